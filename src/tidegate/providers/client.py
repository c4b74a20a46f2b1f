"""The HTTP client of one provider: the hot path of every dispatched job.

It speaks OpenAI's chat completions and embeddings itself; for another API (Anthropic's
Messages) a provider adapter names the path with `post` and `stream` and reads the answer,
and `send` and `download` serve the calls that are not one request's answer (a provider's
Files and Batch APIs: see tidegate.dispatch.provider_batches.clients),
turning each streamed event into the chat chunks of the job's form with a `StreamDecoder`.
The key goes as `Authorization: Bearer` or, to an Anthropic upstream, as `x-api-key` with the
`anthropic-version` header.

One `UpstreamClient` holds one pooled aiohttp session (keep-alive, bounded pool) for the life of
a worker; opening a session per call would pay a TCP (and TLS) handshake on every request.
aiohttp was chosen over httpx by measurement: see `bench/http_client.py` and BENCHMARKS.md.

Every failure leaves as an `UpstreamError` whose `kind` and `retryable` tell the dispatcher what
to do; the API key is sent in a header and appears nowhere else (not in messages, reprs or logs).
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Final, Literal, NamedTuple, Self

import aiohttp
import orjson
from pydantic import SecretStr
from yarl import URL

from tidegate._lifecycle import Lifecycle
from tidegate.ai import NO_USAGE, Finish, StreamPart, ToolCall, ToolCallDelta, Usage, UsageReport
from tidegate.config import ProviderConfig
from tidegate.errors import ClientClosed, ConfigError, ProviderErrorBody, UpstreamError, UpstreamErrorKind
from tidegate.providers.ratelimit import RateLimitInfo, parse_retry_after
from tidegate.tracing import NOOP_SPAN, NOTHING, Span, tracer

# The errors and rate-limit types are re-exported: a caller of the client needs them all.
__all__ = [
    "ClientClosed",
    "RateLimitInfo",
    "StreamChunk",
    "StreamDecoder",
    "StreamSummary",
    "UpstreamClient",
    "UpstreamError",
    "UpstreamResponse",
    "UpstreamStream",
    "Usage",
    "parse_retry_after",
]

logger = logging.getLogger(__name__)

CHAT_PATH: Final = "/chat/completions"
EMBEDDINGS_PATH: Final = "/embeddings"
MESSAGE_LIMIT: Final = 500  # characters of the provider's error message kept in ours
# A connection that takes longer than this to establish will not do better by waiting: fail and
# let the dispatcher retry, rather than hold a slot for the provider's whole (long) timeout.
CONNECT_TIMEOUT_CAP_S: Final = 10.0
_DONE: Final = b"[DONE]"
ANTHROPIC_VERSION: Final = "2023-06-01"  # the Messages API version tidegate's Anthropic adapter speaks

Method = Literal["GET", "POST", "DELETE"]
"""The HTTP methods the client sends: POST for calls, GET to read a provider's files and batches."""

StreamDecoder = Callable[[bytes], tuple[list[bytes], bool]]
"""Reads one server-sent event's data: the chat.completion.chunk documents (JSON) it amounts to,
and whether it ends the stream."""


def _openai_decoder(data: bytes) -> tuple[list[bytes], bool]:
    """OpenAI's events already are chunks; `[DONE]` ends the stream."""
    return ([], True) if data == _DONE else ([data], False)

# What sending or reading can raise when the network or the provider fails (not our bugs).
_TRANSPORT_ERRORS: Final = (TimeoutError, aiohttp.ClientError)
_EXCERPT_BYTES: Final = 4096  # of an error body read for its message; error pages can be huge
_FIELD_LIMIT: Final = 100  # characters kept of a provider error's type, code or param


# ---------------------------------------------------------------------------- results


@dataclass(frozen=True, slots=True)
class UpstreamResponse:
    """A successful (2xx) answer. `headers` looks names up case-insensitively."""

    status: int
    body: dict[str, Any]
    headers: Mapping[str, str]
    latency_ms: float
    usage: Usage
    rate_limit: RateLimitInfo


@dataclass(frozen=True, slots=True)
class StreamChunk:
    """One `data:` event of a chat stream: its JSON as received, parsed, and read as typed events."""

    raw: bytes
    data: dict[str, Any]
    part: StreamPart

    @property
    def text(self) -> str:
        """The content this chunk adds (all choices' `delta.content`, usually one)."""
        return self.part.text


@dataclass(frozen=True, slots=True)
class StreamSummary:
    """What a finished stream amounts to; `UpstreamStream.summary` once `[DONE]` was read.

    `ttft_ms` is from sending the request to the first chunk that carries content (None if none
    did); `latency_ms` is to `[DONE]`. `usage` is the provider's final usage chunk (requested
    with `stream_options.include_usage`), zeros if it sent none.
    """

    status: int
    headers: Mapping[str, str]
    latency_ms: float
    ttft_ms: float | None
    usage: Usage
    rate_limit: RateLimitInfo
    chunks: int
    text: str
    finish_reason: str | None
    tool_calls: tuple[ToolCall, ...] = ()  # the first choice's, put together from their pieces


class _Answer(NamedTuple):
    """A 2xx answer as read, before its body is parsed."""

    status: int
    headers: Mapping[str, str]
    raw: bytes
    latency_ms: float

    def response(self, parsed: dict[str, Any]) -> UpstreamResponse:
        """The answer with its body parsed, its usage and rate-limit headers read."""
        return UpstreamResponse(self.status, parsed, self.headers, self.latency_ms,
                                Usage.from_json(parsed.get("usage")),
                                RateLimitInfo.from_headers(self.headers))


# ---------------------------------------------------------------------------- client


class UpstreamClient(Lifecycle):
    """A pooled HTTP client of one OpenAI-compatible provider.

    Use it as an async context manager (or call `open()` and `close()`); a closed client cannot be
    reopened. `max_connections` bounds the pool: calls beyond it wait for a free connection.

        async with UpstreamClient(provider) as client:
            response = await client.chat({"model": "gpt-4.1", "messages": [...]})
    """

    unavailable_error = ClientClosed

    def __init__(self, provider: ProviderConfig, *, max_connections: int = 256) -> None:
        if max_connections < 1:
            raise ConfigError(f"max_connections must be at least 1, not {max_connections}")
        base = provider.base_url.rstrip("/")
        try:
            self._chat_url = URL(base + CHAT_PATH)
            self._embeddings_url = URL(base + EMBEDDINGS_PATH)
        except ValueError as exc:
            raise ConfigError(f"provider {provider.name}: invalid base_url {base!r}: {exc}") from exc
        if self._chat_url.scheme not in ("http", "https") or not self._chat_url.host:
            raise ConfigError(f"provider {provider.name}: base_url must be an http(s) URL, not {base!r}")
        super().__init__()
        self.provider = provider
        self.max_connections = max_connections
        self._session: aiohttp.ClientSession | None = None
        self._key: SecretStr | None = None  # kept only to scrub it from provider messages
        self._timeout = aiohttp.ClientTimeout(
            total=provider.timeout_s, sock_connect=min(provider.timeout_s, CONNECT_TIMEOUT_CAP_S)
        )
        # A stream may rightly last longer than any total timeout; what must not happen is
        # silence, so a stream fails when no byte arrives for the provider's timeout.
        self._stream_timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=self._timeout.sock_connect, sock_read=provider.timeout_s
        )

    def __repr__(self) -> str:
        return (f"UpstreamClient(provider={self.provider.name!r}, base_url={self.provider.base_url!r}, "
                f"state={self._lifecycle.value})")

    # -- lifecycle

    async def _open(self) -> None:
        """Create the pooled session."""
        key = self.provider.api_key()
        if key is None and self.provider.api_key_env is not None:
            raise ConfigError(f"provider {self.provider.name}: the environment variable "
                              f"{self.provider.api_key_env} holding its API key is not set")
        headers = {"Content-Type": "application/json", "Accept": "application/json",
                   "User-Agent": "tidegate"}
        if self.provider.api == "anthropic":
            headers["anthropic-version"] = ANTHROPIC_VERSION
            if key is not None:
                headers["x-api-key"] = key.get_secret_value()
        elif key is not None:
            headers["Authorization"] = f"Bearer {key.get_secret_value()}"
        self._key = key
        connector = aiohttp.TCPConnector(limit=self.max_connections, limit_per_host=self.max_connections,
                                         ttl_dns_cache=300)
        self._session = aiohttp.ClientSession(headers=headers, timeout=self._timeout,
                                              connector=connector, raise_for_status=False)

    async def _close(self) -> None:
        """Close the pool; in-flight calls fail with a connection error."""
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    def _described(self) -> str:
        return repr(self)  # names the provider, so a log line says which pool it was

    def _require_session(self) -> aiohttp.ClientSession:
        self._check_open()
        assert self._session is not None  # set by _open, cleared only by _close
        return self._session

    # -- calls

    async def chat(self, body: dict[str, Any]) -> UpstreamResponse:
        """POST /chat/completions, non-streaming (a `stream` flag in `body` is dropped: use
        chat_stream for that). Raises UpstreamError on any failure."""
        if "stream" in body or "stream_options" in body:
            body = {k: v for k, v in body.items() if k not in ("stream", "stream_options")}
        return await self._call(self._chat_url, CHAT_PATH, body, expect="choices")

    async def embeddings(self, body: dict[str, Any]) -> UpstreamResponse:
        """POST /embeddings. Raises UpstreamError on any failure."""
        return await self._call(self._embeddings_url, EMBEDDINGS_PATH, body, expect="data")

    def chat_stream(self, body: dict[str, Any],
                    stream_options: Mapping[str, Any] | None = None) -> UpstreamStream:
        """POST /chat/completions with `stream: true` and `stream_options`: the request's (read
        from its struct by the caller), `include_usage` added.

        The request is sent on first iteration (or on entering `async with`); chunks are yielded
        as they arrive. Prefer `async with client.chat_stream(body) as stream:` so that a loop left
        early still releases its connection; `stream.summary` is set after `[DONE]`.
        """
        options = {**(stream_options or {}), "include_usage": True}
        return UpstreamStream(self, {**body, "stream": True, "stream_options": options})

    async def post(self, path: str, body: dict[str, Any], *, expect: str) -> UpstreamResponse:
        """POST `path` (under the base URL) for a JSON answer holding a non-empty `expect` list.
        Raises UpstreamError on any failure."""
        return await self._call(self._url(path), path, body, expect=expect)

    def stream(self, path: str, body: dict[str, Any],
               decode: StreamDecoder = _openai_decoder) -> UpstreamStream:
        """POST `path` for server-sent events, each read by `decode` into chat chunks (see
        chat_stream, which is this for OpenAI's events; OpenAI's by default)."""
        return UpstreamStream(self, body, path=path, decode=decode)

    async def send(self, method: Method, path: str, *, body: dict[str, Any] | None = None,
                   form: aiohttp.FormData | None = None) -> UpstreamResponse:
        """`method` `path` (under the base URL) for an answer that is a JSON object: the calls of a
        Files or Batch API. `body` goes as JSON, `form` as multipart/form-data (an upload), neither
        as no body. Raises UpstreamError on any failure."""
        data = orjson.dumps(body) if body is not None else form
        answer = await self._exchange(method, self._url(path), path, data)
        parsed = self._parse_body(path, answer.raw, answer.headers, expect=None, method=method)
        return answer.response(parsed)

    async def download(self, path: str) -> bytes:
        """GET `path` (under the base URL) for its body as it is (a file's content). Raises
        UpstreamError on any failure."""
        return (await self._exchange("GET", self._url(path), path, None)).raw

    def _url(self, path: str) -> URL:
        return URL(self.provider.base_url.rstrip("/") + path)

    async def _call(self, url: URL, path: str, body: dict[str, Any], *, expect: str) -> UpstreamResponse:
        answer = await self._exchange("POST", url, path, orjson.dumps(body))
        return answer.response(self._parse_body(path, answer.raw, answer.headers, expect=expect))

    async def _exchange(self, method: Method, url: URL, path: str,
                        data: bytes | aiohttp.FormData | None) -> _Answer:
        """Send one request and read its whole answer; UpstreamError unless its status is 2xx."""
        session = self._require_session()
        payload: Any = data
        headers: dict[str, str] | None = None
        if isinstance(data, aiohttp.FormData):
            payload = data()  # the session's JSON Content-Type would win over the form's own
            headers = {"Content-Type": payload.content_type}
        started = time.perf_counter()
        with self._http_span(url, method) as span:
            try:
                async with session.request(method, url, data=payload, headers=headers,
                                           allow_redirects=False) as response:
                    raw = await response.read()
            except _TRANSPORT_ERRORS as exc:
                raise self._transport_error(path, exc, method) from exc
            _answered(span, response.status)
        latency_ms = (time.perf_counter() - started) * 1000.0
        if not 200 <= response.status < 300:
            raise self._status_error(path, response.status, response.headers, raw, method)
        return _Answer(response.status, response.headers, raw, latency_ms)

    # -- tracing

    def _http_span(self, url: URL, method: Method = "POST") -> AbstractContextManager[Span]:
        """The client span of one HTTP request (tidegate.tracing), current while it runs."""
        tracing = tracer()
        if not tracing.enabled:
            return NOTHING
        return tracing.span(method, kind="client", attributes=_http_attributes(url, method))

    def _start_http_span(self, url: URL) -> Span:
        """The client span of a streamed request, ended by its stream."""
        tracing = tracer()
        if not tracing.enabled:
            return NOOP_SPAN
        return tracing.start("POST", kind="client", attributes=_http_attributes(url))

    # -- turning failures into UpstreamError

    def _error(self, message: str, *, kind: UpstreamErrorKind, status: int | None = None,
               retry_after_s: float | None = None, rate_limit: RateLimitInfo | None = None,
               body: ProviderErrorBody | None = None) -> UpstreamError:
        if body is not None:
            body = ProviderErrorBody(self._scrub(body.message), body.type, body.code, body.param)
        error = UpstreamError(self._scrub(message), kind=kind, status=status,
                              retry_after_s=retry_after_s, rate_limit=rate_limit, body=body)
        logger.debug("upstream call failed (%s): %s", kind, error)
        return error

    def _scrub(self, text: str) -> str:
        # Providers sometimes quote the key they refused ("Incorrect API key provided: sk-...").
        if self._key is not None:
            secret = self._key.get_secret_value()
            if secret:
                text = text.replace(secret, "[api key]")
        return text

    def _transport_error(self, path: str, exc: Exception, method: Method = "POST") -> UpstreamError:
        """The UpstreamError for a timeout or connection failure while sending or reading."""
        name = self.provider.name
        # Checked first: aiohttp's read timeouts are ClientErrors too, but they mean "too slow".
        if isinstance(exc, TimeoutError):
            return self._error(f"{name}: {method} {path} timed out (timeout_s={self.provider.timeout_s:g}, "
                               f"{type(exc).__name__})", kind="timeout")
        detail = str(exc) or "no detail"
        return self._error(f"{name}: {method} {path} failed: {type(exc).__name__}: {detail}",
                           kind="connection")

    def _status_error(self, path: str, status: int, headers: Mapping[str, str], raw: bytes,
                      method: Method = "POST") -> UpstreamError:
        rate_limit = RateLimitInfo.from_headers(headers)
        retry_after_s = _retry_after_s(headers)
        kind: UpstreamErrorKind
        if status == 429:
            kind = "rate_limited"
            if retry_after_s is None:
                retry_after_s = rate_limit.wait_hint_s()
        elif status in (408, 409) or status >= 500:
            kind = "server"
        else:
            kind = "client"
        body = _provider_error(raw)
        message = f"{self.provider.name}: {method} {path} answered HTTP {status}: {body.message}"
        return self._error(message, kind=kind, status=status, retry_after_s=retry_after_s,
                           rate_limit=rate_limit, body=body)

    def _parse_body(self, path: str, raw: bytes, headers: Mapping[str, str], *,
                    expect: str | None, method: Method = "POST") -> dict[str, Any]:
        """The JSON object answered, holding a non-empty `expect` list unless that is None."""
        try:
            parsed = orjson.loads(raw)
        except orjson.JSONDecodeError:
            parsed = None
            problem = f"a body that is not valid JSON ({len(raw)} bytes)"
        else:
            problem = ("a JSON body that is not an object" if expect is None
                       else f"a JSON body without a {expect!r} list")
        listed = expect is None or (isinstance(parsed, dict) and isinstance(parsed.get(expect), list)
                                    and bool(parsed[expect]))
        if isinstance(parsed, dict) and listed:
            return parsed
        raise self._error(f"{self.provider.name}: {method} {path} answered {problem}", kind="malformed",
                          status=200, rate_limit=RateLimitInfo.from_headers(headers))


def _http_attributes(url: URL, method: Method = "POST") -> dict[str, str | int]:
    """The HTTP semantic conventions' attributes of a request to `url`."""
    return {"http.request.method": method, "url.full": str(url), "server.address": url.host or "",
            "server.port": url.port or 0}


def _answered(span: Span, status: int) -> None:
    """The response's status on its span; an error status fails it."""
    if span is NOOP_SPAN:
        return  # tracing off: not even the attributes are built
    span.set_attributes({"http.response.status_code": status})
    if status >= 400:
        span.fail(str(status))


def _retry_after_s(headers: Mapping[str, str]) -> float | None:
    # OpenAI adds a millisecond-precise `retry-after-ms` beside the whole-second Retry-After.
    precise = headers.get("retry-after-ms")
    if precise is not None:
        try:
            milliseconds = float(precise)
        except ValueError:
            pass
        else:
            if milliseconds >= 0:
                return milliseconds / 1000.0
    return parse_retry_after(headers.get("retry-after"))


def _provider_error(raw: bytes) -> ProviderErrorBody:
    """The provider's error: its message (see _provider_message), and the type, code and param of
    an OpenAI-shaped `{"error": {...}}` when they are strings."""
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        data = None
    error = data.get("error") if isinstance(data, dict) else None
    fields = error if isinstance(error, dict) else {}

    def text(name: str) -> str | None:
        value = fields.get(name)
        return value[:_FIELD_LIMIT] if isinstance(value, str) and value else None

    return ProviderErrorBody(_provider_message(raw), text("type"), text("code"), text("param"))


def _provider_message(raw: bytes) -> str:
    """The provider's own words from an error body: OpenAI's `{"error": {"message": ...}}`, a few
    common variants, or the body's text; whitespace collapsed, truncated to MESSAGE_LIMIT."""
    text: str | None = None
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        data = None
    if isinstance(data, dict):
        error = data.get("error")
        if isinstance(error, dict):
            error = error.get("message")
        for candidate in (error, data.get("message"), data.get("detail")):
            if isinstance(candidate, str) and candidate.strip():
                text = candidate
                break
    if text is None:
        text = raw[:_EXCERPT_BYTES].decode("utf-8", errors="replace")
    text = " ".join(text.split()) or "(empty body)"
    return text if len(text) <= MESSAGE_LIMIT else text[: MESSAGE_LIMIT - 1] + "…"


# ---------------------------------------------------------------------------- streams


@dataclass(slots=True)
class _StreamProgress:
    started: float
    ttft_ms: float | None = None
    chunks: int = 0
    usage: Usage = NO_USAGE
    finish_reason: str | None = None
    text: list[str] = field(default_factory=list)
    # A tool call's pieces by its index: id and name (they come first), then its arguments.
    calls: dict[int, tuple[str, str, list[str]]] = field(default_factory=dict)

    def add_call(self, delta: ToolCallDelta) -> None:
        call_id, name, arguments = self.calls.get(delta.index, ("", "", []))
        arguments.append(delta.arguments)
        self.calls[delta.index] = (delta.id or call_id, delta.name or name, arguments)

    def tool_calls(self) -> tuple[ToolCall, ...]:
        return tuple(ToolCall(call_id, name, "".join(arguments))
                     for _, (call_id, name, arguments) in sorted(self.calls.items()))


class UpstreamStream:
    """The chunks of one streamed chat completion, as an async iterator of StreamChunk.

    Raises UpstreamError like the other calls, before the first chunk (an HTTP error status) or
    during the stream (a cut connection, an `error` event, a line that is not JSON, an end
    without `[DONE]`, or without what `decode` takes for the end). `summary` is None until then,
    then a StreamSummary.
    """

    def __init__(self, client: UpstreamClient, body: dict[str, Any], *, path: str = CHAT_PATH,
                 decode: StreamDecoder = _openai_decoder) -> None:
        self._client = client
        self._body = body
        self._path = path
        self._decode = decode
        self._response: aiohttp.ClientResponse | None = None
        self._chunks: AsyncGenerator[StreamChunk, None] | None = None
        self._closed = False
        self._span: Span = NOOP_SPAN  # the request's client span, from its start to its close
        self.summary: StreamSummary | None = None

    async def __aenter__(self) -> Self:
        await self._start()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.aclose()

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> StreamChunk:
        if self._chunks is None:
            await self._start()
        assert self._chunks is not None
        try:
            return await anext(self._chunks)
        except StopAsyncIteration:
            await self.aclose()  # exhausted: the connection goes back now
            raise
        except BaseException as exc:
            self._span.fail(type(exc).__name__)
            await self.aclose()  # failed or cancelled: the connection goes back now
            raise

    async def aclose(self) -> None:
        """Release the connection; a stream not read to `[DONE]` is cut. Idempotent."""
        self._closed = True
        if self._chunks is not None:
            await self._chunks.aclose()
        response, self._response = self._response, None
        if response is not None:
            response.release()
        span, self._span = self._span, NOOP_SPAN
        span.end()

    async def _start(self) -> None:
        if self._chunks is not None:
            return
        if self._closed:
            raise ClientClosed("this stream was closed; start a new one")
        client = self._client
        # The chat URL is built once per client; another endpoint's (a legacy completion's, a
        # native API's) per stream.
        url = client._chat_url if self._path == CHAT_PATH else client._url(self._path)
        self._span = client._start_http_span(url)
        try:
            self._chunks = await self._send(url)
        except BaseException as exc:
            self._span.fail(type(exc).__name__)
            await self.aclose()  # a failed start is final: iterating again must not resend
            raise

    async def _send(self, url: URL) -> AsyncGenerator[StreamChunk, None]:
        client = self._client
        session = client._require_session()
        progress = _StreamProgress(started=time.perf_counter())
        try:
            response = await session.post(url, data=orjson.dumps(self._body),
                                          timeout=client._stream_timeout, allow_redirects=False)
        except _TRANSPORT_ERRORS as exc:
            raise client._transport_error(self._path, exc) from exc
        self._response = response
        _answered(self._span, response.status)
        if response.status != 200:
            try:
                raw = await response.content.read(_EXCERPT_BYTES)
            except _TRANSPORT_ERRORS:  # the status alone says enough
                raw = b""
            raise client._status_error(self._path, response.status, response.headers, raw)
        return self._read(response, progress)

    async def _read(self, response: aiohttp.ClientResponse,
                    progress: _StreamProgress) -> AsyncGenerator[StreamChunk, None]:
        client = self._client
        done = False
        try:
            async for data in _sse_data(response.content):
                chunks, done = self._decode(data)
                for chunk in chunks:
                    yield self._chunk(chunk, progress, response.headers)
                if done:
                    break
            if done:
                # Reading to the end lets the connection go back to the pool instead of closing.
                await response.content.read()
        except _TRANSPORT_ERRORS as exc:
            raise client._transport_error(self._path, exc) from exc
        if not done:
            raise client._error(f"{client.provider.name}: POST {self._path} stream ended before its end",
                                kind="malformed", status=response.status,
                                rate_limit=RateLimitInfo.from_headers(response.headers))
        self.summary = StreamSummary(
            status=response.status, headers=response.headers,
            latency_ms=(time.perf_counter() - progress.started) * 1000.0, ttft_ms=progress.ttft_ms,
            usage=progress.usage, rate_limit=RateLimitInfo.from_headers(response.headers),
            chunks=progress.chunks, text="".join(progress.text), finish_reason=progress.finish_reason,
            tool_calls=progress.tool_calls(),
        )

    def _chunk(self, data: bytes, progress: _StreamProgress, headers: Mapping[str, str]) -> StreamChunk:
        client = self._client
        try:
            parsed = orjson.loads(data)
        except orjson.JSONDecodeError:
            parsed = None
        if not isinstance(parsed, dict):
            raise client._error(f"{client.provider.name}: POST {self._path} streamed an event that is not "
                                f"a JSON object ({len(data)} bytes)", kind="malformed", status=200,
                                rate_limit=RateLimitInfo.from_headers(headers))
        if "error" in parsed:  # a provider failing after it already answered 200
            raise client._error(f"{client.provider.name}: POST {self._path} stream failed: "
                                f"{_provider_message(data)}", kind="server", status=200,
                                rate_limit=RateLimitInfo.from_headers(headers))
        chunk = StreamChunk(data, parsed, StreamPart.of(data, parsed))
        progress.chunks += 1
        text = chunk.text
        if text:
            if progress.ttft_ms is None:
                progress.ttft_ms = (time.perf_counter() - progress.started) * 1000.0
            progress.text.append(text)
        for event in chunk.part.events:
            if isinstance(event, UsageReport):
                progress.usage = event.usage
            elif isinstance(event, Finish):
                progress.finish_reason = event.reason
            elif isinstance(event, ToolCallDelta):
                progress.add_call(event)
        return chunk


async def _sse_data(content: aiohttp.StreamReader) -> AsyncIterator[bytes]:
    """The data of each server-sent event, as bytes arrive (multi-line data joined by newlines;
    comments and other fields skipped). A final event without its blank line still counts."""
    buffer = bytearray()
    data: list[bytes] = []
    async for piece in content.iter_any():
        buffer += piece
        start = 0
        while (end := buffer.find(b"\n", start)) >= 0:
            line = bytes(buffer[start:end]).rstrip(b"\r")
            start = end + 1
            if not line:
                if data:
                    yield b"\n".join(data)
                    data.clear()
            elif line.startswith(b"data:"):
                value = line[5:]
                data.append(value[1:] if value.startswith(b" ") else value)
        del buffer[:start]
    if buffer.startswith(b"data:"):
        value = bytes(buffer[5:]).rstrip(b"\r")
        data.append(value[1:] if value.startswith(b" ") else value)
    if data:
        yield b"\n".join(data)
