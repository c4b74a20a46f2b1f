"""From an HTTP request to queued jobs: priority, entitlements, limits and the job payload.

Everything is checked before anything is written, and a batch is enqueued in one atomic call,
so a refused request leaves nothing in the queue.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Header
from pydantic import BaseModel, ValidationError

from tidegate.dispatch.requests import AUTO, AIRequest, Kind
from tidegate.errors import InvalidJob, InvalidPriority
from tidegate.gateway.errors import ApiError
from tidegate.gateway.schemas import ChatCompletionRequest, EmbeddingsRequest, JobRequest
from tidegate.gateway.state import GatewayState
from tidegate.gateway.tenants import Tenant
from tidegate.jobs import Priority

__all__ = [
    "IdempotencyHeader",
    "JobDraft",
    "PriorityHeader",
    "TimeoutHeader",
    "draft_from_job_request",
    "draft_job",
    "enqueue",
    "resolve_priority",
    "scoped_idempotency_key",
    "wait_timeout_s",
]

MAX_IDEMPOTENCY_KEY_CHARS = 255

PriorityHeader = Annotated[str | None, Header(
    alias="X-Priority", description="critical, high, normal, low, bulk or 0-4 (wins over the body's "
    "`priority`). Default: the API key's tenant's default priority.")]
TimeoutHeader = Annotated[str | None, Header(
    alias="X-Tidegate-Timeout", description="Seconds to wait for the result before answering 504 "
    "with the job id (capped by the gateway's maximum).")]
IdempotencyHeader = Annotated[str | None, Header(
    alias="Idempotency-Key", description="The same key (per tenant) gives the same job: a retried "
    "request waits for the first one's result instead of calling the provider again.")]

_BODY_MODELS: Mapping[str, type[BaseModel]] = {"chat": ChatCompletionRequest,
                                                "embeddings": EmbeddingsRequest}


@dataclass(frozen=True, slots=True)
class JobDraft:
    """A checked job, ready for `Queue.enqueue_many`."""

    kind: Kind
    priority: Priority
    payload: dict[str, Any]
    idempotency_key: str | None = None
    callback_url: str | None = None
    timeout_s: float | None = None

    def spec(self, tenant: Tenant) -> dict[str, Any]:
        """The queue's job spec."""
        return {"payload": self.payload, "priority": self.priority, "tenant": tenant.name,
                "idempotency_key": self.idempotency_key, "callback_url": self.callback_url,
                "timeout_s": self.timeout_s}


def resolve_priority(tenant: Tenant, *candidates: object) -> Priority:
    """The first priority given among `candidates` (header, body field, …), else the tenant's
    default. A priority above the tenant's maximum is refused with 403, never downgraded."""
    chosen = next((value for value in candidates if value is not None), None)
    priority = tenant.default_priority if chosen is None else Priority.parse(chosen)
    if not tenant.may_use(priority):
        raise ApiError(
            403, f"priority {priority.name.lower()!r} is above the maximum of tenant {tenant.name!r} "
            f"({tenant.max_priority.name.lower()!r})",
            code="priority_not_allowed", param="priority",
        )
    return priority


def scoped_idempotency_key(key: str | None, tenant: Tenant) -> str | None:
    """The Idempotency-Key header, scoped to the tenant so that two tenants using the same key
    never see each other's job."""
    if key is None:
        return None
    if not key or len(key) > MAX_IDEMPOTENCY_KEY_CHARS:
        raise ApiError(400, f"Idempotency-Key must be 1-{MAX_IDEMPOTENCY_KEY_CHARS} characters",
                       code="invalid_idempotency_key")
    return f"{tenant.name}:{key}"


def wait_timeout_s(header: str | None, state: GatewayState) -> float:
    """How long a synchronous call waits: X-Tidegate-Timeout (seconds, capped at the maximum)
    or the configured default."""
    settings = state.settings
    if header is None:
        return settings.request_timeout_s
    try:
        seconds = float(header)
    except ValueError:
        seconds = -1.0
    if not 0 < seconds < float("inf"):
        raise ApiError(400, f"X-Tidegate-Timeout must be a number of seconds > 0, got {header!r}",
                       code="invalid_timeout")
    return min(seconds, settings.max_request_timeout_s)


def _check_model(state: GatewayState, tenant: Tenant, kind: Kind, model: object) -> None:
    if model in (None, "", AUTO):
        return  # routed by the worker, within allowed_models
    name = str(model)
    if tenant.allowed_models is not None and name not in tenant.allowed_models:
        raise ApiError(403, f"model {name!r} is not allowed for tenant {tenant.name!r}",
                       code="model_not_allowed", param="model")
    known = state.models.get(name)
    if known is None:
        raise ApiError(404, f"the model {name!r} does not exist", code="model_not_found", param="model")
    if known.kind != kind:
        raise ApiError(400, f"model {name!r} serves {known.kind} requests, not {kind}",
                       code="wrong_model_kind", param="model")


def _validated_body(kind: Kind, body: Mapping[str, Any], where: str) -> dict[str, Any]:
    """A body that came inside a job, checked as the OpenAI endpoint would check it."""
    try:
        model = _BODY_MODELS[kind].model_validate(body)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join([where, *map(str, error['loc'])])}: {error['msg']}" for error in exc.errors()[:10]
        )
        raise ApiError(400, f"invalid request: {problems}", code="invalid_request", param=where) from None
    return model.model_dump(exclude_unset=True)


def draft_job(
    state: GatewayState,
    tenant: Tenant,
    kind: Kind,
    body: dict[str, Any],
    *,
    priority: Priority,
    idempotency_key: str | None = None,
    callback_url: str | None = None,
    timeout_s: float | None = None,
    keep_stream: bool = True,
) -> JobDraft:
    """Check one request body against the limits and the tenant's entitlements and build its
    job. The `priority` field is taken out of the body: it is tidegate's, not the provider's."""
    body = {key: value for key, value in body.items() if key != "priority"}
    if not keep_stream:
        # Nobody listens to an asynchronous job's chunks: store the whole answer instead.
        body.pop("stream", None)
        body.pop("stream_options", None)
    if kind == "chat":
        messages = body.get("messages")
        if isinstance(messages, list) and len(messages) > state.settings.max_messages:
            raise ApiError(400, f"{len(messages)} messages is over the limit of "
                           f"{state.settings.max_messages}", code="too_many_messages", param="messages")
    _check_model(state, tenant, kind, body.get("model"))
    allowed = None if tenant.allowed_models is None else frozenset(tenant.allowed_models)
    request = AIRequest(kind=kind, body=body, allowed_models=allowed)
    try:
        AIRequest.from_payload(request.to_payload())  # the worker's own check, before queueing
    except InvalidJob as exc:
        raise ApiError(400, str(exc), code="invalid_request") from None
    return JobDraft(kind, priority, request.to_payload(), idempotency_key, callback_url, timeout_s)


def draft_from_job_request(
    state: GatewayState,
    tenant: Tenant,
    job: JobRequest,
    *,
    where: str,
    fallback_priority: str | None,
    idempotency_key: str | None,
) -> JobDraft:
    """A job of POST /v1/jobs: its body validated like the OpenAI endpoint's, its priority from
    the job, then its body's `priority`, then X-Priority. Errors name the job of a batch
    (`where`, e.g. "jobs.3"; empty for a single job)."""
    body = _validated_body(job.kind, job.body, f"{where}.body" if where else "body")
    try:
        priority = resolve_priority(tenant, job.priority, body.get("priority"), fallback_priority)
        return draft_job(state, tenant, job.kind, body, priority=priority, idempotency_key=idempotency_key,
                         callback_url=job.callback_url, timeout_s=job.timeout_s, keep_stream=False)
    except ApiError as exc:
        raise (exc.located(where) if where else exc) from None
    except InvalidPriority as exc:
        if not where:
            raise  # answered by the app's TidegateError handler, like any other invalid priority
        raise ApiError(400, f"{where}: {exc}", code="invalid_priority", param=f"{where}.priority") from None


async def enqueue(state: GatewayState, tenant: Tenant, drafts: Sequence[JobDraft]) -> list[str]:
    """Enqueue checked jobs in one atomic call; their callback URLs are checked first."""
    for url in {draft.callback_url for draft in drafts if draft.callback_url is not None}:
        await state.check_callback_url(url)
    ids = await state.queue.enqueue_many([draft.spec(tenant) for draft in drafts])
    for draft in drafts:
        state.metrics.enqueued.labels(draft.kind, draft.priority.name.lower()).inc()
    return ids
