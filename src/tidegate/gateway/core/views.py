"""Stored jobs as the API shows them."""

from __future__ import annotations

from decimal import Decimal, InvalidOperation

from pydantic import ValidationError

from tidegate.ai import AIResult, result_of
from tidegate.gateway.core.schemas import JobFailureView, JobView
from tidegate.jobs import Job, JobState

__all__ = ["failure_view", "job_view"]


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
