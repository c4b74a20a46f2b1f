"""What `tidegate sync verify` reads from PostgreSQL: the configured tables in key order with the
snapshot's own keyset query and decoders, rows by key, and the slot's confirmed position.

Positions are WAL positions: a change's version carries its commit record's LSN. Around every
read, `pg_current_wal_insert_lsn()` is taken before (`low`: a transaction whose commit record
lies below it had committed before the read's snapshot was taken, so the read sees it) and after
(`high`: every commit the read sees was written below it). The slot's `confirmed_flush_lsn` is
what the sync has applied: the pipeline confirms a position only after every sink applied it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from typing import Any, Self

from tidegate.errors import InvalidChange, SourceError
from tidegate.sync.backfill import decode_row, raw_text_caster, select_batch
from tidegate.sync.contracts import CheckpointStore
from tidegate.sync.sources.postgres import catalog as pg_catalog
from tidegate.sync.sources.postgres.catalog import TableInfo
from tidegate.sync.sources.postgres.driver import psycopg2, sql
from tidegate.sync.sources.postgres.pgoutput import parse_lsn
from tidegate.sync.sources.postgres.settings import (
    CHECKPOINT_PREFIX,
    PostgresSourceSettings,
    catalog_errors,
    connect,
    connection_params,
    describe,
)
from tidegate.sync.sources.postgres.stream import document_key
from tidegate.sync.values import source_zone
from tidegate.sync.verify import SourceRead, source_row

__all__ = ["PostgresRows"]


class PostgresRows:
    """`RowSource` over the tables of a PostgreSQL source; one autocommit connection, so every
    read is one statement with a snapshot of its own."""

    def __init__(self, settings: PostgresSourceSettings, checkpoints: CheckpointStore) -> None:
        self.settings = settings
        self._checkpoints = checkpoints
        self._params = connection_params(settings.dsn)
        self._where = describe(self._params)
        self._zone = source_zone(settings.source_zone)
        self._conn: Any = None
        self._tables: dict[str, TableInfo] = {}
        self._base_types: dict[int, int] = {}
        self.entity_types: tuple[str, ...] = ()

    async def __aenter__(self) -> Self:
        checkpoint = await self._checkpoints.get_checkpoint(CHECKPOINT_PREFIX + self.settings.slot_name)
        if not isinstance(checkpoint, dict) or not checkpoint.get("snapshot_done"):
            raise SourceError(
                f"slot {self.settings.slot_name} has no finished snapshot in this cache: run "
                "`tidegate sync` until its initial snapshot is done, then verify")
        await asyncio.to_thread(self._open)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            await asyncio.to_thread(conn.close)

    def _open(self) -> None:
        self._conn = connect(self._params, replication=False)
        with self._conn.cursor() as cur, catalog_errors(f"reading the tables at {self._where}"):
            tables = pg_catalog.inspect_tables(cur, self.settings.tables)
            self._base_types = pg_catalog.base_types(cur)
            if pg_catalog.slot_info(cur, self.settings.slot_name) is None:
                raise SourceError(f"replication slot {self.settings.slot_name} does not exist at "
                                  f"{self._where}: nothing syncs this database")
        self._tables = {table.entity_type: table for table in tables}
        self.entity_types = tuple(self._tables)

    # ------------------------------------------------------------------ RowSource

    async def batch(self, entity_type: str, after: tuple[Any, ...] | None, limit: int) -> SourceRead:
        """Up to `limit` rows after key `after`, by the snapshot's own keyset query."""
        table = self._tables[entity_type]
        return await asyncio.to_thread(self._read, table, lambda: self._text_rows(
            table, lambda cur: select_batch(cur, table, list(after) if after else None, limit)))

    async def rows(self, entity_type: str, keys: Sequence[tuple[Any, ...]]) -> SourceRead:
        """The rows with these keys (key values as PostgreSQL's text, as `batch` gives them)."""
        table = self._tables[entity_type]
        return await asyncio.to_thread(self._read, table, lambda: self._by_key(table, keys))

    async def applied(self) -> int:
        """The slot's confirmed flush position."""
        return await asyncio.to_thread(self._confirmed)

    # ------------------------------------------------------------------ reads

    def _read(self, table: TableInfo, select: Any) -> SourceRead:
        low = self._insert_lsn()
        raw: list[dict[str, str | None]] = select()
        high = self._insert_lsn()
        rows = []
        documents = document_key(table, self._base_types)
        for values in raw:
            key = tuple(values[c] for c in table.key_columns)
            # Decoded and identified as the snapshot does (backfill.row_changes).
            decoded = decode_row(table, values, self._base_types, self._zone)
            with contextlib.suppress(InvalidChange):  # counted by the caller as unreadable
                rows.append(source_row(table.entity_type, table.key_columns, key, decoded,
                                       documents=documents))
        last = tuple(raw[-1][c] for c in table.key_columns) if raw else None
        return SourceRead(tuple(rows), low, high, last, len(raw))

    def _by_key(self, table: TableInfo, keys: Sequence[tuple[Any, ...]]) -> list[dict[str, str | None]]:
        if not keys:
            return []
        one = sql.SQL("({})").format(sql.SQL(", ").join(sql.SQL("%s::" + t) for t in table.key_types))
        query = sql.SQL("SELECT {} FROM {} WHERE ({}) IN ({})").format(
            sql.SQL(", ").join(sql.Identifier(c) for c in table.columns), table.identifier,
            sql.SQL(", ").join(sql.Identifier(c) for c in table.key_columns),
            sql.SQL(", ").join(one for _ in keys))

        def read(cur: Any) -> list[dict[str, str | None]]:
            cur.execute(query, [value for key in keys for value in key])
            return [dict(zip(table.columns, row, strict=True)) for row in cur.fetchall()]

        return self._text_rows(table, read)

    def _text_rows(self, table: TableInfo,
                   read: Callable[[Any], list[dict[str, str | None]]]) -> list[dict[str, str | None]]:
        """`read(cursor)` on a cursor that gives every value as the text its output function
        wrote, as the snapshot and pgoutput do, so pg_types decodes all three alike."""
        try:
            with self._conn.cursor() as cur:
                psycopg2.extensions.register_type(raw_text_caster(), cur)
                return read(cur)
        except psycopg2.Error as exc:
            raise SourceError(f"verify read of {table.entity_type} failed: {exc}".strip()) from exc

    def _insert_lsn(self) -> int:
        with self._conn.cursor() as cur, catalog_errors(f"reading the WAL position at {self._where}"):
            cur.execute("SELECT pg_current_wal_insert_lsn()::text")
            return parse_lsn(cur.fetchone()[0])

    def _confirmed(self) -> int:
        with self._conn.cursor() as cur, catalog_errors(f"reading slot {self.settings.slot_name}"):
            slot = pg_catalog.slot_info(cur, self.settings.slot_name)
        if slot is None:
            raise SourceError(f"replication slot {self.settings.slot_name} is gone at {self._where}")
        return slot.confirmed_flush_lsn or 0
