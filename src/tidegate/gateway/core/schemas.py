"""Request and response models of the HTTP API, for validation and for the OpenAPI document.

The bodies of the OpenAI-compatible endpoints are the OpenAI dialect's
(tidegate.gateway.openai.schemas). Types are strict: a string where a number belongs is
refused, not coerced.
"""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag

from tidegate.gateway.core.limits import (
    MAX_BUDGET_USD,
    MAX_NAME_CHARS,
    MAX_RPM,
)

__all__ = [
    "DeadLetterPage",
    "JobBatch",
    "JobFailureView",
    "JobRequest",
    "JobView",
    "JobsAccepted",
    "JobsRequest",
    "KeyCreated",
    "KeyView",
    "LatencyView",
    "LevelView",
    "ModelDispatchView",
    "ModelList",
    "ModelView",
    "PriorityValue",
    "PurgeResult",
    "RedriveRequest",
    "RedriveResult",
    "StatsView",
    "TenantBody",
    "TenantSpendView",
    "TenantView",
]

PriorityValue = Annotated[
    int | str,
    Field(description="A priority name (critical, high, normal, low, bulk) or level 0-4; "
          "0 = critical is served first.", examples=["high", 1]),
]

class JobRequest(BaseModel):
    """One asynchronous AI job: the OpenAI request body of its kind, plus how to run it."""

    model_config = ConfigDict(
        extra="forbid", strict=True,
        json_schema_extra={"examples": [{
            "kind": "chat", "priority": "bulk", "timeout_s": 3600,
            "callback_url": "https://example.com/hooks/tidegate",
            "body": {"model": "auto", "messages": [{"role": "user", "content": "Tag this product."}]},
        }]},
    )

    kind: Literal["chat", "embeddings", "completion", "moderation"] = Field(description=(
        "The endpoint the body is for: chat, embeddings, or the legacy completion and moderation "
        "(while a provider offers them)."))
    body: dict[str, Any]
    priority: PriorityValue | None = None
    callback_url: str | None = Field(None, max_length=2048, description=(
        "POSTed the finished job, signed (X-Tidegate-Signature). http(s) to a public address."))
    # Bounded: a deadline beyond what the queue can store and read back would poison it.
    timeout_s: float | None = Field(None, gt=0, le=3650 * 86_400, description=(
        "Deadline from now (at most ten years): a job not started by then is never dispatched "
        "(state expired)."))


class JobBatch(BaseModel):
    """Several jobs, enqueued atomically: all or none."""

    model_config = ConfigDict(extra="forbid", strict=True)

    jobs: list[JobRequest] = Field(min_length=1)


def _job_or_batch(value: Any) -> str:
    return "job-batch" if isinstance(value, dict) and "jobs" in value else "single-job"


JobsRequest = Annotated[
    Annotated[JobRequest, Tag("single-job")] | Annotated[JobBatch, Tag("job-batch")],
    Discriminator(_job_or_batch),
]
"""The body of POST /v1/jobs: one job, or `{"jobs": [...]}`."""


class JobsAccepted(BaseModel):
    """Enqueued jobs, in the order given (an Idempotency-Key repeat gives the first job's id)."""

    model_config = ConfigDict(json_schema_extra={"examples": [{"ids": ["9f1c2e..."]}]})

    ids: list[str]


class JobFailureView(BaseModel):
    """How a dead job failed, as its worker recorded it: the status and OpenAI-shaped error that a
    synchronous call waiting for it is answered."""

    model_config = ConfigDict(json_schema_extra={"examples": [{
        "status": 404, "type": "invalid_request_error", "code": "model_not_found",
        "message": "The model 'gpt-9' does not exist.", "param": "model", "upstream_status": 404,
        "model": "gpt-9",
    }]})

    status: int = Field(ge=400, le=599, description=(
        "The HTTP status: the provider's own for a request it refused, 403/404/400 for a routing "
        "refusal, 429 for a spent budget, 502 when retries ran out"))
    type: str
    code: str
    message: str
    param: str | None = None
    upstream_status: int | None = Field(None, description="What the provider answered, if it answered")
    model: str | None = Field(None, description="The model that was called, if one was")


class JobView(BaseModel):
    """A job as its tenant sees it."""

    id: str
    kind: str | None
    state: str = Field(examples=["succeeded"], description=(
        "queued, delayed, leased, succeeded, failed (waiting for a retry), dead, cancelled, expired"))
    priority: str
    tenant: str
    created_at: datetime
    finished_at: datetime | None = None
    deadline: datetime | None = None
    retry_at: datetime | None = Field(None, description=(
        "When a delayed or failed job may run again; `last_error` says why it waits"))
    attempts: int
    max_attempts: int
    model: str | None = None
    usage: dict[str, int] | None = None
    cost_usd: Decimal | None = None
    timings: dict[str, float] = Field(default_factory=dict, description=(
        "queue_wait_ms, upstream_latency_ms, ttft_ms (streams), as known"))
    result: Any = Field(None, description="The worker's full result; `result.response` is the "
                        "provider's answer.")
    last_error: str | None = None
    errors: list[str] = Field(default_factory=list)
    failure: JobFailureView | None = Field(None, description=(
        "A dead job's structured failure, when its worker recorded one"))


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


class ModelView(BaseModel):
    """A model, as OpenAI's GET /v1/models lists it."""

    id: str
    object: Literal["model"] = "model"
    created: int = 0
    owned_by: str
    kind: Literal["chat", "embeddings", "completion", "moderation"]


class ModelList(BaseModel):
    """The models this deployment routes to."""

    object: Literal["list"] = "list"
    data: list[ModelView]


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


class KeyView(BaseModel):
    """An API key as listed: never its secret."""

    key_id: str
    tenant: str
    created_at: datetime
    revoked_at: datetime | None = None


class KeyCreated(KeyView):
    """A new key. `api_key` is shown only in this answer: store it now."""

    api_key: str
