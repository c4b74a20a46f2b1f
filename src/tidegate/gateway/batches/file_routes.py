"""The Files API: POST /v1/files (a multipart upload), GET /v1/files, GET /v1/files/{id},
GET /v1/files/{id}/content, DELETE /v1/files/{id}.

Files are what batches read their requests from (`purpose` batch) and write their answers to
(`batch_output`, made by the gateway), and what responses read as `input_file` parts (`purpose`
user_data, inlined into the response's job by tidegate.gateway.responses.files). They are kept in
the batch store (tidegate.gateway.batches.store), in the queue's backend, so every gateway replica
serves the same ones. A tenant sees only its own files: another tenant's answers 404, like an
unknown id; admins see every file, as they see every job.

Retention, as OpenAI's: an upload may say `expires_after[anchor]=created_at` and
`expires_after[seconds]` (an hour to 30 days); without it a `batch` upload expires after the
gateway's `batch_upload_retention_s` (30 days) and a `user_data` one is kept until deleted; a
batch's output and error files expire after its `batch_output_retention_s` (30 days).
`expires_at` shows when; the gateways' sweep (tidegate.gateway.batches.sweep) deletes a file
past it, unless a batch in progress reads it.
"""

from __future__ import annotations

import secrets
import time
from typing import Annotated, Final

from fastapi import APIRouter, File, Form, Query, UploadFile
from fastapi.responses import Response

from tidegate.coord.tenants import Tenant
from tidegate.gateway.batches.schemas import FileDeleted, FileList, FileView, file_view, visible_to
from tidegate.gateway.batches.store import StoredFile
from tidegate.gateway.core.auth import MeteredTenantDep, StateDep, TenantDep
from tidegate.gateway.core.errors import ApiError, error_responses
from tidegate.gateway.core.state import GatewayState

__all__ = ["MULTIPART_ENVELOPE_BYTES", "UPLOADS_PATH", "UPLOAD_PURPOSES", "USER_DATA", "router",
           "visible_file"]

UPLOADS_PATH: Final = "/v1/files"
# What an upload's body holds beyond the file: the parts' headers and boundaries, the purpose.
MULTIPART_ENVELOPE_BYTES: Final = 64 * 1024
USER_DATA: Final = "user_data"  # the purpose of a file a response reads (an input_file part)
UPLOAD_PURPOSES: Final = ("batch", USER_DATA)  # what a client may upload for; more come with their APIs
MAX_PAGE: Final = 10_000  # OpenAI's most files per page
EXPIRES_AFTER_S: Final = (3600, 30 * 86_400)  # OpenAI's bounds of expires_after[seconds]

router = APIRouter(prefix=UPLOADS_PATH, tags=["Files"], responses=error_responses(401, 503))

_NOT_FOUND: dict[int | str, str] = {404: "No such file for this tenant."}


def new_file_id() -> str:
    """A fresh file id, shaped as OpenAI's."""
    return f"file-{secrets.token_hex(12)}"


async def visible_file(state: GatewayState, tenant: Tenant, file_id: str) -> StoredFile:
    """The file if this tenant may see it and it has not expired; 404 otherwise, the same as
    for an unknown id."""
    file = await state.batches.get_file(file_id)
    return visible_to(tenant, None if file is None or file.expired(time.time()) else file, "file", file_id)


@router.post("", response_model=FileView, summary="Upload a file",
             responses=error_responses(400, 413, 429))
async def create_file(
    state: StateDep,
    tenant: MeteredTenantDep,
    file: Annotated[UploadFile, File(description=(
        "The file: for `batch`, JSON Lines of requests; for `user_data`, a document a response "
        "reads (an `input_file` part with its `file_id`)."))],
    purpose: Annotated[str, Form(description="What the file is for: `batch` or `user_data`.")],
    anchor: Annotated[str | None, Form(alias="expires_after[anchor]", description=(
        "What the expiry counts from: `created_at` (the only anchor)."))] = None,
    seconds: Annotated[int | None, Form(alias="expires_after[seconds]", description=(
        f"Seconds after the anchor the file expires and is deleted, {EXPIRES_AFTER_S[0]} to "
        f"{EXPIRES_AFTER_S[1]}; without it a `batch` file is kept the gateway's "
        "`batch_upload_retention_s` (30 days), a `user_data` one until deleted."))] = None,
) -> FileView:
    """Store a file for the tenant, at most the gateway's `max_file_bytes`, until it is deleted
    or expires (`expires_after`, or the gateway's retention of batch uploads)."""
    if purpose not in UPLOAD_PURPOSES:
        raise ApiError(400, f"purpose {purpose!r} is not served: use one of {', '.join(UPLOAD_PURPOSES)}",
                       code="invalid_purpose", param="purpose")
    expires_after_s = _expires_after(anchor, seconds)
    if expires_after_s is None and purpose == "batch":
        expires_after_s = state.settings.batch_upload_retention_s
    limit = state.settings.max_file_bytes
    # One byte past the limit is enough to know: a file over it is never read in full.
    content = await file.read(limit + 1)
    if len(content) > limit:
        raise ApiError(413, f"the file is over the limit of {limit} bytes", code="file_too_large",
                       param="file")
    now = int(time.time())
    stored = StoredFile(id=new_file_id(), tenant=tenant.name, filename=file.filename or "upload.jsonl",
                        purpose=purpose, bytes=len(content), created_at=now,
                        expires_at=None if expires_after_s is None else now + expires_after_s)
    await state.batches.put_file(stored, content)
    return file_view(stored)


def _expires_after(anchor: str | None, seconds: int | None) -> int | None:
    """The seconds an upload is kept for (None: until deleted), checked as OpenAI checks them."""
    if anchor is None and seconds is None:
        return None
    if anchor != "created_at":
        raise ApiError(400, f"expires_after[anchor] must be 'created_at', not {anchor!r}",
                       code="invalid_expires_after", param="expires_after[anchor]")
    low, high = EXPIRES_AFTER_S
    if seconds is None or not low <= seconds <= high:
        raise ApiError(400, f"expires_after[seconds] must be from {low} to {high}, not {seconds}",
                       code="invalid_expires_after", param="expires_after[seconds]")
    return seconds


@router.get("", response_model=FileList, summary="List files", responses=error_responses(400))
async def list_files(
    state: StateDep,
    tenant: TenantDep,
    purpose: Annotated[str | None, Query(max_length=64, description="Only files of this purpose.")] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = MAX_PAGE,
    after: Annotated[str | None, Query(max_length=255, description="The last id of the page before.")] = None,
) -> FileList:
    """The tenant's files, newest first."""
    page, has_more = await state.batches.page_files(tenant.name, purpose, after=after, limit=limit)
    views = [file_view(file) for file in page]
    return FileList(data=views, first_id=views[0].id if views else None,
                    last_id=views[-1].id if views else None, has_more=has_more)


@router.get("/{file_id}", response_model=FileView, summary="Retrieve a file",
            responses=error_responses(described=_NOT_FOUND))
async def retrieve_file(file_id: str, state: StateDep, tenant: TenantDep) -> FileView:
    """The file's metadata."""
    return file_view(await visible_file(state, tenant, file_id))


@router.get("/{file_id}/content", summary="Retrieve a file's content", response_class=Response,
            responses={200: {"content": {"application/octet-stream": {"schema": {
                "type": "string", "format": "binary"}}}, "description": "The file's bytes."},
                **error_responses(described=_NOT_FOUND)})
async def file_content(file_id: str, state: StateDep, tenant: TenantDep) -> Response:
    """The file's bytes, as uploaded (or, for a batch's output, as the gateway wrote them)."""
    file = await visible_file(state, tenant, file_id)
    content = await state.batches.file_content(file.id)
    if content is None:  # deleted between the two reads
        raise ApiError(404, f"no file with id {file_id!r}", code="file_not_found", param="file_id")
    return Response(content, media_type="application/octet-stream")


@router.delete("/{file_id}", response_model=FileDeleted, summary="Delete a file",
               responses=error_responses(described=_NOT_FOUND))
async def delete_file(file_id: str, state: StateDep, tenant: TenantDep) -> FileDeleted:
    """Delete the file; batches made from it go on (their lines were read when they were made)."""
    file = await visible_file(state, tenant, file_id)
    return FileDeleted(id=file.id, deleted=await state.batches.delete_file(file.id))
