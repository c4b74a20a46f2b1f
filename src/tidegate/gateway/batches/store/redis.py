"""The batch store in Redis, every key with the queue's hash tag:

- hashes `tidegate:{name}:files` and `tidegate:{name}:batches` (id → JSON), one string per
  file's bytes (`tidegate:{name}:file:<id>`) and per batch's lines
  (`tidegate:{name}:batch_lines:<id>`), one hash per batch's answers
  (`tidegate:{name}:batch_answers:<id>`, custom_id → answer);
- sorted sets that index them: per tenant by creation time (`files_of:<tenant>`,
  `files_of:<tenant>:<purpose>`, `batches_of:<tenant>`, and `batches_by_time` for an admin's
  listing of all), so a page costs its size whatever other tenants keep; files by expiry
  (`files_expiring`); batches still followed by when they were last checked (`batches_active`).

A batch's insert and compare-and-set (lua/insert.lua, lua/swap.lua) keep its indexes in the same
step; a file and its indexes are written and deleted in one MULTI. Records stored before the
indexes existed are indexed once, by the first process to read an index (`batch_indexes` marks
it done)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Final, TypeVar

import orjson

from tidegate._formats import FormatCheck, RedisStore, StoreFormat
from tidegate._redis import RedisClient, key_prefix, lua_source, require_redis
from tidegate._urls import redact_url
from tidegate.errors import QueueUnavailable
from tidegate.gateway.batches.store.base import ACTIVE, BatchStore
from tidegate.gateway.batches.store.models import BatchRecord, StoredFile

require_redis("the Redis batch store")

__all__ = ["REDIS_FORMAT", "RedisBatchStore", "redis_store"]

T = TypeVar("T")

_SCRIPTS = ("swap", "insert", "page", "answer")
REINDEX_CHUNK: Final = 500  # records read (HSCAN) and indexed per round trip


# The files' and batches' format (see tidegate._formats). Format 1 is 0.1.0's layout, now recorded.
REDIS_FORMAT = StoreFormat.initial("batches")


def redis_store(name: str) -> RedisStore:
    """Where the batch store called `name` keeps its format: the field "batches" of the hash
    `tidegate:{name}:formats` (the queue's, when named after it)."""
    prefix = key_prefix(name)
    return RedisStore(REDIS_FORMAT, prefix + "formats", (prefix + "files", prefix + "batches"))


class RedisBatchStore(BatchStore):
    """Files and batches in Redis, hash-tagged by the queue's name so they sit on one Redis
    Cluster slot with it. Connects on first use."""

    def __init__(self, url: str, name: str = "default") -> None:
        super().__init__(name)
        self.url = url
        self.prefix = prefix = key_prefix(name)
        self.files_key = prefix + "files"
        self.batches_key = prefix + "batches"
        self.expiring_key = prefix + "files_expiring"
        self.active_key = prefix + "batches_active"
        self.by_time_key = prefix + "batches_by_time"
        self.indexed_key = prefix + "batch_indexes"
        self._format = FormatCheck(redis_store(name))
        self._content_prefix = prefix + "file:"
        self._lines_prefix = prefix + "batch_lines:"
        self._answers_prefix = prefix + "batch_answers:"
        self._redis: RedisClient | None = None
        self._indexed = False

    def __repr__(self) -> str:
        return f"RedisBatchStore(url={redact_url(self.url)!r}, name={self.name!r})"

    def files_of(self, tenant: str, purpose: str | None = None) -> str:
        """The index of the tenant's files (of one purpose when given); tenant names hold no ':'."""
        return f"{self.prefix}files_of:{tenant}" + ("" if purpose is None else f":{purpose}")

    def batches_of(self, tenant: str) -> str:
        """The index of the tenant's batches."""
        return f"{self.prefix}batches_of:{tenant}"

    async def _open(self) -> None:
        # Bytes replies: a file's content is returned as it was stored.
        self._redis = RedisClient(self.url, what="Redis batch store", unavailable=QueueUnavailable,
                                  decode_responses=False, component="batch_store",
                                  scripts={name: lua_source("tidegate.gateway.batches.store", name)
                                           for name in _SCRIPTS})

    async def _close(self) -> None:
        assert self._redis is not None
        await self._redis.aclose()

    async def _call(self, fn: Callable[[Any], Awaitable[T]], *, retry: bool = True) -> T:
        """`fn(client)`, sent again across a lost connection when `retry` (reads, and writes that
        are harmless twice), driver errors translated."""
        redis = self._redis
        assert redis is not None
        await self._format.ready(redis)
        return await redis.run(lambda: fn(redis.client), retry=retry)

    async def _script(self, name: str, keys: list[str], args: list[Any], *, retry: bool) -> Any:
        assert self._redis is not None
        await self._format.ready(self._redis)
        return await self._redis.script(name, keys, args, retry=retry)

    async def _indexes(self) -> None:
        """Index the files and batches an older version stored without indexes, once: the
        marker key says it was done, so each process asks once. Harmless twice (ZADD NX)."""
        if self._indexed:
            return
        if await self._call(lambda r: r.get(self.indexed_key)) is None:
            await self._reindex(self.files_key, self._file_entries)
            await self._reindex(self.batches_key, self._batch_entries)
            await self._call(lambda r: r.set(self.indexed_key, b"1"))
        self._indexed = True

    async def _reindex(self, hash_key: str, entries: Callable[[bytes], list[tuple[str, str, float]]]) -> None:
        """ZADD NX every (index, id, score) `entries` makes of each record of `hash_key`."""
        cursor = 0
        while True:
            cursor, records = await self._scan(hash_key, cursor)
            await self._zadd_nx([entry for raw in records.values() for entry in entries(raw)])
            if cursor == 0:
                return

    async def _scan(self, hash_key: str, cursor: int) -> tuple[int, dict[bytes, bytes]]:
        scanned: tuple[int, dict[bytes, bytes]] = await self._call(
            lambda r: r.hscan(hash_key, cursor, count=REINDEX_CHUNK))
        return scanned

    async def _zadd_nx(self, entries: list[tuple[str, str, float]]) -> None:
        async def add(r: Any) -> None:
            async with r.pipeline(transaction=False) as pipe:
                for key, member, score in entries:
                    pipe.zadd(key, {member: score}, nx=True)
                await pipe.execute()

        if entries:
            await self._call(add)

    def _file_entries(self, raw: bytes) -> list[tuple[str, str, float]]:
        file = StoredFile.model_validate_json(raw)
        entries: list[tuple[str, str, float]] = [
            (self.files_of(file.tenant), file.id, file.created_at),
            (self.files_of(file.tenant, file.purpose), file.id, file.created_at)]
        if file.expires_at is not None:
            entries.append((self.expiring_key, file.id, file.expires_at))
        return entries

    def _batch_entries(self, raw: bytes) -> list[tuple[str, str, float]]:
        batch = BatchRecord.model_validate_json(raw)
        entries: list[tuple[str, str, float]] = [
            (self.batches_of(batch.tenant), batch.id, batch.created_at),
            (self.by_time_key, batch.id, batch.created_at)]
        if batch.status in ACTIVE:
            entries.append((self.active_key, batch.id, batch.checked_ms))
        return entries

    async def _put_file(self, file: StoredFile, meta: str, content: bytes) -> None:
        async def write(r: Any) -> None:
            # The bytes first: a file listed is a file whose content can be read.
            async with r.pipeline(transaction=True) as pipe:
                pipe.set(self._content_prefix + file.id, content)
                pipe.hset(self.files_key, file.id, meta)
                pipe.zadd(self.files_of(file.tenant), {file.id: file.created_at})
                pipe.zadd(self.files_of(file.tenant, file.purpose), {file.id: file.created_at})
                if file.expires_at is None:
                    pipe.zrem(self.expiring_key, file.id)
                else:
                    pipe.zadd(self.expiring_key, {file.id: file.expires_at})
                await pipe.execute()

        await self._call(write)

    async def _get_file(self, file_id: str) -> bytes | None:
        raw: bytes | None = await self._call(lambda r: r.hget(self.files_key, file_id))
        return raw

    async def _file_content(self, file_id: str) -> bytes | None:
        raw: bytes | None = await self._call(lambda r: r.get(self._content_prefix + file_id))
        return raw

    async def _page_files(self, tenant: str, purpose: str | None, after: str | None,
                          count: int) -> list[str | bytes]:
        await self._indexes()
        records: list[str | bytes] = await self._script(
            "page", [self.files_of(tenant, purpose), self.files_key], [after or "", count], retry=True)
        return records

    async def _delete_file(self, file_id: str) -> bool:
        raw = await self._get_file(file_id)
        if raw is None:
            return False
        file = StoredFile.model_validate_json(raw)

        async def delete(r: Any) -> bool:
            async with r.pipeline(transaction=True) as pipe:
                pipe.hdel(self.files_key, file_id)
                pipe.delete(self._content_prefix + file_id)
                pipe.zrem(self.files_of(file.tenant), file_id)
                pipe.zrem(self.files_of(file.tenant, file.purpose), file_id)
                pipe.zrem(self.expiring_key, file_id)
                removed, *_ = await pipe.execute()
            return bool(removed)

        return await self._call(delete)

    async def _expired_files(self, now_s: int, count: int) -> list[str | bytes]:
        await self._indexes()
        ids: list[bytes] = await self._call(
            lambda r: r.zrangebyscore(self.expiring_key, "-inf", now_s, start=0, num=count))
        if not ids:
            return []
        raws: list[bytes | None] = await self._call(lambda r: r.hmget(self.files_key, ids))
        await self._unindex(self.expiring_key, [file_id for file_id, raw in zip(ids, raws, strict=True)
                                                if raw is None])
        return [raw for raw in raws if raw is not None]

    async def _unindex(self, index_key: str, ids: list[bytes]) -> None:
        """Drop index entries whose record is gone or has moved on (left by a reindex that raced
        a delete or a batch's end), so none holds a place in the sweep's rounds."""
        if ids:
            await self._call(lambda r: r.zrem(index_key, *ids))

    async def _insert_batch(self, batch: BatchRecord, record: str) -> bool:
        # Not sent twice: it would find its own batch "taken".
        keys = [self.batches_key, self.batches_of(batch.tenant), self.by_time_key]
        added = await self._script("insert", keys, [batch.id, record, batch.created_at], retry=False)
        return bool(added)

    async def _get_batch(self, batch_id: str) -> bytes | None:
        raw: bytes | None = await self._call(lambda r: r.hget(self.batches_key, batch_id))
        return raw

    async def _page_batches(self, tenant: str | None, after: str | None, count: int) -> list[str | bytes]:
        await self._indexes()
        index = self.by_time_key if tenant is None else self.batches_of(tenant)
        records: list[str | bytes] = await self._script(
            "page", [index, self.batches_key], [after or "", count], retry=True)
        return records

    async def _active_batches(self, count: int | None) -> list[str | bytes]:
        await self._indexes()
        ids: list[bytes] = await self._call(
            lambda r: r.zrange(self.active_key, 0, -1 if count is None else count - 1))
        if not ids:
            return []
        raws: list[bytes | None] = await self._call(lambda r: r.hmget(self.batches_key, ids))
        followed = [raw is not None and orjson.loads(raw).get("status") in ACTIVE for raw in raws]
        await self._unindex(self.active_key, [batch_id for batch_id, kept in zip(ids, followed, strict=True)
                                              if not kept])
        return [raw for raw, kept in zip(raws, followed, strict=True) if raw is not None and kept]

    async def _swap_batch(self, batch: BatchRecord, expected: str, record: str) -> bool:
        followed = str(batch.checked_ms) if batch.status in ACTIVE else ""
        swapped = await self._script("swap", [self.batches_key, self.active_key],
                                     [batch.id, expected, record, followed], retry=False)
        return bool(swapped)

    async def _put_lines(self, batch_id: str, lines: bytes) -> None:
        await self._call(lambda r: r.set(self._lines_prefix + batch_id, lines))

    async def _get_lines(self, batch_id: str) -> bytes | None:
        raw: bytes | None = await self._call(lambda r: r.get(self._lines_prefix + batch_id))
        return raw

    async def _put_answers(self, batch_id: str, answers: dict[str, bytes]) -> None:
        args = [item for pair in answers.items() for item in pair]
        await self._script("answer", [self._answers_prefix + batch_id], args, retry=True)

    async def _get_answers(self, batch_id: str) -> dict[str, bytes]:
        raw: dict[bytes, bytes] = await self._call(lambda r: r.hgetall(self._answers_prefix + batch_id))
        return {custom_id.decode(): answer for custom_id, answer in raw.items()}

    async def _drop_answers(self, batch_id: str) -> None:
        await self._call(lambda r: r.delete(self._answers_prefix + batch_id))
