"""The sync pipeline: source → bus → entity cache → sinks, and positions confirmed back.

Two tasks share one tracker:

- the producer takes committed transactions from the source, fills columns the source could not
  send (unchanged TOAST values) from the row's latest image in commit order or from the source
  itself (`tidegate.sync.fill`), and publishes them on the bus;
- the consumer fetches from the bus as a member of the pipeline's consumer group, applies each
  batch to the cache (compare-and-set on versions) and then to the sinks with the cache's results,
  acks the batch, and confirms to the source every position whose transaction and all before it
  are applied.

Once the snapshot is behind it (the source has sent a transaction of its stream) and every change
published has been applied, the pipeline calls `on_loaded` once; by default, in a tidegate process,
that freezes the loaded heap out of the garbage collector's reach (`tidegate._eventloop`).

So a crash anywhere loses nothing: unconfirmed positions are replayed by the source, unacked
deliveries stay on the bus, and replays are harmless because the cache ignores versions it has.
Other processes (a recommender in each gateway) may consume the same bus with their own groups.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence

from tidegate._eventloop import freeze_loaded
from tidegate.config import PipelineSettings, default_consumer_name
from tidegate.errors import TidegateError
from tidegate.sync.contracts import (
    ApplyOutcome,
    ApplyResult,
    Bus,
    ChangeSource,
    EntityCache,
    Sink,
    Subscription,
    Transaction,
)
from tidegate.sync.fill import Filler, RowReader
from tidegate.sync.metrics import SyncMetrics
from tidegate.sync.tracker import PositionTracker

__all__ = ["Pipeline", "PipelineSettings", "default_consumer_name"]

log = logging.getLogger("tidegate.sync")


def _backfill_of(transaction: Transaction) -> str | None:
    """The entity type a source's backfill batch (rows re-read after a schema change) re-reads:
    its mark names it in `backfill`."""
    mark = transaction.snapshot_mark
    if isinstance(mark, dict) and isinstance(mark.get("backfill"), str):
        return str(mark["backfill"])
    return None


class Pipeline:
    """Runs one source into the bus and the bus into the cache and sinks; see the module doc."""

    # Over seven parameters (PLR0913): outstanding, issue 27: not yet folded into an object.
    def __init__(self, source: ChangeSource, bus: Bus, cache: EntityCache, entity_types: Sequence[str], *,  # noqa: PLR0913
                 sinks: Sequence[Sink] = (), settings: PipelineSettings | None = None,
                 metrics: SyncMetrics | None = None, on_loaded: Callable[[], object] | None = None) -> None:
        self.source = source
        self.bus = bus
        self.cache = cache
        self.sinks = tuple(sinks)
        self.entity_types = tuple(entity_types)
        self.settings = settings or PipelineSettings()
        self.metrics = metrics or SyncMetrics()
        self._tracker = PositionTracker()
        self._room = asyncio.Condition()
        reader = self.source if isinstance(self.source, RowReader) else None
        self._filler = Filler(reader, self.metrics)
        self._producing = True
        self._unpublished = 0  # changes read from the source, not yet published
        self.applied_changes = 0  # applied by the cache and every sink, stale ones included
        self.last_confirmed: int | None = None
        if on_loaded is None and self.settings.freeze_loaded:
            on_loaded = freeze_loaded
        self._on_loaded = on_loaded
        self._streaming = False  # a transaction of the source's stream (not its snapshot) was published

    async def run(self, stop: asyncio.Event | None = None) -> None:
        """Run until `stop` is set (then drain what is in flight) or a part fails (raised)."""
        subscription = self.bus.subscribe(self.settings.group, self.settings.consumer, self.entity_types)
        async with subscription:
            producer = asyncio.create_task(self._produce(), name="sync-producer")
            consumer = asyncio.create_task(self._consume(subscription), name="sync-consumer")
            stopper = asyncio.create_task((stop or asyncio.Event()).wait(), name="sync-stop")
            monitor = asyncio.create_task(self._monitor(), name="sync-monitor")
            try:
                done, _ = await asyncio.wait({producer, consumer, stopper},
                                             return_when=asyncio.FIRST_COMPLETED)
                for task in done & {producer, consumer}:
                    task.result()  # a failed part fails the pipeline
                await self._stop_producer(producer)
                await self._drain(consumer)
            finally:
                for task in (producer, consumer, stopper, monitor):
                    task.cancel()
                await asyncio.gather(producer, consumer, stopper, monitor, return_exceptions=True)

    async def _stop_producer(self, producer: asyncio.Task[None]) -> None:
        self._producing = False
        producer.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await producer

    async def _drain(self, consumer: asyncio.Task[None]) -> None:
        """Let the consumer apply what was published (bounded by drain_timeout_s)."""
        async def applied_all() -> None:
            async with self._room:
                await self._room.wait_for(lambda: self._tracker.pending_changes == 0)

        waiter = asyncio.create_task(applied_all())
        await asyncio.wait({waiter, consumer}, timeout=self.settings.drain_timeout_s,
                           return_when=asyncio.FIRST_COMPLETED)
        waiter.cancel()
        if consumer.done():
            consumer.result()
        await self._confirm()

    async def _monitor(self) -> None:
        """Replication lag and slot state from the source's status, when it has one."""
        status = getattr(self.source, "status", None)
        if status is None:
            return
        while True:
            await asyncio.sleep(self.settings.status_interval_s)
            try:
                report = await status()
            except TidegateError as exc:
                log.warning("cannot read the change source's status: %s", exc)
                continue
            values = report.to_dict() if hasattr(report, "to_dict") else report
            if isinstance(values.get("lag_bytes"), int):
                self.metrics.lag_bytes.set(values["lag_bytes"])
            if "active" in values:
                self.metrics.slot_active.set(1 if values["active"] else 0)

    # -- producer ---------------------------------------------------------------------------

    async def _produce(self) -> None:
        """Read the source on a task of its own and publish what it read meanwhile in one call:
        one bus round trip per batch rather than per transaction, which matters because a
        transaction often holds a few changes and a round trip to Redis or Kafka costs more than
        they do. A batch ends at the first transaction that brings it to `batch_size` changes."""
        ready: asyncio.Queue[Transaction | None] = asyncio.Queue()  # None: the source ended
        reader = asyncio.create_task(self._read_source(ready), name="sync-source")
        try:
            while (first := await ready.get()) is not None:
                batch, size = [first], len(first.changes)
                while size < self.settings.batch_size and not ready.empty():
                    transaction = ready.get_nowait()
                    if transaction is None:
                        ready.put_nowait(None)  # the end, taken after this batch
                        break
                    batch.append(transaction)
                    size += len(transaction.changes)
                await self._publish(batch)
            await reader  # the source ended: its failure, if it failed, is the producer's
        finally:
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)

    async def _read_source(self, ready: asyncio.Queue[Transaction | None]) -> None:
        try:
            async for transaction in self.source.transactions():
                backfilled = _backfill_of(transaction)
                if backfilled is not None:
                    # Rows re-read after a schema change are not in commit order: they neither
                    # need a fill nor may they serve as one; earlier images may be in the old shape.
                    self._filler.forget(backfilled)
                else:
                    transaction = await self._filler.fill(transaction)
                async with self._room:
                    await self._room.wait_for(self._has_room)
                self._unpublished += len(transaction.changes)
                ready.put_nowait(transaction)
        finally:
            ready.put_nowait(None)

    def _has_room(self) -> bool:
        """Read ahead of the consumer (published or not yet) stays within max_pending_changes."""
        return self._tracker.pending_changes + self._unpublished < self.settings.max_pending_changes

    async def _publish(self, batch: Sequence[Transaction]) -> None:
        # Tracked only now: a transaction read but never published (the pipeline stopped) must
        # not hold up the drain, which waits for every tracked change.
        for transaction in batch:
            self._tracker.add(transaction)
            self._unpublished -= len(transaction.changes)
            self._count_backfill(transaction)
            self._streaming = self._streaming or transaction.snapshot_mark is None
        self.metrics.pending.set(self._tracker.pending_changes)
        changes = [change for transaction in batch for change in transaction.changes]
        if changes:
            await self.bus.publish(changes)
            now = time.time()
            commit_to_bus = self.metrics.commit_to_bus_of
            for transaction in batch:
                if transaction.snapshot_mark is not None:
                    continue
                for change in transaction.changes:
                    commit_to_bus(change.entity_type).observe(max(0.0, now - change.commit_time.timestamp()))
        if not all(transaction.changes for transaction in batch):
            await self._confirm()  # a heartbeat or an empty commit: nothing to wait for

    def _count_backfill(self, transaction: Transaction) -> None:
        entity_type = _backfill_of(transaction)
        if entity_type is not None:
            self.metrics.backfill_rows.labels(entity_type).inc(len(transaction.changes))
            if isinstance(transaction.snapshot_mark, dict) and transaction.snapshot_mark.get("done"):
                self.metrics.backfills.labels(entity_type).inc()

    # -- consumer ---------------------------------------------------------------------------

    async def _consume(self, subscription: Subscription) -> None:
        while True:
            deliveries = await subscription.fetch(self.settings.batch_size, self.settings.fetch_timeout_s)
            if not deliveries:
                continue
            results = await self.cache.apply([d.change for d in deliveries])
            for sink in self.sinks:
                await sink.apply(results)
            await subscription.ack(deliveries)
            self._account(results)
            self.applied_changes += len(results)
            self.metrics.pending.set(self._tracker.pending_changes)
            async with self._room:
                self._room.notify_all()
            await self._confirm()

    def _account(self, results: Sequence[ApplyResult]) -> None:
        """Tell the filler and the tracker what was applied, and count it."""
        now = time.time()
        metrics = self.metrics
        counts: dict[tuple[str, str], int] = {}
        age: float | None = None
        for result in results:
            change = result.change
            self._filler.applied(change)
            streamed = self._tracker.applied(change)
            key = (change.entity_type, change.op.value)
            counts[key] = counts.get(key, 0) + 1
            if result.outcome is ApplyOutcome.STALE:
                metrics.stale_of(change.entity_type).inc()
            if streamed:
                age = max(0.0, now - change.commit_time.timestamp())
                metrics.commit_to_applied_of(change.entity_type).observe(age)
        for key, count in counts.items():
            metrics.events_of(*key).inc(count)
        if age is not None:
            metrics.lag_seconds.set(age)

    async def _confirm(self) -> None:
        confirmable = self._tracker.take_confirmable()
        for mark in confirmable.snapshot_marks:
            await self.source.confirm_snapshot(mark)
        if confirmable.position is not None:
            await self.source.confirm(confirmable.position)
            self.last_confirmed = confirmable.position
            self.metrics.confirmed_position.set(confirmable.position)
        if self._on_loaded is not None and self._streaming and self._tracker.pending_changes == 0:
            on_loaded, self._on_loaded = self._on_loaded, None
            on_loaded()
