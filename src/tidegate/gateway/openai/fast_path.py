"""The hot endpoints without FastAPI's per-request machinery: POST /v1/chat/completions and POST
/v1/embeddings, served by the same route functions' code with everything FastAPI would decide
decided the same way.

Why a second path beside FastAPI's routes: FastAPI's routing, dependency solving and body
handling cost a call about a fifth of the gateway's CPU (BENCHMARKS.md, "Gateway overhead"), more
than the queue, and the two routes are the gateway's hot ones. When it was added it took
`tidegate up` from 1,220 to 890 µs of CPU per request (bench/results/history.md, "gateway fast
path"; `bench/gateway.py` gives today's figures). The price is a second reading of the same two
routes, so tests/test_gateway_fast_path.py sends the same requests, valid and invalid (bodies,
keys, headers), to the app with and without this middleware and requires the same status, body
(error shape and code) and headers.

This middleware, the innermost of the gateway's (inside the body limit and the request metrics,
outside FastAPI's router), takes a request to one of those two routes and:

- reads the body, parses it with orjson and decodes it into the route's typed request
  (tidegate.contract), as the route does;
- authenticates and meters the caller with the same dependency functions the route declares;
- reads X-Priority, X-Tidegate-Timeout and Idempotency-Key as FastAPI would (the first header
  of each name) and calls the route's own handling (`routes.serve`);
- answers an ApiError or a TidegateError with the app's own exception handlers.

Anything it is not sure to read exactly as FastAPI would — a body that is not a JSON object
orjson parses and the contract accepts, a content type other than JSON — goes to FastAPI untouched
(the body already read is handed on), so every refusal keeps the shape and the order FastAPI
gives it. Nothing has been changed by then: validation comes before authentication and metering.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

import orjson
from fastapi import FastAPI
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tidegate.ai import Kind
from tidegate.contract import InvalidRequestBody, RequestBody, decode
from tidegate.errors import TidegateError
from tidegate.gateway.core.auth import current_tenant, metered_tenant
from tidegate.gateway.core.errors import ApiError
from tidegate.gateway.core.intake import IDEMPOTENCY_HEADER, PRIORITY_HEADER, TIMEOUT_HEADER, CallOptions
from tidegate.gateway.core.state import GatewayState
from tidegate.gateway.openai import routes
from tidegate.gateway.openai.dialect import OPENAI

__all__ = ["FastPath"]

@dataclass(frozen=True, slots=True)
class _HotRoute:
    """What FastAPI's router would leave in `scope["route"]` for the two routes, as far as the
    gateway reads it: the template the request metrics count, the error shape of its dialect."""

    path: str
    kind: Kind
    error_shape: Callable[[ApiError], dict[str, Any]] = OPENAI.error_body


_ROUTES: Final[Mapping[str, _HotRoute]] = {
    route.path: route for route in (_HotRoute("/v1/chat/completions", "chat"),
                                    _HotRoute("/v1/embeddings", "embeddings"))
}
_HEADERS: Final = {name.lower().encode("latin-1"): name
                   for name in (PRIORITY_HEADER, TIMEOUT_HEADER, IDEMPOTENCY_HEADER)}
_HANDLED: Final = (ApiError, TidegateError, StarletteHTTPException)

Handler = Callable[[Request, Any], Response | Awaitable[Response]]


class FastPath:
    """ASGI middleware serving the hot endpoints of `gateway` (see the module docstring); every
    other request goes on to `app`."""

    def __init__(self, app: ASGIApp, gateway: FastAPI) -> None:
        self.app = app
        self.gateway = gateway

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        route = _ROUTES.get(scope["path"]) if scope["type"] == "http" else None
        if route is None or scope["method"] != "POST" or not _is_json(scope):
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        request = Request(scope, receive)
        try:
            body = await _read_body(receive)
            if body is None:
                return  # the client went away: nobody to answer
            parsed = _parsed(body, route.kind)
            if parsed is None:
                await self.app(scope, _replaying(body, receive), send)
                return
            scope["route"] = route
            response = await self._serve(request, route.kind, parsed, started)
        except _HANDLED as exc:
            scope["route"] = route
            response = await self._handled(request, exc)
        await response(scope, receive, send)

    async def _serve(self, request: Request, kind: Kind, body: RequestBody, started: float) -> Response:
        state: GatewayState = self.gateway.state.gateway
        tenant = await metered_tenant(request, await current_tenant(request, state), state)
        headers = _tidegate_headers(request.scope)
        options = CallOptions(headers.get(PRIORITY_HEADER), headers.get(TIMEOUT_HEADER),
                              headers.get(IDEMPOTENCY_HEADER))
        return await routes.serve(state, tenant, OPENAI.request(kind, body), options, started=started)

    async def _handled(self, request: Request, exc: Exception) -> Response:
        """The app's own answer to `exc`, from the handler Starlette's ExceptionMiddleware would
        pick (the one of its nearest class)."""
        handlers = self.gateway.exception_handlers
        handler: Handler = next(handlers[cls] for cls in type(exc).__mro__ if cls in handlers)
        response = handler(request, exc)
        return await response if inspect.isawaitable(response) else response


def _is_json(scope: Scope) -> bool:
    for name, value in scope["headers"]:
        if name == b"content-type":
            media_type = value.split(b";", 1)[0].strip().lower()
            return bool(media_type == b"application/json")
    return False


async def _read_body(receive: Receive) -> bytes | None:
    """The body's bytes; None when the client disconnected first. The gateway's BodyLimit
    refuses an oversized body here, with an HTTPException, as it does in FastAPI's own read."""
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return None
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)


def _parsed(body: bytes, kind: Kind) -> RequestBody | None:
    """The body as the route's typed request, or None when FastAPI should read it (and refuse it)."""
    try:
        document = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(document, dict):
        return None
    try:
        return decode(kind, document)
    except InvalidRequestBody:
        return None


def _replaying(body: bytes, receive: Receive) -> Receive:
    """A receive that gives the whole `body` first, then what the server says next (a
    disconnect)."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if sent:
            return await receive()
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replay


def _tidegate_headers(scope: Scope) -> dict[str, str]:
    """The first value of each request header tidegate reads, as FastAPI's Header() takes it."""
    found: dict[str, str] = {}
    for name, value in scope["headers"]:
        header = _HEADERS.get(name)
        if header is not None and header not in found:
            found[header] = value.decode("latin-1")
    return found
