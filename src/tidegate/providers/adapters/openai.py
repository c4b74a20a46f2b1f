"""The adapter of OpenAI-compatible upstreams (OpenAI, and the many APIs shaped like it): the job's
body goes as it came, with the routed model; answers and chunks already are in the job's form.
A job made from a Responses request goes to POST /responses as the client wrote it when the
provider serves that API natively (`native_apis`; tidegate.providers.adapters.native)."""

from __future__ import annotations

from typing import Any

from tidegate.ai import AIRequest
from tidegate.providers.adapters.base import Answer, PartSink, ProviderAdapter
from tidegate.providers.adapters.native import call_native, native_origin, refuse_native_only

__all__ = ["OpenAIAdapter"]

_STREAM_FIELDS = ("stream", "stream_options")


class OpenAIAdapter(ProviderAdapter):
    """POST /chat/completions and /embeddings of an OpenAI-compatible API."""

    async def complete(self, request: AIRequest, model: str) -> Answer:
        """The answer of one call; a stream the caller asked for is dropped, as nobody listens."""
        origin = native_origin(request, self.client)
        if origin is not None:
            return await call_native(self.client, request, origin, model, None)
        refuse_native_only(request, self.client)
        body = {key: value for key, value in _body(request, model).items() if key not in _STREAM_FIELDS}
        if request.kind == "chat":
            response = await self.client.chat(body)
        else:
            response = await self.client.embeddings(body)
        return Answer(response.body, response.usage, response.latency_ms, response.rate_limit)

    async def stream(self, request: AIRequest, model: str, on_part: PartSink) -> Answer:
        """Relay each chunk as it arrives; the answer is the stream as one chat.completion (or,
        native, the upstream's own events and document)."""
        origin = native_origin(request, self.client)
        if origin is not None:
            return await call_native(self.client, request, origin, model, on_part)
        refuse_native_only(request, self.client)
        tier: object = None
        async with self.client.chat_stream(_body(request, model)) as stream:
            async for chunk in stream:
                tier = chunk.data.get("service_tier", tier)  # each chunk names it, as OpenAI's do
                await on_part(chunk.part)
        summary = stream.summary
        assert summary is not None  # set once [DONE] was read, and the loop ends only then
        message: dict[str, Any] = {"role": "assistant", "content": summary.text}
        if summary.tool_calls:
            message["tool_calls"] = [{"id": call.id, "type": "function",
                                      "function": {"name": call.name, "arguments": call.arguments}}
                                     for call in summary.tool_calls]
        document = {
            "object": "chat.completion",
            "model": model,
            "choices": [{"index": 0, "message": message, "finish_reason": summary.finish_reason}],
            "usage": summary.usage.to_json(),
        }
        if isinstance(tier, str):
            document["service_tier"] = tier
        return Answer(document, summary.usage, summary.latency_ms, summary.rate_limit, summary.ttft_ms)


def _body(request: AIRequest, model: str) -> dict[str, Any]:
    return {**request.body, "model": model}
