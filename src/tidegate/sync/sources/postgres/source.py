"""The PostgreSQL change source: an initial snapshot, then logical replication (pgoutput).

    setup()        publication FOR TABLE the configured tables; the slot, created together with
                   an exported snapshot when the checkpoint store has no record of it
    snapshot       every row of every table in key order, in batches, versioned just below the
                   slot's consistent point; resumable from the last batch confirmed
    stream         committed transactions from the slot, read on a thread (psycopg2 blocks)
    backfills      a table re-read after its columns changed (tidegate.sync.backfill), between
                   the stream's transactions
    confirm(lsn)   the only way the slot's flush position moves

The checkpoint `pg:<slot>` in the checkpoint store (kept next to the cache) records the slot's
consistent point, the snapshot's progress and the shape (columns and types) the cache's rows of
each table are in. Without it the cache cannot be trusted to hold the snapshot, so the slot is
dropped and everything is read again.

The configured tables are the ones followed. One configured later (not in the checkpoint yet) is
added to the publication and read like the snapshot before the stream resumes. One dropped while
followed loses its cached rows (the database has none) with a warning, and is followed again once
re-created; at start, a configured table that does not exist is refused unless the checkpoint knows
it (then it is the dropped case). Tables added to the publication by hand but not configured are
ignored.

Beside this module: `settings` (settings, status, connecting), `snapshot` (the snapshot's read
transaction), `stream` (the replication reader and the transactions it assembles), `schemas` (the
schema watch), `readback` (rows read back by key for the fill), `catalog` (the catalog queries).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Sequence
from datetime import tzinfo
from typing import Any

from tidegate._lifecycle import Lifecycle
from tidegate.errors import SourceError
from tidegate.sync.backfill import (
    BackfillRequest,
    Shape,
    decode_shape,
    encode_shape,
    read_batch,
    row_changes,
    shapes_of_catalog,
)
from tidegate.sync.changes import MAX_ORDINAL, Change, Op, Version
from tidegate.sync.contracts import CheckpointStore, Transaction
from tidegate.sync.fill import RowsRead
from tidegate.sync.sources.postgres import catalog as pg_catalog
from tidegate.sync.sources.postgres.catalog import SlotInfo, TableInfo
from tidegate.sync.sources.postgres.driver import psycopg2
from tidegate.sync.sources.postgres.pgoutput import parse_lsn
from tidegate.sync.sources.postgres.readback import RowReadback
from tidegate.sync.sources.postgres.schemas import SchemaWatch
from tidegate.sync.sources.postgres.settings import (
    CHECKPOINT_PREFIX,
    PostgresSourceSettings,
    SourceStatus,
    catalog_errors,
    connect,
    connection_params,
    describe,
)
from tidegate.sync.sources.postgres.snapshot import SnapshotReader
from tidegate.sync.sources.postgres.stream import ReplicationReader, TransactionAssembler, document_key
from tidegate.sync.values import JsonValue, source_zone

__all__ = ["PostgresSource", "PostgresSourceSettings", "SourceStatus"]

logger = logging.getLogger(__name__)

# Longest close() waits for the replication thread (it notices a stop within a poll interval,
# unless a call to an unresponsive server holds it; it is a daemon thread and dies with the process).
READER_STOP_TIMEOUT_S = 10.0
# Tables already warned about in this process (slot, table): the warning is for start-up, not
# for every restart of the source after a lost connection.
_warned_toast: set[tuple[str, str]] = set()
class PostgresSource(Lifecycle):
    """`ChangeSource` over PostgreSQL logical replication. An async context manager: entering it
    runs `setup()`; `transactions()` yields the snapshot (when one is due), then the stream."""

    unavailable_error = SourceError
    what = "this PostgreSQL source"

    def __init__(self, settings: PostgresSourceSettings, checkpoints: CheckpointStore) -> None:
        super().__init__()
        self.settings = settings
        self._checkpoints = checkpoints
        self._checkpoint_key = CHECKPOINT_PREFIX + settings.slot_name
        self._zone: tzinfo = source_zone(settings.source_zone)
        self._params = connection_params(settings.dsn)
        self._where = describe(self._params)
        self._tables: list[TableInfo] = []
        self._shapes: dict[str, Shape | None] = {}  # entity type → shape in the catalog at setup
        self._gone: list[str] = []  # configured tables followed before and dropped since
        self._base_types: dict[int, int] = {}
        self._checkpoint: dict[str, Any] | None = None
        # The replication connection that created the slot, kept open (and idle) while its
        # exported snapshot is still to be imported by the snapshot reader.
        self._exporter: Any = None
        self._snapshot_name: str | None = None
        self._reader: ReplicationReader | None = None
        self._assembler: TransactionAssembler | None = None
        self._snapshot_reader: SnapshotReader | None = None
        self._confirmed_lsn = 0
        self._repeatable: frozenset[str] = frozenset()  # tables with a deferrable unique key
        self._readback = RowReadback(lambda: self._connect(replication=False), self._where,
                                     settings.slot_name, self._zone)
        self._iterated = False

    async def _open(self) -> None:
        try:
            await self.setup()
        except BaseException:
            await self._close()  # what setup() connected before it failed
            raise

    async def close(self) -> None:
        """Stop the replication thread and close every connection. Idempotent."""
        was_open = self.is_open
        await super().close()
        if not was_open:  # setup() runs without open() too: what it connected goes as well
            await self._close()

    async def _close(self) -> None:
        await self._close_snapshot_reader()
        await self._stop_reader()
        await asyncio.to_thread(self._close_exporter)
        await asyncio.to_thread(self._readback.close)

    # ------------------------------------------------------------------ setup

    async def setup(self) -> None:
        """Check the tables, create or complete the publication and make sure the slot exists
        with a checkpoint describing it. Idempotent."""
        checkpoint = await self._checkpoints.get_checkpoint(self._checkpoint_key)
        known = set(checkpoint.get("shapes") or ()) if isinstance(checkpoint, dict) else set()
        slot = await asyncio.to_thread(self._inspect_and_publish, known)
        if slot is not None and isinstance(checkpoint, dict):
            self._checkpoint = self._reconcile(checkpoint, slot)
            await self._checkpoints.put_checkpoint(self._checkpoint_key, self._checkpoint)
            return
        if slot is not None:
            logger.warning(
                "replication slot %s exists but the checkpoint store has no record of it (an "
                "empty cache): dropping it and taking a new snapshot", self.settings.slot_name)
        elif checkpoint is not None:
            logger.warning(
                "replication slot %s is gone although the checkpoint store knows it: creating it "
                "again with a new snapshot; rows deleted while it was missing may remain cached",
                self.settings.slot_name)
        consistent_point = await asyncio.to_thread(self._create_slot, slot is not None)
        self._checkpoint = {"consistent_point": consistent_point, "tables_done": [],
                            "table": None, "after": None, "snapshot_done": False,
                            "shapes": {name: encode_shape(shape) for name, shape in self._shapes.items()}}
        await self._checkpoints.put_checkpoint(self._checkpoint_key, self._checkpoint)

    def _reconcile(self, checkpoint: dict[str, Any], slot: SlotInfo) -> dict[str, Any]:
        """The checkpoint for this run's configured tables: a table configured since the last run
        is to be read like the snapshot (the stream never carried its older rows); a table no
        longer configured is forgotten (configured again later, it is read again).

        A late table's read is versioned at (the slot's confirmed position, top ordinal), after
        a TRUNCATE just below it: above whatever the cache still holds of the table from an
        earlier time it was configured (rows deleted since must go), below every change the
        stream will carry (it resumes after that position; the read is newer than any change it
        replays, which then converge as after a backfill, see tidegate.sync.backfill)."""
        recorded = dict(checkpoint.get("shapes") or {})
        if "shapes" not in checkpoint:  # written before shapes were recorded: take the catalog's
            recorded = {name: encode_shape(shape) for name, shape in self._shapes.items()}
        shapes = {name: recorded[name] if name in recorded else encode_shape(shape)
                  for name, shape in self._shapes.items()}
        done = [name for name in checkpoint.get("tables_done") or () if name in recorded]
        present = {table.entity_type for table in self._tables}
        new = sorted(present - set(recorded))
        if new:
            logger.info("table(s) %s newly configured for slot %s: reading their rows before "
                        "the stream resumes", ", ".join(new), self.settings.slot_name)
        start = slot.confirmed_flush_lsn or int(checkpoint["consistent_point"])
        late = {name: lsn for name, lsn in (checkpoint.get("late") or {}).items()
                if name in present and name not in done}
        late.update((name, start) for name in new)
        return {**checkpoint, "shapes": shapes, "tables_done": done, "late": late,
                "snapshot_done": bool(checkpoint.get("snapshot_done")) and present <= set(done)}

    def _inspect_and_publish(self, known: set[str]) -> SlotInfo | None:
        with contextlib.closing(self._connect(replication=False)) as conn, conn.cursor() as cur, \
                catalog_errors(f"setting up the publication and slot at {self._where}"):
            cur.execute("SELECT current_setting('wal_level'), current_database()")
            wal_level, database = cur.fetchone()
            if wal_level != "logical":
                raise SourceError(
                    f"PostgreSQL at {self._where} has wal_level={wal_level}: logical replication "
                    "needs wal_level = logical (postgresql.conf) and a server restart"
                )
            catalog = shapes_of_catalog(cur, self.settings.tables)
            self._shapes = {pg_catalog.entity_type_of_name(name): shape for name, shape in catalog.items()}
            gone = [name for name, shape in catalog.items()
                    if shape is None and pg_catalog.entity_type_of_name(name) in known]
            for name in gone:
                logger.warning("configured table %s was dropped: its cached rows are removed; it "
                               "is followed again if it is created again", name)
            self._gone = gone
            self._tables = pg_catalog.inspect_tables(
                cur, [name for name in self.settings.tables if name not in gone])
            self._base_types = pg_catalog.base_types(cur)
            self._repeatable = pg_catalog.deferrable_keys(cur, self._tables)
            fresh = [t for t in self._tables
                     if (self.settings.slot_name, t.entity_type) not in _warned_toast]
            pg_catalog.warn_toast_risk(fresh)
            _warned_toast.update((self.settings.slot_name, t.entity_type) for t in fresh)
            if self._tables:
                pg_catalog.ensure_publication(cur, self.settings.publication_name, self._tables)
            slot = pg_catalog.slot_info(cur, self.settings.slot_name)
            if slot is not None and (slot.plugin != "pgoutput" or slot.database != database):
                raise SourceError(
                    f"replication slot {slot.name} belongs to plugin {slot.plugin!r} in database "
                    f"{slot.database!r}, not pgoutput in {database!r}: choose another slot name"
                )
            return slot

    def _create_slot(self, drop_first: bool) -> int:
        """Create the slot with an exported snapshot; the exporting connection stays open (it
        must stay idle for the snapshot to remain importable). Returns the consistent point."""
        self._close_exporter()
        if drop_first:
            with contextlib.closing(self._connect(replication=False)) as conn, conn.cursor() as cur, \
                    catalog_errors(f"dropping slot {self.settings.slot_name}"):
                pg_catalog.drop_slot(cur, self.settings.slot_name)
        exporter = self._connect(replication=True)
        try:
            cur = exporter.cursor()
            cur.execute(f"CREATE_REPLICATION_SLOT {self.settings.slot_name} LOGICAL pgoutput "
                        "EXPORT_SNAPSHOT")
            _, consistent_point, snapshot_name, _ = cur.fetchone()
        except psycopg2.Error as exc:
            exporter.close()
            raise SourceError(f"cannot create replication slot {self.settings.slot_name} at "
                              f"{self._where}: {exc}".strip()) from exc
        self._exporter, self._snapshot_name = exporter, snapshot_name
        logger.info("created replication slot %s at %s", self.settings.slot_name, consistent_point)
        return parse_lsn(consistent_point)

    def _close_exporter(self) -> None:
        exporter, self._exporter, self._snapshot_name = self._exporter, None, None
        if exporter is not None:
            with contextlib.suppress(psycopg2.Error):
                exporter.close()

    # ------------------------------------------------------------------ transactions

    async def transactions(self) -> AsyncIterator[Transaction]:
        """The snapshot's batches when it is not done, then the committed transactions."""
        if self._iterated:
            raise SourceError("transactions() of a PostgresSource may be iterated only once")
        if self._checkpoint is None or not self.is_open:
            raise SourceError("open the source first: `async with PostgresSource(...)`")
        self._iterated = True
        try:
            if not self._checkpoint.get("snapshot_done"):
                async for batch in self._snapshot(dict(self._checkpoint)):
                    yield batch
            async for transaction in self._stream():
                yield transaction
        finally:
            # The replication reader stays until close(): the pipeline's drain confirms what it
            # applied after it stopped iterating, and the reader sends that before it ends.
            await self._close_snapshot_reader()

    async def confirm(self, position: int) -> None:
        """Everything up to `position` is applied: the slot may release it. The reader reports
        it to the server at once (within its poll interval), and again when it stops."""
        if position > self._confirmed_lsn:
            self._confirmed_lsn = position
            if self._reader is not None:
                self._reader.confirmed_lsn = position

    async def confirm_snapshot(self, mark: JsonValue) -> None:
        """Every snapshot batch up to the one carrying `mark` is applied: record the progress."""
        if self._checkpoint is None:
            raise SourceError("confirm_snapshot before the source was set up")
        if isinstance(mark, dict) and "backfill" in mark:
            await self._confirm_backfill(mark)
            return
        names = {table.entity_type for table in self._tables}
        if not isinstance(mark, dict) or mark.get("table") not in names:
            raise SourceError(f"{mark!r} is not a snapshot mark of this source")
        checkpoint = dict(self._checkpoint)
        table = mark["table"]
        if mark.get("done"):
            done = [*checkpoint.get("tables_done", []), table]
            checkpoint.update(tables_done=list(dict.fromkeys(done)), table=None, after=None,
                              snapshot_done=names <= set(done))
        else:
            checkpoint.update(table=table, after=mark.get("after"))
        self._checkpoint = checkpoint
        await self._checkpoints.put_checkpoint(self._checkpoint_key, checkpoint)

    async def _confirm_backfill(self, mark: dict[str, JsonValue]) -> None:
        """A backfill's batch is applied; once its last one is, the cache's rows of that table
        are in the backfill's shape: record it (a restart compares the catalog with it)."""
        if not mark.get("done") or self._checkpoint is None:
            return
        shapes = dict(self._checkpoint.get("shapes") or {})
        shapes[str(mark["backfill"])] = mark.get("shape")
        self._checkpoint = {**self._checkpoint, "shapes": shapes}
        await self._checkpoints.put_checkpoint(self._checkpoint_key, self._checkpoint)

    # ------------------------------------------------------------------ snapshot

    async def _snapshot(self, checkpoint: dict[str, Any]) -> AsyncIterator[Transaction]:
        """Every row of the tables not yet done, in key order, as INSERTs.

        All carry version (consistent point - 1, 0): above every commit the snapshot contains,
        below every commit the slot streams (a commit record may start exactly at the consistent
        point, so the point itself would tie with the stream's first change).

        With the snapshot the slot exported, the rows are exactly those of the consistent point.
        Resuming after a restart, that snapshot is gone and a fresh REPEATABLE READ read is taken
        instead, from the last confirmed key on. It converges all the same. The stream resumes
        at the slot's confirmed position, and everything committed before that position (and
        after the consistent point) was streamed and applied already: every commit after the
        consistent point reaches the cache through the stream, with a version above the
        snapshot's, so where the fresh read shows a newer row than the exported snapshot would
        have, the stream's version of it wins anyway; a row deleted since is absent from the
        read and its DELETE comes (or came) through the stream.
        """
        version = Version(int(checkpoint["consistent_point"]) - 1, 0)
        done_tables = set(checkpoint.get("tables_done") or ())
        pending = [table for table in self._tables if table.entity_type not in done_tables]
        if not pending:
            return
        snapshot_name = self._snapshot_name
        if snapshot_name is None:
            logger.info("resuming the snapshot of slot %s with a fresh read (table %s after %s)",
                        self.settings.slot_name, checkpoint.get("table"), checkpoint.get("after"))
        self._snapshot_reader = await asyncio.to_thread(
            lambda: SnapshotReader.open(self._connect(replication=False), snapshot_name))
        await asyncio.to_thread(self._close_exporter)  # imported (or never there): let it go
        size = self.settings.snapshot_batch_size
        late = checkpoint.get("late") or {}
        for index, table in enumerate(pending):
            after = checkpoint.get("after") if checkpoint.get("table") == table.entity_type else None
            start = late.get(table.entity_type)
            table_version = version if start is None else Version(int(start), MAX_ORDINAL)
            done = False
            while not done:
                first = after is None
                changes, after = await asyncio.to_thread(
                    self._snapshot_batch, self._snapshot_reader, table, after, size, table_version)
                done = len(changes) < size
                if first and start is not None:  # what an earlier time left of it goes first
                    assert self._snapshot_reader is not None
                    changes = (Change.of_row(
                        entity_type=table.entity_type, op=Op.TRUNCATE, key_columns=table.key_columns,
                        version=Version(int(start), MAX_ORDINAL - 1),
                        commit_time=self._snapshot_reader.as_of), *changes)
                if done and index == len(pending) - 1:
                    # End the read transaction before the consumer takes the last batch: it
                    # holds the tables' locks (a TRUNCATE or ALTER would wait on it).
                    await self._close_snapshot_reader()
                yield Transaction(changes, position=None, snapshot_mark={
                    "table": table.entity_type, "after": after, "done": done})

    async def _close_snapshot_reader(self) -> None:
        reader, self._snapshot_reader = self._snapshot_reader, None
        if reader is not None:
            await asyncio.to_thread(reader.close)

    def _snapshot_batch(self, reader: SnapshotReader | None, table: TableInfo,
                        after: list[str | None] | None, size: int,
                        version: Version) -> tuple[tuple[Change, ...], list[str | None] | None]:
        """The next batch's changes and the key (as text) of its last row."""
        if reader is None:
            raise SourceError("the snapshot read was closed")
        rows = reader.batch(table, after, size)
        changes = row_changes(table, rows, version, reader.as_of, self._base_types, self._zone,
                               document_key(table, self._base_types))
        if rows:
            after = [rows[-1][column] for column in table.key_columns]
        return tuple(changes), after

    # ------------------------------------------------------------------ stream

    async def _stream(self) -> AsyncIterator[Transaction]:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[list[Transaction] | BaseException] = asyncio.Queue()  # bounded by the reader
        assert self._checkpoint is not None
        recorded = self._checkpoint.get("shapes") or {}
        assembler = TransactionAssembler(
            self._tables, self._zone, self._base_types,
            shapes={name: decode_shape(recorded.get(name)) for name in self._shapes})
        self._reader = ReplicationReader(
            connect=lambda replication: self._connect(replication=replication),
            slot_name=self.settings.slot_name, publication=self.settings.publication_name,
            assembler=assembler, loop=loop, queue=queue,
            status_interval_s=self.settings.status_interval_s, heartbeat_s=self.settings.heartbeat_s,
            max_pending=self.settings.max_pending_transactions,
        )
        self._assembler = assembler
        for name in self._gone:  # known by name only, so their removal can be streamed
            schema, table = pg_catalog.split_table_name(name)
            assembler.follow(TableInfo(schema, table, 0, (), {}, (), (), "d", ()))
        self._reader.confirmed_lsn = self._confirmed_lsn
        self._reader.start()
        watch = SchemaWatch(lambda: self._connect(replication=False), self._where, self.settings)
        watcher = asyncio.create_task(watch.run(assembler), name="pg-schema-watch")
        try:
            while True:
                item = await queue.get()
                if isinstance(item, BaseException):
                    if isinstance(item, SourceError):
                        raise item
                    raise SourceError(
                        f"replication from slot {self.settings.slot_name} at {self._where} failed: "
                        f"{type(item).__name__}: {item}".strip()
                    ) from item
                self._reader.taken(len(item))
                for transaction in item:
                    yield transaction
                    for request in assembler.take_backfills(transaction.position):
                        async for batch in self._backfill(request):
                            yield batch
        finally:
            watcher.cancel()
            await asyncio.gather(watcher, return_exceptions=True)

    async def _backfill(self, request: BackfillRequest) -> AsyncIterator[Transaction]:
        """The table's rows re-read in key order, batch by batch, at the request's version (see
        tidegate.sync.backfill); each batch is marked so the last one records the shape."""
        logger.info("table %s changed (%s): re-reading its rows at version %s", request.table,
                    request.reason, request.version)
        mark: dict[str, JsonValue] = {"backfill": request.entity_type,
                                      "shape": encode_shape(request.shape)}
        if request.shape is None:
            yield Transaction((), position=None, snapshot_mark={**mark, "after": None, "done": True})
            return
        conn = await asyncio.to_thread(self._connect, replication=False)
        try:
            after: list[str | None] | None = None
            size = self.settings.snapshot_batch_size
            while True:
                changes, after, table = await asyncio.to_thread(
                    read_batch, conn, request, after, size, self._base_types, self._zone,
                    lambda table: document_key(table, self._base_types))
                done = table is None or len(changes) < size
                yield Transaction(tuple(changes), position=None,
                                  snapshot_mark={**mark, "after": after, "done": done})
                if done:
                    return
        finally:
            await asyncio.to_thread(conn.close)

    async def _stop_reader(self) -> None:
        reader, self._reader = self._reader, None
        if reader is not None:
            reader.stop()
            await asyncio.to_thread(reader.join, READER_STOP_TIMEOUT_S)

    # ------------------------------------------------------------------ reading rows back

    def keys_may_repeat(self, entity_type: str) -> bool:
        """True when the table has a DEFERRABLE unique key: inside a transaction two rows may
        share a key, so images by key are not enough to fill unchanged columns."""
        return entity_type in self._repeatable

    async def read_rows(self, entity_type: str, keys: Sequence[Sequence[str]],
                        columns: Sequence[str], *, xid: int | None = None) -> RowsRead:
        """The current committed values of `columns` (and the key) of the rows with `keys`
        (each key's values as the server's text), as canonical rows by entity id, with the WAL
        insert position at the read: no commit at or after it is visible to the read. With `xid`
        (the transaction whose change asks), once that transaction is visible to the read (see
        `readback`)."""
        table = self._current_table(entity_type)
        if table is None:
            raise SourceError(f"{entity_type} is not a table of this source")
        return await self._readback.read(table, keys, columns, self._base_types, xid=xid)

    def _current_table(self, entity_type: str) -> TableInfo | None:
        """The table as the stream knows it now (after schema changes), else as at setup."""
        current = self._assembler.table(entity_type) if self._assembler is not None else None
        return current or next((t for t in self._tables if t.entity_type == entity_type), None)

    # ------------------------------------------------------------------ connections

    def _connect(self, *, replication: bool) -> Any:
        return connect(self._params, replication=replication)

    # ------------------------------------------------------------------ status

    async def status(self) -> SourceStatus:
        """The slot's position and lag, and the tables' row counts; needs no `setup()`."""
        slot, current, rows = await asyncio.to_thread(self._read_status)
        checkpoint = await self._checkpoints.get_checkpoint(self._checkpoint_key)
        confirmed = slot.confirmed_flush_lsn if slot is not None else None
        return SourceStatus(
            slot_name=self.settings.slot_name, slot_exists=slot is not None,
            active=bool(slot and slot.active), confirmed_flush_lsn=confirmed,
            restart_lsn=slot.restart_lsn if slot is not None else None, current_lsn=current,
            lag_bytes=current - confirmed if confirmed is not None else None, table_rows=rows,
            snapshot_done=bool(checkpoint.get("snapshot_done")) if isinstance(checkpoint, dict) else None,
        )

    def _read_status(self) -> tuple[SlotInfo | None, int, dict[str, int]]:
        with contextlib.closing(self._connect(replication=False)) as conn, conn.cursor() as cur, \
                catalog_errors(f"reading the status at {self._where}"):
            present = [name for name, shape in shapes_of_catalog(cur, self.settings.tables).items()
                       if shape is not None]
            tables = pg_catalog.inspect_tables(cur, present)
            slot = pg_catalog.slot_info(cur, self.settings.slot_name)
            cur.execute("SELECT pg_current_wal_lsn()::text")
            current = parse_lsn(cur.fetchone()[0])
            return slot, current, pg_catalog.row_estimates(cur, tables)
