"""Child processes of the gateway benchmark: start one with its output in a log file, wait until
it is ready, count its CPU (with any processes it forked), stop it.

Only processes this benchmark started are ever signalled, by their own pid.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import sys
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from bench.common import BenchmarkError

REPO_ROOT = Path(__file__).resolve().parent.parent
STOP_TIMEOUT_S = 10.0
POLL_S = 0.1
LOG_TAIL_CHARS = 3000
_TICKS_PER_S = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True, slots=True)
class Child:
    """A process the benchmark started, and the file its stdout and stderr go to."""

    name: str
    process: asyncio.subprocess.Process
    log_path: Path

    @property
    def pid(self) -> int:
        """Its process id."""
        return self.process.pid

    async def log(self) -> str:
        """Everything it has written so far."""
        return await asyncio.to_thread(self.log_path.read_text, errors="replace")

    async def failure(self, what: str) -> BenchmarkError:
        """An error naming the process, what did not happen, and the end of its log."""
        status = "running" if self.process.returncode is None else f"exited with {self.process.returncode}"
        tail = (await self.log())[-LOG_TAIL_CHARS:]
        return BenchmarkError(f"{self.name} ({status}): {what}; the end of its log:\n{tail}")


async def spawn(name: str, argv: Sequence[str], folder: Path, *, env: Mapping[str, str] | None = None,
                cwd: Path = REPO_ROOT) -> Child:
    """Start `argv` with stdin closed and stdout+stderr in `folder/<name>.log`."""
    log_path = folder / f"{name}.log"
    with log_path.open("wb") as log:
        process = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.DEVNULL, stdout=log, stderr=asyncio.subprocess.STDOUT,
            env=dict(env) if env is not None else None, cwd=cwd,
        )
    return Child(name, process, log_path)


async def stop(child: Child, timeout_s: float = STOP_TIMEOUT_S) -> None:
    """SIGINT (a graceful stop for every program here), then SIGKILL if it lingers."""
    if child.process.returncode is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        child.process.send_signal(signal.SIGINT)
    try:
        await asyncio.wait_for(child.process.wait(), timeout_s)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            child.process.kill()
        await child.process.wait()


@contextlib.asynccontextmanager
async def running(name: str, argv: Sequence[str], folder: Path, *, env: Mapping[str, str] | None = None,
                  cwd: Path = REPO_ROOT) -> AsyncIterator[Child]:
    """`spawn` for the length of a block; stopped when it ends."""
    child = await spawn(name, argv, folder, env=env, cwd=cwd)
    try:
        yield child
    finally:
        await stop(child)


async def wait_for_line(child: Child, pattern: str, timeout_s: float) -> re.Match[str]:
    """The first match of `pattern` in the child's log; fails if it exits or the time runs out."""
    compiled = re.compile(pattern, re.MULTILINE)
    deadline = time.monotonic() + timeout_s
    while True:
        if match := compiled.search(await child.log()):
            return match
        if child.process.returncode is not None:
            raise await child.failure(f"exited before printing /{pattern}/")
        if time.monotonic() > deadline:
            raise await child.failure(f"did not print /{pattern}/ within {timeout_s:.0f} s")
        await asyncio.sleep(POLL_S)


async def wait_for_http(child: Child, url: str, timeout_s: float) -> None:
    """Poll GET `url` until it answers 200; fails if the child exits or the time runs out."""
    deadline = time.monotonic() + timeout_s
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2.0)) as session:
        while True:
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                async with session.get(url) as response:
                    if response.status == 200:
                        return
            if child.process.returncode is not None:
                raise await child.failure(f"exited before {url} answered 200")
            if time.monotonic() > deadline:
                raise await child.failure(f"{url} did not answer 200 within {timeout_s:.0f} s")
            await asyncio.sleep(POLL_S)


def tidegate_command() -> list[str]:
    """`python -m tidegate`, with this interpreter (the console script may be absent)."""
    return [sys.executable, "-m", "tidegate"]


def _children(pid: int) -> list[int]:
    found: list[int] = []
    with contextlib.suppress(OSError):
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as children:
                found.extend(int(child) for child in children.read().split())
    return found


def _cpu_s(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()  # after the parenthesised name
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _TICKS_PER_S


def tree_pids(pid: int) -> list[int]:
    """`pid` and every live process below it (LiteLLM's uvicorn workers, for one)."""
    pids, pending = [], [pid]
    while pending:
        current = pending.pop()
        pids.append(current)
        pending.extend(_children(current))
    return pids


def tree_cpu_s(pid: int) -> float:
    """User + system CPU seconds of `pid` and its live descendants."""
    return sum(_cpu_s(p) for p in tree_pids(pid))


class CpuWatch:
    """CPU used by named process trees between `start()` and `stop()`, in core-seconds."""

    def __init__(self, pids: Mapping[str, int]) -> None:
        self._pids = dict(pids)
        self._before: dict[str, float] = {}

    def start(self) -> None:
        """Take the first reading."""
        self._before = {name: tree_cpu_s(pid) for name, pid in self._pids.items()}

    def stop(self) -> dict[str, float]:
        """CPU seconds each tree used since `start()`."""
        return {name: tree_cpu_s(pid) - self._before.get(name, 0.0) for name, pid in self._pids.items()}
