"""memory:// — the bus inside this process, for the embedded mode and tests.

Nothing survives the process, and only code holding this bus object reaches it: the publisher
and every subscriber must share it. Changes are handed over as the same immutable `Change`
objects (never copied), so sinks must not modify the rows they receive.

Per entity type there is one stream of numbered changes; per (stream, group) the number of the
next change to deliver and the deliveries still pending. A pending delivery goes to another
consumer of the group as soon as its subscription closes without acking it, or once it has been
pending `reclaim_idle_s` (the consumer hung).

The cap (`max_len`, default 100,000 changes per entity type): once a group exists, a publisher
waits while a stream holds `max_len` changes some group still needs, so a slow group slows the
source down instead of losing changes. Before any group exists nobody is waiting for them: the
stream keeps the newest `max_len` for a group created later, and counts (and logs) the older ones
it lets go in `trimmed`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from tidegate.errors import BusUnavailable
from tidegate.sync.buses.base import BusBase, BusSettings, SubscriptionBase, log
from tidegate.sync.changes import Change
from tidegate.sync.contracts import Delivery

__all__ = ["DEFAULT_MAX_LEN", "MemoryBus", "MemorySubscription"]

DEFAULT_MAX_LEN = 100_000


@dataclass(slots=True)
class _Pending:
    change: Change
    owner: MemorySubscription | None  # None: its subscription closed, any consumer may take it
    since: float  # monotonic time of its latest delivery


@dataclass(slots=True)
class _Group:
    next_seq: int
    pending: dict[int, _Pending] = field(default_factory=dict)

    def low_water(self) -> int:
        """The oldest change this group still needs."""
        return min(self.pending) if self.pending else self.next_seq


@dataclass(slots=True)
class _Stream:
    # Numbered changes, numbers contiguous from first_seq: a dict gives O(1) reads by number.
    entries: dict[int, Change] = field(default_factory=dict)
    first_seq: int = 0
    next_seq: int = 0
    groups: dict[str, _Group] = field(default_factory=dict)

    def __len__(self) -> int:
        return self.next_seq - self.first_seq

    def trim(self) -> None:
        """Forget the changes every group has acked."""
        if not self.groups:
            return
        low = min(group.low_water() for group in self.groups.values())
        while self.first_seq < low:
            del self.entries[self.first_seq]
            self.first_seq += 1


class MemoryBus(BusBase):
    """`bus_for("memory://")`: an in-process bus; see the module doc for its cap and reclaim."""

    def __init__(self, settings: BusSettings | None = None) -> None:
        super().__init__("memory://", settings or BusSettings())
        self.max_len = self.settings.max_len or DEFAULT_MAX_LEN
        self.trimmed = 0  # changes dropped before any group existed to need them
        self._streams: dict[str, _Stream] = {}
        self._lock = asyncio.Lock()
        # Two conditions on one lock: consumers wait for changes, publishers for room.
        self._readable = asyncio.Condition(self._lock)
        self._writable = asyncio.Condition(self._lock)
        self._closed = False

    def subscribe(self, group: str, consumer: str, entity_types: Sequence[str]) -> MemorySubscription:
        """A consumer of `group`; enter it (`async with`) to join the group."""
        return MemorySubscription(self, group, consumer, entity_types)

    async def _open(self) -> None:
        pass

    async def _close(self) -> None:
        async with self._lock:
            self._closed = True
            # Wake everyone waiting so they see the bus closed instead of waiting forever.
            self._readable.notify_all()
            self._writable.notify_all()

    def stream(self, entity_type: str) -> _Stream:
        """The stream of one entity type (created empty on first use)."""
        stream = self._streams.get(entity_type)
        if stream is None:
            stream = self._streams[entity_type] = _Stream()
        return stream

    def check_alive(self) -> None:
        """Raise BusUnavailable once the bus closed (for callers that were waiting)."""
        if self._closed:
            raise BusUnavailable(f"{self!r} was closed")

    async def _publish(self, changes: Sequence[Change]) -> None:
        async with self._lock:
            for change in changes:
                stream = self.stream(change.entity_type)
                while stream.groups and len(stream) >= self.max_len:
                    # Consumers may be waiting for what was appended so far: wake them first.
                    self._readable.notify_all()
                    await self._writable.wait()
                    self.check_alive()
                if len(stream) >= self.max_len:
                    self._drop_oldest(stream, change.entity_type)
                stream.entries[stream.next_seq] = change
                stream.next_seq += 1
            self._readable.notify_all()

    def _drop_oldest(self, stream: _Stream, entity_type: str) -> None:
        if not self.trimmed:
            log.warning("%r: no consumer group reads %s yet; keeping its newest %d changes only",
                        self, entity_type, self.max_len)
        del stream.entries[stream.first_seq]
        stream.first_seq += 1
        self.trimmed += 1

    async def wait_readable(self, timeout_s: float) -> None:
        """Wait (lock held) until something is published or released, or `timeout_s` passes."""
        try:
            async with asyncio.timeout(timeout_s):
                await self._readable.wait()
        except TimeoutError:
            pass
        self.check_alive()

    def notify_readable(self) -> None:
        """Wake waiting consumers (lock held): deliveries were released."""
        self._readable.notify_all()

    def notify_writable(self) -> None:
        """Wake waiting publishers (lock held): acks made room."""
        self._writable.notify_all()


class MemorySubscription(SubscriptionBase):
    """One consumer of one group on a MemoryBus."""

    bus: MemoryBus

    def __init__(self, bus: MemoryBus, group: str, consumer: str, entity_types: Sequence[str]) -> None:
        super().__init__(bus, group, consumer, entity_types)
        self._turn = 0  # which entity type is served first, so none starves the others

    async def _open(self) -> None:
        async with self.bus._lock:
            for entity_type in self.entity_types:
                stream = self.bus.stream(entity_type)
                if self.group not in stream.groups:
                    # A new group starts at the oldest change the stream still holds.
                    stream.groups[self.group] = _Group(next_seq=stream.first_seq)

    async def _close(self) -> None:
        async with self.bus._lock:
            released = False
            for entity_type in self.entity_types:
                for pending in self.bus.stream(entity_type).groups[self.group].pending.values():
                    if pending.owner is self:
                        pending.owner = None
                        released = True
            if released:
                self.bus.notify_readable()

    async def _fetch(self, max_count: int, timeout_s: float) -> list[Delivery]:
        deadline = time.monotonic() + timeout_s
        async with self.bus._lock:
            while True:
                self.bus.check_alive()
                now = time.monotonic()
                out, next_reclaim = self._take(max_count, now)
                if out or now >= deadline:
                    return out
                # Wake for the first hung delivery becoming reclaimable, if that comes first.
                wake = deadline if next_reclaim is None else min(deadline, next_reclaim)
                await self.bus.wait_readable(max(0.0, wake - now))

    def _take(self, max_count: int, now: float) -> tuple[list[Delivery], float | None]:
        """Reclaimable deliveries first (oldest first), then new changes, per entity type in turn;
        also when the next pending delivery becomes reclaimable."""
        out: list[Delivery] = []
        next_reclaim: float | None = None
        idle_s = self.bus.settings.reclaim_idle_s
        types = self.entity_types[self._turn:] + self.entity_types[:self._turn]
        self._turn = (self._turn + 1) % len(self.entity_types)
        for entity_type in types:
            stream = self.bus.stream(entity_type)
            group = stream.groups[self.group]
            reclaimable: list[int] = []
            for seq, pending in group.pending.items():
                due = pending.since + idle_s
                if pending.owner is None or due <= now:
                    reclaimable.append(seq)
                elif next_reclaim is None or due < next_reclaim:
                    next_reclaim = due
            for seq in sorted(reclaimable)[:max_count - len(out)]:
                pending = group.pending[seq]
                pending.owner, pending.since = self, now
                out.append(Delivery(pending.change, (entity_type, seq)))
            while group.next_seq < stream.next_seq and len(out) < max_count:
                seq = group.next_seq
                change = stream.entries[seq]
                group.pending[seq] = _Pending(change, self, now)
                group.next_seq += 1
                out.append(Delivery(change, (entity_type, seq)))
            if len(out) >= max_count:
                break
        return out, next_reclaim

    async def _ack(self, deliveries: Sequence[Delivery]) -> None:
        async with self.bus._lock:
            touched: set[str] = set()
            for delivery in deliveries:
                entity_type, seq = delivery.handle
                stream = self.bus.stream(entity_type)
                group = stream.groups.get(self.group)
                # Whoever holds it now: the change was handled, as XACK treats it.
                if group is not None and group.pending.pop(seq, None) is not None:
                    touched.add(entity_type)
            for entity_type in touched:
                self.bus.stream(entity_type).trim()
            if touched:
                self.bus.notify_writable()
