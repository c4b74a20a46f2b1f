"""tidegate: a durable priority queue and dispatcher for AI API traffic, fed by live change data."""

from tidegate.errors import (
    Closed,
    ConfigError,
    Conflict,
    InvalidInput,
    InvalidJob,
    InvalidPriority,
    JobNotFound,
    LeaseLost,
    MissingDependency,
    NotFound,
    PayloadTooLarge,
    QueueClosed,
    QueueFull,
    QueueUnavailable,
    TidegateError,
    Unavailable,
)
from tidegate.jobs import FINAL_STATES, Job, JobSpec, JobState, Priority
from tidegate.queue import Queue, QueueSettings, QueueStats

__all__ = [
    "FINAL_STATES",
    "Closed",
    "ConfigError",
    "Conflict",
    "InvalidInput",
    "InvalidJob",
    "InvalidPriority",
    "Job",
    "JobNotFound",
    "JobSpec",
    "JobState",
    "LeaseLost",
    "MissingDependency",
    "NotFound",
    "PayloadTooLarge",
    "Priority",
    "Queue",
    "QueueClosed",
    "QueueFull",
    "QueueSettings",
    "QueueStats",
    "QueueUnavailable",
    "TidegateError",
    "Unavailable",
]

# The one place the version is written: pyproject.toml reads it from here (hatchling's dynamic
# version). Semantic: 0.MINOR.PATCH while the API settles, a new minor for new features or a new
# storage format, a patch for fixes only; CHANGELOG.md says what each release changed.
__version__ = "0.2.0"
