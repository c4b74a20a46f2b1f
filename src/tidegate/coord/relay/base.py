"""The relay's contract: a streamed answer goes from the worker that calls the provider to the
gateway that holds the client's connection. Chunks go into a per-job channel as they arrive, and
a subscriber reads them from the first one, whenever it attaches.

`ChunkRelay` checks the lifecycle once and calls the `_hooks` a backend implements:
`memory.MemoryRelay` serves one process (the embedded `tidegate up`); `redis.RedisRelay` serves
gateways and workers in separate processes, with a capped Redis Stream per job that expires after
the answer. `relay_for(queue_url)` picks one by the queue's URL.
"""

from __future__ import annotations

import abc
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator

from tidegate._redis import is_redis_url
from tidegate._urls import without_query
from tidegate.coord._store import OpensOnFirstUse, queue_name_of
from tidegate.errors import QueueUnavailable

__all__ = ["CHANNEL_TTL_S", "END", "MAX_CHUNKS", "ChunkRelay", "relay_for"]

CHANNEL_TTL_S = 300  # how long a finished stream stays readable for a late subscriber
MAX_CHUNKS = 100_000  # cap per stream, so a runaway answer cannot fill memory
END = b""  # what marks the end of a stream in its channel


class ChunkRelay(OpensOnFirstUse):
    """A per-job channel of SSE data payloads (each a JSON document as bytes). Opens on first
    use; a closed relay raises QueueUnavailable, as one that cannot reach its store does."""

    unavailable_error = QueueUnavailable
    what = "this stream relay"

    async def publish(self, job_id: str, chunk: bytes) -> None:
        """Append one chunk to the job's channel."""
        await self._ready()
        await self._publish(job_id, chunk)

    async def finish(self, job_id: str) -> None:
        """Mark the end of the job's stream (after its last chunk or an error chunk)."""
        await self._ready()
        await self._finish(job_id)

    async def subscribe(self, job_id: str, *, timeout_s: float) -> AsyncIterator[bytes]:
        """Every chunk of the job from the first, as they arrive, until finish(); raises
        TimeoutError when no chunk arrives for `timeout_s`."""
        await self._ready()
        # aclosing: a subscriber that stops early ends the backend's reader at once.
        async with contextlib.aclosing(self._subscribe(job_id, timeout_s)) as chunks:
            async for chunk in chunks:
                yield chunk

    # -- what each backend implements (the relay open)

    @abc.abstractmethod
    async def _publish(self, job_id: str, chunk: bytes) -> None:
        """Append one chunk, once (a chunk sent twice would repeat in the answer)."""

    @abc.abstractmethod
    async def _finish(self, job_id: str) -> None:
        """Append the end of the stream."""

    @abc.abstractmethod
    def _subscribe(self, job_id: str, timeout_s: float) -> AsyncGenerator[bytes, None]:
        """The job's chunks from the first until its end; TimeoutError after `timeout_s` without
        one."""


def relay_for(queue_url: str) -> ChunkRelay:
    """Redis for a Redis queue (gateways and workers may be separate processes), named after the
    queue (`?name=`); memory otherwise (the embedded queue runs gateway and workers in one process)."""
    if is_redis_url(queue_url):
        from tidegate.coord.relay.redis import RedisRelay

        return RedisRelay(without_query(queue_url), queue_name_of(queue_url))
    from tidegate.coord.relay.memory import MemoryRelay

    return MemoryRelay()
