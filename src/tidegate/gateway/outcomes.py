"""What a client is told about a job it waited for: the provider's answer with tidegate's headers,
or an OpenAI-shaped error that says how the job ended."""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import Any

from tidegate.coord.budget import seconds_to_next_day
from tidegate.gateway.errors import ApiError
from tidegate.gateway.views import failure_view
from tidegate.jobs import Job, JobState

__all__ = ["failure_of", "result_headers", "shutting_down"]


def result_headers(job: Job) -> dict[str, str]:
    """X-Tidegate-* headers describing a finished job."""
    headers = {"X-Tidegate-Job-Id": job.id, "X-Tidegate-Priority": job.priority.name.lower()}
    result: dict[str, Any] = job.result if isinstance(job.result, dict) else {}
    for header, field in (("X-Tidegate-Model", "model"), ("X-Tidegate-Cost-Usd", "cost_usd")):
        if isinstance(result.get(field), str):
            headers[header] = result[field]
    for header, field in (("X-Tidegate-Queue-Wait-Ms", "queue_wait_ms"),
                          ("X-Tidegate-Upstream-Latency-Ms", "upstream_latency_ms")):
        value = result.get(field)
        if isinstance(value, int | float) and not isinstance(value, bool):
            headers[header] = f"{value:.1f}"
    return headers


def _dead(job: Job) -> ApiError:
    """The failure the worker recorded with the job (see tidegate.dispatch.failures). A job dead
    without one (its lease ran out on its last attempt, or it died before failures were
    recorded) answers 502 with its last error."""
    failure = failure_view(job)
    if failure is not None:
        return ApiError(failure.status, failure.message, code=failure.code, type_=failure.type,
                        param=failure.param, job_id=job.id, headers=_budget_headers(failure.code))
    error = job.last_error or "no error recorded"
    return ApiError(502, f"the job failed after {job.attempts} attempt(s): {error}", code="job_failed",
                    type_="upstream_error", job_id=job.id)


def failure_of(job: Job, waited_s: float) -> ApiError:
    """The error for a job that did not succeed within the wait: dead (the provider's error),
    cancelled (409), expired before a worker took it, or still running (504: poll it)."""
    if job.state is JobState.DEAD:
        return _dead(job)
    if job.state is JobState.CANCELLED:
        return ApiError(409, "the job was cancelled", code="job_cancelled", job_id=job.id)
    if job.state is JobState.EXPIRED:
        return ApiError(504, "the job passed its deadline before a worker could start it",
                        code="job_expired", job_id=job.id)
    return _still_waiting(job, waited_s)


def shutting_down(job: Job) -> ApiError:
    """503 for a call whose gateway stops before its job finished: the job goes on."""
    return ApiError(503, f"this gateway is shutting down; the job goes on: poll GET /v1/jobs/{job.id}",
                    code="gateway_shutting_down", type_="service_unavailable", job_id=job.id,
                    headers={"Retry-After": "1"})


def _still_waiting(job: Job, waited_s: float) -> ApiError:
    """504 for a job that goes on. A job parked until later (a spent budget, a provider's
    Retry-After) says why and until when, with Retry-After set to that time."""
    message = f"no result within {waited_s:g}s; the job goes on (state {job.state.value})"
    headers: dict[str, str] = {}
    if job.state in (JobState.DELAYED, JobState.FAILED) and job.not_before is not None:
        wait_s = max((job.not_before - datetime.now(UTC)).total_seconds(), 0.0)
        headers["Retry-After"] = str(math.ceil(wait_s))
        message += f" until {job.not_before.isoformat(timespec='seconds')}"
        if job.last_error:
            message += f": {job.last_error}"
    return ApiError(504, f"{message}; poll GET /v1/jobs/{job.id}", code="timeout", job_id=job.id,
                    headers=headers)


def _budget_headers(code: str) -> dict[str, str]:
    """A job a budget ended: the OpenAI SDKs are told not to retry (`x-should-retry`), since the
    same request meets the same budget; a spent budget says when it starts afresh."""
    if code == "budget_exhausted":
        next_day_s = seconds_to_next_day(datetime.now(UTC))
        return {"x-should-retry": "false", "Retry-After": str(math.ceil(next_day_s))}
    if code.startswith("budget_"):
        return {"x-should-retry": "false"}
    return {}
