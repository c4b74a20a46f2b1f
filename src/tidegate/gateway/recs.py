"""The recommendations API, mounted by the gateway under /v1 with the same keys as the rest of it
(any tenant's):

- `GET /v1/recommendations/{user_id}`: a user's top items, filtered and optionally explained;
- `POST /v1/recommendations:batch`: up to 100 users at once, each with its own query;
- `POST /v1/profiles/{user_id}/interactions`: direct ingestion for applications that do not go
  through the database; the same `record` path the change flow's events take;
- `GET /v1/health`: the model's size and freshness.

Profiles are per tenant (see `profile_id`): a tenant reads and writes only its own users. The
change flow's profiles, built from the database, which knows no tenant, are the operator's: admin
tenants (and the local tenant of embedded mode) address them, as the database's user ids. Items
and the signals between them (co-occurrence, trending) are one shared model: one catalogue.
Recording interactions is counted against the tenant's rate limit, like every call that writes.

The recommender comes from the GatewayState (`state.recommender`); a gateway without one answers
503 saying so. Bad input answers 400 naming what is wrong, unknown query parameters included
(FastAPI would silently ignore a misspelt filter, and the caller would get unfiltered items).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, Path, Query, Request

from tidegate.coord.tenants import Tenant
from tidegate.errors import CacheUnavailable, InvalidRecsInput
from tidegate.gateway.core.auth import MeteredTenantDep, StateDep, TenantDep, is_admin
from tidegate.gateway.core.errors import ApiError, error_responses
from tidegate.gateway.core.state import GatewayState
from tidegate.recs.engine import Recommender
from tidegate.recs.model import Interaction, InteractionKind, RecQuery, RecResult
from tidegate.recs.schemas import (
    ID_MAX_LENGTH,
    MAX_CATEGORIES,
    MAX_N,
    USER_ID_PATTERN,
    Category,
    FreshnessView,
    HealthView,
    InteractionIn,
    InteractionsAccepted,
    InteractionsRequest,
    RecommendationsBatch,
    RecommendationsBatchResult,
    RecommendationsQuery,
    RecommendationsView,
    RecommendationView,
)

__all__ = ["FUTURE_SKEW_S", "TENANT_SEPARATOR", "profile_id", "router"]

FUTURE_SKEW_S = 300.0  # an interaction may be this far ahead of the gateway's clock (clock skew)
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)  # and no older than this

router = APIRouter(prefix="/v1", tags=["Recommendations"], responses=error_responses(
    400, 401, described={503: "No recommender is configured on this gateway, or its store cannot "
                              "be reached."}))

# Between a tenant's name and its user's id in the recommender's store; refused in user ids, so
# no id given to the API can name another tenant's user.
TENANT_SEPARATOR = "\x1f"
UserId = Annotated[str, Path(min_length=1, max_length=ID_MAX_LENGTH, pattern=USER_ID_PATTERN,
                             description="The user's id (no control characters).", examples=["17850"])]


def profile_id(tenant: Tenant, user_id: str) -> str:
    """The recommender's id of the tenant's user: the user id itself for an admin tenant (the
    database's users, which the change flow feeds), else the id prefixed with the tenant's name,
    so that tenants never read or write each other's profiles, nor the database's."""
    if TENANT_SEPARATOR in user_id:
        raise ApiError(400, "a user id must not contain control characters", code="invalid_request",
                       param="user_id")
    return user_id if is_admin(tenant) else f"{tenant.name}{TENANT_SEPARATOR}{user_id}"


# -- shared checks --------------------------------------------------------------------------


def _only_query(*allowed: str) -> Any:
    """A dependency refusing query parameters other than `allowed`, naming them (after the key
    is checked: a caller without one learns nothing of the API)."""

    async def check(request: Request, _: TenantDep) -> None:  # async: no thread-pool hop
        unknown = sorted({name for name in request.query_params if name not in allowed})
        if unknown:
            known = f"; known: {', '.join(allowed)}" if allowed else "; this operation takes none"
            raise ApiError(400, f"unknown query parameter(s): {', '.join(unknown)}{known}",
                           code="unknown_parameter", param=unknown[0])

    return Depends(check)


def recommender_of(state: GatewayState) -> Recommender:
    """The gateway's recommender; 503 when it has none."""
    if state.recommender is None:
        raise ApiError(503, "recommendations are not configured on this gateway: run it under "
                       "`tidegate up`, or point the change flow's cache at Redis "
                       "(sync.cache_url) so gateways share the recommender's state",
                       code="recommender_not_configured")
    return state.recommender


@contextlib.contextmanager
def _answering(where: str = "") -> Iterator[None]:
    """The recommender's refusals as 400s, its store's outages as 503s."""
    try:
        yield
    except InvalidRecsInput as exc:
        error = ApiError(400, str(exc), code="invalid_request")
        raise (error.located(where) if where else error) from None
    except CacheUnavailable as exc:
        raise ApiError(503, f"the recommender's store cannot be reached: {exc}",
                       code="recommender_unavailable") from None


def _query(user_id: str, fields: RecommendationsQuery, max_n: int) -> RecQuery:
    """The engine's query for validated fields, with the checks that span fields."""
    if fields.n > max_n:
        raise ApiError(400, f"n {fields.n} is over this recommender's maximum of {max_n}",
                       code="invalid_request", param="n")
    if fields.min_price is not None and fields.max_price is not None and fields.min_price > fields.max_price:
        raise ApiError(400, f"min_price {fields.min_price:g} is above max_price {fields.max_price:g}",
                       code="invalid_request", param="min_price")
    return RecQuery(user_id=user_id, n=fields.n, context=fields.context, categories=tuple(fields.categories),
                    min_price=fields.min_price, max_price=fields.max_price, explain=fields.explain,
                    diversity=fields.diversity)


def _view(result: RecResult, user_id: str) -> RecommendationsView:
    return RecommendationsView(
        user_id=user_id, cold_start=result.cold_start, generated_at=result.generated_at,
        items=[RecommendationView(item_id=r.item_id, score=r.score, signals=dict(r.signals), reason=r.reason)
               for r in result.items])


# -- routes ---------------------------------------------------------------------------------


@router.get("/recommendations/{user_id}", response_model=RecommendationsView,
            summary="A user's recommendations",
            dependencies=[_only_query("n", "context", "category", "min_price", "max_price", "explain",
                                      "diversity")])
async def recommendations(  # noqa: PLR0913 (a route: each parameter is a query parameter FastAPI reads)
    user_id: UserId,
    state: StateDep,
    tenant: TenantDep,
    n: Annotated[int, Query(ge=1, le=MAX_N, description="How many items.")] = 10,
    context: Annotated[str | None, Query(min_length=1, max_length=ID_MAX_LENGTH, description=(
        "An item the user is looking at: its neighbours become candidates, and on a cold start its "
        "category frames the trending."))] = None,
    category: Annotated[list[Category] | None, Query(max_length=MAX_CATEGORIES, description=(
        "Only items in one of these categories (repeat the parameter for several)."))] = None,
    min_price: Annotated[float | None, Query(ge=0, allow_inf_nan=False)] = None,
    max_price: Annotated[float | None, Query(ge=0, allow_inf_nan=False)] = None,
    explain: Annotated[bool, Query(description="Give each item a short reason.")] = False,
    diversity: Annotated[float, Query(ge=0, le=1, allow_inf_nan=False, description=(
        "0: pure score order; up to 1: items like those above them are pushed down."))] = 0.0,
) -> RecommendationsView:
    """The user's top `n` items by the blended score (profile similarity, co-occurrence with
    their recent items and the context item, trending), in stock, within the filters, without
    what they already bought. An unknown user gets what is trending (in the context's or the
    filter's category), marked `cold_start`."""
    recommender = recommender_of(state)
    fields = RecommendationsQuery.model_construct(
        user_id=user_id, n=n, context=context, categories=category or [], min_price=min_price,
        max_price=max_price, explain=explain, diversity=diversity)
    query = _query(profile_id(tenant, user_id), fields, recommender.settings.max_n)
    with _answering():
        return _view(await recommender.recommend(query), user_id)


@router.post("/recommendations:batch", response_model=RecommendationsBatchResult,
             summary="Several users' recommendations", dependencies=[_only_query()])
async def recommendations_batch(
    batch: Annotated[RecommendationsBatch, Body(openapi_examples={
        "two users": {"summary": "Two users", "value": {"queries": [
            {"user_id": "17850", "n": 3}, {"user_id": "13047", "n": 3, "categories": ["kitchen"],
                                          "explain": True}]}}})],
    state: StateDep,
    tenant: TenantDep,
) -> RecommendationsBatchResult:
    """Up to 100 queries, each with the fields of GET /v1/recommendations/{user_id} plus its
    `user_id` (the category filter as the list `categories`), answered in order."""
    recommender = recommender_of(state)
    queries = []
    for index, fields in enumerate(batch.queries):
        try:
            queries.append(_query(profile_id(tenant, fields.user_id), fields, recommender.settings.max_n))
        except ApiError as exc:
            raise exc.located(f"queries.{index}") from None
    results = []
    for index, (query, fields) in enumerate(zip(queries, batch.queries, strict=True)):
        with _answering(f"queries.{index}"):
            results.append(_view(await recommender.recommend(query), fields.user_id))
    return RecommendationsBatchResult(results=results)


@router.post("/profiles/{user_id}/interactions", response_model=InteractionsAccepted,
             summary="Record a user's interactions", dependencies=[_only_query()])
async def record_interactions(
    user_id: UserId,
    body: Annotated[InteractionsRequest, Body(openapi_examples={
        "one": {"summary": "One interaction", "value": {"item_id": "85123A", "kind": "view"}},
        "several": {"summary": "Several, with their times", "value": [
            {"item_id": "85123A", "kind": "add_to_cart", "quantity": 2, "at": "2026-01-01T12:00:00Z"},
            {"item_id": "85123A", "kind": "purchase", "quantity": 2, "at": "2026-01-01T12:03:00Z"}]},
    })],
    state: StateDep,
    tenant: MeteredTenantDep,
) -> InteractionsAccepted:
    """Record what the user did (one interaction, or a list of up to 1,000), all or none: the
    same path the change flow's interaction events take, so the user's next recommendations
    reflect it. `at` defaults to now and may be at most five minutes ahead of the gateway's
    clock. Counted against the tenant's requests-per-minute limit."""
    recommender = recommender_of(state)
    given = body if isinstance(body, list) else [body]
    stored_id = profile_id(tenant, user_id)
    interactions = _interactions(stored_id, given, listed=isinstance(body, list))
    with _answering():
        await recommender.record(interactions)
    if state.recs_monitor is not None:
        state.recs_monitor.activity.add(stored_id, len(interactions))
        state.recs_monitor.interactions.labels("api").inc(len(interactions))
    return InteractionsAccepted(user_id=user_id, recorded=len(interactions))


def _interactions(user_id: str, given: Sequence[InteractionIn], *, listed: bool) -> list[Interaction]:
    now = datetime.now(UTC)
    latest = now + timedelta(seconds=FUTURE_SKEW_S)
    made = []
    for index, entry in enumerate(given):
        where = f"interactions.{index}.at" if listed else "interaction.at"
        at = now
        if entry.at is not None:
            try:
                at = entry.at.astimezone(UTC)
            except OverflowError:  # e.g. 0001-01-01 at +14:00 is before year 1 in UTC
                at = EPOCH - timedelta(seconds=1)
            if not EPOCH <= at <= latest:
                raise ApiError(400, f"{where}: {entry.at.isoformat()} is not between 1970-01-01T00:00:00Z "
                               f"and {FUTURE_SKEW_S:.0f} s ahead of the gateway's clock",
                               code="invalid_request", param=where)
        made.append(Interaction(user_id=user_id, item_id=entry.item_id, kind=InteractionKind(entry.kind),
                                at=at, quantity=entry.quantity))
    return made


@router.get("/health", response_model=HealthView, summary="The recommender's freshness",
            dependencies=[_only_query()])
async def health(state: StateDep, tenant: TenantDep) -> HealthView:
    """How many items and user profiles the recommender holds, when its model last changed and
    how long ago; with a change flow in this process, the commit → recommendation-updated
    latency (p50/p99) and the most active user lately."""
    recommender = recommender_of(state)
    with _answering():
        report = dict(await recommender.health())
    view = health_view(report)
    monitor = state.recs_monitor
    if monitor is not None:
        freshness = monitor.freshness()
        view.commit_to_updated = FreshnessView(p50_ms=freshness.p50_ms, p99_ms=freshness.p99_ms,
                                               count=freshness.count)
        # A user id is a tenant's own: only the operator sees whose it is.
        view.most_active_user = monitor.activity.most_active() if is_admin(tenant) else None
    return view


_HEALTH_FIELDS = ("items", "users", "last_update_at", "seconds_since_update")


def health_view(report: dict[str, Any]) -> HealthView:
    """The recommender's health report as the API shows it (what it reports beyond the known
    fields goes into `details`)."""
    last = report.get("last_update_at")
    since = report.get("seconds_since_update", report.get("freshness_s"))
    return HealthView(
        status="ok",
        items=_count(report.get("items")),
        users=_count(report.get("users")),
        last_update_at=datetime.fromisoformat(last) if isinstance(last, str) else
        last if isinstance(last, datetime) else None,
        seconds_since_update=float(since) if isinstance(since, int | float) and not isinstance(since, bool)
        else None,
        details={k: v for k, v in report.items() if k not in (*_HEALTH_FIELDS, "freshness_s")},
    )


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None
