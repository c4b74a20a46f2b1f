"""The Batch API: POST /v1/batches, GET /v1/batches/{id}, GET /v1/batches,
POST /v1/batches/{id}/cancel, as OpenAI's (an `openai` SDK pointed at the gateway works
unchanged), every line a tidegate job at the batch's priority (bulk by default; see
tidegate.gateway.batches.runs).

A tenant sees only its own batches: another tenant's answers 404, like an unknown id; admins see
every batch, as they see every job.
"""

from __future__ import annotations

from typing import Annotated, Final

from fastapi import APIRouter, Body, Query

from tidegate.coord.tenants import Tenant
from tidegate.gateway.batches.runs import cancel_batch, create_batch, followed
from tidegate.gateway.batches.schemas import BatchList, BatchRequest, BatchView, batch_view, visible_to
from tidegate.gateway.batches.store import BatchRecord
from tidegate.gateway.core.auth import MeteredTenantDep, StateDep, TenantDep, is_admin
from tidegate.gateway.core.errors import error_responses
from tidegate.gateway.core.intake import IdempotencyHeader, PriorityHeader
from tidegate.gateway.core.state import GatewayState

__all__ = ["router"]

MAX_PAGE: Final = 100  # OpenAI's most batches per page

router = APIRouter(prefix="/v1/batches", tags=["Batches"], responses=error_responses(401, 503))

_NOT_FOUND: dict[int | str, str] = {404: "No such batch for this tenant."}


async def visible_batch(state: GatewayState, tenant: Tenant, batch_id: str) -> BatchRecord:
    """The batch if this tenant may see it; 404 otherwise, the same as for an unknown id."""
    return visible_to(tenant, await state.batches.get_batch(batch_id), "batch", batch_id)


@router.post("", response_model=BatchView, summary="Create a batch",
             responses=error_responses(400, 403, 429, described={
                 404: "No such input file for this tenant.",
                 409: "The Idempotency-Key was first used for another batch."}))
async def create(
    body: Annotated[BatchRequest, Body()],
    state: StateDep,
    tenant: MeteredTenantDep,
    x_priority: PriorityHeader = None,
    idempotency_key: IdempotencyHeader = None,
) -> BatchView:
    """Read the input file's requests (JSON Lines of `custom_id`, `method`, `url`, `body`) and
    queue each as a job at the batch's priority; malformed lines go to the error file. With an
    Idempotency-Key, a repeated request answers the first batch."""
    batch = await create_batch(state, tenant, body, priority_header=x_priority,
                               idempotency_key=idempotency_key)
    return batch_view(batch)


@router.get("", response_model=BatchList, summary="List batches", responses=error_responses(400))
async def list_batches(
    state: StateDep,
    tenant: TenantDep,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 20,
    after: Annotated[str | None, Query(max_length=255, description="The last id of the page before.")] = None,
) -> BatchList:
    """The tenant's batches (every tenant's for an admin), newest first, their progress up to
    date."""
    page, has_more = await state.batches.page_batches(None if is_admin(tenant) else tenant.name,
                                                      after=after, limit=limit)
    views = [batch_view(await followed(state, batch)) for batch in page]
    return BatchList(data=views, first_id=views[0].id if views else None,
                     last_id=views[-1].id if views else None, has_more=has_more)


@router.get("/{batch_id}", response_model=BatchView, summary="Retrieve a batch",
            responses=error_responses(described=_NOT_FOUND))
async def retrieve(batch_id: str, state: StateDep, tenant: TenantDep) -> BatchView:
    """The batch, its progress up to date (finalized once every line's job is final)."""
    return batch_view(await followed(state, await visible_batch(state, tenant, batch_id)))


@router.post("/{batch_id}/cancel", response_model=BatchView, summary="Cancel a batch",
             responses=error_responses(described={
                 **_NOT_FOUND, 409: "The batch has ended (or is still being validated)."}))
async def cancel(batch_id: str, state: StateDep, tenant: TenantDep) -> BatchView:
    """Cancel the lines not yet started; started ones finish and are in the output file. The
    batch is `cancelling` until they have, then `cancelled`."""
    return batch_view(await cancel_batch(state, await visible_batch(state, tenant, batch_id)))
