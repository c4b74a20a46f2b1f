"""Where tenants and their API keys live: the queue's own backend, so every gateway replica and
every `tidegate keys …` command sees the same ones.

- SQLite (`sqlite:///path`): the queue's file, tables `tenants` and `api_keys` (rows under the
  store's name), every change one `BEGIN IMMEDIATE` transaction on a thread of its own.
- Redis (`redis://…?name=X`): two hashes with the queue's hash tag, `tidegate:{X}:tenants`
  (name → Tenant JSON) and `tidegate:{X}:keys` (key id → tenant, SHA-256 hex digest of the
  secret, created and revoked times, as JSON).

A key reads `tg_<key id>_<secret>`: 12 lowercase hex characters of public id, then 32 random
bytes, URL-safe base64. Only the digest of the secret is stored, so neither the tables nor the
hashes nor any listing, repr, log line or error can give a key away.

`authenticate` says only "this tenant" or None: a malformed key, an unknown id, a wrong secret,
a revoked key and a deleted tenant all look alike. It hashes the presented secret every time and
compares digests in constant time, so how long a check takes does not depend on how much of a
secret was right.

Authentication cache: a store remembers a key it found valid for `auth_cache_s` (1 s by default,
0 turns it off), so a busy gateway does not ask the backend on every request. The secret is still
hashed and compared on every call. A revocation or tenant change made through the same store
object takes effect at once; one made through another store (another replica, the CLI) takes
effect on this one within `auth_cache_s`. Only valid keys are cached, so a new key works at once
everywhere and bogus keys cannot fill the cache.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import re
import secrets
import sqlite3
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Self, TypeVar
from urllib.parse import parse_qsl, urlsplit

import orjson

from tidegate._redis import (
    RETRY_WITHIN_S,
    Outage,
    call_with_reconnect,
    connection_options,
)
from tidegate._sqlite import SqliteThread
from tidegate._urls import redact_url
from tidegate.coord._store import backend_of, without_query
from tidegate.coord.tenants import ApiKeyInfo, Tenant, TenantStore
from tidegate.errors import ConfigError, MissingDependency, QueueClosed, QueueUnavailable, TenantNotFound
from tidegate.queue.base import _sqlite_path

__all__ = [
    "DEFAULT_AUTH_CACHE_S",
    "RedisTenantStore",
    "SqliteTenantStore",
    "parse_api_key",
    "tenant_store_for",
]

log = logging.getLogger("tidegate.tenants")

T = TypeVar("T")
Clock = Callable[[], float]  # monotonic seconds; injectable so tests can move time

DEFAULT_AUTH_CACHE_S = 1.0
AUTH_CACHE_MAX_KEYS = 4_096  # a gateway serves far fewer live keys; the bound only caps memory
KEY_PREFIX = "tg_"
_KEY_ID_BYTES = 6  # 12 hex characters
_SECRET_BYTES = 32
_NAME_RE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")  # as QueueSettings.name: it goes into a {hash tag}
# The secret part accepts any sane URL-safe length, so keys made with a longer secret later still
# parse; today's are 43 characters.
_KEY_RE = re.compile(r"tg_([0-9a-f]{12})_([A-Za-z0-9_-]{20,128})")
_MAX_KEY_CHARS = len(KEY_PREFIX) + 2 * _KEY_ID_BYTES + 1 + 128
_ID_ATTEMPTS = 5  # fresh ids tried should one collide (2^48 of them: it will not happen)
# What a malformed or unknown key is compared with, so that every path hashes and compares once.
_DUMMY_SECRET = "x" * 43
_DUMMY_DIGEST = hashlib.sha256(b"tidegate: no such key").hexdigest()


def _new_key() -> tuple[str, str]:
    """A fresh key id and secret."""
    return secrets.token_hex(_KEY_ID_BYTES), secrets.token_urlsafe(_SECRET_BYTES)


def parse_api_key(api_key: object) -> tuple[str, str] | None:
    """(key id, secret) of a well-formed key, else None."""
    if not isinstance(api_key, str) or len(api_key) > _MAX_KEY_CHARS:
        return None
    match = _KEY_RE.fullmatch(api_key)
    return (match[1], match[2]) if match else None


def _digest(secret: str) -> str:
    # One fast hash is enough: the secret is 256 random bits, nothing a dictionary could guess.
    return hashlib.sha256(secret.encode()).hexdigest()


def _now() -> datetime:
    return datetime.now(UTC)


def _timestamp(moment: datetime) -> str:
    # A fixed format (always with microseconds, always UTC) so that text order is time order.
    return moment.astimezone(UTC).isoformat(timespec="microseconds")


def _check_name(name: str) -> str:
    if not _NAME_RE.fullmatch(name):
        raise ConfigError(f"invalid tenant store name {name!r}: use 1-64 of A-Z a-z 0-9 _ . -")
    return name


def tenant_store_for(queue_url: str, *, auth_cache_s: float = DEFAULT_AUTH_CACHE_S) -> TenantStore:
    """The tenant store of a queue: the same SQLite file (its own tables) or the same Redis server
    (hashes under the queue's `?name=`, "default" when not given)."""
    parts = urlsplit(queue_url)
    name = dict(parse_qsl(parts.query)).get("name", "default")
    if backend_of(queue_url) == "redis":
        return RedisTenantStore(without_query(queue_url), name, auth_cache_s=auth_cache_s)
    return SqliteTenantStore(_sqlite_path(parts.netloc, parts.path), name, auth_cache_s=auth_cache_s)


@dataclass(frozen=True, slots=True)
class _KeyRecord:
    """A stored key: what authenticate checks and list_keys shows; never the secret itself."""

    key_id: str
    tenant: str
    secret_sha256: str
    created_at: datetime
    revoked_at: datetime | None = None

    def info(self) -> ApiKeyInfo:
        return ApiKeyInfo(key_id=self.key_id, tenant=self.tenant, created_at=self.created_at,
                          revoked_at=self.revoked_at)


@dataclass(frozen=True, slots=True)
class _Cached:
    secret_sha256: str
    tenant: Tenant
    expires_at: float  # on the store's clock


def _newest_first(records: list[_KeyRecord]) -> list[ApiKeyInfo]:
    records.sort(key=lambda record: (record.created_at, record.key_id), reverse=True)
    return [record.info() for record in records]


class _TenantStoreBase:
    """The rules every backend shares — key format, hashing, constant-time checks, the
    authentication cache, the lifecycle — around a few storage hooks."""

    _what = "tenant store"

    def __init__(self, name: str, auth_cache_s: float, clock: Clock) -> None:
        if auth_cache_s < 0:
            raise ValueError(f"auth_cache_s must be >= 0, got {auth_cache_s}")
        self.name = _check_name(name)
        self.auth_cache_s = auth_cache_s
        self._clock = clock
        self._cache: OrderedDict[str, _Cached] = OrderedDict()
        self._closed = False

    # -- the TenantStore protocol

    async def put_tenant(self, tenant: Tenant) -> None:
        """Create or replace a tenant."""
        self._check_open()
        await self._put_tenant(tenant)
        self._cache.clear()  # its keys must not answer with the old limits from this store

    async def get_tenant(self, name: str) -> Tenant | None:
        """The tenant, or None."""
        self._check_open()
        return await self._get_tenant(name)

    async def list_tenants(self) -> list[Tenant]:
        """Every tenant, by name."""
        self._check_open()
        return sorted(await self._list_tenants(), key=lambda tenant: tenant.name)

    async def create_key(self, tenant: str) -> tuple[ApiKeyInfo, str]:
        """A new key for an existing tenant: its listing and the full key, shown only now.
        Raises TenantNotFound for an unknown tenant."""
        self._check_open()
        for _ in range(_ID_ATTEMPTS):
            key_id, secret = _new_key()
            record = _KeyRecord(key_id, tenant, _digest(secret), _now())
            if await self._insert_key(record):
                log.info("created API key %s for tenant %s", key_id, tenant)
                return record.info(), f"{KEY_PREFIX}{key_id}_{secret}"
        raise QueueUnavailable(f"{self._what}: no free key id after {_ID_ATTEMPTS} attempts")

    async def authenticate(self, api_key: str) -> Tenant | None:
        """The tenant of a valid, unrevoked key of an existing tenant; None for anything else,
        never saying why. See the module docstring for the cache."""
        self._check_open()
        parsed = parse_api_key(api_key)
        # Hash and compare on every path, so the work done does not depend on the secret.
        digest = _digest(parsed[1] if parsed else _DUMMY_SECRET)
        if parsed is None:
            hmac.compare_digest(digest, _DUMMY_DIGEST)
            return None
        key_id = parsed[0]
        cached = self._cached(key_id)
        if cached is not None:
            return cached.tenant if hmac.compare_digest(digest, cached.secret_sha256) else None
        found = await self._lookup(key_id)
        if found is None:
            hmac.compare_digest(digest, _DUMMY_DIGEST)
            return None
        record, tenant = found
        if not hmac.compare_digest(digest, record.secret_sha256):
            return None
        if record.revoked_at is not None or tenant is None:
            return None
        self._remember(key_id, _Cached(record.secret_sha256, tenant,
                                       self._clock() + self.auth_cache_s))
        return tenant

    async def revoke_key(self, key_id: str) -> bool:
        """Revoke a key; False when there is no such unrevoked key."""
        self._check_open()
        self._cache.pop(key_id, None)
        revoked = await self._revoke(key_id, _now())
        if revoked:
            log.info("revoked API key %s", key_id)
        return revoked

    async def list_keys(self, tenant: str | None = None) -> list[ApiKeyInfo]:
        """Keys (all, or one tenant's), newest first."""
        self._check_open()
        return _newest_first(await self._list_keys(tenant))

    async def close(self) -> None:
        """Release connections. Idempotent; a closed store cannot be used again."""
        if not self._closed:
            self._closed = True
            self._cache.clear()
            await self._close()

    async def __aenter__(self) -> Self:
        self._check_open()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # -- the cache

    def _cached(self, key_id: str) -> _Cached | None:
        if self.auth_cache_s <= 0:
            return None
        entry = self._cache.get(key_id)
        if entry is not None and entry.expires_at <= self._clock():
            del self._cache[key_id]
            return None
        return entry

    def _remember(self, key_id: str, entry: _Cached) -> None:
        if self.auth_cache_s <= 0:
            return
        self._cache[key_id] = entry
        self._cache.move_to_end(key_id)
        while len(self._cache) > AUTH_CACHE_MAX_KEYS:
            self._cache.popitem(last=False)

    def _check_open(self) -> None:
        if self._closed:
            raise QueueClosed(f"this {self._what} was closed; create a new one")

    # -- storage hooks, implemented by each backend

    async def _put_tenant(self, tenant: Tenant) -> None:
        raise NotImplementedError

    async def _get_tenant(self, name: str) -> Tenant | None:
        raise NotImplementedError

    async def _list_tenants(self) -> list[Tenant]:
        raise NotImplementedError

    async def _insert_key(self, record: _KeyRecord) -> bool:
        """Store a new key; False if its id is taken. TenantNotFound for an unknown tenant."""
        raise NotImplementedError

    async def _lookup(self, key_id: str) -> tuple[_KeyRecord, Tenant | None] | None:
        """The key and its tenant (None if the tenant is gone), or None for an unknown id."""
        raise NotImplementedError

    async def _revoke(self, key_id: str, when: datetime) -> bool:
        raise NotImplementedError

    async def _list_keys(self, tenant: str | None) -> list[_KeyRecord]:
        raise NotImplementedError

    async def _close(self) -> None:
        raise NotImplementedError


def _unknown_tenant(name: str) -> TenantNotFound:
    return TenantNotFound(f"no tenant named {name!r}: create it first (tidegate tenants put {name})")


# ---------------------------------------------------------------------- SQLite

_SCHEMA = """
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
    PRIMARY KEY (store, key_id)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS api_keys_tenant ON api_keys(store, tenant);
"""

_KEY_COLUMNS = "key_id, tenant, secret_sha256, created_at, revoked_at"


def _sqlite_record(row: tuple[Any, ...]) -> _KeyRecord:
    key_id, tenant, digest, created, revoked = row
    return _KeyRecord(str(key_id), str(tenant), str(digest), datetime.fromisoformat(created),
                      datetime.fromisoformat(revoked) if revoked else None)


class SqliteTenantStore(_TenantStoreBase):
    """Tenants and keys in a SQLite file (WAL), usually the queue's own; safe across processes on
    one host. Connects lazily, on a thread of its own so the event loop never waits on the disk."""

    def __init__(self, path: str, name: str = "default", *,
                 auth_cache_s: float = DEFAULT_AUTH_CACHE_S, clock: Clock = time.monotonic) -> None:
        super().__init__(name, auth_cache_s, clock)
        self.path = path
        self._db = SqliteThread(
            path, _SCHEMA, name="tenants",
            error=lambda exc: QueueUnavailable(f"SQLite {self._what} at {path}: {exc}"),
        )

    def __repr__(self) -> str:
        return f"SqliteTenantStore(path={self.path!r}, name={self.name!r})"

    async def _put_tenant(self, tenant: Tenant) -> None:
        def body(conn: sqlite3.Connection) -> None:
            conn.execute(
                "INSERT INTO tenants (store, name, tenant) VALUES (?, ?, ?)"
                " ON CONFLICT (store, name) DO UPDATE SET tenant = excluded.tenant",
                (self.name, tenant.name, tenant.model_dump_json()),
            )

        await self._write(body)

    async def _get_tenant(self, name: str) -> Tenant | None:
        row = await self._run(lambda conn: conn.execute(
            "SELECT tenant FROM tenants WHERE store = ? AND name = ?", (self.name, name)
        ).fetchone())
        return None if row is None else Tenant.model_validate_json(row[0])

    async def _list_tenants(self) -> list[Tenant]:
        rows = await self._run(lambda conn: conn.execute(
            "SELECT tenant FROM tenants WHERE store = ?", (self.name,)
        ).fetchall())
        return [Tenant.model_validate_json(row[0]) for row in rows]

    async def _insert_key(self, record: _KeyRecord) -> bool:
        def body(conn: sqlite3.Connection) -> bool:
            # Checked in the same transaction as the insert, so no key outlives a check.
            known = conn.execute("SELECT 1 FROM tenants WHERE store = ? AND name = ?",
                                 (self.name, record.tenant)).fetchone()
            if known is None:
                raise _unknown_tenant(record.tenant)
            cursor = conn.execute(
                f"INSERT INTO api_keys (store, {_KEY_COLUMNS}) VALUES (?, ?, ?, ?, ?, NULL)"
                " ON CONFLICT DO NOTHING",
                (self.name, record.key_id, record.tenant, record.secret_sha256,
                 _timestamp(record.created_at)),
            )
            return cursor.rowcount == 1

        return await self._write(body)

    async def _lookup(self, key_id: str) -> tuple[_KeyRecord, Tenant | None] | None:
        # One statement reads the key and its tenant together: one consistent snapshot.
        row = await self._run(lambda conn: conn.execute(
            "SELECT k.key_id, k.tenant, k.secret_sha256, k.created_at, k.revoked_at, t.tenant"
            " FROM api_keys AS k LEFT JOIN tenants AS t ON t.store = k.store AND t.name = k.tenant"
            " WHERE k.store = ? AND k.key_id = ?",
            (self.name, key_id),
        ).fetchone())
        if row is None:
            return None
        tenant = Tenant.model_validate_json(row[5]) if row[5] is not None else None
        return _sqlite_record(row[:5]), tenant

    async def _revoke(self, key_id: str, when: datetime) -> bool:
        changed = await self._write(lambda conn: conn.execute(
            "UPDATE api_keys SET revoked_at = ? WHERE store = ? AND key_id = ? AND revoked_at IS NULL",
            (_timestamp(when), self.name, key_id),
        ).rowcount)
        return changed == 1

    async def _list_keys(self, tenant: str | None) -> list[_KeyRecord]:
        query = f"SELECT {_KEY_COLUMNS} FROM api_keys WHERE store = ?"
        params: tuple[str, ...] = (self.name,)
        if tenant is not None:
            query += " AND tenant = ?"
            params += (tenant,)
        rows = await self._run(lambda conn: conn.execute(query, params).fetchall())
        return [_sqlite_record(row) for row in rows]

    async def _close(self) -> None:
        await self._db.close()

    # -- plumbing

    async def _run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        self._check_open()
        return await self._db.run(fn)

    async def _write(self, body: Callable[[sqlite3.Connection], T]) -> T:
        self._check_open()
        return await self._db.write(body)


# ---------------------------------------------------------------------- Redis


def _redis_record(key_id: str, raw: str | bytes) -> _KeyRecord:
    data = orjson.loads(raw)
    revoked = data.get("revoked_at")
    return _KeyRecord(key_id, data["tenant"], data["secret_sha256"],
                      datetime.fromisoformat(data["created_at"]),
                      datetime.fromisoformat(revoked) if revoked else None)


def _redis_value(record: _KeyRecord) -> bytes:
    return orjson.dumps({
        "tenant": record.tenant,
        "secret_sha256": record.secret_sha256,
        "created_at": _timestamp(record.created_at),
        "revoked_at": _timestamp(record.revoked_at) if record.revoked_at else None,
    })


class RedisTenantStore(_TenantStoreBase):
    """Tenants and keys in two Redis hashes, `tidegate:{name}:tenants` and `tidegate:{name}:keys`,
    hash-tagged by the queue's name so they sit on one Redis Cluster slot. Connects lazily.

    A check costs two reads (the key, then its tenant); the authentication cache spares them for
    keys seen within `auth_cache_s`."""

    def __init__(self, url: str, name: str = "default", *,
                 auth_cache_s: float = DEFAULT_AUTH_CACHE_S, clock: Clock = time.monotonic) -> None:
        super().__init__(name, auth_cache_s, clock)
        try:
            import redis.asyncio as aioredis
            from redis.exceptions import RedisError, WatchError
        except ImportError as exc:  # pragma: no cover - exercised only without the extra
            raise MissingDependency(
                f"the Redis {self._what} needs redis-py: pip install 'tidegate[redis]'"
            ) from exc
        self.url = url
        self.tenants_key = f"tidegate:{{{name}}}:tenants"
        self.keys_key = f"tidegate:{{{name}}}:keys"
        self._errors: type[Exception] = RedisError
        self._watch_error: type[Exception] = WatchError
        # retry=None: a lost connection is retried by `_call` on its own bounded schedule.
        self._redis: Any = aioredis.Redis.from_url(
            url, decode_responses=True, retry=None, **connection_options())
        self._outage = Outage("tenant_store", url)

    def __repr__(self) -> str:
        return f"RedisTenantStore(url={redact_url(self.url)!r}, name={self.name!r})"

    async def _put_tenant(self, tenant: Tenant) -> None:
        await self._call(lambda r: r.hset(self.tenants_key, tenant.name, tenant.model_dump_json()))

    async def _get_tenant(self, name: str) -> Tenant | None:
        raw = await self._call(lambda r: r.hget(self.tenants_key, name))
        return None if raw is None else Tenant.model_validate_json(raw)

    async def _list_tenants(self) -> list[Tenant]:
        values = await self._call(lambda r: r.hvals(self.tenants_key))
        return [Tenant.model_validate_json(raw) for raw in values]

    async def _insert_key(self, record: _KeyRecord) -> bool:
        # No command deletes a tenant, so a tenant seen here is still there when the key lands.
        if not await self._call(lambda r: r.hexists(self.tenants_key, record.tenant)):
            raise _unknown_tenant(record.tenant)
        added = await self._call(lambda r: r.hsetnx(self.keys_key, record.key_id, _redis_value(record)),
                                 retry=False)  # sent twice, it would find its own key "taken"
        return bool(added)

    async def _lookup(self, key_id: str) -> tuple[_KeyRecord, Tenant | None] | None:
        raw = await self._call(lambda r: r.hget(self.keys_key, key_id))
        if raw is None:
            return None
        record = _redis_record(key_id, raw)
        tenant_raw = await self._call(lambda r: r.hget(self.tenants_key, record.tenant))
        return record, (None if tenant_raw is None else Tenant.model_validate_json(tenant_raw))

    async def _revoke(self, key_id: str, when: datetime) -> bool:
        async def attempt(r: Any) -> bool | None:
            # WATCH makes read-check-write one step: of two concurrent revocations one wins.
            async with r.pipeline(transaction=True) as pipe:
                await pipe.watch(self.keys_key)
                raw = await pipe.hget(self.keys_key, key_id)
                record = None if raw is None else _redis_record(key_id, raw)
                if record is None or record.revoked_at is not None:
                    return False
                revoked = _KeyRecord(record.key_id, record.tenant, record.secret_sha256,
                                     record.created_at, when)
                pipe.multi()
                pipe.hset(self.keys_key, key_id, _redis_value(revoked))
                try:
                    await pipe.execute()
                except self._watch_error:
                    return None  # the hash changed under us: read again
                return True

        while True:
            outcome = await self._call(attempt)
            if outcome is not None:
                return outcome

    async def _list_keys(self, tenant: str | None) -> list[_KeyRecord]:
        entries: dict[str, str] = await self._call(lambda r: r.hgetall(self.keys_key))
        records = [_redis_record(key_id, raw) for key_id, raw in entries.items()]
        return [record for record in records if tenant is None or record.tenant == tenant]

    async def _close(self) -> None:
        await self._redis.aclose()

    async def _call(self, fn: Callable[[Any], Awaitable[T]], *, retry: bool = True) -> T:
        """`fn(client)`, sent again across a lost connection (a Redis restart) for a short while
        when `retry` (reads, and writes that are harmless twice), driver errors translated."""
        self._check_open()
        try:
            return await call_with_reconnect(lambda: fn(self._redis), self._outage,
                                             within_s=RETRY_WITHIN_S if retry else 0.0)
        except self._errors as exc:
            raise QueueUnavailable(f"Redis {self._what} on {redact_url(self.url)}: {exc}") from exc
