"""The SQLite change source: triggers and outbox to Changes, snapshot and resume, and the demo shop."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import itertools
import logging
import sqlite3
import sys
from collections.abc import AsyncIterator, Iterable, Sequence
from pathlib import Path
from typing import Any

import pytest

from tidegate.demo.shop import SHOP_TABLES, ShopLoad, categories_of, create_shop
from tidegate.errors import ConfigError, SourceError
from tidegate.sync.changes import Change, Op, Version, entity_id_of
from tidegate.sync.contracts import Transaction
from tidegate.sync.sources.sqlite.capture import OUTBOX, drop_triggers, install_triggers, read_shape
from tidegate.sync.sources.sqlite.source import SNAPSHOT_ORDINAL, SqliteSource, SqliteSourceSettings
from tidegate.sync.values import JsonValue, Row, canonical, checksum, normalise_timestamp, source_zone

WAIT_S = 20.0  # liveness bound for changes to arrive; never a speed assertion


class MemoryCheckpoints:
    """A CheckpointStore in a dict, as an in-memory entity cache keeps them."""

    def __init__(self) -> None:
        self.values: dict[str, JsonValue] = {}

    async def get_checkpoint(self, name: str) -> JsonValue:
        return self.values.get(name)

    async def put_checkpoint(self, name: str, value: JsonValue) -> None:
        self.values[name] = value


class Cache:
    """The versioned state a cache would hold: a change applies only when its version is newer."""

    def __init__(self) -> None:
        self.entries: dict[tuple[str, str], tuple[Version, Row | None]] = {}

    def apply(self, changes: Iterable[Change]) -> None:
        for change in changes:
            ident = (change.entity_type, change.entity_id)
            held = self.entries.get(ident)
            if held is not None and held[0] >= change.version:
                continue
            self.entries[ident] = (change.version, None if change.op is Op.DELETE else change.after)

    def rows(self, table: str) -> dict[str, Row]:
        return {ident: row for (kind, ident), (_, row) in self.entries.items()
                if kind == table and row is not None}


# ---------------------------------------------------------------------- helpers


def execute(path: Path, *statements: str | tuple[str, Sequence[Any]]) -> None:
    """Run statements in one transaction on a connection of their own, as an application would."""
    conn = sqlite3.connect(path, isolation_level=None, timeout=30)
    try:
        conn.execute("BEGIN IMMEDIATE")
        for statement in statements:
            sql, params = (statement, ()) if isinstance(statement, str) else statement
            conn.execute(sql, params)
        conn.execute("COMMIT")
    finally:
        conn.close()


def query(path: Path, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
    conn = sqlite3.connect(path, timeout=30)
    try:
        return conn.execute(sql, params).fetchall()
    finally:
        conn.close()


def read_back(path: Path, table: str, key_columns: Sequence[str], timestamps: Sequence[str] = (),
              zone: str | None = None) -> dict[str, Row]:
    """The table as the database holds it: canonical rows by entity id, timestamps normalised."""
    conn = sqlite3.connect(path, timeout=30)
    conn.row_factory = sqlite3.Row
    try:
        rows = [dict(r) for r in conn.execute(f"SELECT * FROM {table}")]
    finally:
        conn.close()
    result = {}
    for raw in rows:
        for column in timestamps:
            if raw[column] is not None:
                raw[column] = normalise_timestamp(raw[column], source_zone(zone))
        row = canonical(raw)
        result[entity_id_of(row, key_columns)] = row
    return result


def settings(path: Path, *tables: str, **options: Any) -> SqliteSourceSettings:
    return SqliteSourceSettings(path=str(path), tables=tables, poll_interval_s=0.005, **options)


Streaming = tuple[SqliteSource, AsyncIterator[Transaction]]


@contextlib.asynccontextmanager
async def streaming(config: SqliteSourceSettings, store: MemoryCheckpoints) -> AsyncIterator[Streaming]:
    async with SqliteSource(config, store) as source:
        stream: Any = source.transactions()  # an async generator: closed here, not left to the collector
        try:
            yield source, stream
        finally:
            await stream.aclose()


async def take(stream: AsyncIterator[Transaction], changes: int) -> list[Transaction]:
    """Transactions until at least `changes` changes arrived."""
    taken: list[Transaction] = []
    async with asyncio.timeout(WAIT_S):
        while sum(len(t.changes) for t in taken) < changes:
            taken.append(await anext(stream))
    return taken


async def finish_snapshot(source: SqliteSource, stream: AsyncIterator[Transaction]) -> list[Change]:
    """Consume and confirm the snapshot; its changes."""
    changes: list[Change] = []
    async with asyncio.timeout(WAIT_S):
        while True:
            transaction = await anext(stream)
            assert transaction.snapshot_mark is not None, "a stream transaction before the snapshot ended"
            assert transaction.position is None
            changes.extend(transaction.changes)
            await source.confirm_snapshot(transaction.snapshot_mark)
            assert isinstance(transaction.snapshot_mark, dict)
            if transaction.snapshot_mark["done"]:
                return changes


def changes_of(transactions: Iterable[Transaction]) -> list[Change]:
    return [change for transaction in transactions for change in transaction.changes]


def outbox_seqs(path: Path) -> list[int]:
    return [seq for (seq,) in query(path, f"SELECT seq FROM {OUTBOX} ORDER BY seq")]


@pytest.fixture
def db(tmp_path: Path) -> Path:
    path = tmp_path / "app.db"
    execute(path, "CREATE TABLE items (id TEXT PRIMARY KEY, name TEXT, price NUMERIC, stock INTEGER, "
                  "ratio REAL, tags TEXT, picture BLOB, updated_at TIMESTAMP)")
    return path


# ---------------------------------------------------------------------- row changes


async def test_insert_update_delete_arrive_as_changes_with_canonical_images(db: Path) -> None:
    async with streaming(settings(db, "items"), MemoryCheckpoints()) as (source, stream):
        assert await finish_snapshot(source, stream) == []

        execute(db, ("INSERT INTO items VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                     ("a1", "Lantern", 2.55, 7, 0.1 + 0.2, '["lighting","love"]', b"\x00\xffpng",
                      "2024-05-01T10:00:00Z")))
        [inserted] = changes_of(await take(stream, 1))
        row = read_back(db, "items", ["id"], ["updated_at"])["a1"]
        assert inserted.op is Op.INSERT and inserted.entity_type == "items" and inserted.entity_id == "a1"
        assert inserted.key == {"id": "a1"}
        assert inserted.after == row
        assert inserted.after["ratio"] == 0.1 + 0.2  # every digit of a REAL survives
        assert inserted.after["picture"] == "00ff706e67"
        assert inserted.after["tags"] == '["lighting","love"]'  # JSON text stays text
        assert inserted.after["updated_at"] == "2024-05-01T10:00:00.000000Z"
        assert inserted.before is None
        assert inserted.checksum == checksum(row)
        assert inserted.commit_time.utcoffset() is not None and inserted.xid is None

        execute(db, "UPDATE items SET price = 3.1, stock = NULL WHERE id = 'a1'")
        [updated] = changes_of(await take(stream, 1))
        assert updated.op is Op.UPDATE and updated.entity_id == "a1"
        assert updated.before == row
        assert updated.after == read_back(db, "items", ["id"], ["updated_at"])["a1"]
        assert updated.after["price"] == 3.1 and updated.after["stock"] is None
        assert updated.checksum == checksum(updated.after)
        assert updated.version > inserted.version

        execute(db, "DELETE FROM items WHERE id = 'a1'")
        [deleted] = changes_of(await take(stream, 1))
        assert deleted.op is Op.DELETE and deleted.entity_id == "a1" and deleted.after is None
        assert deleted.before == updated.after
        assert deleted.checksum == checksum(updated.after)
        assert deleted.version > updated.version


async def test_versions_and_positions_follow_the_outbox(db: Path) -> None:
    async with streaming(settings(db, "items"), MemoryCheckpoints()) as (source, stream):
        await finish_snapshot(source, stream)
        execute(db, "INSERT INTO items (id) VALUES ('x')")
        [transaction] = await take(stream, 1)
        [seq] = outbox_seqs(db)
        assert transaction.position == seq
        assert transaction.changes[0].version == Version(seq, 0)
        assert transaction.commit_time == transaction.changes[0].commit_time


async def test_composite_keys_and_a_key_change_is_a_delete_and_an_insert(tmp_path: Path) -> None:
    path = tmp_path / "orders.db"
    execute(path, "CREATE TABLE order_lines (order_id TEXT, line INTEGER, qty INTEGER, "
                  "PRIMARY KEY (order_id, line))")
    async with streaming(settings(path, "order_lines"), MemoryCheckpoints()) as (source, stream):
        await finish_snapshot(source, stream)
        execute(path, "INSERT INTO order_lines VALUES ('A1', 2, 5)")
        [inserted] = changes_of(await take(stream, 1))
        assert inserted.entity_id == '["A1",2]'
        assert inserted.key == {"order_id": "A1", "line": 2}
        assert inserted.after == {"order_id": "A1", "line": 2, "qty": 5}

        execute(path, "UPDATE order_lines SET line = 3 WHERE order_id = 'A1' AND line = 2")
        removed, added = changes_of(await take(stream, 2))
        assert (removed.op, removed.entity_id, removed.version.ordinal) == (Op.DELETE, '["A1",2]', 0)
        assert (added.op, added.entity_id, added.version.ordinal) == (Op.INSERT, '["A1",3]', 1)
        assert removed.version.lsn == added.version.lsn
        assert added.after == read_back(path, "order_lines", ["order_id", "line"])['["A1",3]']


async def test_a_table_without_primary_key_is_keyed_by_rowid(tmp_path: Path) -> None:
    path = tmp_path / "log.db"
    execute(path, "CREATE TABLE notes (body TEXT)", "INSERT INTO notes VALUES ('before')")
    async with streaming(settings(path, "notes"), MemoryCheckpoints()) as (source, stream):
        [snapshot] = await finish_snapshot(source, stream)
        assert (snapshot.entity_id, snapshot.after) == ("1", {"rowid": 1, "body": "before"})
        execute(path, "INSERT INTO notes VALUES ('after')")
        [change] = changes_of(await take(stream, 1))
        assert (change.entity_id, change.key) == ("2", {"rowid": 2})
        assert change.after == {"rowid": 2, "body": "after"}


async def test_a_table_wider_than_one_json_object_call(tmp_path: Path) -> None:
    path = tmp_path / "wide.db"
    columns = [f"c{n:03d}" for n in range(120)]  # json_object takes at most 100 arguments
    execute(path, f"CREATE TABLE wide (id INTEGER PRIMARY KEY, {', '.join(columns)})")
    async with streaming(settings(path, "wide"), MemoryCheckpoints()) as (source, stream):
        await finish_snapshot(source, stream)
        execute(path, (f"INSERT INTO wide VALUES (1, {', '.join('?' for _ in columns)})",
                       [None if n % 7 == 0 else n * 1.5 for n in range(len(columns))]))
        [change] = changes_of(await take(stream, 1))
    assert change.after == read_back(path, "wide", ["id"])["1"]
    assert len(change.after) == 121


async def test_timestamps_in_every_form_normalise_to_utc(tmp_path: Path,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "events.db"
    execute(path, "CREATE TABLE events (id INTEGER PRIMARY KEY, at TIMESTAMP, day DATE, seen TEXT, note)",
            "INSERT INTO events VALUES (0, '2024-03-01 12:00:00', '2024-03-01', '2024-03-01 12:00', 'x')")
    # `seen` is TEXT, a timestamp only because the settings say so; their list replaces what the
    # declared types say, so `at` is in it too.
    config = settings(path, "events", source_zone="Europe/Berlin",
                      timestamp_columns={"events": ("at", "seen")})
    forms: list[tuple[object, str]] = [
        ("2024-03-01 12:00:00", "2024-03-01T11:00:00.000000Z"),  # naive, Berlin winter time
        ("2024-07-01T12:00:00", "2024-07-01T10:00:00.000000Z"),  # naive, Berlin summer time
        ("2024-03-01T12:00:00+02:00", "2024-03-01T10:00:00.000000Z"),
        ("2024-03-01T12:00:00.250Z", "2024-03-01T12:00:00.250000Z"),
        (1709294400, "2024-03-01T12:00:00.000000Z"),  # epoch seconds
        (1709294400.5, "2024-03-01T12:00:00.500000Z"),
        (1709294400000, "2024-03-01T12:00:00.000000Z"),  # epoch milliseconds
        ("1709294400", "2024-03-01T12:00:00.000000Z"),
    ]
    async with streaming(config, MemoryCheckpoints()) as (source, stream):
        [snapshot] = await finish_snapshot(source, stream)
        assert snapshot.after == {"id": 0, "at": "2024-03-01T11:00:00.000000Z", "day": "2024-03-01",
                                  "seen": "2024-03-01T11:00:00.000000Z", "note": "x"}

        execute(path, *[("INSERT INTO events (id, at) VALUES (?, ?)", (n, value))
                        for n, (value, _) in enumerate(forms, start=1)])
        changes = changes_of(await take(stream, len(forms)))
        assert [c.after["at"] for c in changes if c.after] == [expected for _, expected in forms]

        # A DATE keeps its date, whatever time of day or zone comes with it.
        execute(path, "INSERT INTO events (id, day) VALUES (20, '2024-03-01 23:30:00')",
                "INSERT INTO events (id, day) VALUES (21, '2024-03-01')")
        assert [c.after["day"] for c in changes_of(await take(stream, 2)) if c.after] == ["2024-03-01"] * 2

        # A value that is no timestamp is passed on as written, and said so.
        with caplog.at_level(logging.WARNING, logger="tidegate.sync.sqlite"):
            execute(path, "INSERT INTO events (id, at) VALUES (30, 'soon')")
            [odd] = changes_of(await take(stream, 1))
        assert odd.after is not None and odd.after["at"] == "soon"
        assert "events.at" in caplog.text


async def test_many_rows_of_one_transaction_all_arrive_in_order(db: Path) -> None:
    async with streaming(settings(db, "items", batch_size=100), MemoryCheckpoints()) as (source, stream):
        await finish_snapshot(source, stream)
        execute(db, *[("INSERT INTO items (id, stock) VALUES (?, ?)", (f"i{n:04d}", n)) for n in range(450)])
        transactions = await take(stream, 450)
        changes = changes_of(transactions)
        assert [c.entity_id for c in changes] == [f"i{n:04d}" for n in range(450)]
        assert all(a.version < b.version for a, b in itertools.pairwise(changes))
        assert all(len(t.changes) <= 100 for t in transactions)
        positions = [t.position for t in transactions if t.position is not None]
        assert len(positions) == len(transactions)
        assert positions == sorted(positions) and positions[-1] == changes[-1].version.lsn


async def test_confirm_deletes_outbox_rows_up_to_the_position_and_no_further(db: Path) -> None:
    async with streaming(settings(db, "items", batch_size=2), MemoryCheckpoints()) as (source, stream):
        await finish_snapshot(source, stream)
        execute(db, *[("INSERT INTO items (id) VALUES (?)", (f"c{n}",)) for n in range(6)])
        first, second, third = await take(stream, 6)
        assert first.position is not None and second.position is not None and third.position is not None
        before = outbox_seqs(db)

        await source.confirm(first.position)
        assert outbox_seqs(db) == [seq for seq in before if seq > first.position]

        await source.confirm(second.position)
        assert outbox_seqs(db) == [seq for seq in before if seq > second.position]
        assert len(outbox_seqs(db)) == 2


# ---------------------------------------------------------------------- snapshot


async def test_snapshot_of_existing_rows_then_the_stream(db: Path) -> None:
    # Given rows written before any source ran, and outbox rows a source left behind unconfirmed
    execute(db, *[("INSERT INTO items (id, stock) VALUES (?, ?)", (f"old{n}", n)) for n in range(5)])
    async with SqliteSource(settings(db, "items"), MemoryCheckpoints()):
        pass  # installs the triggers, consumes nothing
    execute(db, "UPDATE items SET stock = 50 WHERE id = 'old0'", "INSERT INTO items (id) VALUES ('new0')")
    covered = outbox_seqs(db)
    assert covered

    store = MemoryCheckpoints()
    async with streaming(settings(db, "items", batch_size=2), store) as (source, stream):
        # When a source starts without a checkpoint
        batches: list[Transaction] = []
        async with asyncio.timeout(WAIT_S):
            while not batches or not batches[-1].snapshot_mark["done"]:
                batches.append(await anext(stream))
        snapshot = changes_of(batches)

        # Then the rows come as inserts at the outbox position the snapshot covers
        assert {c.entity_id: c.after for c in snapshot} == read_back(db, "items", ["id"], ["updated_at"])
        assert {c.op for c in snapshot} == {Op.INSERT}
        assert {c.version for c in snapshot} == {Version(max(covered), SNAPSHOT_ORDINAL)}
        assert all(b.position is None for b in batches) and len(batches) == 3

        # And later writes stream, without the outbox rows the snapshot already holds (still
        # there: the snapshot is not confirmed yet)
        execute(db, "DELETE FROM items WHERE id = 'old3'")
        [change] = changes_of(await take(stream, 1))
        assert (change.op, change.entity_id) == (Op.DELETE, "old3")
        assert change.version.lsn > max(covered)

        # Confirming the snapshot stores its mark and deletes the outbox rows it covered
        for batch in batches:
            await source.confirm_snapshot(batch.snapshot_mark)
        mark = store.values[source.settings.checkpoint_name]
        assert isinstance(mark, dict) and mark["done"] is True
        assert outbox_seqs(db) == [change.version.lsn]

    # A restart with the checkpoint streams on without a new snapshot, replaying what was not
    # confirmed
    execute(db, "INSERT INTO items (id) VALUES ('new1')")
    async with streaming(settings(db, "items"), store) as (source, stream):
        [first] = await take(stream, 1)
        assert first.snapshot_mark is None
        assert [c.entity_id for c in first.changes] == ["old3", "new1"]


async def test_resume_after_a_crash_mid_snapshot(db: Path) -> None:
    execute(db, *[("INSERT INTO items (id, stock) VALUES (?, ?)", (f"r{n:02d}", n)) for n in range(25)])
    store, cache = MemoryCheckpoints(), Cache()

    # Given a snapshot that stopped after its first batch was applied and confirmed
    async with streaming(settings(db, "items", batch_size=10), store) as (source, stream):
        first, _ = await take(stream, 20)
        cache.apply(first.changes)
        await source.confirm_snapshot(first.snapshot_mark)
        # (the second batch was read but never applied: the process died here)
    assert isinstance(first.snapshot_mark, dict) and first.snapshot_mark["done"] is False

    # And writes meanwhile, to rows already copied and rows not yet copied
    execute(db, "UPDATE items SET stock = 500 WHERE id = 'r05'", "DELETE FROM items WHERE id = 'r03'",
            "UPDATE items SET stock = 515 WHERE id = 'r15'", "DELETE FROM items WHERE id = 'r18'",
            "INSERT INTO items (id, stock) VALUES ('r30', 30)")

    # When the source restarts
    async with streaming(settings(db, "items", batch_size=10), store) as (source, stream):
        resumed = await finish_snapshot(source, stream)
        cache.apply(resumed)
        # Then the snapshot continues after the confirmed key, and the stream brings every write
        assert resumed[0].entity_id == "r10"
        streamed = changes_of(await take(stream, 5))
        cache.apply(streamed)
        assert {c.entity_id for c in streamed} == {"r05", "r03", "r15", "r18", "r30"}

    assert cache.rows("items") == read_back(db, "items", ["id"], ["updated_at"])


async def test_a_database_behind_its_checkpoint_is_refused(db: Path) -> None:
    store = MemoryCheckpoints()
    async with streaming(settings(db, "items"), store) as (source, stream):
        execute(db, "INSERT INTO items (id) VALUES ('a')")  # outbox row 1, inside the snapshot
        await finish_snapshot(source, stream)
    # The file is replaced by an older copy (a restore): its outbox is behind the checkpoint.
    for suffix in ("", "-wal", "-shm"):
        db.with_name(db.name + suffix).unlink(missing_ok=True)
    execute(db, "CREATE TABLE items (id TEXT PRIMARY KEY)")
    with pytest.raises(SourceError, match="restored or replaced"):
        async with SqliteSource(settings(db, "items"), store):
            pass


async def test_a_new_table_in_the_settings_takes_a_new_snapshot(db: Path) -> None:
    execute(db, "CREATE TABLE tags (name TEXT PRIMARY KEY)", "INSERT INTO tags VALUES ('red')")
    store = MemoryCheckpoints()
    async with streaming(settings(db, "items"), store) as (source, stream):
        await finish_snapshot(source, stream)
    async with streaming(settings(db, "items", "tags"), store) as (source, stream):
        snapshot = await finish_snapshot(source, stream)
    assert [(c.entity_type, c.entity_id) for c in snapshot] == [("tags", "red")]


# ---------------------------------------------------------------------- other writers, schema


async def test_writes_from_another_process_arrive(db: Path) -> None:
    script = (
        "import sqlite3, sys\n"
        "conn = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=30)\n"
        "for n in range(40):\n"
        "    conn.execute('INSERT INTO items (id, stock) VALUES (?, ?)', (f'p{n:02d}', n))\n"
    )
    async with streaming(settings(db, "items"), MemoryCheckpoints()) as (source, stream):
        await finish_snapshot(source, stream)
        writer = await asyncio.create_subprocess_exec(sys.executable, "-c", script, str(db))
        changes = changes_of(await take(stream, 40))
        assert await writer.wait() == 0
    assert [c.entity_id for c in changes] == [f"p{n:02d}" for n in range(40)]
    assert [c.after for c in changes] == [read_back(db, "items", ["id"])[f"p{n:02d}"] for n in range(40)]


def _triggers(path: Path) -> set[str]:
    return {name for (name,) in query(path, "SELECT name FROM sqlite_master WHERE type = 'trigger'")}


async def test_a_new_column_reinstalls_the_triggers_and_arrives(db: Path) -> None:
    async with streaming(settings(db, "items"), MemoryCheckpoints()) as (source, stream):
        await finish_snapshot(source, stream)
        old = _triggers(db)
        assert len(old) == 3

        # A row written in the same transaction as the ALTER went through the old triggers
        execute(db, "ALTER TABLE items ADD COLUMN colour TEXT",
                "INSERT INTO items (id, colour) VALUES ('k1', 'red')")
        [early] = changes_of(await take(stream, 1))
        assert early.after is not None and early.after["colour"] == "red"
        new = _triggers(db)
        assert len(new) == 3 and not new & old

        execute(db, "INSERT INTO items (id, colour) VALUES ('k2', 'blue')")
        [late] = changes_of(await take(stream, 1))
        [(after_json,)] = query(db, f"SELECT after_json FROM {OUTBOX} WHERE seq = ?", (late.version.lsn,))
        assert '"colour":"blue"' in after_json  # written by the new triggers themselves
        assert late.after == read_back(db, "items", ["id"], ["updated_at"])["k2"]


async def test_a_column_is_dropped_between_the_helpers_in_one_transaction(db: Path) -> None:
    async with streaming(settings(db, "items"), MemoryCheckpoints()) as (source, stream):
        await finish_snapshot(source, stream)
        conn = sqlite3.connect(db, isolation_level=None, timeout=30)
        with pytest.raises(sqlite3.OperationalError):  # the triggers name every column
            conn.execute("ALTER TABLE items DROP COLUMN ratio")
        conn.execute("BEGIN IMMEDIATE")
        drop_triggers(conn, "items")
        conn.execute("ALTER TABLE items DROP COLUMN ratio")
        install_triggers(conn, read_shape(conn, "items"))
        conn.execute("COMMIT")
        conn.close()
        execute(db, "INSERT INTO items (id) VALUES ('d1')")
        [change] = changes_of(await take(stream, 1))
        assert change.after is not None and "ratio" not in change.after


async def test_an_unknown_table_is_named(db: Path) -> None:
    with pytest.raises(SourceError, match="'nope'"):
        async with SqliteSource(settings(db, "items", "nope"), MemoryCheckpoints()):
            pass
    with pytest.raises(SourceError, match="no SQLite database"):
        async with SqliteSource(settings(db.with_name("missing.db"), "items"), MemoryCheckpoints()):
            pass


def test_settings_from_url() -> None:
    parsed = SqliteSourceSettings.from_url("sqlite:///data/shop.db?tables=products,users&poll_interval_s=0.05",
                                           batch_size=50)
    assert (parsed.path, parsed.tables, parsed.poll_interval_s, parsed.batch_size) == (
        "data/shop.db", ("products", "users"), 0.05, 50)
    assert SqliteSourceSettings.from_url("sqlite:////abs/shop.db", tables=("a",)).path == "/abs/shop.db"
    with pytest.raises(ConfigError, match="tables"):
        SqliteSourceSettings.from_url("sqlite:///shop.db")
    with pytest.raises(ConfigError, match="Mars/Olympus"):
        SqliteSourceSettings.from_url("sqlite:///shop.db?tables=a", source_zone="Mars/Olympus")
    with pytest.raises(ConfigError, match="twice"):
        SqliteSourceSettings.from_url("sqlite:///shop.db?tables=a,A")


# ---------------------------------------------------------------------- the demo shop


RETAIL_CSV = """InvoiceNo,StockCode,Description,Quantity,InvoiceDate,UnitPrice,CustomerID,Country
536365,85123A,WHITE HANGING HEART T-LIGHT HOLDER,6,2010-12-01 08:26:00,2.55,17850,United Kingdom
536365,71053,WHITE METAL LANTERN,6,2010-12-01 08:26:00,3.39,17850,United Kingdom
536366,POST,POSTAGE,1,2010-12-01 08:28:00,18.0,12583,France
C536379,22633,HAND WARMER UNION JACK,-2,2010-12-01 09:41:00,1.85,14527,United Kingdom
536370,22728,ALARM CLOCK BAKELIKE PINK,24,2010-07-01 08:45:00,3.75,12583,France
536371,22086,PAPER CHAIN KIT 50'S CHRISTMAS ,80,2010-12-01 09:00:00,2.55,,United Kingdom
"""


def test_create_shop_from_the_online_retail_layout(tmp_path: Path) -> None:
    data = tmp_path / "online_retail.csv.gz"
    data.write_bytes(gzip.compress(RETAIL_CSV.encode()))
    seed = create_shop(tmp_path / "shop.db", data=data)
    assert (seed.origin, seed.products, seed.users, seed.interactions) == ("online-retail", 4, 2, 3)
    products = {r[0]: r for r in query(tmp_path / "shop.db", "SELECT * FROM products")}
    assert set(products) == {"85123A", "71053", "22728", "22086"}  # no postage, no cancellation
    _, name, _, price, _, categories, embeddings, updated_at = products["85123A"]
    assert (name, price, categories, embeddings) == ("White Hanging Heart T-Light Holder", 2.55,
                                                     '["lighting","love"]', None)
    assert updated_at == "2010-12-01T08:26:00.000Z"  # winter: London is UTC
    assert products["22728"][-1] == "2010-07-01T07:45:00.000Z"  # summer: London is UTC+1
    assert query(tmp_path / "shop.db", "SELECT id, country FROM users ORDER BY id") == [
        ("12583", "France"), ("17850", "United Kingdom")]
    assert create_shop(tmp_path / "shop.db", data=data).origin == "existing"


def test_create_shop_without_the_data_is_generated_and_deterministic(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="tidegate.demo.shop"):
        first = create_shop(tmp_path / "a.db", products=30, users=10, interactions=20,
                            data=tmp_path / "none.gz")
    assert "none.gz" in caplog.text
    create_shop(tmp_path / "b.db", products=30, users=10, interactions=20)
    assert (first.origin, first.products, first.users, first.interactions) == ("generated", 30, 10, 20)
    for table in SHOP_TABLES:
        sql = f"SELECT * FROM {table}"
        assert query(tmp_path / "a.db", sql) == query(tmp_path / "b.db", sql)


def test_categories_come_from_description_words() -> None:
    assert categories_of("SET OF 3 HEART COOKIE CUTTERS") == ["kitchen", "love"]
    assert categories_of("STRING OF STARS") == ["gifts"]  # "RING" only as a word


async def test_the_shop_load_through_the_source_converges_to_the_database(tmp_path: Path) -> None:
    path = tmp_path / "shop.db"
    create_shop(path, products=60, users=30, interactions=50, seed=3)
    load = ShopLoad(path, seed=5)
    cache = Cache()
    keys = {"products": ["id"], "users": ["id"], "interactions": ["id"]}
    stamps = {"products": ["updated_at"], "users": ["created_at"], "interactions": ["created_at"]}
    try:
        config = settings(path, *SHOP_TABLES, batch_size=64)
        async with streaming(config, MemoryCheckpoints()) as (source, stream):
            # The load runs while the snapshot is read and while the stream follows it
            writing = asyncio.create_task(asyncio.to_thread(load.write, 400))
            cache.apply(await finish_snapshot(source, stream))
            done = await writing
            assert done["interaction"] > done["price"] > 0
            assert load.interaction_kinds["view"] > load.interaction_kinds["purchase"] > 0
            execute(path, "INSERT INTO users VALUES ('last', 'Last', 'France', '2024-01-01T00:00:00Z')")
            last_seq = outbox_seqs(path)[-1]
            async with asyncio.timeout(WAIT_S):
                while True:
                    transaction = await anext(stream)
                    cache.apply(transaction.changes)
                    assert transaction.position is not None
                    await source.confirm(transaction.position)
                    if transaction.position >= last_seq:
                        break
    finally:
        load.close()
    for table in SHOP_TABLES:
        assert cache.rows(table) == read_back(path, table, keys[table], stamps[table]), table
    assert outbox_seqs(path) == []


async def test_the_shop_load_writes_rate_times_duration_and_stops(tmp_path: Path) -> None:
    path = tmp_path / "shop.db"
    create_shop(path, products=30, users=10, interactions=0)
    load = ShopLoad(path, seed=1)
    try:
        done = await load.run(rate_per_s=100, duration_s=0.3)
        assert sum(done.values()) == 30
        stop = asyncio.Event()
        stop.set()
        assert await load.run(rate_per_s=100, duration_s=10, stop=stop) == {}
    finally:
        load.close()
    assert load.counts == done
    [(interactions,)] = query(path, "SELECT count(*) FROM interactions")
    assert interactions == done["interaction"] == sum(load.interaction_kinds.values())


async def test_status_needs_no_open_source(db: Path) -> None:
    execute(db, "INSERT INTO items (id) VALUES ('s1')")
    store = MemoryCheckpoints()
    config = settings(db, "items", "gone")
    status = await SqliteSource(config, store).status()  # nothing installed yet, nothing created
    assert status["outbox_pending"] == 0 and status["snapshot_done"] is None
    assert status["tables"] == {"items": {"rows": 1, "captured": False},
                                "gone": {"rows": None, "captured": False}}

    async with streaming(settings(db, "items"), store) as (source, stream):
        await finish_snapshot(source, stream)
        execute(db, "INSERT INTO items (id) VALUES ('s2')", "INSERT INTO items (id) VALUES ('s3')")
        status = await SqliteSource(config, store).status()
    assert status["snapshot_done"] is True
    assert status["outbox_pending"] == 2 and status["outbox_last_seq"] == outbox_seqs(db)[-1]
    assert isinstance(status["lag_s"], float) and status["lag_s"] >= 0
    assert status["tables"]["items"] == {"rows": 3, "captured": True}
    assert (await SqliteSource(config, store).status())["tables"]["items"]["captured"] is True  # after close


async def test_a_source_from_its_url(db: Path) -> None:
    source = SqliteSource.from_url(f"sqlite:///{db}?tables=items", MemoryCheckpoints(), poll_interval_s=0.005)
    async with source:
        assert source.settings.tables == ("items",)
        assert source.settings.checkpoint_name.startswith("sqlite:/")  # the absolute path
        assert source.settings.checkpoint_name.endswith(str(db.relative_to(db.anchor)))



async def test_a_source_used_before_open_or_after_close_raises_source_error(db: Path) -> None:
    source = SqliteSource(settings(db, "items"), MemoryCheckpoints())
    with pytest.raises(SourceError, match="not open"):
        await source.confirm(1)
    async with source:
        await source.confirm(0)
    await source.close()  # idempotent
    with pytest.raises(SourceError):
        await source.confirm(1)
    with pytest.raises(SourceError, match="create a new one"):
        async with source:
            pass


async def test_a_source_whose_open_failed_stays_closed(db: Path) -> None:
    source = SqliteSource(settings(db, "items", "nope"), MemoryCheckpoints())
    with pytest.raises(SourceError, match="'nope'"):
        await source.open()
    with pytest.raises(SourceError, match="create a new one"):
        await source.open()
