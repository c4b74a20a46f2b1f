"""A lock whose waiters are let through by priority, then by arrival.

Jobs a worker has claimed may still have to wait for their model's rate limit. Were they to wait
first-come, first-served, a critical job claimed a moment after forty bulk jobs would wait behind
all of them; through this turnstile only one job per model contends for the limiter, and the next
one to try is always the most urgent."""

from __future__ import annotations

import asyncio
import heapq
import itertools


class PriorityTurnstile:
    """One holder at a time; `acquire` takes a priority (lower goes first) and a timeout."""

    def __init__(self) -> None:
        self._held = False
        self._waiters: list[tuple[int, int, asyncio.Future[None]]] = []
        self._arrival = itertools.count()

    async def acquire(self, priority: int, timeout_s: float) -> bool:
        """True once this caller holds the turnstile; False after `timeout_s` without it."""
        if not self._held and not self._waiters:
            self._held = True
            return True
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiters, (priority, next(self._arrival), turn))
        try:
            # A turn handed over just as the timeout fires is still returned by wait_for, so a
            # grant is never lost.
            await asyncio.wait_for(turn, max(timeout_s, 0.0))
        except TimeoutError:
            return False
        return True

    def release(self) -> None:
        """Hand the turnstile to the most urgent live waiter, or free it."""
        while self._waiters:
            _, _, turn = heapq.heappop(self._waiters)
            if not turn.done():  # skip those that timed out or were cancelled
                turn.set_result(None)
                return
        self._held = False
