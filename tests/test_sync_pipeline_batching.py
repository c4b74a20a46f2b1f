"""The pipeline publishes what its source has ready in batches (one bus call for many small
transactions), in source order, bounded by batch_size; heartbeats are still confirmed; and a stop
never waits for transactions that were read but not yet published."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime
from typing import Self

from support.waiting import eventually
from tidegate.sync.buses.base import BusSettings
from tidegate.sync.buses.memory import MemoryBus
from tidegate.sync.cache import cache_for
from tidegate.sync.changes import Change, Op, Version
from tidegate.sync.contracts import Transaction
from tidegate.sync.pipeline import Pipeline, PipelineSettings
from tidegate.sync.values import JsonValue

COMMITTED = datetime(2026, 1, 1, tzinfo=UTC)


def _transaction(position: int, ids: Sequence[int]) -> Transaction:
    changes = tuple(
        Change.of_row(entity_type="items", op=Op.UPDATE, key_columns=("id",),
                      version=Version(position, ordinal), commit_time=COMMITTED, xid=position,
                      after={"id": row_id, "n": position})
        for ordinal, row_id in enumerate(ids))
    return Transaction(changes, position=position, commit_time=COMMITTED)


class ListSource:
    """A ChangeSource over transactions given up front, all ready at once (as a backlog is),
    then idle until closed; it records what the pipeline confirmed."""

    def __init__(self, transactions: Sequence[Transaction]) -> None:
        self.pending = list(transactions)
        self.confirmed: list[int] = []
        self.closed = asyncio.Event()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self.closed.set()

    async def transactions(self) -> AsyncIterator[Transaction]:
        for transaction in self.pending:
            yield transaction
        await self.closed.wait()

    async def confirm(self, position: int) -> None:
        self.confirmed.append(position)

    async def confirm_snapshot(self, mark: JsonValue) -> None:
        raise AssertionError("no snapshot here")


class RecordingBus(MemoryBus):
    """The memory bus, recording how many changes each publish carried. With `stall` set, the
    first publish reaches the bus and then never returns (a broker that stopped answering)."""

    def __init__(self) -> None:
        super().__init__(BusSettings())
        self.published: list[int] = []
        self.stall: asyncio.Event | None = None

    async def _publish(self, changes: Sequence[Change]) -> None:
        self.published.append(len(changes))
        await super()._publish(changes)
        if self.stall is not None:
            await self.stall.wait()


@contextlib.asynccontextmanager
async def _running(pipeline: Pipeline) -> AsyncIterator[asyncio.Event]:
    stop = asyncio.Event()
    task = asyncio.create_task(pipeline.run(stop))
    try:
        yield stop
    finally:
        stop.set()
        await asyncio.wait_for(task, 5)


async def test_a_backlog_of_small_transactions_goes_out_in_batches_in_order() -> None:
    # Given 100 ready transactions of 3 changes, the last one updating every row once more
    transactions = [_transaction(10 + i, [3 * i % 40, (3 * i + 1) % 40, (3 * i + 2) % 40]) for i in range(99)]
    transactions.append(_transaction(500, range(40)))
    source, bus = ListSource(transactions), RecordingBus()
    async with bus, cache_for("memory://") as cache:
        pipeline = Pipeline(source, bus, cache, ["items"], settings=PipelineSettings(batch_size=50))
        async with _running(pipeline):
            await eventually(lambda: pipeline.applied_changes == 337, "every change is applied")
            await eventually(lambda: pipeline.last_confirmed == 500, "the last position is confirmed")
        # Then far fewer publishes than transactions, each ending at the first transaction that
        # brought it to 50 changes, and nothing published twice or lost
        assert sum(bus.published) == 337
        assert len(bus.published) < 20
        assert all(size < 50 + 40 for size in bus.published)
        # and the cache holds every row as of the newest transaction (publish order kept)
        for row_id in range(40):
            entry = await cache.get("items", str(row_id))
            assert entry is not None and entry.data == {"id": row_id, "n": 500}
    assert source.confirmed == sorted(source.confirmed)


async def test_an_empty_transaction_in_a_batch_is_confirmed_after_the_changes_before_it() -> None:
    source = ListSource([_transaction(10, [1, 2]), Transaction((), position=20), _transaction(30, [3])])
    bus = RecordingBus()
    async with bus, cache_for("memory://") as cache:
        pipeline = Pipeline(source, bus, cache, ["items"])
        async with _running(pipeline):
            await eventually(lambda: pipeline.last_confirmed == 30, "the last position is confirmed")
    assert bus.published == [3]  # the heartbeat rode along, publishing nothing
    assert source.confirmed[-1] == 30 and source.confirmed == sorted(source.confirmed)


async def test_a_stop_does_not_wait_for_transactions_read_but_not_yet_published() -> None:
    # Given a broker that took the first batch and then stopped answering, while the rest of
    # the backlog was read behind it
    source = ListSource([_transaction(10 + i, [i]) for i in range(20)])
    bus = RecordingBus()
    bus.stall = asyncio.Event()
    async with bus, cache_for("memory://") as cache:
        # (a drain that waited for the unpublished rest would wait out this whole timeout)
        pipeline = Pipeline(source, bus, cache, ["items"],
                            settings=PipelineSettings(batch_size=5, drain_timeout_s=3600.0))
        stop = asyncio.Event()
        task = asyncio.create_task(pipeline.run(stop))
        await eventually(lambda: pipeline.applied_changes == 5, "the first batch is applied")
        # When the pipeline is stopped
        stop.set()
        await asyncio.wait_for(task, 30)
        # Then it stops: the drain waits only for what reached the bus, the first batch, which is
        # confirmed; the rest stays unconfirmed at the source, to be read again
        assert bus.published == [5] and pipeline.applied_changes == 5
        assert pipeline.last_confirmed == 14 and source.confirmed[-1] == 14
