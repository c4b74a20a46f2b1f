"""A `tidegate` command run as a real process by the tests: started with its output read line by
line (so a test can wait for "serving" and read the log afterwards), signalled, and timed until
it exits.

What differs between the tests is given to `Process.start`: the command (the test venv's
`python -m tidegate`, or the `tidegate` of another venv), the folder it runs in and its
environment. A test that reads more from the output (a URL, a key) subclasses `Process`.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Self

from support.waiting import eventually

# The source tree's tidegate, as the test venv's interpreter imports it (the editable install).
PYTHON_M_TIDEGATE = (sys.executable, "-m", "tidegate")


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
        def printed() -> bool:
            if text in self.output:
                return True
            if self.proc.returncode is not None and all(reader.done() for reader in self.readers):
                raise AssertionError(f"the process exited ({self.proc.returncode}) before printing "
                                     f"{text!r}:\n{self.output}")
            return False

        await eventually(printed, f"{text!r} is printed", timeout_s=timeout_s, every_s=0.01,
                         describe=lambda _: self.output)
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

    @classmethod
    @contextlib.asynccontextmanager
    async def start(cls, *command: str | Path, cwd: Path, env: Mapping[str, str]) -> AsyncIterator[Self]:
        """`COMMAND...` in `cwd` with exactly `env` (which should set PYTHONUNBUFFERED=1, or the
        output arrives only at exit), killed on leaving the block if it still runs."""
        proc = await asyncio.create_subprocess_exec(
            *command, cwd=cwd, env=dict(env),
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )
        process = cls(proc)
        process.readers = [asyncio.create_task(_read(proc.stdout, process.stdout)),
                           asyncio.create_task(_read(proc.stderr, process.stderr))]
        try:
            yield process
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
            # Cancelled rather than awaited: a child the process started may still hold its pipes.
            for reader in process.readers:
                reader.cancel()
            await asyncio.gather(*process.readers, return_exceptions=True)


async def _read(stream: asyncio.StreamReader | None, into: list[str]) -> None:
    assert stream is not None
    while line := await stream.readline():
        into.append(line.decode(errors="replace"))
