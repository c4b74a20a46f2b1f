"""Real `tidegate` processes for the fault tests: started with their output read line by line
(so a test can wait for "serving" and read the log afterwards), signalled, and timed until
they exit."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MARGIN_S = 5.0  # what a stop may take beyond its grace: interpreter exit, closing pools, a busy machine


@dataclass
class Process:
    """A running `tidegate ...` and what it has printed so far."""

    proc: asyncio.subprocess.Process
    stdout: list[str] = field(default_factory=list)
    stderr: list[str] = field(default_factory=list)
    readers: list[asyncio.Task[None]] = field(default_factory=list)

    @property
    def output(self) -> str:
        """Everything printed so far, stdout then stderr."""
        return "".join(self.stdout) + "".join(self.stderr)

    async def printed(self, text: str, timeout_s: float = 30.0) -> float:
        """Wait until `text` appears in the output; returns when (time.monotonic)."""
        deadline = time.monotonic() + timeout_s
        while text not in self.output:
            if self.proc.returncode is not None and all(reader.done() for reader in self.readers):
                raise AssertionError(f"the process exited ({self.proc.returncode}) before printing "
                                     f"{text!r}:\n{self.output}")
            if time.monotonic() > deadline:
                raise AssertionError(f"{text!r} not printed within {timeout_s}s:\n{self.output}")
            await asyncio.sleep(0.01)
        return time.monotonic()

    def send(self, sig: signal.Signals) -> None:
        """Send a signal (kill -9 with SIGKILL)."""
        self.proc.send_signal(sig)

    async def exited(self, timeout_s: float) -> int:
        """The exit status, once it has exited within `timeout_s` (else the test fails, and
        the process is killed)."""
        try:
            async with asyncio.timeout(timeout_s):
                status = await self.proc.wait()
                await asyncio.gather(*self.readers)
        except TimeoutError:
            self.proc.kill()
            await self.proc.wait()
            raise AssertionError(f"still running {timeout_s}s after the stop:\n{self.output}") from None
        return status


async def _read(stream: asyncio.StreamReader | None, into: list[str]) -> None:
    assert stream is not None
    while line := await stream.readline():
        into.append(line.decode(errors="replace"))


@contextlib.asynccontextmanager
async def tidegate(*args: str, cwd: Path | None = None) -> AsyncIterator[Process]:
    """`python -m tidegate ARGS...`, killed on leaving the block if it still runs."""
    env = {**os.environ, "COLUMNS": "200", "PYTHONUNBUFFERED": "1"}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tidegate", *args, cwd=cwd or ROOT, env=env,
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    process = Process(proc)
    process.readers = [asyncio.create_task(_read(proc.stdout, process.stdout)),
                       asyncio.create_task(_read(proc.stderr, process.stderr))]
    try:
        yield process
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        for reader in process.readers:
            reader.cancel()
        await asyncio.gather(*process.readers, return_exceptions=True)


def provider_config(folder: Path, base_url: str, extra: str = "") -> Path:
    """A tidegate.toml whose one provider is the simulator at `base_url`."""
    path = folder / "tidegate.toml"
    path.write_text(f"""
[[providers]]
name = "sim"
base_url = "{base_url}"

[[providers.models]]
name = "deepseek-v3.2"
input_usd_per_1m = "0.28"
output_usd_per_1m = "0.42"
max_concurrency = 256
{extra}
""")
    return path


@dataclass
class Up:
    """What a running `tidegate up` printed: where to reach it."""

    api_url: str
    sim_url: str  # the simulator's root (its /_sim/ control endpoints)
    admin_key: str


async def up_ready(up: Process) -> Up:
    """Once `tidegate up` has printed its table: where it listens and its admin key."""
    await up.printed("Press Ctrl-C to stop.", timeout_s=60)
    text = "".join(up.stdout)
    api = re.search(r"API \(OpenAI base_url\)\s+(\S+)", text)
    sim = re.search(r"simulated, (\S+)/v1", text)
    key = re.search(r"^(tg_\S+)$", text, re.MULTILINE)
    assert api and sim and key, text
    return Up(api.group(1), sim.group(1), key.group(1))
