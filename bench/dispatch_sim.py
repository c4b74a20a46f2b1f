"""Where the dispatch benchmark's simulated provider runs: on the benchmark's own event loop, or
in a `python -m tidegate simulate` subprocess that takes its CPU off the measured loop.

Both are driven the same way (`reset`, `configure`, `stats`) through `SimHandle`; the subprocess
through the simulator's loopback-only `/_sim/` endpoints.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
import tempfile
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any, Literal, Protocol

import aiohttp

from bench.common import BenchmarkError
from bench.dispatch_scenario import Scenario
from bench.servers import free_port
from tidegate.testing import Simulator

SimPlacement = Literal["inproc", "subprocess"]
START_TIMEOUT_S = 20.0
READY_PREFIX = "Simulated provider listening on "


class SimHandle(Protocol):
    """A running simulated provider."""

    base_url: str  # http://127.0.0.1:<port>/v1
    pid: int | None  # the subprocess, or None when it shares this process

    async def reset(self) -> None:
        """Forget stats and rate-limit windows (between runs)."""
        ...

    async def configure(self, patch: Mapping[str, Any]) -> None:
        """Merge settings (e.g. lift the rate limit for the ceiling run)."""
        ...

    async def stats(self) -> dict[str, Any]:
        """`Simulator.stats_dict()`: per model, requests received and answers by status."""
        ...


class _InProcess:
    def __init__(self, simulator: Simulator, base_url: str) -> None:
        self._simulator = simulator
        self.base_url = base_url
        self.pid: int | None = None

    async def reset(self) -> None:
        self._simulator.reset()

    async def configure(self, patch: Mapping[str, Any]) -> None:
        self._simulator.configure(patch)

    async def stats(self) -> dict[str, Any]:
        return self._simulator.stats_dict()


class _Subprocess:
    def __init__(self, session: aiohttp.ClientSession, base_url: str, pid: int) -> None:
        self._session = session
        self.base_url = base_url
        self._control = base_url.removesuffix("/v1") + "/_sim"
        self.pid: int | None = pid

    async def _call(self, method: str, path: str, body: Mapping[str, Any] | None = None) -> Any:
        async with self._session.request(method, f"{self._control}/{path}", json=body) as response:
            if response.status != 200:
                raise BenchmarkError(f"simulator {method} /_sim/{path}: HTTP {response.status}: "
                                     f"{await response.text()}")
            return await response.json()

    async def reset(self) -> None:
        await self._call("POST", "reset")

    async def configure(self, patch: Mapping[str, Any]) -> None:
        await self._call("POST", "settings", patch)

    async def stats(self) -> dict[str, Any]:
        return dict(await self._call("GET", "stats"))


@contextlib.asynccontextmanager
async def simulated_provider(scenario: Scenario, placement: SimPlacement) -> AsyncIterator[SimHandle]:
    """Start the simulated provider configured by `scenario`; stop it when the block ends."""
    if placement == "inproc":
        simulator = Simulator(scenario.simulator_settings())
        async with simulator.running() as base_url:
            yield _InProcess(simulator, base_url)
        return
    async with _subprocess(scenario) as handle:
        yield handle


@contextlib.asynccontextmanager
async def _subprocess(scenario: Scenario) -> AsyncIterator[SimHandle]:
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="tidegate-bench-sim-") as folder:
        stderr_path = Path(folder) / "stderr.log"
        with stderr_path.open("wb") as stderr:
            process = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "tidegate", "simulate", "--port", str(port),
                *scenario.simulator_flags(),
                stdout=asyncio.subprocess.PIPE, stderr=stderr,
            )
        try:
            base_url = await _ready_url(process, stderr_path)
            async with aiohttp.ClientSession() as session:
                yield _Subprocess(session, base_url, process.pid)
        finally:
            await _stop(process)


async def _ready_url(process: asyncio.subprocess.Process, stderr_path: Path) -> str:
    assert process.stdout is not None
    try:
        async with asyncio.timeout(START_TIMEOUT_S):
            while line := (await process.stdout.readline()).decode():
                if line.startswith(READY_PREFIX):
                    return line.removeprefix(READY_PREFIX).strip()
    except TimeoutError:
        pass
    await _stop(process)
    # The process is gone: nothing else runs on the loop that a short blocking read could delay.
    stderr = stderr_path.read_text(errors="replace")  # noqa: ASYNC240
    raise BenchmarkError(f"`tidegate simulate` did not start within {START_TIMEOUT_S}s:\n{stderr}")


async def _stop(process: asyncio.subprocess.Process) -> None:
    """SIGINT (the simulator's graceful stop), then SIGKILL if it lingers; only our own child."""
    if process.returncode is not None:
        return
    process.send_signal(signal.SIGINT)
    try:
        await asyncio.wait_for(process.wait(), 10)
    except TimeoutError:
        process.kill()
        await process.wait()
