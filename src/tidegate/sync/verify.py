"""`tidegate sync verify`: is the entity cache exactly the database, row by row?

Each table is read in key order, in batches (keyset pagination, throttled to `max_rows_per_s`),
decoded exactly as the snapshot decodes it, and each row's checksum (the canonical SHA-256 every
change carries) is compared with the cached entry of the same entity id: a row the cache lacks
(or holds as a tombstone) is *missing*, one whose checksum differs is *differing*; afterwards the
cache's live entries of the type that no row produced are *extra*.

A running sync keeps changing both sides, so a mismatch is only a suspect until it is looked at
again. Every read of the database records two source positions (`SourceRead.low`/`high`: every
change below `low` is visible in the read, every change it shows is below `high`). For each
round, the suspects are read from the database again, verify waits until the sync has applied
everything below that read's `high` (the slot's confirmed position, the outbox's), then reads
the cached entries again:

- equal to the database's row now: it had changed during the pass; not drift;
- still different, and the cached entry's version is below the *previous* read's `low`: nothing
  changed the row since before the previous look and every change visible in the new read is
  applied, so the cache is wrong: drift;
- still different with a newer version: it changed again meanwhile. A few quick looks (both
  sides read again, 50 ms apart) catch such a row between two of its changes; otherwise one
  more round (at most `rounds`). Suspects left after the rounds, or when the sync does not
  catch up within `settle_timeout_s`, are reported as *unsettled*, not as drift.

Drift is thus only ever reported after two reads of the database, the second one fully applied
by the sync: a change committed while a read was taken cannot pass for drift. An entry no row had
(a candidate *extra*) has no key to read by, so its second look reads the table again.

Reads are short statements, not one long transaction, so a pass holds back no vacuum. The
entity ids seen in a table are kept in memory for the extra-row check (about 100 bytes a row).

`--repair` writes each drifted row as the final look read it from the database (an extra row
becomes a tombstone) through `EntityCache.repair`: only over the very entry that look compared
(same revision and version), keeping that entry's source version. That version cannot regress and
cannot block the stream: every change the source commits later is newer than it, and a change
that landed meanwhile makes the repair a no-op.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol, Self
from urllib.parse import urlsplit

from tidegate.config import SyncConfig, VerifySettings
from tidegate.errors import ConfigError
from tidegate.sync.changes import Change, Op, Version
from tidegate.sync.contracts import CheckpointStore, EntityCache, Entry
from tidegate.sync.metrics import SyncMetrics
from tidegate.sync.values import JsonValue, Row, checksum

__all__ = [
    "LAST_VERIFY_CHECKPOINT",
    "RowSource",
    "SourceRead",
    "SourceRow",
    "TableReport",
    "VerifyReport",
    "VerifySettings",
    "row_source_for",
    "source_row",
    "verify",
    "verify_sync",
]

log = logging.getLogger("tidegate.sync.verify")

LAST_VERIFY_CHECKPOINT = "verify:last"
"""The checkpoint (next to the cache) holding the last verify's report, for `sync status`."""

KINDS = ("missing", "extra", "differing", "unsettled")
_APPLIED_POLL_S = 0.1
_QUICK_LOOKS, _QUICK_LOOK_S = 10, 0.05
_ZERO = Version(0, 0)
_NO_TIME = datetime(1970, 1, 1, tzinfo=UTC)  # a compared row has no commit of its own


@dataclass(frozen=True, slots=True)
class SourceRow:
    """One database row as verify compares it."""

    entity_id: str
    key: tuple[Any, ...]  # the source's own key values, to read the row again
    row: Row  # canonical
    checksum: str


@dataclass(frozen=True, slots=True)
class SourceRead:
    """Rows read by one statement, and the source positions around it: every change at a
    position below `low` is visible in `rows`, and every change visible there is below `high`."""

    rows: tuple[SourceRow, ...]
    low: int
    high: int
    last_key: tuple[Any, ...] | None = None  # of the last row read: where the next batch starts
    read: int = 0  # rows the statement returned (some may not have become SourceRows)


class RowSource(Protocol):
    """What verify needs from a change source: its rows in key order, rows by key, and how far the
    sync has applied its changes. An async context manager."""

    entity_types: tuple[str, ...]

    async def __aenter__(self) -> Self: ...

    async def __aexit__(self, *exc_info: object) -> None: ...

    async def batch(self, entity_type: str, after: tuple[Any, ...] | None, limit: int) -> SourceRead:
        """Up to `limit` rows after key `after` (None: from the first), in key order."""
        ...

    async def rows(self, entity_type: str, keys: Sequence[tuple[Any, ...]]) -> SourceRead:
        """The rows with these keys that exist now."""
        ...

    async def applied(self) -> int:
        """Every change at a position below this has been applied by the sync (every sink)."""
        ...


def source_row(entity_type: str, key_columns: Sequence[str], key: tuple[Any, ...],
               values: dict[str, Any], *, documents: bool = False) -> SourceRow:
    """A row as the snapshot would turn it into a change: the same entity id, canonical row and
    checksum (raises InvalidChange where the snapshot would fail too). `documents`: the key is
    one JSON column (see `entity_id_of`), as the source decides for the stream."""
    change = Change.of_row(entity_type=entity_type, op=Op.INSERT, key_columns=key_columns,
                           version=_ZERO, commit_time=_NO_TIME, after=values, documents=documents)
    assert change.after is not None
    return SourceRow(change.entity_id, key, change.after, change.checksum)


@dataclass(slots=True)
class TableReport:
    """One table's result."""

    checked: int = 0
    missing: int = 0
    extra: int = 0
    differing: int = 0
    unsettled: int = 0
    repaired: int = 0
    rechecked: int = 0  # rows that did not match at first and were looked at again
    examples: dict[str, list[str]] = field(default_factory=dict)

    @property
    def drift(self) -> int:
        """Rows found wrong in the cache."""
        return self.missing + self.extra + self.differing

    def to_dict(self) -> dict[str, JsonValue]:
        """JSON-ready."""
        return {"checked": self.checked, "missing": self.missing, "extra": self.extra,
                "differing": self.differing, "unsettled": self.unsettled, "repaired": self.repaired,
                "rechecked": self.rechecked,
                "examples": {kind: list(ids) for kind, ids in self.examples.items()}}


@dataclass(slots=True)
class VerifyReport:
    """What one verify found, per entity type."""

    started_at: datetime
    finished_at: datetime | None = None
    repair: bool = False
    tables: dict[str, TableReport] = field(default_factory=dict)

    @property
    def drift(self) -> int:
        """Rows found wrong, all tables."""
        return sum(table.drift for table in self.tables.values())

    @property
    def ok(self) -> bool:
        """The cache holds exactly the database now: no drift left unrepaired, nothing unsettled."""
        return all(t.drift == t.repaired and t.unsettled == 0 for t in self.tables.values())

    @property
    def exit_code(self) -> int:
        """0 when `ok`, else 1."""
        return 0 if self.ok else 1

    def to_dict(self) -> dict[str, JsonValue]:
        """JSON-ready; what `sync status` shows of the last verify."""
        finished = self.finished_at or datetime.now(UTC)
        return {
            "started_at": self.started_at.isoformat(timespec="seconds"),
            "finished_at": finished.isoformat(timespec="seconds"),
            "duration_s": round((finished - self.started_at).total_seconds(), 3),
            "ok": self.ok, "repair": self.repair,
            "checked": sum(t.checked for t in self.tables.values()), "drift": self.drift,
            "tables": {name: table.to_dict() for name, table in self.tables.items()},
        }


@dataclass(slots=True)
class _Suspect:
    entity_id: str
    key: tuple[Any, ...] | None  # None: no row of the database has this id (an extra entry)
    db: SourceRow | None  # the row as last read (None: absent)
    low: int  # positions of that read
    high: int
    decide_below: int = 0  # drift only if the cached entry's version is below this
    entry: Entry | None = None


class _Throttle:
    """Paces rows to at most `rate_per_s`, averaged from the start."""

    def __init__(self, rate_per_s: float | None) -> None:
        self._rate = rate_per_s
        self._start = time.monotonic()
        self._rows = 0

    async def passed(self, rows: int) -> None:
        if self._rate is None:
            return
        self._rows += rows
        ahead_s = self._start + self._rows / self._rate - time.monotonic()
        if ahead_s > 0:
            await asyncio.sleep(ahead_s)


async def verify(source: RowSource, cache: EntityCache, settings: VerifySettings | None = None,
                 metrics: SyncMetrics | None = None) -> VerifyReport:
    """Compare every table of `source` with `cache` (see the module doc); repair if asked."""
    settings = settings or VerifySettings()
    report = VerifyReport(started_at=datetime.now(UTC), repair=settings.repair)
    throttle = _Throttle(settings.max_rows_per_s)
    for entity_type in source.entity_types:
        table = _Table(source, cache, settings, throttle, entity_type)
        report.tables[entity_type] = await table.run()
        log.info("verified %s: %s", entity_type, report.tables[entity_type].to_dict())
    report.finished_at = datetime.now(UTC)
    if metrics is not None:
        for entity_type, result in report.tables.items():
            for kind in KINDS:
                metrics.drift_rows.labels(entity_type=entity_type, kind=kind).set(getattr(result, kind))
    return report


class _Table:
    """Verify of one entity type: the pass, the rounds, the repairs."""

    def __init__(self, source: RowSource, cache: EntityCache, settings: VerifySettings,
                 throttle: _Throttle, entity_type: str) -> None:
        self.source, self.cache, self.settings = source, cache, settings
        self.throttle, self.entity_type = throttle, entity_type
        self.report = TableReport()
        self.suspects: dict[str, _Suspect] = {}

    async def run(self) -> TableReport:
        await self._pass()
        self.report.rechecked = len(self.suspects)
        if self.suspects:
            log.info("%s: %d row(s) did not match; looking again once the sync has applied what "
                     "a new read sees", self.entity_type, len(self.suspects))
        for _ in range(self.settings.rounds):
            if not self.suspects or not await self._round():
                break
        for suspect in self.suspects.values():
            self._count("unsettled", suspect.entity_id)
        return self.report

    async def _pass(self) -> None:
        seen: set[str] = set()
        first_low = last_high = None
        async for read in self._reads():
            first_low = read.low if first_low is None else first_low
            last_high = read.high
            self.report.checked += read.read
            unreadable = read.read - len(read.rows)
            if unreadable:  # rows no change can carry: the cache cannot hold them
                log.warning("%s: %d row(s) after key %r cannot become changes (the sync logs why): "
                            "counted as missing", self.entity_type, unreadable, read.last_key)
                self.report.missing += unreadable
            entries = await self.cache.get_many(self.entity_type, [r.entity_id for r in read.rows])
            for row, entry in zip(read.rows, entries, strict=True):
                seen.add(row.entity_id)
                if not _same(row, entry):
                    self.suspects[row.entity_id] = _Suspect(row.entity_id, row.key, row, read.low, read.high)
        assert first_low is not None and last_high is not None
        async for entity_id in self.cache.scan_ids(self.entity_type):
            if entity_id not in seen:
                self.suspects[entity_id] = _Suspect(entity_id, None, None, first_low, last_high)

    async def _reads(self) -> AsyncIterator[SourceRead]:
        """The table in key order, batch by batch (at least one read, even of an empty table)."""
        after: tuple[Any, ...] | None = None
        while True:
            read = await self.source.batch(self.entity_type, after, self.settings.batch_size)
            yield read
            await self.throttle.passed(read.read)
            if read.read < self.settings.batch_size or read.last_key is None:
                return
            after = read.last_key

    async def _round(self) -> bool:
        """Look at every suspect again; False when the sync did not catch up in time."""
        await self._read_again()
        high = max(s.high for s in self.suspects.values())
        if not await self._applied(high):
            log.warning("%s: the sync has not applied source position %d within %.0f s; %d row(s) "
                        "left unsettled", self.entity_type, high, self.settings.settle_timeout_s,
                        len(self.suspects))
            return False
        await self._compare(decide=True)
        # Rows still moving: a few quick looks catch each between two of its changes, sooner
        # than the next round (which waits for the slot's position to move again).
        for _ in range(_QUICK_LOOKS):
            if not any(s.key is not None for s in self.suspects.values()):
                break
            await asyncio.sleep(_QUICK_LOOK_S)
            await self._read_again(keyed_only=True)
            await self._compare(decide=False)
        return True

    async def _compare(self, *, decide: bool) -> None:
        """Drop the suspects the cache now agrees on; with `decide`, report those proven wrong."""
        ids = list(self.suspects)
        for entity_id, entry in zip(ids, await self.cache.get_many(self.entity_type, ids), strict=True):
            suspect = self.suspects[entity_id]
            if _same(suspect.db, entry):
                del self.suspects[entity_id]
            elif decide and (entry.version.lsn if entry is not None else 0) < suspect.decide_below:
                del self.suspects[entity_id]
                suspect.entry = entry
                await self._drifted(suspect)

    async def _read_again(self, *, keyed_only: bool = False) -> None:
        """A fresh database read of every suspect: by key where the key is known, else (an entry
        no row had) by reading the table again and looking for its id. The previous read's
        `low` becomes the bound a drifted entry's version must be below."""
        keyed = [s for s in self.suspects.values() if s.key is not None]
        for suspect in (keyed if keyed_only else self.suspects.values()):
            suspect.decide_below = suspect.low
        for start in range(0, len(keyed), self.settings.batch_size):
            chunk = keyed[start:start + self.settings.batch_size]
            read = await self.source.rows(self.entity_type, [s.key for s in chunk if s.key is not None])
            found = {row.entity_id: row for row in read.rows}
            for suspect in chunk:
                suspect.db, suspect.low, suspect.high = found.get(suspect.entity_id), read.low, read.high
            await self.throttle.passed(len(chunk))
        unkeyed = {s.entity_id: s for s in self.suspects.values() if s.key is None}
        if not unkeyed or keyed_only:
            return
        first_low = last_high = None
        async for read in self._reads():
            first_low = read.low if first_low is None else first_low
            last_high = read.high
            for row in read.rows:
                if row.entity_id in unkeyed:
                    hit = unkeyed.pop(row.entity_id)
                    hit.key, hit.db, hit.low, hit.high = row.key, row, read.low, read.high
        assert first_low is not None and last_high is not None
        for suspect in unkeyed.values():
            suspect.db, suspect.low, suspect.high = None, first_low, last_high

    async def _applied(self, position: int) -> bool:
        deadline = time.monotonic() + self.settings.settle_timeout_s
        while await self.source.applied() < position:
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(_APPLIED_POLL_S)
        return True

    async def _drifted(self, suspect: _Suspect) -> None:
        entry, db = suspect.entry, suspect.db
        live = entry is not None and not entry.deleted
        kind = "extra" if db is None else ("differing" if live else "missing")
        self._count(kind, suspect.entity_id)
        if not self.settings.repair:
            return
        if db is not None:
            written = await self.cache.repair(self.entity_type, suspect.entity_id, db.row, db.checksum, entry)
        else:
            assert entry is not None
            written = await self.cache.repair(self.entity_type, suspect.entity_id, None,
                                              checksum(entry.data), entry)
        if written:
            self.report.repaired += 1
        else:
            log.warning("%s %r changed while being repaired: left to the stream (verify again)",
                        self.entity_type, suspect.entity_id)

    def _count(self, kind: str, entity_id: str) -> None:
        setattr(self.report, kind, getattr(self.report, kind) + 1)
        examples = self.report.examples.setdefault(kind, [])
        if len(examples) < self.settings.examples:
            examples.append(entity_id)


def _same(db: SourceRow | None, entry: Entry | None) -> bool:
    if db is None:
        return entry is None or entry.deleted
    # The stored checksum and the stored row must both be the database's: a checksum that does
    # not describe its row would mislead everything that compares checksums.
    return (entry is not None and entry.data is not None and entry.checksum == db.checksum
            and checksum(entry.data) == db.checksum)


# ---------------------------------------------------------------------- wiring


def row_source_for(config: SyncConfig, checkpoints: CheckpointStore) -> RowSource:
    """The RowSource for a `SyncConfig`'s source URL, not yet opened."""
    scheme = urlsplit(config.source_url).scheme
    if scheme in ("postgresql", "postgres"):
        from tidegate.sync.sources.postgres.settings import PostgresSourceSettings
        from tidegate.sync.sources.postgres.verify import PostgresRows

        return PostgresRows(PostgresSourceSettings.from_url(
            config.source_url, tables=config.tables, slot_name=config.slot,
            publication_name=config.publication, source_zone=config.source_timezone), checkpoints)
    if scheme == "sqlite":
        from tidegate.sync.sources.sqlite.settings import SqliteSourceSettings
        from tidegate.sync.sources.sqlite.verify import SqliteRows

        return SqliteRows(SqliteSourceSettings.from_url(
            config.source_url, tables=config.tables, source_zone=config.source_timezone), checkpoints)
    raise ConfigError(f"sync verify reads postgresql://… or sqlite:///… sources, not {scheme!r}")


async def verify_sync(config: SyncConfig, settings: VerifySettings | None = None,
                      metrics: SyncMetrics | None = None) -> VerifyReport:
    """`tidegate sync verify`: verify the configured cache against the configured source and
    record the report where `sync status` finds it."""
    from tidegate.sync.cache import open_cache

    if urlsplit(config.cache_url).scheme == "memory":
        raise ConfigError("a memory:// cache lives inside its sync process and cannot be verified "
                          "from outside: verify a shared cache (redis://…)")
    async with contextlib.AsyncExitStack() as stack:
        cache = await stack.enter_async_context(open_cache(config))
        source = await stack.enter_async_context(row_source_for(config, cache))
        report = await verify(source, cache, settings or config.verify, metrics)
        await cache.put_checkpoint(LAST_VERIFY_CHECKPOINT, report.to_dict())
    return report
