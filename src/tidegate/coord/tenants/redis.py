"""The tenant store in Redis: two hashes with the queue's hash tag, `tidegate:{name}:tenants`
(name → Tenant JSON) and `tidegate:{name}:keys` (key id → tenant, SHA-256 hex digest of the
secret, created and revoked times, as JSON)."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from datetime import datetime
from typing import Any, TypeVar

import orjson

from tidegate._formats import FormatCheck, Migration, RedisStore, StoreFormat
from tidegate._redis import RedisClient, key_prefix, require_redis
from tidegate._urls import redact_url
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

require_redis("the Redis tenant store")

__all__ = ["REDIS_FORMAT", "RedisTenantStore", "redis_store"]

T = TypeVar("T")


# The tenants' and keys' format (see tidegate._formats). Format 1 is 0.1.0's layout, now recorded.
# Format 2 keeps a key's own limits in its JSON: code before it would read such a key and ignore
# them, so it refuses the store instead.
REDIS_FORMAT = StoreFormat("tenants", 2, (
    *StoreFormat.initial("tenants").migrations,
    Migration(2, "API keys may carry limits of their own (a field of a key's JSON; nothing to convert)"),
))


def redis_store(name: str) -> RedisStore:
    """Where the tenant store called `name` keeps its format: the field "tenants" of the hash
    `tidegate:{name}:formats` (the queue's, when named after it)."""
    prefix = key_prefix(name)
    return RedisStore(REDIS_FORMAT, prefix + "formats", (prefix + "tenants", prefix + "keys"))


def _redis_record(key_id: str, raw: str | bytes) -> KeyRecord:
    data = orjson.loads(raw)
    revoked = data.get("revoked_at")
    limits = data.get("limits")
    return KeyRecord(key_id, data["tenant"], data["secret_sha256"],
                     datetime.fromisoformat(data["created_at"]),
                     datetime.fromisoformat(revoked) if revoked else None,
                     KeyLimits.model_validate(limits) if limits else NO_KEY_LIMITS)


def _redis_value(record: KeyRecord) -> bytes:
    value: dict[str, Any] = {
        "tenant": record.tenant,
        "secret_sha256": record.secret_sha256,
        "created_at": timestamp(record.created_at),
        "revoked_at": timestamp(record.revoked_at) if record.revoked_at else None,
    }
    if record.limits != NO_KEY_LIMITS:
        value["limits"] = record.limits.model_dump(mode="json", exclude_none=True)
    return orjson.dumps(value)


class RedisTenantStore(TenantStore):
    """Tenants and keys in two Redis hashes, `tidegate:{name}:tenants` and `tidegate:{name}:keys`,
    hash-tagged by the queue's name so they sit on one Redis Cluster slot. Connects on first use.

    A check costs two reads (the key, then its tenant); the authentication cache spares them for
    keys seen within `auth_cache_s`."""

    def __init__(self, url: str, name: str = "default", *,
                 auth_cache_s: float = DEFAULT_AUTH_CACHE_S, clock: Clock = time.monotonic) -> None:
        super().__init__(name, auth_cache_s, clock)
        self.url = url
        self.tenants_key = key_prefix(name) + "tenants"
        self.keys_key = key_prefix(name) + "keys"
        self._format = FormatCheck(redis_store(name))
        self._redis: RedisClient | None = None

    def __repr__(self) -> str:
        return f"RedisTenantStore(url={redact_url(self.url)!r}, name={self.name!r})"

    async def _open(self) -> None:
        # Unbounded pool, text replies. No retries of the driver's: `_call` retries a lost
        # connection on its own bounded schedule, and only calls harmless to send twice.
        self._redis = RedisClient(self.url, what="Redis tenant store", unavailable=QueueUnavailable,
                                  decode_responses=True, component="tenant_store")

    async def _put_tenant(self, tenant: Tenant) -> None:
        await self._call(lambda r: r.hset(self.tenants_key, tenant.name, tenant.model_dump_json()))

    async def _get_tenant(self, name: str) -> Tenant | None:
        raw = await self._call(lambda r: r.hget(self.tenants_key, name))
        return None if raw is None else Tenant.model_validate_json(raw)

    async def _list_tenants(self) -> list[Tenant]:
        values = await self._call(lambda r: r.hvals(self.tenants_key))
        return [Tenant.model_validate_json(raw) for raw in values]

    async def _insert_key(self, record: KeyRecord) -> bool:
        from redis.exceptions import WatchError

        async def attempt(r: Any) -> bool | None:
            # WATCH the tenants: a tenant deleted between the check and the insert (its keys all
            # revoked) makes this try again, and then refuse, so no key outlives its tenant.
            async with r.pipeline(transaction=True) as pipe:
                await pipe.watch(self.tenants_key)
                if not await pipe.hexists(self.tenants_key, record.tenant):
                    raise unknown_tenant(record.tenant)
                pipe.multi()
                pipe.hsetnx(self.keys_key, record.key_id, _redis_value(record))
                try:
                    [added] = await pipe.execute()
                except WatchError:
                    return None
                return bool(added)

        while True:
            # Not retried on a lost connection: sent twice, it would find its own key "taken".
            outcome = await self._call(attempt, retry=False)
            if outcome is not None:
                return outcome

    async def _lookup(self, key_id: str) -> tuple[KeyRecord, Tenant | None] | None:
        raw = await self._call(lambda r: r.hget(self.keys_key, key_id))
        if raw is None:
            return None
        record = _redis_record(key_id, raw)
        tenant_raw = await self._call(lambda r: r.hget(self.tenants_key, record.tenant))
        return record, (None if tenant_raw is None else Tenant.model_validate_json(tenant_raw))

    async def _change_limits(self, key_id: str, change: LimitsChange) -> KeyRecord | None:
        from redis.exceptions import WatchError

        async def attempt(r: Any) -> tuple[bool, KeyRecord | None]:
            # (done, the key as stored). WATCH makes read-check-write one step, as in _revoke.
            async with r.pipeline(transaction=True) as pipe:
                await pipe.watch(self.keys_key)
                raw = await pipe.hget(self.keys_key, key_id)
                record = None if raw is None else _redis_record(key_id, raw)
                if record is None or record.revoked_at is not None:
                    return True, None
                changed = replace(record, limits=change(record.limits))
                pipe.multi()
                pipe.hset(self.keys_key, key_id, _redis_value(changed))
                try:
                    await pipe.execute()
                except WatchError:
                    return False, None  # the hash changed under us: read again
                return True, changed

        while True:
            done, stored = await self._call(attempt)
            if done:
                return stored

    async def _revoke(self, key_id: str, when: datetime) -> bool:
        from redis.exceptions import WatchError

        async def attempt(r: Any) -> bool | None:
            # WATCH makes read-check-write one step: of two concurrent revocations one wins.
            async with r.pipeline(transaction=True) as pipe:
                await pipe.watch(self.keys_key)
                raw = await pipe.hget(self.keys_key, key_id)
                record = None if raw is None else _redis_record(key_id, raw)
                if record is None or record.revoked_at is not None:
                    return False
                pipe.multi()
                pipe.hset(self.keys_key, key_id, _redis_value(replace(record, revoked_at=when)))
                try:
                    await pipe.execute()
                except WatchError:
                    return None  # the hash changed under us: read again
                return True

        while True:
            outcome = await self._call(attempt)
            if outcome is not None:
                return outcome

    async def _delete_tenant(self, name: str, when: datetime) -> list[str] | None:
        from redis.exceptions import WatchError

        async def attempt(r: Any) -> tuple[bool, list[str] | None]:
            # (done, revoked ids). Both hashes watched: a key added or revoked meanwhile makes
            # this read again.
            async with r.pipeline(transaction=True) as pipe:
                await pipe.watch(self.tenants_key, self.keys_key)
                if not await pipe.hexists(self.tenants_key, name):
                    return True, None
                entries: dict[str, str] = await pipe.hgetall(self.keys_key)
                records = [_redis_record(key_id, raw) for key_id, raw in entries.items()]
                live = [record for record in records if record.tenant == name and record.revoked_at is None]
                pipe.multi()
                pipe.hdel(self.tenants_key, name)
                for record in live:
                    pipe.hset(self.keys_key, record.key_id, _redis_value(replace(record, revoked_at=when)))
                try:
                    await pipe.execute()
                except WatchError:
                    return False, None
                return True, sorted(record.key_id for record in live)

        while True:
            # Not retried on a lost connection: sent twice, it would find its tenant gone.
            done, revoked = await self._call(attempt, retry=False)
            if done:
                return revoked

    async def _list_keys(self, tenant: str | None) -> list[KeyRecord]:
        entries: dict[str, str] = await self._call(lambda r: r.hgetall(self.keys_key))
        records = [_redis_record(key_id, raw) for key_id, raw in entries.items()]
        return [record for record in records if tenant is None or record.tenant == tenant]

    async def _close(self) -> None:
        assert self._redis is not None
        await self._redis.aclose()

    async def _call(self, fn: Callable[[Any], Awaitable[T]], *, retry: bool = True) -> T:
        """`fn(client)`, sent again across a lost connection (a Redis restart) for a short while
        when `retry` (reads, and writes that are harmless twice), driver errors translated."""
        redis = self._redis
        assert redis is not None
        await self._format.ready(redis)
        return await redis.run(lambda: fn(redis.client), retry=retry)
