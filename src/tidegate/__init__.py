"""tidegate: a durable priority queue and dispatcher for AI API traffic, fed by live change data."""

from tidegate.errors import (
    ConfigError,
    InvalidJob,
    InvalidPriority,
    JobNotFound,
    LeaseLost,
    MissingDependency,
    PayloadTooLarge,
    QueueClosed,
    QueueFull,
    QueueUnavailable,
    TidegateError,
)
from tidegate.jobs import FINAL_STATES, Job, JobSpec, JobState, Priority
from tidegate.queue import Queue, QueueSettings, QueueStats

__all__ = [
    "FINAL_STATES",
    "ConfigError",
    "InvalidJob",
    "InvalidPriority",
    "Job",
    "JobNotFound",
    "JobSpec",
    "JobState",
    "LeaseLost",
    "MissingDependency",
    "PayloadTooLarge",
    "Priority",
    "Queue",
    "QueueClosed",
    "QueueFull",
    "QueueSettings",
    "QueueStats",
    "QueueUnavailable",
    "TidegateError",
]

__version__ = "0.1.0"
