"""OpenAI's Responses API: POST /v1/responses, GET and DELETE /v1/responses/{id},
POST /v1/responses/{id}/cancel, GET /v1/responses/{id}/input_items,
POST /v1/responses/input_tokens and POST /v1/responses/compact.

An OpenAI SDK pointed at `http://host:port/v1` works unchanged: `client.responses.create(...)`,
`.stream(...)`, `.retrieve`, `.cancel`, `.delete`, `.input_items.list`, `.input_tokens.count`,
`.compact` (tidegate.gateway.responses.compaction says how a conversation is compacted). A
response is a job of the queue (`resp_<job id>`), at the caller's priority like every call: its
store, its tenant isolation (another tenant's response answers 404, like an unknown id), its
retention and its background run are the queue's. The Responses dialect (tidegate.gateway.responses.dialect)
translates the request into the job's chat body and renders the job as a response; to a provider
that speaks the Responses API natively the request goes as it is (tidegate.gateway.core.native).
"""

from __future__ import annotations

import time
from typing import Annotated, Literal

from fastapi import Query
from fastapi.responses import JSONResponse, Response

from tidegate.ai import AIRequest
from tidegate.costs import estimate_input_tokens
from tidegate.gateway.core.auth import MeteredTenantDep, StateDep, TenantDep
from tidegate.gateway.core.errors import ApiError, error_responses
from tidegate.gateway.core.intake import (
    CallOptionsDep,
    Submitted,
    TimeoutHeader,
    draft_job,
    submit,
    wait_timeout_s,
)
from tidegate.gateway.core.native import served_natively
from tidegate.gateway.core.outcomes import result_headers, succeeded
from tidegate.gateway.core.streaming import stream_job
from tidegate.gateway.responses.compaction import compacted, compaction
from tidegate.gateway.responses.dialect import RESPONSES
from tidegate.gateway.responses.files import inline_files
from tidegate.gateway.responses.lookup import conversation, lookup_response
from tidegate.gateway.responses.output import listed_items, render, request_of, response_id
from tidegate.gateway.responses.schemas import (
    CompactedResponse,
    ResponseCompactRequest,
    ResponseCreateRequest,
    ResponseDeleted,
    ResponseInputTokens,
    ResponseInputTokensRequest,
    ResponseItemList,
    ResponseObject,
)

__all__ = ["router"]

MAX_ITEMS_PAGE = 100  # input items in one page, as OpenAI allows

router = RESPONSES.router(prefix="/v1/responses", tags=["Responses"], responses=error_responses(401, 503))

_NOT_FOUND: dict[int | str, str] = {404: "No such response for this tenant (or it was created with "
                                         "store: false, or deleted, or its retention ran out)."}
_SSE_EVENT = {
    "type": "object",
    "description": "One server-sent event: `event` names its type (response.created, "
                   "response.output_text.delta, … response.completed) and `data` is the event as JSON, "
                   "with its `sequence_number`.",
    "properties": {"data": {"type": "string"}, "event": {"type": "string"}},
    "required": ["data"],
}


@router.post(
    "",
    response_model=ResponseObject,
    summary="Create a response",
    responses={**error_responses(400, 403, 413, 429, described={
        404: "Unknown model, or `previous_response_id` names no response of this tenant.",
        409: "The job was cancelled while the call waited, or the Idempotency-Key was first used for "
             "another request.",
        "4XX": "The provider refused the request with another client error: its status and message.",
        502: "The provider failed after every attempt.",
        504: "No result in time: `error.job_id` names the job, which goes on; retrieve "
             "resp_<job id>.",
    }), 200: {
        "content": {"text/event-stream": {"schema": _SSE_EVENT}},
        "description": "The response; with `background: true` at once, status `queued`; with "
                       "`stream: true`, its events as server-sent events.",
    }},
)
async def create_response(
    body: ResponseCreateRequest,
    state: StateDep,
    tenant: MeteredTenantDep,
    options: CallOptionsDep,
) -> Response:
    """Queue the response's job at the caller's priority and answer with the response."""
    started = time.perf_counter()
    if body.background and body.store is False:
        raise ApiError(400, "a background response is stored: it cannot have store false",
                       code="unsupported_parameter", param="store")
    history = None if body.previous_response_id is None else await conversation(
        state, tenant, body.previous_response_id)
    body = await inline_files(state, tenant, body)
    request = RESPONSES.translate(body, history, native=served_natively(state, "responses", body.model))
    # A background response streamed is listened to as it runs (and resumable, see
    # retrieve_response); one not streamed is answered at once, its job left to run.
    submitted = await submit(state, tenant, request, options, waits=bool(body.stream) or not body.background)
    if body.stream:
        call = RESPONSES.call(submitted.job_id, submitted.request)
        return await stream_job(state, call, submitted, started=started)
    if body.background:
        job, origin = await lookup_response(state, tenant, response_id(submitted.job_id))
        return JSONResponse(render(job, origin), headers={"X-Tidegate-Job-Id": job.id})
    job, result = await succeeded(state, submitted.job_id, submitted.timeout_s)
    call = RESPONSES.call(job.id, submitted.request, int(job.created_at.timestamp()))
    return call.answer(result, result_headers(job, result))


@router.post(
    "/input_tokens",
    response_model=ResponseInputTokens,
    summary="Count a response's input tokens",
    responses=error_responses(400, 403, 413, described={
        404: "Unknown model, or `previous_response_id` names no response of this tenant."}),
)
async def count_input_tokens(body: ResponseInputTokensRequest, state: StateDep,
                             tenant: TenantDep) -> ResponseInputTokens:
    """The request's input tokens, estimated as tidegate estimates every prompt for its budgets and
    rate limits (tidegate.costs.estimate_input_tokens: characters, no tokenizer; a little high on
    purpose), over the chat body a response would be sent: instructions, the conversation of
    `previous_response_id`, the input and the tools. An estimate, not the provider's count: nothing
    is queued or sent upstream. The request, its model and the tenant's entitlement to it are
    checked as POST /v1/responses checks them."""
    request = await inline_files(state, tenant, body.as_response())
    history = None if request.previous_response_id is None else await conversation(
        state, tenant, request.previous_response_id)
    translated = RESPONSES.translate(request, history,
                                     native=served_natively(state, "responses", request.model))
    draft = draft_job(state, tenant, translated, priority=tenant.default_priority)
    return ResponseInputTokens(input_tokens=estimate_input_tokens(draft.request.body))


@router.post(
    "/compact",
    response_model=CompactedResponse,
    summary="Compact a conversation",
    responses=error_responses(400, 403, 413, 429, described={
        404: "Unknown model, or `previous_response_id` names no response of this tenant.",
        409: "The job was cancelled while the call waited, or the Idempotency-Key was first used for "
             "another request.",
        "4XX": "The provider refused the request with another client error: its status and message.",
        502: "The provider failed after every attempt.",
        504: "No result in time: `error.job_id` names the job, which goes on (GET /v1/jobs/{id}).",
    }),
)
async def compact_conversation(
    body: ResponseCompactRequest,
    state: StateDep,
    tenant: MeteredTenantDep,
    options: CallOptionsDep,
) -> JSONResponse:
    """Compact the conversation of `previous_response_id` and `input` into its user messages and
    one compaction item, to be given as the next response's input: by a job at the caller's
    priority, sent as it is to a provider that speaks the Responses API, else summarized by the
    model itself into tidegate's own compaction item (see tidegate.gateway.responses.compaction)."""
    history = None if body.previous_response_id is None else await conversation(
        state, tenant, body.previous_response_id)
    conversation_request = await inline_files(state, tenant, body.as_response())
    compacting = compaction(body, conversation_request, history,
                            native=served_natively(state, "responses", body.model))
    submitted = await submit(state, tenant, compacting.request, options)
    job, result = await succeeded(state, submitted.job_id, submitted.timeout_s)
    return JSONResponse(compacted(job, result, compacting.retained), headers=result_headers(job, result))


@router.get("/{response_id}", response_model=ResponseObject, summary="Retrieve a response",
            responses={**error_responses(400, described={
                **_NOT_FOUND,
                409: "With `stream`: the response was cancelled.",
                502: "With `stream`: the response failed at the provider after every attempt.",
                504: "With `stream`: no event in time; the response goes on: retrieve it again."}), 200: {
                "content": {"text/event-stream": {"schema": _SSE_EVENT}},
                "description": "The response; with `stream=true`, its events as server-sent events."}})
async def retrieve_response(
    response_id: str,
    state: StateDep,
    tenant: TenantDep,
    stream: Annotated[bool, Query(description=(
        "Stream the response's events, from its start (or after `starting_after`), as they come "
        "while it runs; those of a finished one at once."))] = False,
    starting_after: Annotated[int | None, Query(ge=0, description=(
        "With `stream`: the sequence number of the event after which to start, to resume a "
        "stream."))] = None,
    x_tidegate_timeout: TimeoutHeader = None,
) -> Response:
    """The response as its job stands: queued, in progress, or finished with its output; or its
    stream. Its events are numbered as they were first streamed while the relay keeps the
    stream's chunks (CHANNEL_TTL_S after its end); later, and for a response that was not
    streamed, they are rendered from the stored answer."""
    started = time.perf_counter()
    job, origin = await lookup_response(state, tenant, response_id)
    if not stream:
        return JSONResponse(render(job, origin))
    request = AIRequest.from_payload(job.payload)
    call = RESPONSES.call(job.id, request, int(job.created_at.timestamp()), starting_after=starting_after)
    submitted = Submitted(job.id, job.priority, request, wait_timeout_s(x_tidegate_timeout, state))
    return await stream_job(state, call, submitted, started=started)


@router.delete("/{response_id}", response_model=ResponseDeleted, summary="Delete a response",
               responses=error_responses(described=_NOT_FOUND))
async def delete_response(response_id: str, state: StateDep, tenant: TenantDep) -> ResponseDeleted:
    """Delete the response (its job, cancelled first if it has not finished)."""
    job, _ = await lookup_response(state, tenant, response_id)
    if not job.is_final:
        await state.queue.cancel(job.id)
    if not await state.queue.forget(job.id):
        raise ApiError(404, f"Response with id {response_id!r} not found.", code="response_not_found")
    return ResponseDeleted(id=response_id)


@router.post("/{response_id}/cancel", response_model=ResponseObject, summary="Cancel a response",
             responses=error_responses(described={
                 **_NOT_FOUND, 400: "Only a response created with `background: true` can be cancelled."}))
async def cancel_response(response_id: str, state: StateDep, tenant: TenantDep) -> JSONResponse:
    """Cancel a background response that has not finished; a finished one is answered as it is."""
    job, origin = await lookup_response(state, tenant, response_id)
    if not request_of(origin).in_background:
        raise ApiError(400, "only a response created with background: true can be cancelled",
                       code="not_background", param="response_id")
    if not job.is_final and await state.queue.cancel(job.id):
        job, origin = await lookup_response(state, tenant, response_id)
    return JSONResponse(render(job, origin))


@router.get("/{response_id}/input_items", response_model=ResponseItemList, summary="List input items",
            responses=error_responses(400, described=_NOT_FOUND))
async def list_input_items(
    response_id: str,
    state: StateDep,
    tenant: TenantDep,
    limit: Annotated[int, Query(ge=1, le=MAX_ITEMS_PAGE, description="Items in one page.")] = 20,
    order: Annotated[Literal["asc", "desc"], Query(description="desc: the last input item first.")] = "desc",
    after: Annotated[str | None, Query(description="The id of the item the page starts after.")] = None,
) -> ResponseItemList:
    """The response's own input, as items with ids."""
    job, origin = await lookup_response(state, tenant, response_id)
    items = listed_items(job.id, origin)
    if order == "desc":
        items.reverse()
    if after is not None:
        ids = [item["id"] for item in items]
        if after not in ids:
            raise ApiError(400, f"no input item {after!r} in this response", code="invalid_value",
                           param="after")
        items = items[ids.index(after) + 1:]
    page = items[:limit]
    return ResponseItemList(data=page, first_id=page[0]["id"] if page else None,
                            last_id=page[-1]["id"] if page else None, has_more=len(items) > limit)
