"""The pacing turnstile lets the most urgent waiter through first, and a timed-out waiter never
holds it."""

from __future__ import annotations

import asyncio

from tidegate.dispatch.turnstile import PriorityTurnstile


async def test_waiters_go_through_by_priority_then_arrival() -> None:
    gate = PriorityTurnstile()
    assert await gate.acquire(4, 1.0)
    order: list[str] = []

    async def wait(name: str, priority: int) -> None:
        assert await gate.acquire(priority, 5.0)
        order.append(name)
        gate.release()

    tasks = []
    for name, priority in [("bulk-1", 4), ("normal", 2), ("critical", 0), ("bulk-2", 4)]:
        tasks.append(asyncio.create_task(wait(name, priority)))
        await asyncio.sleep(0)  # arrival order is the order of creation
    gate.release()
    await asyncio.gather(*tasks)
    assert order == ["critical", "normal", "bulk-1", "bulk-2"]


async def test_a_waiter_that_times_out_is_skipped_and_the_gate_frees() -> None:
    gate = PriorityTurnstile()
    assert await gate.acquire(2, 1.0)
    assert not await gate.acquire(0, 0.05)  # times out while held
    late = asyncio.create_task(gate.acquire(3, 5.0))
    await asyncio.sleep(0)
    gate.release()
    assert await late  # the timed-out waiter did not swallow the turn
    gate.release()
    assert await gate.acquire(1, 0.0)  # free again
