"""GET /v1/admin/provider-batches (admin tenants only; 403 for others): the batches the workers
sent to providers' own batch APIs (tidegate.dispatch.provider_batches), the newest first, each
with how far its jobs got as tidegate knows it.

A batch's progress comes from the provider-batch store (which of its jobs are served live instead)
and the queue (each job's state), never from the provider: listing stays cheap and works while a
provider is down. A batch holds up to 50,000 lines and the queue reads one job at a time, so the
progress of a batch is counted over at most SAMPLE_JOBS of its jobs, evenly spread over its lines:
every job when the batch is no larger, else a sample whose size the answer gives (`sampled`), so a
page costs at most `limit` x SAMPLE_JOBS job reads whatever the batches hold. Counters kept by the
workers would be exact, but a job is cancelled in the queue, where no worker sees it, so they
could not count cancelled jobs without reading the jobs anyway.
"""

from __future__ import annotations

import asyncio
from datetime import datetime
from typing import Annotated, Literal

from fastapi import APIRouter, Query
from pydantic import BaseModel, Field

from tidegate.dispatch.provider_batches.store import BatchedJob, ProviderBatchRecord, ProviderBatchStore
from tidegate.gateway.core.auth import AdminDep, StateDep
from tidegate.gateway.core.errors import ApiError, error_responses
from tidegate.jobs import FINAL_STATES, Job, JobState
from tidegate.queue import Queue

__all__ = ["MAX_PAGE", "SAMPLE_JOBS", "ProviderBatchPage", "ProviderBatchProgress", "ProviderBatchView",
           "router"]

SAMPLE_JOBS = 100  # the jobs of one batch whose state is read to count its progress
MAX_PAGE = 50  # batches in one page: at most MAX_PAGE x SAMPLE_JOBS job reads per request

router = APIRouter(prefix="/v1/admin", tags=["Admin"], responses=error_responses(401, 403, 503, described={
    403: "The key's tenant is not an admin."}))


class ProviderBatchProgress(BaseModel):
    """How many of the batch's jobs (of the `sampled` ones) are where."""

    sampled: int = Field(description="The jobs counted: every job of the batch, or an even sample of "
                         "them when it has more lines than the gateway reads for one batch.")
    waiting: int = Field(description="Still waiting for the batch to end.")
    collected: int = Field(description="Answered from the batch.")
    served_live: int = Field(description="Left to a live call (their line failed, or the batch ended "
                             "without them).")
    cancelled: int = Field(description="Cancelled while the batch ran.")
    other: int = Field(description="Dead, expired, or no longer kept by the queue.")


class ProviderBatchView(BaseModel):
    """One batch sent to a provider's own batch API."""

    id: str = Field(description="`<provider>/<batch id>`: what `after` takes.")
    provider: str
    batch_id: str = Field(description="The batch's id at the provider.")
    model: str
    endpoint: str
    lines: int = Field(description="The jobs sent in the batch, one line each.")
    submitted_at: datetime
    progress: ProviderBatchProgress


class ProviderBatchPage(BaseModel):
    """A page of provider batches, the newest first."""

    object: Literal["list"] = "list"
    data: list[ProviderBatchView]
    first_id: str | None = None
    last_id: str | None = Field(None, description="What `after` takes for the next page.")
    has_more: bool = False
    enabled: bool = Field(description="Whether a provider has a `batch` section: without one, no job "
                          "is ever sent to a provider batch.")


@router.get("/provider-batches", response_model=ProviderBatchPage, summary="List provider batches",
            responses=error_responses(400))
async def list_provider_batches(
    state: StateDep,
    _: AdminDep,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE, description="Batches in this page.")] = 20,
    after: Annotated[str | None, Query(max_length=512, description=(
        "The `id` of the last batch of the page before."))] = None,
) -> ProviderBatchPage:
    """The batches the workers sent to providers' own batch APIs within the last week, the newest
    first, each with its jobs' progress as the queue knows it."""
    cursor = None
    if after is not None:
        provider, slash, batch_id = after.partition("/")
        if not (provider and slash and batch_id):
            raise ApiError(400, "`after` is a batch's `id`: `<provider>/<batch id>`", code="invalid_request",
                           param="after")
        cursor = provider, batch_id
    store = state.provider_batches
    if store is None:
        return ProviderBatchPage(data=[], enabled=False)
    # A batch is recorded twice when submitted: under a placeholder id first, then under the
    # provider's, where its jobs then point. Each placeholder so superseded is skipped (one whose
    # submission failed keeps its jobs, and is shown), so twice `limit` records fill a page when
    # the store holds that many; `has_more` may then announce a page of placeholders only.
    records, has_more = await store.recent(2 * limit, after=cursor)
    views: list[ProviderBatchView] = []
    last_id = None
    for n, record in enumerate(records):
        view = await _view(store, state.queue, record)
        last_id = f"{record.provider}/{record.batch_id}"
        if view is not None:
            views.append(view)
        if len(views) == limit:
            has_more = has_more or n + 1 < len(records)
            break
    return ProviderBatchPage(data=views, first_id=views[0].id if views else None, last_id=last_id,
                             has_more=has_more, enabled=True)


async def _view(store: ProviderBatchStore, queue: Queue,
                record: ProviderBatchRecord) -> ProviderBatchView | None:
    """The batch with its progress, or None when none of its jobs points at it any more."""
    lines = record.job_ids
    sample = [lines[n * len(lines) // SAMPLE_JOBS] for n in range(SAMPLE_JOBS)] if len(lines) > SAMPLE_JOBS \
        else list(lines)
    entries = await store.jobs(sample)
    if not any(_in(record, entry) for entry in entries.values()):
        return None
    jobs = await asyncio.gather(*(queue.get(job_id) for job_id in sample))
    counts = dict.fromkeys(("waiting", "collected", "served_live", "cancelled", "other"), 0)
    for job, job_id in zip(jobs, sample, strict=True):
        counts[_where(record, job, entries.get(job_id))] += 1
    return ProviderBatchView(
        id=f"{record.provider}/{record.batch_id}", provider=record.provider, batch_id=record.batch_id,
        model=record.model, endpoint=record.endpoint, lines=len(lines), submitted_at=record.submitted_at,
        progress=ProviderBatchProgress(sampled=len(sample), **counts))


def _in(record: ProviderBatchRecord, entry: BatchedJob | None) -> bool:
    """Whether the job's entry points at the batch."""
    return entry is not None and (entry.provider, entry.batch_id) == (record.provider, record.batch_id)


def _where(record: ProviderBatchRecord, job: Job | None, entry: BatchedJob | None) -> str:
    """Which count of the batch's progress a job of it falls in."""
    if job is None:
        return "other"
    if job.state == JobState.CANCELLED:
        return "cancelled"
    if entry is None or not _in(record, entry):
        return "other"  # its entry expired: nothing says whether the batch answered it
    if entry.live_reason is not None:
        return "served_live"
    if job.state == JobState.SUCCEEDED:
        return "collected"
    return "waiting" if job.state not in FINAL_STATES else "other"
