"""The admin API's bodies: statistics, dead letters, tenants and keys, for validation and for the
OpenAPI document. Types are strict: a string where a number belongs is refused, not coerced."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from typing import Annotated

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field

from tidegate.gateway.core.limits import MAX_BUDGET_USD, MAX_NAME_CHARS, MAX_RPM
from tidegate.gateway.core.schemas import JobView, PriorityValue

__all__ = [
    "DeadLetterPage",
    "KeyCreated",
    "KeyLimitsBody",
    "KeyLimitsView",
    "KeyView",
    "LatencyView",
    "LevelView",
    "ModelDispatchView",
    "PurgeResult",
    "RedriveRequest",
    "RedriveResult",
    "StatsView",
    "TenantBody",
    "TenantSpendView",
    "TenantView",
]


class DeadLetterPage(BaseModel):
    """A page of dead letters, most recent first."""

    data: list[JobView]
    limit: int
    offset: int


class RedriveRequest(BaseModel):
    """Which dead letters to put back: `ids`, or `all: true`."""

    model_config = ConfigDict(extra="forbid", strict=True,
                              json_schema_extra={"examples": [{"ids": ["9f1c2e..."]}, {"all": True}]})

    ids: list[str] | None = None
    all: bool = False


class RedriveResult(BaseModel):
    """How many dead letters went back into the queue."""

    redriven: int


class PurgeResult(BaseModel):
    """How many dead letters were deleted."""

    purged: int


class LatencyView(BaseModel):
    """p50/p99 in milliseconds over `count` recent jobs (None without any)."""

    p50: float | None
    p99: float | None
    count: int


def _no_latency() -> LatencyView:
    return LatencyView(p50=None, p99=None, count=0)


class LevelView(BaseModel):
    """One priority level of the queue."""

    depth: int
    oldest_wait_s: float
    in_flight: int
    queue_wait_ms: LatencyView = Field(default_factory=_no_latency, description=(
        "p50/p99 queue wait of this level's recent jobs seen by this gateway"))


class ModelDispatchView(BaseModel):
    """One model as the workers running in the gateway's process see it. Counts run from the
    workers' start."""

    in_flight: int = Field(description="Provider calls under way")
    throttled_429: int = Field(description="429 answers from the provider")
    jobs: dict[str, int] = Field(description="Jobs by outcome: succeeded, retried, dead, lease_lost")
    concurrency_limit: int | None = Field(None, description="Adaptive concurrency limit, when known")
    paused_until: datetime | None = Field(None, description="Paused after a 429 until then, if paused")


class TenantSpendView(BaseModel):
    """Spend today (UTC) against a daily budget."""

    spent_usd: Decimal = Field(description="Spent or reserved today, from the shared budget ledger")
    daily_budget_usd: Decimal | None = Field(description="The daily budget; None is unlimited")


class StatsView(BaseModel):
    """The queue now, and what this gateway has seen lately."""

    levels: dict[str, LevelView]
    depth: int
    in_flight: int
    delayed: int
    dead: int
    throughput_last_minute: int = Field(description=(
        "Succeeded jobs seen by this gateway that finished in the last 60 s"))
    queue_wait_ms: LatencyView
    upstream_latency_ms: LatencyView
    spend_today_usd: dict[str, Decimal] = Field(description=(
        "Per tenant from the shared budget ledger ('*' is the total); empty when no budget is "
        "configured, as workers then keep no ledger"))
    spend_today_by_model_usd: dict[str, Decimal] = Field(description=(
        "Per model, from the results this gateway has seen today"))
    budgets_today: dict[str, TenantSpendView] = Field(default_factory=dict, description=(
        "Per tenant that spent today or has a daily budget (tenant store, else config), with the "
        "global total and budget under '*'"))
    dispatch_by_model: dict[str, ModelDispatchView] | None = Field(None, description=(
        "In-flight calls, 429s and outcomes per model from the workers running in this gateway's "
        "process (`tidegate up`); None when none does"))


class TenantBody(BaseModel):
    """A tenant's settings (its name is in the URL). PUT replaces them all: a field left out
    takes its default."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{
        "max_priority": "high", "default_priority": "normal", "rpm": 600,
        "daily_budget_usd": "25.00", "allowed_models": ["gpt-4.1", "deepseek-v3.2"], "admin": False,
    }]})

    max_priority: PriorityValue = "high"
    default_priority: PriorityValue = "normal"
    rpm: int | None = Field(None, gt=0, le=MAX_RPM)
    daily_budget_usd: Decimal | None = Field(None, ge=0, le=MAX_BUDGET_USD, allow_inf_nan=False)
    # Bounded like any name: a constrained string is also checked to be valid Unicode (a lone
    # surrogate would be stored, and then fail every answer that shows the tenant).
    allowed_models: list[Annotated[str, Field(min_length=1, max_length=MAX_NAME_CHARS)]] | None = None
    admin: bool = False


class TenantView(BaseModel):
    """A tenant as the admin API shows it."""

    name: str
    max_priority: str
    default_priority: str
    rpm: int | None
    daily_budget_usd: Decimal | None
    allowed_models: list[str] | None
    admin: bool


ModelName = Annotated[str, Field(min_length=1, max_length=MAX_NAME_CHARS)]


class KeyLimitsBody(BaseModel):
    """A key's own limits, inside its tenant's (the stricter of the two wins). Creating a key
    sets those given; PATCH changes those given (null: back to the tenant's) and keeps the rest.
    A field this API does not know is refused, never ignored."""

    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra={"examples": [{
        "rpm": 60, "allowed_models": ["deepseek-v3.2"], "max_priority": "normal",
        "expires_at": "2027-01-31T00:00:00Z",
    }]})

    rpm: int | None = Field(None, gt=0, le=MAX_RPM, description=(
        "Requests per minute of this key that create work; 429 with Retry-After over it."))
    allowed_models: list[ModelName] | None = Field(None, description=(
        "Models this key may use, among its tenant's."))
    max_priority: PriorityValue | None = Field(None, description=(
        "The most urgent priority this key may ask for; the less urgent of the key's and the "
        "tenant's wins."))
    # JSON has no datetime: an ISO 8601 string (with its zone) is what strictness allows here.
    expires_at: AwareDatetime | None = Field(None, strict=False, description=(
        "From then on the key answers 401 with code `expired_api_key`."))


class KeyLimitsView(BaseModel):
    """A key's own limits; null: its tenant's."""

    rpm: int | None = None
    allowed_models: list[str] | None = None
    max_priority: str | None = None
    expires_at: datetime | None = None


class KeyView(BaseModel):
    """An API key as listed: never its secret."""

    key_id: str
    tenant: str
    created_at: datetime
    revoked_at: datetime | None = None
    limits: KeyLimitsView = Field(default_factory=KeyLimitsView)


class KeyCreated(KeyView):
    """A new key. `api_key` is shown only in this answer: store it now."""

    api_key: str
