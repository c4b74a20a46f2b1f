"""The tenant store's contract: tenants and their API keys, kept in the queue's own backend, so
every gateway replica and every `tidegate keys …` command sees the same ones.

`TenantStore` holds every rule the backends share (key format, hashing, constant-time checks,
the authentication cache, the lifecycle) around a few storage `_hooks` that
`sqlite.SqliteTenantStore` and `redis.RedisTenantStore` implement; `tenant_store_for(queue_url)`
picks one by the queue's URL.

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

import abc
import hashlib
import hmac
import logging
import re
import secrets
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from tidegate._urls import without_query
from tidegate.coord._store import OpensOnFirstUse, backend_of, queue_name_of, sqlite_path_of
from tidegate.coord.tenants.models import NO_KEY_LIMITS, ApiKeyInfo, KeyLimits, Tenant
from tidegate.errors import (
    ConfigError,
    Conflict,
    InvalidInput,
    QueueClosed,
    QueueUnavailable,
    TenantNotFound,
)

__all__ = [
    "DEFAULT_AUTH_CACHE_S",
    "Caller",
    "Clock",
    "KeyRecord",
    "LimitsChange",
    "TenantStore",
    "parse_api_key",
    "tenant_store_for",
    "timestamp",
    "unknown_tenant",
]

log = logging.getLogger("tidegate.tenants")

Clock = Callable[[], float]  # monotonic seconds; injectable so tests can move time
LimitsChange = Callable[[KeyLimits], KeyLimits]  # a key's new limits from its current ones

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


def timestamp(moment: datetime) -> str:
    """`moment` as stored: UTC ISO 8601 with microseconds."""
    # A fixed format (always with microseconds, always UTC) so that text order is time order.
    return moment.astimezone(UTC).isoformat(timespec="microseconds")


def _check_name(name: str) -> str:
    if not _NAME_RE.fullmatch(name):
        raise ConfigError(f"invalid tenant store name {name!r}: use 1-64 of A-Z a-z 0-9 _ . -")
    return name


@dataclass(frozen=True, slots=True)
class KeyRecord:
    """A stored key: what authenticate checks and list_keys shows; never the secret itself."""

    key_id: str
    tenant: str
    secret_sha256: str
    created_at: datetime
    revoked_at: datetime | None = None
    limits: KeyLimits = NO_KEY_LIMITS

    def info(self) -> ApiKeyInfo:
        """How the key is listed."""
        return ApiKeyInfo(key_id=self.key_id, tenant=self.tenant, created_at=self.created_at,
                          revoked_at=self.revoked_at, limits=self.limits)


@dataclass(frozen=True, slots=True)
class Caller:
    """Who a valid key says is calling: its tenant, as stored, the key's id and the key's own
    limits (`limits.narrow(tenant)` is what the caller may do)."""

    tenant: Tenant
    key_id: str
    limits: KeyLimits = NO_KEY_LIMITS


@dataclass(frozen=True, slots=True)
class _Cached:
    secret_sha256: str
    caller: Caller
    expires_at: float  # on the store's clock


def _newest_first(records: list[KeyRecord]) -> list[ApiKeyInfo]:
    records.sort(key=lambda record: (record.created_at, record.key_id), reverse=True)
    return [record.info() for record in records]


class TenantStore(OpensOnFirstUse):
    """Tenants and hashed keys, kept in the queue's backend so every gateway replica shares them:
    the rules every backend shares — key format, hashing, constant-time checks, the
    authentication cache — around a few storage hooks. Opens on first use; a closed store
    raises QueueClosed."""

    unavailable_error = QueueClosed
    what = "this tenant store"

    def __init__(self, name: str, auth_cache_s: float, clock: Clock) -> None:
        super().__init__()
        if auth_cache_s < 0:
            raise ValueError(f"auth_cache_s must be >= 0, got {auth_cache_s}")
        self.name = _check_name(name)
        self.auth_cache_s = auth_cache_s
        self._clock = clock
        self._cache: OrderedDict[str, _Cached] = OrderedDict()

    # -- the contract

    async def put_tenant(self, tenant: Tenant) -> None:
        """Create or replace a tenant."""
        await self._ready()
        await self._put_tenant(tenant)
        self._cache.clear()  # its keys must not answer with the old limits from this store

    async def get_tenant(self, name: str) -> Tenant | None:
        """The tenant, or None."""
        await self._ready()
        return await self._get_tenant(name)

    async def list_tenants(self) -> list[Tenant]:
        """Every tenant, by name."""
        await self._ready()
        return sorted(await self._list_tenants(), key=lambda tenant: tenant.name)

    async def create_key(self, tenant: str, limits: KeyLimits = NO_KEY_LIMITS) -> tuple[ApiKeyInfo, str]:
        """A new key for an existing tenant, with its own `limits` inside the tenant's: its
        listing and the full key, shown only now. Raises TenantNotFound for an unknown tenant."""
        await self._ready()
        for _ in range(_ID_ATTEMPTS):
            key_id, secret = _new_key()
            record = KeyRecord(key_id, tenant, _digest(secret), _now(), limits=limits)
            if await self._insert_key(record):
                log.info("created API key %s for tenant %s", key_id, tenant)
                return record.info(), f"{KEY_PREFIX}{key_id}_{secret}"
        raise QueueUnavailable(f"tenant store: no free key id after {_ID_ATTEMPTS} attempts")

    async def add_key(self, tenant: str, api_key: str) -> ApiKeyInfo:
        """Store a key made elsewhere (an operator's TIDEGATE_ADMIN_KEY) for an existing tenant,
        as create_key stores its own: only the digest of its secret. Adding a key that tenant
        already has changes nothing. InvalidInput for a malformed key, Conflict when its id
        names another key or it was revoked, TenantNotFound for an unknown tenant."""
        await self._ready()
        parsed = parse_api_key(api_key)
        if parsed is None:
            raise InvalidInput("not a tidegate API key: it reads tg_, 12 of 0-9 a-f, _, then 20 to 128 "
                               "of A-Z a-z 0-9 _ -")
        key_id, secret = parsed
        record = KeyRecord(key_id, tenant, _digest(secret), _now())
        if await self._insert_key(record):
            log.info("added API key %s for tenant %s", key_id, tenant)
            return record.info()
        found = await self._lookup(key_id)
        if found is None or found[0].tenant != tenant or not hmac.compare_digest(
                found[0].secret_sha256, record.secret_sha256):
            raise Conflict(f"key id {key_id} names another key: choose another key")
        if found[0].revoked_at is not None:
            raise Conflict(f"key {key_id} was revoked: choose another key")
        return found[0].info()

    async def change_key_limits(self, key_id: str, change: LimitsChange) -> ApiKeyInfo | None:
        """Set an unrevoked key's limits to `change(its limits)`, read and written in one atomic
        step; its listing, or None when there is no such unrevoked key. Takes effect at once
        through this store, and within `auth_cache_s` through the others."""
        await self._ready()
        self._cache.pop(key_id, None)
        record = await self._change_limits(key_id, change)
        if record is not None:
            log.info("changed the limits of API key %s", key_id)
        return None if record is None else record.info()

    async def authenticate(self, api_key: str) -> Tenant | None:
        """The tenant of a valid, unrevoked key of an existing tenant; None for anything else,
        never saying why. See the module docstring for the cache."""
        caller = await self.authenticate_key(api_key)
        return None if caller is None else caller.tenant

    async def authenticate_key(self, api_key: str) -> Caller | None:
        """As `authenticate`, with the key's id and its own limits (an expired key is still
        a valid one here: the caller may say why it is refused)."""
        await self._ready()
        parsed = parse_api_key(api_key)
        # Hash and compare on every path, so the work done does not depend on the secret.
        digest = _digest(parsed[1] if parsed else _DUMMY_SECRET)
        if parsed is None:
            hmac.compare_digest(digest, _DUMMY_DIGEST)
            return None
        key_id = parsed[0]
        cached = self._cached(key_id)
        if cached is not None:
            return cached.caller if hmac.compare_digest(digest, cached.secret_sha256) else None
        found = await self._lookup(key_id)
        if found is None:
            hmac.compare_digest(digest, _DUMMY_DIGEST)
            return None
        record, tenant = found
        if not hmac.compare_digest(digest, record.secret_sha256):
            return None
        if record.revoked_at is not None or tenant is None:
            return None
        caller = Caller(tenant, key_id, record.limits)
        self._remember(key_id, _Cached(record.secret_sha256, caller, self._clock() + self.auth_cache_s))
        return caller

    async def revoke_key(self, key_id: str) -> bool:
        """Revoke a key; False when there is no such unrevoked key."""
        await self._ready()
        self._cache.pop(key_id, None)
        revoked = await self._revoke(key_id, _now())
        if revoked:
            log.info("revoked API key %s", key_id)
        return revoked

    async def delete_tenant(self, name: str) -> list[str] | None:
        """Delete a tenant and revoke its keys, in one atomic step: the ids of the keys revoked,
        or None when there is no such tenant. Its keys stay revoked if the name is used again."""
        await self._ready()
        revoked = await self._delete_tenant(name, _now())
        self._cache.clear()  # none of its keys may answer from this store's memory
        if revoked is not None:
            log.info("deleted tenant %s and revoked %d key(s)", name, len(revoked))
        return revoked

    async def get_key(self, key_id: str) -> ApiKeyInfo | None:
        """A key's listing (revoked or not), or None for an unknown id."""
        await self._ready()
        found = await self._lookup(key_id)
        return None if found is None else found[0].info()

    async def list_keys(self, tenant: str | None = None) -> list[ApiKeyInfo]:
        """Keys (all, or one tenant's), newest first."""
        await self._ready()
        return _newest_first(await self._list_keys(tenant))

    async def _closing(self) -> None:
        # Nothing authenticated before the close may answer from this store's memory after it.
        self._cache.clear()
        await super()._closing()

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

    # -- storage hooks, implemented by each backend (the store open)

    @abc.abstractmethod
    async def _put_tenant(self, tenant: Tenant) -> None:
        """Create or replace the tenant."""

    @abc.abstractmethod
    async def _get_tenant(self, name: str) -> Tenant | None:
        """The tenant, or None."""

    @abc.abstractmethod
    async def _list_tenants(self) -> list[Tenant]:
        """Every tenant, in any order."""

    @abc.abstractmethod
    async def _insert_key(self, record: KeyRecord) -> bool:
        """Store a new key; False if its id is taken. TenantNotFound for an unknown tenant."""

    @abc.abstractmethod
    async def _lookup(self, key_id: str) -> tuple[KeyRecord, Tenant | None] | None:
        """The key and its tenant (None if the tenant is gone), or None for an unknown id."""

    @abc.abstractmethod
    async def _change_limits(self, key_id: str, change: LimitsChange) -> KeyRecord | None:
        """Apply `change` to an unrevoked key's limits atomically; the key as now stored, or None."""

    @abc.abstractmethod
    async def _revoke(self, key_id: str, when: datetime) -> bool:
        """Mark an unrevoked key revoked at `when`, in one atomic step; False if there is none."""

    @abc.abstractmethod
    async def _delete_tenant(self, name: str, when: datetime) -> list[str] | None:
        """Remove the tenant and mark its unrevoked keys revoked at `when`, atomically (no key
        of it inserted meanwhile survives); the ids revoked, or None for an unknown tenant."""

    @abc.abstractmethod
    async def _list_keys(self, tenant: str | None) -> list[KeyRecord]:
        """Every key (of `tenant` when given), in any order."""


def unknown_tenant(name: str) -> TenantNotFound:
    """The error for a key asked for a tenant that does not exist."""
    return TenantNotFound(f"no tenant named {name!r}: create it first (tidegate tenants put {name})")


def tenant_store_for(queue_url: str, *, auth_cache_s: float = DEFAULT_AUTH_CACHE_S) -> TenantStore:
    """The tenant store of a queue: the same SQLite file (its own tables) or the same Redis server
    (hashes under the queue's `?name=`, "default" when not given)."""
    name = queue_name_of(queue_url)
    if backend_of(queue_url) == "redis":
        from tidegate.coord.tenants.redis import RedisTenantStore

        return RedisTenantStore(without_query(queue_url), name, auth_cache_s=auth_cache_s)
    from tidegate.coord.tenants.sqlite import SqliteTenantStore

    return SqliteTenantStore(sqlite_path_of(queue_url), name, auth_cache_s=auth_cache_s)
