"""Schema changes while `tidegate sync` runs (PostgreSQL → bus → Redis cache): after each one the
cache holds exactly the database's rows, every column compared — the rows the stream never
touched again included (they are re-read: tidegate.sync.backfill)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import uuid
from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime
from typing import Any

import psycopg2  # type: ignore[import-untyped]
import pytest

from support.sync import execute, in_one_transaction, pg_url, running
from support.sync_exact import cached_rows, database_rows, wait_until_exact
from support.waiting import eventually
from tidegate.app.sync import open_sync
from tidegate.config import SyncConfig, TidegateConfig
from tidegate.sync.backfill import SCHEMA_PREFIX, schema_message
from tidegate.sync.changes import MAX_ORDINAL, Op, Version
from tidegate.sync.contracts import Transaction
from tidegate.sync.pipeline import Pipeline
from tidegate.sync.sources.postgres.catalog import TableInfo
from tidegate.sync.sources.postgres.pgoutput import (
    COLUMN_IN_KEY,
    TEXT,
    Begin,
    Column,
    ColumnValue,
    Commit,
    Insert,
    LogicalMessage,
    Message,
    Relation,
)
from tidegate.sync.sources.postgres.stream import TransactionAssembler

pytestmark = pytest.mark.timeout(120)

ITEMS = """
CREATE TABLE items (id integer PRIMARY KEY, name text NOT NULL, price numeric(10, 2), qty integer,
                    body text);
INSERT INTO items SELECT g, 'item ' || g, g / 4.0, g, repeat(md5(g::text), g % 5)
FROM generate_series(1, 40) g;
"""
OTHER = """
CREATE TABLE other (k text PRIMARY KEY, v integer);
INSERT INTO other SELECT 'k' || g, g FROM generate_series(1, 10) g;
"""


async def sql(dsn: str, *statements: str) -> None:
    """`execute` off the event loop: a DDL statement may wait for the sync's snapshot
    transaction, which needs the loop to go on."""
    await asyncio.to_thread(execute, dsn, *statements)


async def sql_in_one_transaction(dsn: str, *statements: str) -> None:
    """`in_one_transaction` off the event loop (see `sql`)."""
    await asyncio.to_thread(in_one_transaction, dsn, *statements)


def sync_config(dsn: str, redis_url: str, tables: Sequence[str], suffix: str) -> TidegateConfig:
    # Small backfill batches (bounded batches are the point) and a fast catalog check.
    sync = SyncConfig(source_url=f"{pg_url(dsn)}?schema_check_s=0.2&snapshot_batch_size=7",
                      cache_url=redis_url, tables=tuple(tables), slot=f"s_{suffix}",
                      publication=f"p_{suffix}", prefix=f"t{suffix}", heartbeat_s=None)
    return TidegateConfig.load(queue_url="sqlite:///unused.db").model_copy(update={"sync": sync})


@contextlib.asynccontextmanager
async def syncing(config: TidegateConfig) -> AsyncIterator[Pipeline]:
    """The change flow running in this process until the block ends."""
    async with open_sync(config) as pipeline, running(pipeline):
        yield pipeline


def counter(pipeline: Pipeline, name: str, entity_type: str) -> float:
    return sum(sample.value for metric in pipeline.metrics.registry.collect()
               for sample in metric.samples
               if sample.name == name and sample.labels.get("entity_type") == entity_type)


@pytest.fixture
def suffix() -> str:
    return uuid.uuid4().hex[:8]


async def test_add_column_reads_null_or_its_default_in_rows_untouched_since(
    pg_dsn: str, redis_server: str, suffix: str,
) -> None:
    await sql(pg_dsn, ITEMS)
    async with syncing(sync_config(pg_dsn, redis_server, ["items"], suffix)) as pipeline:
        await wait_until_exact(pg_dsn, "items", pipeline.cache)
        # When a column without a default is added and one row is written (a Relation message)
        await sql(pg_dsn, "ALTER TABLE items ADD COLUMN note text",
                  "UPDATE items SET note = 'written' WHERE id = 3")
        # Then every cached row has it: NULL where untouched, the value where written
        rows = await wait_until_exact(pg_dsn, "items", pipeline.cache)
        assert rows["1"]["note"] is None and rows["3"]["note"] == "written"
        # When columns with a constant and a volatile default are added and nothing writes to
        # the table afterwards (only the catalog check can tell)
        await sql(pg_dsn, "ALTER TABLE items ADD COLUMN colour text DEFAULT 'red'",
                  "ALTER TABLE items ADD COLUMN token double precision DEFAULT random()")
        # Then the rows read the default, and each row its own value of the volatile one
        rows = await wait_until_exact(pg_dsn, "items", pipeline.cache)
        assert {row["colour"] for row in rows.values()} == {"red"}
        assert len({row["token"] for row in rows.values()}) == len(rows)
        assert counter(pipeline, "tidegate_sync_backfills_total", "items") >= 2
        assert counter(pipeline, "tidegate_sync_backfill_rows_total", "items") >= 2 * len(rows)


async def test_drop_alter_type_and_rename_columns_are_reflected_in_every_cached_row(
    pg_dsn: str, redis_server: str, suffix: str,
) -> None:
    await sql(pg_dsn, ITEMS)
    async with syncing(sync_config(pg_dsn, redis_server, ["items"], suffix)) as pipeline:
        await wait_until_exact(pg_dsn, "items", pipeline.cache)
        # DROP COLUMN: gone from every cached row
        await sql(pg_dsn, "ALTER TABLE items DROP COLUMN body", "UPDATE items SET qty = 0 WHERE id = 1")
        rows = await wait_until_exact(pg_dsn, "items", pipeline.cache)
        assert all("body" not in row for row in rows.values())
        # ALTER COLUMN TYPE: cached values read in the new type's form ("2.50" → "2.500", 7 → "7")
        await sql(pg_dsn, "ALTER TABLE items ALTER COLUMN price TYPE numeric(12, 3)",
                  "ALTER TABLE items ALTER COLUMN qty TYPE text")
        rows = await wait_until_exact(pg_dsn, "items", pipeline.cache)
        assert rows["10"]["price"] == "2.500" and rows["7"]["qty"] == "7"
        # RENAME COLUMN, a plain one and the key: the rows carry the new names, not the old
        await sql(pg_dsn, "ALTER TABLE items RENAME COLUMN name TO title",
                  "UPDATE items SET title = 'renamed' WHERE id = 2")
        await sql(pg_dsn, "ALTER TABLE items RENAME COLUMN id TO item_id")
        rows = await wait_until_exact(pg_dsn, "items", pipeline.cache)
        assert set(rows["40"]) == {"item_id", "title", "price", "qty"}
        await sql(pg_dsn, "UPDATE items SET title = 'after the rename' WHERE item_id = 5",
                  "DELETE FROM items WHERE item_id = 6", "INSERT INTO items VALUES (41, 'new', 1, '1')")
        await wait_until_exact(pg_dsn, "items", pipeline.cache)


async def test_streamed_changes_win_over_the_backfill_whatever_the_order(
    pg_dsn: str, redis_server: str, suffix: str,
) -> None:
    await sql(pg_dsn, ITEMS, "INSERT INTO items SELECT g, 'item ' || g, g, g FROM generate_series(41, 600) g")
    async with syncing(sync_config(pg_dsn, redis_server, ["items"], suffix)) as pipeline:
        await wait_until_exact(pg_dsn, "items", pipeline.cache)
        # Given writers that keep updating, deleting and inserting rows while the table is re-read
        stop, written = threading.Event(), [0]

        def write() -> None:
            n = 0
            with contextlib.closing(psycopg2.connect(pg_dsn)) as conn:
                conn.autocommit = True
                with conn.cursor() as cur:
                    while not stop.is_set():
                        n += 1
                        written[0] = n
                        # Rows 1..100 are left to the transaction below.
                        cur.execute("UPDATE items SET qty = qty + 1 WHERE id = %s", (n % 500 + 101,))
                        cur.execute("DELETE FROM items WHERE id = %s", ((n * 7) % 500 + 101,))
                        cur.execute("INSERT INTO items (id, name) VALUES (%s, 'w') ON CONFLICT (id) "
                                    "DO UPDATE SET name = 'again'", ((n * 7) % 500 + 101,))

        writer = threading.Thread(target=write, daemon=True)
        writer.start()
        try:
            # When the schema changes inside a transaction that writes before and after the ALTER
            await sql_in_one_transaction(pg_dsn, "UPDATE items SET name = 'before' WHERE id = 1",
                                         "ALTER TABLE items ADD COLUMN extra integer DEFAULT 5",
                                         "UPDATE items SET extra = 6 WHERE id = 2")
            after_alter = written[0]
            await eventually(lambda: written[0] >= after_alter + 50, "the writer writes on after the ALTER")
        finally:
            stop.set()
            await asyncio.to_thread(writer.join)
        # Then the cache ends exactly equal to the database
        rows = await wait_until_exact(pg_dsn, "items", pipeline.cache)
        assert rows["2"]["extra"] == 6 and rows["1"]["name"] == "before"
        # ... and rows the stream did not touch again carry the backfill's version, the ones it
        # did a later streamed one
        backfilled = [entry.version async for entry in pipeline.cache.scan("items")
                      if entry.version.ordinal == MAX_ORDINAL]
        assert backfilled and all(isinstance(v, Version) for v in backfilled)


async def test_a_type_change_of_an_out_of_line_column_left_unchanged_by_later_updates(
    pg_dsn: str, redis_server: str, suffix: str,
) -> None:
    # Given rows whose jsonb document is stored out of line (random text, > 8 KB, incompressible)
    big = "(SELECT jsonb_build_object('text', string_agg(md5(random()::text), '')) " \
          "FROM generate_series(1, 400))"
    await sql(pg_dsn, "CREATE TABLE docs (id integer PRIMARY KEY, n integer, doc jsonb)",
              *(f"INSERT INTO docs VALUES ({i}, 0, {big})" for i in range(1, 6)))
    async with syncing(sync_config(pg_dsn, redis_server, ["docs"], suffix)) as pipeline:
        await wait_until_exact(pg_dsn, "docs", pipeline.cache)
        # When its type changes (every value now reads as text, not as a JSON object) between
        # updates that leave it alone, in one transaction, and right after it
        await sql_in_one_transaction(pg_dsn, "UPDATE docs SET n = 1 WHERE id = 1",
                                     "ALTER TABLE docs ALTER COLUMN doc TYPE text USING doc::text",
                                     "UPDATE docs SET n = 2 WHERE id = 1")
        await sql(pg_dsn, "UPDATE docs SET n = 3 WHERE id = 1", "UPDATE docs SET n = 3 WHERE id = 2")
        # Then every row, the updated ones included, holds the document in its new form
        rows = await wait_until_exact(pg_dsn, "docs", pipeline.cache)
        assert all(isinstance(row["doc"], str) and len(row["doc"]) > 8000 for row in rows.values())


async def test_truncate_empties_the_cached_table_and_later_rows_arrive(
    pg_dsn: str, redis_server: str, suffix: str,
) -> None:
    await sql(pg_dsn, ITEMS)
    async with syncing(sync_config(pg_dsn, redis_server, ["items"], suffix)) as pipeline:
        await wait_until_exact(pg_dsn, "items", pipeline.cache)
        await sql(pg_dsn, "TRUNCATE items")
        assert await wait_until_exact(pg_dsn, "items", pipeline.cache) == {}
        await sql(pg_dsn, "INSERT INTO items VALUES (1, 'back', 1, 1, 'x')")
        await wait_until_exact(pg_dsn, "items", pipeline.cache)


async def test_a_dropped_table_loses_its_rows_is_followed_again_when_recreated_and_no_restart_fails(
    pg_dsn: str, redis_server: str, suffix: str,
) -> None:
    await sql(pg_dsn, ITEMS, OTHER)
    config = sync_config(pg_dsn, redis_server, ["items", "other"], suffix)
    async with syncing(config) as pipeline:
        await wait_until_exact(pg_dsn, "items", pipeline.cache)
        # When a followed table is dropped: its cached rows go (the database has none)
        await sql(pg_dsn, "DROP TABLE items")
        assert await wait_until_exact(pg_dsn, "items", pipeline.cache) == {}
        # ... the other table is still followed
        await sql(pg_dsn, "UPDATE other SET v = -1 WHERE k = 'k1'")
        await wait_until_exact(pg_dsn, "other", pipeline.cache)
        # When it is created again, with other columns: followed again, rows and changes
        await sql(pg_dsn, "CREATE TABLE items (id integer PRIMARY KEY, label text)",
                  "INSERT INTO items SELECT g, 'l' || g FROM generate_series(1, 9) g")
        await wait_until_exact(pg_dsn, "items", pipeline.cache)
        await sql(pg_dsn, "UPDATE items SET label = 'changed' WHERE id = 4")
        await wait_until_exact(pg_dsn, "items", pipeline.cache)
    # When it is dropped while the sync is stopped, a restart neither fails nor keeps its rows
    await sql(pg_dsn, "DROP TABLE items")
    async with syncing(config) as pipeline:
        assert await wait_until_exact(pg_dsn, "items", pipeline.cache) == {}
        await sql(pg_dsn, "UPDATE other SET v = -2 WHERE k = 'k2'")
        await wait_until_exact(pg_dsn, "other", pipeline.cache)


async def test_a_newly_configured_table_is_read_and_an_unconfigured_published_one_ignored(
    pg_dsn: str, redis_server: str, suffix: str,
) -> None:
    await sql(pg_dsn, ITEMS, OTHER)
    async with syncing(sync_config(pg_dsn, redis_server, ["items"], suffix)) as pipeline:
        await wait_until_exact(pg_dsn, "items", pipeline.cache)
        # A table added to the publication by hand but not configured is not followed
        await sql(pg_dsn, f"ALTER PUBLICATION p_{suffix} ADD TABLE other",
                  "UPDATE other SET v = 0 WHERE k = 'k3'", "UPDATE items SET qty = 0 WHERE id = 1")
        await wait_until_exact(pg_dsn, "items", pipeline.cache)
        assert await cached_rows(pipeline.cache, "other") == {}
    # Written while the sync was stopped, before it was configured: every row arrives all the same
    await sql(pg_dsn, "UPDATE other SET v = 100 WHERE k = 'k4'", "INSERT INTO other VALUES ('k99', 99)")
    async with syncing(sync_config(pg_dsn, redis_server, ["items", "other"], suffix)) as pipeline:
        await wait_until_exact(pg_dsn, "other", pipeline.cache)
        await sql(pg_dsn, "DELETE FROM other WHERE k = 'k5'", "UPDATE items SET qty = 1 WHERE id = 1")
        await wait_until_exact(pg_dsn, "other", pipeline.cache)
        await wait_until_exact(pg_dsn, "items", pipeline.cache)
    # Configured out, changed meanwhile (rows deleted among them), then configured again: what
    # the cache kept of it from before is replaced, deleted rows included
    async with syncing(sync_config(pg_dsn, redis_server, ["items"], suffix)) as pipeline:
        # (while it is not configured: the stream passes these by, and confirms past them)
        await sql(pg_dsn, "DELETE FROM other WHERE k IN ('k1', 'k2')",
                  "UPDATE other SET v = -7 WHERE k = 'k6'", "UPDATE items SET qty = 2 WHERE id = 1")
        await wait_until_exact(pg_dsn, "items", pipeline.cache)
    async with syncing(sync_config(pg_dsn, redis_server, ["items", "other"], suffix)) as pipeline:
        await wait_until_exact(pg_dsn, "other", pipeline.cache)
        await sql(pg_dsn, "UPDATE other SET v = 8 WHERE k = 'k7'")
        await wait_until_exact(pg_dsn, "other", pipeline.cache)


async def test_a_schema_change_while_the_sync_is_stopped_is_found_at_restart(
    pg_dsn: str, redis_server: str, suffix: str,
) -> None:
    await sql(pg_dsn, ITEMS)
    config = sync_config(pg_dsn, redis_server, ["items"], suffix)
    async with syncing(config) as pipeline:
        await wait_until_exact(pg_dsn, "items", pipeline.cache)
    # When a column is added (and nothing written) while no sync runs
    await sql(pg_dsn, "ALTER TABLE items ADD COLUMN stock integer NOT NULL DEFAULT 3")
    async with syncing(config) as pipeline:
        # Then the restarted sync re-reads the table, and records the shape it now holds
        rows = await wait_until_exact(pg_dsn, "items", pipeline.cache)
        assert {row["stock"] for row in rows.values()} == {3}

        async def recorded() -> bool:
            checkpoint: Any = await pipeline.cache.get_checkpoint(f"pg:s_{suffix}")
            return any(column[0] == "stock" for column in checkpoint["shapes"]["items"])

        await eventually(recorded, "the new shape is recorded in the checkpoint")
    assert database_rows(pg_dsn, "items") == rows


# ---------------------------------------------------------------------- the assembler's rules
# (pure: messages built by hand, no server)

T0 = datetime(2026, 1, 1, tzinfo=UTC)
DOCS_INFO = TableInfo(schema="public", name="docs", relation_id=7, columns=("id", "n"),
                      type_oids={"id": 23, "n": 23}, key_columns=("id",), key_types=("integer",),
                      replica_identity="d", toastable=())


def relation(*columns: tuple[str, int]) -> Relation:
    return Relation(7, "public", "docs", "d", tuple(
        Column(COLUMN_IN_KEY if index == 0 else 0, name, oid, -1)
        for index, (name, oid) in enumerate(columns)))


def transaction(assembler: TransactionAssembler, lsn: int, *messages: Message) -> Transaction:
    assert assembler.feed(Begin(lsn, T0, lsn)) is None
    for message in messages:
        assert assembler.feed(message) is None
    done = assembler.feed(Commit(0, lsn, lsn + 8, T0))
    assert done is not None
    return done


def row(*values: str) -> tuple[ColumnValue, ...]:
    return tuple(ColumnValue(TEXT, value.encode()) for value in values)


def test_a_relation_message_with_another_shape_asks_for_a_backfill_at_its_commit() -> None:
    shape = (("id", 23, -1), ("n", 23, -1))
    assembler = TransactionAssembler([DOCS_INFO], UTC, shapes={"docs": shape})
    # The known shape again (every new session sends it): nothing to re-read
    first = transaction(assembler, 100, relation(("id", 23), ("n", 23)), Insert(7, row("1", "2")))
    assert assembler.take_backfills(first.position) == []
    # A column added: a backfill at (this commit, the top ordinal), above the changes it holds
    second = transaction(assembler, 200, relation(("id", 23), ("n", 23), ("c", 25)),
                         Insert(7, row("2", "3", "x")))
    (request,) = assembler.take_backfills(second.position)
    assert request.version == Version(200, MAX_ORDINAL) > second.changes[0].version
    assert request.entity_type == "docs" and request.shape == (*shape, ("c", 25, -1))
    assert assembler.take_backfills(second.position) == []  # taken once


def test_a_renamed_key_column_keeps_identifying_rows() -> None:
    assembler = TransactionAssembler([DOCS_INFO], UTC)
    transaction(assembler, 100, relation(("id", 23), ("n", 23)), Insert(7, row("1", "2")))
    renamed = transaction(assembler, 200, relation(("key", 23), ("n", 23)), Insert(7, row("5", "6")))
    (change,) = renamed.changes
    assert change.key == {"key": 5} and change.after == {"key": 5, "n": 6}
    table = assembler.table("docs")
    assert table is not None and table.key_columns == ("key",)


def test_a_renamed_composite_key_column_is_recognised_without_an_earlier_message() -> None:
    # Given the catalog's view at start (key a, b) and a replayed message from before a rename
    # the other way round (x was renamed to a since), the key is (x, b) for that message
    pairs = TableInfo(schema="public", name="docs", relation_id=7, columns=("a", "b", "v"),
                      type_oids={"a": 25, "b": 23, "v": 23}, key_columns=("a", "b"),
                      key_types=("text", "integer"), replica_identity="d", toastable=("a",))
    assembler = TransactionAssembler([pairs], UTC)
    message = Relation(7, "public", "docs", "d", (Column(COLUMN_IN_KEY, "x", 25, -1),
                                                  Column(COLUMN_IN_KEY, "b", 23, -1),
                                                  Column(0, "v", 23, -1)))
    (change,) = transaction(assembler, 100, message, Insert(7, row("", "2", "3"))).changes
    assert change.key == {"x": "", "b": 2}


def test_a_schema_message_for_a_dropped_table_truncates_it_once() -> None:
    assembler = TransactionAssembler([DOCS_INFO], UTC, shapes={"docs": (("id", 23, -1),)})
    gone = LogicalMessage(True, 300, SCHEMA_PREFIX, schema_message("docs", None).encode())
    dropped = transaction(assembler, 300, gone)
    assert [c.op for c in dropped.changes] == [Op.TRUNCATE]
    (request,) = assembler.take_backfills(dropped.position)
    assert request.shape is None and assembler.shapes["docs"] is None
    again = transaction(assembler, 400, gone)  # announced twice: the second changes nothing
    assert again.changes == () and assembler.take_backfills(again.position) == []
