"""The provider-batch store in a SQLite file, usually the queue's own: tables `provider_batches`,
`provider_batch_jobs` and `provider_batch_claims` (rows under the store's name), every change one
transaction. Rows older than KEEP_S are deleted as new batches are recorded, so no table grows
without bound (as Redis lets its keys expire)."""

from __future__ import annotations

import sqlite3
import time

from tidegate._formats import StoreFormat
from tidegate._sqlite import SqliteThread
from tidegate.dispatch.provider_batches.store.base import CLEAN_UP, KEEP_S, ProviderBatchStore
from tidegate.errors import QueueUnavailable

__all__ = ["SQLITE_FORMAT", "SQLITE_SCHEMA", "SqliteProviderBatchStore"]

SQLITE_SCHEMA = """
CREATE TABLE IF NOT EXISTS provider_batches (
    store TEXT NOT NULL,                  -- the store's name, so several can share a file
    provider TEXT NOT NULL,
    batch_id TEXT NOT NULL,
    record TEXT NOT NULL,                 -- the ProviderBatchRecord as JSON
    written_ms INTEGER NOT NULL,
    PRIMARY KEY (store, provider, batch_id)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS provider_batches_by_time ON provider_batches (store, written_ms);
CREATE TABLE IF NOT EXISTS provider_batch_jobs (
    store TEXT NOT NULL,
    job_id TEXT NOT NULL,
    entry TEXT NOT NULL,                  -- the BatchedJob as JSON
    written_ms INTEGER NOT NULL,
    PRIMARY KEY (store, job_id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS provider_batch_claims (
    store TEXT NOT NULL,
    provider TEXT NOT NULL,
    batch_id TEXT NOT NULL,
    step TEXT NOT NULL,                   -- the step of the batch's upkeep claimed (cancel, clean_up)
    written_ms INTEGER NOT NULL,
    PRIMARY KEY (store, provider, batch_id, step)
) WITHOUT ROWID;
"""
# The tables' format (see tidegate._formats), recorded in the file next to the queue's.
SQLITE_FORMAT = StoreFormat.initial("provider_batches")
_TABLES = ("provider_batches", "provider_batch_jobs", "provider_batch_claims")

_IN_ONE_READ = 500  # job ids per SELECT, well below SQLite's limit of bound parameters
_PUT_JOB = ("INSERT INTO provider_batch_jobs (store, job_id, entry, written_ms) VALUES (?, ?, ?, ?)"
            " ON CONFLICT (store, job_id) DO UPDATE SET entry = excluded.entry,"
            " written_ms = excluded.written_ms")


class SqliteProviderBatchStore(ProviderBatchStore):
    """Provider batches in a SQLite file (WAL), usually the queue's own; safe across processes on
    one host."""

    def __init__(self, path: str, name: str = "default") -> None:
        super().__init__(name)
        self.path = path
        self._db = SqliteThread(path, SQLITE_SCHEMA, error=lambda exc: QueueUnavailable(
            f"SQLite provider-batch store at {path}: {exc}"), fmt=SQLITE_FORMAT)

    def __repr__(self) -> str:
        return f"SqliteProviderBatchStore(path={self.path!r}, name={self.name!r})"

    async def _open(self) -> None:
        pass  # the connection opens on its thread at the first statement

    async def _close(self) -> None:
        await self._db.close()

    async def _record(self, provider: str, batch_id: str, batch: bytes,
                      jobs: list[tuple[str, bytes]]) -> None:
        now_ms = int(time.time() * 1000)
        expired_ms = now_ms - KEEP_S * 1000

        def body(conn: sqlite3.Connection) -> None:
            for table in _TABLES:
                conn.execute(f"DELETE FROM {table} WHERE store = ? AND written_ms < ?",
                             (self.name, expired_ms))
            conn.execute("INSERT INTO provider_batches (store, provider, batch_id, record, written_ms)"
                         " VALUES (?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
                         (self.name, provider, batch_id, batch.decode(), now_ms))
            conn.executemany(_PUT_JOB, [(self.name, job_id, entry.decode(), now_ms)
                                        for job_id, entry in jobs])

        await self._db.write(body)

    async def _put_jobs(self, jobs: list[tuple[str, bytes]]) -> None:
        now_ms = int(time.time() * 1000)
        await self._db.write(lambda conn: conn.executemany(
            _PUT_JOB, [(self.name, job_id, entry.decode(), now_ms) for job_id, entry in jobs]))

    async def _get_job(self, job_id: str) -> str | None:
        row = await self._db.run(lambda conn: conn.execute(
            "SELECT entry FROM provider_batch_jobs WHERE store = ? AND job_id = ?",
            (self.name, job_id)).fetchone())
        return None if row is None else str(row[0])

    async def _get_jobs(self, job_ids: list[str]) -> list[str | None]:
        def read(conn: sqlite3.Connection) -> dict[str, str]:
            found: dict[str, str] = {}
            for start in range(0, len(job_ids), _IN_ONE_READ):
                chunk = job_ids[start:start + _IN_ONE_READ]
                found.update(conn.execute(
                    f"SELECT job_id, entry FROM provider_batch_jobs WHERE store = ? AND job_id IN"
                    f" ({', '.join('?' * len(chunk))})", (self.name, *chunk)).fetchall())
            return found

        entries = await self._db.run(read)
        return [entries.get(job_id) for job_id in job_ids]

    async def _get_batch(self, provider: str, batch_id: str) -> str | None:
        row = await self._db.run(lambda conn: conn.execute(
            "SELECT record FROM provider_batches WHERE store = ? AND provider = ? AND batch_id = ?",
            (self.name, provider, batch_id)).fetchone())
        return None if row is None else str(row[0])

    async def _open_batches(self, most: int) -> list[str]:
        expired_ms = int(time.time() * 1000) - KEEP_S * 1000
        rows = await self._db.run(lambda conn: conn.execute(
            "SELECT record FROM provider_batches AS b WHERE store = ? AND written_ms >= ? AND NOT EXISTS"
            " (SELECT 1 FROM provider_batch_claims AS c WHERE c.store = b.store AND c.provider = b.provider"
            " AND c.batch_id = b.batch_id AND c.step = ?) ORDER BY written_ms LIMIT ?",
            (self.name, expired_ms, CLEAN_UP, most)).fetchall())
        return [str(row[0]) for row in rows]

    async def _recent(self, after: tuple[str, str] | None, count: int) -> list[str]:
        expired_ms = int(time.time() * 1000) - KEEP_S * 1000
        query = "SELECT record FROM provider_batches WHERE store = ? AND written_ms >= ?"
        params: tuple[object, ...] = (self.name, expired_ms)
        if after is not None:  # an unknown batch compares as NULL: an empty page
            query += (" AND (written_ms, provider, batch_id) < (SELECT written_ms, provider, batch_id"
                      " FROM provider_batches WHERE store = ? AND provider = ? AND batch_id = ?)")
            params += (self.name, *after)
        query += " ORDER BY written_ms DESC, provider DESC, batch_id DESC LIMIT ?"
        rows = await self._db.run(lambda conn: conn.execute(query, (*params, count)).fetchall())
        return [str(row[0]) for row in rows]

    async def _claim(self, provider: str, batch_id: str, step: str) -> bool:
        now_ms = int(time.time() * 1000)
        inserted: int = await self._db.write(lambda conn: conn.execute(
            "INSERT INTO provider_batch_claims (store, provider, batch_id, step, written_ms)"
            " VALUES (?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
            (self.name, provider, batch_id, step, now_ms)).rowcount)
        return inserted == 1
