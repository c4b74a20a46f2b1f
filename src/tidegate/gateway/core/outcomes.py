"""What a client is told about a job it waited for: its result with tidegate's headers, or an
error that says how the job ended."""

from __future__ import annotations

import contextlib
import math
from datetime import UTC, datetime

from tidegate.ai import AIResult, result_of
from tidegate.errors import TidegateError
from tidegate.gateway.core.budget_door import budget_headers
from tidegate.gateway.core.errors import ApiError
from tidegate.gateway.core.state import GatewayState
from tidegate.gateway.core.views import failure_view
from tidegate.jobs import Job, JobState

__all__ = ["failure_of", "left_waiting", "result_headers", "shutting_down", "succeeded"]


async def succeeded(state: GatewayState, job_id: str, timeout_s: float) -> tuple[Job, AIResult]:
    """The job of a call, waited for, and its result; the ApiError that answers the call when it
    did not succeed in time (or succeeded without an answer to give)."""
    job = await state.wait_job(job_id, timeout_s)
    if job.state is not JobState.SUCCEEDED:
        await left_waiting(state, job)
        raise shutting_down(job) if state.draining and not job.is_final else failure_of(job, timeout_s)
    result = result_of(job)
    state.recent.record(job, result)
    if result is None or result.response is None:
        raise ApiError(502, "the job succeeded without a provider response", code="upstream_error",
                       job_id=job.id)
    return job, result


async def left_waiting(state: GatewayState, job: Job) -> None:
    """A call answered before its job finished (504, 503: "the job goes on, poll it") leaves the
    job to be fetched later: the queue then keeps it `finished_ttl_s` once it finishes, not the
    short `answered_ttl_s`, and a spent budget defers it like any job nobody waits for. Best
    effort: a queue that cannot be told keeps the call's own answer unchanged."""
    if job.is_final or not job.caller_waits:
        return
    with contextlib.suppress(TidegateError):
        await state.queue.caller_gave_up(job.id)


def result_headers(job: Job, result: AIResult | None) -> dict[str, str]:
    """X-Tidegate-* headers describing a finished job and its result (`result_of(job)`)."""
    headers = {"X-Tidegate-Job-Id": job.id, "X-Tidegate-Priority": job.priority.name.lower()}
    if result is None:
        return headers
    for header, text in (("X-Tidegate-Model", result.model), ("X-Tidegate-Cost-Usd", result.cost_usd)):
        if text is not None:
            headers[header] = text
    for header, value in (("X-Tidegate-Queue-Wait-Ms", result.timings.queue_wait_ms),
                          ("X-Tidegate-Upstream-Latency-Ms", result.timings.upstream_latency_ms)):
        if value is not None:
            headers[header] = f"{value:.1f}"
    return headers


def _dead(job: Job) -> ApiError:
    """The failure the worker recorded with the job (see tidegate.dispatch.failures). A job dead
    without one (its lease ran out on its last attempt, or it died before failures were
    recorded) answers 502 with its last error."""
    failure = failure_view(job)
    if failure is not None:
        return ApiError(failure.status, failure.message, code=failure.code, type_=failure.type,
                        param=failure.param, job_id=job.id, headers=budget_headers(failure.code))
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
