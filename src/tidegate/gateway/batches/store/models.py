"""What the batch store keeps: uploaded files (`StoredFile`, their bytes apart), batches
(`BatchRecord`), the lines of a batch (`BatchLine`: a job, or the error of a malformed line) and
their answers as they end (`LineAnswer`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

__all__ = ["BatchFields", "BatchLine", "BatchRecord", "BatchStatus", "LineAnswer", "LineError",
           "RequestCounts", "StoredFile"]

BatchStatus = Literal["validating", "failed", "in_progress", "finalizing", "completed", "expired",
                      "cancelling", "cancelled"]


class StoredFile(BaseModel):
    """An uploaded (or generated) file's metadata, as the Files API shows it; its bytes are
    kept apart and read only by `BatchStore.file_content`."""

    model_config = ConfigDict(frozen=True)

    id: str
    tenant: str
    filename: str
    purpose: str
    bytes: int
    created_at: int  # epoch seconds, as the API shows it
    expires_at: int | None = None  # epoch seconds; None: kept until deleted

    def expired(self, now_s: float) -> bool:
        """Past its `expires_at`: gone for the API at once, though the sweep deletes it later."""
        return self.expires_at is not None and self.expires_at <= now_s


class LineError(BaseModel):
    """Why a line of a batch produced no answer: a malformed line (`line` is its number, from 1),
    or its job's end (dead, expired, cancelled)."""

    model_config = ConfigDict(frozen=True)

    code: str
    message: str
    line: int | None = None
    param: str | None = None


class BatchLine(BaseModel):
    """One line of a batch's input: the job made of it, or the error that kept it from being one."""

    model_config = ConfigDict(frozen=True)

    custom_id: str | None
    job_id: str | None = None
    error: LineError | None = None
    ended: str | None = None  # the job's final state once seen ("gone": past the queue's retention)


@dataclass(frozen=True, slots=True)
class LineAnswer:
    """A line's final outcome, kept in the batch store the moment its job is seen ended (the
    queue keeps a finished job only for its retention): a line of the output file or of the
    error file, as JSON Lines."""

    output: bool  # a line of the output file; else of the error file
    record: bytes  # the JSON line, newline included


class RequestCounts(BaseModel):
    """How many lines a batch has, and how many ended each way so far."""

    total: int = 0
    completed: int = 0
    failed: int = 0


class BatchFields(BaseModel):
    """What a stored batch and the API's Batch object share: what it calls, from which file, where
    it is, and when it reached each status (epoch seconds, as the API shows them)."""

    id: str
    endpoint: str
    input_file_id: str
    completion_window: str
    status: BatchStatus
    output_file_id: str | None = None
    error_file_id: str | None = None
    metadata: dict[str, str] | None = None
    created_at: int
    expires_at: int
    in_progress_at: int | None = None
    finalizing_at: int | None = None
    completed_at: int | None = None
    failed_at: int | None = None
    expired_at: int | None = None
    cancelling_at: int | None = None
    cancelled_at: int | None = None


class BatchRecord(BatchFields):
    """A batch as stored: its fields plus its tenant, its priority, its counts and reasons, and
    when its jobs were last read (`checked_ms`, epoch milliseconds)."""

    tenant: str
    priority: int
    request_counts: RequestCounts = RequestCounts()
    errors: list[LineError] | None = None  # a failed batch's reasons (its malformed lines)
    checked_ms: int = 0  # progress is read at most so often

    def update(self, **changes: Any) -> BatchRecord:
        """A copy with `changes`, checked."""
        return BatchRecord.model_validate({**self.model_dump(), **changes})

