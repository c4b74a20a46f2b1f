"""What the gateway's uvicorn server needs so that even a request the app never sees is answered in
the API's error shape.

uvicorn (h11) refuses a request it cannot parse before any app code runs: a malformed request line,
or a request line and headers over `h11_max_incomplete_event_size` bytes. Its own answer is a
plain-text 400, which an OpenAI SDK cannot read; GatewayH11Protocol answers the same refusal with
`{"error": {...}}` and a code (431 for an oversized head, as the app's own check answers).
Serve the app with `uvicorn.Config(app, **UVICORN_OPTIONS)`.
"""

from __future__ import annotations

from typing import Any, Final

import h11
import orjson
from uvicorn.protocols.http.h11_impl import H11Protocol

from tidegate.gateway.errors import ApiError, error_body, headers_too_large

__all__ = ["MAX_HEADER_BYTES", "UVICORN_OPTIONS", "GatewayH11Protocol", "refusal"]

# The request line and headers together; uvicorn's default too. A larger head is refused.
MAX_HEADER_BYTES: Final = 16 * 1024


def refusal(head_bytes: int) -> tuple[int, bytes]:
    """The status and JSON body answering a request the HTTP server could not read, of which it
    holds `head_bytes` unparsed bytes: 431 when that is over the header limit, else 400."""
    error = (headers_too_large(MAX_HEADER_BYTES) if head_bytes > MAX_HEADER_BYTES
             else ApiError(400, "the request could not be read as HTTP/1.1", code="invalid_http_request"))
    return error.status, orjson.dumps({"error": error_body(error)})


class GatewayH11Protocol(H11Protocol):
    """uvicorn's h11 protocol, answering an unreadable request in the API's error shape."""

    def send_400_response(self, msg: str) -> None:
        """Answer with an OpenAI-shaped error and close, where uvicorn answers in plain text."""
        unparsed, _ = self.conn.trailing_data  # h11 keeps what it could not parse
        status, body = refusal(len(unparsed))
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                   (b"connection", b"close")]
        for event in (h11.Response(status_code=status, headers=headers), h11.Data(data=body),
                      h11.EndOfMessage()):
            self.transport.write(self.conn.send(event) or b"")
        self.transport.close()


UVICORN_OPTIONS: Final[dict[str, Any]] = {
    "http": GatewayH11Protocol,
    "h11_max_incomplete_event_size": MAX_HEADER_BYTES,
}
"""uvicorn.Config keywords every server of the gateway uses."""
