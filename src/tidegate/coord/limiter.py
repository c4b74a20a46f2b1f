"""Pace calls before the provider answers 429: a rate limiter per `provider/model` key, shared by
every worker process, and an adaptive concurrency limit per worker.

Algorithm. Each key has two limits, requests and tokens per period (the config's rpm and tpm per
minute), each a GCRA (generic cell rate algorithm, the "virtual scheduling" form of a token
bucket). A limit of L per period P admits one unit every P / L seconds, with a burst of
`burst_capacity(L)` units (DEFAULT_BURST_FRACTION = 10 % of L, at least 1): requests are spread
evenly over the period instead of all L passing at its start, so the provider's own bucket,
which providers document as refilling continuously and enforce over sub-minute slices, never
empties. In any window of length P at most L + capacity - 1 requests pass (exactly L when the
capacity is 1). A request costing more tokens than the token burst passes only into a full bucket
and is paid back, at the limit's rate, before the next one: the average stays at L.

`acquire` admits for BOTH limits atomically or for neither, and returns how long until it would
pass, so a caller can wait briefly or park the job. `pause` (after a 429) and `observe` (the
provider's x-ratelimit headers) stop a key for every process until a time that only ever moves
later.

`LocalRateLimiter` keeps this in process memory (the SQLite queue: one host, and pacing within a
process is what matters there); `RedisRateLimiter` keeps it in Redis, one Lua script per
operation measured on the Redis server's clock, so workers on hosts whose clocks drift still share
one limit. `rate_limiter_for(queue_url)` picks one by the queue's URL.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from types import TracebackType
from typing import Protocol, Self

from tidegate.coord._store import RedisStore, backend_of, without_query
from tidegate.errors import DispatchClosed

__all__ = [
    "DEFAULT_BURST_FRACTION",
    "DEFAULT_PERIOD_S",
    "AdaptiveConcurrency",
    "ConcurrencyState",
    "LimiterState",
    "LocalRateLimiter",
    "RateLimiter",
    "RedisRateLimiter",
    "burst_capacity",
    "rate_limiter_for",
]

DEFAULT_PERIOD_S = 60.0  # providers state rpm and tpm per minute
DEFAULT_BURST_FRACTION = 0.1  # a limit's burst: 6 s worth of a per-minute limit
STATE_KEEP_MS = 60_000  # how long Redis keeps a key's state once it has nothing left to remember
_US = 1_000_000


def burst_capacity(limit: int, burst_fraction: float = DEFAULT_BURST_FRACTION) -> int:
    """How many units of a limit may pass at once: `limit * burst_fraction`, at least 1."""
    return max(1, int(limit * burst_fraction))


@dataclass(frozen=True, slots=True)
class LimiterState:
    """A key's limiter state, for metrics and dashboards.

    `requests_available` / `tokens_available` are what could pass right now (the burst left),
    None when no such limit was used on the key; they go negative while a request larger than
    the burst is being paid back. `rpm`, `tpm` and `period_s` are the limits last used."""

    key: str
    paused_for_s: float  # 0.0 when not paused
    paused_until: datetime | None  # UTC end of the pause, None when not paused
    requests_available: float | None
    tokens_available: float | None
    rpm: int | None
    tpm: int | None
    period_s: float | None


class RateLimiter(Protocol):
    """A rate limiter shared by everything that calls one provider/model key."""

    async def acquire(
        self, key: str, *, tokens: int, rpm: int | None, tpm: int | None, period_s: float = DEFAULT_PERIOD_S
    ) -> float:
        """Admit one request costing `tokens` under both limits (None = no such limit) and return
        0.0, or admit nothing and return the seconds until it would be admitted."""
        ...

    async def pause(self, key: str, seconds: float) -> None:
        """Stop the key for `seconds` in every process (after a 429). Never shortens a pause."""
        ...

    async def observe(
        self,
        key: str,
        *,
        remaining_requests: int | None,
        remaining_tokens: int | None,
        reset_requests_s: float | None,
        reset_tokens_s: float | None,
    ) -> None:
        """Feed back the provider's x-ratelimit headers: a budget it reports at 0 pauses the key
        until that budget's reset."""
        ...

    async def state(self, key: str) -> LimiterState:
        """The key's current state."""
        ...

    async def close(self) -> None:
        """Release connections. Idempotent; a closed limiter cannot be used again."""
        ...

    async def __aenter__(self) -> Self: ...

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None: ...


def rate_limiter_for(queue_url: str, name: str = "default") -> RateLimiter:
    """The limiter that fits a queue: Redis for redis:// (rediss://, unix://) URLs, shared by every
    process on that server under `name`; in-process for SQLite."""
    if backend_of(queue_url) == "redis":
        return RedisRateLimiter(without_query(queue_url), name)
    return LocalRateLimiter()


# ---------------------------------------------------------------------- shared rules


def _check_acquire(tokens: int, rpm: int | None, tpm: int | None, period_s: float) -> None:
    if tokens < 0:
        raise ValueError(f"tokens must be >= 0, got {tokens}")
    for name, limit in (("rpm", rpm), ("tpm", tpm)):
        if limit is not None and limit <= 0:
            raise ValueError(f"{name} must be > 0 or None, got {limit}")
    if not period_s > 0:
        raise ValueError(f"period_s must be > 0, got {period_s}")


def _observed_pause_s(
    remaining_requests: int | None,
    remaining_tokens: int | None,
    reset_requests_s: float | None,
    reset_tokens_s: float | None,
) -> float | None:
    """How long the headers say nothing more can pass: the reset of each budget reported at 0."""
    waits = [
        reset
        for remaining, reset in ((remaining_requests, reset_requests_s), (remaining_tokens, reset_tokens_s))
        if remaining is not None and remaining <= 0 and reset is not None and reset > 0
    ]
    return max(waits) if waits else None


def _gcra(tat: float, now: float, units: int, interval: float, capacity: int) -> tuple[float, float]:
    """One GCRA step: (the tat after admitting `units`, seconds until that is allowed; <= 0 = now).

    Same arithmetic as lua/limiter_acquire.lua."""
    start = max(tat, now)
    # A request above the burst could never fit; it passes into a full bucket instead.
    allow_at = start + (units - capacity) * interval if units <= capacity else start
    return start + units * interval, allow_at - now


def _available(tat: float | None, now: float, limit: int | None, period: float | None,
               capacity: int | None) -> float | None:
    if limit is None or period is None or capacity is None:
        return None
    return capacity - max((tat or 0.0) - now, 0.0) * limit / period


# ---------------------------------------------------------------------- in process


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


class LocalRateLimiter:
    """Rate limits kept in this process (the SQLite queue's limiter). Safe for any number of
    tasks and threads: every operation holds a lock for a few arithmetic steps, never across an
    await. Idle keys are forgotten once there are many, so memory stays bounded."""

    MAX_KEYS = 1024  # beyond this many keys, idle ones (full buckets, no pause) are dropped

    def __init__(
        self, *, burst_fraction: float = DEFAULT_BURST_FRACTION, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.burst_fraction = burst_fraction
        self._clock = clock
        self._buckets: dict[str, _Bucket] = {}
        self._lock = threading.Lock()
        self._closed = False

    async def acquire(
        self, key: str, *, tokens: int, rpm: int | None, tpm: int | None, period_s: float = DEFAULT_PERIOD_S
    ) -> float:
        """See RateLimiter.acquire."""
        self._check_open()
        _check_acquire(tokens, rpm, tpm, period_s)
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

    async def pause(self, key: str, seconds: float) -> None:
        """See RateLimiter.pause."""
        self._check_open()
        with self._lock:
            now = self._clock()
            bucket = self._bucket(key, now)
            bucket.paused_until = max(bucket.paused_until, now + max(seconds, 0.0))

    async def observe(
        self,
        key: str,
        *,
        remaining_requests: int | None,
        remaining_tokens: int | None,
        reset_requests_s: float | None,
        reset_tokens_s: float | None,
    ) -> None:
        """See RateLimiter.observe."""
        pause_s = _observed_pause_s(remaining_requests, remaining_tokens, reset_requests_s, reset_tokens_s)
        if pause_s is not None:
            await self.pause(key, pause_s)

    async def state(self, key: str) -> LimiterState:
        """See RateLimiter.state."""
        self._check_open()
        with self._lock:
            now, wall = self._clock(), time.time()
            bucket = self._buckets.get(key) or _Bucket()
            paused_for = max(bucket.paused_until - now, 0.0)
            period = bucket.period_s
            return LimiterState(
                key=key,
                paused_for_s=paused_for,
                paused_until=datetime.fromtimestamp(wall + paused_for, UTC) if paused_for > 0 else None,
                requests_available=_available(
                    bucket.request_tat, now, bucket.rpm, period,
                    None if bucket.rpm is None else burst_capacity(bucket.rpm, self.burst_fraction)),
                tokens_available=_available(
                    bucket.token_tat, now, bucket.tpm, period,
                    None if bucket.tpm is None else burst_capacity(bucket.tpm, self.burst_fraction)),
                rpm=bucket.rpm,
                tpm=bucket.tpm,
                period_s=period,
            )

    async def close(self) -> None:
        """Forget all state. Idempotent."""
        self._closed = True
        self._buckets.clear()

    async def __aenter__(self) -> Self:
        self._check_open()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise DispatchClosed("this rate limiter was closed; create a new one")

    def _bucket(self, key: str, now: float) -> _Bucket:
        bucket = self._buckets.get(key)
        if bucket is None:
            if len(self._buckets) >= self.MAX_KEYS:
                # An idle bucket is full and unpaused: forgetting it changes no decision.
                for idle in [k for k, b in self._buckets.items() if b.idle(now)]:
                    del self._buckets[idle]
            bucket = self._buckets[key] = _Bucket()
        return bucket


# ---------------------------------------------------------------------- Redis


class RedisRateLimiter:
    """Rate limits shared through Redis by every process that uses the same `name`.

    One key per provider/model, `tidegate:{name}:rate:<key>` (hash-tagged by name, so it works on
    Redis Cluster), expiring once it holds nothing a full bucket would not. Connects lazily."""

    def __init__(self, url: str, name: str = "default", *,
                 burst_fraction: float = DEFAULT_BURST_FRACTION) -> None:
        self.name = name
        self.burst_fraction = burst_fraction
        self._prefix = f"tidegate:{{{name}}}:rate:"
        self._store = RedisStore(
            url, ("limiter_acquire", "limiter_pause", "limiter_state"), what="rate limiter"
        )

    async def acquire(
        self, key: str, *, tokens: int, rpm: int | None, tpm: int | None, period_s: float = DEFAULT_PERIOD_S
    ) -> float:
        """See RateLimiter.acquire."""
        _check_acquire(tokens, rpm, tpm, period_s)
        args = [
            tokens,
            "" if rpm is None else rpm,
            "" if tpm is None else tpm,
            max(round(period_s * _US), 1),
            burst_capacity(rpm, self.burst_fraction) if rpm is not None else 1,
            burst_capacity(tpm, self.burst_fraction) if tpm is not None else 1,
            STATE_KEEP_MS,
        ]
        # Sent again after a lost connection: an admission counted twice only paces a little more.
        wait_us = int(await self._store.script("limiter_acquire", [self._prefix + key], args, retry=True))
        return wait_us / _US

    async def pause(self, key: str, seconds: float) -> None:
        """See RateLimiter.pause."""
        pause_us = max(math.ceil(seconds * _US), 0)
        await self._store.script("limiter_pause", [self._prefix + key], [pause_us, STATE_KEEP_MS], retry=True)

    async def observe(
        self,
        key: str,
        *,
        remaining_requests: int | None,
        remaining_tokens: int | None,
        reset_requests_s: float | None,
        reset_tokens_s: float | None,
    ) -> None:
        """See RateLimiter.observe."""
        pause_s = _observed_pause_s(remaining_requests, remaining_tokens, reset_requests_s, reset_tokens_s)
        if pause_s is not None:
            await self.pause(key, pause_s)

    async def state(self, key: str) -> LimiterState:
        """See RateLimiter.state (times on the Redis server's clock)."""
        raw = await self._store.script("limiter_state", [self._prefix + key], [], retry=True)
        now, rt, tt, pu, rpm, tpm, per, rc, tc = (_opt_int(value) for value in raw)
        assert now is not None
        paused_for_us = max((pu or 0) - now, 0)
        period_s = None if per is None else per / _US
        return LimiterState(
            key=key,
            paused_for_s=paused_for_us / _US,
            paused_until=datetime.fromtimestamp((pu or 0) / _US, UTC) if paused_for_us else None,
            requests_available=_available(
                None if rt is None else rt / _US, now / _US, rpm, period_s, rc),
            tokens_available=_available(
                None if tt is None else tt / _US, now / _US, tpm, period_s, tc),
            rpm=rpm,
            tpm=tpm,
            period_s=period_s,
        )

    async def close(self) -> None:
        """Release the Redis connections. Idempotent."""
        await self._store.close()

    async def __aenter__(self) -> Self:
        self._store.check_open()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()


def _opt_int(value: bytes | str) -> int | None:
    text = value.decode() if isinstance(value, bytes) else value
    return int(text) if text else None


# ---------------------------------------------------------------------- concurrency


@dataclass(frozen=True, slots=True)
class ConcurrencyState:
    """One key's adaptive concurrency, for metrics."""

    limit: int  # calls allowed at once now
    max_limit: int  # the ceiling (the model's max_concurrency)
    in_flight: int  # calls holding a slot


@dataclass(slots=True)
class _Window:
    limit: int
    max_limit: int
    in_flight: int = 0


class AdaptiveConcurrency:
    """Calls in flight per key in this worker, under an AIMD limit (as TCP does): each success
    adds 1 up to the ceiling, each throttle (429) halves it, never below 1. A key starts at its
    ceiling, the model's max_concurrency (or at `start` when given, if lower).

    In-process and per worker: a throttled provider shrinks every worker's window on its own,
    and the shared RateLimiter keeps their sum under the provider's limits. Not thread-safe:
    use it from one event loop.
    """

    def __init__(self, *, start: int | None = None, default_max: int = 64) -> None:
        if start is not None and start < 1:
            raise ValueError(f"start must be >= 1, got {start}")
        if default_max < 1:
            raise ValueError(f"default_max must be >= 1, got {default_max}")
        self.start = start
        self.default_max = default_max
        self._windows: dict[str, _Window] = {}

    def try_acquire(self, key: str, max_concurrency: int | None = None) -> bool:
        """Take a slot for a call on `key` if one is free. `max_concurrency` (the model's) sets
        the key's ceiling; a later, different value moves it."""
        window = self._window(key, max_concurrency)
        if window.in_flight >= window.limit:
            return False
        window.in_flight += 1
        return True

    def release(self, key: str) -> None:
        """Give back a slot taken by `try_acquire`."""
        window = self._windows.get(key)
        if window is None or window.in_flight <= 0:
            raise ValueError(f"release of {key!r} without a matching try_acquire")
        window.in_flight -= 1

    def on_success(self, key: str) -> None:
        """A call on `key` succeeded without throttling: one more slot, up to the ceiling."""
        window = self._window(key, None)
        window.limit = min(window.limit + 1, window.max_limit)

    def on_throttled(self, key: str) -> None:
        """A call on `key` was throttled (429): halve the slots, keeping at least one."""
        window = self._window(key, None)
        window.limit = max(window.limit // 2, 1)

    def limit(self, key: str) -> int:
        """The key's current limit (its starting limit if it was never used)."""
        return self._window(key, None).limit

    def in_flight(self, key: str) -> int:
        """Slots of the key held now."""
        window = self._windows.get(key)
        return 0 if window is None else window.in_flight

    def snapshot(self) -> dict[str, ConcurrencyState]:
        """Every key's limit, ceiling and slots in use."""
        return {
            key: ConcurrencyState(limit=w.limit, max_limit=w.max_limit, in_flight=w.in_flight)
            for key, w in self._windows.items()
        }

    def _window(self, key: str, max_concurrency: int | None) -> _Window:
        window = self._windows.get(key)
        if window is None:
            ceiling = max_concurrency or self.default_max
            start = ceiling if self.start is None else min(self.start, ceiling)
            window = self._windows[key] = _Window(limit=start, max_limit=ceiling)
        elif max_concurrency is not None and max_concurrency != window.max_limit:
            window.max_limit = max_concurrency
            window.limit = min(window.limit, max_concurrency)
        return window
