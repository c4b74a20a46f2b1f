"""A private `redis-server` for one benchmark run: free port, temporary folder, no persistence.

The benchmark never touches a server the machine happens to run (6379 or any other): figures from
a shared server would depend on whoever else uses it, and FLUSHALL between systems would be rude.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import redis

from bench.common import BenchmarkError

START_TIMEOUT_S = 10.0


@dataclass(frozen=True, slots=True)
class RedisServer:
    """A running private server: where it listens and which version it is."""

    host: str
    port: int
    version: str
    pid: int

    @property
    def url(self) -> str:
        """`redis://host:port/0`, the form every client in the benchmark accepts."""
        return f"redis://{self.host}:{self.port}/0"


def redis_server_version(binary: str) -> str:
    """`7.0.15` from `redis-server --version` (`Redis server v=7.0.15 sha=…`)."""
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, check=True).stdout
    for word in out.split():
        if word.startswith("v="):
            return word[2:]
    return out.strip()


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now (the kernel's pick for port 0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def private_redis(binary: str = "redis-server") -> Iterator[RedisServer]:
    """Start `redis-server` on a free loopback port in a temporary folder; stop it on exit."""
    path = shutil.which(binary)
    if path is None:
        raise BenchmarkError(
            f"{binary!r} not found on PATH: install it (Debian: `apt-get install redis-server`)"
        )
    host = "127.0.0.1"
    with tempfile.TemporaryDirectory(prefix="tidegate-bench-redis-") as folder:
        port = free_port(host)
        log_file = Path(folder) / "redis.log"
        process = subprocess.Popen(
            [
                path,
                "--bind", host,
                "--port", str(port),
                "--dir", folder,
                # Nothing on disk: persistence would put fsync and fork pauses into the figures.
                "--save", "",
                "--appendonly", "no",
                "--logfile", str(log_file),
                "--daemonize", "no",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            _wait_until_ready(host, port, process, log_file)
            yield RedisServer(host=host, port=port, version=redis_server_version(path), pid=process.pid)
        finally:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def _wait_until_ready(host: str, port: int, process: subprocess.Popen[bytes], log_file: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    client = redis.Redis(host=host, port=port, socket_connect_timeout=0.5)
    try:
        while True:
            if process.poll() is not None:
                log = log_file.read_text() if log_file.exists() else ""
                raise BenchmarkError(f"redis-server exited with {process.returncode}:\n{log}")
            try:
                if client.ping():
                    return
            except redis.ConnectionError:
                pass
            if time.monotonic() > deadline:
                raise BenchmarkError(
                    f"redis-server did not answer on {host}:{port} within {START_TIMEOUT_S}s"
                )
            time.sleep(0.02)
    finally:
        client.close()
