"""The batch store in a SQLite file, usually the queue's own: tables `batch_files`, `batches`,
`batch_lines` and `batch_answers` (rows under the store's name), every change one transaction.

Listing and the sweep's questions read indexes on the records' own JSON fields (a file's or a
batch's `created_at` per tenant, a file's `expires_at`, a batch's status), so a page costs its
size and tables made before those fields were indexed need no other change."""

from __future__ import annotations

import sqlite3
from typing import Final

from tidegate._formats import StoreFormat
from tidegate._sqlite import SqliteThread
from tidegate.errors import QueueUnavailable
from tidegate.gateway.batches.store.base import ACTIVE, BatchStore
from tidegate.gateway.batches.store.models import BatchRecord, StoredFile

__all__ = ["SQLITE_FORMAT", "SQLITE_SCHEMA", "SqliteBatchStore"]

_FILE_CREATED: Final = "json_extract(meta, '$.created_at')"
_FILE_EXPIRES: Final = "json_extract(meta, '$.expires_at')"
_BATCH_CREATED: Final = "json_extract(record, '$.created_at')"
_ACTIVE_SQL: Final = ", ".join(f"'{status}'" for status in sorted(ACTIVE))

SQLITE_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS batch_files (
    store TEXT NOT NULL,                  -- the store's name, so several can share a file
    id TEXT NOT NULL,
    tenant TEXT NOT NULL,
    meta TEXT NOT NULL,                   -- the StoredFile as JSON
    content BLOB NOT NULL,
    PRIMARY KEY (store, id)
) WITHOUT ROWID;
DROP INDEX IF EXISTS batch_files_tenant;
CREATE INDEX IF NOT EXISTS batch_files_listed ON batch_files(store, tenant, {_FILE_CREATED}, id);
CREATE INDEX IF NOT EXISTS batch_files_expiring ON batch_files(store, {_FILE_EXPIRES})
    WHERE {_FILE_EXPIRES} IS NOT NULL;
CREATE TABLE IF NOT EXISTS batches (
    store TEXT NOT NULL,
    id TEXT NOT NULL,
    tenant TEXT NOT NULL,
    status TEXT NOT NULL,                 -- the record's own, apart for compare-and-set
    record TEXT NOT NULL,                 -- the BatchRecord as JSON
    PRIMARY KEY (store, id)
) WITHOUT ROWID;
DROP INDEX IF EXISTS batches_tenant;
CREATE INDEX IF NOT EXISTS batches_listed ON batches(store, tenant, {_BATCH_CREATED}, id);
CREATE INDEX IF NOT EXISTS batches_by_time ON batches(store, {_BATCH_CREATED}, id);
CREATE INDEX IF NOT EXISTS batches_status ON batches(store, status);
CREATE TABLE IF NOT EXISTS batch_lines (
    store TEXT NOT NULL,
    id TEXT NOT NULL,
    lines BLOB NOT NULL,                  -- JSON list of BatchLine
    PRIMARY KEY (store, id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS batch_answers (
    store TEXT NOT NULL,
    batch TEXT NOT NULL,
    custom_id TEXT NOT NULL,
    answer BLOB NOT NULL,                 -- which file, then the JSON line (BatchStore.put_answers)
    PRIMARY KEY (store, batch, custom_id)
) WITHOUT ROWID;
"""
# The tables' format (see tidegate._formats), recorded in the file next to the queue's.
SQLITE_FORMAT = StoreFormat.initial("batches")


def _before(created: str) -> str:
    """The rows listed after a cursor's (created, id), spelt so that the index seeks to it:
    (created, id) < (?, ?) as a row value would scan from the newest."""
    return f" AND {created} <= ? AND ({created} < ? OR id < ?)"


class SqliteBatchStore(BatchStore):
    """Files and batches in a SQLite file (WAL), usually the queue's own; safe across processes
    on one host. Its calls run on the file's thread, never on the event loop: a file's bytes may
    be many megabytes."""

    def __init__(self, path: str, name: str = "default") -> None:
        super().__init__(name)
        self.path = path
        self._db = SqliteThread(path, SQLITE_SCHEMA,
                                error=lambda exc: QueueUnavailable(f"SQLite batch store at {path}: {exc}"),
                                fmt=SQLITE_FORMAT)

    def __repr__(self) -> str:
        return f"SqliteBatchStore(path={self.path!r}, name={self.name!r})"

    async def _open(self) -> None:
        pass  # the connection opens on its thread at the first statement

    async def _close(self) -> None:
        await self._db.close()

    async def _put_file(self, file: StoredFile, meta: str, content: bytes) -> None:
        await self._db.write(lambda conn: conn.execute(
            "INSERT INTO batch_files (store, id, tenant, meta, content) VALUES (?, ?, ?, ?, ?)"
            " ON CONFLICT (store, id) DO UPDATE SET meta = excluded.meta, content = excluded.content",
            (self.name, file.id, file.tenant, meta, content)))

    async def _get_file(self, file_id: str) -> str | None:
        row = await self._db.run(lambda conn: conn.execute(
            "SELECT meta FROM batch_files WHERE store = ? AND id = ?", (self.name, file_id)).fetchone())
        return None if row is None else str(row[0])

    async def _file_content(self, file_id: str) -> bytes | None:
        row = await self._db.run(lambda conn: conn.execute(
            "SELECT content FROM batch_files WHERE store = ? AND id = ?", (self.name, file_id)).fetchone())
        return None if row is None else bytes(row[0])

    async def _page_files(self, tenant: str, purpose: str | None, after: str | None,
                          count: int) -> list[str | bytes]:
        def body(conn: sqlite3.Connection) -> list[str | bytes]:
            where, args = "store = ? AND tenant = ?", [self.name, tenant]
            if purpose is not None:
                where, args = where + " AND json_extract(meta, '$.purpose') = ?", [*args, purpose]
            if after is not None:
                row = conn.execute(f"SELECT {_FILE_CREATED} FROM batch_files WHERE store = ? AND tenant = ?"
                                   " AND id = ?", (self.name, tenant, after)).fetchone()
                if row is None:
                    return []
                where, args = where + _before(_FILE_CREATED), [*args, row[0], row[0], after]
            rows = conn.execute(f"SELECT meta FROM batch_files WHERE {where}"
                                f" ORDER BY {_FILE_CREATED} DESC, id DESC LIMIT ?", (*args, count)).fetchall()
            return [str(row[0]) for row in rows]

        return await self._db.run(body)

    async def _delete_file(self, file_id: str) -> bool:
        changed = await self._db.write(lambda conn: conn.execute(
            "DELETE FROM batch_files WHERE store = ? AND id = ?", (self.name, file_id)).rowcount)
        return bool(changed)

    async def _expired_files(self, now_s: int, count: int) -> list[str | bytes]:
        rows = await self._db.run(lambda conn: conn.execute(
            f"SELECT meta FROM batch_files WHERE store = ? AND {_FILE_EXPIRES} IS NOT NULL"
            f" AND {_FILE_EXPIRES} <= ? ORDER BY {_FILE_EXPIRES} LIMIT ?",
            (self.name, now_s, count)).fetchall())
        return [str(row[0]) for row in rows]

    async def _insert_batch(self, batch: BatchRecord, record: str) -> bool:
        changed = await self._db.write(lambda conn: conn.execute(
            "INSERT INTO batches (store, id, tenant, status, record) VALUES (?, ?, ?, ?, ?)"
            " ON CONFLICT DO NOTHING", (self.name, batch.id, batch.tenant, batch.status, record)).rowcount)
        return changed == 1

    async def _get_batch(self, batch_id: str) -> str | None:
        row = await self._db.run(lambda conn: conn.execute(
            "SELECT record FROM batches WHERE store = ? AND id = ?", (self.name, batch_id)).fetchone())
        return None if row is None else str(row[0])

    async def _page_batches(self, tenant: str | None, after: str | None, count: int) -> list[str | bytes]:
        def body(conn: sqlite3.Connection) -> list[str | bytes]:
            where, args = "store = ?", [self.name]
            if tenant is not None:
                where, args = where + " AND tenant = ?", [*args, tenant]
            if after is not None:
                row = conn.execute(f"SELECT {_BATCH_CREATED} FROM batches WHERE {where} AND id = ?",
                                   (*args, after)).fetchone()
                if row is None:
                    return []
                where, args = where + _before(_BATCH_CREATED), [*args, row[0], row[0], after]
            rows = conn.execute(f"SELECT record FROM batches WHERE {where} ORDER BY {_BATCH_CREATED} DESC,"
                                " id DESC LIMIT ?", (*args, count)).fetchall()
            return [str(row[0]) for row in rows]

        return await self._db.run(body)

    async def _active_batches(self, count: int | None) -> list[str | bytes]:
        rows = await self._db.run(lambda conn: conn.execute(
            "SELECT record FROM batches INDEXED BY batches_status"  # without statistics SQLite reads all
            f" WHERE store = ? AND status IN ({_ACTIVE_SQL})"
            " ORDER BY json_extract(record, '$.checked_ms'), id LIMIT ?",
            (self.name, -1 if count is None else count)).fetchall())
        return [str(row[0]) for row in rows]

    async def _swap_batch(self, batch: BatchRecord, expected: str, record: str) -> bool:
        changed = await self._db.write(lambda conn: conn.execute(
            "UPDATE batches SET status = ?, record = ? WHERE store = ? AND id = ? AND status = ?",
            (batch.status, record, self.name, batch.id, expected)).rowcount)
        return changed == 1

    async def _put_lines(self, batch_id: str, lines: bytes) -> None:
        await self._db.write(lambda conn: conn.execute(
            "INSERT INTO batch_lines (store, id, lines) VALUES (?, ?, ?)"
            " ON CONFLICT (store, id) DO UPDATE SET lines = excluded.lines", (self.name, batch_id, lines)))

    async def _get_lines(self, batch_id: str) -> bytes | None:
        row = await self._db.run(lambda conn: conn.execute(
            "SELECT lines FROM batch_lines WHERE store = ? AND id = ?", (self.name, batch_id)).fetchone())
        return None if row is None else bytes(row[0])

    async def _put_answers(self, batch_id: str, answers: dict[str, bytes]) -> None:
        rows = [(self.name, batch_id, custom_id, answer) for custom_id, answer in answers.items()]
        await self._db.write(lambda conn: conn.executemany(
            "INSERT INTO batch_answers (store, batch, custom_id, answer) VALUES (?, ?, ?, ?)"
            " ON CONFLICT DO NOTHING", rows))

    async def _get_answers(self, batch_id: str) -> dict[str, bytes]:
        rows = await self._db.run(lambda conn: conn.execute(
            "SELECT custom_id, answer FROM batch_answers WHERE store = ? AND batch = ?",
            (self.name, batch_id)).fetchall())
        return {str(row[0]): bytes(row[1]) for row in rows}

    async def _drop_answers(self, batch_id: str) -> None:
        await self._db.write(lambda conn: conn.execute(
            "DELETE FROM batch_answers WHERE store = ? AND batch = ?", (self.name, batch_id)))
