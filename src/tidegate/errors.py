"""The one exception tree of tidegate.

    TidegateError
    ├── ConfigError                 settings or URLs that cannot work
    ├── MissingDependency           an optional extra is not installed
    ├── InvalidJob                  a job description the queue refuses (nothing is written)
    │   ├── InvalidPriority         not a priority name or level 0-4
    │   └── PayloadTooLarge         payload above the configured size
    ├── QueueFull                   admission control: a priority level is at its max depth
    ├── LeaseLost                   a stale lease token: the job was recovered, re-claimed or cancelled
    ├── JobNotFound                 no job with that id (or not visible to the caller)
    ├── QueueClosed                 the queue was closed, or used before it was opened
    └── QueueUnavailable            the backend cannot be reached (driver errors are translated)
"""

from __future__ import annotations


class TidegateError(Exception):
    """Root of every error tidegate raises on purpose."""


class ConfigError(TidegateError):
    """A setting or URL that cannot work."""


class MissingDependency(TidegateError):
    """An optional dependency is missing; the message names the extra to install."""


class InvalidJob(TidegateError):
    """A job description the queue refuses. Nothing of the request was written."""


class InvalidPriority(InvalidJob, ValueError):
    """A priority that is neither a known name nor a level 0-4."""


class PayloadTooLarge(InvalidJob):
    """A payload above the queue's configured maximum size."""


class QueueFull(TidegateError):
    """Admission control refused new work because a priority level is at its max depth."""

    def __init__(self, message: str, *, priority: int, retry_after_s: float) -> None:
        super().__init__(message)
        self.priority = priority
        self.retry_after_s = retry_after_s


class LeaseLost(TidegateError):
    """The caller's lease token is no longer current; the call changed nothing."""


class JobNotFound(TidegateError):
    """No job with that id."""


class QueueClosed(TidegateError):
    """The queue is closed, or was used before it was opened."""


class QueueUnavailable(TidegateError):
    """The queue's backend cannot be reached or answered with an error."""
