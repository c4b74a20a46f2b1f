"""The batch store in Redis, every key with the queue's hash tag: hashes `tidegate:{name}:files`
and `tidegate:{name}:batches` (id → JSON), and one string per file's bytes
(`tidegate:{name}:file:<id>`) and per batch's lines (`tidegate:{name}:batch_lines:<id>`). A
batch's compare-and-set is lua/swap.lua."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import orjson

from tidegate._redis import RedisClient, key_prefix, lua_source, require_redis
from tidegate._urls import redact_url
from tidegate.coord.batches.base import BatchStore
from tidegate.errors import QueueUnavailable

require_redis("the Redis batch store")

__all__ = ["RedisBatchStore"]

T = TypeVar("T")


class RedisBatchStore(BatchStore):
    """Files and batches in Redis, hash-tagged by the queue's name so they sit on one Redis
    Cluster slot with it. Connects on first use.

    Listing scans the hash of every tenant's files (or batches) and keeps the tenant's: a gateway
    holds few enough of them that an index per tenant would cost more than it spares."""

    def __init__(self, url: str, name: str = "default") -> None:
        super().__init__(name)
        self.url = url
        prefix = key_prefix(name)
        self.files_key = prefix + "files"
        self.batches_key = prefix + "batches"
        self._content_prefix = prefix + "file:"
        self._lines_prefix = prefix + "batch_lines:"
        self._redis: RedisClient | None = None

    def __repr__(self) -> str:
        return f"RedisBatchStore(url={redact_url(self.url)!r}, name={self.name!r})"

    async def _open(self) -> None:
        # Bytes replies: a file's content is returned as it was stored.
        self._redis = RedisClient(self.url, what="Redis batch store", unavailable=QueueUnavailable,
                                  decode_responses=False, component="batch_store",
                                  scripts={"swap": lua_source("tidegate.coord.batches", "swap")})

    async def _close(self) -> None:
        assert self._redis is not None
        await self._redis.aclose()

    async def _call(self, fn: Callable[[Any], Awaitable[T]], *, retry: bool = True) -> T:
        """`fn(client)`, sent again across a lost connection when `retry` (reads, and writes that
        are harmless twice), driver errors translated."""
        redis = self._redis
        assert redis is not None
        return await redis.run(lambda: fn(redis.client), retry=retry)

    async def _put_file(self, file_id: str, tenant: str, meta: str, content: bytes) -> None:
        async def write(r: Any) -> None:
            # The bytes first: a file listed is a file whose content can be read.
            async with r.pipeline(transaction=True) as pipe:
                pipe.set(self._content_prefix + file_id, content)
                pipe.hset(self.files_key, file_id, meta)
                await pipe.execute()

        await self._call(write)

    async def _get_file(self, file_id: str) -> bytes | None:
        raw: bytes | None = await self._call(lambda r: r.hget(self.files_key, file_id))
        return raw

    async def _file_content(self, file_id: str) -> bytes | None:
        raw: bytes | None = await self._call(lambda r: r.get(self._content_prefix + file_id))
        return raw

    async def _list_files(self, tenant: str) -> list[str | bytes]:
        values: list[bytes] = await self._call(lambda r: r.hvals(self.files_key))
        return [raw for raw in values if orjson.loads(raw).get("tenant") == tenant]

    async def _delete_file(self, file_id: str) -> bool:
        async def delete(r: Any) -> bool:
            async with r.pipeline(transaction=True) as pipe:
                pipe.hdel(self.files_key, file_id)
                pipe.delete(self._content_prefix + file_id)
                removed, _ = await pipe.execute()
            return bool(removed)

        return await self._call(delete)

    async def _insert_batch(self, batch_id: str, tenant: str, status: str, record: str) -> bool:
        added = await self._call(lambda r: r.hsetnx(self.batches_key, batch_id, record),
                                 retry=False)  # sent twice, it would find its own batch "taken"
        return bool(added)

    async def _get_batch(self, batch_id: str) -> bytes | None:
        raw: bytes | None = await self._call(lambda r: r.hget(self.batches_key, batch_id))
        return raw

    async def _list_batches(self, tenant: str | None) -> list[str | bytes]:
        values: list[bytes] = await self._call(lambda r: r.hvals(self.batches_key))
        return [raw for raw in values if tenant is None or orjson.loads(raw).get("tenant") == tenant]

    async def _swap_batch(self, batch_id: str, expected: str, status: str, record: str) -> bool:
        assert self._redis is not None
        swapped = await self._redis.script("swap", [self.batches_key], [batch_id, expected, record])
        return bool(swapped)

    async def _put_lines(self, batch_id: str, lines: bytes) -> None:
        await self._call(lambda r: r.set(self._lines_prefix + batch_id, lines))

    async def _get_lines(self, batch_id: str) -> bytes | None:
        raw: bytes | None = await self._call(lambda r: r.get(self._lines_prefix + batch_id))
        return raw
