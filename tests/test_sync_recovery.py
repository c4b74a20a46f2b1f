"""Crash and resume: `tidegate sync` (PostgreSQL → Redis Streams → Redis cache) is killed with
SIGKILL several times — during the initial snapshot and while streaming under a steady write
load — and restarted. In the end the cache equals the database row for row (checksums), no
entity's version ever went backwards, and the slot's confirmed position only moved forward."""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg2  # type: ignore[import-untyped]
import pytest

from support.sync import cached_checksums, checksums_of, pg_url, wait_until_equal
from support.waiting import eventually
from tidegate.sync.cache import cache_for
from tidegate.sync.changes import Version, entity_id_of

pytestmark = pytest.mark.timeout(300)

SCHEMA = """
CREATE TABLE items (
    id integer PRIMARY KEY,
    name text NOT NULL,
    price numeric(10, 2),
    tags text[],
    doc jsonb,
    updated_at timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE lines (order_id integer, line integer, qty integer NOT NULL, PRIMARY KEY (order_id, line));
"""
PRELOADED = 20_000
KEYS = {"items": ["id"], "lines": ["order_id", "line"]}


class Writer(threading.Thread):
    """A steady mix of inserts, updates, deletes and multi-row statements, one transaction each
    (some with several statements), until stopped."""

    def __init__(self, dsn: str, first_id: int) -> None:
        super().__init__(daemon=True)
        self.dsn, self.next_id = dsn, first_id
        self.stopped = threading.Event()
        self.transactions = 0
        self.rng = random.Random(5)

    def run(self) -> None:
        conn = psycopg2.connect(self.dsn)
        try:
            with conn.cursor() as cur:
                while not self.stopped.is_set():
                    self._one(cur)
                    conn.commit()
                    self.transactions += 1
                    time.sleep(0.002)
        finally:
            conn.close()

    def _one(self, cur: Any) -> None:
        pick = self.rng.random()
        some = self.rng.randrange(1, self.next_id)
        if pick < 0.3:
            self.next_id += 1
            cur.execute("INSERT INTO items (id, name, price, tags, doc) VALUES (%s, %s, %s, %s, %s)",
                        (self.next_id, f"item {self.next_id}", self.rng.randrange(100, 99_999) / 100,
                         ["new", f"t{self.next_id % 5}"], '{"v": 1}'))
        elif pick < 0.6:
            cur.execute("UPDATE items SET name = name || '+', price = price + 0.01, updated_at = now(), "
                        "doc = jsonb_set(coalesce(doc, '{}'), '{v}', to_jsonb(%s)) WHERE id = %s",
                        (self.rng.randrange(1000), some))
        elif pick < 0.7:
            cur.execute("DELETE FROM items WHERE id = %s", (some,))
        elif pick < 0.8:  # one statement, many rows, one commit LSN
            cur.execute("UPDATE items SET tags = array_append(tags, 'bulk') WHERE id %% 97 = %s",
                        (self.rng.randrange(97),))
        else:  # a transaction of several statements on the composite-key table
            order = self.rng.randrange(1, 500)
            cur.execute("INSERT INTO lines VALUES (%s, 1, 1), (%s, 2, 2) ON CONFLICT (order_id, line) "
                        "DO UPDATE SET qty = lines.qty + 1", (order, order))
            cur.execute("DELETE FROM lines WHERE order_id = %s AND line = 2", (self.rng.randrange(1, 500),))


def _rows(dsn: str, table: str) -> dict[str, dict[str, Any]]:
    with contextlib.closing(psycopg2.connect(dsn)) as conn, conn.cursor() as cur:
        cur.execute(f"SELECT * FROM {table}")
        names = [d.name for d in cur.description]
        rows = [dict(zip(names, values, strict=True)) for values in cur.fetchall()]
    return {entity_id_of(row, KEYS[table]): row for row in rows}


def _confirmed_lsn(dsn: str, slot: str) -> int | None:
    with contextlib.closing(psycopg2.connect(dsn)) as conn, conn.cursor() as cur:
        cur.execute("SELECT confirmed_flush_lsn - '0/0'::pg_lsn FROM pg_replication_slots "
                    "WHERE slot_name = %s", (slot,))
        row = cur.fetchone()
        return int(row[0]) if row and row[0] is not None else None


class SyncProcess:
    """`tidegate sync` as its own OS process."""

    def __init__(self, tmp_path: Path, source: str, redis_url: str, prefix: str, slot: str) -> None:
        self.command = [sys.executable, "-m", "tidegate", "sync",
                        "--source", f"{source}?snapshot_batch_size=100", "--bus", redis_url,
                        "--cache", redis_url, "--tables", "items,lines"]
        self.env = {**os.environ, "TIDEGATE_SYNC__PREFIX": prefix, "TIDEGATE_SYNC__SLOT": slot,
                    "TIDEGATE_SYNC__PUBLICATION": slot, "TIDEGATE_SYNC__HEARTBEAT_S": "1"}
        self.tmp_path = tmp_path
        self.runs = 0
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.runs += 1
        log = (self.tmp_path / f"sync-{self.runs}.log").open("wb")
        self.proc = subprocess.Popen(self.command, cwd=self.tmp_path, env=self.env, stdout=log,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        log.close()

    def kill(self) -> None:
        assert self.proc is not None and self.proc.poll() is None, self.log()
        self.proc.kill()
        self.proc.wait()

    def terminate(self) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                return self.proc.wait(timeout=30)
            self.proc.kill()
        return self.proc.wait()

    def log(self) -> str:
        return (self.tmp_path / f"sync-{self.runs}.log").read_text(errors="replace")[-3000:]


@pytest.fixture
def sync_process(tmp_path: Path, pg_dsn: str, redis_server: str) -> Iterator[SyncProcess]:
    suffix = uuid.uuid4().hex[:8]
    process = SyncProcess(tmp_path, pg_url(pg_dsn), redis_server, f"t{suffix}", f"slot_{suffix}")
    try:
        yield process
    finally:
        if process.proc is not None and process.proc.poll() is None:
            process.proc.kill()
            process.proc.wait()


async def _versions(cache: Any, entity_type: str) -> dict[str, Version]:
    return {entry.entity_id: entry.version async for entry in cache.scan(entity_type)}


def _assert_no_regression(before: dict[str, Version], after: dict[str, Version]) -> None:
    regressed = {key: (before[key], version) for key, version in after.items()
                 if key in before and version < before[key]}
    assert not regressed, f"versions went backwards: {list(regressed.items())[:5]}"


async def test_killed_during_snapshot_and_streaming_the_cache_still_ends_equal_to_the_database(
    pg_dsn: str, redis_server: str, sync_process: SyncProcess,
) -> None:
    # Given a database with rows from before any slot existed
    with contextlib.closing(psycopg2.connect(pg_dsn)) as conn, conn.cursor() as cur:
        cur.execute(SCHEMA)
        cur.execute("INSERT INTO items (id, name, price, tags, doc) SELECT g, 'item ' || g, g / 100.0, "
                    "ARRAY['seed'], jsonb_build_object('g', g) FROM generate_series(1, %s) g", (PRELOADED,))
        conn.commit()
    slot = sync_process.env["TIDEGATE_SYNC__SLOT"]
    async with cache_for(redis_server, prefix=sync_process.env["TIDEGATE_SYNC__PREFIX"]) as cache:
        # When the sync is killed in the middle of its initial snapshot
        sync_process.start()
        def mid_snapshot(checkpoint: Any) -> bool:
            return isinstance(checkpoint, dict) and bool(checkpoint.get("table")) \
                and not checkpoint.get("snapshot_done")

        await eventually(lambda: cache.get_checkpoint(f"pg:{slot}"), "the snapshot makes progress",
                         until=mid_snapshot, timeout_s=60, every_s=0.01,
                         describe=lambda checkpoint: f"{checkpoint}\n{sync_process.log()}")
        sync_process.kill()
        snapshot_cut = await cache.count("items")
        assert 0 < snapshot_cut < PRELOADED, "the kill was meant to land mid-snapshot"
        versions = await _versions(cache, "items")

        # ... and then, under a steady write load, killed three more times while streaming
        writer = Writer(pg_dsn, PRELOADED)
        writer.start()
        confirmed: list[int] = []
        try:
            for _ in range(3):
                sync_process.start()
                await asyncio.sleep(random.uniform(2.0, 4.0))
                sync_process.kill()
                now = await _versions(cache, "items")
                _assert_no_regression(versions, now)
                versions = now
                lsn = _confirmed_lsn(pg_dsn, slot)
                if lsn is not None:
                    confirmed.append(lsn)
        finally:
            writer.stopped.set()
            writer.join()
        assert writer.transactions > 100

        # Then a last run catches up: the cache equals the database, row for row
        sync_process.start()
        for table in ("items", "lines"):
            async def source(table: str = table) -> dict[str, str]:
                return checksums_of(await asyncio.to_thread(_rows, pg_dsn, table))

            async def cached(table: str = table) -> dict[str, str]:
                return await cached_checksums(cache, table)

            await wait_until_equal(source, cached, timeout_s=90)
        _assert_no_regression(versions, await _versions(cache, "items"))
        assert confirmed == sorted(confirmed), "the slot's confirmed position moved backwards"
        assert sync_process.terminate() == 0, sync_process.log()
    final = _confirmed_lsn(pg_dsn, slot)
    assert final is not None and (not confirmed or final >= confirmed[-1])
