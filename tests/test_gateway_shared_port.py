"""`tidegate gateway --processes N`: N gateway processes listen on one port (SO_REUSEPORT) under
a supervisor that passes a stop on to all of them and exits cleanly once they have drained."""

from __future__ import annotations

import asyncio
import signal
import socket
import uuid
from pathlib import Path

import httpx

from support.cluster import START_TIMEOUT_S, TidegateProcess, _spawn
from support.redis_keys import delete_keys
from support.waiting import eventually


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def listening_sockets(port: int) -> int:
    """How many TCP sockets listen on `port` (each process bound with SO_REUSEPORT has its own)."""
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as lines:
            next(lines)
            for line in lines:
                fields = line.split()
                if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == "0A":  # 0A: LISTEN
                    count += 1
    return count


async def _ready(gateway: TidegateProcess, url: str) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=2.0) as http:

        async def ready() -> bool:
            if gateway.proc.poll() is not None:
                raise AssertionError(f"the gateway exited while starting\n{gateway.describe()}")
            try:
                return (await http.get("/readyz")).status_code == 200
            except httpx.TransportError:
                return False

        await eventually(ready, "a 200 from /readyz", timeout_s=START_TIMEOUT_S, every_s=0.05,
                         describe=lambda _: gateway.describe())


async def test_gateway_processes_share_one_port_and_stop_together(
    redis_server: str, tmp_path: Path,
) -> None:
    queue_url = f"{redis_server}?name=t{uuid.uuid4().hex[:12]}"
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    gateway = _spawn("gateways", ["gateway", "--queue", queue_url, "--port", str(port), "--processes", "2",
                                  "--grace-s", "2"], tmp_path)
    try:
        await _ready(gateway, url)
        # Two processes listen on the one port (the second may bind it a moment after the first),
        # and every request is answered
        await eventually(lambda: listening_sockets(port), "two processes listen on the port",
                         until=lambda listening: listening == 2, every_s=0.05)
        answers = []
        for _ in range(20):  # a new connection each: the kernel spreads them over the processes
            async with httpx.AsyncClient(base_url=url, timeout=10.0) as http:
                answers.append((await http.get("/v1/models")).status_code)
        assert answers == [200] * 20

        # A stop reaches both: they drain, the supervisor exits 0, nothing listens any more
        status = await gateway.stop(signal.SIGTERM, timeout_s=20.0)
        assert status == 0, gateway.describe()
        assert listening_sockets(port) == 0
    finally:
        if gateway.proc.poll() is None:
            await gateway.stop(signal.SIGKILL)
        await delete_keys(redis_server, f"*{queue_url.rsplit('=', 1)[1]}*")


async def test_several_processes_need_a_fixed_port(tmp_path: Path) -> None:
    gateway = _spawn("gateways", ["gateway", "--queue", f"sqlite:///{tmp_path / 'q.db'}", "--port", "0",
                                  "--processes", "2"], tmp_path)

    status = await asyncio.to_thread(gateway.proc.wait, 30)

    assert status == 2
    assert "--port" in gateway.log()
