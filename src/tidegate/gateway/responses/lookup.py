"""Stored responses found by id within a tenant, and the conversation a continued one brings:
what POST /v1/responses (`previous_response_id`), its retrieve routes and a `/v1/responses` batch
line share.

A response is its job (`resp_<job id>`) made from a Responses request, the request kept in the
job's payload as its `origin`; a job of another tenant, one made from another API, or one created
with `store: false` is not found, exactly as an unknown id.
"""

from __future__ import annotations

from tidegate.ai import Origin, result_of
from tidegate.coord.tenants import Tenant
from tidegate.errors import InvalidJob
from tidegate.gateway.core.errors import ApiError
from tidegate.gateway.core.state import GatewayState
from tidegate.gateway.responses.output import Continued, continued, job_id_of, render, request_of
from tidegate.jobs import Job, JobState

__all__ = ["conversation", "lookup_response", "origin_of"]


async def lookup_response(state: GatewayState, tenant: Tenant, response_id: str,
                          param: str | None = None) -> tuple[Job, Origin]:
    """A stored response of this tenant's and the request it was made from; 404 otherwise, the
    same for another tenant's as for an unknown id (`param`: the field that named it)."""
    job_id = job_id_of(response_id)
    job = None if job_id is None else await state.queue.get(job_id)
    origin = None if job is None else origin_of(job)
    if job is None or origin is None or job.tenant != tenant.name or not request_of(origin).stored:
        what = "Previous response" if param else "Response"
        raise ApiError(404, f"{what} with id {response_id!r} not found.", code="response_not_found",
                       param=param)
    return job, origin


def origin_of(job: Job) -> Origin | None:
    """The Responses request of a job made from one (None for any other job)."""
    try:
        origin = Origin.from_payload(job.payload.get("origin"))
    except InvalidJob:
        return None
    return origin if origin is not None and origin.api == "responses" else None


async def conversation(state: GatewayState, tenant: Tenant, response_id: str) -> Continued:
    """The conversation a continued response brings: its input (its instructions left out, as
    the API does not carry them over) and its answer (see `Continued`)."""
    job, origin = await lookup_response(state, tenant, response_id, param="previous_response_id")
    result = result_of(job)
    if job.state is not JobState.SUCCEEDED or result is None:
        raise ApiError(400, f"previous response {response_id!r} has no answer to continue from (it is "
                       f"{render(job, origin)['status']})", code="previous_response_unavailable",
                       param="previous_response_id")
    return continued(job, origin, result.response)
