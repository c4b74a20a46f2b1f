"""Stored records as the API shows them: jobs, tenants and keys."""

from __future__ import annotations

from decimal import Decimal, InvalidOperation

from pydantic import ValidationError

from tidegate.ai import AIResult, result_of
from tidegate.coord.tenants import ApiKeyInfo, Tenant
from tidegate.gateway.core.schemas import JobFailureView, JobView, KeyView, TenantView
from tidegate.jobs import Job, JobState

__all__ = ["failure_view", "job_view", "key_view", "tenant_view"]


def job_view(job: Job) -> JobView:
    """A job with its outcome laid out: model, usage, cost and timings from the worker's result."""
    result = result_of(job) or AIResult(response=None)
    known = {"queue_wait_ms": result.timings.queue_wait_ms,
             "upstream_latency_ms": result.timings.upstream_latency_ms, "ttft_ms": result.timings.ttft_ms}
    timings = {name: value for name, value in known.items() if value is not None}
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
        model=result.model,
        usage=None if result.usage is None else result.usage.to_json(),
        cost_usd=_decimal(result.cost_usd),
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
