"""Request and response models of the Files and Batch APIs, shaped as OpenAI's (the `openai`
SDK reads them unchanged), plus tidegate's own `priority` on a batch."""

from __future__ import annotations

from typing import Annotated, Literal, Protocol, TypeVar

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from tidegate.coord.tenants import Tenant
from tidegate.gateway.batches.lines import SERVED_ENDPOINTS
from tidegate.gateway.batches.store import BatchFields, BatchRecord, LineError, RequestCounts, StoredFile
from tidegate.gateway.core.auth import is_admin
from tidegate.gateway.core.errors import ApiError
from tidegate.gateway.core.schemas import PriorityValue
from tidegate.jobs import Priority

__all__ = [
    "BatchErrors",
    "BatchList",
    "BatchRequest",
    "BatchView",
    "FileDeleted",
    "FileList",
    "FileView",
    "batch_view",
    "file_view",
    "visible_to",
]

MAX_METADATA_KEYS = 16  # as OpenAI's metadata: 16 pairs, keys of 64 characters, values of 512
MetadataKey = Annotated[str, StringConstraints(max_length=64)]
MetadataValue = Annotated[str, StringConstraints(max_length=512)]
# Whole hours, from 1 to a week: "24h" is OpenAI's only window; a shorter or longer one is tidegate's.
WINDOW_PATTERN = r"^(?:[1-9]|[1-9][0-9]|1[0-5][0-9]|16[0-8])h$"


class FileView(BaseModel):
    """An uploaded file (OpenAI's File object)."""

    id: str
    object: Literal["file"] = "file"
    bytes: int
    created_at: int
    filename: str
    purpose: str
    status: Literal["processed"] = "processed"
    expires_at: int | None = None
    status_details: str | None = None


class FileList(BaseModel):
    """A page of files, newest first."""

    object: Literal["list"] = "list"
    data: list[FileView]
    first_id: str | None = None
    last_id: str | None = None
    has_more: bool = False


class FileDeleted(BaseModel):
    """What DELETE /v1/files/{id} did."""

    id: str
    object: Literal["file"] = "file"
    deleted: bool


class BatchRequest(BaseModel):
    """POST /v1/batches: a batch of requests read from an uploaded `batch` file."""

    model_config = ConfigDict(json_schema_extra={"examples": [{
        "input_file_id": "file-2f1c0d4e9a8b7c6d5e4f3a2b", "endpoint": "/v1/chat/completions",
        "completion_window": "24h", "metadata": {"job": "nightly-tags"}}]})

    input_file_id: str = Field(min_length=1, max_length=255)
    # Documented as an enum but read as any string, so that another endpoint is refused by the
    # batch's own check (code unsupported_endpoint, naming those served).
    endpoint: str = Field(description="The endpoint every line calls.",
                          json_schema_extra={"enum": list(SERVED_ENDPOINTS)})
    completion_window: str = Field(pattern=WINDOW_PATTERN, description=(
        "Whole hours from 1h to 168h (OpenAI's is 24h): the lines' jobs' deadline, from the batch's "
        "creation. A line not started by then ends expired."))
    metadata: dict[MetadataKey, MetadataValue] | None = Field(None, max_length=MAX_METADATA_KEYS)
    priority: PriorityValue | None = Field(None, description=(
        "tidegate: the lines' priority (default bulk), within the tenant's maximum; X-Priority "
        "wins over it."))


class BatchErrors(BaseModel):
    """Why a batch failed: its malformed lines."""

    object: Literal["list"] = "list"
    data: list[LineError]


class BatchView(BatchFields):
    """A batch (OpenAI's Batch object), with tidegate's `priority`. Cancelled and expired lines
    count as failed."""

    object: Literal["batch"] = "batch"
    errors: BatchErrors | None = None
    request_counts: RequestCounts
    priority: str = Field(description="tidegate: the priority of the batch's jobs.")


class BatchList(BaseModel):
    """A page of batches, newest first."""

    object: Literal["list"] = "list"
    data: list[BatchView]
    first_id: str | None = None
    last_id: str | None = None
    has_more: bool = False


def file_view(file: StoredFile) -> FileView:
    """A stored file as the API shows it."""
    return FileView(id=file.id, bytes=file.bytes, created_at=file.created_at, filename=file.filename,
                    purpose=file.purpose, expires_at=file.expires_at)


def batch_view(batch: BatchRecord) -> BatchView:
    """A stored batch as the API shows it."""
    fields = batch.model_dump(include=set(BatchFields.model_fields))
    return BatchView(
        **fields,
        errors=None if batch.errors is None else BatchErrors(data=batch.errors),
        request_counts=batch.request_counts,
        priority=Priority(batch.priority).name.lower(),
    )


class _Owned(Protocol):
    @property
    def tenant(self) -> str: ...


Owned = TypeVar("Owned", bound=_Owned)


def visible_to(tenant: Tenant, record: Owned | None, what: str, record_id: str) -> Owned:
    """The record if this tenant may see it (its own, or any for an admin); 404 otherwise, the
    same as for an unknown id, so ids cannot be probed."""
    if record is None or (record.tenant != tenant.name and not is_admin(tenant)):
        raise ApiError(404, f"no {what} with id {record_id!r}", code=f"{what}_not_found",
                       param=f"{what}_id")
    return record
