"""Stored records as the API shows them: jobs, tenants and keys."""

from __future__ import annotations

from decimal import Decimal, InvalidOperation
from typing import Any

from pydantic import ValidationError

from tidegate.coord.tenants import ApiKeyInfo, Tenant
from tidegate.gateway.schemas import JobFailureView, JobView, KeyView, TenantView
from tidegate.jobs import Job, JobState

__all__ = ["failure_view", "job_view", "key_view", "tenant_view"]

_TIMINGS = ("queue_wait_ms", "upstream_latency_ms", "ttft_ms")


def job_view(job: Job) -> JobView:
    """A job with its outcome laid out: model, usage, cost and timings from the worker's result."""
    result: dict[str, Any] = job.result if isinstance(job.result, dict) else {}
    usage = result.get("usage")
    stored = result.get("response")
    response: dict[str, Any] = stored if isinstance(stored, dict) else {}
    timings: dict[str, float] = {}
    for name in _TIMINGS:
        # A streamed job's worker has kept ttft_ms inside the response document; look there too.
        value = result.get(name, response.get(name))
        if isinstance(value, int | float) and not isinstance(value, bool):
            timings[name] = float(value)
    kind = job.payload.get("kind")
    return JobView(
        id=job.id,
        kind=kind if isinstance(kind, str) else None,
        state=job.state.value,
        priority=job.priority.name.lower(),
        tenant=job.tenant,
        created_at=job.created_at,
        finished_at=job.finished_at,
        deadline=job.deadline,
        retry_at=job.not_before if job.state in (JobState.DELAYED, JobState.FAILED) else None,
        attempts=job.attempts,
        max_attempts=job.max_attempts,
        model=result.get("model") if isinstance(result.get("model"), str) else None,
        usage={k: v for k, v in usage.items() if isinstance(v, int)} if isinstance(usage, dict) else None,
        cost_usd=_decimal(result.get("cost_usd")),
        timings=timings,
        result=job.result,
        last_error=job.last_error,
        errors=list(job.errors),
        failure=failure_view(job),
    )


def failure_view(job: Job) -> JobFailureView | None:
    """The dead job's structured failure, or None when it has none that reads as one (a job
    dead by lease expiry has none; a stored record is checked, not trusted)."""
    if job.failure is None:
        return None
    try:
        return JobFailureView.model_validate(job.failure)
    except ValidationError:
        return None


def _decimal(value: object) -> Decimal | None:
    if not isinstance(value, str):
        return None
    try:
        return Decimal(value)
    except InvalidOperation:
        return None


def tenant_view(tenant: Tenant) -> TenantView:
    """A tenant with its priorities by name."""
    return TenantView(
        name=tenant.name,
        max_priority=tenant.max_priority.name.lower(),
        default_priority=tenant.default_priority.name.lower(),
        rpm=tenant.rpm,
        daily_budget_usd=tenant.daily_budget_usd,
        allowed_models=None if tenant.allowed_models is None else list(tenant.allowed_models),
        admin=tenant.admin,
    )


def key_view(info: ApiKeyInfo) -> KeyView:
    """A key's listing."""
    return KeyView(key_id=info.key_id, tenant=info.tenant, created_at=info.created_at,
                   revoked_at=info.revoked_at)
