"""The AI job contract: a worker's result reads back as the same typed AIResult and is stored in
the format job readers have always seen; a relayed chunk reads as typed stream events; a
dialect's routes answer their errors in the dialect's shape."""

from __future__ import annotations

from typing import Any

import httpx
import orjson
import pytest
from fastapi import FastAPI

from tidegate.ai import (
    AIRequest,
    AIResult,
    Finish,
    Origin,
    StreamError,
    StreamPart,
    TextDelta,
    Timings,
    ToolCall,
    ToolCallDelta,
    Usage,
    UsageReport,
)
from tidegate.errors import InvalidJob
from tidegate.gateway.core.errors import ApiError, install_error_handlers
from tidegate.gateway.openai.dialect import OpenAIDialect

COMPLETION = {
    "id": "chatcmpl-1", "object": "chat.completion", "model": "gpt-4.1",
    "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
        "role": "assistant", "content": None,
        "tool_calls": [{"id": "call_1", "type": "function",
                        "function": {"name": "lookup", "arguments": "{\"sku\": 7}"}}]}}],
    "usage": {"prompt_tokens": 12, "completion_tokens": 5, "total_tokens": 17},
}


def _result() -> AIResult:
    return AIResult(COMPLETION, model="gpt-4.1", provider="openai", route="named", usage=Usage(12, 5, 17),
                    cost_micros=123, cost_usd="0.000123", timings=Timings(1.23456, 80.0, 20.5),
                    attempts=1, worker_id="worker-1")


def test_a_result_is_stored_in_the_job_result_format_and_reads_back_the_same() -> None:
    stored = _result().to_json()

    assert stored == {
        "v": 1, "response": COMPLETION, "provider": "openai", "model": "gpt-4.1", "route": "named",
        "usage": {"prompt_tokens": 12, "completion_tokens": 5, "total_tokens": 17},
        "cost_usd": "0.000123", "cost_micros": 123, "queue_wait_ms": 1.235, "upstream_latency_ms": 80.0,
        "attempts": 1, "worker_id": "worker-1", "ttft_ms": 20.5,
    }
    again = AIResult.from_json(orjson.loads(orjson.dumps(stored)))
    assert again is not None and again.to_json() == stored


def test_finish_reason_and_tool_calls_are_read_from_the_response() -> None:
    result = _result()

    assert result.finish_reason == "tool_calls"
    assert result.tool_calls == (ToolCall("call_1", "lookup", "{\"sku\": 7}"),)


def test_a_stored_record_is_read_not_trusted() -> None:
    assert AIResult.from_json(["not", "a", "result"]) is None
    result = AIResult.from_json({"response": "text", "model": 3, "cost_micros": True, "queue_wait_ms": "1"})

    assert result is not None
    assert (result.response, result.model, result.cost_micros) == (None, None, None)
    assert result.timings == Timings()
    assert result.finish_reason is None and result.tool_calls == ()


def _chunk(**fields: Any) -> bytes:
    return orjson.dumps({"object": "chat.completion.chunk", "model": "gpt-4.1", **fields})


def test_a_relayed_chunk_reads_as_typed_events_and_keeps_its_bytes() -> None:
    call = {"index": 0, "id": "call_1", "function": {"name": "f", "arguments": "{"}}
    delta = {"content": "Hi", "tool_calls": [call]}
    raw = _chunk(choices=[{"index": 0, "finish_reason": "stop", "delta": delta}])

    part = StreamPart.decode(raw)

    assert part.raw == raw and part.model == "gpt-4.1" and part.text == "Hi"
    assert part.events == (TextDelta("Hi"), ToolCallDelta(0, "call_1", "f", "{"), Finish("stop"))
    usage = StreamPart.decode(_chunk(choices=[], usage={"prompt_tokens": 3, "completion_tokens": 2}))
    assert usage.usage_only and usage.events == (UsageReport(Usage(3, 2, 5)),)


def test_a_worker_failure_chunk_reads_as_the_error_that_ends_the_stream() -> None:
    part = StreamPart.decode(StreamPart.failure("gpt-4.1: cut").raw)

    assert part.error == StreamError("gpt-4.1: cut", "upstream_error")
    assert StreamPart.decode(b"not json").events == ()


class _ShapedDialect(OpenAIDialect):
    """OpenAI's dialect with errors shaped as Anthropic's API shapes them."""

    def error_body(self, error: ApiError) -> dict[str, Any]:
        return {"type": "error", "error": {"type": error.type, "message": error.message}}


async def test_a_route_of_a_dialect_answers_its_errors_in_the_dialect_shape() -> None:
    app = FastAPI()
    install_error_handlers(app)
    router = _ShapedDialect().router()

    @router.get("/refused")
    async def refused() -> None:
        raise ApiError(403, "no", code="nope")

    @router.get("/typed")
    async def typed(count: int) -> int:
        return count

    app.include_router(router)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway") as client:
        refusal = await client.get("/refused")
        invalid = await client.get("/typed", params={"count": "many"})
        unrouted = await client.get("/elsewhere")

    assert refusal.status_code == 403
    assert refusal.json() == {"type": "error", "error": {"type": "permission_error", "message": "no"}}
    assert invalid.status_code == 400 and invalid.json()["type"] == "error"
    assert unrouted.status_code == 404 and unrouted.json()["error"]["code"] == "unknown_url"  # no dialect


HI = [{"role": "user", "content": "Hi"}]
RESPONSE = {"model": "auto", "input": "Hi", "store": True}


def test_a_requests_origin_crosses_the_payload_and_a_malformed_one_is_refused() -> None:
    request = AIRequest.of("chat", {"model": "auto", "messages": [{"role": "user", "content": "Hi"}]},
                        origin=Origin.of("responses", RESPONSE))

    payload = orjson.loads(orjson.dumps(request.to_payload()))

    assert payload["origin"] == {"api": "responses", "body": RESPONSE}
    assert AIRequest.from_payload(payload) == request
    assert "origin" not in AIRequest.of("chat", {"model": "auto", "messages": HI}).to_payload()
    for origin in ({"api": "gemini", "body": RESPONSE}, {"api": "responses", "body": []},
                   {"api": "responses"}, "responses",
                   {"api": "responses", "body": RESPONSE, "native_only": "yes"},
                   {"api": "responses", "body": RESPONSE, "context": [1]},
                   {"api": "responses", "body": RESPONSE, "x": 1},
                   {"api": "responses", "body": {**RESPONSE, "input": 5}},
                   {"api": "anthropic", "body": RESPONSE}):
        with pytest.raises(InvalidJob):
            AIRequest.from_payload({**payload, "origin": origin})
    with pytest.raises(InvalidJob, match="unknown AI job field"):
        AIRequest.from_payload({**payload, "priority": 1})


def test_a_native_origin_keeps_what_only_its_api_carries_and_a_native_event_is_named() -> None:
    context = ({"type": "reasoning", "id": "rs_1", "summary": []},)
    request = AIRequest.of("chat", {"model": "auto", "messages": [{"role": "user", "content": "Hi"}]},
                        origin=Origin.of("responses", {"model": "auto", "input": "Hi"}, native_only=True,
                                         context=context))
    message = AIRequest.of("chat", {"model": "auto", "messages": [{"role": "user", "content": "Hi"}]},
                            origin=Origin.of("anthropic", {"model": "auto", "messages": HI, "max_tokens": 16,
                                                           "top_k": 3}))

    payload = orjson.loads(orjson.dumps(request.to_payload()))
    delta = StreamPart.decode(b'{"type": "response.output_text.delta", "delta": "Hi", "sequence_number": 3}')
    thinking = StreamPart.decode(b'{"type": "content_block_delta", "index": 0, '
                                 b'"delta": {"type": "thinking_delta", "thinking": "hm"}}')
    failed = StreamPart.decode(b'{"type": "response.failed", "response": {"error": {"message": "no"}}}')

    assert payload["origin"] == {"api": "responses", "body": {"model": "auto", "input": "Hi"},
                                 "native_only": True, "context": [context[0]]}
    assert AIRequest.from_payload(payload) == request
    assert AIRequest.from_payload(message.to_payload()) == message
    assert (delta.event, delta.text) == ("response.output_text.delta", "Hi")
    assert (thinking.event, thinking.text, thinking.error) == ("content_block_delta", "", None)
    assert failed.error is not None and failed.error.message == "no"
