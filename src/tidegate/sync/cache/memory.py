"""memory:// entity cache: plain dicts in this process (the embedded default).

Every operation runs without awaiting in between, so each one is atomic in the event loop. Rows
are kept as JSON bytes, so callers never share mutable rows with the cache and the memory cache
behaves like the Redis one (tuples read back as lists). TTLs are deadlines on a monotonic clock
(injectable for tests), checked on every read; expired entries are pruned when touched and, in
deadline order, at every write to their type, so tombstones of rows never touched again do not
pile up.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field

import orjson

from tidegate.sync.cache.base import (
    DEFAULT_TOMBSTONE_TTL_S,
    ZERO_VERSION,
    BaseEntityCache,
    Outcome,
    row_json,
)
from tidegate.sync.changes import Change, Op, Version
from tidegate.sync.contracts import ApplyOutcome, Entry
from tidegate.sync.values import Row

__all__ = ["MemoryEntityCache"]


@dataclass(slots=True)
class _Slot:
    version: Version
    revision: int
    checksum: str
    data: bytes | None  # None: a tombstone
    deadline: float | None  # clock reading at which it expires; None: never

    def row(self) -> Row | None:
        return None if self.data is None else orjson.loads(self.data)


@dataclass(slots=True)
class _Table:
    """The entries of one entity type."""

    slots: dict[str, _Slot] = field(default_factory=dict)
    floor: Version | None = None  # version of the newest truncate
    # Ids by deadline. One TTL per kind and a monotonic clock make insertion order deadline
    # order, as long as a rewritten id moves to the end (it is removed, then added again).
    live_deadlines: OrderedDict[str, float] = field(default_factory=OrderedDict)
    dead_deadlines: OrderedDict[str, float] = field(default_factory=OrderedDict)

    def held(self, entity_id: str, now: float) -> _Slot | None:
        slot = self.slots.get(entity_id)
        if slot is not None and slot.deadline is not None and slot.deadline <= now:
            self.remove(entity_id)
            return None
        return slot

    def put(self, entity_id: str, slot: _Slot) -> None:
        self.remove(entity_id)
        self.slots[entity_id] = slot
        if slot.deadline is not None:
            deadlines = self.dead_deadlines if slot.data is None else self.live_deadlines
            deadlines[entity_id] = slot.deadline

    def remove(self, entity_id: str) -> None:
        self.slots.pop(entity_id, None)
        self.live_deadlines.pop(entity_id, None)
        self.dead_deadlines.pop(entity_id, None)

    def prune(self, now: float) -> None:
        for deadlines in (self.live_deadlines, self.dead_deadlines):
            while deadlines:
                entity_id, deadline = next(iter(deadlines.items()))
                if deadline > now:
                    break
                self.remove(entity_id)


class MemoryEntityCache(BaseEntityCache):
    """`cache_for("memory://")`: a cache of its own in this process (each instance is separate).

    `clock` gives seconds on a monotonic scale; tests inject one to expire entries on demand."""

    def __init__(
        self,
        *,
        entry_ttl_s: float | None = None,
        tombstone_ttl_s: float | None = DEFAULT_TOMBSTONE_TTL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(entry_ttl_s=entry_ttl_s, tombstone_ttl_s=tombstone_ttl_s)
        self._clock = clock
        self._tables: dict[str, _Table] = {}
        self._checkpoints: dict[str, bytes] = {}

    async def _open(self) -> None:
        pass

    async def _close(self) -> None:
        pass

    def _table(self, entity_type: str) -> _Table:
        table = self._tables.get(entity_type)
        if table is None:
            table = self._tables[entity_type] = _Table()
        return table

    def _deadline(self, now: float, ttl_s: float | None) -> float | None:
        return None if ttl_s is None else now + ttl_s

    # ------------------------------------------------------------------ changes

    async def _apply(self, entity_type: str, changes: Sequence[Change]) -> list[Outcome]:
        table = self._table(entity_type)
        now = self._clock()
        table.prune(now)
        # Encoded before anything is written, so a row that cannot be stored fails the whole batch.
        rows = [row_json(change) for change in changes]
        return [self._apply_one(table, change, row, now) for change, row in zip(changes, rows, strict=True)]

    def _apply_one(self, table: _Table, change: Change, row: bytes | None, now: float) -> Outcome:
        above_floor = table.floor is None or change.version > table.floor
        if change.op is Op.TRUNCATE:
            if not above_floor:
                return ApplyOutcome.STALE, None
            table.floor = change.version
            for entity_id in [i for i, slot in table.slots.items() if slot.version < change.version]:
                table.remove(entity_id)
            return ApplyOutcome.APPLIED, None
        slot = table.held(change.entity_id, now)
        previous = None if slot is None else slot.row()
        if not above_floor or (slot is not None and change.version <= slot.version):
            return ApplyOutcome.STALE, previous
        revision = 1 if slot is None else slot.revision + 1
        if row is None:
            new = _Slot(change.version, revision, change.checksum, None,
                        self._deadline(now, self.tombstone_ttl_s))
        else:
            new = _Slot(change.version, revision, change.checksum, row,
                        self._deadline(now, self.entry_ttl_s))
        table.put(change.entity_id, new)
        return ApplyOutcome.APPLIED, previous

    # ------------------------------------------------------------------ reads and writes

    async def _read(self, entity_type: str, entity_id: str) -> tuple[Entry | None, Version | None]:
        table = self._tables.get(entity_type)
        if table is None:
            return None, None
        slot = table.held(entity_id, self._clock())
        return (None if slot is None else _entry(entity_type, entity_id, slot)), table.floor

    async def _put_loaded(
        self, entity_type: str, entity_id: str, row: Row, row_checksum: str, floor: Version | None
    ) -> Row | None:
        table = self._table(entity_type)
        if table.floor != floor:
            return row  # truncated while loading: the row may predate the truncate
        now = self._clock()
        table.prune(now)
        slot = table.held(entity_id, now)
        if slot is not None:
            return slot.row()
        table.put(entity_id, _Slot(ZERO_VERSION, 1, row_checksum, orjson.dumps(row),
                                   self._deadline(now, self.entry_ttl_s)))
        return row

    async def _write(
        self, entity_type: str, entity_id: str, row: Row, row_checksum: str, expected_revision: int
    ) -> tuple[bool, int]:
        table = self._table(entity_type)
        now = self._clock()
        table.prune(now)
        slot = table.held(entity_id, now)
        revision = 0 if slot is None else slot.revision
        if revision != expected_revision:
            return False, revision
        version = ZERO_VERSION if slot is None else slot.version
        table.put(entity_id, _Slot(version, revision + 1, row_checksum, orjson.dumps(row),
                                   self._deadline(now, self.entry_ttl_s)))
        return True, revision + 1

    async def _read_many(self, entity_type: str, entity_ids: Sequence[str]) -> list[Entry | None]:
        table = self._tables.get(entity_type)
        if table is None:
            return [None] * len(entity_ids)
        now = self._clock()
        slots = [table.held(entity_id, now) for entity_id in entity_ids]
        return [None if slot is None else _entry(entity_type, entity_id, slot)
                for entity_id, slot in zip(entity_ids, slots, strict=True)]

    async def _repair(self, entity_type: str, entity_id: str, row: bytes, row_checksum: str,
                      expected: Entry | None) -> bool:
        table = self._table(entity_type)
        now = self._clock()
        table.prune(now)
        slot = table.held(entity_id, now)
        if slot is None:
            if expected is not None:
                return False
            revision, version = 0, ZERO_VERSION
        else:
            if expected is None or (slot.revision, slot.version) != (expected.revision, expected.version):
                return False
            revision, version = slot.revision, slot.version
        ttl_s = self.entry_ttl_s if row else self.tombstone_ttl_s
        table.put(entity_id, _Slot(version, revision + 1, row_checksum, row or None,
                                   self._deadline(now, ttl_s)))
        return True

    async def _scan(self, entity_type: str) -> AsyncIterator[Entry]:
        table = self._tables.get(entity_type)
        if table is None:
            return
        now = self._clock()
        # A snapshot: the caller may write to the cache between the entries it is handed.
        live = [
            _entry(entity_type, entity_id, slot)
            for entity_id, slot in table.slots.items()
            if slot.data is not None and (slot.deadline is None or slot.deadline > now)
        ]
        for entry in live:
            yield entry

    async def _scan_ids(self, entity_type: str) -> AsyncIterator[str]:
        table = self._tables.get(entity_type)
        if table is None:
            return
        now = self._clock()
        live = [entity_id for entity_id, slot in table.slots.items()
                if slot.data is not None and (slot.deadline is None or slot.deadline > now)]
        for entity_id in live:
            yield entity_id

    async def _count(self, entity_type: str) -> int:
        table = self._tables.get(entity_type)
        if table is None:
            return 0
        now = self._clock()
        return sum(
            1 for slot in table.slots.values()
            if slot.data is not None and (slot.deadline is None or slot.deadline > now)
        )

    # ------------------------------------------------------------------ checkpoints

    async def _get_checkpoint(self, name: str) -> bytes | None:
        return self._checkpoints.get(name)

    async def _put_checkpoint(self, name: str, value: bytes) -> None:
        self._checkpoints[name] = value


def _entry(entity_type: str, entity_id: str, slot: _Slot) -> Entry:
    return Entry(entity_type, entity_id, slot.row(), slot.version, slot.revision, slot.checksum)
