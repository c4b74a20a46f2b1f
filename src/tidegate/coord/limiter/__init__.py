"""Rate limits per provider/model key shared by every worker (`RateLimiter`: in memory for the
SQLite queue, in Redis for a Redis queue, picked by `rate_limiter_for(queue_url)`), and the
adaptive concurrency limit of one worker (`AdaptiveConcurrency`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tidegate.coord._store import imported_when_named
from tidegate.coord.limiter.base import (
    DEFAULT_BURST_FRACTION,
    DEFAULT_PERIOD_S,
    LimiterState,
    RateLimiter,
    burst_capacity,
    rate_limiter_for,
)
from tidegate.coord.limiter.concurrency import AdaptiveConcurrency, ConcurrencyState
from tidegate.coord.limiter.memory import LocalRateLimiter

if TYPE_CHECKING:
    from tidegate.coord.limiter.redis import RedisRateLimiter

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


__getattr__ = imported_when_named(__name__, {"RedisRateLimiter": "tidegate.coord.limiter.redis"})
