"""Reading rows back by key for the fill (tidegate.sync.fill): the current committed values of
some columns of some rows, on an autocommit connection of its own.

A plain autocommit connection takes a new snapshot per statement, so a read sees every
transaction committed before it; see `tidegate.sync.fill` for why a value newer than the change
is safe. Not older: a commit reaches the slot once its WAL is flushed, which can be before other
sessions see it (while it waits for a synchronous standby, say), so with `xid` (the transaction
whose change asks) the read is repeated until its snapshot shows that transaction, and with it
every one committed before (standbys release waiting commits in WAL order).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from datetime import tzinfo
from typing import Any

from tidegate.errors import SourceError
from tidegate.sync.backfill import raw_text_caster as _raw_text_caster
from tidegate.sync.changes import entity_id_of
from tidegate.sync.fill import RowsRead
from tidegate.sync.sources.postgres.catalog import TableInfo
from tidegate.sync.sources.postgres.driver import psycopg2, sql
from tidegate.sync.sources.postgres.pgoutput import parse_lsn
from tidegate.sync.sources.postgres.stream import document_key
from tidegate.sync.sources.postgres.types import decode_text
from tidegate.sync.values import Row, canonical

__all__ = ["RowReadback"]

logger = logging.getLogger(__name__)

# Keys per statement when reading rows back for the fill.
READ_BATCH = 500
# How long a read back waits for the transaction that asked to become visible, and how often
# it looks again.
VISIBLE_WAIT_S = 10.0
VISIBLE_POLL_S = 0.005
# Is the 32-bit xid %s visible in the statement's snapshot? Its epoch is the snapshot's
# (next xid's), or the one before when that would put it beyond the next xid.
_VISIBLE_SQL = """pg_visible_in_snapshot(GREATEST(3,
    (pg_snapshot_xmax(pg_current_snapshot())::text::bigint >> 32 << 32) + %s - CASE
    WHEN (pg_snapshot_xmax(pg_current_snapshot())::text::bigint & 4294967295) < %s
    THEN 4294967296 ELSE 0 END)::text::xid8, pg_current_snapshot())"""


class RowReadback:
    """Reads rows of the source's tables back by key (see the module doc); the connection opens
    on the first read and is opened again after one failed."""

    def __init__(self, connect: Callable[[], Any], where: str, slot_name: str, zone: tzinfo) -> None:
        self._connect = connect
        self._where = where
        self._slot_name = slot_name
        self._zone = zone
        self._conn: Any = None

    async def read(self, table: TableInfo, keys: Sequence[Sequence[str]], columns: Sequence[str],
                   base_types: dict[int, int], *, xid: int | None = None) -> RowsRead:
        """The current committed values of `columns` (and the key) of the rows of `table` with
        `keys` (each key's values as the server's text), as canonical rows by entity id, with
        the WAL insert position at the read; with `xid`, once that transaction is visible."""
        if not table.key_columns:  # dropped before this run, known by name only: no rows
            return RowsRead({}, 0)
        wanted = [c for c in dict.fromkeys([*table.key_columns, *columns]) if c in table.type_oids]
        rows: dict[str, Row] = {}
        position = 0
        for start in range(0, len(keys), READ_BATCH):
            batch = [tuple(key) for key in keys[start:start + READ_BATCH]]
            deadline = time.monotonic() + VISIBLE_WAIT_S
            while True:
                found, position, visible = await asyncio.to_thread(
                    self._read_batch, table, wanted, batch, xid, base_types)
                if visible:
                    break
                if time.monotonic() > deadline:
                    raise SourceError(
                        f"transaction {xid} reached slot {self._slot_name} but is still "
                        f"not visible at {self._where} after {VISIBLE_WAIT_S:.0f} s")
                await asyncio.sleep(VISIBLE_POLL_S)
            xid = None  # seen once: later batches' snapshots are newer still
            rows.update(found)
        return RowsRead(rows, position)

    def _read_batch(self, table: TableInfo, columns: list[str], keys: list[tuple[str, ...]],
                    xid: int | None, base_types: dict[int, int]) -> tuple[dict[str, Row], int, bool]:
        one = sql.SQL("({})").format(sql.SQL(", ").join(sql.SQL("%s::" + t) for t in table.key_types))
        key_list = sql.SQL(", ").join(sql.Identifier(c) for c in table.key_columns)
        # The position and the visibility check use the statement's own snapshot (taken before
        # the position is read); the outer join keeps one row when no key matches.
        query = sql.SQL(
            "SELECT pg_current_wal_insert_lsn()::text, {}, r.* FROM (SELECT 1) AS one LEFT JOIN "
            "(SELECT {} FROM {} WHERE ({}) IN ({})) AS r ON true").format(
            sql.SQL(_VISIBLE_SQL if xid is not None else "true"),
            sql.SQL(", ").join(sql.Identifier(c) for c in columns), table.identifier, key_list,
            sql.SQL(", ").join([one] * len(keys)))
        params: list[object] = [xid, xid] if xid is not None else []
        params += [text for key in keys for text in key]
        try:
            if self._conn is None:
                self._conn = self._connect()
            with self._conn.cursor() as cur:
                psycopg2.extensions.register_type(_raw_text_caster(), cur)
                cur.execute(query, params)
                result = cur.fetchall()
        except (psycopg2.errors.UndefinedColumn, psycopg2.errors.UndefinedTable):
            # The table changed shape (or went) since the change: that schema change comes later
            # in the stream, with a backfill (or the removal) above this change's version.
            logger.info("reading %s rows back: its columns changed since; the re-read that "
                        "follows the change fills them", table.entity_type)
            return {}, 0, True
        except psycopg2.Error as exc:
            self.close()
            raise SourceError(f"reading {table.entity_type} rows back at {self._where} failed: "
                              f"{exc}".strip()) from exc
        rows: dict[str, Row] = {}
        documents = document_key(table, base_types)
        for _, _, *values in result:
            if values[0] is None:  # keys are NOT NULL: the empty outer row
                continue
            decoded = {column: decode_text(base_types.get(table.type_oids[column],
                                                                table.type_oids[column]),
                                           value, self._zone)
                       for column, value in zip(columns, values, strict=True)}
            row = canonical(decoded)
            rows[entity_id_of(row, table.key_columns, documents=documents)] = row
        return rows, parse_lsn(result[0][0]), result[0][1] in (True, "t", "true")

    def close(self) -> None:
        """Close the connection (the next read opens another)."""
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(psycopg2.Error):
                conn.close()
