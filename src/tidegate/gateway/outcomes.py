"""What a client is told about a job it waited for: the provider's answer with tidegate's headers,
or an OpenAI-shaped error that says how the job ended."""

from __future__ import annotations

import re
from typing import Any

from tidegate.gateway.errors import ApiError
from tidegate.jobs import Job, JobState

__all__ = ["failure_of", "result_headers"]

# The worker keeps only the text of a job's last error. These are the parts of that text that are
# stable: the upstream client's "answered HTTP <status>", and the router's refusals.
_UPSTREAM_STATUS = re.compile(r"answered HTTP (\d{3})")
_ROUTER_REFUSALS: tuple[tuple[str, int, str], ...] = (
    ("is not allowed for this tenant", 403, "model_not_allowed"),
    ("is unknown: no configured provider", 404, "model_not_found"),
    ("invalid AI job", 400, "invalid_request"),
    ("budget exhausted", 429, "budget_exhausted"),
)
# 4xx statuses that a retry could have cured: not the client's fault, so they answer 502.
_NOT_CLIENT_ERRORS = frozenset({408, 409, 429})


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
    error = job.last_error or "the job failed"
    for phrase, status, code in _ROUTER_REFUSALS:
        if phrase in error:
            return ApiError(status, error, code=code, job_id=job.id)
    match = _UPSTREAM_STATUS.search(error)
    if match is not None:
        status = int(match[1])
        if 400 <= status < 500 and status not in _NOT_CLIENT_ERRORS:
            return ApiError(status, error, code="upstream_client_error", type_="invalid_request_error",
                            job_id=job.id)
    return ApiError(502, f"the job failed after {job.attempts} attempt(s): {error}", code="upstream_error",
                    job_id=job.id)


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
    return ApiError(
        504, f"no result within {waited_s:g}s; the job goes on (state {job.state.value}): "
        f"poll GET /v1/jobs/{job.id}",
        code="timeout", job_id=job.id,
    )
