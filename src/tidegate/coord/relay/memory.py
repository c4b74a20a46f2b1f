"""The relay of one process: each job's chunks in a list, subscribers woken by an event."""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field

from tidegate.coord.relay.base import CHANNEL_TTL_S, MAX_CHUNKS, ChunkRelay

__all__ = ["MemoryRelay"]


@dataclass
class _Channel:
    chunks: list[bytes] = field(default_factory=list)
    done: bool = False
    finished_at: float = 0.0
    changed: asyncio.Event = field(default_factory=asyncio.Event)


class MemoryRelay(ChunkRelay):
    """The relay for one process (the embedded `tidegate up`). A finished channel is forgotten
    CHANNEL_TTL_S after its end; a channel keeps at most MAX_CHUNKS chunks."""

    def __init__(self) -> None:
        super().__init__()
        self._channels: dict[str, _Channel] = {}
        # Finished channels in the order they finished (the clock is monotonic), so forgetting
        # the old ones looks at those alone, never at every channel: a scan of every channel
        # on every chunk saturated `tidegate up` under steady streaming (bench.soak).
        self._finished: deque[tuple[float, str]] = deque()

    async def _open(self) -> None:
        pass  # nothing to connect to

    async def _close(self) -> None:
        self._channels.clear()
        self._finished.clear()

    def _channel(self, job_id: str) -> _Channel:
        self._forget_old()
        return self._channels.setdefault(job_id, _Channel())

    def _forget_old(self) -> None:
        cutoff = time.monotonic() - CHANNEL_TTL_S
        finished = self._finished
        while finished and finished[0][0] < cutoff:
            _, job_id = finished.popleft()
            channel = self._channels.get(job_id)
            if channel is not None and channel.done and channel.finished_at < cutoff:
                del self._channels[job_id]

    async def _publish(self, job_id: str, chunk: bytes) -> None:
        channel = self._channel(job_id)
        if len(channel.chunks) < MAX_CHUNKS:
            channel.chunks.append(chunk)
        channel.changed.set()

    async def _finish(self, job_id: str) -> None:
        channel = self._channel(job_id)
        channel.done, channel.finished_at = True, time.monotonic()
        self._finished.append((channel.finished_at, job_id))
        channel.changed.set()

    async def _subscribe(self, job_id: str, timeout_s: float) -> AsyncGenerator[bytes, None]:
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
