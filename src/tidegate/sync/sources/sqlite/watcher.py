"""The SQLite source's watcher: a thread that notices commits of other connections by
`PRAGMA data_version`, so the poller reads the outbox only after one."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import threading

from tidegate.errors import SourceError

__all__ = ["Watcher"]


class Watcher:
    """A thread that asks `PRAGMA data_version` every `interval_s` on a connection of its own and
    sets `changed` (an asyncio.Event of the calling loop) whenever it moved."""

    def __init__(self, path: str, interval_s: float, changed: asyncio.Event) -> None:
        self._path = path
        self._interval_s = interval_s
        self._changed = changed
        self._loop = asyncio.get_running_loop()
        self._stopping = threading.Event()
        self._failure: sqlite3.Error | None = None
        self._thread = threading.Thread(target=self._watch, name="tidegate-sync-sqlite-watch", daemon=True)
        self._thread.start()

    def raise_failure(self) -> None:
        """Raise what stopped the watcher, if anything did."""
        if self._failure is not None:
            raise SourceError(f"SQLite source at {self._path}: watching for commits failed: {self._failure}")

    async def stop(self) -> None:
        """Stop the thread and wait for it (at most one interval)."""
        self._stopping.set()
        await asyncio.to_thread(self._thread.join)

    def _watch(self) -> None:
        try:
            conn = sqlite3.connect(self._path, isolation_level=None, check_same_thread=False)
            try:
                last = None
                while not self._stopping.wait(self._interval_s):
                    version = conn.execute("PRAGMA data_version").fetchone()[0]
                    if version != last:
                        last = version
                        self._loop.call_soon_threadsafe(self._changed.set)
            finally:
                conn.close()
        except sqlite3.Error as exc:
            self._failure = exc
            self._wake()
        except RuntimeError:  # the event loop closed under a source that was never closed
            return

    def _wake(self) -> None:
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(self._changed.set)
