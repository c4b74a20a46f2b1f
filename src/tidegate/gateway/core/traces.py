"""The gateway's server spans (tidegate.tracing): one per HTTP request, named after its method
and route template (`POST /v1/chat/completions`), continuing the caller's trace when the request
carries a W3C `traceparent`. The intake adds the job's id, tenant and priority to it, and puts its
context in the job, so the worker's spans join the same trace.

`create_app` adds the middleware only when tracing is on: off, requests never pass through it.
"""

from __future__ import annotations

from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tidegate.tracing import Carrier, tracer

__all__ = ["ServerSpans"]

_CARRIED = {b"traceparent": "traceparent", b"tracestate": "tracestate"}


class ServerSpans:
    """ASGI middleware: a server span around each HTTP request (the outermost middleware, so
    the span covers every answer, a streamed one to its last byte)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        method: str = scope["method"]
        status = 500  # what the server answers if the app raises before it starts answering
        attributes: dict[str, Any] = {"http.request.method": method, "url.path": scope["path"],
                                      "url.scheme": scope.get("scheme", "http")}
        with tracer().span(method, kind="server", attributes=attributes, parent=_carrier(scope)) as span:

            async def sending(message: Message) -> None:
                nonlocal status
                if message["type"] == "http.response.start":
                    status = message["status"]
                await send(message)

            try:
                await self.app(scope, receive, sending)
            finally:
                # The route is known once routing (or the fast path) has put it in the scope.
                route = getattr(scope.get("route"), "path", None)
                answered: dict[str, Any] = {"http.response.status_code": status}
                if isinstance(route, str):
                    span.update_name(f"{method} {route}")
                    answered["http.route"] = route
                span.set_attributes(answered)
                if status >= 500:
                    span.fail(str(status))


def _carrier(scope: Scope) -> Carrier | None:
    """The caller's W3C trace context, from the request's headers."""
    found = {_CARRIED[name]: value.decode("latin-1") for name, value in scope["headers"] if name in _CARRIED}
    return found if "traceparent" in found else None
