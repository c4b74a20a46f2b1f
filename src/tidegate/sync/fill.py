"""Filling the columns a change could not carry: PostgreSQL's unchanged TOAST values.

With REPLICA IDENTITY DEFAULT or USING INDEX, an UPDATE that leaves an out-of-line value alone
does not send it (pgoutput marks it 'u'). The value must come from a source known to hold *this
row* as of *the change before it in commit order*, never from a guess. The `Filler` runs on the
producer, which sees every change in commit order, and uses two sources:

1. **The latest image of each key**, left by the changes it has passed on and the cache has not
   applied yet (an entry is dropped once the cache applied its change: memory follows what is in
   flight, with no "last N rows" cliff). A key change (the old key's removal, then the row under
   its new key) carries the image from the old key to the new one; a delete leaves a tombstone,
   so a later row on that key never inherits the removed one's values. PostgreSQL checks a
   non-deferrable unique key row by row, so two live rows never share a key at any point of the
   stream, and the image under a key is that of the one row holding it.
2. **PostgreSQL itself**, for anything else: a keyed SELECT of only the missing columns, on a
   plain connection, at a snapshot that shows the change's transaction (the source reads again
   until it does: a commit can reach the slot before it is visible). That value is never
   older than the change; it may be *newer* (later commits are visible), which is safe because
   every later change of the row follows in the stream with its own, higher version and
   overwrites what it sent, and the cache's compare-and-set keeps the newest version. A read
   records the WAL insert position at its snapshot (`position`): no commit at or after it is
   visible to the read, so from that position on the image is exact, and before it the image is
   "ahead" of the stream. An image that is ahead is used for later changes of the same key (they
   converge to the value read, which is the value after them when nothing changes the column in
   between) but never carried across a key change: the key may have held another row at the
   read's time, so the row's new key is read again instead. The last change of a key therefore
   always ends with the value PostgreSQL holds.

A row the read does not find any more (deleted or moved since) leaves the columns missing from
that change: its removal follows in the stream (transient, never a wrong value). Tables whose
unique keys are DEFERRABLE may hold two rows on one key inside a transaction (a swap in one
statement), so their fills always read PostgreSQL.

REPLICA IDENTITY FULL sends whole old rows: the source fills from them and nothing reaches here.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from tidegate.sync.changes import Change, Op, Version
from tidegate.sync.contracts import Transaction
from tidegate.sync.metrics import SyncMetrics
from tidegate.sync.values import Row

__all__ = ["Filler", "RowReader", "RowsRead"]

log = logging.getLogger("tidegate.sync")

Ident = tuple[str, str]  # (entity type, entity id)


@dataclass(frozen=True, slots=True)
class RowsRead:
    """Rows read back from the source by key: entity id → the columns read (keys included), and
    a position no commit visible to the read is at or after."""

    rows: dict[str, Row]
    position: int


@runtime_checkable
class RowReader(Protocol):
    """A source that can read current rows back by key (PostgreSQL)."""

    async def read_rows(self, entity_type: str, keys: Sequence[Sequence[str]],
                        columns: Sequence[str], *, xid: int | None = None) -> RowsRead:
        """The current committed values of `columns` of the rows with these keys (each the key
        columns' values as the source's text, `Change.source_key`); missing rows are absent.
        With `xid`, the read must see that transaction and every one committed before it."""
        ...

    def keys_may_repeat(self, entity_type: str) -> bool:
        """True when two rows may share a key inside a transaction (a deferrable unique key)."""
        ...


@dataclass(slots=True)
class _Image:
    row: Row | None  # None: deleted
    version: Version  # of the change that left it
    exact_from: int = 0  # exact for changes at or after this position; before it, ahead of them
    removed: _Image | None = field(default=None, repr=False)  # a tombstone: the row it removed


class Filler:
    """Fills `unchanged` columns of changes in commit order; see the module docstring."""

    def __init__(self, reader: RowReader | None, metrics: SyncMetrics) -> None:
        self._reader = reader
        self._metrics = metrics
        self._images: dict[Ident, _Image] = {}

    @property
    def tracked(self) -> int:
        """Keys whose latest image is held (changes passed on, not yet applied)."""
        return len(self._images)

    def applied(self, change: Change) -> None:
        """The cache applied `change`: its image is no longer needed unless a newer one replaced
        it (a replayed or redelivered change of an earlier run matches nothing)."""
        ident = (change.entity_type, change.entity_id)
        image = self._images.get(ident)
        if image is not None and image.version == change.version:
            del self._images[ident]

    async def fill(self, transaction: Transaction) -> Transaction:
        """The transaction with every unchanged column filled that can be; images tracked."""
        repeatable = {t for t in {c.entity_type for c in transaction.changes} if self._repeatable(t)}
        fetched = await self._prefetch(transaction.changes)
        filled: list[Change] = []
        previous_change: Change | None = None
        for change in transaction.changes:
            if change.op is Op.TRUNCATE:
                self._truncate(change.entity_type)
                filled.append(change)
                previous_change = change
                continue
            ident = (change.entity_type, change.entity_id)
            exact_from = 0
            if change.unchanged and change.after is not None:
                moved_from = _moved_from(change, previous_change)
                previous_change = change
                change, exact_from = await self._filled(change, ident, moved_from, fetched)
            else:
                previous_change = change
            previous = self._images.get(ident) if change.after is None else None
            self._images[ident] = _Image(change.after, change.version, exact_from, previous)
            filled.append(change)
        if repeatable:
            await self._settle_repeated_keys(filled)
        if all(a is b for a, b in zip(filled, transaction.changes, strict=True)):
            return transaction
        return dataclasses.replace(transaction, changes=tuple(filled))

    # ------------------------------------------------------------------ one change

    async def _filled(self, change: Change, ident: Ident, moved_from: Ident | None,
                      fetched: dict[Ident, tuple[Row | None, int]]) -> tuple[Change, int]:
        lsn = change.version.lsn
        if not self._repeatable(change.entity_type):
            image = self._source_image(change, moved_from)
            if image is not None and image.row is not None and _has(image.row, change.unchanged) \
                    and (moved_from is None or image.exact_from <= lsn):
                return change.with_columns(image.row), _ahead(image.exact_from, lsn)
        # Not known in commit order: read the row where it is now, under this change's key (for
        # a key change, the new key: the old one may hold another row by now).
        if ident not in fetched:
            fetched.update(await self._read(change.entity_type, [change]))
        if ident not in fetched:
            self._unresolved(change, "the source cannot read rows back")
            return change, 0
        row, position = fetched[ident]
        if row is None:
            log.debug("%s %s: row gone since the change; its removal follows in the stream",
                      change.entity_type, change.entity_id)
            return change, _ahead(position, lsn)
        filled = change.with_columns(row)
        if filled.unchanged:
            self._unresolved(filled, "the source's row lacks them")
        return filled, _ahead(position, lsn)

    async def _settle_repeated_keys(self, changes: list[Change]) -> None:
        """Under a deferrable key, a removal of a key that a row of this transaction moved onto
        may be another row's departure (both held the key mid-transaction: a swap by one
        statement); the stream cannot say which. Such a key's final removal is checked against
        PostgreSQL and becomes the row it holds, when it holds one."""
        last: dict[Ident, int] = {}
        written: dict[Ident, Change] = {}
        suspect: list[int] = []
        for index, change in enumerate(changes):
            ident = (change.entity_type, change.entity_id)
            if change.op is Op.TRUNCATE:
                written = {i: c for i, c in written.items() if i[0] != change.entity_type}
                continue
            last[ident] = index
            if change.after is not None:
                written[ident] = change
        for ident, index in last.items():
            change = changes[index]
            if change.op is Op.DELETE and ident in written and self._repeatable(ident[0]):
                suspect.append(index)
        for index in suspect:
            change = changes[index]
            model = written[(change.entity_type, change.entity_id)]
            if model.source_key is None or model.after is None:
                continue
            columns = [*model.after, *model.unchanged]
            wanted = dataclasses.replace(model, unchanged=tuple(columns))
            read = await self._read(change.entity_type, [wanted])
            row, position = read.get((change.entity_type, change.entity_id), (None, 0))
            if row is None:
                continue
            changes[index] = dataclasses.replace(change, op=Op.UPDATE, after=row, before=None,
                                                 unchanged=(), checksum="")
            self._images[(change.entity_type, change.entity_id)] = _Image(
                row, change.version, _ahead(position, change.version.lsn))

    def _source_image(self, change: Change, moved_from: Ident | None) -> _Image | None:
        """The image this change continues: its own key's, or for a key change the row the old
        key's removal (the change just before it) took away."""
        if moved_from is None:
            return self._images.get((change.entity_type, change.entity_id))
        tombstone = self._images.get(moved_from)
        if tombstone is None or tombstone.row is not None:
            return None
        if tombstone.version != Version(change.version.lsn, change.version.ordinal - 1):
            return None
        return tombstone.removed

    def _repeatable(self, entity_type: str) -> bool:
        return self._reader is not None and self._reader.keys_may_repeat(entity_type)

    def forget(self, entity_type: str) -> None:
        """Drop every image of the type: the table's shape changed (a column's type, name or
        presence), so an image of an earlier change may hold a value in the old form; the next
        fills read PostgreSQL instead (tidegate.sync.backfill)."""
        self._truncate(entity_type)

    def _truncate(self, entity_type: str) -> None:
        for ident in [i for i in self._images if i[0] == entity_type]:
            del self._images[ident]

    def _unresolved(self, change: Change, why: str) -> None:
        self._metrics.unresolved_unchanged.labels(change.entity_type).inc(len(change.unchanged))
        log.warning("%s %s: unchanged column(s) %s not filled (%s); the row is cached without "
                    "them until they change", change.entity_type, change.entity_id,
                    ", ".join(change.unchanged), why)

    # ------------------------------------------------------------------ reads

    async def _read(self, entity_type: str,
                    changes: Iterable[Change]) -> dict[Ident, tuple[Row | None, int]]:
        """One read of these changes' rows (by their own keys) and their unchanged columns."""
        if self._reader is None:
            return {}
        wanted = {c.entity_id: c for c in changes if c.source_key is not None}
        if not wanted:
            return {}
        columns = list(dict.fromkeys(col for c in wanted.values() for col in c.unchanged))
        keys = [c.source_key for c in wanted.values() if c.source_key is not None]
        xid = next((c.xid for c in wanted.values() if c.xid is not None), None)
        read = await self._reader.read_rows(entity_type, keys, columns, xid=xid)
        return {(entity_type, entity_id): (read.rows.get(entity_id), read.position)
                for entity_id in wanted}

    async def _prefetch(self, changes: Sequence[Change]) -> dict[Ident, tuple[Row | None, int]]:
        """Read, in one query per table, the rows this transaction will need from the source.
        A plan only: `_filled` decides, and reads on its own whatever the plan missed."""
        if self._reader is None or not any(c.unchanged for c in changes):
            return {}
        needed: dict[str, list[Change]] = {}
        live: set[Ident] = set()  # keys a change of this transaction left a row on
        removed: dict[Ident, bool] = {}  # key → its removal took a known row
        previous: Change | None = None
        for change in changes:
            ident = (change.entity_type, change.entity_id)
            moved_from, previous = _moved_from(change, previous), change
            if change.op is Op.TRUNCATE:
                live = {i for i in live if i[0] != change.entity_type}
            elif change.op is Op.DELETE:
                removed[ident] = ident in live or self._usable(ident, change.version.lsn)
                live.discard(ident)
            elif change.unchanged and not self._planned_known(change, moved_from, live, removed):
                needed.setdefault(change.entity_type, []).append(change)
                live.add(ident)
            else:
                live.add(ident)
        fetched: dict[Ident, tuple[Row | None, int]] = {}
        for entity_type, wanted in needed.items():
            fetched.update(await self._read(entity_type, wanted))
        return fetched

    def _planned_known(self, change: Change, moved_from: Ident | None, live: set[Ident],
                       removed: dict[Ident, bool]) -> bool:
        if self._repeatable(change.entity_type):
            return False
        if moved_from is not None:
            return removed.get(moved_from, False)
        ident = (change.entity_type, change.entity_id)
        return ident in live or self._usable(ident, None)

    def _usable(self, ident: Ident, exact_at: int | None) -> bool:
        image = self._images.get(ident)
        if image is None or image.row is None:
            return False
        return exact_at is None or image.exact_from <= exact_at


def _moved_from(change: Change, previous: Change | None) -> Ident | None:
    """The old key's ident when this change moved its row to a new key: the source emits the
    old key's removal right before the row under its new key (same commit, previous ordinal)."""
    if change.op is not Op.UPDATE or change.before is None or previous is None:
        return None
    if any(change.before.get(column) != value for column, value in change.key.items()) \
            and previous.op is Op.DELETE and previous.entity_type == change.entity_type \
            and previous.version == Version(change.version.lsn, change.version.ordinal - 1):
        return (previous.entity_type, previous.entity_id)
    return None


def _has(row: Row, columns: Sequence[str]) -> bool:
    return all(column in row for column in columns)


def _ahead(exact_from: int, lsn: int) -> int:
    """Where an image filled from one exact from `exact_from` becomes exact (0: already)."""
    return exact_from if exact_from > lsn else 0
