"""The AI job contract: what the gateway enqueues (`AIRequest`), what a worker stores when the
call succeeded (`AIResult`), and what a streamed answer is made of (`StreamPart` and its events).

A job payload:

    {"kind": "chat" | "embeddings" | "completion" | "moderation",
     "body": {...},                      # the OpenAI-compatible request body, as the client sent it
                                         # (in process: its typed struct, tidegate.contract)
     "allowed_models": ["gpt-4.1", ...], # optional: the tenant's entitlement, set by the gateway
     "origin": {"api": "responses",      # optional: the request in another API's shape that the
                "body": {...},           # body was translated from, so that API can render the job
                "native_only": true,     #   optional: the body is only its summary (see below)
                "context": [...]},       #   optional (responses, compact): the items of the conversation
                                         #   that `previous_response_id` continues
     "trace": {"traceparent": "00-…"}}   # optional: the W3C trace context of the request that
                                         # enqueued it (tidegate.tracing), set when tracing is on

A job result (what `GET /v1/jobs/{id}` shows as `result`):

    {"response": {...},                  # the answer, an OpenAI-compatible document: a
                                         # chat.completion, an embeddings list, a
                                         # text_completion or a moderation
     "provider": "...", "model": "...", "route": "...",
     "usage": {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3,
               "prompt_tokens_details": {...},       # cache reads and writes, when there were
               "completion_tokens_details": {...}},  # reasoning tokens, when there were (Usage)
     "cost_usd": "0.000123", "cost_micros": 123,
     "queue_wait_ms": 1.5, "upstream_latency_ms": 80.2, "ttft_ms": 20.0,  # ttft_ms: streams only
     "attempts": 1, "worker_id": "..."}

`completion` and `moderation` are OpenAI's legacy `/v1/completions` (`prompt`: a string, strings,
token ids or lists of them) and `/v1/moderations` (`input`: a string, strings, or multimodal items).

A streamed answer crosses the relay one chunk at a time, each an OpenAI-compatible
`chat.completion.chunk` (a streamed completion's: a `text_completion` chunk, its `choices[].text`
read as the content) as the upstream sent it (or an `{"error": {...}}` that ends the stream):
`StreamPart.decode` reads the typed events out of one.

Native pass-through: a job with an `origin` ("responses": OpenAI's Responses API; "compact": its
POST /responses/compact; "anthropic": Anthropic's Messages API) routed to a provider that speaks
that API itself (`ProviderConfig.speaks`, `Origin.spoken_api`) is sent the origin's body (the
routed model in it), not the chat `body`. Its result's `response` is then the upstream's own
document (a Response object, `"object": "response"`; a compacted conversation, `"object":
"response.compaction"`; a Message, `"type": "message"`) and its stream's chunks are the
upstream's own typed events, one JSON object each with its `type` ("response.output_text.delta",
"message_start", …), which `StreamPart.event` names; the upstream's terminal event (`response.completed`,
`message_stop`) is relayed too. Only the dialect of the origin's API reads such a result. An
origin that is `native_only` holds what the chat body cannot carry (a built-in tool, `top_k`,
…): its `body` is a summary for routing and estimates (model, text, limits), and a route to a
provider that does not speak the API fails the job rather than answer another question.

These wire forms are the contract between gateway, dispatch, the change flow and the
recommender; a provider adapter of another upstream converts its answers into them, and a
gateway dialect renders them in its own API's shape.

In process the body is typed: `AIRequest.body` is the struct of its kind (tidegate.contract),
decoded once (at the door, or from the stored payload by the worker) and read as fields; the
stored JSON is the body the struct encodes back (`contract.to_body`), the layout above. An
origin's body is typed the same way (`contract.ResponsesRequest`, `contract.MessagesRequest`),
and encodes back to the very object the caller sent.

Stored records are read, not trusted: `AIResult.from_json` takes what it can use and leaves the
rest at its empty value, as the readers of job results always did.

Formats: a payload and a result document say which format they are in with a top-level `"v"`,
and one newer than this code is refused with PayloadFormatError (a worker leaves such a job to a
newer worker), never misread. A result carries `"v": RESULT_FORMAT`; 0.1.0 wrote none (the same
layout) and its readers skip fields they do not know. A payload without `"v"` is format 1, 0.1.0's
layout: 0.1.0's workers refuse any field they do not know, so while the payload format stays 1
it is written without `"v"`, and a 0.1.0 worker serves what this release's gateway enqueued
during a rolling upgrade. The first release that changes the payload writes `"v": 2`, which this
release's workers already leave alone.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal

import orjson

from tidegate.contract import (
    InvalidRequestBody,
    OriginBody,
    RequestBody,
    decode,
    decode_origin,
    origin_struct_of,
    struct_of,
    to_body,
)
from tidegate.errors import InvalidJob, PayloadFormatError
from tidegate.jobs import Job

__all__ = [
    "AUTO",
    "KINDS",
    "NO_USAGE",
    "PAYLOAD_FORMAT",
    "RESULT_FORMAT",
    "AIRequest",
    "AIResult",
    "Finish",
    "Kind",
    "Origin",
    "OriginApi",
    "StreamError",
    "StreamEvent",
    "StreamPart",
    "TextDelta",
    "Timings",
    "ToolCall",
    "ToolCallDelta",
    "Usage",
    "UsageReport",
    "result_of",
]

Kind = Literal["chat", "embeddings", "completion", "moderation"]
KINDS: Final[tuple[Kind, ...]] = ("chat", "embeddings", "completion", "moderation")
AUTO = "auto"
PAYLOAD_FORMAT: Final = 1  # the AI job payload's format this code writes and reads (see above)
RESULT_FORMAT: Final = 1  # the result document's


def _format_of(document: Mapping[str, Any], what: str, readable: int, absent: int) -> int:
    """The format a stored document says in `"v"` (`absent` when it says none), refused with
    PayloadFormatError when newer than `readable`, the newest this code reads."""
    version = document.get("v", absent)
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise InvalidJob(f"{what} format 'v' must be a whole number, got {version!r}")
    if version > readable:
        raise PayloadFormatError(
            f"{what} in format {version}, newer than this tidegate reads (format {readable}): "
            f"a release that reads format {version} serves it", found=version, readable=readable)
    return version


@dataclass(frozen=True, slots=True)
class AIRequest:
    """A validated AI job payload: its body typed (the struct of its kind, tidegate.contract)."""

    kind: Kind
    body: RequestBody
    allowed_models: frozenset[str] | None = None
    # The request as another API shaped it (OpenAI's Responses), when `body` is its translation:
    # the job is that API's object too, rendered from it. Workers never read it.
    origin: Origin | None = None
    trace: dict[str, str] | None = None  # W3C traceparent (and tracestate) of the enqueuing request

    def __post_init__(self) -> None:
        if not isinstance(self.body, struct_of(self.kind)):
            raise InvalidJob(f"a {self.kind} request's body is a {struct_of(self.kind).__name__}, "
                             f"not a {type(self.body).__name__}")

    @property
    def requested_model(self) -> str | None:
        """The model the caller named, or None for routing (`"auto"` or absent)."""
        model = self.body.model
        return None if model in ("", AUTO) else model

    @property
    def stream(self) -> bool:
        """Whether the caller asked for server-sent events."""
        return getattr(self.body, "stream", False)

    @classmethod
    def of(cls, kind: Kind, body: Mapping[str, Any], *, origin: Origin | None = None) -> AIRequest:
        """The request of `kind` whose body is `body` (a JSON object), decoded and checked: an
        InvalidJob (contract.InvalidRequestBody) names the field refused."""
        return cls(kind=kind, body=decode(kind, body), origin=origin)

    def to_payload(self) -> dict[str, Any]:
        """The job payload for this request, in format PAYLOAD_FORMAT (1: without `"v"`, so that
        0.1.0's workers take it; see the module's docstring)."""
        payload: dict[str, Any] = {"kind": self.kind, "body": to_body(self.body)}
        if self.allowed_models is not None:
            payload["allowed_models"] = sorted(self.allowed_models)
        if self.origin is not None:
            payload["origin"] = self.origin.to_payload()
        if self.trace is not None:
            payload["trace"] = self.trace
        return payload

    @classmethod
    def from_payload(cls, payload: Mapping[str, Any]) -> AIRequest:
        """Parse a job payload; anything malformed is an InvalidJob naming the field, a payload
        of a newer format a PayloadFormatError."""
        _format_of(payload, "AI job payload", PAYLOAD_FORMAT, absent=1)
        unknown = set(payload) - {"v", "kind", "body", "allowed_models", "origin", "trace"}
        if unknown:
            raise InvalidJob(f"unknown AI job field(s): {', '.join(sorted(unknown))}")
        kind = payload.get("kind")
        if kind not in KINDS:
            raise InvalidJob(f"AI job kind must be one of {', '.join(KINDS)}, got {kind!r}")
        body = payload.get("body")
        if not isinstance(body, dict):
            raise InvalidJob("AI job body must be a JSON object")
        if "model" not in body:  # a job enqueued through the queue's API without one is routed
            body = {**body, "model": AUTO}
        allowed = payload.get("allowed_models")
        if allowed is not None and not (
            isinstance(allowed, list) and all(isinstance(name, str) for name in allowed)
        ):
            raise InvalidJob("allowed_models must be a list of model names")
        trace = payload.get("trace")
        if trace is not None and not (
            isinstance(trace, dict) and all(isinstance(value, str) for value in trace.values())
        ):
            raise InvalidJob("trace must be an object of W3C trace context fields (strings)")
        return cls(kind=kind, body=decode(kind, body),
                   allowed_models=None if allowed is None else frozenset(allowed),
                   origin=Origin.from_payload(payload.get("origin")), trace=trace)


OriginApi = Literal["responses", "compact", "anthropic"]
_ORIGIN_APIS: Final = ("responses", "compact", "anthropic")


@dataclass(frozen=True, slots=True)
class Origin:
    """The request a job's body was translated from: the API that took it and its body there,
    typed (a ResponsesRequest, a CompactRequest or a MessagesRequest, tidegate.contract).
    `native_only`: the body cannot carry it, only a provider speaking `api` may serve the job;
    `context`: the Responses items of the conversation the request continues (sent before its
    input to a native upstream)."""

    api: OriginApi
    body: OriginBody
    native_only: bool = False
    context: tuple[dict[str, Any], ...] = ()

    @property
    def spoken_api(self) -> str:
        """The client API a provider must speak to be sent this origin as it is: a compaction
        ("compact", OpenAI's POST /responses/compact) is the Responses API's."""
        return "responses" if self.api == "compact" else self.api

    def __post_init__(self) -> None:
        expected = origin_struct_of(self.api)
        if not isinstance(self.body, expected):
            raise InvalidJob(f"a {self.api} origin's body is a {expected.__name__}, "
                             f"not a {type(self.body).__name__}")

    @classmethod
    def of(cls, api: OriginApi, body: Mapping[str, Any], *, native_only: bool = False,
           context: tuple[dict[str, Any], ...] = ()) -> Origin:
        """The origin whose body is `body` (a JSON object), decoded and checked: an InvalidJob
        (contract.InvalidRequestBody) names the field refused."""
        return cls(api, decode_origin(api, body), native_only, context)

    def to_payload(self) -> dict[str, Any]:
        """The payload's `origin`: its body exactly as the caller sent it (`contract.to_body`)."""
        origin: dict[str, Any] = {"api": self.api, "body": to_body(self.body)}
        if self.native_only:
            origin["native_only"] = True
        if self.context:
            origin["context"] = list(self.context)
        return origin

    @classmethod
    def from_payload(cls, origin: object) -> Origin | None:
        """A payload's `origin` (None when it has none); anything malformed is an InvalidJob."""
        if origin is None:
            return None
        if (not isinstance(origin, dict) or not {"api", "body"} <= set(origin)
                or set(origin) - {"api", "body", "native_only", "context"}):
            raise InvalidJob("origin must be an object with 'api' and 'body' (and 'native_only', "
                             "'context')")
        api = origin["api"]
        if api not in _ORIGIN_APIS:
            raise InvalidJob(f"origin api must be one of {', '.join(_ORIGIN_APIS)}, got {api!r}")
        if not isinstance(origin["body"], dict):
            raise InvalidJob("origin body must be a JSON object")
        native_only = origin.get("native_only", False)
        context = origin.get("context", [])
        if not isinstance(native_only, bool):
            raise InvalidJob("origin native_only must be a boolean")
        if not (isinstance(context, list) and all(isinstance(item, dict) for item in context)):
            raise InvalidJob("origin context must be a list of items (objects)")
        try:
            body = decode_origin(api, origin["body"])
        except InvalidRequestBody as exc:
            raise InvalidJob(f"origin body: {exc}") from None
        return cls(api, body, native_only, tuple(context))


# ---------------------------------------------------------------------------- results


@dataclass(frozen=True, slots=True)
class Usage:
    """Tokens a call consumed, as the provider counted them (zeros when it did not say).

    `input_tokens` is every prompt token, the ones read from or written to the provider's prompt
    cache included (OpenAI's `prompt_tokens`; Anthropic's `input_tokens` leaves those out, and
    its adapter adds them back). `cached_input_tokens`, `cache_write_5m_tokens` and
    `cache_write_1h_tokens` say how many of them the cache served or took (an Anthropic cache
    write lasts 5 minutes or 1 hour, at two prices). `reasoning_tokens` is how many of the
    `output_tokens` the model spent reasoning: both providers bill them as output, already
    counted there.
    """

    input_tokens: int = 0
    output_tokens: int = 0
    total_tokens: int = 0
    cached_input_tokens: int = 0
    cache_write_5m_tokens: int = 0
    cache_write_1h_tokens: int = 0
    reasoning_tokens: int = 0

    @property
    def cache_write_tokens(self) -> int:
        """The input tokens written to the prompt cache, whatever their lifetime."""
        return self.cache_write_5m_tokens + self.cache_write_1h_tokens

    @property
    def uncached_input_tokens(self) -> int:
        """The input tokens neither read from nor written to the cache: those billed at the
        plain input price."""
        return max(0, self.input_tokens - self.cached_input_tokens - self.cache_write_tokens)

    def to_json(self) -> dict[str, Any]:
        """The stored `usage` object, in OpenAI's chat shape: the counts, then
        `prompt_tokens_details` (`cached_tokens`, `cache_write_tokens` and their lifetimes in
        `cache_write_tokens_details`) and `completion_tokens_details` (`reasoning_tokens`),
        each only when it has something to say."""
        usage: dict[str, Any] = {"prompt_tokens": self.input_tokens, "completion_tokens": self.output_tokens,
                                 "total_tokens": self.total_tokens}
        if self.cached_input_tokens or self.cache_write_tokens:
            prompt: dict[str, Any] = {"cached_tokens": self.cached_input_tokens}
            if self.cache_write_tokens:
                prompt["cache_write_tokens"] = self.cache_write_tokens
                prompt["cache_write_tokens_details"] = {_TTL_5M: self.cache_write_5m_tokens,
                                                        _TTL_1H: self.cache_write_1h_tokens}
            usage["prompt_tokens_details"] = prompt
        if self.reasoning_tokens:
            usage["completion_tokens_details"] = {"reasoning_tokens": self.reasoning_tokens}
        return usage

    @classmethod
    def from_json(cls, usage: object) -> Usage:
        """An OpenAI-shaped `usage` object; counts that are missing or not positive integers are
        zeros, and a missing total is the sum of the two. Cache writes whose lifetime is not
        told are 5-minute ones (Anthropic's default)."""
        if not isinstance(usage, dict):
            return NO_USAGE
        prompt = _count(usage.get("prompt_tokens"))
        completion = _count(usage.get("completion_tokens"))
        total = _count(usage.get("total_tokens")) or prompt + completion
        return cls(prompt, completion, total, *_details(usage))

    @classmethod
    def stored(cls, usage: Mapping[str, Any]) -> Usage:
        """A stored `usage` object (`to_json`) read back as it was written: no total recomputed,
        and a count that is not an integer, or absent (a result of an earlier release, written
        before the details were), reads as 0."""
        def count(name: str) -> int:
            return _whole(usage.get(name)) or 0

        return cls(count("prompt_tokens"), count("completion_tokens"), count("total_tokens"),
                   *_details(usage))


NO_USAGE: Final = Usage()
_TTL_5M: Final = "ttl_5m_tokens"
_TTL_1H: Final = "ttl_1h_tokens"


def _details(usage: Mapping[str, Any]) -> tuple[int, int, int, int]:
    """Cached, 5-minute written, 1-hour written and reasoning tokens of an OpenAI-shaped usage."""
    prompt = usage.get("prompt_tokens_details")
    prompt = prompt if isinstance(prompt, dict) else {}
    lifetimes = prompt.get("cache_write_tokens_details")
    lifetimes = lifetimes if isinstance(lifetimes, dict) else {}
    written_1h = _count(lifetimes.get(_TTL_1H))
    written_5m = _count(lifetimes.get(_TTL_5M)) if _TTL_5M in lifetimes else max(
        0, _count(prompt.get("cache_write_tokens")) - written_1h)
    completion = usage.get("completion_tokens_details")
    reasoning = completion.get("reasoning_tokens") if isinstance(completion, dict) else None
    return _count(prompt.get("cached_tokens")), written_5m, written_1h, _count(reasoning)


def _count(value: object) -> int:
    whole = _whole(value)
    return whole if whole is not None and whole > 0 else 0


@dataclass(frozen=True, slots=True)
class Timings:
    """Where a job's time went, in milliseconds (None: not known)."""

    queue_wait_ms: float | None = None
    upstream_latency_ms: float | None = None
    ttft_ms: float | None = None  # streams: from sending the request to the first content


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One tool call of an answer: the function named and its arguments (JSON text)."""

    id: str
    name: str
    arguments: str


@dataclass(frozen=True, slots=True)
class AIResult:
    """A succeeded AI job's result: the answer as the upstream gave it, and what it took.

    `response` keeps the provider's document untouched, so an OpenAI-compatible API answers with
    exactly what the provider said; `finish_reason` and `tool_calls` are read from it.
    """

    response: dict[str, Any] | None
    model: str | None = None
    provider: str | None = None
    route: str | None = None
    usage: Usage | None = None  # None: the record holds no usage object
    cost_micros: int | None = None
    cost_usd: str | None = None  # `cost_micros` in USD, as decimal text (tidegate.costs.micros_to_usd)
    timings: Timings = field(default_factory=Timings)
    attempts: int | None = None
    worker_id: str | None = None

    @property
    def finish_reason(self) -> str | None:
        """Why the first choice stopped ("stop", "length", "tool_calls", …); None if not said."""
        choice = self._first_choice()
        reason = choice.get("finish_reason")
        return reason if isinstance(reason, str) else None

    @property
    def tool_calls(self) -> tuple[ToolCall, ...]:
        """The function calls the first choice's message asks for."""
        message = self._first_choice().get("message")
        calls = message.get("tool_calls") if isinstance(message, dict) else None
        found: list[ToolCall] = []
        for call in calls if isinstance(calls, list) else ():
            function = call.get("function") if isinstance(call, dict) else None
            if isinstance(function, dict):
                found.append(ToolCall(str(call.get("id") or ""), str(function.get("name") or ""),
                                      str(function.get("arguments") or "")))
        return tuple(found)

    def _first_choice(self) -> dict[str, Any]:
        choices = (self.response or {}).get("choices")
        first = choices[0] if isinstance(choices, list) and choices else None
        return first if isinstance(first, dict) else {}

    def to_json(self) -> dict[str, Any]:
        """The stored result document (see the module's docstring), in format RESULT_FORMAT;
        unknown fields are left out."""
        document: dict[str, Any] = {"v": RESULT_FORMAT, "response": self.response, "provider": self.provider,
                                    "model": self.model, "route": self.route,
                                    "usage": None if self.usage is None else self.usage.to_json(),
                                    "cost_usd": self.cost_usd, "cost_micros": self.cost_micros,
                                    "queue_wait_ms": _rounded(self.timings.queue_wait_ms),
                                    "upstream_latency_ms": _rounded(self.timings.upstream_latency_ms),
                                    "attempts": self.attempts, "worker_id": self.worker_id}
        if self.timings.ttft_ms is not None:
            document["ttft_ms"] = _rounded(self.timings.ttft_ms)
        return {key: value for key, value in document.items() if value is not None}

    @classmethod
    def from_json(cls, document: object) -> AIResult | None:
        """A stored result, or None when it is not a result document at all; one of a newer
        format than RESULT_FORMAT is a PayloadFormatError (one without `"v"` was written by 0.1.0,
        in format 1's layout). A field of the wrong type reads as unknown. Timings missing at the
        top are looked for in the response, where early workers kept a stream's `ttft_ms`."""
        if not isinstance(document, dict):
            return None
        try:
            _format_of(document, "a job result", RESULT_FORMAT, absent=1)
        except InvalidJob:
            return None  # a "v" that is no format: not a result document
        stored = document.get("response")
        response = stored if isinstance(stored, dict) else None

        def timing(name: str) -> float | None:
            return _number(document.get(name, (response or {}).get(name)))

        usage = document.get("usage")
        return cls(
            response=response, model=_text(document.get("model")), provider=_text(document.get("provider")),
            route=_text(document.get("route")),
            usage=Usage.stored(usage) if isinstance(usage, dict) else None,
            cost_micros=_whole(document.get("cost_micros")), cost_usd=_text(document.get("cost_usd")),
            timings=Timings(timing("queue_wait_ms"), timing("upstream_latency_ms"), timing("ttft_ms")),
            attempts=_whole(document.get("attempts")), worker_id=_text(document.get("worker_id")),
        )


def result_of(job: Job) -> AIResult | None:
    """The typed result a job holds (None when it holds none)."""
    return AIResult.from_json(job.result)


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _whole(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


# ---------------------------------------------------------------------------- streams


@dataclass(frozen=True, slots=True)
class TextDelta:
    """Content a chunk adds to a choice."""

    text: str
    index: int = 0


@dataclass(frozen=True, slots=True)
class ToolCallDelta:
    """Part of a tool call a chunk adds: its id and name come first, its arguments in pieces."""

    index: int
    id: str | None
    name: str | None
    arguments: str


@dataclass(frozen=True, slots=True)
class Finish:
    """A choice is complete."""

    reason: str
    index: int = 0


@dataclass(frozen=True, slots=True)
class UsageReport:
    """The tokens the whole answer used (a stream's last chunk, when asked for)."""

    usage: Usage


@dataclass(frozen=True, slots=True)
class StreamError:
    """The stream failed after it started: the error ends it."""

    message: str
    type: str | None = None
    param: str | None = None
    code: str | None = None


StreamEvent = TextDelta | ToolCallDelta | Finish | UsageReport | StreamError


@dataclass(frozen=True, slots=True)
class StreamPart:
    """One chunk of a streamed answer: the bytes as they cross the relay (the upstream's own), the
    typed events they carry, and the model named in them."""

    raw: bytes
    events: tuple[StreamEvent, ...] = ()
    model: str | None = None
    usage_only: bool = False  # carries usage and no choices: the chunk include_usage asks for
    service_tier: str | None = None  # the tier the chunk says the call runs at (OpenAI's name it)
    event: str | None = None  # a native upstream's event: its `type` (see the module's docstring)

    @property
    def text(self) -> str:
        """The content this chunk adds (all choices', usually one)."""
        return "".join(event.text for event in self.events if isinstance(event, TextDelta))

    @property
    def error(self) -> StreamError | None:
        """The error that ends the stream, if this chunk is one."""
        return next((event for event in self.events if isinstance(event, StreamError)), None)

    @classmethod
    def failure(cls, message: str, type_: str = "upstream_error") -> StreamPart:
        """The chunk a worker sends to end a stream that failed after it started."""
        return cls(orjson.dumps({"error": {"message": message, "type": type_}}),
                   (StreamError(message, type_),))

    @classmethod
    def decode(cls, raw: bytes) -> StreamPart:
        """Read one relayed chunk. Bytes that are not a JSON object carry no events."""
        try:
            document = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return cls(raw)
        return cls.of(raw, document) if isinstance(document, dict) else cls(raw)

    @classmethod
    def of(cls, raw: bytes, document: dict[str, Any]) -> StreamPart:
        """The part of an OpenAI-compatible chunk already parsed into `document`."""
        event = document.get("type")
        if isinstance(event, str) and "choices" not in document:
            return cls(raw, _native_events(event, document), event=event)
        model = document.get("model")
        model = model if isinstance(model, str) else None
        tier = document.get("service_tier")
        if "error" in document:
            return cls(raw, (_stream_error(document["error"]),), model)
        choices = document.get("choices")
        events: list[StreamEvent] = []
        for choice in choices if isinstance(choices, list) else ():
            if isinstance(choice, dict):
                events.extend(_choice_events(choice))
        usage_only = choices == [] and "usage" in document
        if isinstance(document.get("usage"), dict):
            events.append(UsageReport(Usage.from_json(document["usage"])))
        return cls(raw, tuple(events), model, usage_only, tier if isinstance(tier, str) else None)


def _native_events(event: str, document: dict[str, Any]) -> tuple[StreamEvent, ...]:
    """The typed events of a native upstream's event: its text (what the time to first token is
    measured by) and its error; the rest is its own API's to read."""
    if event == "error":
        inner = document.get("error")
        return (_stream_error(inner if isinstance(inner, dict) else document),)
    if event == "response.failed":
        response = document.get("response")
        return (_stream_error((response.get("error") if isinstance(response, dict) else None) or {}),)
    delta = document.get("delta")
    if event == "response.output_text.delta" and isinstance(delta, str) and delta:
        return (TextDelta(delta),)
    if event == "content_block_delta" and isinstance(delta, dict) and delta.get("type") == "text_delta":
        text = delta.get("text")
        return (TextDelta(text),) if isinstance(text, str) and text else ()
    return ()


def _stream_error(error: object) -> StreamError:
    given = error if isinstance(error, dict) else {"message": str(error)}

    def text(name: str) -> str | None:
        value = given.get(name)
        return value if isinstance(value, str) else None

    return StreamError(str(given.get("message") or ""), text("type"), text("param"), text("code"))


def _choice_events(choice: dict[str, Any]) -> list[StreamEvent]:
    index = choice.get("index")
    index = index if isinstance(index, int) and not isinstance(index, bool) else 0
    events: list[StreamEvent] = []
    delta = choice.get("delta")
    text = choice.get("text")
    if delta is None and isinstance(text, str) and text:
        events.append(TextDelta(text, index))  # a text_completion chunk: its choice's text
    if isinstance(delta, dict):
        content = delta.get("content")
        if isinstance(content, str) and content:
            events.append(TextDelta(content, index))
        for call in delta.get("tool_calls") or ():
            if isinstance(call, dict):
                given = call.get("function")
                function: dict[str, Any] = given if isinstance(given, dict) else {}
                position = call.get("index")
                events.append(ToolCallDelta(
                    position if isinstance(position, int) and not isinstance(position, bool) else 0,
                    _text(call.get("id")), _text(function.get("name")),
                    _text(function.get("arguments")) or ""))
    reason = choice.get("finish_reason")
    if isinstance(reason, str):
        events.append(Finish(reason, index))
    return events
