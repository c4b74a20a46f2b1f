"""ASGI middleware of the gateway: a request body size limit and request metrics. Plain ASGI
rather than Starlette's BaseHTTPMiddleware, so streamed answers pass through untouched."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import NamedTuple

from fastapi import HTTPException
from starlette.routing import BaseRoute
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tidegate.gateway.core.errors import ApiError, error_response, headers_too_large, shape_before_routing
from tidegate.gateway.core.http_server import MAX_HEADER_BYTES
from tidegate.gateway.core.metrics import GatewayMetrics

__all__ = ["BODY_LIMIT_SETTING", "UPLOAD_LIMIT_SETTING", "BodyCap", "BodyLimit", "RequestMetrics"]


class BodyLimit:
    """Refuse request bodies over `max_bytes` (or the limit `paths` gives a path) with 413: at
    once when Content-Length says so, else as soon as the bytes read pass the limit (a chunked
    upload), so an oversized body is never read in full. Headers over MAX_HEADER_BYTES in all
    are refused with 431: the HTTP server refuses such a head only when it arrives in pieces
    (see http_server). Refusals made here, before routing, are in the error shape of the route
    the request was for (`routes`: the app's, as its routers declared them), as the route's own
    would be."""

    def __init__(self, app: ASGIApp, max_bytes: int, paths: Mapping[str, BodyCap] | None = None,
                 routes: Sequence[BaseRoute] = ()) -> None:
        self.app = app
        self.cap = BodyCap(max_bytes, BODY_LIMIT_SETTING)
        self.paths = dict(paths or {})
        self.routes = routes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        header_bytes = sum(len(name) + len(value) + 4 for name, value in scope["headers"])
        if header_bytes > MAX_HEADER_BYTES:
            await error_response(headers_too_large(MAX_HEADER_BYTES),
                                 shape_before_routing(self.routes, scope))(scope, receive, send)
            return
        cap = self.paths.get(scope["path"], self.cap)
        limit = cap.max_bytes
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            shape = shape_before_routing(self.routes, scope)
            await error_response(cap.refusal(), shape)(scope, receive, send)
            return
        received = 0

        async def counted() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    # Raised inside the route's body read: FastAPI passes an HTTPException
                    # through to the app's handler, which answers in the route's shape.
                    raise HTTPException(413, cap.refusal().message, headers=_CLOSE)
            return message

        await self.app(scope, counted, send)


# The settings behind a body limit, named in its 413 so that an operator whose callers send large
# contexts knows what to raise (the queue's cap bounds the gateway's: GatewayState.max_body_bytes).
BODY_LIMIT_SETTING = ("gateway.max_body_bytes (TIDEGATE_GATEWAY__MAX_BODY_BYTES), at most the queue's "
                      "max_payload_bytes (a queue_url option) plus 64 KiB")
UPLOAD_LIMIT_SETTING = "gateway.max_file_bytes (TIDEGATE_GATEWAY__MAX_FILE_BYTES)"


class BodyCap(NamedTuple):
    """A body limit and the setting that makes it, named in the 413 that refuses a body over it."""

    max_bytes: int
    setting: str

    def refusal(self) -> ApiError:
        """The 413 of a body over this limit."""
        return ApiError(413, f"the request body is over the limit of {self.max_bytes} bytes, "
                             f"set by {self.setting}", code="request_too_large", headers=_CLOSE)


# On a refused body: the server closes the connection once it has answered, rather than read
# and discard the rest of the body first.
_CLOSE = {"Connection": "close"}


class RequestMetrics:
    """Count each answered request by route template, method and status, and time it to the
    end of its answer (a stream's last byte)."""

    def __init__(self, app: ASGIApp, metrics: GatewayMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500  # what the server answers when the app raises before starting a response

        async def watched(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, watched)
        finally:
            # The router stores the matched route in the scope; its template keeps label
            # values few (/v1/jobs/{job_id}, not one per id).
            route = scope.get("route")
            template = getattr(route, "path", None) or "unmatched"
            method = scope.get("method", "")
            self.metrics.requests.labels(template, method, str(status)).inc()
            self.metrics.latency.labels(template, method).observe(time.perf_counter() - started)
