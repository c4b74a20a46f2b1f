"""The OpenAI-compatible API: POST /v1/chat/completions, POST /v1/embeddings, GET /v1/models,
and OpenAI's legacy POST /v1/completions and POST /v1/moderations when a configured provider offers
them (serves a model of their kind; else they answer 404 `unsupported_endpoint`).

An OpenAI SDK pointed at `http://host:port/v1` works unchanged. Each call becomes a job at the
caller's priority and waits for its result; the answer is the provider's own, plus X-Tidegate-*
headers (job id, model, queue wait, cost). `stream: true` relays the provider's chunks as
server-sent events while the worker receives them.

The routes are thin: the OpenAI dialect (tidegate.gateway.openai.dialect) reads the body and
renders the answer; the intake, the wait and the relay are shared by every dialect.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Annotated, Any, Final

from fastapi import Request
from fastapi.responses import Response

from tidegate.ai import AIRequest, Kind
from tidegate.coord.tenants import Tenant
from tidegate.gateway.core.auth import MeteredTenantDep, StateDep, TenantDep
from tidegate.gateway.core.dialect import Dialect, decoded
from tidegate.gateway.core.errors import ApiError, error_responses, unsupported_endpoint
from tidegate.gateway.core.intake import CallOptions, CallOptionsDep, submit
from tidegate.gateway.core.openapi import documented_as
from tidegate.gateway.core.outcomes import result_headers, succeeded
from tidegate.gateway.core.schemas import ModelList, ModelView
from tidegate.gateway.core.state import GatewayState
from tidegate.gateway.core.streaming import stream_job
from tidegate.gateway.openai.dialect import OPENAI
from tidegate.gateway.openai.schemas import (
    ChatCompletion,
    ChatCompletionRequest,
    Completion,
    CompletionRequest,
    Embeddings,
    EmbeddingsRequest,
    Moderation,
    ModerationRequest,
)

__all__ = ["RESULT_HEADERS", "WAIT_ERROR_DESCRIPTIONS", "router", "serve"]

# A synchronous call answers how its job ended: refused at the door, or dead (the failure its
# worker recorded: the provider's own 4xx, a routing or budget refusal, 502), cancelled or late.
WAIT_ERROR_DESCRIPTIONS: dict[int | str, str] = {
    404: "Unknown model, or the provider answered 404 for it.",
    409: "The job was cancelled while the call waited, or the Idempotency-Key was first used for "
         "another request (the other endpoint, another body).",
    "4XX": "The provider refused the request with another client error (such as 422): its status "
           "and its own message, type and code, relayed.",
    502: "The provider failed after every attempt, or refused tidegate's own credentials.",
    504: "No result in time: `error.job_id` names the job, which goes on; poll GET /v1/jobs/{id}.",
}
_WAIT_ERRORS = error_responses(400, 403, 413, 429, described=WAIT_ERROR_DESCRIPTIONS)
RESULT_HEADERS = {
    name: {"description": text, "schema": {"type": "string"}}
    for name, text in (("X-Tidegate-Job-Id", "The job that served the call."),
                       ("X-Tidegate-Model", "The model that answered."),
                       ("X-Tidegate-Queue-Wait-Ms", "Time the job waited in the queue."),
                       ("X-Tidegate-Cost-Usd", "What the call cost."))
}

# Before OpenAPI 3.2 an event stream's schema describes each of its events.
_SSE_EVENT = {
    "type": "object",
    "description": "One server-sent event. Its `data` is a chat.completion.chunk as JSON, and `[DONE]` "
                   "last; a stream that fails after its first chunk ends with an OpenAI-shaped error "
                   "(`{\"error\": {...}}`) instead of `[DONE]`.",
    "properties": {"data": {"type": "string"}, "event": {"type": "string"}, "id": {"type": "string"}},
    "required": ["data"],
}


def _streamed(event: dict[str, Any], chunk: str, answer: str) -> dict[str, Any]:
    """The documented 200 of a route that may stream: the provider's `answer`, or its `chunk`s
    as server-sent events (each described by `event`)."""
    return {
        "headers": RESULT_HEADERS,
        "content": {"text/event-stream": {
            "schema": event,
            "example": f'data: {{"object": "{chunk}", "choices": [...]}}\n\ndata: [DONE]\n\n',
        }},
        "description": f"The provider's {answer}; with `stream: true`, its chunks as server-sent events.",
    }


router = OPENAI.router(prefix="/v1", tags=["OpenAI-compatible"], responses=error_responses(401, 503))

# A body as FastAPI reads it (a JSON object), decoded by the route into the typed contract
# (tidegate.contract), once; the OpenAPI document shows the dialect's model of it, which
# tests/test_contract.py holds to the contract.
ChatBody = Annotated[dict[str, Any], documented_as(ChatCompletionRequest)]
EmbeddingsBody = Annotated[dict[str, Any], documented_as(EmbeddingsRequest)]
CompletionBody = Annotated[dict[str, Any], documented_as(CompletionRequest)]
ModerationBody = Annotated[dict[str, Any], documented_as(ModerationRequest)]


@router.post(
    "/chat/completions",
    response_model=ChatCompletion,
    summary="Create a chat completion",
    responses={**_WAIT_ERRORS, 200: _streamed(_SSE_EVENT, "chat.completion.chunk", "completion")},
)
async def chat_completions(
    body: ChatBody,
    state: StateDep,
    tenant: MeteredTenantDep,
    options: CallOptionsDep,
) -> Response:
    """Queue the completion at the caller's priority and answer with the provider's result."""
    started = time.perf_counter()
    return await serve(state, tenant, OPENAI.request("chat", decoded("chat", body)), options, started=started)


@router.post(
    "/embeddings",
    response_model=Embeddings,
    summary="Create embeddings",
    responses={**_WAIT_ERRORS,
               200: {"headers": RESULT_HEADERS, "description": "The provider's embeddings."}},
)
async def embeddings(
    body: EmbeddingsBody,
    state: StateDep,
    tenant: MeteredTenantDep,
    options: CallOptionsDep,
) -> Response:
    """Queue the embeddings request at the caller's priority and answer with the provider's result."""
    started = time.perf_counter()
    return await serve(state, tenant, OPENAI.request("embeddings", decoded("embeddings", body)), options,
                       started=started)


async def serve(
    state: GatewayState,
    tenant: Tenant,
    request: AIRequest,
    options: CallOptions,
    *,
    started: float,
    dialect: Dialect = OPENAI,
) -> Response:
    """Queue the call's job and answer with its result (or relay its stream) in `dialect`'s
    shape: what every AI route does once FastAPI, or the gateway's fast path
    (tidegate.gateway.openai.fast_path), has read the request."""
    submitted = await submit(state, tenant, request, options)
    if submitted.request.kind in ("chat", "completion") and submitted.request.stream:
        return await stream_job(state, dialect, submitted, started=started)
    job, result = await succeeded(state, submitted.job_id, submitted.timeout_s)
    return dialect.answer(result, result_headers(job, result))


# ---------------------------------------------------------------------------- legacy endpoints

_SSE_COMPLETION = ("One server-sent event. Its `data` is a text_completion chunk as JSON, and `[DONE]` "
                   "last; a stream that fails after its first chunk ends with an OpenAI-shaped error "
                   "instead.")
LEGACY_PATHS: Final[Mapping[Kind, str]] = {"completion": "/v1/completions", "moderation": "/v1/moderations"}


def _require_offered(request: Request, state: GatewayState, kind: Kind) -> None:
    """404 `unsupported_endpoint` when no configured provider offers `kind`'s endpoint. Checked
    once the call is authenticated and its body read, as every route answers 401 and 400 first."""
    if not state.offers(kind):
        unoffered = [path for other, path in LEGACY_PATHS.items() if not state.offers(other)]
        raise unsupported_endpoint(request, LEGACY_PATHS[kind], unoffered)


_LEGACY_ERRORS = error_responses(400, 403, 413, 429, described={
    **WAIT_ERROR_DESCRIPTIONS,
    404: "No configured provider offers this endpoint (code `unsupported_endpoint`), or the model is "
         "unknown (`model_not_found`) or the provider answered 404 for it."})



async def _queued(state: GatewayState, tenant: Tenant, request: AIRequest, options: CallOptions) -> Response:
    return await serve(state, tenant, request, options, started=time.perf_counter())


@router.post(
    "/completions",
    response_model=Completion,
    summary="Create a completion (legacy)",
    responses={**_LEGACY_ERRORS, 200: _streamed({**_SSE_EVENT, "description": _SSE_COMPLETION},
                                                 "text_completion", "text_completion")},
)
async def completions(request: Request, body: CompletionBody, state: StateDep, tenant: MeteredTenantDep,
                      options: CallOptionsDep) -> Response:
    """Queue the legacy completion at the caller's priority and answer with the provider's result."""
    typed = decoded("completion", body)
    _require_offered(request, state, "completion")
    return await _queued(state, tenant, OPENAI.request("completion", typed), options)


@router.post(
    "/moderations",
    response_model=Moderation,
    summary="Classify content (moderation)",
    responses={**_LEGACY_ERRORS,
               200: {"headers": RESULT_HEADERS, "description": "The provider's moderation."}},
)
async def moderations(request: Request, body: ModerationBody, state: StateDep, tenant: MeteredTenantDep,
                      options: CallOptionsDep) -> Response:
    """Queue the moderation at the caller's priority and answer with the provider's result."""
    typed = decoded("moderation", body)
    _require_offered(request, state, "moderation")
    return await _queued(state, tenant, OPENAI.request("moderation", typed), options)


def _model_views(state: GatewayState, tenant: Tenant) -> list[ModelView]:
    allowed = None if tenant.allowed_models is None else set(tenant.allowed_models)
    return [
        ModelView(id=name, owned_by="tidegate", kind=model.kind)
        for name, model in sorted(state.models.items())
        if allowed is None or name in allowed
    ]


@router.get("/models", response_model=ModelList, summary="List models")
async def list_models(state: StateDep, tenant: TenantDep) -> ModelList:
    """The models the caller may name ("auto" is always accepted and routes by priority)."""
    return ModelList(data=_model_views(state, tenant))


@router.get("/models/{model}", response_model=ModelView, summary="Retrieve a model",
            responses=error_responses(described={404: "Unknown model."}))
async def retrieve_model(model: str, state: StateDep, tenant: TenantDep) -> ModelView:
    """One model the caller may name."""
    for view in _model_views(state, tenant):
        if view.id == model:
            return view
    raise ApiError(404, f"the model {model!r} does not exist", code="model_not_found", param="model")
