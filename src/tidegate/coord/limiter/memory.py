"""The rate limiter of one process (the SQLite queue's): GCRA state in memory."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from tidegate.coord.limiter.base import (
    DEFAULT_BURST_FRACTION,
    LimiterState,
    RateLimiter,
    available,
    burst_capacity,
)

__all__ = ["LocalRateLimiter"]


def _gcra(tat: float, now: float, units: int, interval: float, capacity: int) -> tuple[float, float]:
    """One GCRA step: (the tat after admitting `units`, seconds until that is allowed; <= 0 = now).

    Same arithmetic as lua/acquire.lua."""
    start = max(tat, now)
    # A request above the burst could never fit; it passes into a full bucket instead.
    allow_at = start + (units - capacity) * interval if units <= capacity else start
    return start + units * interval, allow_at - now


@dataclass(slots=True)
class _Bucket:
    request_tat: float = 0.0
    token_tat: float = 0.0
    paused_until: float = 0.0
    rpm: int | None = None
    tpm: int | None = None
    period_s: float | None = None

    def idle(self, now: float) -> bool:
        return max(self.request_tat, self.token_tat, self.paused_until) <= now


class LocalRateLimiter(RateLimiter):
    """Rate limits kept in this process (the SQLite queue's limiter). Safe for any number of
    tasks and threads: every operation holds a lock for a few arithmetic steps, never across an
    await. Idle keys are forgotten once there are many, so memory stays bounded."""

    MAX_KEYS = 1024  # beyond this many keys, idle ones (full buckets, no pause) are dropped

    def __init__(
        self, *, burst_fraction: float = DEFAULT_BURST_FRACTION, clock: Callable[[], float] = time.monotonic
    ) -> None:
        super().__init__(burst_fraction=burst_fraction)
        self._clock = clock
        self._buckets: dict[str, _Bucket] = {}
        self._lock = threading.Lock()

    async def _open(self) -> None:
        pass  # nothing to connect to

    async def _close(self) -> None:
        self._buckets.clear()  # forget all state

    async def _acquire(self, key: str, tokens: int, rpm: int | None, tpm: int | None,
                       period_s: float) -> float:
        with self._lock:
            now = self._clock()
            bucket = self._bucket(key, now)
            wait = bucket.paused_until - now
            request_tat, token_tat = bucket.request_tat, bucket.token_tat
            if rpm is not None:
                request_tat, step = _gcra(request_tat, now, 1, period_s / rpm,
                                          burst_capacity(rpm, self.burst_fraction))
                wait = max(wait, step)
            if tpm is not None:
                token_tat, step = _gcra(token_tat, now, tokens, period_s / tpm,
                                        burst_capacity(tpm, self.burst_fraction))
                wait = max(wait, step)
            if wait > 0:
                return wait
            bucket.request_tat, bucket.token_tat = request_tat, token_tat
            bucket.rpm, bucket.tpm, bucket.period_s = rpm, tpm, period_s
            return 0.0

    async def _pause(self, key: str, seconds: float) -> None:
        with self._lock:
            now = self._clock()
            bucket = self._bucket(key, now)
            bucket.paused_until = max(bucket.paused_until, now + seconds)

    async def _state(self, key: str) -> LimiterState:
        with self._lock:
            now, wall = self._clock(), time.time()
            bucket = self._buckets.get(key) or _Bucket()
            paused_for = max(bucket.paused_until - now, 0.0)
            period = bucket.period_s
            return LimiterState(
                key=key,
                paused_for_s=paused_for,
                paused_until=datetime.fromtimestamp(wall + paused_for, UTC) if paused_for > 0 else None,
                requests_available=available(
                    bucket.request_tat, now, bucket.rpm, period,
                    None if bucket.rpm is None else burst_capacity(bucket.rpm, self.burst_fraction)),
                tokens_available=available(
                    bucket.token_tat, now, bucket.tpm, period,
                    None if bucket.tpm is None else burst_capacity(bucket.tpm, self.burst_fraction)),
                rpm=bucket.rpm,
                tpm=bucket.tpm,
                period_s=period,
            )

    def _bucket(self, key: str, now: float) -> _Bucket:
        bucket = self._buckets.get(key)
        if bucket is None:
            if len(self._buckets) >= self.MAX_KEYS:
                # An idle bucket is full and unpaused: forgetting it changes no decision.
                for idle in [k for k, b in self._buckets.items() if b.idle(now)]:
                    del self._buckets[idle]
            bucket = self._buckets[key] = _Bucket()
        return bucket
