"""Helpers of the change-flow tests: a DSN as a URL, statements run on PostgreSQL, a pipeline
running for a block, a dict checkpoint store, waiting until a cache holds exactly what a
database holds."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import psycopg2  # type: ignore[import-untyped]

from support.waiting import eventually
from tidegate.sync.contracts import EntityCache
from tidegate.sync.pipeline import Pipeline
from tidegate.sync.values import JsonValue, canonical, checksum


def pg_url(dsn: str) -> str:
    """A postgresql:// URL for a libpq keyword DSN (the fixture's form)."""
    parts = dict(item.split("=", 1) for item in dsn.split())
    return f"postgresql://{parts['user']}@{parts['host']}:{parts['port']}/{parts['dbname']}"


def execute(dsn: str, *statements: str) -> None:
    """Each statement in its own transaction (autocommit)."""
    with contextlib.closing(psycopg2.connect(dsn)) as conn:
        conn.autocommit = True
        with conn.cursor() as cur:
            for statement in statements:
                cur.execute(statement)


def in_one_transaction(dsn: str, *statements: str) -> None:
    """All statements in one transaction."""
    with contextlib.closing(psycopg2.connect(dsn)) as conn, conn.cursor() as cur:
        for statement in statements:
            cur.execute(statement)
        conn.commit()


@contextlib.asynccontextmanager
async def running(pipeline: Pipeline) -> AsyncIterator[Pipeline]:
    """The pipeline running on a task of this process until the block ends (then stopped, with
    its drain)."""
    stop = asyncio.Event()
    task = asyncio.create_task(pipeline.run(stop))
    try:
        yield pipeline
    finally:
        stop.set()
        await task


class DictCheckpoints:
    """An in-memory CheckpointStore."""

    def __init__(self) -> None:
        self.values: dict[str, JsonValue] = {}

    async def get_checkpoint(self, name: str) -> JsonValue:
        return self.values.get(name)

    async def put_checkpoint(self, name: str, value: JsonValue) -> None:
        self.values[name] = value


def checksums_of(rows: dict[str, dict[str, Any]]) -> dict[str, str]:
    """entity id → checksum of the canonical row, as the cache records it."""
    return {entity_id: checksum(canonical(row)) for entity_id, row in rows.items()}


async def cached_checksums(cache: EntityCache, entity_type: str) -> dict[str, str]:
    """entity id → checksum of every live entry of the type."""
    return {entry.entity_id: entry.checksum async for entry in cache.scan(entity_type)}


async def wait_until_equal(read_source: Callable[[], Awaitable[dict[str, str]]],
                           read_cache: Callable[[], Awaitable[dict[str, str]]],
                           timeout_s: float = 30.0) -> dict[str, str]:
    """Wait (the cache is filled by another process) until the cache's checksums equal the
    source's; on timeout, fail naming what differs."""

    async def both() -> tuple[dict[str, str], dict[str, str]]:
        return await read_source(), await read_cache()

    _, actual = await eventually(both, "the cache matches the source", until=lambda pair: pair[0] == pair[1],
                                 timeout_s=timeout_s, every_s=0.1, describe=_difference)
    return actual


def _difference(pair: tuple[dict[str, str], dict[str, str]]) -> str:
    expected, actual = pair
    missing = sorted(set(expected) - set(actual))[:5]
    extra = sorted(set(actual) - set(expected))[:5]
    differ = sorted(k for k in set(expected) & set(actual) if expected[k] != actual[k])[:5]
    return (f"{len(expected)} rows vs {len(actual)} cached; missing {missing}, extra {extra}, "
            f"different {differ}")
