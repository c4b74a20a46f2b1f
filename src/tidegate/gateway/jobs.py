"""Asynchronous jobs: POST /v1/jobs (one or a batch), GET /v1/jobs/{id} (with an optional
long-poll), DELETE /v1/jobs/{id} (cancel).

A tenant sees only its own jobs: another tenant's job answers 404, exactly like an unknown id,
so ids cannot be probed. Admins see every job.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Body, Query
from pydantic import BaseModel

from tidegate.ai import result_of
from tidegate.coord.tenants import Tenant
from tidegate.gateway.core.auth import MeteredTenantDep, StateDep, TenantDep, is_admin
from tidegate.gateway.core.errors import ApiError, error_responses
from tidegate.gateway.core.intake import (
    IdempotencyHeader,
    PriorityHeader,
    draft_from_job_request,
    enqueue,
    header_priority,
    scoped_idempotency_key,
)
from tidegate.gateway.core.schemas import JobBatch, JobRequest, JobsAccepted, JobsRequest, JobView
from tidegate.gateway.core.state import GatewayState
from tidegate.gateway.core.views import job_view
from tidegate.gateway.openai.dialect import OPENAI
from tidegate.jobs import Job
from tidegate.queue.base import MAX_RELATIVE_S

__all__ = ["router"]

router = APIRouter(prefix="/v1/jobs", tags=["Jobs"], responses=error_responses(401, 503))

_NOT_FOUND: dict[int | str, str] = {404: "No such job for this tenant."}


class CancelResult(BaseModel):
    """What DELETE did: `cancelled` is false when the job had already finished."""

    id: str
    cancelled: bool
    state: str


@router.post("", status_code=202, response_model=JobsAccepted, summary="Enqueue jobs",
             responses=error_responses(400, 403, 413, 429, described={
                 404: "A job names an unknown model.",
                 409: "The Idempotency-Key was first used for another request (another kind, body or "
                      "callback_url): `error.job_id` names that job."}))
async def create_jobs(
    request: Annotated[JobsRequest, Body(openapi_examples={
        "one": {"summary": "One job", "value": {
            "kind": "chat", "priority": "low",
            "body": {"model": "auto", "messages": [{"role": "user", "content": "Describe this product."}]}}},
        "batch": {"summary": "A batch (up to the gateway's max_batch)", "value": {"jobs": [
            {"kind": "embeddings", "priority": "bulk", "body": {"model": "auto", "input": "red shoes"}},
            {"kind": "embeddings", "priority": "bulk", "body": {"model": "auto", "input": "blue kettle"}}]}},
    })],
    state: StateDep,
    tenant: MeteredTenantDep,
    x_priority: PriorityHeader = None,
    idempotency_key: IdempotencyHeader = None,
) -> JobsAccepted:
    """Enqueue one job or a batch (all or none) and answer at once with their ids.

    With an Idempotency-Key, job *i* of a batch uses `key:i`; repeating the request gives the
    same ids. A job's priority comes from its `priority`, then its body's, then X-Priority,
    then the tenant's default."""
    jobs: list[JobRequest] = request.jobs if isinstance(request, JobBatch) else [request]
    if len(jobs) > state.settings.max_batch:
        raise ApiError(400, f"batch of {len(jobs)} jobs is over the limit of {state.settings.max_batch}",
                       code="batch_too_large", param="jobs")
    key = scoped_idempotency_key(idempotency_key, tenant)
    fallback_priority = header_priority(x_priority)
    batch = isinstance(request, JobBatch)
    drafts = [
        draft_from_job_request(
            state, tenant, job, OPENAI, where=f"jobs.{index}" if batch else "",
            fallback_priority=fallback_priority,
            idempotency_key=None if key is None else (f"{key}:{index}" if batch else key),
        )
        for index, job in enumerate(jobs)
    ]
    return JobsAccepted(ids=await enqueue(state, tenant, drafts))


async def visible_job(state: GatewayState, tenant: Tenant, job_id: str) -> Job:
    """The job if this tenant may see it; 404 otherwise, the same as for an unknown id."""
    job = await state.queue.get(job_id)
    if job is None or (job.tenant != tenant.name and not is_admin(tenant)):
        raise ApiError(404, f"no job with id {job_id!r}", code="job_not_found")
    return job


@router.get("/{job_id}", response_model=JobView, summary="Get a job",
            responses=error_responses(400, described=_NOT_FOUND))
async def get_job(
    job_id: str,
    state: StateDep,
    tenant: TenantDep,
    wait: Annotated[float, Query(ge=0, le=MAX_RELATIVE_S, allow_inf_nan=False, description=(
        "Seconds to wait for the job to finish (long-poll); answers as soon as it does. "
        "Capped by the gateway's max_wait_s."))] = 0.0,
) -> JobView:
    """The job's state, result, usage, cost, timings and errors."""
    job = await visible_job(state, tenant, job_id)
    if wait > 0 and not job.is_final:
        job = await state.wait_job(job_id, min(wait, state.settings.max_wait_s))
    state.recent.record(job, result_of(job))
    return job_view(job)


@router.delete("/{job_id}", response_model=CancelResult, summary="Cancel a job",
               responses=error_responses(described=_NOT_FOUND))
async def cancel_job(job_id: str, state: StateDep, tenant: TenantDep) -> CancelResult:
    """Cancel a job that has not finished; a running call's result is then discarded."""
    await visible_job(state, tenant, job_id)
    cancelled = await state.queue.cancel(job_id)
    job = await state.queue.get(job_id)
    return CancelResult(id=job_id, cancelled=cancelled, state=job.state.value if job else "cancelled")
