"""Wake-ups without polling for the embedded backend.

A `Signal` wakes every coroutine waiting on it. `Doorbell` carries signals between the queue
instances that share one SQLite file — in this process or in others on the host — over Linux
abstract-namespace datagram sockets: each instance that waits rings from a socket whose name is
registered as an empty file in `<db>.bells/`; producers ring every registered bell after their
transaction commits. A lost or refused datagram costs at most one safety interval of latency, never
correctness, because waiters re-check the database after every wake-up and at least every few
seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import sys
import time
import uuid
from pathlib import Path

WORK = b"w"  # new or returned work may be claimable
DONE = b"d"  # some job reached a final state
# A folder's mtime is set from a coarse clock: a bell registered within the same tick as the
# listing that saw that mtime would leave it unchanged. A listing is trusted only once its mtime
# is older than this, as git treats a "racily clean" index entry.
RACY_MTIME_NS = 50_000_000


class Signal:
    """A broadcast wake-up: `notify()` wakes everyone waiting on a marker taken before it."""

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def marker(self) -> asyncio.Event:
        """The event that the next notify() sets; take it before checking the condition."""
        return self._event

    def notify(self) -> None:
        """Wake all current waiters; later waiters wait for the next notify()."""
        event, self._event = self._event, asyncio.Event()
        event.set()

    @staticmethod
    async def wait(marker: object, timeout_s: float) -> bool:
        """Wait until the marker's notify or the timeout; True when notified."""
        assert isinstance(marker, asyncio.Event)
        try:
            await asyncio.wait_for(marker.wait(), timeout_s)
        except TimeoutError:
            return False
        return True


class Doorbell:
    """Cross-instance delivery of WORK and DONE signals for one SQLite database file."""

    def __init__(self, db_path: str) -> None:
        self.work = Signal()
        self.done = Signal()
        self._dir = Path(f"{db_path}.bells")
        self._name = uuid.uuid4().hex
        self._sock: socket.socket | None = None
        self._sender: socket.socket | None = None
        self._supported = sys.platform.startswith("linux")
        # The other instances' bells as last listed, and the folder's mtime then (None: list
        # again): a ring, two per request, stats the folder instead of listing it, at a quarter
        # of the cost.
        self._others: list[str] = []
        self._listed_mtime_ns: int | None = None

    def listen(self) -> None:
        """Start receiving rings from other instances (idempotent; needs a running loop)."""
        if self._sock is not None or not self._supported:
            return
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.setblocking(False)
        sock.bind(_address(self._name))
        self._dir.mkdir(parents=True, exist_ok=True)
        (self._dir / self._name).touch()
        asyncio.get_running_loop().add_reader(sock.fileno(), self._on_readable)
        self._sock = sock

    def close(self) -> None:
        """Stop listening and unregister this instance's bell."""
        if self._sock is not None:
            with contextlib.suppress(Exception):
                asyncio.get_running_loop().remove_reader(self._sock.fileno())
            self._sock.close()
            self._sock = None
            with contextlib.suppress(FileNotFoundError):
                (self._dir / self._name).unlink()
        if self._sender is not None:
            self._sender.close()
            self._sender = None

    def ring(self, kind: bytes, *, here: bool = True) -> None:
        """Signal this instance's waiters (unless `here` is False: the caller told them itself),
        then every other registered instance."""
        if here:
            (self.work if kind == WORK else self.done).notify()
        if not self._supported:
            return
        for name in self._other_bells():
            self._send(name, kind)

    def _other_bells(self) -> list[str]:
        """The names of the other registered bells, listed again when the folder changed."""
        try:
            mtime_ns = os.stat(self._dir).st_mtime_ns
        except FileNotFoundError:
            return []
        if mtime_ns != self._listed_mtime_ns:
            try:
                names = os.listdir(self._dir)
            except FileNotFoundError:
                return []
            self._others = [name for name in names if name != self._name]
            racy = time.time_ns() - mtime_ns < RACY_MTIME_NS
            self._listed_mtime_ns = None if racy else mtime_ns
        return self._others

    def _send(self, name: str, kind: bytes) -> None:
        if self._sender is None:
            self._sender = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            self._sender.setblocking(False)
        try:
            self._sender.sendto(kind, _address(name))
        except ConnectionRefusedError:
            # Its process is gone without closing: drop the stale registration.
            with contextlib.suppress(FileNotFoundError):
                (self._dir / name).unlink()
            self._listed_mtime_ns = None
        except (BlockingIOError, FileNotFoundError, OSError):
            pass  # a full buffer already holds a pending wake-up; safety re-checks cover the rest

    def _on_readable(self) -> None:
        assert self._sock is not None
        kinds: set[bytes] = set()
        while True:
            try:
                kinds.add(self._sock.recv(16))
            except (BlockingIOError, InterruptedError):
                break
        if WORK in kinds:
            self.work.notify()
        if DONE in kinds:
            self.done.notify()


def _address(name: str) -> bytes:
    return b"\0tidegate-" + name.encode()
