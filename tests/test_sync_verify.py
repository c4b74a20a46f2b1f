"""`tidegate sync verify`: drift injected straight into the cache (a changed value, a missing row,
an extra row) is found per table and repaired at a version later changes still replace; a
correct cache is reported clean while the database keeps changing under the pass. A real
PostgreSQL (and SQLite) source, a running sync, memory and Redis caches."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import sqlite3
import subprocess
import sys
import threading
import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from pathlib import Path

import psycopg2  # type: ignore[import-untyped]
import psycopg2.extras  # type: ignore[import-untyped]
import pytest

from support.redis_keys import delete_keys
from support.sync import execute, pg_url, running
from support.waiting import eventually
from tidegate.app.sync import open_sync, sync_status
from tidegate.config import SyncConfig, TidegateConfig
from tidegate.demo.shop import ShopLoad, create_shop
from tidegate.errors import SourceError
from tidegate.sync.cache import cache_for
from tidegate.sync.changes import Change, Op, Version, entity_id_of
from tidegate.sync.contracts import EntityCache
from tidegate.sync.metrics import SyncMetrics
from tidegate.sync.pipeline import Pipeline
from tidegate.sync.values import canonical, checksum
from tidegate.sync.verify import VerifyReport, VerifySettings, row_source_for, verify

pytestmark = pytest.mark.timeout(120)

KEYS = {"items": ["id"], "pairs": ["a", "b"]}
SCHEMA = (
    "CREATE TABLE items (id int PRIMARY KEY, name text, price numeric(10, 2), tags jsonb, big text)",
    "CREATE TABLE pairs (a text, b int, note text, PRIMARY KEY (a, b))",
    "INSERT INTO items SELECT i, 'item ' || i, i * 1.5, jsonb_build_object('n', i), "
    "repeat(md5(i::text), 300) FROM generate_series(1, 300) i",
    "INSERT INTO pairs SELECT chr(97 + i % 5), i, 'note ' || i FROM generate_series(1, 120) i",
)
FAST = VerifySettings(max_rows_per_s=None, settle_timeout_s=20)


def _db_checksums(dsn: str, table: str) -> dict[str, str]:
    with contextlib.closing(psycopg2.connect(dsn)) as conn, \
            conn.cursor(cursor_factory=psycopg2.extras.RealDictCursor) as cur:
        cur.execute(f"SELECT * FROM {table}")
        rows = [canonical(dict(row)) for row in cur.fetchall()]
    return {entity_id_of(row, KEYS[table]): checksum(row) for row in rows}


async def _cache_checksums(cache: EntityCache, table: str) -> dict[str, str]:
    return {e.entity_id: checksum(e.data) async for e in cache.scan(table)}


async def _cache_equals_db(dsn: str, cache: EntityCache) -> bool:
    for table in KEYS:
        if await asyncio.to_thread(_db_checksums, dsn, table) != await _cache_checksums(cache, table):
            return False
    return True


def _sync_config(dsn: str, cache_url: str) -> SyncConfig:
    suffix = uuid.uuid4().hex[:10]
    return SyncConfig(source_url=f"{pg_url(dsn)}?status_interval_s=1", cache_url=cache_url,
                      tables=tuple(KEYS), slot=f"s_{suffix}", publication=f"p_{suffix}",
                      prefix=f"t{suffix}", heartbeat_s=1.0)


@contextlib.asynccontextmanager
async def _syncing(sync: SyncConfig, cache: EntityCache | None = None) -> AsyncIterator[Pipeline]:
    """The change flow running in this process until the block ends."""
    config = TidegateConfig.load(queue_url="sqlite:///unused.db").model_copy(update={"sync": sync})
    try:
        async with open_sync(config, cache=cache) as pipeline, running(pipeline):
            yield pipeline
    finally:
        if sync.cache_url.startswith("redis://"):
            await delete_keys(sync.cache_url, f"{{{sync.prefix}:*", f"{sync.prefix}:sync:checkpoints")


async def _verify(sync: SyncConfig, cache: EntityCache, settings: VerifySettings = FAST,
                  metrics: SyncMetrics | None = None) -> VerifyReport:
    async with row_source_for(sync, cache) as source:
        return await verify(source, cache, settings, metrics)


def _counts(report: VerifyReport) -> dict[str, tuple[int, int, int, int]]:
    return {name: (t.missing, t.extra, t.differing, t.unsettled) for name, t in report.tables.items()}


async def _inject_drift(cache: EntityCache) -> dict[str, str]:
    """A changed value, a missing row (a tombstone just above the row's version, as a lost
    re-insert leaves it) and an extra row; returns their entity ids."""
    changed = entity_id_of({"id": 3}, ["id"])
    missing = entity_id_of({"id": 5}, ["id"])
    extra = entity_id_of({"a": "zz", "b": 999}, ["a", "b"])
    await cache.force_update("items", changed, {"name": "wrong"})
    held = await cache.get("items", missing)
    assert held is not None
    await cache.apply([Change.of_row(
        entity_type="items", op=Op.DELETE, key_columns=["id"], before={"id": 5},
        version=Version(held.version.lsn, held.version.ordinal + 1), commit_time=datetime.now(UTC))])
    await cache.force_update("pairs", extra, {"a": "zz", "b": 999, "note": "ghost"})
    return {"changed": changed, "missing": missing, "extra": extra}


@pytest.mark.parametrize("cache_kind", ["memory", "redis"])
async def test_verify_finds_injected_drift_per_table_and_repair_fixes_it_without_blocking_the_stream(
    pg_dsn: str, redis_server: str, cache_kind: str,
) -> None:
    # Given a database synced into a cache that holds exactly its rows
    execute(pg_dsn, *SCHEMA)
    sync = _sync_config(pg_dsn, "memory://" if cache_kind == "memory" else redis_server)
    async with _syncing(sync) as pipeline:
        cache = pipeline.cache
        await eventually(lambda: _cache_equals_db(pg_dsn, cache), "the snapshot is cached")
        clean = await _verify(sync, cache)
        assert clean.ok and clean.drift == 0
        assert {name: t.checked for name, t in clean.tables.items()} == {"items": 300, "pairs": 120}

        # When drift is written straight into the cache
        ids = await _inject_drift(cache)
        metrics = SyncMetrics()
        found = await _verify(sync, cache, metrics=metrics)

        # Then verify names each wrong row, per table and kind, and says it is not ok
        assert not found.ok and found.exit_code == 1
        assert _counts(found) == {"items": (1, 0, 1, 0), "pairs": (0, 1, 0, 0)}
        assert found.tables["items"].examples == {"differing": [ids["changed"]], "missing": [ids["missing"]]}
        assert found.tables["pairs"].examples == {"extra": [ids["extra"]]}
        gauges = {(s.labels["entity_type"], s.labels["kind"]): s.value
                  for m in metrics.registry.collect() for s in m.samples
                  if m.name == "tidegate_sync_drift_rows"}
        assert gauges[("items", "missing")] == gauges[("items", "differing")] == 1
        assert gauges[("pairs", "extra")] == 1
        assert gauges[("pairs", "missing")] == 0

        # When it repairs, the cache equals the database again and a second verify is clean
        repaired = await _verify(sync, cache, VerifySettings(max_rows_per_s=None, repair=True))
        assert repaired.ok and sum(t.repaired for t in repaired.tables.values()) == 3
        assert await _cache_equals_db(pg_dsn, cache)
        assert (await _verify(sync, cache)).drift == 0

        # And later changes of the repaired rows still land: their versions did not regress
        execute(pg_dsn, "UPDATE items SET name = 'renamed' WHERE id IN (3, 5)",
                 "DELETE FROM items WHERE id = 7", "INSERT INTO pairs VALUES ('zz', 999, 'real now')")
        await eventually(lambda: _cache_equals_db(pg_dsn, cache), "the later changes are cached")
        renamed = await cache.get_entity("items", ids["changed"])
        assert renamed is not None and renamed["name"] == "renamed"
        assert (await _verify(sync, cache)).ok


def _writer(dsn: str, stop: threading.Event, counter: list[int]) -> None:
    """Updates, inserts and deletes at random until `stop`, on one connection."""
    rng = random.Random(7)
    next_id = 10_000
    with contextlib.closing(psycopg2.connect(dsn)) as conn:
        conn.autocommit = True
        with conn.cursor() as cur:
            while not stop.is_set():
                roll = rng.random()
                if roll < 0.6:
                    cur.execute("UPDATE items SET price = price + 1, name = md5(random()::text) "
                                "WHERE id = %s", (rng.randint(1, 300),))
                elif roll < 0.8:
                    next_id += 1
                    cur.execute("INSERT INTO items VALUES (%s, 'new', 1, '{}', 'x')", (next_id,))
                elif roll < 0.9:
                    cur.execute("DELETE FROM items WHERE id = (SELECT max(id) FROM items WHERE id > 10000)")
                else:
                    cur.execute("UPDATE pairs SET note = md5(random()::text) WHERE b = %s",
                                (rng.randint(1, 120),))
                counter[0] += 1
                stop.wait(0.004)


@pytest.mark.parametrize("cache_kind", ["memory", "redis"])
async def test_verify_reports_no_drift_on_a_correct_cache_while_writes_continue(
    pg_dsn: str, redis_server: str, cache_kind: str,
) -> None:
    # Given a synced cache and a writer changing rows all through the verify pass
    execute(pg_dsn, *SCHEMA)
    sync = _sync_config(pg_dsn, "memory://" if cache_kind == "memory" else redis_server)
    async with _syncing(sync) as pipeline:
        await eventually(lambda: _cache_equals_db(pg_dsn, pipeline.cache), "the snapshot is cached")
        stop, written = threading.Event(), [0]
        writer = threading.Thread(target=_writer, args=(pg_dsn, stop, written))
        writer.start()
        try:
            # When verify reads slowly (small batches, throttled), so the rows move under it
            report = await _verify(sync, pipeline.cache, VerifySettings(
                batch_size=50, max_rows_per_s=200, settle_timeout_s=20))
        finally:
            stop.set()
            writer.join()
        # Then nothing is reported: every mismatch it met was a change still on its way
        assert written[0] > 100
        assert sum(t.rechecked for t in report.tables.values()) > 0  # rows did move under the pass
        assert report.drift == 0 and report.ok, {n: t.to_dict() for n, t in report.tables.items()}
        assert sum(t.checked for t in report.tables.values()) >= 420
        await eventually(lambda: _cache_equals_db(pg_dsn, pipeline.cache), "the writes are cached")


async def test_rows_the_stopped_sync_never_applied_are_unsettled_not_drift(pg_dsn: str) -> None:
    execute(pg_dsn, *SCHEMA)
    sync = _sync_config(pg_dsn, "memory://")
    async with cache_for("memory://") as cache:
        async with _syncing(sync, cache):
            await eventually(lambda: _cache_equals_db(pg_dsn, cache), "the snapshot is cached")
        # When the sync has stopped and the database moves on without it
        execute(pg_dsn, "UPDATE items SET name = 'later' WHERE id <= 4")
        report = await _verify(sync, cache, VerifySettings(max_rows_per_s=None, settle_timeout_s=1.5))
    # Then the rows are stale, not proven wrong: unsettled, and the verify is not ok
    assert _counts(report)["items"] == (0, 0, 0, 4)
    assert report.drift == 0 and not report.ok and report.exit_code == 1


async def test_a_table_keyed_by_one_jsonb_column_is_identified_as_the_sync_identifies_it(
    pg_dsn: str,
) -> None:
    # Given a table keyed by JSON documents, where the number 7 and the string "7" are two keys
    execute(pg_dsn, "CREATE TABLE docs (k jsonb PRIMARY KEY, v int)",
            """INSERT INTO docs VALUES ('7', 1), ('"7"', 2), ('{"a": [1, 2]}', 3)""")
    sync = _sync_config(pg_dsn, "memory://").model_copy(update={"tables": ("docs",)})
    async with cache_for("memory://") as cache, _syncing(sync, cache):
        await eventually(lambda: _count_is(cache, "docs", 3), "the snapshot is cached")
        # When verify compares them
        report = await _verify(sync, cache)
    # Then each row has the entity id the sync gave it: nothing missing, extra or differing
    assert report.tables["docs"].checked == 3
    assert _counts(report)["docs"] == (0, 0, 0, 0) and report.ok


async def _count_is(cache: EntityCache, entity_type: str, rows: int) -> bool:
    return await cache.count(entity_type) == rows


# ---------------------------------------------------------------------- the command


def _tidegate(*args: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tidegate", "sync", *args], cwd=cwd,
                          env={**os.environ, **env}, capture_output=True, text=True, timeout=90,
                          check=False)


@contextlib.contextmanager
def _env(sync: SyncConfig) -> Iterator[dict[str, str]]:
    yield {"TIDEGATE_SYNC__SLOT": sync.slot, "TIDEGATE_SYNC__PUBLICATION": sync.publication,
           "TIDEGATE_SYNC__PREFIX": sync.prefix, "TIDEGATE_SYNC__SOURCE_URL": sync.source_url,
           "TIDEGATE_SYNC__CACHE_URL": sync.cache_url, "TIDEGATE_SYNC__TABLES": json.dumps(sync.tables)}


async def test_the_command_exits_1_on_drift_repairs_and_status_shows_the_last_verify(
    tmp_path: Path, pg_dsn: str, redis_server: str,
) -> None:
    execute(pg_dsn, *SCHEMA)
    sync = _sync_config(pg_dsn, redis_server)
    async with _syncing(sync) as pipeline:
        await eventually(lambda: _cache_equals_db(pg_dsn, pipeline.cache), "the snapshot is cached")
        assert (await sync_status(sync))["verify"] is None
        ids = await _inject_drift(pipeline.cache)
        with _env(sync) as env:
            found = await asyncio.to_thread(_tidegate, "verify", "--json", cwd=tmp_path, env=env)
            assert found.returncode == 1, found.stderr
            report = json.loads(found.stdout)
            assert (report["ok"], report["drift"], report["checked"]) == (False, 3, 420)
            assert report["tables"]["items"]["differing"] == report["tables"]["pairs"]["extra"] == 1
            assert (await sync_status(sync))["verify"] == report

            metrics_file = tmp_path / "drift.prom"
            fixed = await asyncio.to_thread(_tidegate, "verify", "--repair", "--metrics-file",
                                            str(metrics_file), cwd=tmp_path, env=env)
            assert fixed.returncode == 0, fixed.stdout + fixed.stderr
            assert "repaired" in fixed.stdout
            assert f"items missing: {ids['missing']}" in fixed.stdout
            assert f"items differing: {ids['changed']}" in fixed.stdout
            gauge = 'tidegate_sync_drift_rows{entity_type="items",kind="missing"} 1.0'
            assert gauge in metrics_file.read_text()
            shown = await asyncio.to_thread(_tidegate, "status", cwd=tmp_path, env=env)
            assert shown.returncode == 0, shown.stderr
            assert "last verify: " in shown.stdout
            assert " ok, 420 row(s) checked, 3 wrong (repaired)" in shown.stdout
        assert (await _verify(sync, pipeline.cache)).ok


def test_verify_of_a_memory_cache_is_refused_with_the_reason(tmp_path: Path) -> None:
    done = _tidegate("verify", "--cache", "memory://", "--source", f"sqlite:///{tmp_path}/x.db",
                     cwd=tmp_path, env={})
    assert done.returncode == 2
    assert "memory://" in done.stderr and "redis://" in done.stderr


# ---------------------------------------------------------------------- SQLite


async def test_verify_and_repair_a_sqlite_source(tmp_path: Path, redis_server: str) -> None:
    shop = tmp_path / "shop.db"
    create_shop(shop, products=80, users=20, interactions=60)
    sync = SyncConfig(source_url=f"sqlite:///{shop}", cache_url=redis_server,
                      prefix=f"t{uuid.uuid4().hex[:8]}")
    async with _syncing(sync) as pipeline:
        cache = pipeline.cache
        await eventually(lambda: _caught_up(sync, cache, shop), "the shop is cached")
        product = await anext(aiter(cache.scan("products")))
        await cache.force_update("products", product.entity_id, {"name": "wrong"})
        user = await anext(aiter(cache.scan("users")))
        await cache.repair("users", user.entity_id, None, "gone", user)  # a row lost from the cache

        found = await _verify(sync, cache)
        assert _counts(found) == {"products": (0, 0, 1, 0), "users": (1, 0, 0, 0),
                                  "interactions": (0, 0, 0, 0)}

        fixed = await _verify(sync, cache, VerifySettings(max_rows_per_s=None, repair=True))
        assert fixed.ok and sum(t.repaired for t in fixed.tables.values()) == 2
        assert (await _verify(sync, cache)).drift == 0


async def _caught_up(sync: SyncConfig, cache: EntityCache, shop: Path) -> bool:
    with contextlib.closing(sqlite3.connect(shop)) as conn:
        rows = {t: conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in sync.tables}
    return {t: await cache.count(t) for t in rows} == rows


async def test_verify_before_the_snapshot_is_done_is_refused_with_the_reason(pg_dsn: str) -> None:
    execute(pg_dsn, *SCHEMA)
    sync = _sync_config(pg_dsn, "memory://")
    async with cache_for("memory://") as cache:  # a cache no sync has filled
        with pytest.raises(SourceError, match="no finished snapshot"):
            async with row_source_for(sync, cache):
                pass


async def test_a_sqlite_shop_verifies_clean_while_the_shop_keeps_writing(tmp_path: Path) -> None:
    shop = tmp_path / "shop.db"
    create_shop(shop, products=150, users=40, interactions=200)
    sync = SyncConfig(source_url=f"sqlite:///{shop}", cache_url="memory://")
    async with _syncing(sync) as pipeline:
        await eventually(lambda: _caught_up(sync, pipeline.cache, shop), "the shop is cached")
        # When the shop writes all through a slow pass
        stop = asyncio.Event()
        shop_load = ShopLoad(shop)
        load = asyncio.create_task(shop_load.run(rate_per_s=300, duration_s=30, stop=stop))
        try:
            await eventually(lambda: shop_load.counts.total(), "the shop is writing")
            report = await _verify(sync, pipeline.cache, VerifySettings(
                batch_size=25, max_rows_per_s=500, settle_timeout_s=20))
        finally:
            stop.set()
            written = await load
        # Then every mismatch met was a change on its way, none is reported
        assert sum(written.values()) > 150
        assert sum(t.rechecked for t in report.tables.values()) > 0  # rows did move under the pass
        assert report.ok, {n: t.to_dict() for n, t in report.tables.items()}
        assert sum(t.checked for t in report.tables.values()) >= 390
