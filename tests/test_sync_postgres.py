"""The PostgreSQL change source against a real server (the `pg_dsn` fixture: a fresh database of a
private cluster with wal_level=logical), driven directly with a dict-backed checkpoint store."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

import psycopg2  # type: ignore[import-untyped]
import psycopg2.extras  # type: ignore[import-untyped]
import pytest

from support.sync import DictCheckpoints as MemoryCheckpoints
from support.waiting import eventually
from tidegate.errors import ConfigError, SourceError
from tidegate.sync.changes import Change, Op, Version
from tidegate.sync.contracts import ChangeSource, Transaction
from tidegate.sync.sources.postgres.pgoutput import parse_lsn
from tidegate.sync.sources.postgres.source import PostgresSource, PostgresSourceSettings
from tidegate.sync.values import canonical, checksum, source_zone

WAIT_S = 15.0


def make_settings(dsn: str, *tables: str, **options: Any) -> PostgresSourceSettings:
    options.setdefault("slot_name", f"s_{uuid.uuid4().hex[:12]}")
    options.setdefault("status_interval_s", 1.0)
    return PostgresSourceSettings(dsn=dsn, tables=tables, **options)


@contextlib.contextmanager
def cursor(dsn: str) -> Iterator[Any]:
    with contextlib.closing(psycopg2.connect(dsn)) as conn:
        conn.autocommit = True
        # psycopg2 reads uuid[] as one string unless told (on this connection only).
        psycopg2.extras.register_uuid(conn_or_curs=conn)
        with conn.cursor(cursor_factory=psycopg2.extras.RealDictCursor) as cur:
            yield cur


def execute(dsn: str, *statements: str) -> None:
    """Each statement in its own transaction (autocommit)."""
    with cursor(dsn) as cur:
        for statement in statements:
            cur.execute(statement)


def select(dsn: str, query: str) -> list[dict[str, Any]]:
    with cursor(dsn) as cur:
        cur.execute(query)
        return [dict(row) for row in cur.fetchall()]


def slot_row(dsn: str, slot: str) -> dict[str, Any]:
    rows = select(dsn, f"SELECT active, active_pid, confirmed_flush_lsn::text AS confirmed "
                       f"FROM pg_replication_slots WHERE slot_name = '{slot}'")
    assert rows, f"slot {slot} does not exist"
    return rows[0]


def confirmed_flush(dsn: str, slot: str) -> int:
    return parse_lsn(slot_row(dsn, slot)["confirmed"])


class Reader:
    """Pulls a source's transactions with a deadline on each."""

    def __init__(self, source: PostgresSource) -> None:
        self.source = source
        self._iterator: AsyncIterator[Transaction] = source.transactions().__aiter__()

    async def next(self, timeout_s: float = WAIT_S) -> Transaction:
        return await asyncio.wait_for(self._iterator.__anext__(), timeout_s)

    async def snapshot(self) -> list[Transaction]:
        """Snapshot batches until the last one (its mark says done)."""
        batches = []
        while True:
            batch = await self.next()
            assert batch.position is None, "a streamed transaction before the snapshot ended"
            batches.append(batch)
            last_table = self.source.settings.tables[-1].removeprefix("public.")
            if batch.snapshot_mark["done"] and batch.snapshot_mark["table"] == last_table:
                return batches

    async def streamed(self) -> Transaction:
        """The next streamed transaction that carries changes (heartbeats skipped)."""
        while True:
            transaction = await self.next()
            assert transaction.position is not None
            if transaction.changes:
                return transaction

    async def changes(self, count: int) -> list[Change]:
        """The next `count` streamed changes, across transactions."""
        changes: list[Change] = []
        while len(changes) < count:
            changes += (await self.streamed()).changes
        assert len(changes) == count, changes
        return changes


@contextlib.asynccontextmanager
async def running(settings: PostgresSourceSettings,
                  checkpoints: MemoryCheckpoints | None = None) -> AsyncIterator[Reader]:
    """An entered source and a reader of its transactions; the source is closed on exit."""
    async with PostgresSource(settings, checkpoints or MemoryCheckpoints()) as source:
        yield Reader(source)


def fold(state: dict[tuple[str, str], tuple[Version, Any]], changes: Sequence[Change]) -> None:
    """Apply changes as the versioned cache does: a change wins only over an older version."""
    for change in changes:
        if change.op is Op.TRUNCATE:
            for key in [k for k in state if k[0] == change.entity_type]:
                del state[key]
            continue
        key = (change.entity_type, change.entity_id)
        current = state.get(key)
        if current is None or change.version > current[0]:
            state[key] = (change.version, change.after if change.op is not Op.DELETE else None)


def rows_of(state: dict[tuple[str, str], tuple[Version, Any]]) -> dict[str, Any]:
    return {key[1]: row for key, (_, row) in state.items() if row is not None}


def canonical_rows(dsn: str, table: str, key: str = "id", zone: str | None = None) -> dict[str, Any]:
    return {str(row[key]): canonical(row, source_zone(zone))
            for row in select(dsn, f"SELECT * FROM {table}")}


# ---------------------------------------------------------------------- types and operations

TYPED_TABLE = """
CREATE TABLE typed (
    id int PRIMARY KEY, i2 smallint, i8 bigint, o oid, num numeric(12, 3), f4 real,
    f8 double precision, t text, vc varchar(20), bp char(5), nm name, b boolean,
    tstz timestamptz, ts timestamp, d date, tm time, j json, jb jsonb, u uuid, by bytea,
    a_int int[], a_i8 bigint[], a_text text[], a_vc varchar[], a_num numeric[], a_bool boolean[],
    a_tstz timestamptz[], a_ts timestamp[], a_date date[], a_time time[], a_jsonb jsonb[],
    a_uuid uuid[], a_bytea bytea[], a_f8 float8[], nested int[][]
)"""

TYPED_VALUES = """(
    {id}, -32768, 9223372036854775807, 4000000000, -123456789.125, 0.1, 1.0000000000000002,
    'café ✓', 'short', 'ab', 'a_name', true,
    '2024-03-10 01:59:59.999999-08', '2024-01-15 12:00:00', '2024-02-29', '23:59:59.5',
    '{{"n": 1.5, "s": "x"}}', '{{"nested": {{"list": [1, "two", null, false]}}, "e": ""}}',
    'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', '\\x00ff10',
    '{{1,NULL,-3}}', '{{9223372036854775807}}', '{{"a,b","x\\"y",NULL,"NULL","","{{}}"}}',
    '{{"with space"}}', '{{1.10,NULL,-0.000001}}', '{{t,f,NULL}}',
    '{{"2024-01-01 00:00:00+00","1999-12-31 23:59:59.5+05:30"}}', '{{"2024-06-01 08:30:00"}}',
    '{{2024-01-01,NULL}}', '{{00:00:01}}', ARRAY['{{"k": [1]}}'::jsonb, NULL, '"s"'::jsonb],
    '{{a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11}}', '{{"\\\\x0102",NULL}}', '{{1.5,-2e-300}}',
    '{{{{1,2}},{{3,NULL}}}}'
)"""


async def test_every_type_round_trips_from_snapshot_and_stream(pg_dsn: str) -> None:
    zone = "America/New_York"
    execute(pg_dsn, TYPED_TABLE, f"INSERT INTO typed VALUES {TYPED_VALUES.format(id=1)}")
    async with running(make_settings(pg_dsn, "typed", source_zone=zone)) as reader:
        # Given a row that existed before the slot (snapshot) ...
        (batch,) = await reader.snapshot()
        # ... and the same values inserted, updated and deleted afterwards (stream).
        execute(pg_dsn, f"INSERT INTO typed VALUES {TYPED_VALUES.format(id=2)}",
                "INSERT INTO typed (id) VALUES (3)",
                "UPDATE typed SET t = NULL, a_text = '{}', jb = '[]', num = 0, ts = '2024-07-01 12:00' "
                "WHERE id = 2",
                f"INSERT INTO typed VALUES {TYPED_VALUES.format(id=4)}", "DELETE FROM typed WHERE id = 4")
        inserted, nulls, updated, _, deleted = await reader.changes(5)

    # Then every after-image is the canonical form of what a plain SELECT reads back.
    rows = canonical_rows(pg_dsn, "typed", zone=zone)
    snapped = batch.changes[0]
    assert snapped.op is Op.INSERT
    assert snapped.after is not None and inserted.after is not None and nulls.after is not None
    assert snapped.after == rows["1"] and snapped.checksum == checksum(rows["1"])
    assert {k: v for k, v in inserted.after.items() if k != "id"} == {
        k: v for k, v in snapped.after.items() if k != "id"}, "snapshot and stream decode alike"
    assert nulls.after == rows["3"] and nulls.checksum == checksum(rows["3"])
    assert all(v is None for k, v in nulls.after.items() if k != "id")
    assert updated.op is Op.UPDATE and updated.after == rows["2"]
    assert updated.checksum == checksum(rows["2"])
    assert deleted.op is Op.DELETE and deleted.entity_id == "4" and deleted.before == {"id": 4}
    # Spot checks of the canonical forms themselves.
    assert snapped.after["ts"] == "2024-01-15T17:00:00.000000Z"  # naive, read in New York (EST)
    assert snapped.after["tstz"] == "2024-03-10T09:59:59.999999Z"
    assert snapped.after["num"] == "-123456789.125"
    assert snapped.after["a_text"] == ["a,b", 'x"y', None, "NULL", "", "{}"]
    assert snapped.after["nested"] == [[1, 2], [3, None]]
    assert snapped.after["jb"] == {"nested": {"list": [1, "two", None, False]}, "e": ""}
    assert snapped.after["by"] == "00ff10" and snapped.after["a_bytea"] == ["0102", None]
    assert snapped.after["bp"] == "ab   "
    assert inserted.commit_time.tzinfo is not None and inserted.xid is not None


async def test_values_python_cannot_hold_keep_their_text_and_domains_decode_as_their_base(
        pg_dsn: str) -> None:
    values = "'NaN', '-Infinity', 'infinity', '0044-03-15 BC', '24:00:00', NULL, 'ok', 5"
    execute(pg_dsn, "CREATE TYPE mood AS ENUM ('sad', 'ok')",
            "CREATE DOMAIN positive AS int CHECK (VALUE > 0)", "CREATE DOMAIN small AS positive",
            "CREATE TABLE odd (id int PRIMARY KEY, n numeric, f float8, ts timestamptz, d date, "
            "tm time, e text, m mood, p small)",
            f"INSERT INTO odd VALUES (1, {values})")
    async with running(make_settings(pg_dsn, "odd")) as reader:
        (batch,) = await reader.snapshot()
        execute(pg_dsn, f"INSERT INTO odd VALUES (2, {values})")
        (change,) = await reader.changes(1)
    expected = {"n": "NaN", "f": "-Infinity", "ts": "infinity", "d": "0044-03-15 BC",
                "tm": "24:00:00", "e": None, "m": "ok", "p": 5}
    assert batch.changes[0].after == {"id": 1, **expected}
    assert change.after == {"id": 2, **expected}


async def test_multi_row_statements_share_one_lsn_with_distinct_ordinals(pg_dsn: str) -> None:
    execute(pg_dsn, "CREATE TABLE m (id int PRIMARY KEY, v int)")
    async with running(make_settings(pg_dsn, "m")) as reader:
        await reader.snapshot()
        execute(pg_dsn, "INSERT INTO m SELECT g, g FROM generate_series(1, 5) g",
                "UPDATE m SET v = v * 10")
        inserts = await reader.streamed()
        updates = await reader.streamed()
    for tx, op in ((inserts, Op.INSERT), (updates, Op.UPDATE)):
        assert [c.op for c in tx.changes] == [op] * 5
        assert len({c.version.lsn for c in tx.changes}) == 1
        assert [c.version.ordinal for c in tx.changes] == [0, 1, 2, 3, 4]
        assert tx.position is not None and tx.position > tx.changes[0].version.lsn
    assert sorted(c.entity_id for c in updates.changes) == ["1", "2", "3", "4", "5"]
    assert inserts.changes[0].version < updates.changes[0].version
    assert {c.after["v"] for c in updates.changes if c.after is not None} == {10, 20, 30, 40, 50}


async def test_composite_keys_schema_qualified_and_key_changes(pg_dsn: str) -> None:
    execute(pg_dsn, "CREATE SCHEMA shop",
            "CREATE TABLE shop.stock (store int, sku text, qty int, PRIMARY KEY (store, sku))",
            "CREATE TABLE plain (id int PRIMARY KEY, v text)")
    async with running(make_settings(pg_dsn, "shop.stock", "public.plain")) as reader:
        await reader.snapshot()
        execute(pg_dsn, "INSERT INTO shop.stock VALUES (1, 'a-1', 5)",
                "UPDATE shop.stock SET qty = 6",
                "UPDATE shop.stock SET sku = 'b-2'",
                "DELETE FROM shop.stock",
                "INSERT INTO plain VALUES (1, 'x')", "UPDATE plain SET id = 2")
        insert, update, moved_out, moved_in, delete, plain_insert, plain_out, plain_in = \
            await reader.changes(8)
    assert insert.entity_type == "shop.stock" and insert.entity_id == '[1,"a-1"]'
    assert insert.key == {"store": 1, "sku": "a-1"}
    assert update.op is Op.UPDATE and update.after == {"store": 1, "sku": "a-1", "qty": 6}
    # A changed key: the old entity is deleted, then the row arrives under its new key, both in
    # the statement's transaction with consecutive ordinals.
    assert (moved_out.op, moved_out.entity_id) == (Op.DELETE, '[1,"a-1"]')
    assert (moved_in.op, moved_in.entity_id) == (Op.UPDATE, '[1,"b-2"]')
    assert moved_in.after == {"store": 1, "sku": "b-2", "qty": 6}
    assert moved_out.version.lsn == moved_in.version.lsn
    assert moved_in.version.ordinal == moved_out.version.ordinal + 1
    assert (delete.op, delete.entity_id) == (Op.DELETE, '[1,"b-2"]')
    assert delete.before == {"store": 1, "sku": "b-2"}
    assert plain_insert.entity_type == "plain"
    assert [(c.op, c.entity_id) for c in (plain_out, plain_in)] == [(Op.DELETE, "1"), (Op.UPDATE, "2")]


async def test_truncate_is_one_change_per_table(pg_dsn: str) -> None:
    execute(pg_dsn, "CREATE TABLE a (id int PRIMARY KEY)", "CREATE TABLE b (id int PRIMARY KEY)",
            "CREATE TABLE other (id int PRIMARY KEY)", "INSERT INTO a VALUES (1)")
    async with running(make_settings(pg_dsn, "a", "b")) as reader:
        await reader.snapshot()
        execute(pg_dsn, "TRUNCATE a, b, other RESTART IDENTITY")
        tx = await reader.streamed()
    assert [(c.op, c.entity_type, c.entity_id) for c in tx.changes] == [
        (Op.TRUNCATE, "a", "*"), (Op.TRUNCATE, "b", "*")]
    assert [c.version.ordinal for c in tx.changes] == [0, 1]


BIG_VALUE = "(SELECT string_agg(md5(random()::text), '') FROM generate_series(1, 400))"


@pytest.mark.parametrize("identity", ["default", "full"])
async def test_unchanged_toast_column(pg_dsn: str, identity: str,
                                      caplog: pytest.LogCaptureFixture) -> None:
    execute(pg_dsn, "CREATE TABLE docs (id int PRIMARY KEY, body text, n int)",
            f"ALTER TABLE docs REPLICA IDENTITY {identity.upper()}")
    caplog.set_level(logging.WARNING, logger="tidegate.sync.sources.postgres.catalog")
    async with running(make_settings(pg_dsn, "docs")) as reader:
        await reader.snapshot()
        execute(pg_dsn, f"INSERT INTO docs VALUES (1, {BIG_VALUE}, 0)",
                "UPDATE docs SET n = n + 1")  # the TOASTed neighbour is left unchanged
        _, update = await reader.changes(2)
    warned = [r for r in caplog.records if "docs" in r.getMessage() and "TOAST" in r.getMessage()]
    (row,) = canonical_rows(pg_dsn, "docs").values()
    if identity == "default":
        # The server did not send the value: it is listed, never a placeholder.
        assert update.unchanged == ("body",)
        assert update.after == {"id": 1, "n": 1}
        filled = update.with_columns({"body": row["body"]})
        assert filled.after == row and filled.checksum == checksum(row)
        assert len(warned) == 1
    else:
        # REPLICA IDENTITY FULL: the old row carries it.
        assert update.unchanged == ()
        assert update.after == row and update.checksum == checksum(row)
        assert update.before is not None and update.before["n"] == 0
        assert not warned


# ---------------------------------------------------------------------- snapshot


async def test_snapshot_batches_then_changes_made_meanwhile_stream(pg_dsn: str) -> None:
    execute(pg_dsn, "CREATE TABLE s (id int PRIMARY KEY, v text)",
            "INSERT INTO s SELECT g, 'v' || g FROM generate_series(1, 5) g")
    checkpoints = MemoryCheckpoints()
    settings = make_settings(pg_dsn, "s", snapshot_batch_size=2)
    state: dict[tuple[str, str], tuple[Version, Any]] = {}
    async with running(settings, checkpoints) as reader:
        consistent_point = checkpoints.values[f"pg:{settings.slot_name}"]["consistent_point"]
        first = await reader.next()
        # Changes committed while the snapshot is being read ...
        execute(pg_dsn, "UPDATE s SET v = 'changed' WHERE id = 4", "DELETE FROM s WHERE id = 5",
                "INSERT INTO s VALUES (6, 'v6')")
        rest = await reader.snapshot()
        batches = [first, *rest]
        for batch in batches:
            await reader.source.confirm_snapshot(batch.snapshot_mark)
        # ... arrive after it, streamed, with versions above the snapshot's.
        streamed = await reader.changes(3)
    assert [[c.entity_id for c in b.changes] for b in batches] == [["1", "2"], ["3", "4"], ["5"]]
    assert [b.snapshot_mark for b in batches] == [
        {"table": "s", "after": ["2"], "done": False}, {"table": "s", "after": ["4"], "done": False},
        {"table": "s", "after": ["5"], "done": True}]
    snapshot_changes = [c for b in batches for c in b.changes]
    # The exported snapshot is the consistent point's: row 4 as it was, row 5 still there.
    assert snapshot_changes[3].after == {"id": 4, "v": "v4"}
    assert {c.version for c in snapshot_changes} == {Version(consistent_point - 1, 0)}
    assert all(c.op is Op.INSERT for c in snapshot_changes)
    assert [(c.op, c.entity_id) for c in streamed] == [(Op.UPDATE, "4"), (Op.DELETE, "5"), (Op.INSERT, "6")]
    assert all(c.version > snapshot_changes[0].version for c in streamed)
    fold(state, snapshot_changes + streamed)
    assert rows_of(state) == canonical_rows(pg_dsn, "s")
    assert checkpoints.values[f"pg:{settings.slot_name}"]["snapshot_done"] is True


async def test_snapshot_resumes_after_the_confirmed_key(pg_dsn: str) -> None:
    execute(pg_dsn, "CREATE TABLE r (id int PRIMARY KEY, v text)", "CREATE TABLE r2 (id int PRIMARY KEY)",
            "INSERT INTO r SELECT g, 'v' || g FROM generate_series(1, 5) g",
            "INSERT INTO r2 VALUES (1)")
    checkpoints = MemoryCheckpoints()
    settings = make_settings(pg_dsn, "r", "r2", snapshot_batch_size=2)
    state: dict[tuple[str, str], tuple[Version, Any]] = {}
    # Given a source stopped after its first batch was confirmed (the second was not) ...
    async with running(settings, checkpoints) as reader:
        first = await reader.next()
        await reader.source.confirm_snapshot(first.snapshot_mark)
        await reader.next()
        fold(state, first.changes)
    key = f"pg:{settings.slot_name}"
    consistent_point = checkpoints.values[key]["consistent_point"]
    assert checkpoints.values[key]["after"] == ["2"]
    # ... and changes while it was down, before and after the confirmed key:
    execute(pg_dsn, "UPDATE r SET v = 'changed' WHERE id = 4", "DELETE FROM r WHERE id = 5",
            "UPDATE r SET v = 'early' WHERE id = 1")
    # When it restarts, the snapshot continues from key 2 with a fresh read, on the same slot.
    async with running(settings, checkpoints) as reader:
        batches = await reader.snapshot()
        for batch in batches:
            await reader.source.confirm_snapshot(batch.snapshot_mark)
        streamed = await reader.changes(3)
    assert [[c.entity_id for c in b.changes] for b in batches] == [["3", "4"], [], ["1"]]
    assert batches[0].changes[1].after == {"id": 4, "v": "changed"}  # a fresh read: today's row
    assert checkpoints.values[key]["consistent_point"] == consistent_point
    assert {c.version for b in batches for c in b.changes} == {Version(consistent_point - 1, 0)}
    # Every change after the consistent point streams afterwards and wins on its version.
    assert [(c.op, c.entity_id) for c in streamed] == [(Op.UPDATE, "4"), (Op.DELETE, "5"), (Op.UPDATE, "1")]
    fold(state, [c for b in batches for c in b.changes] + streamed)
    assert rows_of(state) == {**canonical_rows(pg_dsn, "r"), **canonical_rows(pg_dsn, "r2")}
    assert checkpoints.values[key]["snapshot_done"] is True
    assert len(select(pg_dsn, "SELECT 1 FROM pg_replication_slots")) == 1


async def test_without_a_checkpoint_the_slot_is_recreated_and_read_again(
        pg_dsn: str, caplog: pytest.LogCaptureFixture) -> None:
    execute(pg_dsn, "CREATE TABLE c (id int PRIMARY KEY)", "INSERT INTO c VALUES (1), (2)")
    settings = make_settings(pg_dsn, "c")
    first_store = MemoryCheckpoints()
    async with running(settings, first_store) as reader:
        await reader.snapshot()
        execute(pg_dsn, "INSERT INTO c VALUES (3)")
        await reader.changes(1)
    old_point = first_store.values[f"pg:{settings.slot_name}"]["consistent_point"]
    # A cache that lost everything (memory://, restarted) has no checkpoint.
    caplog.set_level(logging.WARNING, logger="tidegate.sync.sources.postgres.source")
    fresh_store = MemoryCheckpoints()
    async with running(settings, fresh_store) as reader:
        (batch,) = await reader.snapshot()
    assert sorted(c.entity_id for c in batch.changes) == ["1", "2", "3"]
    assert fresh_store.values[f"pg:{settings.slot_name}"]["consistent_point"] > old_point
    assert any("no record" in r.getMessage() for r in caplog.records)


# ---------------------------------------------------------------------- positions


async def test_confirm_moves_the_slot_exactly_that_far(pg_dsn: str) -> None:
    execute(pg_dsn, "CREATE TABLE p (id int PRIMARY KEY)")
    settings = make_settings(pg_dsn, "p")
    async with running(settings) as reader:
        await reader.snapshot()
        execute(pg_dsn, "INSERT INTO p VALUES (1)", "INSERT INTO p VALUES (2)")
        first, second = await reader.streamed(), await reader.streamed()
        assert first.position is not None and second.position is not None
        # Nothing confirmed yet: the slot stays before the first transaction.
        await asyncio.sleep(2.5)
        assert confirmed_flush(pg_dsn, settings.slot_name) <= first.changes[0].version.lsn
        await reader.source.confirm(first.position)
        await eventually(lambda: confirmed_flush(pg_dsn, settings.slot_name) == first.position,
                         "the slot to reach the confirmed position")
        await asyncio.sleep(2.5)  # several status intervals later, still not beyond it
        assert confirmed_flush(pg_dsn, settings.slot_name) == first.position
        await reader.source.confirm(second.position)
        target = second.position
        await eventually(lambda: confirmed_flush(pg_dsn, settings.slot_name) >= target,
                         "the slot to reach the second position")


async def test_heartbeat_lets_an_idle_slot_advance(pg_dsn: str) -> None:
    execute(pg_dsn, "CREATE TABLE h (id int PRIMARY KEY)")
    settings = make_settings(pg_dsn, "h", heartbeat_s=0.3)
    async with running(settings) as reader:
        await reader.snapshot()
        start = confirmed_flush(pg_dsn, settings.slot_name)
        beat = await reader.next()
        assert beat.changes == () and beat.position is not None and beat.position > start
        later = await reader.next()
        assert later.changes == () and later.position is not None and later.position > beat.position
        await reader.source.confirm(later.position)
        target = later.position
        await eventually(lambda: confirmed_flush(pg_dsn, settings.slot_name) >= target,
                         "the idle slot to advance to the heartbeat")


async def test_feedback_keeps_the_connection_while_idle_and_while_the_consumer_lags(pg_dsn: str) -> None:
    execute(pg_dsn, "CREATE TABLE k (id int PRIMARY KEY)")
    # The server drops a replication connection silent for 2 s; the periodic status message
    # (10 s) is too rare to prevent that on its own.
    dsn = f"{pg_dsn} options='-c wal_sender_timeout=2000'"
    settings = make_settings(dsn, "k", status_interval_s=10.0, max_pending_transactions=1)
    async with running(settings) as reader:
        await reader.snapshot()
        execute(pg_dsn, *(f"INSERT INTO k VALUES ({i})" for i in range(1, 6)))
        await reader.streamed()
        pid = slot_row(pg_dsn, settings.slot_name)["active_pid"]
        # The consumer lags: the reader waits for room, still answering the server.
        await asyncio.sleep(5)
        assert [c.entity_id for c in await reader.changes(4)] == ["2", "3", "4", "5"]
        # Idle: nothing to read for a while, keepalives answered.
        await asyncio.sleep(5)
        execute(pg_dsn, "INSERT INTO k VALUES (6)")
        assert [c.entity_id for c in await reader.changes(1)] == ["6"]
        assert slot_row(pg_dsn, settings.slot_name)["active_pid"] == pid


# ---------------------------------------------------------------------- errors and setup


async def test_lost_connection_raises_source_error(pg_dsn: str) -> None:
    execute(pg_dsn, "CREATE TABLE l (id int PRIMARY KEY)")
    settings = make_settings(pg_dsn, "l")
    async with running(settings) as reader:
        await reader.snapshot()
        waiting = asyncio.create_task(reader.next())  # the stream starts when asked for
        await eventually(lambda: slot_row(pg_dsn, settings.slot_name)["active"], "the stream to start")
        execute(pg_dsn, f"SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots "
                        f"WHERE slot_name = '{settings.slot_name}'")
        with pytest.raises(SourceError, match=settings.slot_name):
            await waiting


async def test_unreachable_server_and_bad_dsn() -> None:
    settings = PostgresSourceSettings(
        dsn="host=127.0.0.1 port=1 dbname=shop user=app password=secret connect_timeout=2",
        tables=("t",))
    with pytest.raises(SourceError, match=r"app@127\.0\.0\.1:1/shop") as raised:
        async with PostgresSource(settings, MemoryCheckpoints()):
            pass
    assert "secret" not in str(raised.value)
    with pytest.raises(ConfigError, match="invalid PostgreSQL DSN"):
        PostgresSource(PostgresSourceSettings(dsn="host=x password='unterminated", tables=("t",)),
                       MemoryCheckpoints())


async def test_missing_table_and_table_without_key_are_refused(pg_dsn: str) -> None:
    execute(pg_dsn, "CREATE TABLE nokey (v int)")
    with pytest.raises(SourceError, match=r"public\.absent does not exist"):
        async with PostgresSource(make_settings(pg_dsn, "absent"), MemoryCheckpoints()):
            pass
    with pytest.raises(SourceError, match=r"public\.nokey has neither a primary key"):
        async with PostgresSource(make_settings(pg_dsn, "nokey"), MemoryCheckpoints()):
            pass


async def test_catalog_errors_are_source_errors(pg_dsn: str) -> None:
    role = f"app_{uuid.uuid4().hex[:8]}"
    execute(pg_dsn, "CREATE TABLE owned (id int PRIMARY KEY)",
            f"CREATE ROLE {role} LOGIN REPLICATION")
    try:
        dsn = pg_dsn.replace("user=postgres", f"user={role}")
        with pytest.raises(SourceError, match=r"setting up the publication and slot.*InsufficientPrivilege"):
            async with PostgresSource(make_settings(dsn, "owned"), MemoryCheckpoints()):
                pass
    finally:
        execute(pg_dsn, f"DROP ROLE {role}")


async def test_replica_identity_index_serves_as_key(pg_dsn: str) -> None:
    execute(pg_dsn, "CREATE TABLE ri (code text NOT NULL, v int)",
            "CREATE UNIQUE INDEX ri_code ON ri (code)", "ALTER TABLE ri REPLICA IDENTITY USING INDEX ri_code")
    async with running(make_settings(pg_dsn, "ri")) as reader:
        await reader.snapshot()
        execute(pg_dsn, "INSERT INTO ri VALUES ('x', 1)", "DELETE FROM ri")
        insert, delete = await reader.changes(2)
    assert insert.entity_id == "x" and delete.entity_id == "x" and delete.before == {"code": "x"}


async def test_setup_creates_or_completes_the_publication(pg_dsn: str) -> None:
    execute(pg_dsn, "CREATE TABLE x1 (id int PRIMARY KEY)", "CREATE TABLE x2 (id int PRIMARY KEY)",
            "CREATE PUBLICATION tidegate FOR TABLE x1")
    settings = make_settings(pg_dsn, "x1", "x2")
    checkpoints = MemoryCheckpoints()
    source = PostgresSource(settings, checkpoints)
    await source.setup()
    await source.setup()  # idempotent
    await source.close()
    published = select(pg_dsn, "SELECT tablename FROM pg_publication_tables "
                               "WHERE pubname = 'tidegate' ORDER BY 1")
    assert [row["tablename"] for row in published] == ["x1", "x2"]
    slots = select(pg_dsn, "SELECT plugin FROM pg_replication_slots "
                           f"WHERE slot_name = '{settings.slot_name}'")
    assert slots == [{"plugin": "pgoutput"}]
    assert checkpoints.values[f"pg:{settings.slot_name}"]["snapshot_done"] is False


async def test_a_closed_source_cannot_reopen_or_stream(pg_dsn: str) -> None:
    execute(pg_dsn, "CREATE TABLE once (id int PRIMARY KEY)")
    source = PostgresSource(make_settings(pg_dsn, "once"), MemoryCheckpoints())
    async with source:
        pass
    await source.close()  # idempotent
    with pytest.raises(SourceError, match="create a new one"):
        async with source:
            pass
    with pytest.raises(SourceError):
        await anext(aiter(source.transactions()))


async def test_status_reports_slot_lag_and_rows(pg_dsn: str) -> None:
    execute(pg_dsn, "CREATE TABLE st (id int PRIMARY KEY)",
            "INSERT INTO st SELECT generate_series(1, 7)")
    settings = make_settings(pg_dsn, "st")
    checkpoints = MemoryCheckpoints()
    source = PostgresSource(settings, checkpoints)
    before = await source.status()
    assert not before.slot_exists and before.lag_bytes is None and before.snapshot_done is None
    assert before.table_rows == {"st": 7}
    async with source:
        reader = Reader(source)
        for batch in await reader.snapshot():
            await source.confirm_snapshot(batch.snapshot_mark)
        execute(pg_dsn, "INSERT INTO st VALUES (8)")
        tx = await reader.streamed()
        assert tx.position is not None
        await source.confirm(tx.position)
        target = tx.position
        await eventually(lambda: confirmed_flush(pg_dsn, settings.slot_name) >= target,
                         "the confirmed position")
        status = await source.status()
    assert status.slot_exists and status.active and status.snapshot_done is True
    assert status.confirmed_flush_lsn is not None and status.confirmed_flush_lsn >= tx.position
    assert status.lag_bytes == status.current_lsn - status.confirmed_flush_lsn >= 0
    assert status.table_rows == {"st": 8}
    shown = status.to_dict()
    assert shown["slot_name"] == settings.slot_name and "/" in str(shown["confirmed_flush_lsn"])


def test_settings_from_url() -> None:
    settings = PostgresSourceSettings.from_url(
        "postgresql://app:pw@db:5432/shop?sslmode=disable&slot_name=shop_sync&tables=products,users",
        heartbeat_s=5)
    assert settings.dsn == "postgresql://app:pw@db:5432/shop?sslmode=disable"
    assert settings.slot_name == "shop_sync" and settings.tables == ("products", "users")
    assert settings.heartbeat_s == 5
    with pytest.raises(ConfigError, match="slot_name") as raised:
        PostgresSourceSettings.from_url("postgresql://app:pw@db/shop?slot_name=Bad-Name&tables=t")
    assert "pw" not in str(raised.value)
    with pytest.raises(ConfigError, match="source_zone"):
        PostgresSourceSettings.from_url("postgresql://db/shop?tables=t&source_zone=Mars/Olympus")


def test_is_a_change_source(pg_dsn: str) -> None:
    source = PostgresSource(make_settings(pg_dsn, "t"), MemoryCheckpoints())
    assert isinstance(source, ChangeSource)


def test_fixture_names_the_fix_when_binaries_are_missing(tmp_path: Any) -> None:
    from bench.postgres_server import PostgresUnavailable, find_bin_dir

    with pytest.raises(PostgresUnavailable, match="make servers"):
        find_bin_dir(tmp_path / "nowhere")
    for version in ("9.6", "15", "13"):
        (tmp_path / version / "bin").mkdir(parents=True)
        for binary in ("initdb", "pg_ctl"):
            (tmp_path / version / "bin" / binary).touch()
    assert find_bin_dir(tmp_path) == tmp_path / "15" / "bin"
