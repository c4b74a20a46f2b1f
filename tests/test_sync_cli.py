"""`tidegate sync` and `tidegate sync status` as an operator runs them: real processes, a real
SQLite shop and PostgreSQL, a Redis cache both commands share."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg2  # type: ignore[import-untyped]
import pytest

from support.sync import pg_url
from support.waiting import eventually_sync
from tidegate.demo.shop import ShopLoad, create_shop
from tidegate.recs import Recommender, recs_store_for

pytestmark = pytest.mark.timeout(120)


def _tidegate(*args: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tidegate", *args], cwd=cwd, env={**os.environ, **env},
                          capture_output=True, text=True, timeout=60, check=False)


def _status(cwd: Path, env: dict[str, str], *args: str) -> dict[str, Any]:
    done = _tidegate("sync", "status", "--json", *args, cwd=cwd, env=env)
    assert done.returncode == 0, done.stderr
    report: dict[str, Any] = json.loads(done.stdout)
    return report


@contextlib.contextmanager
def _syncing(cwd: Path, env: dict[str, str], *args: str) -> Iterator[subprocess.Popen[bytes]]:
    """`tidegate sync` running; stopped with SIGTERM at the end, which must exit 0."""
    with (cwd / "sync.log").open("wb") as log:
        sync = subprocess.Popen([sys.executable, "-m", "tidegate", "sync", *args], cwd=cwd,
                                env={**os.environ, **env}, stdout=log, stderr=subprocess.STDOUT)
    try:
        yield sync
        sync.send_signal(signal.SIGTERM)
        assert sync.wait(timeout=30) == 0, (cwd / "sync.log").read_text()
    finally:
        if sync.poll() is None:
            sync.kill()
            sync.wait()


LOOK_EVERY_S = 0.2  # each look runs `tidegate sync status` (a process of its own) or writes a row


def _caught_up(report: dict[str, Any]) -> bool:
    return all(t["source_rows"] == t["cached"] for t in report["tables"].values())


def test_sync_runs_until_sigterm_and_status_shows_the_outbox_and_the_cache(
    tmp_path: Path, redis_server: str,
) -> None:
    # Given a shop and `tidegate sync` capturing it into a Redis cache
    shop = tmp_path / "shop.db"
    create_shop(shop, products=50, users=10, interactions=40)
    env = {"TIDEGATE_SYNC__PREFIX": f"t{uuid.uuid4().hex[:8]}"}
    args = ("--source", f"sqlite:///{shop}", "--cache", redis_server)
    with _syncing(tmp_path, env, *args):
        # When the shop keeps writing
        ShopLoad(shop).write(100)
        # Then status shows every row cached and nothing left in the outbox
        eventually_sync(lambda: _status(tmp_path, env, *args), "every row is cached, the outbox empty",
                        until=lambda report: _caught_up(report) and report["source"]["outbox_pending"] == 0,
                        timeout_s=60, every_s=LOOK_EVERY_S)
        report = _status(tmp_path, env, *args)
        assert report["source"]["snapshot_done"] is True
        assert set(report["tables"]) == {"products", "users", "interactions"}
        # ... and the recommender's state beside the cache knows the catalogue (gateways share it)
        health = asyncio.run(_recs_health(redis_server, env["TIDEGATE_SYNC__PREFIX"]))
        assert health["items"] == report["tables"]["products"]["source_rows"]
        assert isinstance(health["users"], int) and health["users"] > 0


async def _recs_health(url: str, prefix: str) -> dict[str, Any]:
    async with recs_store_for(url, prefix=prefix) as store:
        return dict(await Recommender(store).health())


def test_status_of_postgresql_shows_the_slot_position_and_lag(
    tmp_path: Path, pg_dsn: str, redis_server: str,
) -> None:
    with contextlib.closing(psycopg2.connect(pg_dsn)) as conn, conn.cursor() as cur:
        cur.execute("CREATE TABLE items (id int PRIMARY KEY, name text); INSERT INTO items VALUES (1, 'a')")
        conn.commit()
    suffix = uuid.uuid4().hex[:8]
    env = {"TIDEGATE_SYNC__SLOT": f"s_{suffix}", "TIDEGATE_SYNC__PUBLICATION": f"p_{suffix}",
           "TIDEGATE_SYNC__PREFIX": f"t{suffix}"}
    args = ("--source", pg_url(pg_dsn), "--cache", redis_server, "--tables", "items")
    assert _status(tmp_path, env, *args)["source"]["slot_exists"] is False
    with _syncing(tmp_path, env, *args):
        eventually_sync(lambda: _status(tmp_path, env, *args), "the row is cached",
                        until=lambda report: report["tables"]["items"]["cached"] == 1, timeout_s=60,
                        every_s=LOOK_EVERY_S)
        report = _status(tmp_path, env, *args)
    source = report["source"]
    assert source["slot_exists"] is True and source["snapshot_done"] is True
    assert isinstance(source["lag_bytes"], int) and source["lag_bytes"] >= 0
    assert "/" in source["confirmed_flush_lsn"]  # PostgreSQL's X/Y notation


def test_sync_of_postgresql_warns_once_about_replica_identity_and_logs_positions_as_lsns(
    tmp_path: Path, pg_dsn: str, redis_server: str,
) -> None:
    # Given three ordinary tables (primary key, text columns, REPLICA IDENTITY DEFAULT)
    with contextlib.closing(psycopg2.connect(pg_dsn)) as conn, conn.cursor() as cur:
        for table in ("shelves", "books", "readers"):
            cur.execute(f"CREATE TABLE {table} (id int PRIMARY KEY, name text, notes text)")
            cur.execute(f"INSERT INTO {table} VALUES (1, 'a', 'b')")
        conn.commit()
    suffix = uuid.uuid4().hex[:8]
    env = {"TIDEGATE_SYNC__SLOT": f"s_{suffix}", "TIDEGATE_SYNC__PUBLICATION": f"p_{suffix}",
           "TIDEGATE_SYNC__PREFIX": f"t{suffix}"}
    args = ("--source", pg_url(pg_dsn), "--cache", redis_server, "--tables", "shelves,books,readers",
            "--no-recommendations")
    log = tmp_path / "sync.log"

    def written_and_progress_logged() -> bool:
        with contextlib.closing(psycopg2.connect(pg_dsn)) as conn, conn.cursor() as cur:
            cur.execute("INSERT INTO books SELECT coalesce(max(id), 0) + 1, 'c', 'd' FROM books")
            conn.commit()
        return re.search(r"confirmed position [^n]", log.read_text()) is not None

    # When `tidegate sync` streams changes until a progress line with a confirmed position is
    # logged (one every 10 s while changes flow)
    with _syncing(tmp_path, env, *args):
        eventually_sync(written_and_progress_logged, "a progress line with a position", timeout_s=45,
                        every_s=LOOK_EVERY_S)

    # Then the tables' replica identity is one line naming all three, not a warning each
    printed = log.read_text()
    warnings = [line for line in printed.splitlines() if "REPLICA IDENTITY" in line]
    assert len(warnings) == 1, printed
    assert "REPLICA IDENTITY DEFAULT: public.shelves, public.books, public.readers" in warnings[0]
    # ... and positions read as `sync status` and PostgreSQL print them (0/1955CB0), not integers
    progress = [line for line in printed.splitlines() if re.search(r"confirmed position [^n]", line)]
    assert re.search(r"confirmed position [0-9A-F]+/[0-9A-F]+, up", progress[0]), progress


def test_a_bad_source_url_is_a_clear_error(tmp_path: Path) -> None:
    done = _tidegate("sync", "status", "--source", "mysql://db/shop", cwd=tmp_path, env={})
    assert done.returncode == 2
    assert "mysql" in done.stderr and "postgresql://" in done.stderr
