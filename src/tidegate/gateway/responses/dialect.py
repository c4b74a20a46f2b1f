"""The Responses dialect: OpenAI's Responses API over chat jobs.

A response is a job: `resp_<job id>`. Its Responses request is translated into the chat body a
chat-only upstream is sent (tidegate.gateway.responses.input, which refuses what cannot
be translated faithfully) and kept in the job's payload as its `origin`, from which the job is
rendered as a response object (`output`) or streamed as typed events (`stream`).

A request with what no chat completion can carry (a built-in tool, a reasoning item, …) is taken
only when the route says every provider that may serve it speaks the Responses API natively
(`translate(..., native=True)`, tidegate.gateway.core.native): its job is then `native_only`, its chat
body a summary, and the upstream's own Response and events are shown as they are.

Rendering needs the response's id, so the routes bind the dialect to the call's job with
`ResponsesDialect.call` before they answer or stream; the unbound dialect (RESPONSES) reads
requests, shapes errors and makes the routes' router.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Mapping
from typing import Any, Final

import orjson
from fastapi.responses import Response
from pydantic import BaseModel

from tidegate.ai import AIRequest, AIResult, Kind, Origin
from tidegate.gateway.core.dialect import Dialect, StreamRenderer, decoded, decoded_origin, validated
from tidegate.gateway.core.errors import ApiError, openai_error
from tidegate.gateway.responses.input import UNTRANSLATABLE, chat_body, summary_body
from tidegate.gateway.responses.output import (
    Continued,
    answered_status,
    is_native,
    native_response,
    output_items,
    response_object,
    response_usage,
)
from tidegate.gateway.responses.schemas import ResponseCreateRequest
from tidegate.gateway.responses.stream import ResponsesStream
from tidegate.gateway.responses.summaries import with_summaries_read

__all__ = ["RESPONSES", "ResponsesDialect"]


class ResponsesDialect(Dialect):
    """OpenAI's Responses API; bound to one call's job by `call`."""

    name = "responses"

    def __init__(self, job_id: str | None = None, origin: Origin | None = None,
                 created_at: int | None = None, starting_after: int | None = None) -> None:
        self._job_id = job_id
        self._origin = origin
        self._created_at = created_at
        self._starting_after = starting_after

    def call(self, job_id: str, request: AIRequest, created_at: int | None = None, *,
             starting_after: int | None = None) -> ResponsesDialect:
        """This dialect bound to the job of one call (made from a Responses request); its stream
        shows the events numbered after `starting_after` (all without it)."""
        if request.origin is None:
            raise ValueError("a response's job carries the Responses request it was made from")
        created = int(time.time()) if created_at is None else created_at
        return ResponsesDialect(job_id, request.origin, created, starting_after)

    def translate(self, body: ResponseCreateRequest, history: Continued | None = None, *,
                  native: bool = False) -> AIRequest:
        """The chat job of a Responses request, `history` (the conversation of the response it
        continues) before its input. `native`: every provider that may serve it speaks the
        Responses API, so what has no chat translation is sent on as it is (see the module).
        tidegate's own compaction items in the input are read first, as the messages they stand
        for (tidegate.gateway.responses.summaries)."""
        body = with_summaries_read(body)
        given = body.model_dump(exclude_unset=True)
        context = () if history is None else history.items
        try:
            chat = chat_body(body, [] if history is None else history.messages())
        except ApiError as refused:
            if not native or refused.code not in UNTRANSLATABLE:
                raise
            origin = decoded_origin("responses", given, native_only=True, context=context)
            return AIRequest(kind="chat", body=decoded("chat", summary_body(body)), origin=origin)
        return AIRequest(kind="chat", body=decoded("chat", chat),
                         origin=decoded_origin("responses", given, context=context))

    def request(self, kind: Kind, body: BaseModel) -> AIRequest:
        """The chat job of a validated Responses request that continues no other."""
        if not isinstance(body, ResponseCreateRequest):
            raise TypeError(f"the Responses dialect reads ResponseCreateRequest, not {type(body).__name__}")
        return self.translate(body)

    def parse(self, kind: Kind, body: Mapping[str, Any], where: str) -> AIRequest:
        """A raw Responses request, checked as POST /v1/responses checks it."""
        return self.request(kind, validated(ResponseCreateRequest, body, where))

    def _bound(self) -> tuple[str, Origin, int]:
        if self._job_id is None or self._origin is None or self._created_at is None:
            raise RuntimeError("bind the Responses dialect to its call's job first (ResponsesDialect.call)")
        return self._job_id, self._origin, self._created_at

    def answer(self, result: AIResult, headers: Mapping[str, str]) -> Response:
        """The response object of the call's succeeded job."""
        job_id, origin, created_at = self._bound()
        if is_native(result.response):
            assert result.response is not None
            return Response(orjson.dumps(native_response(job_id, origin, result.response)),
                            media_type="application/json", headers=dict(headers))
        status, incomplete = answered_status(result.finish_reason)
        document = response_object(
            job_id, created_at, origin, status=status, model=result.model,
            output=output_items(job_id, result.response, status=status),
            usage=response_usage((result.response or {}).get("usage")), incomplete=incomplete,
            completed_at=int(time.time()) if status == "completed" else None,
            service_tier=(result.response or {}).get("service_tier"))
        return Response(orjson.dumps(document), media_type="application/json", headers=dict(headers))

    def stream(self, request: AIRequest) -> StreamRenderer:
        """The typed events of the call's response."""
        job_id, origin, created_at = self._bound()
        return ResponsesStream(job_id, functools.partial(response_object, job_id, created_at, origin),
                               functools.partial(native_response, job_id, origin),
                               starting_after=self._starting_after)

    def error_body(self, error: ApiError) -> dict[str, Any]:
        """OpenAI's `{"error": {"message", "type", "param", "code"}}`, as on every OpenAI route."""
        return openai_error(error)


RESPONSES: Final = ResponsesDialect()
