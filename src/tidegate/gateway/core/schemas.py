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

__all__ = [
    "JobBatch",
    "JobFailureView",
    "JobRequest",
    "JobView",
    "JobsAccepted",
    "JobsRequest",
    "ModelList",
    "ModelView",
    "PriorityValue",
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
    usage: dict[str, Any] | None = Field(None, description=(
        "prompt_tokens, completion_tokens, total_tokens; prompt_tokens_details (cached_tokens, "
        "cache_write_tokens and cache_write_tokens_details.ttl_5m_tokens / ttl_1h_tokens) and "
        "completion_tokens_details (reasoning_tokens) when there were any"))
    cost_usd: Decimal | None = None
    timings: dict[str, float] = Field(default_factory=dict, description=(
        "queue_wait_ms, upstream_latency_ms, ttft_ms (streams), as known"))
    result: Any = Field(None, description="The worker's full result; `result.response` is the "
                        "provider's answer.")
    last_error: str | None = None
    errors: list[str] = Field(default_factory=list)
    failure: JobFailureView | None = Field(None, description=(
        "A dead job's structured failure, when its worker recorded one"))


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


