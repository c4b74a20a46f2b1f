"""The embedded change source: triggers write to an outbox table, a poller turns it into Changes.

`SqliteSource` installs the capture triggers (see `tidegate.sync.sources.sqlite.capture`) on start, then
hands out the outbox in sequence order and deletes what the pipeline confirms:

- Transactions: SQLite cannot say which outbox rows one transaction wrote, so each poll batch is
  one `Transaction` whose position is its last sequence number; a change's version is
  (sequence number, 0). An update that changes the primary key becomes a delete of the old key
  (ordinal 0) and an insert of the new one (ordinal 1), so no entity is left behind under its
  old id.
- Commit time: SQLite keeps none, so a change carries the time of the statement that wrote it.
  There is no transaction id either (`xid` is None).
- Waking up: a watcher thread with a connection of its own asks `PRAGMA data_version` (which
  only moves when another connection commits) every poll interval, and wakes the poller, which
  reads the outbox only then: an idle database costs one cheap pragma per interval on a thread
  that does nothing else. A moved `PRAGMA schema_version` re-installs the triggers before the
  outbox is read; rows the old triggers wrote without a newly added column get it from the row
  as it is now.
- Snapshot: without a checkpoint for this database in the checkpoint store (first start, or an
  in-memory cache after a restart) the rows already in the tables come first, read in one read
  transaction together with the outbox's last sequence number N. Snapshot rows are inserts at
  version (N, SNAPSHOT_ORDINAL): the state after every change up to N, and above the zero version
  an entity cache gives rows it loaded itself even when N is 0. Outbox rows up to N are already
  in the snapshot and are skipped, then deleted once the snapshot is confirmed. Batches carry a
  mark (table and last key copied); confirmed marks are stored, so after a crash the snapshot
  continues after the last confirmed key. That converges, though the rest is read later than N:
  every write after N is in the outbox above N and is streamed after the snapshot. The read
  transaction keeps the WAL from being checkpointed past it while the snapshot runs.
- Writers: any number of connections and processes may write the database (WAL). The source
  holds the write lock only to install triggers and for one DELETE per confirmation. One source
  per database file: confirmations delete outbox rows for every reader.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import sqlite3
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

from tidegate._lifecycle import Lifecycle
from tidegate._sqlite import SqliteThread, immediate
from tidegate.errors import InvalidChange, SourceError
from tidegate.sync.changes import MAX_ORDINAL, Change, Op, Version
from tidegate.sync.contracts import CheckpointStore, Transaction
from tidegate.sync.sources.sqlite.capture import (
    OUTBOX,
    OUTBOX_SCHEMA,
    RowReader,
    TableShape,
    captured_tables,
    drop_triggers_except,
    install_triggers,
    quote_identifier,
    read_shape,
)
from tidegate.sync.sources.sqlite.settings import SqliteSourceSettings
from tidegate.sync.sources.sqlite.watcher import Watcher
from tidegate.sync.values import JsonValue, Row, source_zone

__all__ = ["SNAPSHOT_ORDINAL", "SqliteSource", "SqliteSourceSettings"]

log = logging.getLogger("tidegate.sync.sqlite")

_OUTBOX_PAGE = (f"SELECT seq, entity_type, op, before_json, after_json, changed_at FROM {OUTBOX} "
                "WHERE seq > ? ORDER BY seq LIMIT ?")
_LAST_SEQ = "SELECT COALESCE((SELECT seq FROM sqlite_sequence WHERE name = ?), 0)"
SNAPSHOT_ORDINAL = MAX_ORDINAL  # after every change at the snapshot's position


@dataclass(frozen=True, slots=True)
class _SnapshotPlan:
    """What the snapshot copies: `todo` in order, the first one after the raw key `after`.
    `tables` is every table of the snapshot, kept in its marks."""

    tables: tuple[str, ...]
    todo: tuple[str, ...]
    max_seq: int | None = None  # None: a fresh snapshot reads it in its own transaction
    after: list[Any] | None = None


class SqliteSource(Lifecycle):
    """A `ChangeSource` over a SQLite file: `async with SqliteSource(settings, checkpoints) as s:`
    then `async for transaction in s.transactions(): …` (see the module doc). A source opens once:
    a failed open leaves it closed."""

    unavailable_error = SourceError
    what = "the SQLite source"

    def __init__(self, settings: SqliteSourceSettings, checkpoints: CheckpointStore) -> None:
        super().__init__()
        self.settings = settings
        self._checkpoints = checkpoints
        self._zone = source_zone(settings.source_zone)
        self._checkpoint_name = settings.checkpoint_name
        self._db = SqliteThread(settings.path, OUTBOX_SCHEMA,
                                error=lambda exc: SourceError(f"SQLite source at {settings.path}: {exc}"))
        self._iterated = False
        self._readers: dict[str, RowReader] = {}
        self._plan: _SnapshotPlan | None = None
        self._after_seq = 0  # the last outbox row handed out, or covered by the snapshot
        self._schema_version: int | None = None
        self._changed = asyncio.Event()  # set by the watcher when another connection committed
        self._watcher: Watcher | None = None
        self._more = False  # the last poll filled a whole batch: read again without waiting

    @classmethod
    def from_url(cls, url: str, checkpoints: CheckpointStore, **options: Any) -> SqliteSource:
        """A source for a `sqlite:///…` URL (see `SqliteSourceSettings.from_url`)."""
        return cls(SqliteSourceSettings.from_url(url, **options), checkpoints)

    # -- lifecycle --------------------------------------------------------------------------

    def _described(self) -> str:
        return f"{self.what} at {self.settings.path}"

    async def _open(self) -> None:
        if not await asyncio.to_thread(Path(self.settings.path).is_file):
            raise SourceError(f"no SQLite database at {self.settings.path}")
        try:
            await self._db.open()
            await self._db.run(self._install)
            self._plan = await self._load_plan()
        except BaseException:
            await self.close()  # a failed open is final, as a close is: create a new source
            await self._close()
            raise

    async def _close(self) -> None:
        """Stop: `transactions()` ends, the connection closes."""
        self._changed.set()  # a poller waiting for a commit sees the source closed
        if self._watcher is not None:
            await self._watcher.stop()
        await self._db.close()

    async def install(self) -> None:
        """Create the outbox and (re)install every configured table's triggers; idempotent.
        Raises SourceError naming a configured table that does not exist."""
        self._check_open()
        await self._db.run(self._install)

    def _install(self, conn: sqlite3.Connection) -> None:
        def body(conn: sqlite3.Connection) -> dict[str, TableShape]:
            shapes: dict[str, TableShape] = {}
            for table in self.settings.tables:
                try:
                    shape = read_shape(conn, table, self.settings.timestamp_columns.get(table))
                except SourceError as exc:
                    raise SourceError(f"SQLite source at {self.settings.path}: {exc}") from None
                shapes[shape.name] = shape
                if install_triggers(conn, shape):
                    log.info("capture triggers installed on %s (%d columns)", shape.name, len(shape.columns))
            for table in drop_triggers_except(conn, shapes):
                log.info("capture triggers removed from %s: not a configured table", table)
            return shapes

        shapes = immediate(conn, body)
        self._readers = {name: RowReader(shape, self._zone) for name, shape in shapes.items()}
        self._schema_version = int(conn.execute("PRAGMA schema_version").fetchone()[0])

    # -- the change stream ------------------------------------------------------------------

    async def transactions(self) -> AsyncIterator[Transaction]:
        """The snapshot when one is due, then the outbox, until the source is closed."""
        self._check_open()
        if self._iterated:
            raise SourceError("transactions() of a SQLite source can be iterated once")
        self._iterated = True
        if self._plan is not None:
            async for transaction in self._snapshot(self._plan):
                yield transaction
        self._watcher = Watcher(self.settings.path, self.settings.poll_interval_s, self._changed)
        self._changed.set()  # the first read needs no commit to wait for
        while self.is_open:
            if not self._more:
                await self._changed.wait()
                self._watcher.raise_failure()
            self._changed.clear()  # before reading: a commit from now on wakes the next read
            if not self.is_open:
                break
            polled: Transaction | None = await self._db.run(self._poll)
            if polled is not None:
                yield polled

    def _poll(self, conn: sqlite3.Connection) -> Transaction | None:
        if int(conn.execute("PRAGMA schema_version").fetchone()[0]) != self._schema_version:
            self._install(conn)
        rows = conn.execute(_OUTBOX_PAGE, (self._after_seq, self.settings.batch_size)).fetchall()
        self._more = len(rows) == self.settings.batch_size
        if not rows:
            return None
        captured_at = time.time()
        changes: list[Change] = []
        for row in rows:
            changes.extend(self._changes_of(conn, row, captured_at))
        last_seq = int(rows[-1][0])
        self._after_seq = last_seq
        commit_time = changes[-1].commit_time if changes else None
        # Rows that cannot become changes still advance the position, so they are deleted.
        return Transaction(tuple(changes), last_seq, commit_time)

    def _changes_of(self, conn: sqlite3.Connection, row: tuple[Any, ...], captured_at: float) -> list[Change]:
        seq, entity_type, op, before_json, after_json, changed_at = row
        reader = self._readers.get(entity_type)
        if reader is None:  # written before the table left the configuration
            log.debug("outbox row %d of %s skipped: not a configured table", seq, entity_type)
            return []
        try:
            before = orjson.loads(before_json) if before_json is not None else None
            after = orjson.loads(after_json) if after_json is not None else None
            if after is not None and reader.missing(after):
                after = self._fill_missing(conn, reader, after)
            return _changes(reader, Op(op), Version(int(seq), 0), datetime.fromisoformat(changed_at),
                            before, after, captured_at)
        except (orjson.JSONDecodeError, InvalidChange, ValueError) as exc:
            log.error("outbox row %d of %s cannot become a change and is skipped: %s", seq, entity_type, exc)
            return []

    def _fill_missing(self, conn: sqlite3.Connection, reader: RowReader,
                      image: dict[str, Any]) -> dict[str, Any]:
        """An image written by triggers older than a column: the missing columns from the row
        as it is now (a later change of the row, if any, follows in the outbox)."""
        shape = reader.shape
        found = conn.execute(shape.row_sql(), [image.get(c) for c in shape.key_columns]).fetchone()
        if found is None:  # deleted since: its delete follows in the outbox
            return image
        current: dict[str, Any] = orjson.loads(found[0])
        return {**{c: current.get(c) for c in reader.missing(image)}, **image}

    async def confirm(self, position: int) -> None:
        """Delete the outbox rows up to `position`: every change there is applied."""
        self._check_open()
        await self._delete_through(position)

    async def status(self) -> dict[str, JsonValue]:
        """What `tidegate sync status` shows, read on a read-only connection of its own (the
        source need not be open): the outbox's last sequence number, the rows not yet confirmed
        and how old the oldest is, the snapshot's state, and each configured table's rows and
        whether its capture triggers are installed (None for a table that does not exist)."""
        if not await asyncio.to_thread(Path(self.settings.path).is_file):
            raise SourceError(f"no SQLite database at {self.settings.path}")
        try:
            found = await asyncio.to_thread(self._read_status)
        except sqlite3.Error as exc:
            raise SourceError(f"SQLite source at {self.settings.path}: {exc}") from exc
        mark = await self._checkpoints.get_checkpoint(self._checkpoint_name)
        oldest = found.pop("oldest_pending_at")
        lag_s = None
        if isinstance(oldest, str):
            lag_s = round(max(0.0, time.time() - datetime.fromisoformat(oldest).timestamp()), 3)
        return {
            "kind": "sqlite", "path": self.settings.path, **found,
            "oldest_pending_at": oldest, "lag_s": lag_s,
            "snapshot_done": bool(mark["done"]) if _is_mark(mark) and isinstance(mark, dict) else None,
            "snapshot_position": mark["max_seq"] if _is_mark(mark) and isinstance(mark, dict) else None,
        }

    def _read_status(self) -> dict[str, JsonValue]:
        uri = f"{Path(self.settings.path).resolve().as_uri()}?mode=ro"
        with contextlib.closing(sqlite3.connect(uri, uri=True, timeout=30)) as conn:
            names = {str(n).lower(): str(n) for (n,) in conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table'")}
            last_seq, pending, oldest = 0, 0, None
            if OUTBOX in names:
                last_seq = int(conn.execute(_LAST_SEQ, (OUTBOX,)).fetchone()[0])
                pending, oldest = conn.execute(f"SELECT count(*), min(changed_at) FROM {OUTBOX}").fetchone()
            captured = captured_tables(conn)
            tables: dict[str, JsonValue] = {}
            for table in self.settings.tables:
                name = names.get(table.lower())
                if name is None:
                    tables[table] = {"rows": None, "captured": False}
                    continue
                rows = int(conn.execute(f"SELECT count(*) FROM {quote_identifier(name)}").fetchone()[0])
                tables[table] = {"rows": rows, "captured": name.lower() in captured}
        return {"outbox_last_seq": last_seq, "outbox_pending": int(pending), "oldest_pending_at": oldest,
                "tables": tables}

    # -- the snapshot -----------------------------------------------------------------------

    async def _load_plan(self) -> _SnapshotPlan | None:
        """What snapshot is due, from the checkpoint of this database (None: none is)."""
        name = self._checkpoint_name
        tables = tuple(self._readers)
        mark = await self._checkpoints.get_checkpoint(name)
        if mark is None:
            return _SnapshotPlan(tables, tables)
        if not _is_mark(mark):
            log.warning("checkpoint %s is not a snapshot mark (%r): taking a new snapshot", name, mark)
            return _SnapshotPlan(tables, tables)
        assert isinstance(mark, dict)
        planned = tuple(mark["tables"])
        if not set(tables) <= set(planned):
            log.info("tables %s are new to the snapshot of %s: taking a new snapshot",
                     ", ".join(sorted(set(tables) - set(planned))), self.settings.path)
            return _SnapshotPlan(tables, tables)
        last_seq = await self._db.run(lambda conn: int(conn.execute(_LAST_SEQ, (OUTBOX,)).fetchone()[0]))
        if last_seq < int(mark["max_seq"]):
            # Versions from this database would be older than those the cache holds, so every
            # change would be ignored as stale.
            raise SourceError(
                f"SQLite source at {self.settings.path}: the outbox is at sequence {last_seq}, behind the "
                f"checkpoint {name} ({mark['max_seq']}): the database was restored or replaced. Clear the "
                "entity cache (its entries and that checkpoint) to capture it from a new snapshot")
        self._after_seq = int(mark["max_seq"])
        kept = tuple(t for t in planned if t in self._readers)
        if mark["done"]:
            if kept != planned:
                # A table left the configuration and its triggers are gone: should it come
                # back, it needs a snapshot again.
                await self._checkpoints.put_checkpoint(name, {**mark, "tables": list(kept)})
            return None
        # Continue after the last confirmed key of the table the mark names.
        start = planned.index(mark["table"]) if mark["table"] in planned else 0
        todo = tuple(t for t in planned[start:] if t in self._readers)
        after = _decode_key(mark["after"]) if todo and todo[0] == mark["table"] else None
        return _SnapshotPlan(kept, todo, int(mark["max_seq"]), after)

    async def _snapshot(self, plan: _SnapshotPlan) -> AsyncIterator[Transaction]:
        """Snapshot batches; each batch is yielded once the next one is read, so the last one
        (marked done) leaves after the read transaction has ended."""
        max_seq, read_at = await self._db.run(lambda conn: _begin_read(conn, plan.max_seq))
        held: Transaction | None = None
        try:
            for index, table in enumerate(plan.todo):
                after = plan.after if index == 0 else None
                while self.is_open:
                    page = await self._db.run(functools.partial(
                        self._snapshot_page, table=table, after=after, max_seq=max_seq, read_at=read_at))
                    if page is None:
                        break
                    changes, after, full = page
                    mark = _mark(plan.tables, max_seq, table, after, done=False)
                    if held is not None:
                        yield held
                    held = Transaction(changes, None, read_at, snapshot_mark=mark)
                    if not full:
                        break
        finally:
            if self.is_open:
                await self._db.run(lambda conn: conn.execute("COMMIT"))
        if not self.is_open:
            return
        self._after_seq = max_seq
        if held is None:
            done = _mark(plan.tables, max_seq, None, None, done=True)
            yield Transaction((), None, read_at, snapshot_mark=done)
            return
        assert isinstance(held.snapshot_mark, dict)
        yield Transaction(held.changes, None, read_at, snapshot_mark={**held.snapshot_mark, "done": True})

    def _snapshot_page(self, conn: sqlite3.Connection, table: str, after: list[Any] | None, max_seq: int,
                       read_at: datetime) -> tuple[tuple[Change, ...], list[Any], bool] | None:
        reader = self._readers[table]
        shape = reader.shape
        batch = self.settings.batch_size
        params = [*(after or ()), batch]
        rows = conn.execute(shape.select_sql(after_key=after is not None), params).fetchall()
        if not rows:
            return None
        width = len(shape.key_columns)
        captured_at = time.time()
        changes: list[Change] = []
        for row in rows:
            try:
                image = reader.normalise(orjson.loads(row[width]))
                changes.append(Change.of_row(
                    entity_type=table, op=Op.INSERT, key_columns=shape.key_columns, after=image,
                    version=Version(max_seq, SNAPSHOT_ORDINAL), commit_time=read_at, captured_at=captured_at,
                    read=True))
            except (orjson.JSONDecodeError, InvalidChange) as exc:
                log.error("%s row %r cannot become a change and is skipped: %s", table, row[:width], exc)
        return tuple(changes), list(rows[-1][:width]), len(rows) == batch

    async def confirm_snapshot(self, mark: JsonValue) -> None:
        """Store the snapshot's progress; once it is done, delete the outbox rows it covered."""
        self._check_open()
        if not _is_mark(mark):
            raise SourceError(f"{mark!r} is not a snapshot mark of the SQLite source")
        assert isinstance(mark, dict)
        await self._checkpoints.put_checkpoint(self._checkpoint_name, mark)
        if mark["done"]:
            await self._delete_through(int(mark["max_seq"]))

    async def _delete_through(self, seq: int) -> None:
        await self._db.write(lambda conn: conn.execute(f"DELETE FROM {OUTBOX} WHERE seq <= ?", (seq,)))


def _begin_read(conn: sqlite3.Connection, max_seq: int | None) -> tuple[int, datetime]:
    """Start the snapshot's read transaction; the outbox's last sequence number in it."""
    conn.execute("BEGIN")
    try:
        last = int(conn.execute(_LAST_SEQ, (OUTBOX,)).fetchone()[0])
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    return (last if max_seq is None else max_seq), datetime.now(UTC)


def _changes(reader: RowReader, op: Op, version: Version, commit_time: datetime,
             before: dict[str, Any] | None, after: dict[str, Any] | None, captured_at: float) -> list[Change]:
    shape = reader.shape
    before_row = reader.normalise(before) if before is not None else None
    after_row = reader.normalise(after) if after is not None else None

    def change(op: Op, ordinal: int, after: Row | None, before: Row | None) -> Change:
        return Change.of_row(entity_type=shape.name, op=op, key_columns=shape.key_columns,
                             version=Version(version.lsn, ordinal), commit_time=commit_time,
                             after=after, before=before, captured_at=captured_at)

    if (op is Op.UPDATE and before_row is not None and after_row is not None
            and any(before_row.get(c) != after_row.get(c) for c in shape.key_columns)):
        return [change(Op.DELETE, 0, None, before_row), change(Op.INSERT, 1, after_row, None)]
    return [change(op, 0, after_row, before_row)]


def _mark(tables: Sequence[str], max_seq: int, table: str | None, after: list[Any] | None, *,
          done: bool) -> dict[str, JsonValue]:
    return {"source": "sqlite", "tables": list(tables), "max_seq": max_seq, "table": table,
            "after": _encode_key(after), "done": done}


def _is_mark(value: JsonValue) -> bool:
    return (isinstance(value, dict) and value.get("source") == "sqlite"
            and {"tables", "max_seq", "table", "after", "done"} <= value.keys())


# Raw key values go into marks as JSON; a BLOB key as {"blob": hex} so it compares as a BLOB again.
def _encode_key(key: list[Any] | None) -> list[JsonValue] | None:
    if key is None:
        return None
    return [{"blob": bytes(v).hex()} if isinstance(v, bytes | memoryview) else v for v in key]


def _decode_key(key: JsonValue) -> list[Any] | None:
    if key is None:
        return None
    if not isinstance(key, list):
        raise SourceError(f"snapshot mark key {key!r} is not a list")
    return [bytes.fromhex(v["blob"]) if isinstance(v, dict) else v for v in key]
