"""What the gateway's uvicorn server needs: a fast HTTP parser that still answers, in the API's error
shape, a request the app never sees.

uvicorn parses HTTP/1.1 with httptools (llhttp, in C), at a fraction of the CPU of the pure-Python
h11 parser (BENCHMARKS.md, "Gateway overhead"). It refuses a request it cannot parse before any app
code runs, with a plain-text 400 that an OpenAI SDK cannot read, and llhttp sets no limit on the
size of a request's head. GatewayHttpToolsProtocol answers the same refusal with `{"error": {...}}`
and a code, and refuses a request line and headers over MAX_HEADER_BYTES with 431 (as the app's
own check answers) before it buffers more. Serve the app with `uvicorn.Config(app, **UVICORN_OPTIONS)`.
"""

from __future__ import annotations

import asyncio
from typing import Any, Final

import orjson
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from tidegate.gateway.core.errors import ApiError, error_body, headers_too_large

__all__ = ["MAX_HEADER_BYTES", "UVICORN_OPTIONS", "GatewayHttpToolsProtocol", "refusal"]

# The request line and headers together; uvicorn's default for h11 too. A larger head is refused.
MAX_HEADER_BYTES: Final = 16 * 1024


def refusal(head_bytes: int) -> tuple[int, bytes]:
    """The status and JSON body answering a request the HTTP server could not read, of which it
    holds `head_bytes` unparsed bytes: 431 when that is over the header limit, else 400."""
    error = (headers_too_large(MAX_HEADER_BYTES) if head_bytes > MAX_HEADER_BYTES
             else ApiError(400, "the request could not be read as HTTP/1.1", code="invalid_http_request"))
    return error.status, orjson.dumps({"error": error_body(error)})


class GatewayHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a bounded request head, answering an unreadable or
    oversized request in the API's error shape."""

    _head_bytes = 0  # bytes received since the current request began, while its head is unread
    _in_head = False

    def on_message_begin(self) -> None:
        """A request begins: its head is counted from here."""
        self._in_head = True
        self._head_bytes = 0
        super().on_message_begin()

    def on_headers_complete(self) -> None:
        """The head is read: what follows is the body, which the app bounds itself."""
        self._in_head = False
        super().on_headers_complete()
        if self.cycle is not None and self.cycle.transport is self.transport:
            self.cycle.transport = _Gathered(self.transport, self.loop)  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        """Parse `data`; refuse the request once its unfinished head is over the limit. A chunk
        in which a request began counts whole, so the head held is at most the limit plus one
        read."""
        super().data_received(data)
        if self._in_head and not self.transport.is_closing():
            self._head_bytes += len(data)
            if self._head_bytes > MAX_HEADER_BYTES:
                self._refuse(self._head_bytes)

    def send_400_response(self, msg: str) -> None:
        """Answer an unparsable request with an OpenAI-shaped error and close, where uvicorn
        answers in plain text."""
        self._refuse(0)

    def _refuse(self, head_bytes: int) -> None:
        status, body = refusal(head_bytes)
        reason = b"Request Header Fields Too Large" if status == 431 else b"Bad Request"
        self.transport.write(b"".join([
            b"HTTP/1.1 %d %s\r\n" % (status, reason),
            b"content-type: application/json\r\n",
            b"content-length: %d\r\n" % len(body),
            b"connection: close\r\n\r\n",
            body,
        ]))
        self.transport.close()


class _Gathered:
    """The transport a response is written to, its head sent with the first piece of its body in
    one write: uvicorn writes them apart, two sends on the socket (and two wake-ups of the
    client) where one does. The head waits at most until the end of the event loop's turn (a
    streamed answer's first chunk may come later); everything after it goes through at once,
    so nothing is held once the response is complete."""

    __slots__ = ("_head", "_loop", "_transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._head: bytes | None = b""  # b"": nothing written yet; None: the head has gone

    def write(self, data: bytes) -> None:
        head = self._head
        if head is None:
            self._transport.write(data)
        elif not head:
            self._head = data
            self._loop.call_soon(self._send_head)
        else:
            self._head = None
            self._transport.write(head + data)

    def _send_head(self) -> None:
        head, self._head = self._head, None
        if head and not self._transport.is_closing():
            self._transport.write(head)

    def close(self) -> None:
        self._send_head()
        self._transport.close()

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


UVICORN_OPTIONS: Final[dict[str, Any]] = {"http": GatewayHttpToolsProtocol, "ws": "none"}
"""uvicorn.Config keywords every server of the gateway uses. No WebSocket protocol: the gateway
serves no WebSocket route, and uvicorn's automatic choice would import whichever `websockets`
another package installed (older uvicorn releases import its deprecated `legacy` module)."""
