"""The budget side of a worker: which daily limits a tenant's jobs are reserved against, how much
of them is left, what a call is estimated to cost, and the reservations themselves.

A tenant's own daily budget (set in the tenant store, read again every `TENANT_CACHE_S`) wins over
the configured one; the global budget applies to everyone. CRITICAL jobs are recorded but never
refused (DESIGN.md: the most urgent work is not stopped by a spent budget). The gateway refuses a
synchronous call with the same limits and estimates before it is queued (tidegate.gateway.core.budget_door).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import date
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from tidegate.ai import AUTO, AIRequest
from tidegate.config import BudgetConfig
from tidegate.coord.budget import BudgetLedger, Reservation
from tidegate.costs import estimate_cost_micros, estimate_input_tokens, usd_to_micros
from tidegate.dispatch.router import RouteDecision, Router
from tidegate.dispatch.tiers import priced, tier_of
from tidegate.jobs import Job, Priority

if TYPE_CHECKING:  # the worker only reads tenants; the store belongs to the gateway layer
    from tidegate.coord.tenants import TenantStore

__all__ = [
    "TENANT_CACHE_S",
    "Hold",
    "Limits",
    "Spending",
    "Unlimited",
    "cheaper_route",
    "estimated_micros",
    "hold_from_json",
    "hold_to_json",
    "limits_of",
]

TENANT_CACHE_S = 5.0  # how long a tenant's budget is reused before it is read again

Limits = tuple[int | None, int | None]  # (tenant, global) daily limits in micro-USD; None: none


def limits_of(budgets: BudgetConfig, tenant: str, own: Decimal | None) -> Limits:
    """A tenant's and the global daily limits in micros: the tenant's own budget (`own`, from the
    tenant store) over the configured ones."""
    tenant_usd = budgets.tenant_limit_usd(tenant, own)
    return (
        None if tenant_usd is None else usd_to_micros(tenant_usd),
        None if budgets.global_daily_usd is None else usd_to_micros(budgets.global_daily_usd),
    )


def estimated_micros(route: RouteDecision, request: AIRequest, priority: Priority) -> int:
    """The most a call can cost on `route` (its max_tokens included), at the prices of the tier
    it would be sent with: what a reservation holds."""
    model = priced(route.model, route.provider, tier_of(request, route.provider, priority))
    return estimate_cost_micros(model, request.body)


def cheaper_route(router: Router, request: AIRequest, route: RouteDecision,
                  exclude: frozenset[str] = frozenset()) -> RouteDecision | None:
    """The cheapest model that may serve an `auto` chat request, if it is not `route`'s: what the
    `step_down` mode tries when the routed model does not fit the budget left. A model the
    caller named is never swapped (see Router)."""
    if request.kind != "chat" or request.requested_model not in (None, "", AUTO):
        return None
    cheaper = router.cheapest(estimated_input_tokens=estimate_input_tokens(request.body),
                              allowed_models=request.allowed_models, exclude=exclude)
    return None if cheaper is None or cheaper.model.name == route.model.name else cheaper


@dataclass(frozen=True, slots=True)
class Unlimited:
    """A call that no daily limit applies to: nothing is reserved before it (there is nothing
    to refuse), and its cost is recorded once, when it settles."""

    tenant: str


Hold = Reservation | Unlimited
"""What a job's call holds on the ledger while it runs."""


def hold_to_json(hold: Hold | None) -> dict[str, Any] | None:
    """A hold as JSON, for a job whose call outlives its claim (a provider batch): whichever
    worker collects the job settles the hold from it. The ledger keeps a reservation pending by
    its id, so a settle from the stored copy is the same, once-only settle."""
    if hold is None:
        return None
    if isinstance(hold, Unlimited):
        return {"tenant": hold.tenant}
    return {"id": hold.id, "tenant": hold.tenant, "amount_micros": hold.amount_micros,
            "day": hold.day.isoformat(), "enforced": hold.enforced}


def hold_from_json(data: dict[str, Any] | None) -> Hold | None:
    """The hold `hold_to_json` wrote."""
    if data is None:
        return None
    if "id" not in data:
        return Unlimited(str(data["tenant"]))
    return Reservation(str(data["id"]), str(data["tenant"]), int(data["amount_micros"]),
                       date.fromisoformat(data["day"]), bool(data["enforced"]))


class Spending:
    """Reserves, settles and releases a job's estimated cost on the ledger (None: no ledger, and
    nothing is reserved) against the tenant's and the global daily limits."""

    def __init__(self, budgets: BudgetConfig, ledger: BudgetLedger | None,
                 tenants: TenantStore | None) -> None:
        self.budgets = budgets
        self.ledger = ledger
        self._tenants = tenants
        self._tenant_budgets: dict[str, tuple[float, Decimal | None]] = {}  # name → (read at, budget)

    async def limits(self, tenant: str) -> Limits:
        """Daily limits in micros: the tenant's own budget (tenant store) wins over the config."""
        return limits_of(self.budgets, tenant, await self._tenant_budget(tenant))

    async def reserve(self, job: Job, amount_micros: int, limits: Limits) -> Hold:
        """Reserve `amount_micros` for `job` (BudgetExhausted when it does not fit; a CRITICAL job
        is never refused). Without any limit there is nothing to reserve: the hold is Unlimited."""
        assert self.ledger is not None
        tenant_limit, global_limit = limits
        if tenant_limit is None and global_limit is None:
            return Unlimited(job.tenant)
        return await self.ledger.reserve(
            job.tenant, amount_micros, tenant_limit_micros=tenant_limit, global_limit_micros=global_limit,
            enforce=job.priority is not Priority.CRITICAL,
        )

    async def settle(self, hold: Hold | None, spent_micros: int) -> None:
        """Turn a hold into what the call actually cost."""
        if self.ledger is None or hold is None:
            return
        if isinstance(hold, Unlimited):
            await self.ledger.record(hold.tenant, spent_micros)
        else:
            await self.ledger.settle(hold, spent_micros)

    async def release(self, hold: Hold | None) -> None:
        """Give a hold back unspent (the call did not happen or failed)."""
        if self.ledger is not None and isinstance(hold, Reservation):
            await self.ledger.release(hold)

    async def fraction_left(self, tenant: str) -> float | None:
        """The share of the tightest budget still free today (None: no ledger or no limit)."""
        if self.ledger is None:
            return None
        tenant_limit, global_limit = await self.limits(tenant)
        if tenant_limit is None and global_limit is None:
            return None  # nothing to read: the answer is None whatever was spent
        status = await self.ledger.status(
            tenant, tenant_limit_micros=tenant_limit, global_limit_micros=global_limit
        )
        return status.fraction_left

    async def _tenant_budget(self, tenant: str) -> Decimal | None:
        if self._tenants is None:
            return None
        now = time.monotonic()
        cached = self._tenant_budgets.get(tenant)
        if cached is not None and now - cached[0] < TENANT_CACHE_S:
            return cached[1]
        record = await self._tenants.get_tenant(tenant)
        budget = None if record is None else record.daily_budget_usd
        self._tenant_budgets[tenant] = (now, budget)
        return budget
