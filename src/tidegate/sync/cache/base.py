"""What every entity cache backend shares: lifecycle, validation, batching per entity type,
single-flight loads and optimistic application writes. Backends implement the `_hooks`.

Semantics (the same for memory:// and redis://):

- `apply` writes a change only when its version is newer than the entry held (live or tombstone)
  and newer than the type's truncate floor; anything else is STALE and changes nothing. Each
  result's `previous` is the row held when the change was considered (for a STALE change, the
  row that stays; None for none, a tombstone or a truncate).
- A delete leaves a tombstone with the tombstone TTL. Once a tombstone has expired, a change
  older than the delete applies again: the tombstone TTL bounds how late a change may arrive (a
  replay after a crash, a redelivery) and still be recognised as older than the delete.
- A TRUNCATE sets the type's floor to its version and removes every entry older than it (all of
  them when changes arrive in order; an entry a newer change already wrote stays).
- Rows loaded on a miss and rows created by an application write carry `ZERO_VERSION`, below
  every real version, so the next change from the source replaces them.
- `revision` counts writes to an entry and survives deletes (a tombstone keeps counting); an
  entry that expired or was truncated starts again at 1.
- Application writes (`update`, `force_update`) read the entry, merge the partial row and write it
  back only if the entry's revision is unchanged (compare-and-set), keeping the entry's source
  version and storing the checksum of the merged row. With nothing held (a miss, an expired
  entry) the revision is 0, and a tombstone is at its own revision: `update(..., expected_revision
  = that revision)` creates the row from `changes` alone; any other expected revision raises
  VersionConflict. `force_update` always writes.
- A batch spanning several entity types is applied type by type; if the store fails half-way the
  whole batch may be applied again: the types already done answer STALE.
- `repair` (what `tidegate sync verify --repair` writes) replaces an entry with the database's row
  or a tombstone only if the entry is still exactly the one the caller read (revision and
  version), and keeps that entry's source version (ZERO_VERSION when nothing was held): it never
  overwrites a change that landed meanwhile, and every later change from the source still wins.
"""

from __future__ import annotations

import abc
from collections.abc import AsyncIterator, Mapping, Sequence

import orjson

from tidegate._lifecycle import Lifecycle
from tidegate.errors import CacheUnavailable, ConfigError, InvalidChange, VersionConflict
from tidegate.sync.cache.singleflight import SingleFlight
from tidegate.sync.changes import MAX_ORDINAL, Change, Op, Version
from tidegate.sync.contracts import ApplyOutcome, ApplyResult, Entry, Loader
from tidegate.sync.values import JsonValue, Row, canonical, checksum

__all__ = ["DEFAULT_TOMBSTONE_TTL_S", "READ_PAGE", "ZERO_VERSION", "BaseEntityCache", "Outcome", "row_json"]

DEFAULT_TOMBSTONE_TTL_S = 24 * 3600.0
"""How long a delete is remembered by default: a change arriving later than this after the delete
that superseded it could resurrect the row."""

ZERO_VERSION = Version(0, 0)
"""The version of rows the source did not write (loaded on a miss, created by an application
write): every change from the source is newer."""

READ_PAGE = 1000
"""Entries `get_many` reads per round trip (a Lua script's arguments stay well below its limits)."""

# Version.key is fixed-width only within these bounds; stores compare the keys as strings.
_MAX_LSN = 2**64 - 1

Outcome = tuple[ApplyOutcome, Row | None]
"""What a backend did with one change, and the row it held before (None: none or a tombstone)."""


class BaseEntityCache(Lifecycle):
    """The `EntityCache` contract written once; see the module docstring for its semantics.

    Use it as an async context manager (or call `open()` and `close()`); a closed cache cannot
    reopen."""

    unavailable_error = CacheUnavailable
    what = "the entity cache"

    def __init__(self, *, entry_ttl_s: float | None, tombstone_ttl_s: float | None) -> None:
        self.entry_ttl_s = _ttl("entry_ttl_s", entry_ttl_s)
        self.tombstone_ttl_s = _ttl("tombstone_ttl_s", tombstone_ttl_s)
        super().__init__()
        self._flights: SingleFlight[tuple[str, str], bytes | None] = SingleFlight()

    # ------------------------------------------------------------------ changes from the source

    async def apply(self, changes: Sequence[Change]) -> list[ApplyResult]:
        """Compare-and-set each change on its version (see the module docstring); one result per
        change, in the order given."""
        self._check_open()
        by_type: dict[str, list[int]] = {}
        for index, change in enumerate(changes):
            _check_change(change)
            by_type.setdefault(change.entity_type, []).append(index)
        if len(by_type) == 1:  # the common batch, of one table: no regrouping to do
            (entity_type,) = by_type
            outcomes = await self._apply(entity_type, list(changes))
            return [ApplyResult(change, outcome, previous)
                    for change, (outcome, previous) in zip(changes, outcomes, strict=True)]
        results: dict[int, ApplyResult] = {}
        for entity_type, indexes in by_type.items():
            batch = [changes[index] for index in indexes]
            outcomes = await self._apply(entity_type, batch)
            for index, change, (outcome, previous) in zip(indexes, batch, outcomes, strict=True):
                results[index] = ApplyResult(change, outcome, previous)
        return [results[index] for index in range(len(changes))]

    # ------------------------------------------------------------------ reads

    async def get(self, entity_type: str, entity_id: str) -> Entry | None:
        """The entry, tombstones included (None: nothing cached, or it expired)."""
        self._check_open()
        _check_key(entity_type, entity_id)
        entry, _ = await self._read(entity_type, entity_id)
        return entry

    async def get_entity(self, entity_type: str, entity_id: str, load: Loader | None = None) -> Row | None:
        """The entity's row (None: deleted, or not cached and `load` is None or finds nothing).

        On a miss `load` runs once for all callers missing together in this process; its row is
        cached at ZERO_VERSION unless something was written meanwhile (then the cache's entry is
        the answer). A loader's exception reaches every waiting caller and nothing is cached. A
        loader answering None caches nothing either: the next miss loads again."""
        self._check_open()
        _check_key(entity_type, entity_id)
        entry, _ = await self._read(entity_type, entity_id)
        if entry is not None:
            return entry.data
        if load is None:
            return None
        # Each caller decodes its own copy, so one caller mutating its row cannot affect another.
        raw = await self._flights.run(
            (entity_type, entity_id), lambda: self._load(entity_type, entity_id, load)
        )
        return None if raw is None else _row(orjson.loads(raw))

    async def _load(self, entity_type: str, entity_id: str, load: Loader) -> bytes | None:
        # Read again inside the flight: a flight that ended between our miss and now has filled it.
        entry, floor = await self._read(entity_type, entity_id)
        if entry is not None:
            return None if entry.data is None else orjson.dumps(entry.data)
        loaded = await load()
        if loaded is None:
            return None
        if not isinstance(loaded, Mapping):
            raise InvalidChange(
                f"the loader of {entity_type} {entity_id!r} returned a {type(loaded).__name__}, not a row"
            )
        row = _row(canonical(loaded))
        answer = await self._put_loaded(entity_type, entity_id, row, checksum(row), floor)
        return None if answer is None else orjson.dumps(answer)

    async def get_many(self, entity_type: str, entity_ids: Sequence[str]) -> list[Entry | None]:
        """The entries of `entity_ids` (tombstones included; None: nothing cached), in the
        order given, read in pages of `READ_PAGE` per round trip."""
        self._check_open()
        for entity_id in entity_ids:
            _check_key(entity_type, entity_id)
        entries: list[Entry | None] = []
        for start in range(0, len(entity_ids), READ_PAGE):
            entries += await self._read_many(entity_type, entity_ids[start:start + READ_PAGE])
        return entries

    def scan(self, entity_type: str) -> AsyncIterator[Entry]:
        """Every live entry of the type (tombstones and expired entries left out), in no
        particular order. Entries written while the scan runs may or may not be seen."""
        self._check_open()
        _check_key(entity_type, "*")
        return self._scan(entity_type)

    def scan_ids(self, entity_type: str) -> AsyncIterator[str]:
        """The ids of every live entry of the type, like `scan` without reading the rows."""
        self._check_open()
        _check_key(entity_type, "*")
        return self._scan_ids(entity_type)

    async def count(self, entity_type: str) -> int:
        """How many live entries of the type are cached."""
        self._check_open()
        _check_key(entity_type, "*")
        return await self._count(entity_type)

    # ------------------------------------------------------------------ application writes

    async def update(self, entity_type: str, entity_id: str, changes: Row, expected_revision: int) -> int:
        """Merge `changes` (a partial row) into the cached row if its revision is still
        `expected_revision`; returns the new revision, or raises VersionConflict with the current
        revision and writes nothing. Expected revision 0 creates a row that is not cached."""
        self._check_open()
        _check_key(entity_type, entity_id)
        patch = _patch(changes)
        if isinstance(expected_revision, bool) or not isinstance(expected_revision, int) \
                or expected_revision < 0:
            raise InvalidChange(f"expected_revision must be an integer >= 0, not {expected_revision!r}")
        entry, _ = await self._read(entity_type, entity_id)
        current = 0 if entry is None else entry.revision
        if current == expected_revision:
            row = _merged(entry, patch)
            written, current = await self._write(entity_type, entity_id, row, checksum(row), current)
            if written:
                return current
        raise VersionConflict(
            f"{entity_type} {entity_id!r} is at revision {current}, not {expected_revision}: nothing written",
            current_revision=current,
        )

    async def force_update(self, entity_type: str, entity_id: str, changes: Row) -> int:
        """Merge `changes` into the cached row whatever its revision; returns the new revision.

        Still a compare-and-set underneath: when another write lands between the read and the
        write, it reads again and merges into that, so no concurrent write is lost."""
        self._check_open()
        _check_key(entity_type, entity_id)
        patch = _patch(changes)
        while True:
            entry, _ = await self._read(entity_type, entity_id)
            current = 0 if entry is None else entry.revision
            row = _merged(entry, patch)
            written, revision = await self._write(entity_type, entity_id, row, checksum(row), current)
            if written:
                return revision

    async def repair(self, entity_type: str, entity_id: str, row: Row | None, row_checksum: str,
                     expected: Entry | None) -> bool:
        """Write `row` (canonical; None: a tombstone) over the entry if the cache still holds
        exactly `expected` (same revision and version; None: nothing held), keeping the entry's
        source version (ZERO_VERSION when nothing was held) and counting a revision. False, with
        nothing written, when the entry changed since it was read.

        Keeping the version is what makes a repair safe beside a running sync: the repair never
        overwrites a change that landed after `expected` was read (the compare fails), and any
        change the source commits later carries a newer version than `expected`'s, so it still
        replaces the repaired row."""
        self._check_open()
        _check_key(entity_type, entity_id)
        if expected is not None and (expected.entity_type, expected.entity_id) != (entity_type, entity_id):
            raise InvalidChange(f"repair of {entity_type} {entity_id!r} given the entry of another entity")
        raw = b"" if row is None else orjson.dumps(_patch(row))
        return await self._repair(entity_type, entity_id, raw, row_checksum, expected)

    # ------------------------------------------------------------------ checkpoints

    async def get_checkpoint(self, name: str) -> JsonValue:
        """The value last put under `name` (None if never)."""
        self._check_open()
        _check_name(name)
        raw = await self._get_checkpoint(name)
        return None if raw is None else orjson.loads(raw)

    async def put_checkpoint(self, name: str, value: JsonValue) -> None:
        """Store `value` (anything JSON can hold) under `name`, durably."""
        self._check_open()
        _check_name(name)
        try:
            raw = orjson.dumps(value)
        except TypeError as exc:
            raise TypeError(f"checkpoint {name!r} must be a JSON value: {exc}") from None
        await self._put_checkpoint(name, raw)

    # ------------------------------------------------------------------ backend hooks

    @abc.abstractmethod
    async def _open(self) -> None: ...

    @abc.abstractmethod
    async def _close(self) -> None: ...

    @abc.abstractmethod
    async def _apply(self, entity_type: str, changes: Sequence[Change]) -> list[Outcome]:
        """Apply changes of one type in order, each atomically; one outcome per change."""

    @abc.abstractmethod
    async def _read(self, entity_type: str, entity_id: str) -> tuple[Entry | None, Version | None]:
        """The unexpired entry (tombstones included) and the type's truncate floor."""

    @abc.abstractmethod
    async def _put_loaded(
        self, entity_type: str, entity_id: str, row: Row, row_checksum: str, floor: Version | None
    ) -> Row | None:
        """Cache a loaded row at ZERO_VERSION if nothing is held and the floor is still `floor`;
        returns the row to answer: the held one if an entry appeared meanwhile (None for a
        tombstone), else `row` (cached or not)."""

    @abc.abstractmethod
    async def _write(
        self, entity_type: str, entity_id: str, row: Row, row_checksum: str, expected_revision: int
    ) -> tuple[bool, int]:
        """Store `row` keeping the entry's version if the revision is `expected_revision`:
        (True, new revision), else (False, current revision) with nothing written."""

    @abc.abstractmethod
    async def _read_many(self, entity_type: str, entity_ids: Sequence[str]) -> list[Entry | None]:
        """The unexpired entries (tombstones included) of up to READ_PAGE ids, in order."""

    @abc.abstractmethod
    async def _repair(self, entity_type: str, entity_id: str, row: bytes, row_checksum: str,
                      expected: Entry | None) -> bool:
        """`repair` on the store: `row` is the row's JSON, empty for a tombstone."""

    @abc.abstractmethod
    def _scan(self, entity_type: str) -> AsyncIterator[Entry]: ...

    @abc.abstractmethod
    def _scan_ids(self, entity_type: str) -> AsyncIterator[str]: ...

    @abc.abstractmethod
    async def _count(self, entity_type: str) -> int: ...

    @abc.abstractmethod
    async def _get_checkpoint(self, name: str) -> bytes | None: ...

    @abc.abstractmethod
    async def _put_checkpoint(self, name: str, value: bytes) -> None: ...


# ---------------------------------------------------------------------- helpers


def row_json(change: Change) -> bytes | None:
    """The JSON the cache stores for a change's row: its after-image (None for a delete or a
    truncate, which store no row)."""
    if change.after is None or change.op not in (Op.INSERT, Op.UPDATE):
        return None
    try:
        return orjson.dumps(change.after)
    except TypeError as exc:
        raise InvalidChange(
            f"the row of {change.entity_type} {change.entity_id!r} is not canonical JSON: {exc}"
        ) from None


def _ttl(name: str, value: float | None) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ConfigError(f"{name} must be a number of seconds > 0 or None (no expiry), not {value!r}")
    return float(value)


def _check_key(entity_type: object, entity_id: object) -> None:
    if not isinstance(entity_type, str) or not entity_type:
        raise InvalidChange(f"an entity type must be a non-empty string, not {entity_type!r}")
    if not isinstance(entity_id, str) or not entity_id:
        raise InvalidChange(f"an entity id must be a non-empty string, not {entity_id!r}")


def _check_name(name: object) -> None:
    if not isinstance(name, str) or not name:
        raise InvalidChange(f"a checkpoint name must be a non-empty string, not {name!r}")


def _check_change(change: object) -> None:
    if not isinstance(change, Change):
        raise InvalidChange(f"the entity cache applies Change objects, not {type(change).__name__}")
    _check_key(change.entity_type, change.entity_id)
    lsn, ordinal = change.version
    if not (0 <= lsn <= _MAX_LSN and 0 <= ordinal <= MAX_ORDINAL):
        raise InvalidChange(
            f"change of {change.entity_type} {change.entity_id!r} has version ({lsn}, {ordinal}) "
            "outside 0..2**64-1 / 0..2**32-1"
        )


def _patch(changes: object) -> Row:
    if not isinstance(changes, Mapping):
        raise InvalidChange(f"an update's changes must be a row (a mapping), not {type(changes).__name__}")
    return _row(canonical(changes))


def _row(value: JsonValue) -> Row:
    # canonical() of a mapping is a dict: this only narrows the type.
    assert isinstance(value, dict)
    return value


def _merged(entry: Entry | None, patch: Row) -> Row:
    base = entry.data if entry is not None and entry.data is not None else {}
    return {**base, **patch}
