"""The snapshot's reader: one transaction, in the slot's exported snapshot when there is one,
that reads each table in key order; the PostgreSQL source yields its batches as transactions."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from tidegate.errors import SourceError
from tidegate.sync.backfill import raw_text_caster as _raw_text_caster
from tidegate.sync.backfill import select_batch
from tidegate.sync.sources.postgres.catalog import TableInfo
from tidegate.sync.sources.postgres.driver import psycopg2

__all__ = ["SnapshotReader"]


class SnapshotReader:
    """One REPEATABLE READ, read-only transaction, importing the slot's snapshot when there is
    one; reads tables in key order with keyset pagination (so a batch costs the same anywhere in
    the table, and a resume starts from a key)."""

    def __init__(self, conn: Any, as_of: datetime) -> None:
        self._conn = conn
        # When the rows are as of (the transaction's start): the snapshot changes' commit time,
        # since the rows' own commit times are unknown.
        self.as_of = as_of

    @classmethod
    def open(cls, conn: Any, snapshot_name: str | None) -> SnapshotReader:
        """Begin the transaction on `conn` (which it then owns), in the exported snapshot
        `snapshot_name` when there is one."""
        conn.autocommit = False
        conn.set_session(isolation_level=psycopg2.extensions.ISOLATION_LEVEL_REPEATABLE_READ,
                         readonly=True)
        try:
            with conn.cursor() as cur:
                if snapshot_name is not None:
                    # Must be the transaction's first statement (psycopg2 has just sent BEGIN).
                    cur.execute("SET TRANSACTION SNAPSHOT %s", (snapshot_name,))
                cur.execute("SELECT now()")  # without an import, this takes the snapshot
                (as_of,) = cur.fetchone()
        except psycopg2.Error as exc:
            conn.close()
            raise SourceError(f"cannot start the snapshot transaction: {exc}".strip()) from exc
        return cls(conn, as_of)

    def batch(self, table: TableInfo, after: Sequence[str | None] | None,
              limit: int) -> list[dict[str, str | None]]:
        """Up to `limit` rows after key `after` (key texts), each column as the type's text."""
        try:
            with self._conn.cursor() as cur:
                # Every value as the text its output function wrote, as pgoutput sends it:
                # pg_types decodes both the same way.
                psycopg2.extensions.register_type(_raw_text_caster(), cur)
                return select_batch(cur, table, after, limit)
        except psycopg2.Error as exc:
            raise SourceError(f"snapshot read of {table.entity_type} failed: {exc}".strip()) from exc

    def close(self) -> None:
        """End the transaction and close its connection."""
        with contextlib.suppress(psycopg2.Error):
            self._conn.rollback()
            self._conn.close()
