"""Anthropic's Messages API: POST /v1/messages and POST /v1/messages/count_tokens.

An Anthropic SDK pointed at the gateway (`base_url` without `/v1`) works unchanged: its key comes
as `x-api-key` (or `Authorization: Bearer`), its `anthropic-version` header is accepted. Each
message call becomes a chat job at the caller's priority, like an OpenAI call, and is answered as
a Message (or Anthropic's event stream), with the same X-Tidegate-* headers; every error of these
routes is Anthropic-shaped. The Anthropic dialect (tidegate.gateway.anthropic.dialect) does the
translation; the intake, the wait and the relay are those of every dialect. To a provider that
speaks the Messages API natively (`api = "anthropic"`) the request goes as it is
(tidegate.gateway.core.native).
"""

from __future__ import annotations

import time
from typing import Annotated

from fastapi import Header
from fastapi.responses import Response

from tidegate.ai import AIRequest
from tidegate.costs import estimate_input_tokens
from tidegate.gateway.anthropic.dialect import ANTHROPIC, conversation, json_text, tool_fields
from tidegate.gateway.anthropic.schemas import (
    AnthropicError,
    CountTokensRequest,
    Message,
    MessagesRequest,
    TokenCount,
)
from tidegate.gateway.core.auth import MeteredTenantDep, StateDep, TenantDep
from tidegate.gateway.core.dialect import decoded
from tidegate.gateway.core.errors import error_responses
from tidegate.gateway.core.intake import (
    CallOptionsDep,
    draft_job,
)
from tidegate.gateway.core.native import served_natively
from tidegate.gateway.openai.routes import RESULT_HEADERS, WAIT_ERROR_DESCRIPTIONS, serve

__all__ = ["router"]

AnthropicVersionHeader = Annotated[str | None, Header(
    alias="anthropic-version", description="The Messages API version the client speaks (such as "
    "2023-06-01): accepted, and the answer is the same for every version.")]

# Before OpenAPI 3.2 an event stream's schema describes each of its events.
_SSE_EVENT = {
    "type": "object",
    "description": "One server-sent event of Anthropic's sequence: `message_start`, then for each "
                   "content block `content_block_start`, `content_block_delta` (text_delta or "
                   "input_json_delta) and `content_block_stop`, then `message_delta` (stop_reason, "
                   "usage) and `message_stop`; a stream that fails after it started ends with an "
                   "`error` event.",
    "properties": {"event": {"type": "string"}, "data": {"type": "string"}},
    "required": ["event", "data"],
}

router = ANTHROPIC.router(prefix="/v1", tags=["Anthropic Messages"],
                          responses=error_responses(401, 503, model=AnthropicError))


@router.post(
    "/messages",
    response_model=Message,
    summary="Create a message",
    responses={**error_responses(400, 403, 413, 429, described=WAIT_ERROR_DESCRIPTIONS, model=AnthropicError),
               200: {"headers": RESULT_HEADERS,
                     "content": {"text/event-stream": {
                         "schema": _SSE_EVENT,
                         "example": 'event: message_start\ndata: {"type": "message_start", ...}\n\n',
                     }},
                     "description": "The model's Message; with `stream: true`, Anthropic's events."}},
)
async def create_message(
    body: MessagesRequest,
    state: StateDep,
    tenant: MeteredTenantDep,
    options: CallOptionsDep,
    anthropic_version: AnthropicVersionHeader = None,
) -> Response:
    """Queue the conversation as a chat job at the caller's priority and answer with a Message."""
    started = time.perf_counter()
    request = ANTHROPIC.translate(body, native=served_natively(state, "anthropic", body.model))
    return await serve(state, tenant, request, options, started=started, dialect=ANTHROPIC)


@router.post(
    "/messages/count_tokens",
    response_model=TokenCount,
    summary="Count a message's input tokens",
    responses=error_responses(400, 403, 413, described={404: "Unknown model."}, model=AnthropicError),
)
async def count_tokens(
    body: CountTokensRequest,
    state: StateDep,
    tenant: TenantDep,
    anthropic_version: AnthropicVersionHeader = None,
) -> TokenCount:
    """The conversation's input tokens, estimated as tidegate estimates every prompt for its budgets
    and rate limits (tidegate.costs.estimate_input_tokens: characters, no tokenizer; a little high
    on purpose). An estimate, not the provider's count: nothing is queued or sent upstream. The
    model and the conversation are checked as a message call's would be."""
    chat = {"model": body.model, "messages": conversation(body.system, body.messages),
            **tool_fields(body.tools, body.tool_choice)}
    request = AIRequest(kind="chat", body=decoded("chat", chat))
    draft = draft_job(state, tenant, request, priority=tenant.default_priority)
    json_text(chat, "body")  # what a message call's queue would refuse, refused alike
    return TokenCount(input_tokens=estimate_input_tokens(draft.request.body))
