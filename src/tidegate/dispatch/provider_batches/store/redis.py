"""The provider-batch store in Redis, every key with the queue's hash tag and a TTL of KEEP_S:
one string per batch (`tidegate:{name}:pbatch:<provider>/<id>`) and per job
(`tidegate:{name}:pbatch_job:<job id>`), each JSON, and per step of a batch's upkeep claimed
(`tidegate:{name}:pbatch_claim:<step>:<provider>/<id>`). A batch and its jobs are written in one
MULTI, so the keys sharing one Redis Cluster slot is what lets them go together. The open batches
are one sorted set (`tidegate:{name}:pbatch_open`, `<provider>/<id>` by the time recorded),
trimmed of those older than KEEP_S as it is read; every batch recorded is in another
(`tidegate:{name}:pbatch_recent`), trimmed as each batch is recorded, which `recent` pages through."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from tidegate._formats import FormatCheck, RedisStore, StoreFormat
from tidegate._redis import RedisClient, key_prefix, require_redis
from tidegate._urls import redact_url
from tidegate.dispatch.provider_batches.store.base import CLEAN_UP, KEEP_S, ProviderBatchStore
from tidegate.errors import QueueUnavailable

require_redis("the Redis provider-batch store")

__all__ = ["REDIS_FORMAT", "RedisProviderBatchStore", "redis_store"]

T = TypeVar("T")


# The provider batches' format (see tidegate._formats). Format 1 is 0.1.0's layout, now recorded.
REDIS_FORMAT = StoreFormat.initial("provider_batches")


def redis_store(name: str) -> RedisStore:
    """Where the provider-batch store called `name` keeps its format: the field
    "provider_batches" of the hash `tidegate:{name}:formats` (the queue's, when named after it).
    Its records expire within KEEP_S; the open and recent indexes exist while any is kept."""
    prefix = key_prefix(name)
    return RedisStore(REDIS_FORMAT, prefix + "formats", (prefix + "pbatch_open", prefix + "pbatch_recent"))


class RedisProviderBatchStore(ProviderBatchStore):
    """Provider batches in Redis, hash-tagged by the queue's name so they sit on one Redis
    Cluster slot with it. Connects on first use."""

    def __init__(self, url: str, name: str = "default") -> None:
        super().__init__(name)
        self.url = url
        prefix = key_prefix(name)
        self._batch_prefix = prefix + "pbatch:"
        self._job_prefix = prefix + "pbatch_job:"
        self._claim_prefix = prefix + "pbatch_claim:"
        self._open_key = prefix + "pbatch_open"
        self._recent_key = prefix + "pbatch_recent"
        self._format = FormatCheck(redis_store(name))
        self._redis: RedisClient | None = None

    def __repr__(self) -> str:
        return f"RedisProviderBatchStore(url={redact_url(self.url)!r}, name={self.name!r})"

    def batch_key(self, provider: str, batch_id: str) -> str:
        """The key of one batch's record."""
        return f"{self._batch_prefix}{provider}/{batch_id}"

    def job_key(self, job_id: str) -> str:
        """The key of one job's entry."""
        return self._job_prefix + job_id

    async def _open(self) -> None:
        self._redis = RedisClient(self.url, what="Redis provider-batch store", unavailable=QueueUnavailable,
                                  component="provider_batch_store")

    async def _close(self) -> None:
        assert self._redis is not None
        await self._redis.aclose()

    async def _call(self, fn: Callable[[Any], Awaitable[T]]) -> T:
        """`fn(client)`, sent again across a lost connection (every write here is harmless twice),
        driver errors translated."""
        redis = self._redis
        assert redis is not None
        await self._format.ready(redis)
        return await redis.run(lambda: fn(redis.client), retry=True)

    async def _record(self, provider: str, batch_id: str, batch: bytes,
                      jobs: list[tuple[str, bytes]]) -> None:
        async def write(r: Any) -> None:
            async with r.pipeline(transaction=True) as pipe:
                pipe.set(self.batch_key(provider, batch_id), batch, ex=KEEP_S)
                now = time.time()
                pipe.zadd(self._open_key, {f"{provider}/{batch_id}": now})
                pipe.zremrangebyscore(self._recent_key, "-inf", now - KEEP_S)
                pipe.zadd(self._recent_key, {f"{provider}/{batch_id}": now}, nx=True)
                for job_id, entry in jobs:
                    pipe.set(self.job_key(job_id), entry, ex=KEEP_S)
                await pipe.execute()

        await self._call(write)

    async def _put_jobs(self, jobs: list[tuple[str, bytes]]) -> None:
        async def write(r: Any) -> None:
            async with r.pipeline(transaction=True) as pipe:
                for job_id, entry in jobs:
                    pipe.set(self.job_key(job_id), entry, ex=KEEP_S)
                await pipe.execute()

        await self._call(write)

    async def _get_job(self, job_id: str) -> bytes | None:
        raw: bytes | None = await self._call(lambda r: r.get(self.job_key(job_id)))
        return raw

    async def _get_jobs(self, job_ids: list[str]) -> list[bytes | None]:
        keys = [self.job_key(job_id) for job_id in job_ids]
        raws: list[bytes | None] = await self._call(lambda r: r.mget(keys))
        return raws

    async def _get_batch(self, provider: str, batch_id: str) -> bytes | None:
        raw: bytes | None = await self._call(lambda r: r.get(self.batch_key(provider, batch_id)))
        return raw

    async def _open_batches(self, most: int) -> list[bytes]:
        async def read(r: Any) -> list[bytes]:
            await r.zremrangebyscore(self._open_key, "-inf", time.time() - KEEP_S)
            members: list[bytes] = await r.zrange(self._open_key, 0, most - 1)
            return await self._records(r, members)

        return await self._call(read)

    async def _recent(self, after: tuple[str, str] | None, count: int) -> list[bytes]:
        async def read(r: Any) -> list[bytes]:
            await r.zremrangebyscore(self._recent_key, "-inf", time.time() - KEEP_S)
            start = 0
            if after is not None:
                rank = await r.zrevrank(self._recent_key, "/".join(after))
                if rank is None:
                    return []
                start = rank + 1
            members: list[bytes] = await r.zrevrange(self._recent_key, start, start + count - 1)
            return await self._records(r, members)

        return await self._call(read)

    async def _records(self, r: Any, members: list[bytes]) -> list[bytes]:
        """The records of the batches `members` (`<provider>/<id>`) still kept, in their order."""
        if not members:
            return []
        keys = [self._batch_prefix + member.decode() for member in members]
        records: list[bytes | None] = await r.mget(keys)
        return [record for record in records if record is not None]

    async def _claim(self, provider: str, batch_id: str, step: str) -> bool:
        async def take(r: Any) -> bool:
            taken = bool(await r.set(f"{self._claim_prefix}{step}:{provider}/{batch_id}", b"1", nx=True,
                                     ex=KEEP_S))
            if step == CLEAN_UP:  # retired whoever took it: a worker killed in between leaves none open
                await r.zrem(self._open_key, f"{provider}/{batch_id}")
            return taken

        return await self._call(take)
