"""Relaying a streamed answer from the worker that calls the provider to the gateway that holds
the client's connection: chunks go into a per-job channel as they arrive, and a subscriber reads
them from the first one, whenever it attaches.

`MemoryRelay` serves one process (the embedded `tidegate up`); `RedisRelay` serves gateways and
workers in separate processes, with a capped Redis Stream per job that expires after the answer.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Protocol
from urllib.parse import parse_qsl, urlsplit

from tidegate._redis import (
    BLOCK_MAX_S,
    Outage,
    call_with_reconnect,
    connection_options,
    honouring_cancellation,
    is_connection_error,
)
from tidegate.errors import MissingDependency, QueueUnavailable

CHANNEL_TTL_S = 300  # how long a finished stream stays readable for a late subscriber
MAX_CHUNKS = 100_000  # cap per stream, so a runaway answer cannot fill memory
END = b""  # what publish(job, END) stores: the end of the stream


class ChunkRelay(Protocol):
    """A per-job channel of SSE data payloads (each a JSON document as bytes)."""

    async def publish(self, job_id: str, chunk: bytes) -> None:
        """Append one chunk to the job's channel."""
        ...

    async def finish(self, job_id: str) -> None:
        """Mark the end of the job's stream (after its last chunk or an error chunk)."""
        ...

    def subscribe(self, job_id: str, *, timeout_s: float) -> AsyncIterator[bytes]:
        """Every chunk of the job from the first, as they arrive, until finish(); raises
        TimeoutError when no chunk arrives for `timeout_s`."""
        ...

    async def close(self) -> None:
        """Release connections."""
        ...


@dataclass
class _Channel:
    chunks: list[bytes] = field(default_factory=list)
    done: bool = False
    finished_at: float = 0.0
    changed: asyncio.Event = field(default_factory=asyncio.Event)


class MemoryRelay:
    """The relay for one process."""

    def __init__(self) -> None:
        self._channels: dict[str, _Channel] = {}

    def _channel(self, job_id: str) -> _Channel:
        self._forget_old()
        return self._channels.setdefault(job_id, _Channel())

    def _forget_old(self) -> None:
        cutoff = time.monotonic() - CHANNEL_TTL_S
        for job_id in [j for j, c in self._channels.items() if c.done and c.finished_at < cutoff]:
            del self._channels[job_id]

    async def publish(self, job_id: str, chunk: bytes) -> None:
        channel = self._channel(job_id)
        if len(channel.chunks) < MAX_CHUNKS:
            channel.chunks.append(chunk)
        channel.changed.set()

    async def finish(self, job_id: str) -> None:
        channel = self._channel(job_id)
        channel.done, channel.finished_at = True, time.monotonic()
        channel.changed.set()

    async def subscribe(self, job_id: str, *, timeout_s: float) -> AsyncIterator[bytes]:
        channel = self._channel(job_id)
        sent = 0
        while True:
            while sent < len(channel.chunks):
                yield channel.chunks[sent]
                sent += 1
            if channel.done:
                return
            channel.changed.clear()
            await asyncio.wait_for(channel.changed.wait(), timeout_s)

    async def close(self) -> None:
        self._channels.clear()


class RedisRelay:
    """The relay across processes: one Redis Stream per job, `tidegate:{name}:chunks:<job id>`.

    A subscriber lives through a lost connection (a Redis restart): it reconnects with backoff
    and reads on from the last chunk it had, for as long as its quiet timeout allows. Appends are
    not sent twice (a chunk shown twice would corrupt the answer): they fail at once."""

    def __init__(self, url: str, name: str = "default") -> None:
        try:
            import redis.asyncio as aioredis
            from redis.exceptions import RedisError
        except ImportError as exc:  # pragma: no cover - only without the extra
            raise MissingDependency(
                "streaming over Redis needs redis-py: pip install 'tidegate[redis]'"
            ) from exc
        self._errors: type[Exception] = RedisError
        # retry=None: the driver's own retries would append a chunk twice, and would sleep up to
        # seconds inside a read whose deadline is ours to keep.
        self._redis: Any = aioredis.Redis.from_url(url, retry=None, **connection_options())
        self._prefix = f"tidegate:{{{name}}}:chunks:"
        self._outage = Outage("relay", url)

    async def publish(self, job_id: str, chunk: bytes) -> None:
        await self._append(job_id, chunk)

    async def finish(self, job_id: str) -> None:
        await self._append(job_id, END)

    async def _append(self, job_id: str, chunk: bytes) -> None:
        key = self._prefix + job_id

        async def send() -> None:
            async with self._redis.pipeline(transaction=False) as pipe:
                pipe.xadd(key, {"d": chunk}, maxlen=MAX_CHUNKS, approximate=True)
                pipe.expire(key, CHANNEL_TTL_S)
                await pipe.execute()

        try:
            # Sent once (within_s=0): a chunk sent twice would repeat in the answer.
            await call_with_reconnect(send, self._outage, within_s=0.0)
        except self._errors as exc:
            raise QueueUnavailable(f"stream relay: {exc}") from exc

    async def subscribe(self, job_id: str, *, timeout_s: float) -> AsyncIterator[bytes]:
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
        while (remaining := quiet_until - time.monotonic()) > 0:
            try:
                block_ms = max(int(min(remaining, BLOCK_MAX_S) * 1000), 1)
                answer = await honouring_cancellation(
                    self._redis.xread({key: last}, count=500, block=block_ms))
            except self._errors as exc:
                if not is_connection_error(exc):
                    raise QueueUnavailable(f"stream relay: {exc}") from exc
                self._outage.lost(exc)
                delay = self._outage.delay_s()
                if time.monotonic() + delay >= quiet_until:
                    raise QueueUnavailable(f"stream relay: {exc}") from exc
                await asyncio.sleep(delay)
                continue
            self._outage.restored()
            if answer:
                entries: list[Any] = answer[0][1]
                return entries
        return None

    async def close(self) -> None:
        await self._redis.aclose()


def relay_for(queue_url: str) -> ChunkRelay:
    """Redis for a Redis queue (gateways and workers may be separate processes), named after the
    queue (`?name=`); memory otherwise (the embedded queue runs gateway and workers in one process)."""
    parts = urlsplit(queue_url)
    if parts.scheme in ("redis", "rediss", "unix"):
        name = dict(parse_qsl(parts.query)).get("name", "default")
        return RedisRelay(parts._replace(query="").geturl(), name)
    return MemoryRelay()
