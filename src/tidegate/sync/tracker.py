"""Which source position the pipeline may confirm.

Changes go out on the bus in commit order but come back applied in whatever order the bus
delivers them (partitions, reclaims). A position may be confirmed to the source only when its
transaction and every transaction before it are fully applied by every sink — otherwise a crash
would skip the unapplied ones for good. The tracker keeps the open transactions in order and
counts down each one's changes as they are applied.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from tidegate.sync.changes import Change
from tidegate.sync.contracts import Transaction
from tidegate.sync.values import JsonValue

__all__ = ["Confirmable", "PositionTracker"]

ChangeKey = tuple[str, str, int, int]


def _key(change: Change) -> ChangeKey:
    return (change.entity_type, change.entity_id, change.version.lsn, change.version.ordinal)


@dataclass(slots=True)
class _Open:
    position: int | None
    snapshot_mark: JsonValue
    remaining: int


@dataclass(frozen=True, slots=True)
class Confirmable:
    """What became confirmable: snapshot marks in order, then the highest position (if any)."""

    snapshot_marks: list[JsonValue] = field(default_factory=list)
    position: int | None = None


class PositionTracker:
    """Open transactions in source order and the changes each still waits for."""

    def __init__(self) -> None:
        self._open: deque[_Open] = deque()
        self._waiting: dict[ChangeKey, list[_Open]] = {}
        self._pending_changes = 0

    @property
    def pending_changes(self) -> int:
        """Changes handed out and not yet applied."""
        return self._pending_changes

    def add(self, transaction: Transaction) -> None:
        """A transaction is about to be published."""
        entry = _Open(transaction.position, transaction.snapshot_mark, len(transaction.changes))
        self._open.append(entry)
        for change in transaction.changes:
            self._waiting.setdefault(_key(change), []).append(entry)
        self._pending_changes += len(transaction.changes)

    def applied(self, change: Change) -> bool:
        """Every sink has applied this change. Changes the tracker does not know (left on the
        bus by an earlier run, or delivered twice) are ignored. True when the change was a known
        streamed one — the ones whose freshness means something (a snapshot row's does not)."""
        entries = self._waiting.get(_key(change))
        if not entries:
            return False
        entry = entries.pop(0)
        if not entries:
            del self._waiting[_key(change)]
        entry.remaining -= 1
        self._pending_changes -= 1
        return entry.snapshot_mark is None

    def take_confirmable(self) -> Confirmable:
        """Remove the fully applied prefix of open transactions and say what it confirms."""
        marks: list[JsonValue] = []
        position: int | None = None
        while self._open and self._open[0].remaining == 0:
            done = self._open.popleft()
            if done.snapshot_mark is not None:
                marks.append(done.snapshot_mark)
            if done.position is not None:
                position = done.position if position is None else max(position, done.position)
        return Confirmable(marks, position)
