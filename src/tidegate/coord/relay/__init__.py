"""Streamed answers relayed from the worker to the gateway (`ChunkRelay`: in memory for the
embedded queue, Redis Streams for a Redis queue, picked by `relay_for(queue_url)`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tidegate.coord._store import imported_when_named
from tidegate.coord.relay.base import CHANNEL_TTL_S, END, MAX_CHUNKS, ChunkRelay, relay_for
from tidegate.coord.relay.memory import MemoryRelay

if TYPE_CHECKING:
    from tidegate.coord.relay.redis import RedisRelay

__all__ = ["CHANNEL_TTL_S", "END", "MAX_CHUNKS", "ChunkRelay", "MemoryRelay", "RedisRelay", "relay_for"]

__getattr__ = imported_when_named(__name__, {"RedisRelay": "tidegate.coord.relay.redis"})
