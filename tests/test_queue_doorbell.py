"""The embedded queue's doorbell: rings reach every instance registered on the same file, also one
registered after the ringer's listing of the bells was cached."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

from tidegate.queue._signals import DONE, WORK, Doorbell

WAKE_TIMEOUT_S = 5.0


def _age(folder: Path, seconds: float) -> None:
    """Set the folder's mtime `seconds` into the past, as if its last change were that old."""
    then = time.time() - seconds
    os.utime(folder, (then, then))


async def _woken(bell: Doorbell, kind: bytes, ring: Doorbell) -> bool:
    signal = bell.work if kind == WORK else bell.done
    marker = signal.marker()
    ring.ring(kind)
    return await signal.wait(marker, WAKE_TIMEOUT_S)


async def test_a_bell_registered_after_a_trusted_listing_is_rung(tmp_path: Path) -> None:
    db = str(tmp_path / "q.db")
    first, second = Doorbell(db), Doorbell(db)
    first.listen()
    try:
        _age(Path(f"{db}.bells"), 10.0)
        first.ring(WORK)  # lists the bells (none but its own) and trusts the listing: the folder is old
        second.listen()   # registers: the folder changes
        assert await _woken(second, WORK, first)
        assert await _woken(second, DONE, first)
        assert await _woken(first, WORK, second)
    finally:
        first.close()
        second.close()


async def test_a_bell_whose_process_is_gone_is_dropped(tmp_path: Path) -> None:
    db = str(tmp_path / "q.db")
    ringer, gone = Doorbell(db), Doorbell(db)
    ringer.listen()
    gone.listen()
    folder = Path(f"{db}.bells")
    # A process killed without closing leaves its file and no socket behind.
    assert gone._sock is not None
    asyncio.get_running_loop().remove_reader(gone._sock.fileno())
    gone._sock.close()
    gone._sock = None
    try:
        ringer.ring(WORK)
        assert sorted(os.listdir(folder)) == [ringer._name]
        late = Doorbell(db)
        late.listen()
        try:
            assert await _woken(late, WORK, ringer)
        finally:
            late.close()
    finally:
        ringer.close()
