"""`tidegate gateway` and `tidegate worker` started as OS processes by the multi-process tests,
the way an operator scales out: the real command line, one config file, one Redis queue.

Each process writes its log to a file of its own (a pipe nobody reads would fill and block the
process) and is found ready from the outside: a gateway when GET /readyz answers 200, a worker
when it logs that it serves the queue.
"""

from __future__ import annotations

import asyncio
import re
import signal
import subprocess
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import httpx

from support.waiting import eventually
from tidegate.simulator.catalogue import default_models

ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 20.0
_LISTENING = re.compile(r"Uvicorn running on (http://\S+)")


def write_config(path: Path, sim_url: str, models: tuple[str, ...]) -> Path:
    """A tidegate.toml whose one provider is the simulator at `sim_url`, serving `models` at the
    shipped prices; returns its path."""
    lines = ["[[providers]]", 'name = "sim"', f'base_url = "{sim_url}"', ""]
    for model in default_models():
        if model.name in models:
            lines += ["[[providers.models]]", f'name = "{model.name}"',
                      f'input_usd_per_1m = "{model.input_usd_per_1m}"',
                      f'output_usd_per_1m = "{model.output_usd_per_1m}"', ""]
    path.write_text("\n".join(lines))
    return path


@dataclass
class TidegateProcess:
    """One running `tidegate` command and the file its output goes to."""

    name: str
    proc: subprocess.Popen[bytes]
    log_path: Path

    def log(self) -> str:
        """Everything the process has written so far."""
        return self.log_path.read_text(errors="replace")

    def describe(self) -> str:
        """Its name, exit status and log, for an assertion message."""
        status = "running" if self.proc.poll() is None else f"exited with {self.proc.returncode}"
        return f"--- {self.name} ({status}) ---\n{self.log()}"

    async def stop(self, sig: signal.Signals = signal.SIGTERM, timeout_s: float = STOP_TIMEOUT_S) -> int:
        """Send `sig` and wait for the exit without blocking the event loop (a draining worker may
        still be calling a simulator served by this loop); SIGKILL after `timeout_s`. Returns
        the exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return await asyncio.to_thread(self.proc.wait, timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return await asyncio.to_thread(self.proc.wait)


@dataclass
class GatewayProcess(TidegateProcess):
    """A `tidegate gateway` and the URL it serves on."""

    url: str = ""


def _spawn(name: str, args: list[str], log_dir: Path) -> TidegateProcess:
    log_path = log_dir / f"{name}.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tidegate", *args], cwd=ROOT, stdin=subprocess.DEVNULL,
            stdout=log, stderr=subprocess.STDOUT,
        )
    return TidegateProcess(name, proc, log_path)


async def _until(process: TidegateProcess, what: str, check: Callable[[], Awaitable[bool]]) -> None:
    """Until `check` holds; fail with the process's log when it has exited first or
    START_TIMEOUT_S has passed."""

    async def holds() -> bool:
        if process.proc.poll() is not None:
            raise AssertionError(f"{process.name} exited before {what}\n{process.describe()}")
        return await check()

    await eventually(holds, f"{process.name} shows {what}", timeout_s=START_TIMEOUT_S, every_s=0.05,
                     describe=lambda _: process.describe())


async def start_gateway(name: str, queue_url: str, config: Path, log_dir: Path) -> GatewayProcess:
    """`tidegate gateway` on a port the kernel picks; returns once /readyz answers 200."""
    started = _spawn(name, ["gateway", "--queue", queue_url, "--config", str(config), "--port", "0"],
                     log_dir)
    gateway = GatewayProcess(started.name, started.proc, started.log_path)
    try:
        async def listening() -> bool:
            return _LISTENING.search(gateway.log()) is not None

        await _until(gateway, "a listening socket", listening)
        match = _LISTENING.search(gateway.log())
        assert match is not None
        gateway.url = match[1]
        async with httpx.AsyncClient(base_url=gateway.url, timeout=2.0) as http:

            async def ready() -> bool:
                try:
                    return (await http.get("/readyz")).status_code == 200
                except httpx.TransportError:
                    return False

            await _until(gateway, "a 200 from /readyz", ready)
            return gateway
    except BaseException:
        await gateway.stop(signal.SIGKILL)
        raise


async def start_worker(name: str, queue_url: str, config: Path, log_dir: Path,
                       *options: str) -> TidegateProcess:
    """`tidegate worker --worker-id NAME`; returns once it logs that it serves the queue."""
    worker = _spawn(name, ["worker", "--queue", queue_url, "--config", str(config),
                           "--worker-id", name, *options], log_dir)
    async def serving() -> bool:
        return f"worker {name} serving" in worker.log()

    try:
        await _until(worker, "a 'serving' line", serving)
    except BaseException:
        await worker.stop(signal.SIGKILL)
        raise
    return worker
