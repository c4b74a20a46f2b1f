"""Every store a configuration names, with its format: what `tidegate migrate` reports and
migrates. The stores are those of the queue URL (the queue, tenants and keys, the budget ledger,
files and batches, provider batches: one SQLite file, or one Redis keyspace `tidegate:{name}:…`)
and, when the change flow's cache is on Redis, the entity cache (with the change flow's positions)
and the recommender's store there. The rate limiter and the stream relay hold only state that
expires within minutes and are not versioned (see their modules)."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from pathlib import Path

from tidegate._formats import FormatReport, RedisStore, StoreFormat, inspect_sqlite_store, open_sqlite_store
from tidegate._redis import is_redis_url
from tidegate._sqlite import BUSY_TIMEOUT_MS, reclaiming, sqlite_path
from tidegate.config import TidegateConfig
from tidegate.coord import queue_name_of
from tidegate.errors import QueueUnavailable

__all__ = ["store_formats"]


async def store_formats(config: TidegateConfig, *, apply: bool) -> list[FormatReport]:
    """Each store's format against the code's; with `apply`, after running what is pending (a
    store newer than the code is reported, never changed)."""
    url = config.queue_url
    if is_redis_url(url):
        base_url = url.partition("?")[0]  # the queue's options are not the connection's
        reports = await _redis_reports(base_url, _queue_keyspace(queue_name_of(url)), apply=apply)
    else:
        reports = await asyncio.to_thread(_sqlite_reports, sqlite_path(url), apply=apply)
    if is_redis_url(config.sync.cache_url):
        from tidegate.recs.store.redis import redis_store as recs_store
        from tidegate.sync.cache.redis import redis_store as cache_store

        prefix = config.sync.prefix
        reports += await _redis_reports(config.sync.cache_url, [cache_store(prefix), recs_store(prefix)],
                                        apply=apply)
    return reports


def _sqlite_stores() -> list[tuple[StoreFormat, str]]:
    from tidegate.coord.budget import sqlite as budget
    from tidegate.coord.tenants import sqlite as tenants
    from tidegate.dispatch.provider_batches.store import sqlite as provider_batches
    from tidegate.gateway.batches.store import sqlite as batches
    from tidegate.queue import sqlite as queue

    return [(module.SQLITE_FORMAT, module.SQLITE_SCHEMA)
            for module in (queue, tenants, budget, batches, provider_batches)]


def _sqlite_reports(path: str, *, apply: bool) -> list[FormatReport]:
    if not apply and not Path(path).is_file():
        return [FormatReport(fmt.store, path, None, fmt.version, "stamped") for fmt, _ in _sqlite_stores()]
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    connection = sqlite3.connect(path, isolation_level=None, timeout=BUSY_TIMEOUT_MS / 1000)
    with contextlib.closing(connection) as conn:
        reports = []
        for fmt, schema in _sqlite_stores():
            found = inspect_sqlite_store(conn, fmt, schema, where=path)
            if apply and found.outcome in ("pending", "stamped"):
                found = open_sqlite_store(conn, fmt, schema, where=path, mode="auto")
            reports.append(found)
        if apply and not any(report.needs_action for report in reports):
            reclaiming(conn)  # a file from before auto_vacuum=incremental: one VACUUM
        return reports


def _queue_keyspace(name: str) -> list[RedisStore]:
    from tidegate.coord.budget import redis as budget
    from tidegate.coord.budget.base import utc_today
    from tidegate.coord.tenants import redis as tenants
    from tidegate.dispatch.provider_batches.store import redis as provider_batches
    from tidegate.gateway.batches.store import redis as batches
    from tidegate.queue import redis as queue

    return [queue.redis_store(name), tenants.redis_store(name), budget.redis_store(name, utc_today()),
            batches.redis_store(name), provider_batches.redis_store(name)]


async def _redis_reports(url: str, stores: list[RedisStore], *, apply: bool) -> list[FormatReport]:
    from tidegate._redis import RedisClient

    client = RedisClient(url, what="store formats", unavailable=QueueUnavailable)
    try:
        await client.ping()
        reports = []
        for store in stores:
            found = await store.open(client, mode="look")
            if apply and found.outcome in ("pending", "stamped"):
                found = await store.open(client, mode="auto")
            reports.append(found)
        return reports
    finally:
        await client.aclose()
