"""The tenant store in a SQLite file, usually the queue's own: tables `tenants` and `api_keys`
(rows under the store's name), every change one `BEGIN IMMEDIATE` transaction."""

from __future__ import annotations

import sqlite3
import time
from dataclasses import replace
from datetime import datetime
from typing import Any

from tidegate._formats import Migration, StoreFormat
from tidegate._sqlite import SqliteThread
from tidegate.coord.tenants.base import (
    DEFAULT_AUTH_CACHE_S,
    Clock,
    KeyRecord,
    LimitsChange,
    TenantStore,
    timestamp,
    unknown_tenant,
)
from tidegate.coord.tenants.models import NO_KEY_LIMITS, KeyLimits, Tenant
from tidegate.errors import QueueUnavailable

__all__ = ["SQLITE_FORMAT", "SQLITE_SCHEMA", "SqliteTenantStore"]

SQLITE_SCHEMA = """
CREATE TABLE IF NOT EXISTS tenants (
    store TEXT NOT NULL,                  -- the store's name, so several can share a file
    name TEXT NOT NULL,
    tenant TEXT NOT NULL,                 -- the Tenant model as JSON
    PRIMARY KEY (store, name)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS api_keys (
    store TEXT NOT NULL,
    key_id TEXT NOT NULL,                 -- public: names the key in listings and revocation
    tenant TEXT NOT NULL,
    secret_sha256 TEXT NOT NULL,          -- hex digest; the secret itself is never stored
    created_at TEXT NOT NULL,             -- UTC ISO 8601 with microseconds: text order is time order
    revoked_at TEXT,
    limits TEXT,                          -- the key's own KeyLimits as JSON; NULL: none (format 2)
    PRIMARY KEY (store, key_id)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS api_keys_tenant ON api_keys(store, tenant);
"""


def _add_limits_column(conn: sqlite3.Connection) -> None:
    """Format 2: a key may carry limits of its own; every key so far has none (NULL)."""
    if "limits" not in {row[1] for row in conn.execute("PRAGMA table_info(api_keys)")}:
        conn.execute("ALTER TABLE api_keys ADD COLUMN limits TEXT")


# The tables' format (see tidegate._formats), recorded in the file next to the queue's.
SQLITE_FORMAT = StoreFormat("tenants", 2, (
    *StoreFormat.initial("tenants").migrations,
    Migration(2, "API keys may carry limits of their own (a column, empty for every key so far)",
              _add_limits_column),
))

_KEY_COLUMNS = "key_id, tenant, secret_sha256, created_at, revoked_at, limits"


def _sqlite_record(row: tuple[Any, ...]) -> KeyRecord:
    key_id, tenant, digest, created, revoked, limits = row
    return KeyRecord(str(key_id), str(tenant), str(digest), datetime.fromisoformat(created),
                     datetime.fromisoformat(revoked) if revoked else None,
                     KeyLimits.model_validate_json(limits) if limits else NO_KEY_LIMITS)


def _limits_column(limits: KeyLimits) -> str | None:
    return None if limits == NO_KEY_LIMITS else limits.model_dump_json(exclude_none=True)


class SqliteTenantStore(TenantStore):
    """Tenants and keys in a SQLite file (WAL), usually the queue's own; safe across processes on
    one host. Connects on first use; `SqliteThread` keeps the event loop from waiting on the disk or
    on another process's lock."""

    def __init__(self, path: str, name: str = "default", *,
                 auth_cache_s: float = DEFAULT_AUTH_CACHE_S, clock: Clock = time.monotonic) -> None:
        super().__init__(name, auth_cache_s, clock)
        self.path = path
        self._db = SqliteThread(
            path, SQLITE_SCHEMA,
            error=lambda exc: QueueUnavailable(f"SQLite tenant store at {path}: {exc}"), on_loop=True,
            fmt=SQLITE_FORMAT,
        )

    def __repr__(self) -> str:
        return f"SqliteTenantStore(path={self.path!r}, name={self.name!r})"

    async def _open(self) -> None:
        pass  # the connection opens on its thread at the first statement

    async def _put_tenant(self, tenant: Tenant) -> None:
        def body(conn: sqlite3.Connection) -> None:
            conn.execute(
                "INSERT INTO tenants (store, name, tenant) VALUES (?, ?, ?)"
                " ON CONFLICT (store, name) DO UPDATE SET tenant = excluded.tenant",
                (self.name, tenant.name, tenant.model_dump_json()),
            )

        await self._db.write(body)

    async def _get_tenant(self, name: str) -> Tenant | None:
        row = await self._db.run(lambda conn: conn.execute(
            "SELECT tenant FROM tenants WHERE store = ? AND name = ?", (self.name, name)
        ).fetchone())
        return None if row is None else Tenant.model_validate_json(row[0])

    async def _list_tenants(self) -> list[Tenant]:
        rows = await self._db.run(lambda conn: conn.execute(
            "SELECT tenant FROM tenants WHERE store = ?", (self.name,)
        ).fetchall())
        return [Tenant.model_validate_json(row[0]) for row in rows]

    async def _insert_key(self, record: KeyRecord) -> bool:
        def body(conn: sqlite3.Connection) -> bool:
            # Checked in the same transaction as the insert, so no key outlives a check.
            known = conn.execute("SELECT 1 FROM tenants WHERE store = ? AND name = ?",
                                 (self.name, record.tenant)).fetchone()
            if known is None:
                raise unknown_tenant(record.tenant)
            cursor = conn.execute(
                f"INSERT INTO api_keys (store, {_KEY_COLUMNS}) VALUES (?, ?, ?, ?, ?, NULL, ?)"
                " ON CONFLICT DO NOTHING",
                (self.name, record.key_id, record.tenant, record.secret_sha256,
                 timestamp(record.created_at), _limits_column(record.limits)),
            )
            return cursor.rowcount == 1

        return await self._db.write(body)

    async def _lookup(self, key_id: str) -> tuple[KeyRecord, Tenant | None] | None:
        # One statement reads the key and its tenant together: one consistent snapshot.
        row = await self._db.run(lambda conn: conn.execute(
            "SELECT k.key_id, k.tenant, k.secret_sha256, k.created_at, k.revoked_at, k.limits, t.tenant"
            " FROM api_keys AS k LEFT JOIN tenants AS t ON t.store = k.store AND t.name = k.tenant"
            " WHERE k.store = ? AND k.key_id = ?",
            (self.name, key_id),
        ).fetchone())
        if row is None:
            return None
        tenant = Tenant.model_validate_json(row[6]) if row[6] is not None else None
        return _sqlite_record(row[:6]), tenant

    async def _change_limits(self, key_id: str, change: LimitsChange) -> KeyRecord | None:
        def body(conn: sqlite3.Connection) -> KeyRecord | None:
            # Read and written in one transaction: two changes at once both apply, in turn.
            row = conn.execute(f"SELECT {_KEY_COLUMNS} FROM api_keys"
                               " WHERE store = ? AND key_id = ? AND revoked_at IS NULL",
                               (self.name, key_id)).fetchone()
            if row is None:
                return None
            record = _sqlite_record(row)
            changed = replace(record, limits=change(record.limits))
            conn.execute("UPDATE api_keys SET limits = ? WHERE store = ? AND key_id = ?",
                         (_limits_column(changed.limits), self.name, key_id))
            return changed

        return await self._db.write(body)

    async def _revoke(self, key_id: str, when: datetime) -> bool:
        changed = await self._db.write(lambda conn: conn.execute(
            "UPDATE api_keys SET revoked_at = ? WHERE store = ? AND key_id = ? AND revoked_at IS NULL",
            (timestamp(when), self.name, key_id),
        ).rowcount)
        return changed == 1

    async def _delete_tenant(self, name: str, when: datetime) -> list[str] | None:
        def body(conn: sqlite3.Connection) -> list[str] | None:
            # One transaction, as _insert_key's check and insert: no key lands between the two.
            where = "store = ? AND tenant = ? AND revoked_at IS NULL"
            gone = conn.execute("DELETE FROM tenants WHERE store = ? AND name = ?", (self.name, name))
            if gone.rowcount == 0:
                return None
            rows = conn.execute(f"SELECT key_id FROM api_keys WHERE {where}", (self.name, name)).fetchall()
            conn.execute(f"UPDATE api_keys SET revoked_at = ? WHERE {where}",
                         (timestamp(when), self.name, name))
            return sorted(row[0] for row in rows)

        return await self._db.write(body)

    async def _list_keys(self, tenant: str | None) -> list[KeyRecord]:
        query = f"SELECT {_KEY_COLUMNS} FROM api_keys WHERE store = ?"
        params: tuple[str, ...] = (self.name,)
        if tenant is not None:
            query += " AND tenant = ?"
            params += (tenant,)
        rows = await self._db.run(lambda conn: conn.execute(query, params).fetchall())
        return [_sqlite_record(row) for row in rows]

    async def _close(self) -> None:
        await self._db.close()
