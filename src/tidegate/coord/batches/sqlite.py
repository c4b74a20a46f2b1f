"""The batch store in a SQLite file, usually the queue's own: tables `batch_files`, `batches` and
`batch_lines` (rows under the store's name), every change one transaction."""

from __future__ import annotations

import sqlite3

from tidegate._sqlite import SqliteThread
from tidegate.coord.batches.base import BatchStore
from tidegate.errors import QueueUnavailable

__all__ = ["SqliteBatchStore"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS batch_files (
    store TEXT NOT NULL,                  -- the store's name, so several can share a file
    id TEXT NOT NULL,
    tenant TEXT NOT NULL,
    meta TEXT NOT NULL,                   -- the StoredFile as JSON
    content BLOB NOT NULL,
    PRIMARY KEY (store, id)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS batch_files_tenant ON batch_files(store, tenant);
CREATE TABLE IF NOT EXISTS batches (
    store TEXT NOT NULL,
    id TEXT NOT NULL,
    tenant TEXT NOT NULL,
    status TEXT NOT NULL,                 -- the record's own, apart for compare-and-set
    record TEXT NOT NULL,                 -- the BatchRecord as JSON
    PRIMARY KEY (store, id)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS batches_tenant ON batches(store, tenant);
CREATE TABLE IF NOT EXISTS batch_lines (
    store TEXT NOT NULL,
    id TEXT NOT NULL,
    lines BLOB NOT NULL,                  -- JSON list of BatchLine
    PRIMARY KEY (store, id)
) WITHOUT ROWID;
"""


class SqliteBatchStore(BatchStore):
    """Files and batches in a SQLite file (WAL), usually the queue's own; safe across processes
    on one host. Its calls run on the file's thread, never on the event loop: a file's bytes may
    be many megabytes."""

    def __init__(self, path: str, name: str = "default") -> None:
        super().__init__(name)
        self.path = path
        self._db = SqliteThread(path, _SCHEMA,
                                error=lambda exc: QueueUnavailable(f"SQLite batch store at {path}: {exc}"))

    def __repr__(self) -> str:
        return f"SqliteBatchStore(path={self.path!r}, name={self.name!r})"

    async def _open(self) -> None:
        pass  # the connection opens on its thread at the first statement

    async def _close(self) -> None:
        await self._db.close()

    async def _put_file(self, file_id: str, tenant: str, meta: str, content: bytes) -> None:
        await self._db.write(lambda conn: conn.execute(
            "INSERT INTO batch_files (store, id, tenant, meta, content) VALUES (?, ?, ?, ?, ?)"
            " ON CONFLICT (store, id) DO UPDATE SET meta = excluded.meta, content = excluded.content",
            (self.name, file_id, tenant, meta, content)))

    async def _get_file(self, file_id: str) -> str | None:
        row = await self._db.run(lambda conn: conn.execute(
            "SELECT meta FROM batch_files WHERE store = ? AND id = ?", (self.name, file_id)).fetchone())
        return None if row is None else str(row[0])

    async def _file_content(self, file_id: str) -> bytes | None:
        row = await self._db.run(lambda conn: conn.execute(
            "SELECT content FROM batch_files WHERE store = ? AND id = ?", (self.name, file_id)).fetchone())
        return None if row is None else bytes(row[0])

    async def _list_files(self, tenant: str) -> list[str | bytes]:
        rows = await self._db.run(lambda conn: conn.execute(
            "SELECT meta FROM batch_files WHERE store = ? AND tenant = ?", (self.name, tenant)).fetchall())
        return [str(row[0]) for row in rows]

    async def _delete_file(self, file_id: str) -> bool:
        changed = await self._db.write(lambda conn: conn.execute(
            "DELETE FROM batch_files WHERE store = ? AND id = ?", (self.name, file_id)).rowcount)
        return bool(changed)

    async def _insert_batch(self, batch_id: str, tenant: str, status: str, record: str) -> bool:
        changed = await self._db.write(lambda conn: conn.execute(
            "INSERT INTO batches (store, id, tenant, status, record) VALUES (?, ?, ?, ?, ?)"
            " ON CONFLICT DO NOTHING", (self.name, batch_id, tenant, status, record)).rowcount)
        return changed == 1

    async def _get_batch(self, batch_id: str) -> str | None:
        row = await self._db.run(lambda conn: conn.execute(
            "SELECT record FROM batches WHERE store = ? AND id = ?", (self.name, batch_id)).fetchone())
        return None if row is None else str(row[0])

    async def _list_batches(self, tenant: str | None) -> list[str | bytes]:
        def body(conn: sqlite3.Connection) -> list[str | bytes]:
            if tenant is None:
                rows = conn.execute("SELECT record FROM batches WHERE store = ?", (self.name,)).fetchall()
            else:
                rows = conn.execute("SELECT record FROM batches WHERE store = ? AND tenant = ?",
                                    (self.name, tenant)).fetchall()
            return [str(row[0]) for row in rows]

        return await self._db.run(body)

    async def _swap_batch(self, batch_id: str, expected: str, status: str, record: str) -> bool:
        changed = await self._db.write(lambda conn: conn.execute(
            "UPDATE batches SET status = ?, record = ? WHERE store = ? AND id = ? AND status = ?",
            (status, record, self.name, batch_id, expected)).rowcount)
        return changed == 1

    async def _put_lines(self, batch_id: str, lines: bytes) -> None:
        await self._db.write(lambda conn: conn.execute(
            "INSERT INTO batch_lines (store, id, lines) VALUES (?, ?, ?)"
            " ON CONFLICT (store, id) DO UPDATE SET lines = excluded.lines", (self.name, batch_id, lines)))

    async def _get_lines(self, batch_id: str) -> bytes | None:
        row = await self._db.run(lambda conn: conn.execute(
            "SELECT lines FROM batch_lines WHERE store = ? AND id = ?", (self.name, batch_id)).fetchone())
        return None if row is None else bytes(row[0])
