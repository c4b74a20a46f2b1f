"""GroupCall (tidegate._group_commit): calls made while a batch is on its way go out together in the
next, each caller gets its own outcome, and nothing is left waiting."""

from __future__ import annotations

import asyncio

import pytest

from tidegate._group_commit import GroupCall


class Sender:
    """Records each batch; answers after `delay_s`, each item doubled, an odd item refused.
    `sent` is set once a batch is on its way."""

    def __init__(self, delay_s: float = 0.0) -> None:
        self.batches: list[list[int]] = []
        self.delay_s = delay_s
        self.fail_with: Exception | None = None
        self.sent = asyncio.Event()

    async def __call__(self, items: list[int]) -> list[int | BaseException]:
        self.batches.append(items)
        self.sent.set()
        await asyncio.sleep(self.delay_s)
        if self.fail_with is not None:
            raise self.fail_with
        return [ValueError(f"odd {item}") if item % 2 else item * 2 for item in items]


async def test_calls_of_one_loop_turn_go_out_in_one_batch() -> None:
    sender = Sender()
    group = GroupCall(sender)

    results = await asyncio.gather(*(group.call(item) for item in (2, 4, 6)))

    assert results == [4, 8, 12]
    assert sender.batches == [[2, 4, 6]]


async def test_calls_made_while_a_batch_is_on_its_way_go_in_the_next() -> None:
    sender = Sender(delay_s=0.05)
    group = GroupCall(sender)
    first = asyncio.ensure_future(group.call(2))
    await sender.sent.wait()  # the first batch is on its way

    later = await asyncio.gather(*(group.call(item) for item in (4, 6)))

    assert await first == 4 and later == [8, 12]
    assert sender.batches == [[2], [4, 6]]


async def test_each_caller_gets_its_own_outcome() -> None:
    group = GroupCall(Sender())

    outcomes = await asyncio.gather(group.call(2), group.call(3), return_exceptions=True)

    assert outcomes[0] == 4
    assert isinstance(outcomes[1], ValueError) and str(outcomes[1]) == "odd 3"


async def test_a_failed_send_reaches_every_caller_of_its_batch_and_the_next_batch_is_sent() -> None:
    sender = Sender()
    sender.fail_with = ConnectionError("server gone")
    group = GroupCall(sender)

    outcomes = await asyncio.gather(group.call(2), group.call(4), return_exceptions=True)
    sender.fail_with = None
    after = await group.call(6)

    assert all(isinstance(outcome, ConnectionError) for outcome in outcomes)
    assert after == 12


async def test_batches_hold_at_most_max_items() -> None:
    sender = Sender()
    group = GroupCall(sender, max_items=2)

    assert await asyncio.gather(*(group.call(item) for item in (2, 4, 6))) == [4, 8, 12]
    assert sender.batches == [[2, 4], [6]]


async def test_a_cancelled_caller_does_not_stop_its_batch() -> None:
    sender = Sender(delay_s=0.05)
    group = GroupCall(sender)
    cancelled = asyncio.ensure_future(group.call(2))
    kept = asyncio.ensure_future(group.call(4))
    await sender.sent.wait()

    cancelled.cancel()

    assert await kept == 8
    with pytest.raises(asyncio.CancelledError):
        await cancelled
    assert sender.batches == [[2, 4]]  # sent all the same


async def test_drain_returns_once_every_call_is_answered() -> None:
    sender = Sender(delay_s=0.02)
    group = GroupCall(sender)
    calls = [asyncio.ensure_future(group.call(item)) for item in (2, 4)]
    await sender.sent.wait()

    await group.drain()

    assert all(call.done() for call in calls)


async def test_stopping_the_sender_leaves_no_caller_waiting() -> None:
    sender = Sender(delay_s=10.0)
    group = GroupCall(sender)
    calls = [asyncio.ensure_future(group.call(item)) for item in (2, 4)]
    await sender.sent.wait()
    assert group._sender is not None

    group._sender.cancel()

    done, _ = await asyncio.wait(calls, timeout=1.0)
    assert done == set(calls) and all(call.cancelled() for call in calls)
