"""The last guard of every stop's bound: a process whose drain hangs past its grace (plus
HARD_STOP_MARGIN_S) exits anyway, with status 1 and a message saying it was stuck."""

from __future__ import annotations

import asyncio
import signal
import sys
import textwrap
import time

from support.faults import ROOT

HANGS_ON_STOP = textwrap.dedent("""
    import asyncio
    from tidegate import _shutdown

    _shutdown.HARD_STOP_MARGIN_S = 0.5

    async def main() -> None:
        stopping = asyncio.Event()
        with _shutdown.stop_on_signals(stopping.set, grace_s=0.5):
            print("ready", flush=True)
            await stopping.wait()
            await asyncio.Event().wait()  # a drain that never ends

    asyncio.run(main())
""")


async def test_a_stop_that_hangs_past_its_grace_ends_the_process_with_status_1() -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", HANGS_ON_STOP, cwd=ROOT,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        assert proc.stdout is not None
        assert (await asyncio.wait_for(proc.stdout.readline(), 30)).strip() == b"ready"
        stopped = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        _, err = await asyncio.wait_for(proc.communicate(), 10)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == 1
    assert time.monotonic() - stopped >= 1.0  # grace + margin, not at once
    assert b"still stopping" in err
