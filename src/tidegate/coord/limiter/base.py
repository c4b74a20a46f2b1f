"""The rate limiter's contract: pace calls before the provider answers 429, with one limiter per
`provider/model` key shared by every worker process.

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

`RateLimiter` checks arguments and the lifecycle once and calls the `_hooks` a backend
implements: `memory.LocalRateLimiter` keeps the state in process memory (the SQLite queue: one
host, and pacing within a process is what matters there); `redis.RedisRateLimiter` keeps it in
Redis, one Lua script per operation measured on the Redis server's clock, so workers on hosts
whose clocks drift still share one limit. `rate_limiter_for(queue_url)` picks one by the queue's
URL.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from datetime import datetime

from tidegate._urls import without_query
from tidegate.coord._store import OpensOnFirstUse, backend_of
from tidegate.errors import DispatchClosed

__all__ = [
    "DEFAULT_BURST_FRACTION",
    "DEFAULT_PERIOD_S",
    "LimiterState",
    "RateLimiter",
    "burst_capacity",
    "rate_limiter_for",
]

DEFAULT_PERIOD_S = 60.0  # providers state rpm and tpm per minute
DEFAULT_BURST_FRACTION = 0.1  # a limit's burst: 6 s worth of a per-minute limit


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


class RateLimiter(OpensOnFirstUse):
    """A rate limiter shared by everything that calls one provider/model key. Opens on first
    use; closing releases its state or connections, and a closed limiter raises DispatchClosed."""

    unavailable_error = DispatchClosed
    what = "this rate limiter"

    def __init__(self, *, burst_fraction: float = DEFAULT_BURST_FRACTION) -> None:
        super().__init__()
        self.burst_fraction = burst_fraction

    async def acquire(
        self, key: str, *, tokens: int, rpm: int | None, tpm: int | None, period_s: float = DEFAULT_PERIOD_S
    ) -> float:
        """Admit one request costing `tokens` under both limits (None = no such limit) and return
        0.0, or admit nothing and return the seconds until it would be admitted."""
        await self._ready()
        if tokens < 0:
            raise ValueError(f"tokens must be >= 0, got {tokens}")
        for name, limit in (("rpm", rpm), ("tpm", tpm)):
            if limit is not None and limit <= 0:
                raise ValueError(f"{name} must be > 0 or None, got {limit}")
        if not period_s > 0:
            raise ValueError(f"period_s must be > 0, got {period_s}")
        return await self._acquire(key, tokens, rpm, tpm, period_s)

    async def pause(self, key: str, seconds: float) -> None:
        """Stop the key for `seconds` (at least 0) in every process (after a 429). Never shortens
        a pause."""
        await self._ready()
        await self._pause(key, max(seconds, 0.0))

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
        until that budget's reset (the later of the two when both are)."""
        waits = [
            reset
            for remaining, reset in ((remaining_requests, reset_requests_s),
                                     (remaining_tokens, reset_tokens_s))
            if remaining is not None and remaining <= 0 and reset is not None and reset > 0
        ]
        if waits:
            await self.pause(key, max(waits))

    async def state(self, key: str) -> LimiterState:
        """The key's current state."""
        await self._ready()
        return await self._state(key)

    # -- what each backend implements (arguments already checked, the limiter open)

    @abc.abstractmethod
    async def _acquire(self, key: str, tokens: int, rpm: int | None, tpm: int | None,
                       period_s: float) -> float:
        """One atomic admission for both limits, or none: 0.0, or the seconds to wait."""

    @abc.abstractmethod
    async def _pause(self, key: str, seconds: float) -> None:
        """Move the key's pause to end no earlier than `seconds` from now."""

    @abc.abstractmethod
    async def _state(self, key: str) -> LimiterState:
        """The key's state now."""


def available(tat: float | None, now: float, limit: int | None, period: float | None,
              capacity: int | None) -> float | None:
    """What a limit could admit at `now` given its theoretical arrival time `tat` (None when the
    key never used that limit)."""
    if limit is None or period is None or capacity is None:
        return None
    return capacity - max((tat or 0.0) - now, 0.0) * limit / period


def rate_limiter_for(queue_url: str, name: str = "default") -> RateLimiter:
    """The limiter that fits a queue: Redis for redis:// (rediss://, unix://, redis+cluster://)
    URLs, shared by every process on that server under `name`; in-process for SQLite."""
    if backend_of(queue_url) == "redis":
        from tidegate.coord.limiter.redis import RedisRateLimiter

        return RedisRateLimiter(without_query(queue_url), name)
    from tidegate.coord.limiter.memory import LocalRateLimiter

    return LocalRateLimiter()
