"""The change flow end to end: a source's commits reach the entity cache through every bus, the
cache ends equal to the database, positions are confirmed only after the cache applied them,
unchanged TOAST columns are filled, and refresh rules enqueue each AI job once."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import sqlite3
import uuid
from pathlib import Path
from typing import Any

import psycopg2  # type: ignore[import-untyped]
import pytest

from support.sync import cached_checksums, checksums_of, in_one_transaction, pg_url, running, wait_until_equal
from support.waiting import eventually
from tidegate._eventloop import freeze_loaded, server_gc
from tidegate.app.sync import open_sync
from tidegate.config import RefreshRule, SyncConfig, TidegateConfig
from tidegate.demo.shop import SHOP_TABLES, ShopLoad, create_shop
from tidegate.jobs import Priority
from tidegate.queue import Queue
from tidegate.sync.cache import cache_for
from tidegate.sync.changes import entity_id_of
from tidegate.sync.contracts import EntityCache
from tidegate.sync.pipeline import Pipeline, PipelineSettings
from tidegate.sync.values import normalise_timestamp

pytestmark = pytest.mark.timeout(120)

SHOP_KEYS = {"products": ["id"], "users": ["id"], "interactions": ["id"]}
SHOP_TIMESTAMPS = {"products": ("updated_at",), "users": ("created_at",), "interactions": ("created_at",)}


def _config(sync: SyncConfig, queue_url: str = "sqlite:///unused.db") -> TidegateConfig:
    return TidegateConfig.load(queue_url=queue_url).model_copy(update={"sync": sync})


def _shop_rows(path: Path, table: str) -> dict[str, dict[str, Any]]:
    with contextlib.closing(sqlite3.connect(path)) as conn:
        conn.row_factory = sqlite3.Row
        rows = [dict(row) for row in conn.execute(f"SELECT * FROM {table}")]
    for row in rows:
        for column in SHOP_TIMESTAMPS[table]:
            row[column] = normalise_timestamp(row[column])
    return {entity_id_of(row, SHOP_KEYS[table]): row for row in rows}


async def _shop_matches(path: Path, cache: EntityCache) -> None:
    for table in SHOP_TABLES:
        async def source(table: str = table) -> dict[str, str]:
            return checksums_of(await asyncio.to_thread(_shop_rows, path, table))

        async def cached(table: str = table) -> dict[str, str]:
            return await cached_checksums(cache, table)

        await wait_until_equal(source, cached)


def _outbox_depth(path: Path) -> int:
    with contextlib.closing(sqlite3.connect(path)) as conn:
        return int(conn.execute("SELECT count(*) FROM _tidegate_outbox").fetchone()[0])


@pytest.mark.parametrize("cache_kind", ["memory", "redis"])
async def test_the_shop_reaches_the_cache_and_the_outbox_is_emptied_behind_it(
    tmp_path: Path, redis_server: str, cache_kind: str,
) -> None:
    shop = tmp_path / "shop.db"
    create_shop(shop, products=120, users=40, interactions=200)
    cache_url = "memory://" if cache_kind == "memory" else redis_server
    sync = SyncConfig(source_url=f"sqlite:///{shop}", cache_url=cache_url, prefix=f"t{uuid.uuid4().hex[:8]}")
    async with open_sync(_config(sync)) as pipeline, running(pipeline):
        await _shop_matches(shop, pipeline.cache)  # the snapshot
        written = await ShopLoad(shop).run(rate_per_s=400, duration_s=1.5)
        assert written["interaction"] > 0 and sum(written.values()) > 300
        await _shop_matches(shop, pipeline.cache)  # the stream
        async def outbox_empty() -> bool:
            return await asyncio.to_thread(_outbox_depth, shop) == 0

        await eventually(outbox_empty, "the outbox is empty")
    assert pipeline.last_confirmed is not None
    samples = {s.name: s.value for m in pipeline.metrics.registry.collect() for s in m.samples
               if s.labels.get("entity_type") == "interactions"}
    assert samples["tidegate_sync_commit_to_applied_seconds_count"] > 0


async def test_on_loaded_is_called_once_after_the_snapshot_and_the_stream_caught_up(
    tmp_path: Path,
) -> None:
    # Given a shop whose snapshot the change flow takes, with a hook that notes what was applied
    shop = tmp_path / "shop.db"
    create_shop(shop, products=60, users=20, interactions=100)
    sync = SyncConfig(source_url=f"sqlite:///{shop}", prefix=f"t{uuid.uuid4().hex[:8]}")
    seen: list[int] = []
    async with open_sync(_config(sync)) as opened:
        pipeline = Pipeline(opened.source, opened.bus, opened.cache, opened.entity_types,
                            settings=opened.settings, on_loaded=lambda: seen.append(pipeline.applied_changes))
        async with running(pipeline):
            await _shop_matches(shop, pipeline.cache)
            # When the stream brings commits, several batches of them
            await ShopLoad(shop).run(rate_per_s=200, duration_s=1.0)
            await _shop_matches(shop, pipeline.cache)
    # Then the hook ran once, with the whole snapshot applied
    assert len(seen) == 1
    assert seen[0] >= 60 + 20 + 100


def test_freeze_loaded_freezes_only_inside_a_tidegate_process() -> None:
    assert freeze_loaded() is False
    with server_gc():
        before = gc.get_freeze_count()
        kept = [[index] for index in range(1000)]  # containers alive after server_gc began
        assert freeze_loaded() is True
        assert gc.get_freeze_count() >= before + len(kept)
    assert gc.get_freeze_count() == 0


async def test_a_restart_resumes_from_the_cache_and_replays_enqueue_no_second_refresh_job(
    tmp_path: Path, redis_server: str,
) -> None:
    shop = tmp_path / "shop.db"
    create_shop(shop, products=30, users=5, interactions=0)
    rule = RefreshRule(entity_type="products", columns=("name", "description"), text="{name}\n{description}")
    sync = SyncConfig(source_url=f"sqlite:///{shop}", cache_url=redis_server, bus_url=redis_server,
                      prefix=f"t{uuid.uuid4().hex[:8]}", refresh=(rule,))
    config = _config(sync, queue_url=f"sqlite:///{tmp_path / 'queue.db'}")
    async with Queue.from_url(config.queue_url) as queue:
        async with open_sync(config, queue=queue) as pipeline, running(pipeline):
            await _shop_matches(shop, pipeline.cache)
            assert (await queue.stats()).levels[Priority.LOW].depth == 30  # every product is new
            with contextlib.closing(sqlite3.connect(shop)) as conn, conn:
                conn.execute("UPDATE products SET name = name || ' (new)' WHERE rowid <= 3")
                conn.execute("UPDATE products SET price = price + 1 WHERE rowid > 3")  # no AI work
            await _shop_matches(shop, pipeline.cache)
        assert (await queue.stats()).levels[Priority.LOW].depth == 33

        # A restart with the same (Redis) cache resumes: no second snapshot, no job enqueued twice
        async with open_sync(config, queue=queue) as pipeline, running(pipeline):
            with contextlib.closing(sqlite3.connect(shop)) as conn, conn:
                conn.execute("UPDATE products SET description = 'changed' WHERE rowid = 10")
            await _shop_matches(shop, pipeline.cache)
            await eventually(lambda: pipeline.applied_changes >= 1, "the change is applied")
        assert pipeline.applied_changes == 1
        assert (await queue.stats()).levels[Priority.LOW].depth == 34
        job = next(j for j in await _jobs(queue) if "changed" in str(j.payload))
        assert job.payload["kind"] == "embeddings" and job.tenant == "tidegate-sync"


async def _jobs(queue: Queue) -> list[Any]:
    jobs = []
    while (claimed := await queue.claim("t", limit=100)):
        jobs.extend(claimed)
    return jobs


# ---------------------------------------------------------------------- PostgreSQL

ITEMS = """
CREATE TABLE items (id integer PRIMARY KEY, name text NOT NULL, body text, price numeric(10, 2),
                    seen timestamptz);
"""
SEED = "INSERT INTO items SELECT g, 'item ' || g, NULL, g, now() FROM generate_series(1, {}) g"


def _pg_rows(dsn: str) -> dict[str, dict[str, Any]]:
    with contextlib.closing(psycopg2.connect(dsn)) as conn, conn.cursor() as cur:
        cur.execute("SELECT id, name, body, price, seen FROM items")
        names = [d.name for d in cur.description]
        return {str(row[0]): dict(zip(names, row, strict=True)) for row in cur.fetchall()}


def _confirmed(dsn: str, slot: str) -> int:
    with contextlib.closing(psycopg2.connect(dsn)) as conn, conn.cursor() as cur:
        cur.execute("SELECT confirmed_flush_lsn - '0/0'::pg_lsn FROM pg_replication_slots "
                    "WHERE slot_name = %s", (slot,))
        return int(cur.fetchone()[0])


@pytest.mark.parametrize("bus", ["memory", "redis", "kafka", "redis-debezium", "kafka-debezium"])
async def test_postgresql_commits_reach_the_cache_through_every_bus(
    pg_dsn: str, redis_server: str, bus: str, request: pytest.FixtureRequest,
) -> None:
    backend, _, form = bus.partition("-")
    bus_url = {"memory": "memory://", "redis": redis_server}.get(backend) or request.getfixturevalue(
        "kafka_broker").bus_url
    if form:  # the bus publishes Debezium's envelope, which the pipeline's consumer reads back
        bus_url += f"{'&' if '?' in bus_url else '?'}format={form}"
    in_one_transaction(pg_dsn, ITEMS, SEED.format(50))
    suffix = uuid.uuid4().hex[:8]
    sync = SyncConfig(source_url=pg_url(pg_dsn), bus_url=bus_url, cache_url=redis_server, tables=("items",),
                      slot=f"s_{suffix}", publication=f"p_{suffix}", prefix=f"t{suffix}", heartbeat_s=None)
    async with open_sync(_config(sync)) as pipeline, running(pipeline):
        async def source() -> dict[str, str]:
            return checksums_of(await asyncio.to_thread(_pg_rows, pg_dsn))

        async def cached() -> dict[str, str]:
            return await cached_checksums(pipeline.cache, "items")

        await wait_until_equal(source, cached)  # the snapshot
        before = _confirmed(pg_dsn, sync.slot)
        in_one_transaction(pg_dsn, "INSERT INTO items VALUES (100, 'new', 'x', 1.50, '2026-01-01 10:00+02')",
                 "UPDATE items SET price = price * 2 WHERE id <= 10",  # one statement, ten rows, one LSN
                 "DELETE FROM items WHERE id = 20")
        in_one_transaction(pg_dsn, "UPDATE items SET name = 'renamed' WHERE id = 100")
        await wait_until_equal(source, cached)
        await eventually(lambda: (pipeline.last_confirmed or 0) > before, "a newer position is confirmed")
        deleted = await pipeline.cache.get("items", "20")
        assert deleted is not None and deleted.deleted  # a tombstone, not a missing key
    assert _confirmed(pg_dsn, sync.slot) >= before


async def test_an_unchanged_toast_column_keeps_its_value_in_the_cache(pg_dsn: str, redis_server: str) -> None:
    # Given a row whose body is large enough to be stored out of line (TOAST), incompressible
    big = "SELECT string_agg(md5(g::text), '') FROM generate_series(1, 400) g"  # 12,800 characters
    in_one_transaction(pg_dsn, ITEMS, f"INSERT INTO items VALUES (1, 'one', ({big}), 1, now())")
    suffix = uuid.uuid4().hex[:8]
    sync = SyncConfig(source_url=pg_url(pg_dsn), cache_url=redis_server, tables=("items",),
                      slot=f"s_{suffix}", publication=f"p_{suffix}", prefix=f"t{suffix}", heartbeat_s=None)
    async with open_sync(_config(sync)) as pipeline, running(pipeline):
        async def source() -> dict[str, str]:
            return checksums_of(await asyncio.to_thread(_pg_rows, pg_dsn))

        async def cached() -> dict[str, str]:
            return await cached_checksums(pipeline.cache, "items")

        await wait_until_equal(source, cached)
        # When other columns change (REPLICA IDENTITY DEFAULT: PostgreSQL does not resend the body),
        # twice in one transaction and once more later
        in_one_transaction(pg_dsn, "UPDATE items SET price = 2 WHERE id = 1",
                 "UPDATE items SET name = 'uno' WHERE id = 1")
        in_one_transaction(pg_dsn, "UPDATE items SET price = 3 WHERE id = 1")
        # Then the cached row still has the body, and equals the database's row
        await wait_until_equal(source, cached)
        entry = await pipeline.cache.get("items", "1")
        assert entry is not None and entry.data is not None and len(entry.data["body"]) == 12_800
    unresolved = [s.value for m in pipeline.metrics.registry.collect() for s in m.samples
                  if s.name == "tidegate_sync_unresolved_unchanged_columns_total"]
    assert sum(unresolved) == 0


async def test_a_memory_cache_after_a_restart_means_a_fresh_snapshot(pg_dsn: str) -> None:
    in_one_transaction(pg_dsn, ITEMS, SEED.format(20))
    suffix = uuid.uuid4().hex[:8]
    sync = SyncConfig(source_url=pg_url(pg_dsn), tables=("items",), slot=f"s_{suffix}",
                      publication=f"p_{suffix}", heartbeat_s=None)

    async def source() -> dict[str, str]:
        return checksums_of(await asyncio.to_thread(_pg_rows, pg_dsn))

    for _ in range(2):
        async with (cache_for("memory://") as cache, open_sync(_config(sync), cache=cache) as pipeline,
                    running(pipeline)):
            async def cached(cache: EntityCache = cache) -> dict[str, str]:
                return await cached_checksums(cache, "items")

            await wait_until_equal(source, cached)
        in_one_transaction(pg_dsn, "UPDATE items SET name = 'changed while stopped' WHERE id = 3")


async def test_the_slot_state_is_exported_from_the_source_status(pg_dsn: str) -> None:
    in_one_transaction(pg_dsn, ITEMS, SEED.format(5))
    suffix = uuid.uuid4().hex[:8]
    sync = SyncConfig(source_url=pg_url(pg_dsn), tables=("items",), slot=f"s_{suffix}",
                      publication=f"p_{suffix}", heartbeat_s=None)
    settings = PipelineSettings(group=sync.group, status_interval_s=0.1)
    async with open_sync(_config(sync), settings=settings) as pipeline, running(pipeline):
        def sample(name: str) -> float | None:
            return pipeline.metrics.registry.get_sample_value(name)

        await eventually(lambda: sample("tidegate_sync_slot_active") == 1, "the slot is reported active")
