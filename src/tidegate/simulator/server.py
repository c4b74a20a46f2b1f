"""A simulated OpenAI-compatible provider (aiohttp.web) for the demo, the tests and the benchmarks.

It serves `/v1/models`, `/v1/chat/completions` (plain and SSE streams), `/v1/embeddings`, OpenAI's
legacy `/v1/completions` and `/v1/moderations` (see legacy.py), Anthropic's `/v1/messages` (plain
and streamed, in Anthropic's shapes: see messages.py), OpenAI's `/v1/responses` (plain and
streamed typed events) and `/v1/responses/compact` (see responses.py), OpenAI's Files and Batch
APIs (`/v1/files`, `/v1/batches`: see batches.py) and Anthropic's Message Batches
(`/v1/messages/batches`: see message_batches.py) for the price table's models (a chat answer stops
at a `stop` sequence it meets, naming it in the choice's `stop_reason` as vLLM does, and calls a
function when the request's tools lead to one: see requests.parse_chat), validates requests like a
real provider, answers with realistic usage, enforces its own per-model RPM/TPM over a sliding
window (429 with Retry-After and x-ratelimit-* headers), and injects faults (500, 503, timeouts,
connection resets, malformed bodies) at configured rates or on demand. A repeated prompt prefix is
reported as cached, as OpenAI's automatic prompt caching and Anthropic's `cache_control`
breakpoints report it (see caching.py). A seeded simulator given the same requests answers the
same way. The bodies of the last requests it accepted are kept (`received`), so a test can see
what an upstream was sent.

Control and observation endpoints live under `/_sim/` and are served only on a loopback address:
`GET /_sim/stats`, `GET|POST /_sim/settings`, `POST /_sim/reset`, `POST /_sim/faults`.

    simulator = Simulator(SimulatorSettings(seed=7))
    async with simulator.running() as base_url:   # http://127.0.0.1:<port>/v1
        ...
"""

from __future__ import annotations

import asyncio
import functools
import hmac
import ipaddress
import math
import random
import signal
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from email.utils import format_datetime
from typing import Any, Final, Literal, TypeVar, cast, get_args

import orjson
from aiohttp import web
from pydantic import ValidationError

from tidegate.errors import ConfigError
from tidegate.simulator.answers import (
    FRAMES,
    Frames,
    Reply,
    Wire,
    check_dimensions,
    completion_body,
    completion_id,
    draw_completion_tokens,
    embeddings_body,
)
from tidegate.simulator.batches import EMBEDDINGS_URL, BatchService, LineAnswer
from tidegate.simulator.caching import PromptCache
from tidegate.simulator.content import (
    sample_lognormal,
)
from tidegate.simulator.legacy import (
    CompletionRequest,
    ModerationRequest,
    moderation_body,
    parse_completion,
    parse_moderation,
    text_completion_body,
    text_completion_frames,
)
from tidegate.simulator.limits import Admission, ModelStats, SlidingWindow
from tidegate.simulator.message_batches import MESSAGES_URL, MessageBatchService
from tidegate.simulator.messages import (
    anthropic_error_body,
    parse_messages,
)
from tidegate.simulator.requests import (
    ChatRequest,
    EmbeddingsRequest,
    InvalidRequest,
    error_body,
    parse_chat,
    parse_embeddings,
    parse_json_object,
)
from tidegate.simulator.responses import parse_compaction, parse_responses
from tidegate.simulator.settings import (
    FAULT_RATES,
    ModelBehaviour,
    ServedModel,
    SimulatorSettings,
)

__all__ = ["FaultName", "InjectedFault", "Simulator", "is_loopback", "serve"]

FaultName = Literal["error", "unavailable", "timeout", "reset", "malformed", "status"]
# Settings field of each fault drawn at random, in the order the draw checks them.
_RATE_FAULTS: Final[tuple[tuple[str, FaultName], ...]] = tuple(
    zip(FAULT_RATES, ("error", "unavailable", "timeout", "reset", "malformed"), strict=True)
)
OWNER: Final = "tidegate-simulator"
# Handlers still running at shutdown (a held "timeout", a slow stream) get this long to finish;
# a simulator that takes a minute to stop (aiohttp's default) would slow every test down.
SHUTDOWN_GRACE_S: Final = 0.5
MAX_BODY_BYTES: Final = 32 * 1024 * 1024  # long-context prompts are large
JSON: Final = "application/json"

_R = TypeVar("_R", ChatRequest, EmbeddingsRequest, ModerationRequest)
_Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
REQUEST_LOG_SIZE: Final = 256  # request bodies kept for `Simulator.received`
_UNLIMITED: Final = Admission(True, None, None, None, 0.0, 0.0)


@dataclass(frozen=True, slots=True)
class InjectedFault:
    """A fault for the next `times` accepted requests of one model (ahead of the random ones).

    `status` and `message` are for the "status" fault: any HTTP status with an OpenAI-shaped
    error body (e.g. 422, to see how a client treats it).
    """

    fault: FaultName
    times: int = 1
    status: int = 500
    message: str | None = None


@dataclass(frozen=True, slots=True)
class _Plan:
    """What was decided for an accepted request before answering it."""

    completion: int
    finish: str
    headers: dict[str, str]
    fault: InjectedFault | None


def is_loopback(host: str) -> bool:
    """Whether `host` names only this machine ("localhost" or a loopback address)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class Simulator:
    """The simulated provider's state (settings, limits, stats, random generators) and its
    aiohttp application. `running()` serves it on the caller's event loop."""

    def __init__(self, settings: SimulatorSettings | None = None) -> None:
        self._settings = settings or SimulatorSettings()
        self._served = self._settings.served_models()
        self._windows: dict[str, SlidingWindow] = {}
        self._stats: dict[str, ModelStats] = {}
        self._rngs: dict[str, random.Random] = {}
        self._injected: dict[str, deque[InjectedFault]] = {}
        self._cache = PromptCache()
        self._received: deque[tuple[str, dict[str, Any]]] = deque(maxlen=REQUEST_LOG_SIZE)
        self._started = time.monotonic()
        self._batches = BatchService(lambda: self._settings, self._authorized, self._answer_line)
        self._message_batches = MessageBatchService(lambda: self._settings, self._authorized,
                                                    self._answer_line, lambda: self._batches.stats)

    # -- control (the Python API; /_sim/ calls these)

    @property
    def settings(self) -> SimulatorSettings:
        """The settings in force."""
        return self._settings

    @property
    def models(self) -> tuple[str, ...]:
        """Names of the models served."""
        return tuple(self._served)

    def configure(self, patch: Mapping[str, Any]) -> SimulatorSettings:
        """Merge `patch` into the settings (see SimulatorSettings.merged) and return them; a new
        seed reseeds every model's generator. Raises pydantic's ValidationError when invalid."""
        settings = self._settings.merged(patch)
        reseed = settings.seed != self._settings.seed
        self._settings = settings
        self._served = settings.served_models()
        if reseed:
            self._rngs.clear()
        return settings

    def reset(self) -> None:
        """Forget stats, rate-limit windows, injected faults and the prompt cache; restart every
        generator from the seed, so what follows repeats what followed the start."""
        self._windows.clear()
        self._stats.clear()
        self._rngs.clear()
        self._injected.clear()
        self._cache.reset()
        self._batches.reset()
        self._message_batches.reset()
        self._started = time.monotonic()

    def inject(self, model: str, fault: InjectedFault) -> None:
        """Queue a fault for the next accepted requests of `model`. Raises ConfigError for a
        model not served."""
        if model not in self._served:
            raise ConfigError(f"the simulator does not serve a model named {model!r}")
        self._injected.setdefault(model, deque()).append(fault)

    def received(self, path: str) -> list[dict[str, Any]]:
        """The bodies of the last accepted requests to `path` ("/v1/responses", say), oldest first."""
        return [body for where, body in self._received if where == path]

    def stats(self) -> dict[str, ModelStats]:
        """What each model has seen (only models that received a request)."""
        return dict(self._stats)

    def stats_dict(self) -> dict[str, Any]:
        """`stats()` as JSON-ready data, with the window in force, and what the batch API saw
        (batch lines are not counted in the models' stats: they are not live traffic)."""
        return {"window_s": self._settings.window_s,
                "models": {name: stats.to_dict() for name, stats in self._stats.items()},
                "batches": self._batches.stats.to_dict()}

    # -- serving

    def app(self, *, control: bool = True) -> web.Application:
        """A new aiohttp application serving this simulator (with `/_sim/` if `control`)."""
        app = web.Application(client_max_size=MAX_BODY_BYTES)
        app.router.add_get("/v1/models", self._list_models)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/v1/embeddings", self._embeddings)
        app.router.add_post("/v1/messages", self._messages)
        app.router.add_post("/v1/responses", self._responses)
        app.router.add_post("/v1/responses/compact", self._endpoint("chat", parse_compaction))
        app.router.add_post("/v1/completions", self._endpoint("completion", parse_completion))
        app.router.add_post("/v1/moderations", self._endpoint("moderation", parse_moderation))
        batches = self._batches
        app.router.add_post("/v1/files", batches.create_file)
        app.router.add_get("/v1/files/{file_id}", batches.get_file)
        app.router.add_get("/v1/files/{file_id}/content", batches.file_content)
        app.router.add_delete("/v1/files/{file_id}", batches.delete_file)
        app.router.add_post("/v1/batches", batches.create_batch)
        app.router.add_get("/v1/batches", batches.list_batches)
        app.router.add_get("/v1/batches/{batch_id}", batches.get_batch)
        app.router.add_post("/v1/batches/{batch_id}/cancel", batches.cancel_batch)
        app.on_cleanup.append(lambda _: batches.close())
        messages = self._message_batches
        app.router.add_post("/v1/messages/batches", messages.create)
        app.router.add_get("/v1/messages/batches", messages.list_batches)
        app.router.add_get("/v1/messages/batches/{batch_id}", messages.retrieve)
        app.router.add_get("/v1/messages/batches/{batch_id}/results", messages.results)
        app.router.add_post("/v1/messages/batches/{batch_id}/cancel", messages.cancel)
        app.on_cleanup.append(lambda _: messages.close())
        if control:
            app.router.add_get("/_sim/stats", self._get_stats)
            app.router.add_get("/_sim/settings", self._get_settings)
            app.router.add_post("/_sim/settings", self._post_settings)
            app.router.add_post("/_sim/reset", self._post_reset)
            app.router.add_post("/_sim/faults", self._post_fault)
        return app

    @asynccontextmanager
    async def running(self, host: str = "127.0.0.1", port: int = 0, *,
                      allow_remote: bool = False) -> AsyncIterator[str]:
        """Serve on `host:port` (0: a free port) until the block ends; yields the base URL
        (`http://host:port/v1`). A non-loopback host needs `allow_remote`, and is then served
        without the `/_sim/` endpoints."""
        loopback = is_loopback(host)
        if not loopback and not allow_remote:
            raise ConfigError(f"refusing to serve the simulator on non-loopback host {host!r} "
                              "(pass allow_remote to mean it)")
        runner = web.AppRunner(self.app(control=loopback), handler_cancellation=True,
                               shutdown_timeout=SHUTDOWN_GRACE_S, access_log=None)
        await runner.setup()
        try:
            site = web.TCPSite(runner, host, port)
            try:
                await site.start()
            except OSError as exc:  # port taken, address not of this machine
                raise ConfigError(f"the simulator cannot listen on {host}:{port}: {exc}") from exc
            bound_port = runner.addresses[0][1]
            url_host = f"[{host.strip('[]')}]" if ":" in host else host
            yield f"http://{url_host}:{bound_port}/v1"
        finally:
            await runner.cleanup()

    # -- per-model state

    def _rng(self, model: str) -> random.Random:
        rng = self._rngs.get(model)
        if rng is None:
            # One generator per model, seeded by name: traffic to one model does not change what
            # another answers. A string seed hashes with SHA-512, the same in every process.
            rng = self._rngs[model] = random.Random(f"{self._settings.seed}:{model}")
        return rng

    def _model_stats(self, model: str) -> ModelStats:
        stats = self._stats.get(model)
        if stats is None:
            stats = self._stats[model] = ModelStats(
                accepted_at_s=deque(maxlen=self._settings.stats_max_timestamps))
        return stats

    def _admit(self, served: ServedModel, tokens: int) -> tuple[Admission, dict[str, str]]:
        model = served.behaviour
        # One clock for the limiter and the stats, so the stats show exactly what was limited.
        now = time.monotonic() - self._started
        if model.rpm is None and model.tpm is None:
            admission = _UNLIMITED
        else:
            window = self._windows.setdefault(served.name, SlidingWindow())
            admission = window.admit(now, self._settings.window_s, tokens, model.rpm, model.tpm)
        if admission.accepted:
            stats = self._model_stats(served.name)
            stats.accepted += 1
            stats.accepted_at_s.append(now)
        return admission, _limit_headers(model, admission)

    def _next_fault(self, served: ServedModel, rng: random.Random) -> InjectedFault | None:
        queued = self._injected.get(served.name)
        if queued:
            fault = queued[0]
            if fault.times <= 1:
                queued.popleft()
            else:
                queued[0] = InjectedFault(fault.fault, fault.times - 1, fault.status, fault.message)
            return fault
        behaviour = served.behaviour
        if not any(getattr(behaviour, rate) for rate, _ in _RATE_FAULTS):
            return None  # no draw: turning faults off leaves the rest of the sequence unchanged
        draw = rng.random()
        for rate, name in _RATE_FAULTS:
            draw -= getattr(behaviour, rate)
            if draw < 0:
                return InjectedFault(name)
        return None

    # -- the OpenAI-compatible API

    def _authorized(self, request: web.Request) -> bool:
        key = self._settings.require_api_key
        if key is None:
            return True
        # As the real APIs: OpenAI's takes the key as a Bearer token only, Anthropic's as x-api-key
        # too (its SDKs send either).
        secret = key.get_secret_value().encode()
        bearer = hmac.compare_digest(request.headers.get("Authorization", "").encode(), b"Bearer " + secret)
        if bearer or not request.path.startswith(MESSAGES_URL):
            return bearer
        return hmac.compare_digest(request.headers.get("x-api-key", "").encode(), secret)

    async def _list_models(self, request: web.Request) -> web.StreamResponse:
        if not self._authorized(request):
            return _unauthorized()
        data = [{"id": name, "object": "model", "created": 0, "owned_by": OWNER} for name in self._served]
        return _json(200, {"object": "list", "data": data})

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        try:
            chat, served = await self._accept(request, "chat", parse_chat)
        except InvalidRequest as exc:
            return _error_response(exc)
        return await self._answer(request, served, chat)

    async def _messages(self, request: web.Request) -> web.StreamResponse:
        try:
            chat, served = await self._accept(request, "chat", parse_messages)
        except InvalidRequest as exc:
            return web.Response(status=exc.status, body=anthropic_error_body(exc.status, exc.message),
                                content_type=JSON)
        return await self._answer(request, served, chat)

    async def _responses(self, request: web.Request) -> web.StreamResponse:
        try:
            chat, served = await self._accept(request, "chat", parse_responses)
        except InvalidRequest as exc:
            return _error_response(exc)
        return await self._answer(request, served, chat)

    async def _embeddings(self, request: web.Request) -> web.StreamResponse:
        try:
            embed, served = await self._accept(request, "embeddings", parse_embeddings)
            check_dimensions(embed, served)
        except InvalidRequest as exc:
            return _error_response(exc)
        return await self._answer(request, served, embed)

    def _endpoint(self, kind: Literal["chat", "completion", "moderation"],
                  parse: Callable[[dict[str, Any]], _R]) -> _Handler:
        """The handler of an endpoint whose requests `parse` reads into those of a model of `kind`
        (a compaction, a legacy completion or moderation): accepted as any other request, then
        answered in its own wire format."""

        async def handle(request: web.Request) -> web.StreamResponse:
            try:
                parsed, served = await self._accept(request, kind, parse)
            except InvalidRequest as exc:
                return _error_response(exc)
            return await self._answer(request, served, parsed)

        return handle

    async def _accept(self, request: web.Request, kind: str,
                      parse: Callable[[dict[str, Any]], _R]) -> tuple[_R, ServedModel]:
        """Authorize, validate, and find the model; InvalidRequest for any refusal."""
        if not self._authorized(request):
            raise InvalidRequest("Incorrect API key provided. You can find your API key in your "
                                 "provider's dashboard.", status=401, code="invalid_api_key")
        body = parse_json_object(await request.read())
        parsed = parse(body)
        served = self._serving(parsed.model, kind)
        self._model_stats(served.name).received += 1
        self._received.append((request.path, body))
        return parsed, served

    def _serving(self, model: str, kind: str) -> ServedModel:
        """The served model of that name and kind, or InvalidRequest."""
        served = self._served.get(model)
        if served is None:
            raise InvalidRequest(f"The model `{model}` does not exist or you do not have access "
                                 "to it.", status=404, param="model", code="model_not_found")
        if served.kind != kind:
            raise InvalidRequest(f"The model `{model}` does not support the {kind} endpoint.",
                                 param="model", code="invalid_model")
        return served

    async def _answer(self, request: web.Request, served: ServedModel,
                      parsed: ChatRequest | EmbeddingsRequest | ModerationRequest) -> web.StreamResponse:
        rng = self._rng(served.name)
        stats = self._model_stats(served.name)
        completion, finish = (draw_completion_tokens(rng, served.behaviour, parsed.max_tokens)
                              if isinstance(parsed, ChatRequest) else (0, "stop"))
        wire = parsed.wire if isinstance(parsed, ChatRequest) else "openai"
        admission, headers = self._admit(served, parsed.prompt_tokens + completion)
        if not admission.accepted:
            stats.by_status[429] += 1
            return self._rate_limited(served, admission, headers, wire)
        fault = self._next_fault(served, rng)
        if fault is not None:
            stats.faults[fault.fault] += 1
        streaming = isinstance(parsed, ChatRequest) and parsed.stream
        if fault is not None and not (streaming and fault.fault in ("reset", "malformed")):
            return await self._fault(request, stats, fault, headers, wire)
        if isinstance(parsed, ChatRequest) and parsed.prompt_units:
            parsed = replace(parsed, cache=self._cache.serve(served.name, parsed.prompt_units,
                                                             explicit=parsed.wire == "anthropic"))
        if isinstance(parsed, ChatRequest) and parsed.stream:
            return await self._stream(request, served, parsed, _Plan(completion, finish, headers, fault))
        await _sleep_ms(sample_lognormal(rng, served.behaviour.latency_ms, served.behaviour.latency_p99_ms))
        body, tokens = self._generated(served, parsed, completion, finish)
        stats.completion_tokens += tokens
        stats.prompt_tokens += parsed.prompt_tokens
        stats.by_status[200] += 1
        return _json(200, body, headers)

    def _generated(self, served: ServedModel, parsed: ChatRequest | EmbeddingsRequest | ModerationRequest,
                   completion: int, finish: str) -> tuple[dict[str, Any], int]:
        """A non-streamed answer's body in the request's wire format, and its completion tokens."""
        rng = self._rng(served.name)
        tokens = 0
        if isinstance(parsed, CompletionRequest):
            answers = [Reply.draw(rng, parsed, completion, finish) for _ in parsed.prompts]
            body = text_completion_body(completion_id(rng), served.name, parsed,
                                        [(reply.words, reply.finish, reply.stop) for reply in answers])
            tokens = body["usage"]["completion_tokens"]
        elif isinstance(parsed, ChatRequest):
            body, tokens = completion_body(rng, served.name, parsed, completion, finish)
        elif isinstance(parsed, ModerationRequest):
            body = moderation_body(completion_id(rng), served.name, parsed)
        else:
            body = embeddings_body(served, parsed)
        wire = parsed.wire if isinstance(parsed, ChatRequest) else "openai"
        if parsed.service_tier is not None and wire == "openai":  # a Message names it in its usage
            body["service_tier"] = parsed.service_tier
        return body, tokens

    def _answer_line(self, url: str, body: dict[str, Any]) -> LineAnswer:
        """One line of a provider batch, answered as its endpoint answers a request, but without
        the rate limit, faults or latency of live traffic: the batch has its own. A Message
        (MESSAGES_URL: Anthropic's Message Batches) names the batch tier in its usage, as
        Anthropic's do, and a refusal of one is Anthropic-shaped."""
        try:
            parsed: ChatRequest | EmbeddingsRequest
            if url == EMBEDDINGS_URL:
                parsed = parse_embeddings(body)
                served = self._serving(parsed.model, "embeddings")
                check_dimensions(parsed, served)
                completion, finish = 0, "stop"
            else:
                parsed = (parse_messages if url == MESSAGES_URL else parse_chat)(body)
                if parsed.stream:
                    raise InvalidRequest("A batch request cannot stream.", param="stream",
                                         code="invalid_value")
                served = self._serving(parsed.model, "chat")
                completion, finish = draw_completion_tokens(self._rng(served.name), served.behaviour,
                                                        parsed.max_tokens)
        except InvalidRequest as exc:
            refusal = anthropic_error_body(exc.status, exc.message) if url == MESSAGES_URL else exc.body()
            return LineAnswer(exc.status, orjson.loads(refusal))
        answer, tokens = self._generated(served, parsed, completion, finish)
        if url == MESSAGES_URL:
            answer["usage"]["service_tier"] = "batch"
        return LineAnswer(200, answer, served.name, parsed.prompt_tokens, tokens)

    def _rate_limited(self, served: ServedModel, admission: Admission,
                      headers: dict[str, str], wire: Wire) -> web.StreamResponse:
        wait_s = admission.retry_after_s or 0.0
        if self._settings.retry_after_format == "http-date":
            # An HTTP-date has whole seconds: name the first whole second after the wait.
            headers["Retry-After"] = format_datetime(
                datetime.fromtimestamp(math.ceil(time.time() + wait_s), UTC), usegmt=True)
        else:
            headers["Retry-After"] = str(max(1, math.ceil(wait_s)))  # RFC 9110: whole seconds
        what = "requests" if admission.remaining_requests == 0 else "tokens"
        message = (f"Rate limit reached for {served.name} on {what} per window of "
                   f"{self._settings.window_s:g}s. Please try again in {_go_duration(wait_s)}.")
        body = (anthropic_error_body(429, message) if wire == "anthropic"
                else error_body(message, type_=what, code="rate_limit_exceeded"))
        return web.Response(status=429, body=body, content_type=JSON, headers=headers)

    async def _fault(self, request: web.Request, stats: ModelStats, fault: InjectedFault,
                     headers: dict[str, str], wire: Wire) -> web.StreamResponse:
        """A fault answered before any byte of a normal response."""
        _error = functools.partial(_error_of, wire)
        if fault.fault == "timeout":
            await asyncio.sleep(self._settings.hang_s)  # the client should have given up by now
            return _record(stats, _error(504, "The simulated request timed out.", "server_error", headers))
        if fault.fault == "reset":
            return _abort(request)
        if fault.fault == "malformed":
            stats.by_status[200] += 1
            return web.Response(status=200, body=b'{"id": "chatcmpl-broken", "choices": [{"ind',
                                content_type=JSON, headers=headers)
        if fault.fault == "unavailable":
            return _record(stats, _error(503, "The engine is currently overloaded, please try again later.",
                                         "server_error", headers))
        if fault.fault == "status":
            kind = "server_error" if fault.status >= 500 else "invalid_request_error"
            message = fault.message or f"Simulated HTTP {fault.status}."
            return _record(stats, _error(fault.status, message, kind, headers))
        return _record(stats, _error(500, "The server had an error while processing your request. "
                                          "Sorry about that!", "server_error", headers))

    async def _stream(self, request: web.Request, served: ServedModel, chat: ChatRequest,
                      plan: _Plan) -> web.StreamResponse:
        completion, finish, headers, fault = plan.completion, plan.finish, plan.headers, plan.fault
        rng = self._rng(served.name)
        behaviour = served.behaviour
        stats = self._model_stats(served.name)
        reply = Reply.draw(rng, chat, completion, finish)
        ttft_ms = behaviour.ttft_ms if behaviour.ttft_ms is not None else sample_lognormal(
            rng, behaviour.latency_ms, behaviour.latency_p99_ms)
        if isinstance(chat, CompletionRequest):
            frames = Frames(*text_completion_frames(completion_id(rng), served.name, chat,
                                                     (reply.words, reply.finish, reply.stop)))
        else:
            frames = FRAMES[chat.wire](rng, served.name, chat, reply)
        response = web.StreamResponse(status=200, headers={**headers, "Cache-Control": "no-cache"})
        response.content_type = "text/event-stream"
        await response.prepare(request)
        stats.by_status[200] += 1
        # A fault in a stream strikes half way: the client has already seen chunks by then.
        cut = len(frames.pieces) // 2 if fault is not None else -1
        try:
            await response.write(frames.head)
            await _sleep_ms(ttft_ms)
            for i, piece in enumerate(frames.pieces):
                if i == cut:
                    if fault is not None and fault.fault == "reset":
                        return _abort(request, response)
                    await response.write(frames.broken)
                    await response.write_eof()
                    return response
                if i:
                    await _sleep_ms(behaviour.inter_token_ms)
                await response.write(piece)
            await response.write(frames.tail)
            await response.write_eof()
        except ConnectionResetError:  # the client left mid-stream, as clients may
            return response
        stats.prompt_tokens += chat.prompt_tokens
        stats.completion_tokens += reply.tokens
        return response

    # -- /_sim/ control endpoints

    async def _get_stats(self, request: web.Request) -> web.StreamResponse:
        return _json(200, self.stats_dict())

    async def _get_settings(self, request: web.Request) -> web.StreamResponse:
        return _json(200, self._settings.public_dict())

    async def _post_settings(self, request: web.Request) -> web.StreamResponse:
        try:
            patch = parse_json_object(await request.read())
            settings = self.configure(patch)
        except InvalidRequest as exc:
            return _error_response(exc)
        except ValidationError as exc:
            return _error_response(InvalidRequest(f"invalid simulator settings: {exc}"))
        return _json(200, settings.public_dict())

    async def _post_reset(self, request: web.Request) -> web.StreamResponse:
        self.reset()
        return _json(200, {"reset": True})

    async def _post_fault(self, request: web.Request) -> web.StreamResponse:
        try:
            body = parse_json_object(await request.read())
            model = body.pop("model", None)
            if not isinstance(model, str):
                raise InvalidRequest("'model' must name a served model", param="model")
            fault = _injected_fault(body)
            self.inject(model, fault)
        except InvalidRequest as exc:
            return _error_response(exc)
        except ConfigError as exc:
            return _error_response(InvalidRequest(str(exc), status=404, param="model"))
        return _json(200, {"model": model, "fault": fault.fault, "times": fault.times})


# ---------------------------------------------------------------------------- helpers


def _injected_fault(body: dict[str, Any]) -> InjectedFault:
    fault = body.get("fault")
    times = body.get("times", 1)
    status = body.get("status", 500)
    message = body.get("message")
    if fault not in get_args(FaultName):
        raise InvalidRequest(f"'fault' must be one of {list(get_args(FaultName))}", param="fault")
    if not isinstance(times, int) or isinstance(times, bool) or times < 1:
        raise InvalidRequest("'times' must be a positive integer", param="times")
    if not isinstance(status, int) or isinstance(status, bool) or not 400 <= status <= 599:
        raise InvalidRequest("'status' must be an HTTP error status (400-599)", param="status")
    if message is not None and not isinstance(message, str):
        raise InvalidRequest("'message' must be a string", param="message")
    unknown = set(body) - {"fault", "times", "status", "message"}
    if unknown:
        raise InvalidRequest(f"unknown fields: {sorted(unknown)}")
    return InjectedFault(cast(FaultName, fault), times, status, message)


def _limit_headers(behaviour: ModelBehaviour, admission: Admission) -> dict[str, str]:
    headers: dict[str, str] = {}
    if behaviour.rpm is not None:
        headers["x-ratelimit-limit-requests"] = str(behaviour.rpm)
        headers["x-ratelimit-remaining-requests"] = str(admission.remaining_requests)
        headers["x-ratelimit-reset-requests"] = _go_duration(admission.reset_requests_s)
    if behaviour.tpm is not None:
        headers["x-ratelimit-limit-tokens"] = str(behaviour.tpm)
        headers["x-ratelimit-remaining-tokens"] = str(admission.remaining_tokens)
        headers["x-ratelimit-reset-tokens"] = _go_duration(admission.reset_tokens_s)
    return headers


def _go_duration(seconds: float) -> str:
    """Seconds in the Go duration format OpenAI uses: "20ms", "1.5s", "6m0s"."""
    milliseconds = max(0, math.ceil(seconds * 1000))
    if milliseconds < 1000:
        return f"{milliseconds}ms"
    minutes, rest = divmod(milliseconds, 60_000)
    return f"{minutes}m{rest / 1000:g}s" if minutes else f"{rest / 1000:g}s"


async def _sleep_ms(milliseconds: float) -> None:
    if milliseconds > 0:
        await asyncio.sleep(milliseconds / 1000.0)


def _json(status: int, body: Any, headers: Mapping[str, str] | None = None) -> web.Response:
    return web.Response(status=status, body=orjson.dumps(body), content_type=JSON, headers=headers)


def _error_of(wire: Wire, status: int, message: str, type_: str,
              headers: Mapping[str, str] | None = None) -> web.Response:
    body = anthropic_error_body(status, message) if wire == "anthropic" else error_body(message, type_=type_)
    return web.Response(status=status, body=body, content_type=JSON, headers=headers)


def _error_response(exc: InvalidRequest) -> web.Response:
    return web.Response(status=exc.status, body=exc.body(), content_type=JSON)


def _unauthorized() -> web.Response:
    return _error_response(InvalidRequest("Incorrect API key provided.", status=401, code="invalid_api_key"))


def _record(stats: ModelStats, response: web.Response) -> web.Response:
    stats.by_status[response.status] += 1
    return response


def _abort(request: web.Request, response: web.StreamResponse | None = None) -> web.StreamResponse:
    """Cut the connection without an answer (a TCP reset, as a crashing proxy would)."""
    transport = request.transport
    if transport is not None:
        transport.abort()
    # Nothing more can be sent; aiohttp sees the closed transport and writes nothing.
    return response if response is not None else web.Response(status=500)


async def serve(settings: SimulatorSettings, *, host: str, port: int, allow_remote: bool = False,
                on_ready: Callable[[str], None] | None = None) -> None:
    """Serve until SIGINT or SIGTERM (the `tidegate simulate` command); `on_ready` gets the URL."""
    simulator = Simulator(settings)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    handled: list[signal.Signals] = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        with suppress(NotImplementedError, RuntimeError):  # not on Windows, not off the main thread
            loop.add_signal_handler(sig, stop.set)
            handled.append(sig)
    try:
        async with simulator.running(host, port, allow_remote=allow_remote) as url:
            if on_ready is not None:
                on_ready(url)
            await stop.wait()
    finally:
        for sig in handled:
            loop.remove_signal_handler(sig)
