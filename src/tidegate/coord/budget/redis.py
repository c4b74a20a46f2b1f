"""The budget ledger in Redis: one Lua script per change (lua/*.lua, each documenting its KEYS
and ARGV)."""

from __future__ import annotations

from datetime import date, timedelta

from tidegate._formats import FormatCheck, RedisStore, StoreFormat
from tidegate._group_commit import GroupCall
from tidegate._redis import CLOSE_TIMEOUT_S, RedisClient, key_prefix, lua_source, require_redis
from tidegate._shutdown import bounded
from tidegate.coord.budget.base import GLOBAL, KEEP_DAYS, BudgetLedger, Refusal, Reservation, Today, utc_today
from tidegate.errors import DispatchUnavailable

require_redis("the Redis budget ledger")

__all__ = ["REDIS_FORMAT", "RedisBudgetLedger", "redis_store"]

MAX_CONNECTIONS = 32  # a worker's ledger calls are short; more would only queue in Redis
_KEEP_S = KEEP_DAYS * 86_400
_SCRIPTS = ("reserve", "settle", "record")

# The ledger's format (see tidegate._formats). Format 1 is 0.1.0's layout, now recorded.
REDIS_FORMAT = StoreFormat.initial("budget")


def redis_store(name: str, today: date) -> RedisStore:
    """Where the ledger called `name` keeps its format: the field "budget" of the hash
    `tidegate:{name}:formats` (the queue's, when named after it). Its keys are per day and expire
    KEEP_DAYS after their last write, so a ledger with data has a spend key of one of the last
    KEEP_DAYS days (and the day after: another process's clock may be ahead)."""
    prefix = key_prefix(name)
    days = [today + timedelta(days=offset) for offset in range(1, -KEEP_DAYS - 1, -1)]
    return RedisStore(REDIS_FORMAT, prefix + "formats",
                      tuple(f"{prefix}budget:{day.isoformat()}:spend" for day in days))


class RedisBudgetLedger(BudgetLedger):
    """A ledger in Redis: per day, `tidegate:{name}:budget:<day>:spend` (tenant → micros, '*' →
    the global total) and `...:pending` (unsettled reservations), hash-tagged by name and
    expiring KEEP_DAYS after their last write. Connects on first use.

    A reservation is sent once (sent twice, it would count twice); a settlement, a status and
    the day's spend are sent again across a lost connection for a short while."""

    def __init__(self, url: str, name: str = "default", *, today: Today = utc_today) -> None:
        super().__init__(name, today)
        self.url = url
        self._prefix = key_prefix(name) + "budget:"
        self._redis: RedisClient | None = None
        self._records: GroupCall[tuple[str, date, int], None] = GroupCall(self._record_batch)
        self._format = FormatCheck(redis_store(name, today()))

    async def _open(self) -> None:
        self._redis = RedisClient(
            self.url, what="budget ledger", unavailable=DispatchUnavailable, max_connections=MAX_CONNECTIONS,
            scripts={name: lua_source("tidegate.coord.budget", name) for name in _SCRIPTS})

    async def _close(self) -> None:
        assert self._redis is not None
        # Spend already handed over is recorded before the connections go (bounded).
        await bounded(self._records.drain(), "the ledger's last spend records", 2 * CLOSE_TIMEOUT_S)
        await self._redis.aclose()

    async def _client(self) -> RedisClient:
        """The client, once the ledger's format is known to be this code's."""
        assert self._redis is not None
        await self._format.ready(self._redis)
        return self._redis

    def _keys(self, day: date) -> list[str]:
        base = f"{self._prefix}{day.isoformat()}:"
        return [base + "spend", base + "pending"]

    async def _reserve(self, reservation: Reservation, tenant_limit_micros: int | None,
                       global_limit_micros: int | None) -> Refusal | None:
        redis = await self._client()
        args = [
            reservation.tenant,
            reservation.amount_micros,
            "" if tenant_limit_micros is None else tenant_limit_micros,
            "" if global_limit_micros is None else global_limit_micros,
            "1" if reservation.enforced else "0",
            reservation.id,
            _KEEP_S,
        ]
        refused = await redis.script("reserve", self._keys(reservation.day), args)
        if not refused:
            return None
        return ("tenant" if refused[0] == b"tenant" else "global"), int(refused[1])

    async def _settle(self, reservation: Reservation, actual_micros: int) -> None:
        redis = await self._client()
        args = [reservation.tenant, reservation.id, actual_micros, _KEEP_S]
        # Idempotent (the script removes the pending entry), so a lost connection is retried.
        await redis.script("settle", self._keys(reservation.day), args, retry=True)

    async def _record(self, tenant: str, day: date, amount_micros: int) -> None:
        # Spend recorded in the same loop turn, or while the last batch was on its way, goes out
        # in one script call per day (see tidegate._group_commit).
        await self._records.call((tenant, day, amount_micros))

    async def _record_batch(self, items: list[tuple[str, date, int]]) -> list[None]:
        redis = await self._client()
        by_day: dict[date, list[str | int]] = {}
        for tenant, day, amount_micros in items:
            by_day.setdefault(day, []).extend((tenant, amount_micros))
        for day, pairs in by_day.items():
            await redis.script("record", self._keys(day)[:1], [_KEEP_S, *pairs])
        return [None] * len(items)

    async def _spent(self, day: date, tenant: str) -> tuple[int, int]:
        redis = await self._client()
        tenant_spent, global_spent = await redis.command(
            "HMGET", self._keys(day)[0], tenant, GLOBAL, retry=True)
        return int(tenant_spent or 0), int(global_spent or 0)

    async def _spend(self, day: date) -> dict[str, int]:
        redis = await self._client()
        flat = await redis.command("HGETALL", self._keys(day)[0], retry=True)
        items = flat.items() if isinstance(flat, dict) else zip(flat[::2], flat[1::2], strict=True)
        return {key.decode(): int(value) for key, value in items}
