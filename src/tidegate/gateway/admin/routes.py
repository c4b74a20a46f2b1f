"""The admin API (admin tenants only; 403 for others): queue statistics, the dead-letter queue,
tenants and their API keys."""

from __future__ import annotations

import time
from collections import defaultdict
from datetime import UTC, datetime
from typing import Annotated

from fastapi import APIRouter, Body, Query, Response
from pydantic import ValidationError

from tidegate.coord.budget import GLOBAL
from tidegate.coord.tenants import NO_KEY_LIMITS, Tenant
from tidegate.costs import micros_to_usd
from tidegate.gateway.admin.schemas import (
    DeadLetterPage,
    KeyCreated,
    KeyLimitsBody,
    KeyView,
    LatencyView,
    LevelView,
    ModelDispatchView,
    PurgeResult,
    RedriveRequest,
    RedriveResult,
    StatsView,
    TenantBody,
    TenantSpendView,
    TenantView,
)
from tidegate.gateway.admin.views import changed_limits, key_view, tenant_view
from tidegate.gateway.core.auth import AdminDep, StateDep
from tidegate.gateway.core.errors import ApiError, error_responses
from tidegate.gateway.core.limits import MAX_OFFSET, MAX_PAGE
from tidegate.gateway.core.metrics import Percentiles
from tidegate.gateway.core.state import GatewayState
from tidegate.gateway.core.views import job_view
from tidegate.jobs import Priority

__all__ = ["router"]

_NOT_FOUND = error_responses(404)

router = APIRouter(prefix="/v1", tags=["Admin"], responses=error_responses(401, 403, 503, described={
    403: "The key's tenant is not an admin."}))


# Every list is paged; its bounds are in the document.
Limit = Annotated[int, Query(ge=1, le=MAX_PAGE, description="Entries in this page.")]
Offset = Annotated[int, Query(ge=0, le=MAX_OFFSET, description="Entries to skip.")]


def _latency(values: Percentiles) -> LatencyView:
    return LatencyView(p50=values.p50, p99=values.p99, count=values.count)


@router.get("/stats", response_model=StatsView, summary="Queue and traffic statistics")
async def stats(state: StateDep, _: AdminDep) -> StatsView:
    """Depth, oldest wait and in-flight jobs per priority; throughput and p50/p99 waits (in all
    and per priority) over the recent jobs this gateway has seen; spend today per tenant (the
    shared ledger) against its budget, and per model; in-flight calls and 429s per model from
    workers running in this process."""
    snapshot = await state.queue.stats()
    spend = await state.ledger.spend_today()
    recent = state.recent
    return StatsView(
        levels={
            priority.name.lower(): LevelView(
                depth=level.depth, oldest_wait_s=level.oldest_wait_s, in_flight=level.in_flight,
                queue_wait_ms=_latency(recent.queue_wait_ms(int(priority))),
            )
            for priority, level in sorted(snapshot.levels.items())
        },
        depth=snapshot.depth,
        in_flight=snapshot.in_flight,
        delayed=snapshot.delayed,
        dead=snapshot.dead,
        throughput_last_minute=recent.throughput(60.0),
        queue_wait_ms=_latency(recent.queue_wait_ms()),
        upstream_latency_ms=_latency(recent.upstream_latency_ms()),
        spend_today_usd={tenant: micros_to_usd(micros) for tenant, micros in sorted(spend.items())},
        spend_today_by_model_usd={
            model: micros_to_usd(micros) for model, micros in sorted(recent.spend_by_model_micros().items())
        },
        budgets_today=await _budgets_today(state, spend),
        dispatch_by_model=_dispatch_by_model(state),
    )


async def _budgets_today(state: GatewayState, spend: dict[str, int]) -> dict[str, TenantSpendView]:
    """Each tenant that spent today or has a budget, with the global total under GLOBAL."""
    budgets = state.config.budgets

    limits = {tenant.name: budgets.tenant_limit_usd(tenant.name, tenant.daily_budget_usd)
              for tenant in await state.tenants.list_tenants()}
    for name in (*budgets.tenant_daily_usd, *spend):
        if name != GLOBAL and name not in limits:
            limits[name] = budgets.tenant_limit_usd(name)
    rows = {
        name: TenantSpendView(spent_usd=micros_to_usd(spend.get(name, 0)), daily_budget_usd=budget)
        for name, budget in sorted(limits.items())
        if budget is not None or name in spend
    }
    if budgets.global_daily_usd is not None or GLOBAL in spend:
        rows[GLOBAL] = TenantSpendView(spent_usd=micros_to_usd(spend.get(GLOBAL, 0)),
                                       daily_budget_usd=budgets.global_daily_usd)
    return rows


# Sample names of DispatchMetrics read by /v1/stats (prometheus_client adds _total to counters).
_IN_FLIGHT = "tidegate_in_flight"
_THROTTLED = "tidegate_upstream_429_total"
_JOBS = "tidegate_jobs_total"
_LIMIT = "tidegate_concurrency_limit"
_PAUSED = "tidegate_limiter_paused_until_seconds"


def _dispatch_by_model(state: GatewayState) -> dict[str, ModelDispatchView] | None:
    """Per model, summed over the DispatchMetrics registries of the workers in this process
    (None when there is none: a gateway alone cannot see workers elsewhere)."""
    found = False
    values: defaultdict[str, defaultdict[str, float]] = defaultdict(lambda: defaultdict(float))
    jobs: defaultdict[str, defaultdict[str, int]] = defaultdict(lambda: defaultdict(int))
    for registry in state.extra_registries:
        for family in registry.collect():
            found = found or family.name == _IN_FLIGHT
            for sample in family.samples:
                model = sample.labels.get("model")
                if model is None:
                    continue
                if sample.name == _JOBS:
                    jobs[model][sample.labels["outcome"]] += int(sample.value)
                elif sample.name in (_IN_FLIGHT, _THROTTLED, _LIMIT):
                    values[model][sample.name] += sample.value  # several workers: their sum
                elif sample.name == _PAUSED:
                    values[model][_PAUSED] = max(values[model][_PAUSED], sample.value)
    if not found:
        return None
    now = time.time()
    views = {}
    for model in sorted({*state.models, *values, *jobs}):
        known = values[model]
        paused = known.get(_PAUSED, 0.0)
        views[model] = ModelDispatchView(
            in_flight=int(known.get(_IN_FLIGHT, 0)),
            throttled_429=int(known.get(_THROTTLED, 0)),
            jobs=dict(jobs[model]),
            concurrency_limit=None if known.get(_LIMIT) is None else int(known[_LIMIT]),
            paused_until=datetime.fromtimestamp(paused, UTC) if paused > now else None,
        )
    return views


# ---------------------------------------------------------------------- dead letters


@router.get("/dlq", response_model=DeadLetterPage, summary="List dead letters",
            responses=error_responses(400))
async def list_dead_letters(
    state: StateDep,
    _: AdminDep,
    limit: Limit = 100,
    offset: Offset = 0,
) -> DeadLetterPage:
    """Dead jobs, most recent first, with their errors."""
    dead = await state.queue.dead_letters(limit=limit, offset=offset)
    return DeadLetterPage(data=[job_view(job) for job in dead], limit=limit, offset=offset)


@router.post("/dlq/redrive", response_model=RedriveResult, summary="Redrive dead letters",
             responses=error_responses(400, 413))
async def redrive(body: RedriveRequest, state: StateDep, _: AdminDep) -> RedriveResult:
    """Put dead jobs (the `ids`, or `all`) back in the queue at their own priority."""
    if body.all == (body.ids is not None):
        raise ApiError(400, "give `ids` or `all: true` (one of them)", code="invalid_request")
    return RedriveResult(redriven=await state.queue.redrive(None if body.all else body.ids))


@router.delete("/dlq", response_model=PurgeResult, summary="Purge dead letters",
               responses=error_responses(400))
async def purge(
    state: StateDep,
    _: AdminDep,
    ids: Annotated[list[str] | None, Query(description="Dead job ids to delete.")] = None,
    older_than_s: Annotated[float | None, Query(ge=0, le=3650 * 86_400, description=(
        "Delete those dead for longer (at most ten years)."))] = None,
    all_: Annotated[bool, Query(alias="all", description="Delete every dead letter.")] = False,
) -> PurgeResult:
    """Delete dead letters: the `ids`, those older than `older_than_s`, or `all`."""
    chosen = sum((ids is not None, older_than_s is not None, all_))
    if chosen != 1:
        raise ApiError(400, "give exactly one of `ids`, `older_than_s` or `all=true`", code="invalid_request")
    return PurgeResult(purged=await state.queue.purge_dead(ids, older_than_s=older_than_s))


# ---------------------------------------------------------------------- tenants and keys


@router.get("/admin/tenants", response_model=list[TenantView], summary="List tenants",
            responses=error_responses(400))
async def list_tenants(
    state: StateDep, _: AdminDep, limit: Limit = MAX_PAGE, offset: Offset = 0
) -> list[TenantView]:
    """Tenants by name, a page at a time."""
    tenants = await state.tenants.list_tenants()
    return [tenant_view(tenant) for tenant in tenants[offset:offset + limit]]


@router.get("/admin/tenants/{name}", response_model=TenantView, summary="Get a tenant",
            responses=_NOT_FOUND)
async def get_tenant(name: str, state: StateDep, _: AdminDep) -> TenantView:
    """One tenant."""
    tenant = await state.tenants.get_tenant(name)
    if tenant is None:
        raise ApiError(404, f"no tenant named {name!r}", code="tenant_not_found")
    return tenant_view(tenant)


@router.put("/admin/tenants/{name}", response_model=TenantView, summary="Create or replace a tenant",
            responses=error_responses(400, 413))
async def put_tenant(
    name: str, body: Annotated[TenantBody, Body()], state: StateDep, _: AdminDep
) -> TenantView:
    """Create the tenant, or replace all its settings."""
    try:
        tenant = Tenant(
            name=name,
            max_priority=Priority.parse(body.max_priority),
            default_priority=Priority.parse(body.default_priority),
            rpm=body.rpm,
            daily_budget_usd=body.daily_budget_usd,
            allowed_models=None if body.allowed_models is None else tuple(body.allowed_models),
            admin=body.admin,
        )
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise ApiError(400, f"invalid tenant: {problems}", code="invalid_tenant") from None
    if not tenant.may_use(tenant.default_priority):
        raise ApiError(400, "default_priority must not be above max_priority", code="invalid_tenant",
                       param="default_priority")
    await state.tenants.put_tenant(tenant)
    return tenant_view(tenant)


@router.post("/admin/tenants/{name}/keys", status_code=201, response_model=KeyCreated,
             summary="Create an API key", responses=error_responses(400, 404, 413))
async def create_key(
    name: str, state: StateDep, _: AdminDep, body: Annotated[KeyLimitsBody | None, Body()] = None,
) -> KeyCreated:
    """A new key for the tenant, with the limits of its own the body gives (none without a
    body). The full key is in this answer only: it is never stored."""
    limits = NO_KEY_LIMITS if body is None else changed_limits(NO_KEY_LIMITS, body)
    info, api_key = await state.tenants.create_key(name, limits)
    return KeyCreated(**key_view(info).model_dump(), api_key=api_key)


@router.get("/admin/keys/{key_id}", response_model=KeyView, summary="Get an API key", responses=_NOT_FOUND)
async def get_key(key_id: str, state: StateDep, _: AdminDep) -> KeyView:
    """One key, revoked or not, without its secret."""
    info = await state.tenants.get_key(key_id)
    if info is None:
        raise ApiError(404, f"no key with id {key_id!r}", code="key_not_found")
    return key_view(info)


@router.patch("/admin/keys/{key_id}", response_model=KeyView, summary="Change an API key's limits",
              responses=error_responses(400, 404, 413))
async def change_key(key_id: str, body: Annotated[KeyLimitsBody, Body()], state: StateDep,
                     _: AdminDep) -> KeyView:
    """Change the limits the body gives (null: back to the tenant's), keep the others. Takes
    effect at once on this gateway, within seconds on the others."""
    info = await state.tenants.change_key_limits(key_id, lambda limits: changed_limits(limits, body))
    if info is None:
        raise ApiError(404, f"no active key with id {key_id!r}", code="key_not_found")
    return key_view(info)


@router.get("/admin/keys", response_model=list[KeyView], summary="List API keys",
            responses=error_responses(400))
async def list_keys(
    state: StateDep,
    _: AdminDep,
    tenant: Annotated[str | None, Query(description="Only this tenant's keys.")] = None,
    limit: Limit = MAX_PAGE,
    offset: Offset = 0,
) -> list[KeyView]:
    """Keys, newest first, without their secrets, a page at a time."""
    keys = await state.tenants.list_keys(tenant)
    return [key_view(info) for info in keys[offset:offset + limit]]


@router.delete("/admin/keys/{key_id}", status_code=204, summary="Revoke an API key", responses=_NOT_FOUND)
async def revoke_key(key_id: str, state: StateDep, _: AdminDep) -> Response:
    """Revoke a key: it stops working at once on this gateway, within seconds on the others."""
    if not await state.tenants.revoke_key(key_id):
        raise ApiError(404, f"no active key with id {key_id!r}", code="key_not_found")
    return Response(status_code=204)
