"""Native pass-through: a job made from a Responses or Messages request (its `origin`, see
tidegate.ai) sent to an upstream that speaks that API itself, as the client wrote it.

The body sent is the origin's, with the routed model, minus what is tidegate's own:
- Responses: `priority`, `background` (the queue runs it in the background), `previous_response_id`
  (tidegate owns the response ids: the conversation it continues is resolved by the gateway and
  sent as input items, the origin's `context`, before the request's input) and `store`, sent as
  false: the response is kept by tidegate, as its job, and the upstream need not keep a copy
  nobody can reach. `stream` and `stream_options` go only when the job streams.
- Compaction (origin "compact", POST /responses/compact, never streamed): `priority` and
  `previous_response_id`, whose conversation goes as input items before the input, as above.
- Messages: `priority`; `stream` only when the job streams.
A `service_tier` the origin does not name is the one the provider's tier policy picked.

The answer is the upstream's own document, its usage read from it; a stream is relayed as the
upstream's own events (one JSON object each), decoded here only to know its end and to put the
whole answer together: a Response is in `response.completed` (or `response.incomplete`), a
Message is built from its events. An error event, or `response.failed`, becomes the `{"error":
...}` chunk that fails the stream.

A job whose origin is `native_only` (the chat body cannot carry it) routed to a provider that does
not speak its API fails as a client error (code `native_api_required`): it is never answered from
the chat summary, which would answer another question.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import msgspec
import orjson
from msgspec import UNSET

from tidegate.ai import AIRequest, Origin, Usage
from tidegate.contract import CompactRequest, MessagesRequest, ResponsesRequest, requested_tier, to_body
from tidegate.errors import ProviderErrorBody, UpstreamError
from tidegate.providers.adapters.base import Answer, PartSink
from tidegate.providers.client import UpstreamClient

__all__ = ["MessageAssembler", "ResponsesDecoder", "call_native", "messages_usage", "native_origin",
           "refuse_native_only", "responses_usage", "usage_of"]

RESPONSES_PATH: Final = "/responses"
COMPACT_PATH: Final = "/responses/compact"
MESSAGES_PATH: Final = "/messages"
_RESPONSE_ENDS: Final = frozenset({"response.completed", "response.incomplete"})
# OpenAI's tiers (the policy's, in the job's body) as Anthropic's request field names them.
_MESSAGES_TIERS: Final = {"auto": "auto", "priority": "auto", "default": "standard_only",
                          "flex": "standard_only"}


def native_origin(request: AIRequest, client: UpstreamClient) -> Origin | None:
    """The origin to send as it is, when the client's provider speaks its API; None otherwise."""
    origin = request.origin
    return origin if origin is not None and client.provider.speaks(origin.spoken_api) else None


def refuse_native_only(request: AIRequest, client: UpstreamClient) -> None:
    """Fail a job that only a provider speaking its origin's API may serve (see the module)."""
    origin = request.origin
    if origin is not None and origin.native_only:
        message = (f"this request uses what only the {origin.spoken_api} API itself serves, and it was "
                   f"routed to provider {client.provider.name!r}, which does not speak that API natively: "
                   "name a model of a provider that does, or leave those fields out")
        raise UpstreamError(message, kind="client", status=400,
                            body=ProviderErrorBody(message, "invalid_request_error", "native_api_required"))


async def call_native(client: UpstreamClient, request: AIRequest, origin: Origin, model: str,
                      on_part: PartSink | None) -> Answer:
    """Send the origin's body to its API's path; stream it to `on_part` when given (a compaction
    is never streamed: its answer is one document)."""
    if origin.api == "compact":
        response = await client.post(COMPACT_PATH, _compact_body(request, origin, model), expect="output")
        return Answer(response.body, usage_of(response.body), response.latency_ms, response.rate_limit)
    if origin.api == "responses":
        path, body, expect = RESPONSES_PATH, _responses_body(request, origin, model), "output"
    else:
        path, body, expect = MESSAGES_PATH, _messages_body(request, origin, model), "content"
    if on_part is None:
        response = await client.post(path, body, expect=expect)
        return Answer(response.body, usage_of(response.body), response.latency_ms, response.rate_limit)
    decoder = ResponsesDecoder() if origin.api == "responses" else MessageAssembler()
    async with client.stream(path, {**body, "stream": True}, decoder) as stream:
        async for chunk in stream:
            await on_part(chunk.part)
    summary = stream.summary
    assert summary is not None  # set once the terminal event was read, and the loop ends only then
    document = decoder.document
    return Answer(document, usage_of(document), summary.latency_ms, summary.rate_limit, summary.ttft_ms)


def _responses_body(request: AIRequest, origin: Origin, model: str) -> dict[str, Any]:
    given = origin.body
    assert isinstance(given, ResponsesRequest)  # an origin's body is its API's (Origin checks it)
    # tidegate's own fields out; `store` (false) and a stream's `stream_options` are put back last,
    # where the body has always had them.
    sent = msgspec.structs.replace(given, model=model, priority=UNSET, background=UNSET, store=UNSET,
                                   previous_response_id=UNSET, stream=UNSET, stream_options=UNSET)
    if origin.context:
        sent = msgspec.structs.replace(sent, input=[*origin.context, *given.input_items])
    body = to_body(sent)
    body["store"] = False
    if request.stream and isinstance(given.stream_options, dict):
        body["stream_options"] = given.stream_options
    return _with_policy_tier(body, request, named=given.service_tier is not UNSET)


def _compact_body(request: AIRequest, origin: Origin, model: str) -> dict[str, Any]:
    given = origin.body
    assert isinstance(given, CompactRequest)  # an origin's body is its API's (Origin checks it)
    sent = msgspec.structs.replace(given, model=model, priority=UNSET, previous_response_id=UNSET)
    if origin.context:
        sent = msgspec.structs.replace(sent, input=[*origin.context, *given.input_items])
    return _with_policy_tier(to_body(sent), request, named=given.service_tier is not UNSET)


def _with_policy_tier(body: dict[str, Any], request: AIRequest, *, named: bool) -> dict[str, Any]:
    """`body` with the tier the provider's policy picked (in the job's chat body), unless the
    origin `named` one itself."""
    tier = requested_tier(request.body)
    if not named and tier is not None:
        body["service_tier"] = tier
    return body


def _messages_body(request: AIRequest, origin: Origin, model: str) -> dict[str, Any]:
    given = origin.body
    assert isinstance(given, MessagesRequest)  # an origin's body is its API's (Origin checks it)
    body = to_body(msgspec.structs.replace(given, model=model, priority=UNSET, stream=UNSET))
    tier = _MESSAGES_TIERS.get(str(requested_tier(request.body)))
    if given.service_tier is UNSET and tier is not None:
        body["service_tier"] = tier
    return body


def usage_of(document: Mapping[str, Any]) -> Usage:
    """The tokens a Response or a Message counts."""
    usage = document.get("usage")
    counts = usage if isinstance(usage, dict) else {}
    return messages_usage(counts) if document.get("type") == "message" else responses_usage(counts)


def messages_usage(counts: Mapping[str, Any]) -> Usage:
    """A Message's `usage` in tidegate's terms. Anthropic's `input_tokens` leave out the tokens
    read from the prompt cache (`cache_read_input_tokens`) and written to it
    (`cache_creation_input_tokens`, by lifetime in `cache_creation`: all 5-minute ones when it is
    absent), which are added back; `output_tokens_details.thinking_tokens` are its reasoning."""
    read = _tokens(counts.get("cache_read_input_tokens"))
    lifetimes = _object(counts.get("cache_creation"))
    written_1h = _tokens(lifetimes.get("ephemeral_1h_input_tokens"))
    written_5m = (_tokens(lifetimes["ephemeral_5m_input_tokens"]) if "ephemeral_5m_input_tokens" in lifetimes
                  else max(0, _tokens(counts.get("cache_creation_input_tokens")) - written_1h))
    prompt = _tokens(counts.get("input_tokens")) + read + written_5m + written_1h
    output = _tokens(counts.get("output_tokens"))
    thinking = _tokens(_object(counts.get("output_tokens_details")).get("thinking_tokens"))
    return Usage(prompt, output, prompt + output, read, written_5m, written_1h, thinking)


def responses_usage(counts: Mapping[str, Any]) -> Usage:
    """A Response's `usage` in tidegate's terms: `input_tokens` count the cached ones
    (`input_tokens_details.cached_tokens`) and written ones (`cache_write_tokens`), as OpenAI's
    chat counts do; `output_tokens` count `output_tokens_details.reasoning_tokens`. OpenAI's
    write lifetimes are not Anthropic's: every write is priced as a 5-minute one."""
    prompt, output = _tokens(counts.get("input_tokens")), _tokens(counts.get("output_tokens"))
    given = _object(counts.get("input_tokens_details"))
    reasoning = _tokens(_object(counts.get("output_tokens_details")).get("reasoning_tokens"))
    return Usage(prompt, output, _tokens(counts.get("total_tokens")) or prompt + output,
                 _tokens(given.get("cached_tokens")), _tokens(given.get("cache_write_tokens")),
                 reasoning_tokens=reasoning)


def _tokens(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _object(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, dict) else {}


def _event_of(data: bytes) -> dict[str, Any] | None:
    try:
        event = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    return event if isinstance(event, dict) else None


class ResponsesDecoder:
    """Reads the Responses API's typed events (a `StreamDecoder`): each relayed as it is, the
    stream ending at `response.completed` or `response.incomplete`, whose response is `document`."""

    def __init__(self) -> None:
        self.document: dict[str, Any] = {}

    def __call__(self, data: bytes) -> tuple[list[bytes], bool]:
        """The chunk of one event, and whether it ends the stream."""
        event = _event_of(data)
        if event is None:
            return [data], False  # the client refuses it as malformed
        kind = event.get("type")
        if kind == "error":
            said = {key: event.get(key) for key in ("message", "code", "param")}
            return [orjson.dumps({"error": {**said, "type": "upstream_error"}})], False
        if kind == "response.failed":
            response = event.get("response")
            error = response.get("error") if isinstance(response, dict) else None
            return [orjson.dumps({"error": error or {"message": "the response failed"}})], False
        if kind in _RESPONSE_ENDS and isinstance(event.get("response"), dict):
            self.document = event["response"]
            return [data], True
        return [data], False


class MessageAssembler:
    """Reads Anthropic's Messages events (a `StreamDecoder`): each relayed as it is, the stream
    ending at `message_stop`; the Message they make, every block put together, is `document`."""

    def __init__(self) -> None:
        self.document: dict[str, Any] = {}
        self._blocks: dict[int, dict[str, Any]] = {}
        self._json: dict[int, list[str]] = {}

    def __call__(self, data: bytes) -> tuple[list[bytes], bool]:
        """The chunk of one event, and whether it ends the stream."""
        event = _event_of(data)
        if event is None:
            return [data], False
        kind = event.get("type")
        index = event.get("index")
        position = index if isinstance(index, int) else 0
        if kind == "message_start" and isinstance(event.get("message"), dict):
            self.document = {**event["message"], "content": []}
        elif kind == "content_block_start" and isinstance(event.get("content_block"), dict):
            self._blocks[position] = dict(event["content_block"])
        elif kind == "content_block_delta" and isinstance(event.get("delta"), dict):
            self._delta(position, event["delta"])
        elif kind == "message_delta":
            self._finish(event)
        elif kind == "message_stop":
            self.document["content"] = [self._block(at) for at in sorted(self._blocks)]
            return [data], True
        return [data], False

    def _delta(self, position: int, delta: dict[str, Any]) -> None:
        block = self._blocks.setdefault(position, {})
        kind = delta.get("type")
        if kind == "input_json_delta":
            self._json.setdefault(position, []).append(str(delta.get("partial_json") or ""))
        elif kind == "signature_delta":
            block["signature"] = delta.get("signature")
        elif kind == "citations_delta":
            block.setdefault("citations", []).append(delta.get("citation"))
        else:  # text_delta, thinking_delta: the text of the field named like the delta
            for name in ("text", "thinking"):
                if isinstance(delta.get(name), str):
                    block[name] = str(block.get(name) or "") + delta[name]

    def _block(self, position: int) -> dict[str, Any]:
        block = self._blocks[position]
        pieces = self._json.get(position)
        if pieces:
            try:
                block["input"] = orjson.loads("".join(pieces))
            except orjson.JSONDecodeError:
                block["input"] = {"_raw": "".join(pieces)}
        return block

    def _finish(self, event: dict[str, Any]) -> None:
        delta = event.get("delta")
        for name in ("stop_reason", "stop_sequence"):
            if isinstance(delta, dict) and name in delta:
                self.document[name] = delta[name]
        usage = event.get("usage")
        if isinstance(usage, dict):
            # message_delta's counts are cumulative: the latest stands.
            known = self.document.get("usage")
            self.document["usage"] = {**(known if isinstance(known, dict) else {}),
                                      **{key: value for key, value in usage.items() if value is not None}}
