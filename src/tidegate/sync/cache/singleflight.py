"""Single flight: concurrent callers asking for one key share one run of the work.

A cache miss on a popular entity would otherwise send every concurrent reader to the source of
truth at once (a thundering herd). Here the first caller starts the work as a task; everyone who
asks for the same key while it runs awaits that task, and sees its result or its exception. The
key is forgotten as soon as the task ends, so a failure is never cached and the next caller starts
afresh. Coalescing is per process: other processes sharing a Redis cache run their own flights.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Hashable
from typing import Any, Generic, TypeVar

__all__ = ["SingleFlight"]

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class SingleFlight(Generic[K, V]):
    """At most one running `work()` per key; concurrent callers share its outcome."""

    def __init__(self) -> None:
        self._running: dict[K, asyncio.Task[V]] = {}
        self._waiting: dict[K, int] = {}

    def __len__(self) -> int:
        """How many keys have work running now."""
        return len(self._running)

    def waiting(self, key: K) -> int:
        """How many callers are awaiting the work for `key` now."""
        return self._waiting.get(key, 0)

    async def run(self, key: K, work: Callable[[], Coroutine[Any, Any, V]]) -> V:
        """The outcome of `work()` for `key`, started now unless a run for `key` is under way.

        A caller that is cancelled stops waiting but does not cancel the shared work: the other
        callers still get its outcome."""
        task = self._running.get(key)
        if task is None:
            task = asyncio.create_task(work())
            self._running[key] = task
            task.add_done_callback(lambda done: self._finished(key, done))
        self._waiting[key] = self._waiting.get(key, 0) + 1
        try:
            return await asyncio.shield(task)
        finally:
            left = self._waiting.pop(key) - 1
            if left:
                self._waiting[key] = left

    def _finished(self, key: K, task: asyncio.Task[V]) -> None:
        if self._running.get(key) is task:
            del self._running[key]
        # Mark the exception retrieved: when every caller was cancelled nobody else will, and
        # asyncio would report it as never retrieved.
        if not task.cancelled():
            task.exception()
