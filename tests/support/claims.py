"""Seeing a blocking claim wait: the tests that mean "the claim is blocked, then work arrives"
observe the first half instead of sleeping for it."""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any

from tidegate.queue import Queue


class ClaimWaits:
    """Counts the times claims of the given queue instances began waiting for work: the test's
    hook on the backend's `_wait_for_work`, the step a blocking claim takes once it found
    nothing to lease (work arriving from then on wakes it)."""

    def __init__(self, *queues: Queue) -> None:
        self.count = 0
        for queue in queues:
            self._hook(queue)

    def _hook(self, queue: Queue) -> None:
        wait_for_work = queue._wait_for_work

        def waiting(
            levels: tuple[int, ...], timeout_s: float, marker: object, **options: Any
        ) -> Awaitable[None]:
            self.count += 1
            return wait_for_work(levels, timeout_s, marker, **options)

        queue._wait_for_work = waiting  # type: ignore[method-assign,assignment]
