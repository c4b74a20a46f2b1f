"""Exact comparison of an entity cache with a PostgreSQL database: every column of every row.

`database_rows` reads a table with a plain SELECT (psycopg2's own types, made canonical as the
change flow makes values canonical) and keys each row by the entity id of its primary key as the
catalog names it now; `cached_rows` reads every live entry of the type. `wait_until_exact` polls
until the two are equal, and on timeout fails naming the rows and columns that differ."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from typing import Any

import psycopg2  # type: ignore[import-untyped]

from support.waiting import eventually
from tidegate.sync.changes import entity_id_of
from tidegate.sync.contracts import EntityCache
from tidegate.sync.values import JsonValue, canonical, checksum

_PRIMARY_KEY_SQL = """
SELECT array_agg(a.attname ORDER BY k.ord)
FROM pg_index i
CROSS JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord)
JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
WHERE i.indrelid = %s::regclass AND i.indisprimary
"""


def database_rows(dsn: str, table: str, key_columns: Sequence[str] | None = None, *,
                  documents: bool = False) -> dict[str, dict[str, JsonValue]]:
    """entity id → canonical row of every row of `table` (empty when the table does not exist),
    keyed by `key_columns` (the primary key when not given; `documents` for a jsonb key)."""
    with contextlib.closing(psycopg2.connect(dsn)) as conn, conn.cursor() as cur:
        cur.execute("SELECT to_regclass(%s) IS NOT NULL", (table,))
        if not cur.fetchone()[0]:
            return {}
        if key_columns is None:
            cur.execute(_PRIMARY_KEY_SQL, (table,))
            key_columns = cur.fetchone()[0]
        cur.execute(f"SELECT * FROM {table}")
        names = [d.name for d in cur.description]
        rows: dict[str, dict[str, JsonValue]] = {}
        for values in cur.fetchall():
            row = canonical(dict(zip(names, values, strict=True)))
            assert isinstance(row, dict)
            rows[entity_id_of(row, key_columns, documents=documents)] = row
        return rows


async def cached_rows(cache: EntityCache, entity_type: str) -> dict[str, Any]:
    """entity id → cached row of every live entry; an entry whose checksum does not cover its
    row is reported as such instead of as a row."""
    rows: dict[str, Any] = {}
    async for entry in cache.scan(entity_type):
        rows[entry.entity_id] = (entry.data if entry.checksum == checksum(entry.data)
                                 else {"<checksum mismatch>": entry.checksum})
    return rows


def describe_difference(expected: dict[str, Any], actual: dict[str, Any], limit: int = 5) -> str:
    """Which rows are missing, extra or different, and in which columns."""
    missing = sorted(set(expected) - set(actual))
    extra = sorted(set(actual) - set(expected))
    differ = sorted(k for k in set(expected) & set(actual) if expected[k] != actual[k])
    details = []
    for key in differ[:limit]:
        want, got = expected[key], actual[key]
        columns = sorted(set(want) | set(got))
        details.append(f"{key!r}: " + ", ".join(
            f"{c}: db {str(want.get(c, '<absent>'))[:40]!r} cache {str(got.get(c, '<absent>'))[:40]!r}"
            for c in columns if want.get(c, "<absent>") != got.get(c, "<absent>")))
    return (f"{len(expected)} rows in the database, {len(actual)} cached; missing {missing[:limit]} "
            f"({len(missing)}), extra {extra[:limit]} ({len(extra)}), different {len(differ)}: "
            + "; ".join(details))


async def wait_until_exact(dsn: str, table: str, cache: EntityCache, entity_type: str | None = None,
                           timeout_s: float = 30.0) -> dict[str, Any]:
    """Poll (the cache follows in another task or process) until the cache holds exactly the
    table's rows, every column equal; returns them."""

    async def both() -> tuple[dict[str, Any], dict[str, Any]]:
        return (await asyncio.to_thread(database_rows, dsn, table),
                await cached_rows(cache, entity_type or table))

    _, actual = await eventually(both, f"the cache of {table} equals the database",
                                 until=lambda pair: pair[0] == pair[1], timeout_s=timeout_s, every_s=0.1,
                                 describe=lambda pair: describe_difference(*pair))
    return actual
