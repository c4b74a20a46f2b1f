"""Uploaded files named in a response's input (`input_file` parts with a `file_id`), inlined at the
door: the part is given the file's bytes as `file_data` (a base64 data URL) and its `filename`,
and loses its `file_id`.

Why inline: the file is the tenant's, kept by this gateway (the Files API, purpose `user_data`),
and no upstream holds it. A chat upstream reads a file part only as `file_data`; OpenAI's own
APIs take `file_data` as readily as a `file_id` of theirs, so a request sent natively (to a
provider speaking the Responses API) is answerable as it is; and the job then carries everything
its provider needs, as any job does, so a worker never reads the Files store. The price: the
file travels in the job's payload (twice: the request it was made from, and the chat body), so it
is bounded by what one request body may hold (`gateway.max_body_bytes`), checked before the
file is read.
"""

from __future__ import annotations

import base64
import mimetypes
from collections.abc import Mapping
from typing import Any

from tidegate.coord.tenants import Tenant
from tidegate.gateway.batches.file_routes import USER_DATA, visible_file
from tidegate.gateway.core.errors import ApiError
from tidegate.gateway.core.state import GatewayState
from tidegate.gateway.responses.schemas import ResponseCreateRequest

__all__ = ["inline_files"]


async def inline_files(state: GatewayState, tenant: Tenant,
                       request: ResponseCreateRequest) -> ResponseCreateRequest:
    """The request with each `file_id` of its input's files replaced by the file's data; the
    request itself when it names none. A file of another tenant is not found, as an unknown id."""
    if isinstance(request.input, str):
        return request
    items: list[dict[str, Any]] = []
    for index, item in enumerate(request.input):
        content = item.get("content")
        if not isinstance(content, list) or not any(_names_a_file(part) for part in content):
            items.append(item)
            continue
        parts = [await _inlined(state, tenant, part, f"input[{index}].content[{number}]")
                 if _names_a_file(part) else part for number, part in enumerate(content)]
        items.append({**item, "content": parts})
    return request.model_copy(update={"input": items})


def _names_a_file(part: object) -> bool:
    return isinstance(part, dict) and part.get("type") == "input_file" and "file_id" in part


async def _inlined(state: GatewayState, tenant: Tenant, part: Mapping[str, Any],
                   where: str) -> dict[str, Any]:
    file_id = part.get("file_id")
    if not isinstance(file_id, str) or not file_id:
        raise ApiError(400, f"{where}.file_id must be a non-empty string", code="invalid_value",
                       param=f"{where}.file_id")
    if part.get("file_data") is not None or part.get("file_url") is not None:
        raise ApiError(400, f"{where}: give one of file_id, file_data and file_url",
                       code="invalid_value", param=f"{where}.file_id")
    try:
        file = await visible_file(state, tenant, file_id)
    except ApiError as unknown:
        raise ApiError(404, unknown.message, code="file_not_found", param=f"{where}.file_id") from None
    if file.purpose != USER_DATA:
        raise ApiError(400, f"file {file_id!r} was uploaded for {file.purpose!r}, not {USER_DATA!r}",
                       code="invalid_file_purpose", param=f"{where}.file_id")
    encoded_bytes = -(-file.bytes // 3) * 4
    if encoded_bytes > state.max_body_bytes:
        raise ApiError(413, f"file {file_id!r} is {file.bytes} bytes: base64-encoded into the request "
                       f"it is over the limit of {state.max_body_bytes} bytes of one request",
                       code="file_too_large", param=f"{where}.file_id")
    content = await state.batches.file_content(file.id)
    if content is None:  # deleted between the two reads
        raise ApiError(404, f"no file with id {file_id!r}", code="file_not_found", param=f"{where}.file_id")
    media_type = mimetypes.guess_type(file.filename)[0] or "application/octet-stream"
    data = f"data:{media_type};base64,{base64.b64encode(content).decode()}"
    kept = {key: value for key, value in part.items() if key != "file_id"}
    return {**kept, "filename": part.get("filename") or file.filename, "file_data": data}
