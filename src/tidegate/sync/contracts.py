"""The pluggable parts of the change flow and what each promises.

    source ──transactions──► pipeline ──publish──► bus ──fetch/ack──► pipeline ──apply──► sinks
       ▲                                                                   │
       └────────────── confirm(position) once every sink has applied ──────┘

- A `ChangeSource` yields committed transactions in commit order. A position it is told to
  `confirm` is never replayed after a restart; everything after it may be (replays are harmless:
  the cache ignores versions it already has).
- A `Bus` carries changes durably: once `publish` returns, the changes survive a crash of the
  publisher, and a change stays pending for its consumer group until it is acked.
- The `EntityCache` applies each change first (compare-and-set on the version); `Sink`s follow
  with its results. Both apply durably: once `apply` returns, the changes survive a crash of the
  process. They see an entity's changes in version order but must accept duplicates and older
  versions (a replay after a crash, a redelivery after a reclaim) without regressing.
"""

from __future__ import annotations

import enum
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol, Self, runtime_checkable

from tidegate.sync.changes import Change, Version
from tidegate.sync.values import JsonValue, Row

__all__ = [
    "ApplyOutcome",
    "ApplyResult",
    "Bus",
    "ChangeSource",
    "CheckpointStore",
    "Delivery",
    "EntityCache",
    "Entry",
    "Loader",
    "Sink",
    "Subscription",
    "Transaction",
]


@dataclass(frozen=True, slots=True)
class Transaction:
    """The changes of one committed source transaction (or one snapshot batch), in order.

    `position` is what to confirm to the source once every change here (and before) is applied:
    PostgreSQL's end-of-commit LSN, the outbox's last sequence number. Snapshot batches carry
    None: the slot's position is only confirmed after the snapshot and the stream behind it.
    """

    changes: tuple[Change, ...]
    position: int | None
    commit_time: datetime | None = None
    # Snapshot batches: the source's own progress marker (e.g. table and last key copied), handed
    # back through `confirm_snapshot` once the batch is applied, so a crash resumes after it.
    snapshot_mark: JsonValue = None


@runtime_checkable
class ChangeSource(Protocol):
    """Where changes come from. An async context manager; `transactions()` may be iterated once."""

    async def __aenter__(self) -> Self: ...

    async def __aexit__(self, *exc_info: object) -> None: ...

    def transactions(self) -> AsyncIterator[Transaction]:
        """Committed transactions in commit order: the snapshot first when one is due, then the
        stream. Runs until the source is closed."""
        ...

    async def confirm(self, position: int) -> None:
        """Every change up to `position` is durably applied: the source may forget it."""
        ...

    async def confirm_snapshot(self, mark: JsonValue) -> None:
        """Every snapshot batch up to the one carrying `mark` is durably applied."""
        ...


@dataclass(frozen=True, slots=True)
class Delivery:
    """A change as a bus delivered it; `handle` is the bus's own id for acking it."""

    change: Change
    handle: Any = field(compare=False)


class Subscription(Protocol):
    """One consumer of one consumer group. An async context manager."""

    async def __aenter__(self) -> Self: ...

    async def __aexit__(self, *exc_info: object) -> None: ...

    async def fetch(self, max_count: int, timeout_s: float) -> list[Delivery]:
        """Up to `max_count` deliveries, waiting at most `timeout_s` for the first (without
        polling). Deliveries another consumer of the group left unacked for too long (it died)
        are reclaimed and delivered here too."""
        ...

    async def ack(self, deliveries: Sequence[Delivery]) -> None:
        """These deliveries are done: the group never gets them again."""
        ...


class Bus(Protocol):
    """The event bus between the source and the sinks. An async context manager."""

    async def __aenter__(self) -> Self: ...

    async def __aexit__(self, *exc_info: object) -> None: ...

    async def publish(self, changes: Sequence[Change]) -> None:
        """Publish durably, keeping each entity's changes in order (same key → same partition)."""
        ...

    def subscribe(self, group: str, consumer: str, entity_types: Sequence[str]) -> Subscription:
        """A consumer `consumer` of group `group` for the changes of `entity_types`. Each group
        gets every change; consumers of one group share them."""
        ...


class Sink(Protocol):
    """What follows the entity cache (AI refresh rules, the recommender): it gets each batch with
    what the cache did, so it sees the previous row even without a before-image, and can skip
    changes the cache found stale."""

    name: str

    async def apply(self, results: Sequence[ApplyResult]) -> None:
        """Apply in order, durably; duplicates and older versions must not regress state."""
        ...


class ApplyOutcome(enum.StrEnum):
    """What the cache did with one change."""

    APPLIED = "applied"
    STALE = "stale"  # the cache holds this version or a newer one (a duplicate or a late change)


@dataclass(frozen=True, slots=True)
class ApplyResult:
    """One change's outcome; `previous` is the row the cache held before (None if none/deleted),
    which lets later sinks see what changed even without a before-image."""

    change: Change
    outcome: ApplyOutcome
    previous: Row | None = None


@dataclass(frozen=True, slots=True)
class Entry:
    """A cached entity. `data` is None for a tombstone (a deleted row, kept with its version so a
    late update cannot bring it back). `revision` counts writes to the entry (changes from the
    source and application updates alike): it is the version optimistic updates compare."""

    entity_type: str
    entity_id: str
    data: Row | None
    version: Version
    revision: int
    checksum: str

    @property
    def deleted(self) -> bool:
        """True for a tombstone."""
        return self.data is None


Loader = Callable[[], Awaitable[Row | None]]
"""Loads one entity from the source of truth on a cache miss (None: it does not exist)."""


class CheckpointStore(Protocol):
    """Small durable values the change flow keeps next to the cache (snapshot progress, applied
    positions), so a restart resumes where the cache really is."""

    async def get_checkpoint(self, name: str) -> JsonValue: ...

    async def put_checkpoint(self, name: str, value: JsonValue) -> None: ...


class EntityCache(CheckpointStore, Protocol):
    """Versioned entity cache: memory:// or redis://. An async context manager."""

    async def __aenter__(self) -> Self: ...

    async def __aexit__(self, *exc_info: object) -> None: ...

    async def apply(self, changes: Sequence[Change]) -> list[ApplyResult]:
        """Compare-and-set each change on its version, atomically per change: only a newer
        version is written; a delete leaves a versioned tombstone (with the tombstone TTL); a
        truncate removes every entry of the type and makes older changes of it stale."""
        ...

    async def get(self, entity_type: str, entity_id: str) -> Entry | None:
        """The entry, tombstones included (None: nothing cached)."""
        ...

    async def get_entity(self, entity_type: str, entity_id: str, load: Loader | None = None) -> Row | None:
        """The entity's row. On a miss, `load` runs once however many callers miss together
        (single flight) and its row is cached below any real version, so the next change from
        the source replaces it. A tombstone answers None without loading."""
        ...

    async def update(self, entity_type: str, entity_id: str, changes: Row, expected_revision: int) -> int:
        """Merge `changes` into the cached row if its revision is still `expected_revision`;
        returns the new revision, or raises VersionConflict (nothing written)."""
        ...

    async def force_update(self, entity_type: str, entity_id: str, changes: Row) -> int:
        """Merge `changes` into the cached row whatever its revision; returns the new revision."""
        ...

    def scan(self, entity_type: str) -> AsyncIterator[Entry]:
        """Every live entry of the type (tombstones left out), in no particular order."""
        ...

    def scan_ids(self, entity_type: str) -> AsyncIterator[str]:
        """The ids of every live entry of the type, in no particular order."""
        ...

    async def get_many(self, entity_type: str, entity_ids: Sequence[str]) -> list[Entry | None]:
        """The entries of `entity_ids` (tombstones included; None: nothing cached), in order."""
        ...

    async def repair(self, entity_type: str, entity_id: str, row: Row | None, row_checksum: str,
                     expected: Entry | None) -> bool:
        """Write the source's `row` (None: a tombstone) only over the entry `expected` (None:
        nothing held), keeping its version; False when the entry changed since it was read."""
        ...

    async def count(self, entity_type: str) -> int:
        """How many live entries of the type are cached."""
        ...
