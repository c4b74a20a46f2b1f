"""The hostile workload under SIGKILL: `tidegate sync` (PostgreSQL → Redis Streams → Redis cache)
runs as its own process and is killed with SIGKILL at random moments — during the initial
snapshot, inside a transaction of 20,000 rows, around schema changes — and restarted each time,
while a writer keeps changing wide rows whose large out-of-line text columns most updates leave
alone, moves rows to new keys, swaps keys and deletes and re-inserts keys in one transaction. In
the end the cache holds exactly the database's rows (every column of every row), and no entity's
version ever went backwards across all the observations in between."""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg2  # type: ignore[import-untyped]
import pytest

from support.sync import in_one_transaction, pg_url
from support.sync_exact import wait_until_exact
from support.waiting import eventually
from tidegate.sync.cache import cache_for
from tidegate.sync.changes import Version
from tidegate.sync.contracts import EntityCache

pytestmark = pytest.mark.timeout(400)

SEED = 20261201
TABLES = ("docs", "pairs", "bulk")
# Random text the server makes (md5 of random(): incompressible), stored out of line (> 8 KB).
BIG = "(SELECT string_agg(md5(random()::text), '') FROM generate_series(1, 300))"
DOCS = 1000
BULK = 5_000
BULK_TX_ROWS = 20_000
R = 1  # the row the big transaction updates before and after its bulk; the writer leaves it alone

SCHEMA = f"""
CREATE TABLE docs (id integer PRIMARY KEY, n integer NOT NULL, title text, big text, big2 text);
CREATE TABLE pairs (a text, b integer, v integer, big text, PRIMARY KEY (a, b));
CREATE TABLE bulk (id integer PRIMARY KEY, v integer);
INSERT INTO docs SELECT g, 0, 'doc ' || g, CASE WHEN g % 5 = 0 OR g = {R} THEN {BIG} END,
                        CASE WHEN g % 7 = 0 THEN {BIG} END
FROM generate_series(1, {DOCS}) g;
INSERT INTO pairs SELECT CASE WHEN g % 3 = 0 THEN '' ELSE 'k' || g END, g, g,
                         CASE WHEN g % 4 = 0 THEN {BIG} END
FROM generate_series(1, 300) g;
INSERT INTO bulk SELECT g, g FROM generate_series(1, {BULK}) g;
"""


class Writer(threading.Thread):
    """One transaction after another, picked by a seeded generator, until stopped."""

    def __init__(self, dsn: str) -> None:
        super().__init__(daemon=True)
        self.dsn = dsn
        self.rng = random.Random(SEED)
        self.ids = set(range(2, DOCS + 1))  # live doc ids the writer may touch
        self.next_id = 10_000
        self.stopped = threading.Event()
        self.transactions = 0
        self.failure: BaseException | None = None
        self.value_column = "v"  # pairs.v is renamed to w while the writer runs

    def run(self) -> None:
        try:
            with contextlib.closing(psycopg2.connect(self.dsn)) as conn, conn.cursor() as cur:
                while not self.stopped.is_set():
                    try:
                        self._one(cur)
                    except psycopg2.errors.UndefinedColumn:
                        conn.rollback()
                        self.value_column = "w"
                        continue
                    conn.commit()
                    self.transactions += 1
                    time.sleep(0.01)
        except BaseException as exc:  # reported by the test, which joins this thread
            self.failure = exc

    def _some(self) -> int:
        return self.rng.choice(sorted(self.ids))

    def _one(self, cur: Any) -> None:
        pick = self.rng.random()
        if pick < 0.35:  # most updates leave the large columns alone
            cur.execute("UPDATE docs SET n = n + 1, title = title || '.' WHERE id = %s", (self._some(),))
        elif pick < 0.45:
            cur.execute(f"UPDATE docs SET big = {BIG} WHERE id = %s", (self._some(),))
        elif pick < 0.55:  # a primary-key update: the row moves with its large values
            old, self.next_id = self._some(), self.next_id + 1
            cur.execute("UPDATE docs SET id = %s, n = n + 1 WHERE id = %s", (self.next_id, old))
            self.ids.discard(old)
            self.ids.add(self.next_id)
        elif pick < 0.65:  # two keys swapped in one transaction
            a, b = self._some(), self._some()
            if a != b:
                cur.execute("UPDATE docs SET id = -id WHERE id = %s", (a,))
                cur.execute("UPDATE docs SET id = %s WHERE id = %s", (a, b))
                cur.execute("UPDATE docs SET id = %s, n = n + 1 WHERE id = %s", (b, -a))
        elif pick < 0.75:  # a key deleted and inserted again in one transaction
            key = self._some()
            cur.execute("DELETE FROM docs WHERE id = %s", (key,))
            cur.execute(f"INSERT INTO docs VALUES (%s, 0, 'again', "
                        f"CASE WHEN %s THEN {BIG} END, NULL)", (key, self.rng.random() < 0.5))
        elif pick < 0.82:
            self.next_id += 1
            cur.execute(f"INSERT INTO docs VALUES (%s, 0, 'new', {BIG}, NULL)", (self.next_id,))
            self.ids.add(self.next_id)
        elif pick < 0.86:
            key = self._some()
            cur.execute("DELETE FROM docs WHERE id = %s", (key,))
            self.ids.discard(key)
        else:  # composite keys, '' among them: updates leaving `big` alone, and key moves
            b = self.rng.randrange(1, 301)  # one row per b
            if self.rng.random() < 0.7:
                column = self.value_column
                cur.execute(f"UPDATE pairs SET {column} = {column} + 1 WHERE b = %s", (b,))
            else:
                cur.execute("UPDATE pairs SET a = CASE WHEN a = '' THEN 'moved' ELSE '' END "
                            "WHERE b = %s AND a IN ('', 'moved')", (b,))


def big_transaction(dsn: str) -> None:
    """Row R's large value changes, 20,000 rows are written, then R changes again leaving it."""
    with contextlib.closing(psycopg2.connect(dsn)) as conn, conn.cursor() as cur:
        cur.execute(f"UPDATE docs SET big = {BIG} WHERE id = %s", (R,))
        cur.execute("INSERT INTO bulk SELECT g, g FROM generate_series(%s, %s) g",
                    (BULK + 1, BULK + BULK_TX_ROWS))
        cur.execute("UPDATE docs SET n = n + 1 WHERE id = %s", (R,))
        conn.commit()


class SyncProcess:
    """`tidegate sync` as its own OS process, started and killed again and again."""

    def __init__(self, tmp_path: Path, dsn: str, redis_url: str) -> None:
        suffix = uuid.uuid4().hex[:8]
        self.slot, self.prefix = f"k_{suffix}", f"k{suffix}"
        source = f"{pg_url(dsn)}?snapshot_batch_size=200&schema_check_s=0.5"
        self.command = [sys.executable, "-m", "tidegate", "sync", "--source", source,
                        "--bus", redis_url, "--cache", redis_url, "--tables", ",".join(TABLES)]
        self.env = {**os.environ, "TIDEGATE_SYNC__PREFIX": self.prefix,
                    "TIDEGATE_SYNC__SLOT": self.slot, "TIDEGATE_SYNC__PUBLICATION": self.slot,
                    "TIDEGATE_SYNC__HEARTBEAT_S": "1"}
        self.tmp_path = tmp_path
        self.runs = 0
        self.kills = 0
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.runs += 1
        with (self.tmp_path / f"sync-{self.runs}.log").open("wb") as log:
            self.proc = subprocess.Popen(self.command, cwd=self.tmp_path, env=self.env, stdout=log,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def kill(self) -> None:
        assert self.proc is not None and self.proc.poll() is None, self.log()
        self.proc.kill()  # SIGKILL
        self.proc.wait()
        self.kills += 1

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def log(self) -> str:
        return (self.tmp_path / f"sync-{self.runs}.log").read_text(errors="replace")[-4000:]

    async def started(self, timeout_s: float = 60.0) -> None:
        """Until the process says it is syncing (its interpreter and imports take a while on a
        busy machine: a kill before that would test nothing)."""
        async def syncing() -> bool:
            return "INFO tidegate.sync: syncing" in self.log()

        await _until(syncing, "the sync says it is syncing", self, timeout_s)

    async def run_for(self, seconds: float) -> None:
        """Start, let it work `seconds` once started, kill."""
        self.start()
        await self.started()
        await asyncio.sleep(seconds)
        self.kill()


class Versions:
    """Every entity's version at every observation: live entries by a scan, the ones seen before
    and not live now by a read (a tombstone keeps its version); none may go backwards."""

    def __init__(self, cache: EntityCache) -> None:
        self.cache = cache
        self.seen: dict[tuple[str, str], Version] = {}
        self.observations = 0

    async def observe(self) -> None:
        now: dict[tuple[str, str], Version] = {}
        for table in TABLES:
            async for entry in self.cache.scan(table):
                now[(table, entry.entity_id)] = entry.version
        for ident in self.seen.keys() - now.keys():
            kept = await self.cache.get(*ident)
            assert kept is not None, f"{ident} vanished from the cache without a tombstone"
            now[ident] = kept.version
        regressed = {ident: (self.seen[ident], version) for ident, version in now.items()
                     if ident in self.seen and version < self.seen[ident]}
        assert not regressed, f"versions went backwards: {list(regressed.items())[:5]}"
        self.seen.update(now)
        self.observations += 1


@pytest.fixture
def sync_process(tmp_path: Path, pg_dsn: str, redis_server: str) -> Iterator[SyncProcess]:
    process = SyncProcess(tmp_path, pg_dsn, redis_server)
    try:
        yield process
    finally:
        process.stop()


async def _until(check: Callable[[], Awaitable[bool]], what: str, sync: SyncProcess,
                 timeout_s: float = 60.0) -> None:
    """Until `check` holds while the sync process runs; a failure shows the process's log."""

    async def holds() -> bool:
        held = await check()
        assert sync.proc is not None and sync.proc.poll() is None, f"sync exited:\n{sync.log()}"
        return held

    await eventually(holds, what, timeout_s=timeout_s,
                     describe=lambda held: f"{held}; the sync's log:\n{sync.log()}")


async def test_killed_at_random_moments_the_cache_ends_exactly_equal_and_versions_never_regress(
    pg_dsn: str, redis_server: str, sync_process: SyncProcess,
) -> None:
    rng = random.Random(SEED + 1)
    with contextlib.closing(psycopg2.connect(pg_dsn)) as conn, conn.cursor() as cur:
        cur.execute(SCHEMA)
        conn.commit()
    sync = sync_process
    async with cache_for(redis_server, prefix=sync.prefix) as cache:
        versions = Versions(cache)

        async def snapshot_progress() -> Any:
            checkpoint: Any = await cache.get_checkpoint(f"pg:{sync.slot}")
            if not isinstance(checkpoint, dict):
                return None
            return (checkpoint.get("snapshot_done"), checkpoint.get("tables_done"),
                    checkpoint.get("table"), checkpoint.get("after"))

        # Given a kill in the middle of the initial snapshot, and another after it resumed
        mid_snapshot_kills = 0
        for _ in range(2):
            before = await snapshot_progress()
            sync.start()

            async def progressed(before: Any = before) -> bool:
                now = await snapshot_progress()
                return now is not None and now != before and (bool(now[1]) or now[2] is not None)

            await _until(progressed, "the snapshot makes progress", sync)
            progress = await snapshot_progress()
            sync.kill()
            mid_snapshot_kills += not progress[0]
            await versions.observe()
        assert mid_snapshot_kills == 2, "a kill was meant to land inside the snapshot"

        # When a writer runs the hostile mix, and the sync is killed at random moments
        writer = Writer(pg_dsn)
        writer.start()
        try:
            sync.start()

            async def snapshot_done() -> bool:
                progress = await snapshot_progress()
                return bool(progress and progress[0])

            await _until(snapshot_done, "the snapshot is done", sync)
            await asyncio.sleep(rng.uniform(0.0, 0.5))
            sync.kill()
            await versions.observe()
            for _ in range(3):
                await sync.run_for(rng.uniform(0.2, 1.5))
                await versions.observe()

            # ... inside the transaction of 20,000 rows, partly applied when killed
            sync.start()
            await sync.started()
            await asyncio.to_thread(big_transaction, pg_dsn)

            async def inside() -> bool:
                return (await cache.count("bulk")) > BULK

            await _until(inside, "the big transaction reaches the cache", sync)
            partly = await cache.count("bulk")
            sync.kill()
            assert partly < BULK + BULK_TX_ROWS, "the kill was meant to land inside"
            await versions.observe()
            # ... and again while the restarted sync replays it
            await sync.run_for(rng.uniform(0.2, 1.0))
            await versions.observe()

            # ... and around schema changes: a column added with a default, one renamed
            sync.start()
            await sync.started()
            await asyncio.sleep(rng.uniform(0.2, 1.0))
            await asyncio.to_thread(in_one_transaction, pg_dsn,
                                    "ALTER TABLE docs ADD COLUMN extra integer DEFAULT 7")
            await asyncio.sleep(rng.uniform(0.2, 1.0))
            sync.kill()
            await versions.observe()
            sync.start()
            await sync.started()
            await asyncio.sleep(rng.uniform(0.2, 1.0))
            await asyncio.to_thread(in_one_transaction, pg_dsn, "ALTER TABLE pairs RENAME COLUMN v TO w")
            await asyncio.sleep(rng.uniform(0.2, 1.0))
            sync.kill()
            await versions.observe()
            for _ in range(2):
                await sync.run_for(rng.uniform(0.2, 1.5))
                await versions.observe()
        finally:
            writer.stopped.set()
            await asyncio.to_thread(writer.join)
        assert writer.failure is None, writer.failure
        assert writer.transactions > 200 and sync.kills >= 10

        # Then a last run catches up: every column of every row equals the database's
        sync.start()
        for table in TABLES:
            await wait_until_exact(pg_dsn, table, cache, timeout_s=120)
        await versions.observe()
        assert sync.proc is not None and sync.proc.poll() is None, sync.log()
        # ... and the slot's confirmed position catches up with the database (heartbeats)
        target = _wal_position(pg_dsn)

        async def slot_caught_up() -> bool:
            return (_confirmed_position(pg_dsn, sync.slot) or 0) >= target

        await _until(slot_caught_up, "the slot's confirmed position reaches the WAL's end", sync)
        if os.environ.get("KILL_LOGS"):
            import shutil
            for log in sync.tmp_path.glob("sync-*.log"):
                shutil.copy(log, os.environ["KILL_LOGS"])


def _wal_position(dsn: str) -> int:
    with contextlib.closing(psycopg2.connect(dsn)) as conn, conn.cursor() as cur:
        cur.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn")
        return int(cur.fetchone()[0])


def _confirmed_position(dsn: str, slot: str) -> int | None:
    with contextlib.closing(psycopg2.connect(dsn)) as conn, conn.cursor() as cur:
        cur.execute("SELECT confirmed_flush_lsn - '0/0'::pg_lsn FROM pg_replication_slots "
                    "WHERE slot_name = %s", (slot,))
        row = cur.fetchone()
        return int(row[0]) if row and row[0] is not None else None
