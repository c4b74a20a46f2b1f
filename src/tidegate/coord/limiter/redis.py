"""The rate limiter shared through Redis: one Lua script per operation (lua/*.lua, each
documenting its KEYS and ARGV), measured on the Redis server's clock."""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import Any

from tidegate._redis import RedisClient, key_prefix, lua_source, require_redis
from tidegate.coord.limiter.base import (
    DEFAULT_BURST_FRACTION,
    LimiterState,
    RateLimiter,
    available,
    burst_capacity,
)
from tidegate.errors import DispatchUnavailable

require_redis("the Redis rate limiter")

__all__ = ["STATE_KEEP_MS", "RedisRateLimiter"]

STATE_KEEP_MS = 60_000  # how long Redis keeps a key's state once it has nothing left to remember
MAX_CONNECTIONS = 32  # a worker's limiter calls are short; more would only queue in Redis
_SCRIPTS = ("acquire", "pause", "state")
_US = 1_000_000


class RedisRateLimiter(RateLimiter):
    """Rate limits shared through Redis by every process that uses the same `name`.

    One key per provider/model, `tidegate:{name}:rate:<key>` (hash-tagged by name, so it works on
    Redis Cluster), expiring once it holds nothing a full bucket would not. Connects on first
    use. A call lost with its connection (a Redis restart) is sent again for a short while:
    an admission counted twice only paces a little more."""

    def __init__(self, url: str, name: str = "default", *,
                 burst_fraction: float = DEFAULT_BURST_FRACTION) -> None:
        super().__init__(burst_fraction=burst_fraction)
        self.url = url
        self.name = name
        self._prefix = key_prefix(name) + "rate:"
        self._redis: RedisClient | None = None

    async def _open(self) -> None:
        self._redis = RedisClient(
            self.url, what="rate limiter", unavailable=DispatchUnavailable, max_connections=MAX_CONNECTIONS,
            scripts={name: lua_source("tidegate.coord.limiter", name) for name in _SCRIPTS})

    async def _close(self) -> None:
        assert self._redis is not None
        await self._redis.aclose()

    async def _script(self, name: str, key: str, args: list[int | str]) -> Any:
        assert self._redis is not None
        return await self._redis.script(name, [self._prefix + key], list(args), retry=True)

    async def _acquire(self, key: str, tokens: int, rpm: int | None, tpm: int | None,
                       period_s: float) -> float:
        args: list[int | str] = [
            tokens,
            "" if rpm is None else rpm,
            "" if tpm is None else tpm,
            max(round(period_s * _US), 1),
            burst_capacity(rpm, self.burst_fraction) if rpm is not None else 1,
            burst_capacity(tpm, self.burst_fraction) if tpm is not None else 1,
            STATE_KEEP_MS,
        ]
        wait_us = int(await self._script("acquire", key, args))
        return wait_us / _US

    async def _pause(self, key: str, seconds: float) -> None:
        await self._script("pause", key, [math.ceil(seconds * _US), STATE_KEEP_MS])

    async def _state(self, key: str) -> LimiterState:
        """Times on the Redis server's clock."""
        raw = await self._script("state", key, [])
        now, rt, tt, pu, rpm, tpm, per, rc, tc = (_opt_int(value) for value in raw)
        assert now is not None
        paused_for_us = max((pu or 0) - now, 0)
        period_s = None if per is None else per / _US
        return LimiterState(
            key=key,
            paused_for_s=paused_for_us / _US,
            paused_until=datetime.fromtimestamp((pu or 0) / _US, UTC) if paused_for_us else None,
            requests_available=available(
                None if rt is None else rt / _US, now / _US, rpm, period_s, rc),
            tokens_available=available(
                None if tt is None else tt / _US, now / _US, tpm, period_s, tc),
            rpm=rpm,
            tpm=tpm,
            period_s=period_s,
        )


def _opt_int(value: bytes | str) -> int | None:
    text = value.decode() if isinstance(value, bytes) else value
    return int(text) if text else None
