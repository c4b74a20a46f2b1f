"""A password-protected redis-server of one test's own, which the test may stop (to see how a
client fails when its server goes away)."""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from support.waiting import eventually_sync

PASSWORD = "s3cret"


@dataclass
class OwnRedis:
    url: str  # with the password in it
    process: subprocess.Popen[bytes]


@contextlib.contextmanager
def own_redis_server(folder: Path) -> Iterator[OwnRedis]:
    """Start it on a free loopback port, yield it, terminate it."""
    import redis

    binary = shutil.which("redis-server")
    if binary is None:
        pytest.fail("redis-server is not on PATH: apt-get install redis-server", pytrace=False)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    process = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         "--requirepass", PASSWORD, "--dir", str(folder)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
    )
    try:
        def answering_pid() -> int:
            if process.poll() is not None:
                pytest.fail("the test's own redis-server exited", pytrace=False)
            with redis.Redis(port=port, password=PASSWORD, socket_connect_timeout=0.5) as client:
                return int(client.info("server")["process_id"])

        try:
            pid = eventually_sync(answering_pid, "the test's own redis-server answers", timeout_s=10,
                                  every_s=0.05, ignoring=(redis.exceptions.ConnectionError,))
        except AssertionError as exc:
            pytest.fail(str(exc), pytrace=False)
        if pid != process.pid:
            pytest.fail(f"port {port} is answered by another redis-server", pytrace=False)
        yield OwnRedis(f"redis://:{PASSWORD}@127.0.0.1:{port}/0", process)
    finally:
        process.terminate()
        process.wait(timeout=10)
