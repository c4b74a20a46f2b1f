"""A synchronous call that the daily budget cannot serve is answered at once: 429 with the code
`budget_exhausted` (or `budget_exceeds_limit` for a call above the whole daily limit), in the
API's own error shape, with Retry-After until the budgets start afresh, and nothing is queued.

The check reads the tenant's and the global spend today (one ledger read, only where a limit
applies), routes the request as a worker will with the budget left, and estimates its cost as a
worker reserves it (max_tokens included); in `step_down` mode the cheapest model is tried too.
It reserves nothing: calls that pass it together may still find no room when a worker reserves
for them, and the worker then ends their jobs at once with the same answer (a job a caller waits
for is never deferred: tidegate.coord.budget.budget_outcome). Asynchronous jobs (/v1/jobs,
batches, background responses) are not checked here: `budgets.on_exhausted` decides what becomes
of them, since waiting is what their caller asked for. CRITICAL calls are never refused, as no
worker refuses them.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime

from tidegate.ai import AIRequest
from tidegate.config import BudgetConfig
from tidegate.coord.budget import BUDGET_EXHAUSTED, RefusedCall, budget_outcome, seconds_to_next_day
from tidegate.coord.tenants import Tenant
from tidegate.costs import estimate_input_tokens
from tidegate.dispatch.spending import cheaper_route, estimated_micros, limits_of
from tidegate.errors import BudgetExhausted, RoutingError
from tidegate.gateway.core.errors import ApiError
from tidegate.gateway.core.state import GatewayState
from tidegate.jobs import Priority

__all__ = ["budget_headers", "refuse_over_budget"]

# The OpenAI error type of a budget's refusal, as a worker records it (tidegate.dispatch.failures).
BUDGET_ERROR_TYPE = "insufficient_quota"


def budget_headers(code: str) -> dict[str, str]:
    """A call a budget refused: the OpenAI SDKs are told not to retry (`x-should-retry`), since the
    same request meets the same budget; a spent budget says when it starts afresh (Retry-After,
    seconds to the next UTC midnight)."""
    if code == BUDGET_EXHAUSTED:
        next_day_s = seconds_to_next_day(datetime.now(UTC))
        return {"x-should-retry": "false", "Retry-After": str(max(1, math.ceil(next_day_s)))}
    if code.startswith("budget_"):
        return {"x-should-retry": "false"}
    return {}


async def refuse_over_budget(state: GatewayState, tenant: Tenant, request: AIRequest,
                             priority: Priority) -> None:
    """Raise the 429 ApiError that answers a synchronous call the budget has no room for now;
    return when it fits, when no daily limit applies, or for a CRITICAL call. `request` is the
    checked request the job will carry (tidegate.gateway.core.intake.draft_job)."""
    budgets = state.config.budgets
    tenant_limit, global_limit = limits_of(budgets, tenant.name, tenant.daily_budget_usd)
    if (tenant_limit is None and global_limit is None) or priority is Priority.CRITICAL:
        return
    status = await state.ledger.status(tenant.name, tenant_limit_micros=tenant_limit,
                                       global_limit_micros=global_limit)
    try:
        route = state.router.route(
            kind=request.kind, requested_model=request.requested_model, priority=priority,
            estimated_input_tokens=estimate_input_tokens(request.body),
            budget_fraction_left=status.fraction_left, allowed_models=request.allowed_models)
    except RoutingError:
        return  # not the budget's to answer: the intake's model checks are, or the worker's
    amount = estimated_micros(route, request, priority)
    refusal = status.refusal(amount)
    if refusal is not None and budgets.on_exhausted == "step_down":
        cheaper = cheaper_route(state.router, request, route)
        if cheaper is not None:
            amount = estimated_micros(cheaper, request, priority)
            refusal = status.refusal(amount)
    if refusal is not None:
        raise _answer(refusal, amount, tenant, budgets)


def _answer(refusal: BudgetExhausted, amount_micros: int, tenant: Tenant, budgets: BudgetConfig) -> ApiError:
    """The error a worker would record for the call's job, had it been queued."""
    now = datetime.now(UTC)
    refused = RefusedCall(amount_micros, tenant.name, created_at=now, caller_waits=True)
    outcome = budget_outcome(refusal, refused, budgets, now)
    return ApiError(429, outcome.message, code=outcome.reason, type_=BUDGET_ERROR_TYPE,
                    headers=budget_headers(outcome.reason))
