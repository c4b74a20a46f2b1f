"""The gateway's HTTP server writes a response's head together with its body (one send on the
socket, one wake-up of the client, where uvicorn alone writes twice), and still sends the head of
a streamed answer at once, before its first chunk exists."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Iterator

import uvicorn
from starlette.types import Receive, Scope, Send

from support.waiting import eventually
from tidegate.gateway.core.http_server import UVICORN_OPTIONS, _Gathered


class _Recorded(asyncio.Transport):
    """A transport that keeps what each write was given."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.writes.append(bytes(data))

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed


async def test_a_head_goes_out_with_the_first_piece_of_its_body() -> None:
    raw = _Recorded()
    gathered = _Gathered(raw, asyncio.get_running_loop())

    gathered.write(b"HEAD")
    gathered.write(b"body")
    gathered.write(b"more")
    await asyncio.sleep(0)  # the turn ends: nothing was held back

    assert raw.writes == [b"HEADbody", b"more"]


async def test_a_head_alone_leaves_at_the_end_of_the_turn_and_a_close_sends_it_first() -> None:
    raw = _Recorded()
    gathered = _Gathered(raw, asyncio.get_running_loop())
    gathered.write(b"HEAD")
    assert raw.writes == []
    await asyncio.sleep(0)
    assert raw.writes == [b"HEAD"]
    gathered.write(b"chunk")
    assert raw.writes == [b"HEAD", b"chunk"]

    closing = _Recorded()
    held = _Gathered(closing, asyncio.get_running_loop())
    held.write(b"HEAD")
    held.close()
    assert closing.writes == [b"HEAD"] and closing.closed


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


@contextlib.asynccontextmanager
async def _serving(app: object) -> AsyncIterator[int]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind(("127.0.0.1", 0))
    server = _Server(uvicorn.Config(app, lifespan="off", log_level="warning", **UVICORN_OPTIONS))  # type: ignore[arg-type]
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        await eventually(lambda: server.started, "uvicorn serves", every_s=0.005)
        yield sock.getsockname()[1]
    finally:
        server.should_exit = True
        await task


async def test_a_streamed_answers_head_arrives_before_its_first_chunk_exists() -> None:
    first_chunk = asyncio.Event()

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream")]})
        await first_chunk.wait()
        await send({"type": "http.response.body", "body": b"data: 1\n\n", "more_body": False})

    async with _serving(app) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            assert head.startswith(b"HTTP/1.1 200") and b"text/event-stream" in head
            first_chunk.set()
            rest = await asyncio.wait_for(reader.read(), 10)
            assert b"data: 1" in rest
        finally:
            writer.close()
