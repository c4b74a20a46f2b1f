"""redis:// entity cache: every write is one Lua script (lua/*.lua, sharing lua/_common.lua).

The entries of one entity type live in a hash with two sorted-set indexes (live entries and
tombstones by expiry) and the type's truncate floor, all under the type's `{hash tag}` and passed
in KEYS, so each script runs in one Redis Cluster slot and `scan`/`count`/truncate never walk the
keyspace. A batch of changes is one script call per entity type; the script compares version keys
(fixed-width hex strings) change by change. Expiry uses the Redis server's clock (`TIME` in the
scripts, and a scan reads the clock of the node that holds the type on a Redis Cluster), so
processes with drifting clocks agree; expired entries read as absent and are pruned by later
writes to their type (at least as many as each write adds, so nothing piles up).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Sequence
from typing import Any, TypeVar

import orjson

from tidegate._formats import FormatCheck, RedisStore, StoreFormat
from tidegate._redis import RedisClient, driver_errors, lua_source, require_redis
from tidegate._urls import redact_url
from tidegate.errors import CacheUnavailable, ConfigError
from tidegate.sync.cache.base import (
    DEFAULT_TOMBSTONE_TTL_S,
    BaseEntityCache,
    Outcome,
    row_json,
)
from tidegate.sync.changes import Change, Op, Version
from tidegate.sync.contracts import ApplyOutcome, Entry
from tidegate.sync.values import Row

require_redis("the Redis entity cache")

__all__ = ["REDIS_FORMAT", "RedisEntityCache", "redis_store"]

# The cache's format, its entries and the change flow's positions (see tidegate._formats). Format
# 1 is 0.1.0's layout, now recorded.
REDIS_FORMAT = StoreFormat.initial("entity_cache")


def redis_store(prefix: str) -> RedisStore:
    """Where the entity cache under `prefix` keeps its format: the field "entity_cache" of the
    hash `<prefix>:sync:formats`, next to the positions (`<prefix>:sync:checkpoints`), which a
    cache the change flow wrote holds. (Entries' keys are spread over one hash tag per entity
    type, unknown until read: a cache of 0.1.0 holding entries but no positions is taken as new.
    Its format 1 is 0.1.0's, so that reads it right; a later migration must look further.)"""
    return RedisStore(REDIS_FORMAT, f"{prefix}:sync:formats", (f"{prefix}:sync:checkpoints",))


_SCRIPTS = ("apply", "read", "read_many", "load", "write", "repair", "count")
_OPS = {Op.INSERT: b"u", Op.UPDATE: b"u", Op.DELETE: b"d", Op.TRUNCATE: b"t"}
SCAN_PAGE = 500  # entries per ZSCAN/HMGET round trip of `scan`
T = TypeVar("T")


class RedisEntityCache(BaseEntityCache):
    """`cache_for("redis://host:6379/0")`; any number of processes may share one cache.

    Keys are `{<prefix>:<entity type>}:rows|live|dead|floor`; checkpoints live in the hash
    `<prefix>:sync:checkpoints`."""

    def __init__(
        self,
        url: str,
        *,
        prefix: str = "tidegate",
        entry_ttl_s: float | None = None,
        tombstone_ttl_s: float | None = DEFAULT_TOMBSTONE_TTL_S,
        max_connections: int = 64,
    ) -> None:
        super().__init__(entry_ttl_s=entry_ttl_s, tombstone_ttl_s=tombstone_ttl_s)
        if not prefix or "{" in prefix or "}" in prefix:
            raise ConfigError(f"an entity cache prefix must be non-empty and without braces, not {prefix!r}")
        self.url = url
        self.prefix = prefix
        self._max_connections = max_connections
        self._checkpoints_key = f"{prefix}:sync:checkpoints"
        self._format = FormatCheck(redis_store(prefix))
        self._ttl_args = [_ms(self.entry_ttl_s), _ms(self.tombstone_ttl_s)]
        self._type_keys: dict[str, list[str]] = {}
        self._client: RedisClient | None = None
        self._redis: Any = None
        self._scripts: dict[str, Any] = {}

    # ------------------------------------------------------------------ plumbing

    async def _open(self) -> None:
        client = RedisClient(
            self.url, what="the entity cache", unavailable=CacheUnavailable,
            max_connections=self._max_connections,
            scripts={name: lua_source("tidegate.sync.cache", name, common="_common") for name in _SCRIPTS})
        await client.ping()
        try:
            await self._format.ready(client)  # refuses a newer cache before anything reads it
        except BaseException:
            await client.aclose()
            raise
        self._client, self._redis, self._scripts = client, client.client, client.scripts

    async def _close(self) -> None:
        if self._redis is not None:
            await self._redis.aclose()

    def _keys(self, entity_type: str) -> list[str]:
        keys = self._type_keys.get(entity_type)
        if keys is None:
            # The tag always holds the prefix, so it is never empty whatever the type contains.
            tag = f"{{{self.prefix}:{entity_type}}}"
            keys = [f"{tag}:{name}" for name in ("rows", "live", "dead", "floor")]
            self._type_keys[entity_type] = keys
        return keys

    async def _guard(self, call: Awaitable[T]) -> T:
        """Await a Redis call, translating driver errors (the URL without credentials)."""
        try:
            return await call
        except driver_errors() as exc:
            raise CacheUnavailable(f"entity cache at {redact_url(self.url)}: {exc}") from exc

    async def _script(self, name: str, entity_type: str, *args: Any) -> Any:
        return await self._guard(self._scripts[name](keys=self._keys(entity_type), args=args))

    # ------------------------------------------------------------------ changes

    async def _apply(self, entity_type: str, changes: Sequence[Change]) -> list[Outcome]:
        args: list[Any] = [*self._ttl_args]
        for change in changes:
            args += [_OPS[change.op], change.entity_id, change.version.key, change.checksum,
                     row_json(change) or b""]
        flat = await self._script("apply", entity_type, *args)
        return [
            (ApplyOutcome.APPLIED if flat[i] == b"a" else ApplyOutcome.STALE, _row(flat[i + 1]))
            for i in range(0, len(flat), 2)
        ]

    # ------------------------------------------------------------------ reads and writes

    async def _read(self, entity_type: str, entity_id: str) -> tuple[Entry | None, Version | None]:
        blob, floor = await self._script("read", entity_type, entity_id)
        entry = _decode(entity_type, entity_id, blob)[0] if blob else None
        return entry, (Version.from_key(floor.decode()) if floor else None)

    async def _put_loaded(
        self, entity_type: str, entity_id: str, row: Row, row_checksum: str, floor: Version | None
    ) -> Row | None:
        status, held = await self._script(
            "load", entity_type, entity_id, "" if floor is None else floor.key,
            self._ttl_args[0], row_checksum, orjson.dumps(row),
        )
        return _row(held) if status == b"h" else row

    async def _write(
        self, entity_type: str, entity_id: str, row: Row, row_checksum: str, expected_revision: int
    ) -> tuple[bool, int]:
        written, revision = await self._script(
            "write", entity_type, entity_id, expected_revision, self._ttl_args[0], row_checksum,
            orjson.dumps(row),
        )
        return bool(written), int(revision)

    async def _read_many(self, entity_type: str, entity_ids: Sequence[str]) -> list[Entry | None]:
        if not entity_ids:
            return []
        blobs = await self._script("read_many", entity_type, *entity_ids)
        return [_decode(entity_type, entity_id, blob)[0] if blob else None
                for entity_id, blob in zip(entity_ids, blobs, strict=True)]

    async def _repair(self, entity_type: str, entity_id: str, row: bytes, row_checksum: str,
                      expected: Entry | None) -> bool:
        revision, version = (0, "") if expected is None else (expected.revision, expected.version.key)
        written = await self._script("repair", entity_type, entity_id, revision, version,
                                     *self._ttl_args, row_checksum, row)
        return bool(written)

    async def _scan(self, entity_type: str) -> AsyncIterator[Entry]:
        rows_key, live_key = self._keys(entity_type)[:2]
        now_ms = await self._now_ms(live_key)
        cursor = 0
        while True:
            cursor, members = await self._guard(self._redis.zscan(live_key, cursor, count=SCAN_PAGE))
            ids = [member for member, expires_ms in members if expires_ms > now_ms]
            blobs = await self._guard(self._redis.hmget(rows_key, ids)) if ids else []
            for raw_id, blob in zip(ids, blobs, strict=True):
                if not blob:
                    continue  # removed since the index was read
                entry, expires_ms = _decode(entity_type, raw_id.decode(), blob)
                if entry.data is not None and (expires_ms == 0 or expires_ms > now_ms):
                    yield entry
            if cursor == 0:
                return

    async def _scan_ids(self, entity_type: str) -> AsyncIterator[str]:
        # The live index alone: its scores are the entries' expiry times.
        live_key = self._keys(entity_type)[1]
        now_ms = await self._now_ms(live_key)
        cursor = 0
        while True:
            cursor, members = await self._guard(self._redis.zscan(live_key, cursor, count=SCAN_PAGE))
            for member, expires_ms in members:
                if expires_ms > now_ms:
                    yield member.decode()
            if cursor == 0:
                return

    async def _now_ms(self, key: str) -> int:
        """The clock the scripts that write `key` read: the node's that holds it."""
        assert self._client is not None
        return await self._guard(self._client.server_time_ms(key))

    async def _count(self, entity_type: str) -> int:
        return int(await self._script("count", entity_type))

    # ------------------------------------------------------------------ checkpoints

    async def _get_checkpoint(self, name: str) -> bytes | None:
        value: bytes | None = await self._guard(self._redis.hget(self._checkpoints_key, name))
        return value

    async def _put_checkpoint(self, name: str, value: bytes) -> None:
        await self._guard(self._redis.hset(self._checkpoints_key, name, value))


def _ms(ttl_s: float | None) -> int:
    """A TTL as the scripts take it: whole milliseconds, 0 for none (at least 1 ms when set)."""
    return 0 if ttl_s is None else max(1, round(ttl_s * 1000))


def _row(raw: bytes) -> Row | None:
    return orjson.loads(raw) if raw else None


def _decode(entity_type: str, entity_id: str, blob: bytes) -> tuple[Entry, int]:
    """An entry as lua/_common.lua stores it, and its expiry (ms, 0 for never)."""
    version, expires_ms, revision, checksum_length, rest = blob.split(b":", 4)
    length = int(checksum_length)
    entry = Entry(
        entity_type, entity_id, _row(rest[length:]), Version.from_key(version.decode()),
        int(revision), rest[:length].decode(),
    )
    return entry, int(expires_ms)
