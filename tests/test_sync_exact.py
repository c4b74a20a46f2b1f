"""The change flow is exact: after every scenario the entity cache equals the database, every
column of every row. Real PostgreSQL (wal_level=logical) feeds the pipeline; the cache and bus are
Redis (Streams) or the in-process ones.

Large values are random text well over 8 KB, so PostgreSQL stores them out of line (compressed,
and uncompressed with STORAGE EXTERNAL) and, with REPLICA IDENTITY DEFAULT or USING INDEX, does not
send them when an update leaves them alone: the scenarios are the ones where filling those columns
goes wrong if it guesses (key changes, swaps, delete and reinsert, a key reused while its old row
is still cached, a transaction bigger than any fixed memory, TRUNCATE, a restart).
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg2  # type: ignore[import-untyped]
import psycopg2.extras  # type: ignore[import-untyped]
import pytest

from support.sync import DictCheckpoints, pg_url, running
from support.sync_exact import cached_rows, database_rows, describe_difference
from support.waiting import eventually
from tidegate.app.sync import open_sync
from tidegate.config import SyncConfig, TidegateConfig
from tidegate.sync.changes import Change, Op, Version
from tidegate.sync.contracts import EntityCache, Transaction
from tidegate.sync.fill import Filler
from tidegate.sync.metrics import SyncMetrics
from tidegate.sync.pipeline import Pipeline
from tidegate.sync.sources.postgres.source import PostgresSource, PostgresSourceSettings
from tidegate.sync.values import Row

pytestmark = pytest.mark.timeout(180)

SETTLE_S = 30.0
# Random text: md5 hex of random numbers, 32 characters each (incompressible enough that
# PostgreSQL keeps it out of line rather than compressing it inline).
BIG = "(SELECT string_agg(md5(random()::text), '') FROM generate_series(1, {n}))"
BIG_TEXT = BIG.format(n=300)  # 9,600 characters
DOCS = """
CREATE TABLE docs (id integer PRIMARY KEY, n integer NOT NULL DEFAULT 0, big text, doc jsonb,
                   ext text);
ALTER TABLE docs ALTER COLUMN ext SET STORAGE EXTERNAL;
"""
DOCS_ROW = f"({{id}}, 0, {BIG_TEXT}, jsonb_build_object('body', {BIG_TEXT}), {BIG_TEXT})"
BACKENDS = ["memory", "redis"]
DOCUMENT_KEYED = {"jk"}  # tables keyed by one jsonb column


# ---------------------------------------------------------------------- database and cache


def transaction(dsn: str, *statements: str) -> int:
    """All statements in one transaction; returns the WAL insert position just before its
    commit (the commit's own position is beyond it)."""
    with contextlib.closing(psycopg2.connect(dsn)) as conn, conn.cursor() as cur:
        for statement in statements:
            cur.execute(statement)
        cur.execute("SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn")
        row = cur.fetchone()
        conn.commit()
    return int(row[0]) if row is not None else 0


def row_count(dsn: str, table: str) -> int:
    with contextlib.closing(psycopg2.connect(dsn)) as conn, conn.cursor() as cur:
        cur.execute(f"SELECT count(*) FROM {table}")
        row = cur.fetchone()
        return int(row[0]) if row is not None else 0


async def assert_cache_equals_db(dsn: str, cache: EntityCache, tables: Mapping[str, Sequence[str]],
                                 timeout_s: float = SETTLE_S) -> None:
    """Wait until every table's rows equal the cache's entries, every column of every row (the
    pipeline runs on another task); on timeout fail listing the differences."""
    async def problems() -> list[str]:
        found = []
        for table, key_columns in tables.items():
            cached, stored = await cache.count(table), await asyncio.to_thread(row_count, dsn, table)
            if cached != stored:  # still applying: no need to compare the rows yet
                found.append(f"{table}: {stored} rows in the database, {cached} cached")
                continue
            expected = await asyncio.to_thread(database_rows, dsn, table, key_columns,
                                               documents=table in DOCUMENT_KEYED)
            actual = await cached_rows(cache, table)
            if expected != actual:
                found.append(f"{table}: {describe_difference(expected, actual, limit=20)}")
        return found

    await eventually(problems, "the cache equals the database", until=lambda found: not found,
                     timeout_s=timeout_s, every_s=0.1,
                     describe=lambda found: f"{len(found)} differences:\n" + "\n".join(found[:20]))


def confirmed_flush(dsn: str, slot: str) -> int:
    with contextlib.closing(psycopg2.connect(dsn)) as conn, conn.cursor() as cur:
        cur.execute("SELECT confirmed_flush_lsn - '0/0'::pg_lsn FROM pg_replication_slots "
                    "WHERE slot_name = %s", (slot,))
        row = cur.fetchone()
        assert row is not None, f"slot {slot} is gone"
        return int(row[0])


# ---------------------------------------------------------------------- a running change flow


@dataclass
class Flow:
    """A running pipeline over some tables of a test database."""

    dsn: str
    sync: SyncConfig
    pipeline: Pipeline
    keys: Mapping[str, Sequence[str]]

    async def settled(self, timeout_s: float = SETTLE_S) -> None:
        """The cache equals the database, every column, and no column was left unfilled."""
        await assert_cache_equals_db(self.dsn, self.pipeline.cache, self.keys, timeout_s)
        assert self.unresolved() == 0

    def unresolved(self) -> float:
        return sum(s.value for m in self.pipeline.metrics.registry.collect() for s in m.samples
                   if s.name == "tidegate_sync_unresolved_unchanged_columns_total")


def sync_config(dsn: str, redis_url: str, backend: str, tables: Sequence[str],
                suffix: str | None = None) -> SyncConfig:
    suffix = suffix or uuid.uuid4().hex[:8]
    url = redis_url if backend == "redis" else "memory://"
    return SyncConfig(source_url=pg_url(dsn), bus_url=url, cache_url=url, tables=tuple(tables),
                      slot=f"s_{suffix}", publication=f"p_{suffix}", prefix=f"x{suffix}",
                      heartbeat_s=None)


@contextlib.asynccontextmanager
async def flowing(dsn: str, sync: SyncConfig, keys: Mapping[str, Sequence[str]],
                  cache: EntityCache | None = None) -> AsyncIterator[Flow]:
    """The pipeline running (stopped, with its drain, on exit), its snapshot applied."""
    config = TidegateConfig.load(queue_url="sqlite:///unused.db").model_copy(update={"sync": sync})
    async with open_sync(config, cache=cache) as pipeline, running(pipeline):
        flow = Flow(dsn, sync, pipeline, keys)
        await flow.settled()
        yield flow


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@contextlib.asynccontextmanager
async def docs_flow(pg_dsn: str, redis_server: str, backend: str, rows: int = 10,
                    identity: str = "DEFAULT") -> AsyncIterator[Flow]:
    transaction(pg_dsn, DOCS, f"ALTER TABLE docs REPLICA IDENTITY {identity}",
                "INSERT INTO docs VALUES " + ", ".join(DOCS_ROW.format(id=i) for i in range(1, rows + 1)))
    sync = sync_config(pg_dsn, redis_server, backend, ["docs"])
    async with flowing(pg_dsn, sync, {"docs": ["id"]}) as flow:
        yield flow


def test_the_large_values_are_stored_out_of_line(pg_dsn: str) -> None:
    # The premise of every scenario here: the values are TOASTed out of line, uncompressed for ext.
    transaction(pg_dsn, DOCS, f"INSERT INTO docs VALUES {DOCS_ROW.format(id=1)}")
    with contextlib.closing(psycopg2.connect(pg_dsn)) as conn, conn.cursor() as cur:
        cur.execute("SELECT length(big), pg_column_size(big), pg_column_size(ext), length(ext), "
                    "pg_total_relation_size(reltoastrelid) FROM docs, pg_class "
                    "WHERE relname = 'docs'")
        length, stored, ext_stored, ext_length, toast_bytes = cur.fetchone()
    assert length == 9600 and ext_length == 9600
    assert ext_stored >= ext_length  # EXTERNAL: not compressed
    assert stored > 2000 and toast_bytes > 3 * 8000  # out of line, in the TOAST table


# ---------------------------------------------------------------------- scenarios


async def test_updates_that_leave_large_values_alone(pg_dsn: str, redis_server: str,
                                                     backend: str) -> None:
    async with docs_flow(pg_dsn, redis_server, backend) as flow:
        # Several updates of one row in one transaction, one changing a large value between two
        # that leave it alone; then later transactions, one per row and one for all rows.
        transaction(pg_dsn, "UPDATE docs SET n = 1 WHERE id = 1",
                    f"UPDATE docs SET big = {BIG_TEXT} WHERE id = 1",
                    "UPDATE docs SET n = 2 WHERE id = 1")
        for i in range(2, 6):
            transaction(pg_dsn, f"UPDATE docs SET n = n + {i} WHERE id = {i}")
        transaction(pg_dsn, "UPDATE docs SET n = n + 100")
        transaction(pg_dsn, f"UPDATE docs SET ext = {BIG_TEXT}, n = -1 WHERE id = 3")
        transaction(pg_dsn, "UPDATE docs SET n = n + 1 WHERE id = 3")
        await flow.settled()


async def test_a_primary_key_update_carries_the_large_values(pg_dsn: str, redis_server: str,
                                                              backend: str) -> None:
    async with docs_flow(pg_dsn, redis_server, backend) as flow:
        transaction(pg_dsn, "UPDATE docs SET id = 1004 WHERE id = 4")
        transaction(pg_dsn, "UPDATE docs SET n = 7 WHERE id = 1004")
        # A key change and an update after it in one transaction, then moved twice more.
        transaction(pg_dsn, "UPDATE docs SET id = 1005 WHERE id = 5", "UPDATE docs SET n = 8 WHERE id = 1005",
                    "UPDATE docs SET id = 2005 WHERE id = 1005")
        transaction(pg_dsn, "UPDATE docs SET id = id + 10000 WHERE id IN (6, 7)")
        await flow.settled()


async def test_keys_swapped_in_one_transaction(pg_dsn: str, redis_server: str, backend: str) -> None:
    async with docs_flow(pg_dsn, redis_server, backend) as flow:
        transaction(pg_dsn, "UPDATE docs SET id = -1 WHERE id = 1", "UPDATE docs SET id = 1 WHERE id = 2",
                    "UPDATE docs SET id = 2 WHERE id = -1", "UPDATE docs SET n = n + 1 WHERE id IN (1, 2)")
        await flow.settled()
        # Swapped back and forth across transactions that follow each other closely.
        for _ in range(3):
            transaction(pg_dsn, "UPDATE docs SET id = -3 WHERE id = 3", "UPDATE docs SET id = 3 WHERE id = 4",
                        "UPDATE docs SET id = 4 WHERE id = -3")
        await flow.settled()


async def test_keys_swapped_by_one_statement_under_a_deferrable_key(
        pg_dsn: str, redis_server: str, backend: str) -> None:
    # A deferrable key lets one statement swap two keys: mid-statement both rows hold one key.
    # (A deferrable key cannot be the replica identity: such a table needs FULL to be updated.)
    transaction(pg_dsn, "CREATE TABLE pairs (id integer, n integer, big text, "
                        "CONSTRAINT pairs_pk PRIMARY KEY (id) DEFERRABLE INITIALLY DEFERRED)",
                "ALTER TABLE pairs REPLICA IDENTITY FULL",
                f"INSERT INTO pairs SELECT g, 0, {BIG_TEXT} FROM generate_series(1, 4) g")
    sync = sync_config(pg_dsn, redis_server, backend, ["pairs"])
    async with flowing(pg_dsn, sync, {"pairs": ["id"]}) as flow:
        transaction(pg_dsn, "UPDATE pairs SET id = 3 - id WHERE id IN (1, 2)",
                    "UPDATE pairs SET n = n + 1 WHERE id = 1")
        transaction(pg_dsn, "UPDATE pairs SET id = 7 - id WHERE id IN (3, 4)")
        await flow.settled()


async def test_delete_and_reinsert_in_one_transaction(pg_dsn: str, redis_server: str,
                                                      backend: str) -> None:
    async with docs_flow(pg_dsn, redis_server, backend) as flow:
        transaction(pg_dsn, "DELETE FROM docs WHERE id = 5",
                    f"INSERT INTO docs VALUES {DOCS_ROW.format(id=5)}", "UPDATE docs SET n = 3 WHERE id = 5")
        transaction(pg_dsn, "UPDATE docs SET n = 4 WHERE id = 5")
        # Reinserted with small values, then updated without touching them.
        transaction(pg_dsn, "DELETE FROM docs WHERE id = 6", "INSERT INTO docs (id, big) VALUES (6, 'small')",
                    "UPDATE docs SET n = 1 WHERE id = 6")
        await flow.settled()


async def test_a_row_moved_onto_a_key_whose_old_row_is_still_cached(
        pg_dsn: str, redis_server: str, backend: str) -> None:
    async with docs_flow(pg_dsn, redis_server, backend) as flow:
        # The old row of key 8 goes in one transaction and row 9 moves onto key 8 in the next,
        # right behind it (the removal may not be applied yet); then the same in one transaction.
        transaction(pg_dsn, "DELETE FROM docs WHERE id = 8")
        transaction(pg_dsn, "UPDATE docs SET id = 8 WHERE id = 9")
        transaction(pg_dsn, "UPDATE docs SET n = 5 WHERE id = 8")
        transaction(pg_dsn, "DELETE FROM docs WHERE id = 1", "UPDATE docs SET id = 1 WHERE id = 2",
                    "UPDATE docs SET n = 6 WHERE id = 1")
        await flow.settled()


async def test_a_transaction_of_fifty_thousand_rows_between_two_updates_of_one_row(
        pg_dsn: str, redis_server: str) -> None:
    async with docs_flow(pg_dsn, redis_server, "memory", rows=3) as flow:
        # Row 1's large value changes; then one transaction changes row 2's, writes 50,000 other
        # rows and updates row 2 again without touching it; then row 1 is updated the same way.
        # Both fills must take the value of the first update, not an older one from the cache.
        transaction(pg_dsn, f"UPDATE docs SET big = {BIG_TEXT} WHERE id = 1")
        transaction(pg_dsn, f"UPDATE docs SET big = {BIG_TEXT} WHERE id = 2",
                    "INSERT INTO docs (id, n) SELECT g, g FROM generate_series(100, 50099) g",
                    "UPDATE docs SET n = n + 1 WHERE id = 2")
        transaction(pg_dsn, "UPDATE docs SET n = n + 1 WHERE id = 1")
        await flow.settled(timeout_s=90)


async def test_truncate_then_rows_again(pg_dsn: str, redis_server: str, backend: str) -> None:
    async with docs_flow(pg_dsn, redis_server, backend) as flow:
        transaction(pg_dsn, "UPDATE docs SET n = 1 WHERE id = 1", "TRUNCATE docs",
                    f"INSERT INTO docs VALUES {DOCS_ROW.format(id=1)}", "UPDATE docs SET n = 2 WHERE id = 1")
        transaction(pg_dsn, f"INSERT INTO docs VALUES {DOCS_ROW.format(id=2)}")
        transaction(pg_dsn, "UPDATE docs SET n = 3")
        await flow.settled()


@pytest.mark.parametrize("identity", ["DEFAULT", "USING INDEX docs_code", "FULL"])
async def test_each_replica_identity(pg_dsn: str, redis_server: str, identity: str) -> None:
    # docs with a second unique key: USING INDEX makes it the key PostgreSQL identifies rows by.
    transaction(pg_dsn, DOCS, "ALTER TABLE docs ADD COLUMN code text",
                "INSERT INTO docs SELECT g, 0, " + BIG_TEXT + ", jsonb_build_object('b', " + BIG_TEXT
                + "), " + BIG_TEXT + ", 'c' || g FROM generate_series(1, 6) g",
                "ALTER TABLE docs ALTER COLUMN code SET NOT NULL",
                "CREATE UNIQUE INDEX docs_code ON docs (code)",
                f"ALTER TABLE docs REPLICA IDENTITY {identity}")
    key = ["code"] if identity.startswith("USING") else ["id"]
    sync = sync_config(pg_dsn, redis_server, "redis", ["docs"])
    async with flowing(pg_dsn, sync, {"docs": key}) as flow:
        transaction(pg_dsn, "UPDATE docs SET n = 1 WHERE id = 1",
                    "UPDATE docs SET id = 102 WHERE id = 2",  # the primary key
                    "UPDATE docs SET code = 'moved' WHERE id = 3")  # the other unique key
        transaction(pg_dsn, "UPDATE docs SET n = n + 1")
        transaction(pg_dsn, "UPDATE docs SET code = 'c4x', id = 104 WHERE id = 4",
                    "DELETE FROM docs WHERE id = 5")
        await flow.settled()


HOSTILE_TEXT_KEYS = ["", " ", "  padded  ", '"', '""', '"quoted"', "[1,2]", "null", "7", "*",
                     "a:b{c}", "ключ ✓ 漢字 🎉", "tab\tnew\nline", "x" * 2000]


async def test_every_key_postgresql_accepts(pg_dsn: str, redis_server: str, backend: str) -> None:
    values = ", ".join(f"(%s, 0, {BIG_TEXT})" for _ in HOSTILE_TEXT_KEYS)
    with contextlib.closing(psycopg2.connect(pg_dsn)) as conn, conn.cursor() as cur:
        cur.execute("CREATE TABLE tk (id text PRIMARY KEY, n integer, big text)")
        cur.execute(f"INSERT INTO tk VALUES {values}", HOSTILE_TEXT_KEYS)
        # A key long and random enough to be stored out of line itself (under the index limit).
        cur.execute(f"INSERT INTO tk VALUES ({BIG.format(n=80)}, 0, {BIG_TEXT})")
        cur.execute("CREATE TABLE ck (a text, b text, n integer, big text, PRIMARY KEY (a, b))")
        cur.execute(f"INSERT INTO ck VALUES ('a,b', 'c', 0, {BIG_TEXT}), ('a', 'b,c', 0, {BIG_TEXT}), "
                    f"('', '', 0, {BIG_TEXT}), ('[', ']', 0, {BIG_TEXT}), ('\"', '', 0, {BIG_TEXT}), "
                    f"('', '\"', 0, {BIG_TEXT})")
        cur.execute("CREATE TABLE uk (id uuid PRIMARY KEY, at timestamptz, n integer, big text)")
        cur.execute(f"INSERT INTO uk SELECT gen_random_uuid(), now(), 0, {BIG_TEXT} "
                    "FROM generate_series(1, 3)")
        cur.execute("CREATE TABLE mk (day date, at timestamp, amount numeric(8, 2), tags text[], "
                    "n integer, big text, PRIMARY KEY (day, at, amount, tags))")
        cur.execute(f"INSERT INTO mk VALUES ('2024-02-29', '2024-02-29 23:59:59.5', -1.50, "
                    f"'{{\"a,b\",\"\"}}', 0, {BIG_TEXT})")
        # jsonb keys: the string "7" and the number 7 are two keys.
        cur.execute("CREATE TABLE jk (id jsonb PRIMARY KEY, n integer, big text)")
        cur.execute(f"INSERT INTO jk SELECT k::jsonb, 0, {BIG_TEXT} FROM unnest(ARRAY["
                    "'\"7\"', '7', '\"\"', '[1]', '\"[1]\"', '{\"a\": 1}']) AS k")
        conn.commit()
    keys = {"tk": ["id"], "ck": ["a", "b"], "uk": ["id"], "mk": ["day", "at", "amount", "tags"],
            "jk": ["id"]}
    sync = sync_config(pg_dsn, redis_server, backend, list(keys))
    async with flowing(pg_dsn, sync, keys) as flow:
        # Every row updated without its large value, keys moved onto and off '' and whitespace.
        transaction(pg_dsn, "UPDATE tk SET n = n + 1", "UPDATE ck SET n = n + 1",
                    "UPDATE uk SET n = n + 1", "UPDATE mk SET n = n + 1", "UPDATE jk SET n = n + 1",
                    "UPDATE jk SET id = '8' WHERE id = '\"7\"'")
        transaction(pg_dsn, "UPDATE tk SET id = 'was empty' WHERE id = ''",
                    "UPDATE tk SET id = '' WHERE id = ' '", "UPDATE ck SET b = 'x' WHERE a = '' AND b = ''",
                    "UPDATE uk SET at = at + interval '1 day'", "UPDATE uk SET id = gen_random_uuid()",
                    "UPDATE mk SET amount = 2.25")
        transaction(pg_dsn, "UPDATE tk SET n = n + 1 WHERE id IN ('', 'was empty')",
                    "UPDATE tk SET n = n + 1 WHERE length(id) > 2000")
        await flow.settled()
        ids = {entry.entity_id async for entry in flow.pipeline.cache.scan("tk")}
        assert '""' in ids and " " not in ids and len(ids) == len(HOSTILE_TEXT_KEYS) + 1


async def test_after_a_restart_unchanged_values_are_read_from_postgresql(
        pg_dsn: str, redis_server: str) -> None:
    # Given rows applied by one run of the sync (its memory of them gone with it) ...
    transaction(pg_dsn, DOCS,
                "INSERT INTO docs VALUES " + ", ".join(DOCS_ROW.format(id=i) for i in range(1, 5)))
    sync = sync_config(pg_dsn, redis_server, "redis", ["docs"])
    async with flowing(pg_dsn, sync, {"docs": ["id"]}):
        pass
    # ... and, while it was down, the cache's copy of row 1 made wrong and key 2's row replaced
    transaction(pg_dsn, "DELETE FROM docs WHERE id = 2", "UPDATE docs SET id = 2 WHERE id = 3")
    async with flowing(pg_dsn, sync, {"docs": ["id"]}) as flow:
        await flow.pipeline.cache.force_update("docs", "1", {"big": "not the database's"})
        # When rows are updated without their large values (and one moves onto a key)
        transaction(pg_dsn, "UPDATE docs SET n = 1 WHERE id IN (1, 2)", "UPDATE docs SET id = 3 WHERE id = 4")
        # Then the values come from PostgreSQL, not from the cache.
        await flow.settled()


async def test_the_confirmed_position_reaches_the_slot_at_once_and_on_stop(
        pg_dsn: str, redis_server: str) -> None:
    transaction(pg_dsn, DOCS, f"INSERT INTO docs VALUES {DOCS_ROW.format(id=1)}")
    # The source's status interval stays at its default (10 s).
    sync = sync_config(pg_dsn, redis_server, "redis", ["docs"])
    async with flowing(pg_dsn, sync, {"docs": ["id"]}) as flow:
        for i in range(2, 12):
            written = transaction(pg_dsn, f"INSERT INTO docs (id, n) VALUES ({i}, {i})")
        await flow.settled()
        # Well within the status interval, the slot shows the applied position.
        await eventually(lambda: confirmed_flush(pg_dsn, sync.slot) > written,
                         "the slot confirms what was applied", timeout_s=3.0)
        last = transaction(pg_dsn, "UPDATE docs SET n = 0 WHERE id = 2")
        await flow.settled()
        await eventually(lambda: (flow.pipeline.last_confirmed or 0) > last, "the pipeline confirms")
    # Stopped: the last confirmed position was sent before the connection closed.
    assert confirmed_flush(pg_dsn, sync.slot) > last
    # A restart replays nothing that was applied: only the new change is applied.
    async with flowing(pg_dsn, sync, {"docs": ["id"]}) as flow:
        transaction(pg_dsn, "UPDATE docs SET n = 1 WHERE id = 3")
        await flow.settled()
        await eventually(lambda: flow.pipeline.applied_changes >= 1, "the new change is applied")
        assert flow.pipeline.applied_changes == 1


# ---------------------------------------------------------------------- the fill, step by step


def fold(state: dict[str, tuple[Version, Row | None]], changes: Sequence[Change]) -> None:
    """Apply changes as the versioned cache does: a change wins only over an older version."""
    for change in changes:
        current = state.get(change.entity_id)
        if current is None or change.version > current[0]:
            state[change.entity_id] = (change.version, change.after if change.op is not Op.DELETE else None)


async def streamed(source: PostgresSource, iterator: Any, count: int) -> list[Transaction]:
    """The next `count` streamed transactions that carry changes."""
    found: list[Transaction] = []
    while len(found) < count:
        transaction = await asyncio.wait_for(iterator.__anext__(), SETTLE_S)
        if transaction.snapshot_mark is not None:
            await source.confirm_snapshot(transaction.snapshot_mark)
        elif transaction.changes:
            found.append(transaction)
    return found


async def test_a_fill_takes_the_value_as_of_the_previous_change_not_the_newest(pg_dsn: str) -> None:
    # Given three commits that all happened before the fill sees the first: a new large value, an
    # update leaving it alone, and another large value.
    first_value, newest_value = secrets.token_hex(5000), secrets.token_hex(5000)
    transaction(pg_dsn, DOCS, f"INSERT INTO docs VALUES {DOCS_ROW.format(id=1)}")
    settings = PostgresSourceSettings(dsn=pg_dsn, tables=("docs",), slot_name=f"s_{uuid.uuid4().hex[:8]}")
    async with PostgresSource(settings, DictCheckpoints()) as source:
        iterator = source.transactions().__aiter__()
        filler = Filler(source, SyncMetrics())
        await filler.fill(await asyncio.wait_for(iterator.__anext__(), SETTLE_S))  # the snapshot
        transaction(pg_dsn, f"UPDATE docs SET big = '{first_value}' WHERE id = 1")
        transaction(pg_dsn, "UPDATE docs SET n = 1 WHERE id = 1")
        transaction(pg_dsn, f"UPDATE docs SET big = '{newest_value}' WHERE id = 1")
        first, second, third = await streamed(source, iterator, 3)
        assert "big" in second.changes[0].unchanged  # PostgreSQL did not send it
        # When the fill passes them on (none applied yet)
        filled = [await filler.fill(t) for t in (first, second, third)]
    # Then the middle one carries the value its predecessor left, not the database's newest.
    middle = filled[1].changes[0]
    assert middle.unchanged == () and middle.after is not None
    assert middle.after["big"] == first_value


async def test_a_value_read_ahead_of_the_stream_is_not_carried_to_a_new_key(pg_dsn: str) -> None:
    # Given row 1 updated without its large values, then moved to key 2, then a new row on key 1,
    # all committed before the fill reads the first: reading key 1 for the first finds the new row.
    transaction(pg_dsn, DOCS, f"INSERT INTO docs VALUES {DOCS_ROW.format(id=1)}")
    settings = PostgresSourceSettings(dsn=pg_dsn, tables=("docs",), slot_name=f"s_{uuid.uuid4().hex[:8]}")
    state: dict[str, tuple[Version, Row | None]] = {}
    async with PostgresSource(settings, DictCheckpoints()) as source:
        iterator = source.transactions().__aiter__()
        snapshot = await asyncio.wait_for(iterator.__anext__(), SETTLE_S)
        await source.confirm_snapshot(snapshot.snapshot_mark)
        fold(state, snapshot.changes)
        filler = Filler(source, SyncMetrics())  # a fresh process: nothing in memory
        transaction(pg_dsn, "UPDATE docs SET n = 1 WHERE id = 1")
        transaction(pg_dsn, "UPDATE docs SET id = 2 WHERE id = 1")
        transaction(pg_dsn, f"INSERT INTO docs VALUES {DOCS_ROW.format(id=1)}")
        for streamed_transaction in await streamed(source, iterator, 3):
            fold(state, (await filler.fill(streamed_transaction)).changes)
    # Then row 2 has its own large values (read again under its new key), and both rows equal
    # the database's, every column.
    expected = database_rows(pg_dsn, "docs", ["id"])
    actual = {key: row for key, (_, row) in state.items() if row is not None}
    assert expected == actual, describe_difference(expected, actual)


async def test_a_read_back_waits_until_the_transaction_that_asked_is_visible(pg_dsn: str) -> None:
    transaction(pg_dsn, DOCS)
    settings = PostgresSourceSettings(dsn=pg_dsn, tables=("docs",), slot_name=f"s_{uuid.uuid4().hex[:8]}")
    # (The slot is created first: creating one waits for transactions in progress.)
    async with PostgresSource(settings, DictCheckpoints()) as source:
        # Given a transaction that has written a row but is not visible yet (not committed) ...
        writer = psycopg2.connect(pg_dsn)
        try:
            with writer.cursor() as cur:
                cur.execute(f"INSERT INTO docs VALUES {DOCS_ROW.format(id=50)}")
                cur.execute("SELECT txid_current() & 4294967295")
                row = cur.fetchone()
                assert row is not None
                xid = int(row[0])
            # When the fill reads its row back on behalf of it
            read = asyncio.create_task(source.read_rows("docs", [("50",)], ["big"], xid=xid))
            await asyncio.sleep(0.3)  # a window for a wrong answer: what is asserted is that none comes
            assert not read.done()  # waiting for it, not answering "no such row"
            await asyncio.to_thread(writer.commit)
            result = await asyncio.wait_for(read, SETTLE_S)
        finally:
            writer.close()
        # Then the read sees it; a read for a transaction long visible answers at once.
        assert result.rows["50"]["big"] == database_rows(pg_dsn, "docs", ["id"])["50"]["big"]
        again = await asyncio.wait_for(source.read_rows("docs", [("50",)], ["n"], xid=xid), 1.0)
        assert again.rows["50"] == {"id": 50, "n": 0}
