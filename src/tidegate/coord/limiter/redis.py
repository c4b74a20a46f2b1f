"""The rate limiter shared through Redis: one Lua script per operation (lua/*.lua, each
documenting its KEYS and ARGV), measured on the Redis server's clock."""

from __future__ import annotations

import asyncio
import math
import time
from datetime import UTC, datetime
from typing import Any

from tidegate._redis import (
    CLOSE_TIMEOUT_S,
    Outage,
    RedisClient,
    key_prefix,
    lua_source,
    publish_command,
    require_redis,
)
from tidegate._shutdown import cancel_bounded
from tidegate.coord.limiter.base import (
    DEFAULT_BURST_FRACTION,
    LimiterState,
    RateLimiter,
    available,
    burst_capacity,
)
from tidegate.errors import DispatchUnavailable

require_redis("the Redis rate limiter")

# Unversioned on purpose: a limiter's keys are windows of the last minute (and pauses of a few
# seconds) that expire on their own, so no format outlives a release; a layout change would read
# a window as empty once, pacing from the provider's headers until it refills.
__all__ = ["STATE_KEEP_MS", "KnownPauses", "RedisRateLimiter"]

TRUST_S = 1.0  # how long a key's pause, once read, is answered from what was announced
STATE_KEEP_MS = 60_000  # how long Redis keeps a key's state once it has nothing left to remember
MAX_CONNECTIONS = 32  # a worker's limiter calls are short; more would only queue in Redis
_SCRIPTS = ("acquire", "pause", "state")
_US = 1_000_000


class KnownPauses:
    """What this process knows of its keys' pauses while it follows their announcements.

    Every pause is announced (lua/pause.lua), so once a key's pause has been read by a script
    call made while the subscription stood, the announcements keep it current, and a key without
    limits needs no round trip to be admitted. Nothing is trusted while the subscription is down
    (announcements are lost then) nor from before it last stood, and a key's knowledge is read
    again every TRUST_S, which bounds what a connection lost without notice could hide."""

    def __init__(self) -> None:
        self.generation = 0  # subscriptions so far; a read counts only within one
        self._following = False
        self._until: dict[str, float] = {}  # key → monotonic end of its pause, as last known
        self._read_at: dict[str, float] = {}  # key → when a script read it, this subscription

    def subscribed(self) -> None:
        self.generation += 1
        self._following = True
        self._read_at.clear()

    def lost(self) -> None:
        self._following = False
        self._read_at.clear()

    def wait_s(self, key: str) -> float | None:
        """Seconds the key stays paused, or None when that is not known here."""
        now = time.monotonic()
        read_at = self._read_at.get(key)
        if not self._following or read_at is None or now - read_at > TRUST_S:
            return None
        return max(self._until.get(key, 0.0) - now, 0.0)

    def learn(self, key: str, wait_s: float, since: int) -> None:
        """A script read the key's wait, having been sent in subscription `since`."""
        if not self._following or since != self.generation:
            return
        now = time.monotonic()
        self._read_at[key] = now
        self.paused(key, wait_s)

    def paused(self, key: str, seconds: float) -> None:
        """The key is paused for `seconds` from now (a pause never shortens)."""
        until = time.monotonic() + seconds
        if until > self._until.get(key, 0.0):
            self._until[key] = until


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
        self._paused_channel = key_prefix(name) + "paused"
        self._publish = publish_command(url)
        self._pauses = KnownPauses()
        self._listener: asyncio.Task[None] | None = None
        self._outage = Outage("rate_limiter_pauses", url)

    async def _open(self) -> None:
        self._redis = RedisClient(
            self.url, what="rate limiter", unavailable=DispatchUnavailable, max_connections=MAX_CONNECTIONS,
            scripts={name: lua_source("tidegate.coord.limiter", name) for name in _SCRIPTS})

    async def _close(self) -> None:
        assert self._redis is not None
        if self._listener is not None:
            await cancel_bounded(self._listener, "the pause listener's stop", 2 * CLOSE_TIMEOUT_S)
        await self._redis.aclose()

    async def _script(self, name: str, key: str, args: list[int | str]) -> Any:
        assert self._redis is not None
        return await self._redis.script(name, [self._prefix + key], list(args), retry=True)

    async def _acquire(self, key: str, tokens: int, rpm: int | None, tpm: int | None,
                       period_s: float) -> float:
        if rpm is None and tpm is None:
            # Only a pause can hold a key without limits, and pauses are announced: while the
            # announcements are followed, the key's pause is known here without a round trip.
            known = self._pauses.wait_s(key)
            if known is not None:
                return known
            self._follow_pauses()
            since = self._pauses.generation
            wait_s = await self._script_acquire(key, tokens, rpm, tpm, period_s)
            self._pauses.learn(key, wait_s, since)
            return wait_s
        return await self._script_acquire(key, tokens, rpm, tpm, period_s)

    async def _script_acquire(self, key: str, tokens: int, rpm: int | None, tpm: int | None,
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
        left_us = await self._script("pause", key, [math.ceil(seconds * _US), STATE_KEEP_MS,
                                                    self._paused_channel, self._publish])
        # Known here at once; other processes learn it from the announcement.
        self._pauses.paused(key, int(left_us) / _US)

    def _follow_pauses(self) -> None:
        """Start following the pause announcements (once; it reconnects until the limiter closes)."""
        if self._listener is None:
            assert self._redis is not None
            self._listener = asyncio.create_task(self._redis.follow(
                self._paused_channel, self._outage, running=lambda: self.is_open,
                on_message=self._on_pause, on_subscribed=self._pauses.subscribed, on_lost=self._pauses.lost,
            ), name="tidegate-limiter-pauses")

    def _on_pause(self, message: bytes) -> None:
        left_us, _, key = message.decode().partition(" ")
        self._pauses.paused(key.removeprefix(self._prefix), int(left_us) / _US)

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
