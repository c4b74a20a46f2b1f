"""The budget ledger's contract: daily budgets, reserved atomically before a call and settled to
its real cost afterwards.

A reservation checks the tenant's and the global spent-or-reserved total of the current UTC day
against their limits and adds the amount to both in one atomic step (a Lua script on Redis, a
`BEGIN IMMEDIATE` transaction on SQLite), so any number of workers in any number of processes
never admit more than a limit together. `settle` swaps the reserved amount for the actual cost
on the reservation's own day, once: the ledger keeps the reservation as pending until it is
settled, and a second settle finds nothing pending and changes nothing. A reservation that is
never settled (its worker died) stays counted, which errs on the side of spending less.

Days are UTC dates taken from `today()` (injectable for tests); a day's records expire after
KEEP_DAYS, so nothing grows without bound. Money is integer micro-dollars.

`BudgetLedger` checks arguments and the lifecycle, makes reservations and reports refusals once;
`sqlite.SqliteBudgetLedger` and `redis.RedisBudgetLedger` implement its `_hooks`, each one atomic
step. `budget_ledger_for(queue_url)` picks one by the queue's URL.
"""

from __future__ import annotations

import abc
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, date, datetime

from tidegate._urls import without_query
from tidegate.coord._store import OpensOnFirstUse, backend_of, queue_name_of, sqlite_path_of
from tidegate.costs import micros_to_usd
from tidegate.errors import BudgetExhausted, BudgetScope, DispatchClosed

__all__ = [
    "GLOBAL",
    "KEEP_DAYS",
    "BudgetLedger",
    "BudgetStatus",
    "Refusal",
    "Reservation",
    "budget_ledger_for",
    "utc_today",
]

GLOBAL = "*"  # the global total's entry in spend_today(); no tenant may use this name
KEEP_DAYS = 3  # today, yesterday for reports, and a day of slack for late settlements

Today = Callable[[], date]
Refusal = tuple[BudgetScope, int]  # the budget that refused a reservation, and its spend so far


def utc_today() -> date:
    """The current UTC date: budgets reset at midnight UTC."""
    return datetime.now(UTC).date()


@dataclass(frozen=True, slots=True)
class Reservation:
    """Budget held for one call until it is settled or released. It carries its day, so a call
    that straddles midnight is settled against the day it was reserved on."""

    id: str
    tenant: str
    amount_micros: int
    day: date
    enforced: bool = True  # False: recorded without checking the limits (critical jobs)


@dataclass(frozen=True, slots=True)
class BudgetStatus:
    """A tenant's and the global budget today. Spent includes what is reserved and unsettled;
    a limit of None is unlimited."""

    tenant: str
    day: date
    tenant_spent_micros: int
    global_spent_micros: int
    tenant_limit_micros: int | None
    global_limit_micros: int | None

    @property
    def tenant_remaining_micros(self) -> int | None:
        """What the tenant may still reserve today (None: unlimited)."""
        return _remaining(self.tenant_limit_micros, self.tenant_spent_micros)

    @property
    def global_remaining_micros(self) -> int | None:
        """What anyone may still reserve today (None: unlimited)."""
        return _remaining(self.global_limit_micros, self.global_spent_micros)

    @property
    def remaining_micros(self) -> int | None:
        """The tighter of the two remainders (None: both unlimited)."""
        left = [r for r in (self.tenant_remaining_micros, self.global_remaining_micros) if r is not None]
        return min(left) if left else None

    def refusal(self, amount_micros: int) -> BudgetExhausted | None:
        """What a reservation of `amount_micros` would be refused with now, the tenant's limit
        checked first as the ledger does (None: it fits)."""
        checks: tuple[tuple[BudgetScope, int | None, int], ...] = (
            ("tenant", self.tenant_limit_micros, self.tenant_spent_micros),
            ("global", self.global_limit_micros, self.global_spent_micros))
        for scope, limit, spent in checks:
            if limit is not None and spent + amount_micros > limit:
                return _exhausted(scope, self.tenant, amount_micros, spent, limit)
        return None

    @property
    def fraction_left(self) -> float | None:
        """The share left of the tighter budget, 0.0-1.0 (None: both unlimited); what the router
        compares with `routing.low_budget_fraction`."""
        fractions = [
            (remaining / limit if limit > 0 else 0.0)
            for limit, remaining in ((self.tenant_limit_micros, self.tenant_remaining_micros),
                                     (self.global_limit_micros, self.global_remaining_micros))
            if limit is not None and remaining is not None
        ]
        return min(fractions) if fractions else None


def _remaining(limit: int | None, spent: int) -> int | None:
    return None if limit is None else max(limit - spent, 0)


class BudgetLedger(OpensOnFirstUse):
    """Daily spend per tenant and in total, shared by every worker on the same store, kept under
    the ledger's `name`. Opens on first use; a closed ledger raises DispatchClosed."""

    unavailable_error = DispatchClosed
    what = "this budget ledger"

    def __init__(self, name: str, today: Today) -> None:
        super().__init__()
        self.name = name
        self._today = today

    async def reserve(
        self,
        tenant: str,
        amount_micros: int,
        *,
        tenant_limit_micros: int | None,
        global_limit_micros: int | None,
        enforce: bool = True,
    ) -> Reservation:
        """Atomically check both limits (None = unlimited) and add the amount to both totals, or
        raise BudgetExhausted naming the scope and change nothing. `enforce=False` records
        without checking (critical jobs)."""
        _check_spend(tenant, amount_micros)
        await self._ready()
        reservation = Reservation(uuid.uuid4().hex, tenant, amount_micros, self._today(), enforce)
        limits = (tenant_limit_micros, global_limit_micros) if enforce else (None, None)
        refused = await self._reserve(reservation, *limits)
        if refused is not None:
            scope, spent = refused
            limit = tenant_limit_micros if scope == "tenant" else global_limit_micros
            assert limit is not None
            raise _exhausted(scope, tenant, amount_micros, spent, limit)
        return reservation

    async def settle(self, reservation: Reservation, actual_micros: int) -> None:
        """Replace the reserved amount with the actual cost, on the reservation's day. A second
        settle (or release) of the same reservation changes nothing."""
        if actual_micros < 0:
            raise ValueError(f"actual_micros must be >= 0, got {actual_micros}")
        await self._ready()
        await self._settle(reservation, actual_micros)

    async def release(self, reservation: Reservation) -> None:
        """The call never happened: settle to 0."""
        await self.settle(reservation, 0)

    async def record(self, tenant: str, amount_micros: int) -> None:
        """Add what a call cost to the tenant's and the global total of today, with no
        reservation before it: for spend that no limit is checked against."""
        _check_spend(tenant, amount_micros)
        await self._ready()
        await self._record(tenant, self._today(), amount_micros)

    async def status(
        self, tenant: str, *, tenant_limit_micros: int | None, global_limit_micros: int | None
    ) -> BudgetStatus:
        """The tenant's and the global budget today."""
        await self._ready()
        today = self._today()
        tenant_spent, global_spent = await self._spent(today, tenant)
        return BudgetStatus(tenant, today, tenant_spent, global_spent, tenant_limit_micros,
                            global_limit_micros)

    async def spend_today(self) -> dict[str, int]:
        """Spent-or-reserved micros today per tenant, with the global total under GLOBAL."""
        await self._ready()
        return await self._spend(self._today())

    # -- what each backend implements (arguments already checked, the ledger open)

    @abc.abstractmethod
    async def _reserve(self, reservation: Reservation, tenant_limit_micros: int | None,
                       global_limit_micros: int | None) -> Refusal | None:
        """In one atomic step: refuse (the tenant's limit checked first) or add the amount to the
        tenant's and the global total of the reservation's day and keep it as pending. Limits of
        None are not checked."""

    @abc.abstractmethod
    async def _settle(self, reservation: Reservation, actual_micros: int) -> None:
        """In one atomic step: if the reservation is pending, stop keeping it and add
        `actual - reserved` to both totals of its day; else change nothing."""

    async def _record(self, tenant: str, day: date, amount_micros: int) -> None:
        """Add the amount to the tenant's and the global total of `day`. By default an unchecked
        reservation settled at once; a backend that can add both in one step does."""
        reservation = Reservation(uuid.uuid4().hex, tenant, amount_micros, day, False)
        await self._reserve(reservation, None, None)
        await self._settle(reservation, amount_micros)

    @abc.abstractmethod
    async def _spent(self, day: date, tenant: str) -> tuple[int, int]:
        """The tenant's and the global total of `day`."""

    @abc.abstractmethod
    async def _spend(self, day: date) -> dict[str, int]:
        """Every total of `day`, the global one under GLOBAL."""


def _check_spend(tenant: str, amount_micros: int) -> None:
    """A tenant name and an amount a reservation or a record may carry (ValueError otherwise)."""
    if not tenant or tenant == GLOBAL:
        raise ValueError(f"invalid tenant name {tenant!r}: it must be non-empty and not {GLOBAL!r}")
    if amount_micros < 0:
        raise ValueError(f"amount_micros must be >= 0, got {amount_micros}")


def _exhausted(scope: BudgetScope, tenant: str, amount: int, spent: int, limit: int) -> BudgetExhausted:
    remaining = max(limit - spent, 0)
    owner = f"tenant {tenant!r}" if scope == "tenant" else "the global"
    return BudgetExhausted(
        f"{owner} daily budget is exhausted: {micros_to_usd(amount)} USD needed, "
        f"{micros_to_usd(remaining)} of {micros_to_usd(limit)} USD left today (UTC)",
        scope=scope,
        remaining_micros=remaining,
        limit_micros=limit,
    )


def budget_ledger_for(queue_url: str, name: str | None = None, *, today: Today = utc_today) -> BudgetLedger:
    """The ledger that fits a queue: the same Redis server (keys under `name`), or the same
    SQLite file (its own tables, rows under `name`). `name` defaults to the queue's `?name=`
    ("default" without one), so queues sharing a server never share their spend."""
    if name is None:
        name = queue_name_of(queue_url)
    if backend_of(queue_url) == "redis":
        from tidegate.coord.budget.redis import RedisBudgetLedger

        return RedisBudgetLedger(without_query(queue_url), name, today=today)
    from tidegate.coord.budget.sqlite import SqliteBudgetLedger

    return SqliteBudgetLedger(sqlite_path_of(queue_url), name, today=today)
