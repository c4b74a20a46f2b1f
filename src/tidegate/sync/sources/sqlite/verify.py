"""What `tidegate sync verify` reads from a SQLite source: the tables in key order with the
snapshot's own page query and row reader, rows by key, and how far the outbox was confirmed.

Positions are outbox sequence numbers (a change's version is (seq, ordinal)). Each read runs in
one read transaction together with the outbox's last sequence number N, so the boundary is exact:
the read sees every change up to N and none after (`low` = `high` = N + 1). The pipeline deletes
outbox rows once every sink applied them, so every change below the outbox's lowest remaining
sequence number (or, with an empty outbox, up to its last one) is applied.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Self, TypeVar

import orjson

from tidegate.errors import InvalidChange, SourceError
from tidegate.sync.contracts import CheckpointStore
from tidegate.sync.sources.sqlite.capture import OUTBOX, RowReader, read_shape
from tidegate.sync.sources.sqlite.settings import SqliteSourceSettings
from tidegate.sync.values import source_zone
from tidegate.sync.verify import SourceRead, SourceRow, source_row

__all__ = ["SqliteRows"]

T = TypeVar("T")
_LAST_SEQ = "SELECT COALESCE((SELECT seq FROM sqlite_sequence WHERE name = ?), 0)"


class SqliteRows:
    """`RowSource` over the tables of a SQLite source, on a read-only connection of its own."""

    def __init__(self, settings: SqliteSourceSettings, checkpoints: CheckpointStore) -> None:
        self.settings = settings
        self._checkpoints = checkpoints
        self._conn: sqlite3.Connection | None = None
        self._readers: dict[str, RowReader] = {}
        self.entity_types: tuple[str, ...] = ()

    async def __aenter__(self) -> Self:
        mark = await self._checkpoints.get_checkpoint(self.settings.checkpoint_name)
        if not isinstance(mark, dict) or not mark.get("done"):
            raise SourceError(f"{self.settings.path} has no finished snapshot in this cache: run "
                              "`tidegate sync` until its initial snapshot is done, then verify")
        await asyncio.to_thread(self._open)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            await asyncio.to_thread(conn.close)

    def _open(self) -> None:
        path = Path(self.settings.path)
        if not path.is_file():
            raise SourceError(f"no SQLite database at {self.settings.path}")
        uri = f"{path.resolve().as_uri()}?mode=ro"
        self._conn = sqlite3.connect(uri, uri=True, timeout=30, isolation_level=None,
                                     check_same_thread=False)
        zone = source_zone(self.settings.source_zone)
        for table in self.settings.tables:
            shape = read_shape(self._conn, table, self.settings.timestamp_columns.get(table))
            self._readers[shape.name] = RowReader(shape, zone)
        self.entity_types = tuple(self._readers)

    async def _run(self, work: Callable[[sqlite3.Connection], T]) -> T:
        conn = self._conn
        if conn is None:
            raise SourceError("the SQLite verify source is not open")
        try:
            return await asyncio.to_thread(work, conn)
        except sqlite3.Error as exc:
            raise SourceError(f"SQLite source at {self.settings.path}: {exc}") from exc

    # ------------------------------------------------------------------ RowSource

    async def batch(self, entity_type: str, after: tuple[Any, ...] | None, limit: int) -> SourceRead:
        """Up to `limit` rows after key `after`, by the snapshot's page query."""
        reader = self._readers[entity_type]
        shape = reader.shape
        width = len(shape.key_columns)

        def select(conn: sqlite3.Connection) -> list[tuple[tuple[Any, ...], str]]:
            found = conn.execute(shape.select_sql(after_key=after is not None), [*(after or ()), limit])
            return [(tuple(row[:width]), row[width]) for row in found.fetchall()]

        return await self._run(lambda conn: self._read(conn, reader, select))

    async def rows(self, entity_type: str, keys: Sequence[tuple[Any, ...]]) -> SourceRead:
        """The rows with these raw key values."""
        reader = self._readers[entity_type]
        query = reader.shape.row_sql()

        def select(conn: sqlite3.Connection) -> list[tuple[tuple[Any, ...], str]]:
            found = []
            for key in keys:
                row = conn.execute(query, list(key)).fetchone()
                if row is not None:
                    found.append((key, row[0]))
            return found

        return await self._run(lambda conn: self._read(conn, reader, select))

    async def applied(self) -> int:
        """Below the outbox's lowest unconfirmed sequence number (all of it when empty)."""
        def read(conn: sqlite3.Connection) -> int:
            lowest = conn.execute(f"SELECT min(seq) FROM {OUTBOX}").fetchone()[0]
            if lowest is not None:
                return int(lowest)
            return int(conn.execute(_LAST_SEQ, (OUTBOX,)).fetchone()[0]) + 1

        return await self._run(read)

    # ------------------------------------------------------------------ reads

    def _read(self, conn: sqlite3.Connection, reader: RowReader,
              select: Callable[[sqlite3.Connection], list[tuple[tuple[Any, ...], str]]]) -> SourceRead:
        conn.execute("BEGIN")
        try:
            last_seq = int(conn.execute(_LAST_SEQ, (OUTBOX,)).fetchone()[0])
            raw = select(conn)
        finally:
            conn.execute("COMMIT")
        shape = reader.shape
        rows: list[SourceRow] = []
        for key, image in raw:
            with contextlib.suppress(orjson.JSONDecodeError, InvalidChange):  # counted as unreadable
                values = reader.normalise(orjson.loads(image))
                rows.append(source_row(shape.name, shape.key_columns, key, values))
        last = raw[-1][0] if raw else None
        return SourceRead(tuple(rows), last_seq + 1, last_seq + 1, last, len(raw))
