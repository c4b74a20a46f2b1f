"""What the gateway's uvicorn server needs so that even a request the app never sees is answered in
the API's error shape.

uvicorn (h11) refuses a request it cannot parse before any app code runs: a malformed request line,
or a request line and headers over `h11_max_incomplete_event_size` bytes. Its own answer is a
plain-text 400, which an OpenAI SDK cannot read; GatewayH11Protocol answers the same refusal with
`{"error": {...}}` and a code. Serve the app with `uvicorn.Config(app, **UVICORN_OPTIONS)`.
"""

from __future__ import annotations

from typing import Any, Final

import h11
import orjson
from uvicorn.protocols.http.h11_impl import H11Protocol

__all__ = ["MAX_HEADER_BYTES", "UVICORN_OPTIONS", "GatewayH11Protocol", "unreadable_request_body"]

# The request line and headers together; uvicorn's default too. A larger head is refused.
MAX_HEADER_BYTES: Final = 16 * 1024


def unreadable_request_body() -> bytes:
    """The JSON body of the answer to a request the HTTP server could not read."""
    return orjson.dumps({"error": {
        "message": "the request could not be read as HTTP/1.1: it is malformed, or its request line "
                   f"and headers are over {MAX_HEADER_BYTES} bytes",
        "type": "invalid_request_error", "param": None, "code": "invalid_http_request",
    }})


class GatewayH11Protocol(H11Protocol):
    """uvicorn's h11 protocol, answering an unreadable request in the API's error shape."""

    def send_400_response(self, msg: str) -> None:
        """Answer 400 with an OpenAI-shaped error and close, as uvicorn does in plain text."""
        body = unreadable_request_body()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                   (b"connection", b"close")]
        for event in (h11.Response(status_code=400, headers=headers, reason=b"Bad Request"),
                      h11.Data(data=body), h11.EndOfMessage()):
            self.transport.write(self.conn.send(event) or b"")
        self.transport.close()


UVICORN_OPTIONS: Final[dict[str, Any]] = {
    "http": GatewayH11Protocol,
    "h11_max_incomplete_event_size": MAX_HEADER_BYTES,
}
"""uvicorn.Config keywords every server of the gateway uses."""
