"""ASGI middleware of the gateway: a request body size limit and request metrics. Plain ASGI
rather than Starlette's BaseHTTPMiddleware, so streamed answers pass through untouched."""

from __future__ import annotations

import time

from fastapi import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tidegate.gateway.errors import ApiError, error_response, headers_too_large
from tidegate.gateway.http_server import MAX_HEADER_BYTES
from tidegate.gateway.metrics import GatewayMetrics

__all__ = ["BodyLimit", "RequestMetrics"]


class BodyLimit:
    """Refuse request bodies over `max_bytes` with 413: at once when Content-Length says so,
    else as soon as the bytes read pass the limit (a chunked upload), so an oversized body is
    never read in full. Headers over MAX_HEADER_BYTES in all are refused with 431: the HTTP
    server refuses such a head only when it arrives in pieces (see http_server)."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        header_bytes = sum(len(name) + len(value) + 4 for name, value in scope["headers"])
        if header_bytes > MAX_HEADER_BYTES:
            await error_response(headers_too_large(MAX_HEADER_BYTES))(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await error_response(self._too_large())(scope, receive, send)
            return
        received = 0

        async def counted() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    # Raised inside the route's body read: FastAPI passes an HTTPException
                    # through to the app's handler, which answers in the OpenAI shape.
                    raise HTTPException(413, self._too_large().message, headers=_CLOSE)
            return message

        await self.app(scope, counted, send)

    def _too_large(self) -> ApiError:
        return ApiError(413, f"the request body is over the limit of {self.max_bytes} bytes",
                        code="request_too_large", headers=_CLOSE)


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
