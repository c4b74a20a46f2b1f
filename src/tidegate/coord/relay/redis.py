"""The relay across processes: one capped Redis Stream per job that expires after the answer."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator
from typing import Any

from tidegate._redis import (
    BLOCK_MAX_S,
    RedisClient,
    honouring_cancellation,
    is_connection_error,
    key_prefix,
    require_redis,
)
from tidegate.coord.relay.base import CHANNEL_TTL_S, END, MAX_CHUNKS, ChunkRelay
from tidegate.errors import QueueUnavailable

require_redis("streaming over Redis")

# Unversioned on purpose: a relay's streams hold the chunks of answers being streamed now and
# expire within CHANNEL_TTL_S; nothing in them outlives the request they serve.
__all__ = ["RedisRelay"]


class RedisRelay(ChunkRelay):
    """The relay across processes: one Redis Stream per job, `tidegate:{name}:chunks:<job id>`.
    Connects on first use.

    A subscriber lives through a lost connection (a Redis restart): it reconnects with backoff
    and reads on from the last chunk it had, for as long as its quiet timeout allows. Appends are
    not sent twice (a chunk shown twice would corrupt the answer): they fail at once."""

    def __init__(self, url: str, name: str = "default") -> None:
        super().__init__()
        self.url = url
        self._prefix = key_prefix(name) + "chunks:"
        self._redis: RedisClient | None = None

    async def _open(self) -> None:
        # Unbounded pool: a gateway holds one connection per streaming client it serves. No
        # retries of the driver's: they would append a chunk twice, and would sleep up to seconds
        # inside a read whose deadline is ours to keep.
        self._redis = RedisClient(self.url, what="stream relay", unavailable=QueueUnavailable,
                                  component="relay")

    async def _close(self) -> None:
        assert self._redis is not None
        await self._redis.aclose()

    async def _publish(self, job_id: str, chunk: bytes) -> None:
        await self._append(job_id, chunk)

    async def _finish(self, job_id: str) -> None:
        await self._append(job_id, END)

    async def _append(self, job_id: str, chunk: bytes) -> None:
        redis, key = self._client(), self._prefix + job_id

        async def send() -> None:
            async with redis.client.pipeline(transaction=False) as pipe:
                pipe.xadd(key, {"d": chunk}, maxlen=MAX_CHUNKS, approximate=True)
                pipe.expire(key, CHANNEL_TTL_S)
                await pipe.execute()

        # Sent once: a chunk sent twice would repeat in the answer.
        await redis.run(send, retry=False)

    async def _subscribe(self, job_id: str, timeout_s: float) -> AsyncGenerator[bytes, None]:
        key, last = self._prefix + job_id, "0-0"
        quiet_until = time.monotonic() + timeout_s
        while True:
            entries = await self._read(key, last, quiet_until)
            if entries is None:
                raise TimeoutError(f"no chunk of job {job_id} within {timeout_s}s")
            if entries:
                quiet_until = time.monotonic() + timeout_s
            for entry_id, fields in entries:
                last = entry_id
                chunk = fields[b"d"]
                if chunk == END:
                    return
                yield chunk

    async def _read(self, key: str, last: Any, quiet_until: float) -> list[Any] | None:
        """The entries after `last`, waiting for some until `quiet_until` (None once it passed).
        Reads in slices of at most BLOCK_MAX_S, and across a lost connection: a read from a
        known entry id can be sent again."""
        redis = self._client()
        while (remaining := quiet_until - time.monotonic()) > 0:
            try:
                block_ms = max(int(min(remaining, BLOCK_MAX_S) * 1000), 1)
                await redis.learn_slots()
                answer = await honouring_cancellation(
                    redis.client.xread({key: last}, count=500, block=block_ms))
            except Exception as exc:
                if not redis.is_driver_error(exc):
                    raise
                if not is_connection_error(exc):
                    raise redis.error(exc) from exc
                redis.outage.lost(exc)
                delay = redis.outage.delay_s()
                if time.monotonic() + delay >= quiet_until:
                    raise redis.error(exc) from exc
                await asyncio.sleep(delay)
                continue
            redis.outage.restored()
            if answer:
                entries: list[Any] = answer[0][1]
                return entries
        return None

    def _client(self) -> RedisClient:
        assert self._redis is not None
        return self._redis
