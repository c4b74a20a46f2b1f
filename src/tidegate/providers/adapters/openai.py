"""The adapter of OpenAI-compatible upstreams (OpenAI, and the many APIs shaped like it): the job's
body goes as it came, with the routed model; answers and chunks already are in the job's form.
A job made from a Responses request goes to POST /responses as the client wrote it when the
provider serves that API natively (`native_apis`; tidegate.providers.adapters.native).

Legacy completions and moderations go to `{base}/completions` and `{base}/moderations`; a
streamed completion's `text_completion` chunks are relayed as they come, as a chat's are.
"""

from __future__ import annotations

from typing import Any, Final

from tidegate.ai import AIRequest
from tidegate.contract import ChatRequest, CompletionRequest, to_body
from tidegate.providers.adapters.base import Answer, PartSink, ProviderAdapter
from tidegate.providers.adapters.native import call_native, native_origin, refuse_native_only
from tidegate.providers.client import StreamSummary, UpstreamStream

__all__ = ["OpenAIAdapter"]

_STREAM_FIELDS = ("stream", "stream_options")
COMPLETIONS_PATH: Final = "/completions"
MODERATIONS_PATH: Final = "/moderations"


class OpenAIAdapter(ProviderAdapter):
    """POST /chat/completions, /embeddings, /completions and /moderations of an OpenAI-compatible API."""

    async def complete(self, request: AIRequest, model: str) -> Answer:
        """The answer of one call; a stream the caller asked for is dropped, as nobody listens."""
        origin = native_origin(request, self.client)
        if origin is not None:
            return await call_native(self.client, request, origin, model, None)
        refuse_native_only(request, self.client)
        body = {key: value for key, value in _body(request, model).items() if key not in _STREAM_FIELDS}
        if request.kind == "chat":
            response = await self.client.chat(body)
        elif request.kind == "completion":
            response = await self.client.post(COMPLETIONS_PATH, body, expect="choices")
        elif request.kind == "moderation":
            response = await self.client.post(MODERATIONS_PATH, body, expect="results")
        else:
            response = await self.client.embeddings(body)
        return Answer(response.body, response.usage, response.latency_ms, response.rate_limit)

    async def stream(self, request: AIRequest, model: str, on_part: PartSink) -> Answer:
        """Relay each chunk as it arrives; the answer is the stream as one chat.completion (one
        text_completion for a legacy completion; native, the upstream's own events and document)."""
        origin = native_origin(request, self.client)
        if origin is not None:
            return await call_native(self.client, request, origin, model, on_part)
        refuse_native_only(request, self.client)
        tier: object = None
        async with self._open_stream(request, model) as stream:
            async for chunk in stream:
                tier = chunk.data.get("service_tier", tier)  # each chunk names it, as OpenAI's do
                await on_part(chunk.part)
        summary = stream.summary
        assert summary is not None  # set once [DONE] was read, and the loop ends only then
        if request.kind == "completion":
            return _text_completion(model, summary)
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

    def _open_stream(self, request: AIRequest, model: str) -> UpstreamStream:
        body = _body(request, model)
        if not isinstance(request.body, CompletionRequest):
            options = request.body.stream_options if isinstance(request.body, ChatRequest) else None
            return self.client.chat_stream(body, options)
        options = {**(request.body.stream_options or {}), "include_usage": True}
        return self.client.stream(COMPLETIONS_PATH, {**body, "stream": True, "stream_options": options})


def _body(request: AIRequest, model: str) -> dict[str, Any]:
    """The provider's body: the request's, rendered from its struct, with the routed model."""
    return {**to_body(request.body), "model": model}


def _text_completion(model: str, summary: StreamSummary) -> Answer:
    """A streamed legacy completion as one text_completion (the one choice a stream asks for);
    OpenAI's completions take no service tier."""
    document = {"object": "text_completion", "model": model,
                "choices": [{"index": 0, "text": summary.text, "logprobs": None,
                             "finish_reason": summary.finish_reason}],
                "usage": summary.usage.to_json()}
    return Answer(document, summary.usage, summary.latency_ms, summary.rate_limit, summary.ttft_ms)
