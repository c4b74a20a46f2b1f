"""From an HTTP request to queued jobs: headers, priority, entitlements, limits and the job payload.

Everything is checked before anything is written, and a batch is enqueued in one atomic call,
so a refused request leaves nothing in the queue.

The request headers tidegate reads are checked against the same constants their OpenAPI schemas
are made of (HEADER_SCHEMAS), so the document says exactly what is accepted.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Annotated, Any, Final

import msgspec
from fastapi import Depends, Header

from tidegate.ai import AUTO, AIRequest, Kind
from tidegate.contract import ChatRequest, ResponsesRequest, unstreamed
from tidegate.coord.tenants import Tenant
from tidegate.costs import estimate_input_tokens
from tidegate.dispatch.failures import routing_refused
from tidegate.errors import InvalidPriority, RoutingError
from tidegate.gateway.core.budget_door import refuse_over_budget
from tidegate.gateway.core.dialect import Dialect
from tidegate.gateway.core.errors import ApiError
from tidegate.gateway.core.schemas import JobRequest
from tidegate.gateway.core.state import GatewayState
from tidegate.jobs import Priority
from tidegate.queue.base import MAX_RELATIVE_S
from tidegate.tracing import tracer

__all__ = [
    "HEADER_SCHEMAS",
    "IDEMPOTENCY_HEADER",
    "PRIORITY_HEADER",
    "TIMEOUT_HEADER",
    "CallOptions",
    "CallOptionsDep",
    "IdempotencyHeader",
    "JobDraft",
    "PriorityHeader",
    "Submitted",
    "TimeoutHeader",
    "draft_from_job_request",
    "draft_job",
    "enqueue",
    "header_priority",
    "resolve_priority",
    "scoped_idempotency_key",
    "submit",
    "wait_timeout_s",
]

PRIORITY_HEADER: Final = "X-Priority"
TIMEOUT_HEADER: Final = "X-Tidegate-Timeout"
IDEMPOTENCY_HEADER: Final = "Idempotency-Key"
# The answer to every AI call of a gateway whose config names no provider: no model is offered,
# and a job queued would only end dead at a worker.
NO_PROVIDER: Final = ("no provider is configured: add [[providers]] to tidegate.toml, or start the "
                      "gateway with --simulator-url to offer the simulated provider's models")

MAX_IDEMPOTENCY_KEY_CHARS: Final = 255
MAX_TIMEOUT_HEADER_S: Final = MAX_RELATIVE_S  # ten years, like every relative time tidegate takes


def _any_case(word: str) -> str:
    # JSON Schema patterns (ECMA 262) have no case-insensitive flag: spell each letter both ways.
    return "".join(f"[{char.lower()}{char.upper()}]" if char.isalpha() else re.escape(char) for char in word)


_PRIORITY_NAMES: Final = tuple(priority.name.lower() for priority in Priority)
# A name in any case, or a level as one digit.
PRIORITY_HEADER_PATTERN: Final = (
    "^(?:" + "|".join(map(_any_case, _PRIORITY_NAMES)) + f"|[{min(Priority):d}-{max(Priority):d}])$"
)
# Visible ASCII, no spaces: what survives every proxy and HTTP library unchanged.
IDEMPOTENCY_KEY_PATTERN: Final = f"^[!-~]{{1,{MAX_IDEMPOTENCY_KEY_CHARS}}}$"
# A JSON number that is not negative (the range is checked on its value).
_SECONDS_PATTERN: Final = r"^[0-9]+(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?$"

HEADER_SCHEMAS: Final[Mapping[str, Mapping[str, Any]]] = {
    PRIORITY_HEADER: {"type": "string", "pattern": PRIORITY_HEADER_PATTERN, "examples": ["high", "0"]},
    TIMEOUT_HEADER: {"type": "number", "exclusiveMinimum": 0, "maximum": MAX_TIMEOUT_HEADER_S,
                     "examples": [30]},
    IDEMPOTENCY_HEADER: {"type": "string", "minLength": 1, "maxLength": MAX_IDEMPOTENCY_KEY_CHARS,
                         "pattern": IDEMPOTENCY_KEY_PATTERN, "examples": ["order-1234-summary"]},
}
"""The OpenAPI schema of each request header, built from the constants its check uses."""

PriorityHeader = Annotated[str | None, Header(
    alias=PRIORITY_HEADER, description="critical, high, normal, low or bulk (any case), or the level "
    "0-4; wins over the body's `priority`. Default: the API key's tenant's default priority.")]
TimeoutHeader = Annotated[str | None, Header(
    alias=TIMEOUT_HEADER, description="Seconds to wait for the result before answering 504 with the "
    "job id: a number above 0 and at most ten years, capped by the gateway's maximum wait.")]
IdempotencyHeader = Annotated[str | None, Header(
    alias=IDEMPOTENCY_HEADER, description="The same key (per tenant) gives the same job: a retried "
    f"request waits for the first one's result instead of calling the provider again. 1-"
    f"{MAX_IDEMPOTENCY_KEY_CHARS} visible ASCII characters, no spaces.")]

@dataclass(frozen=True, slots=True)
class CallOptions:
    """The request headers of a synchronous call that the intake reads (X-Priority,
    X-Tidegate-Timeout, Idempotency-Key), as sent."""

    priority: str | None = None
    timeout_header: str | None = None
    idempotency_key: str | None = None


async def _call_options(x_priority: PriorityHeader = None, x_tidegate_timeout: TimeoutHeader = None,
                        idempotency_key: IdempotencyHeader = None) -> CallOptions:
    return CallOptions(x_priority, x_tidegate_timeout, idempotency_key)


CallOptionsDep = Annotated[CallOptions, Depends(_call_options)]
"""A route's CallOptions, its three headers read (and documented) by FastAPI."""


@dataclass(frozen=True, slots=True)
class JobDraft:
    """A checked job, ready for `Queue.enqueue_many`."""

    request: AIRequest
    priority: Priority
    idempotency_key: str | None = None
    callback_url: str | None = None
    timeout_s: float | None = None

    @property
    def kind(self) -> Kind:
        """What the job asks for."""
        return self.request.kind

    @property
    def payload(self) -> dict[str, Any]:
        """The job's payload."""
        return self.request.to_payload()

    @property
    def keep_answer(self) -> bool:
        """Whether the answer may be fetched again after it was given: a stored response (GET
        /v1/responses/{id}, `previous_response_id`), kept as long as any finished job."""
        origin = self.request.origin
        return origin is not None and isinstance(origin.body, ResponsesRequest) and origin.body.stored

    def spec(self, tenant: Tenant, *, caller_waits: bool = False) -> dict[str, Any]:
        """The queue's job spec; `caller_waits` for a synchronous call's job."""
        return {"payload": self.payload, "priority": self.priority, "tenant": tenant.name,
                "idempotency_key": self.idempotency_key, "callback_url": self.callback_url,
                "timeout_s": self.timeout_s, "caller_waits": caller_waits, "keep_answer": self.keep_answer}


def header_priority(value: str | None) -> Priority | None:
    """The priority X-Priority names, or None without the header; 400 for anything else than
    PRIORITY_HEADER_PATTERN allows."""
    if value is None:
        return None
    if re.fullmatch(PRIORITY_HEADER_PATTERN, value) is None:
        raise ApiError(400, f"invalid priority {value!r} in {PRIORITY_HEADER}: use one of "
                       f"{', '.join(_PRIORITY_NAMES)} (any case) or {min(Priority):d}-{max(Priority):d}",
                       code="invalid_priority", param=PRIORITY_HEADER)
    return Priority.parse(value)


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
    if re.fullmatch(IDEMPOTENCY_KEY_PATTERN, key) is None:
        raise ApiError(400, f"{IDEMPOTENCY_HEADER} must be 1-{MAX_IDEMPOTENCY_KEY_CHARS} visible ASCII "
                       f"characters without spaces, got {len(key)} character(s)",
                       code="invalid_idempotency_key", param=IDEMPOTENCY_HEADER)
    return f"{tenant.name}:{key}"


def wait_timeout_s(header: str | None, state: GatewayState) -> float:
    """How long a synchronous call waits: X-Tidegate-Timeout (seconds, capped at the maximum)
    or the configured default."""
    settings = state.settings
    if header is None:
        return settings.request_timeout_s
    seconds = float(header) if re.fullmatch(_SECONDS_PATTERN, header) else -1.0
    if not 0 < seconds <= MAX_TIMEOUT_HEADER_S:
        raise ApiError(400, f"{TIMEOUT_HEADER} must be a number of seconds above 0 and at most "
                       f"{MAX_TIMEOUT_HEADER_S}, got {header!r}", code="invalid_timeout",
                       param=TIMEOUT_HEADER)
    return min(seconds, settings.max_request_timeout_s)


def _check_model(state: GatewayState, tenant: Tenant, request: AIRequest, priority: Priority) -> None:
    """The model named may serve the request for this tenant; `auto` is routed now, as the worker
    will route it (see `_check_routable`)."""
    if not state.models:
        raise ApiError(503, NO_PROVIDER, code="no_provider_configured")
    kind, name = request.kind, request.body.model
    if name in ("", AUTO):
        _check_routable(state, request, priority)
        return
    if tenant.allowed_models is not None and name not in tenant.allowed_models:
        raise ApiError(403, f"model {name!r} is not allowed for tenant {tenant.name!r}",
                       code="model_not_allowed", param="model")
    known = state.models.get(name)
    if known is None:
        raise ApiError(404, f"the model {name!r} does not exist", code="model_not_found", param="model")
    if known.kind != kind:
        raise ApiError(400, f"model {name!r} serves {known.kind} requests, not {kind}",
                       code="wrong_model_kind", param="model")


def _check_routable(state: GatewayState, request: AIRequest, priority: Priority) -> None:
    """Route an `auto` request as the worker will, over the models its tenant may use, so that
    a request no model may ever serve (none allowed: 403; its input fits none: 400) is refused
    here rather than queued to end dead. The worker routes again with the budget left and the
    models failing, which only widen or reorder what was found here."""
    estimated = estimate_input_tokens(request.body) if request.kind == "chat" else 0
    try:
        state.router.route(kind=request.kind, requested_model=None, priority=priority,
                           estimated_input_tokens=estimated, allowed_models=request.allowed_models)
    except RoutingError as exc:
        failure = routing_refused(exc)  # the status and code the worker would record
        raise ApiError(failure["status"], failure["message"], code=failure["code"], type_=failure["type"],
                       param=failure.get("param")) from None


def draft_job(
    state: GatewayState, tenant: Tenant, request: AIRequest, *, priority: Priority, keep_stream: bool = True
) -> JobDraft:
    """Check one request against the limits and the tenant's entitlements and build its job
    (how it runs beyond its priority, `dataclasses.replace` adds: its idempotency key, callback,
    deadline). The `priority` field is taken out of the body: it is tidegate's, not the
    provider's."""
    body = request.body
    if body.priority is not None:
        body = msgspec.structs.replace(body, priority=None)
    if not keep_stream:
        body = unstreamed(body)  # nobody listens to an asynchronous job's chunks: store the answer
    if isinstance(body, ChatRequest) and len(body.messages) > state.settings.max_messages:
        raise ApiError(400, f"{len(body.messages)} messages is over the limit of "
                       f"{state.settings.max_messages}", code="too_many_messages", param="messages")
    allowed = None if tenant.allowed_models is None else frozenset(tenant.allowed_models)
    # The request's trace goes with its job, so the worker's spans continue it (tidegate.tracing).
    checked = AIRequest(kind=request.kind, body=body, allowed_models=allowed, origin=request.origin,
                        trace=tracer().carrier())
    _check_model(state, tenant, checked, priority)
    return JobDraft(checked, priority)


def draft_from_job_request(
    state: GatewayState,
    tenant: Tenant,
    job: JobRequest,
    dialect: Dialect,
    *,
    where: str,
    fallback_priority: Priority | None,
    idempotency_key: str | None,
) -> JobDraft:
    """A job of POST /v1/jobs: its body validated as `dialect`'s endpoint validates it, its
    priority from the job, then its body's `priority`, then X-Priority. Errors name the job of a
    batch (`where`, e.g. "jobs.3"; empty for a single job). A legacy kind no provider offers
    is refused, as its endpoint would be."""
    if job.kind not in ("chat", "embeddings") and not state.offers(job.kind):
        param = f"{where}.kind" if where else "kind"
        raise ApiError(400, f"{param}: no provider offers {job.kind!r} jobs", code="unsupported_kind",
                       param=param)
    request = dialect.parse(job.kind, job.body, f"{where}.body" if where else "body")
    try:
        priority = resolve_priority(tenant, job.priority, request.body.priority, fallback_priority)
        draft = draft_job(state, tenant, request, priority=priority, keep_stream=False)
        return replace(draft, idempotency_key=idempotency_key, callback_url=job.callback_url,
                       timeout_s=job.timeout_s)
    except ApiError as exc:
        raise (exc.located(where) if where else exc) from None
    except InvalidPriority as exc:
        if not where:
            raise  # answered by the app's TidegateError handler, like any other invalid priority
        raise ApiError(400, f"{where}: {exc}", code="invalid_priority", param=f"{where}.priority") from None


@dataclass(frozen=True, slots=True)
class Submitted:
    """A call's job, enqueued: its id, priority and request, and how long the call waits for it."""

    job_id: str
    priority: Priority
    request: AIRequest
    timeout_s: float


async def submit(
    state: GatewayState,
    tenant: Tenant,
    request: AIRequest,
    options: CallOptions,
    *,
    waits: bool = True,
) -> Submitted:
    """Check and enqueue the job of a call (its priority from X-Priority, then the body's
    `priority`); `waits=False` for a call answered at once, whose job runs in the background.
    Every check comes before the enqueue: a refused call leaves nothing queued."""
    timeout_s = wait_timeout_s(options.timeout_header, state)
    chosen = resolve_priority(tenant, header_priority(options.priority), request.body.priority)
    draft = replace(draft_job(state, tenant, request, priority=chosen, keep_stream=waits),
                    idempotency_key=scoped_idempotency_key(options.idempotency_key, tenant))
    [job_id] = await enqueue(state, tenant, [draft], will_wait=waits)
    tracing = tracer()
    if tracing.enabled:
        tracing.annotate({"tidegate.job_id": job_id, "tidegate.tenant": tenant.name,
                          "tidegate.priority": chosen.name.lower()})
    return Submitted(job_id, chosen, draft.request, timeout_s)


async def enqueue(state: GatewayState, tenant: Tenant, drafts: Sequence[JobDraft], *,
                  will_wait: bool = False, derived_keys: bool = False) -> list[str]:
    """Enqueue checked jobs in one atomic call; their callback URLs are checked first, and so is
    every Idempotency-Key already used (409 when it was used for another request). `will_wait`:
    the call waits for them next (see `Queue.enqueue_many`): each is checked against the daily
    budgets first (tidegate.gateway.core.budget_door), and marked as one a caller waits for.
    `derived_keys`: the keys are derived from the requests themselves (a batch's lines), so a key
    another call won in between names the same request, and the check after the write (one read
    per job) is spared."""
    for url in {draft.callback_url for draft in drafts if draft.callback_url is not None}:
        await state.check_callback_url(url)
    keyed = [draft for draft in drafts if draft.idempotency_key is not None]
    known = await state.queue.idempotent_ids([draft.idempotency_key for draft in keyed
                                              if draft.idempotency_key is not None])
    for draft in keyed:
        if draft.idempotency_key in known:
            await _check_repeat(state, draft, known[draft.idempotency_key])
    if will_wait:
        # A call the budget cannot serve now is answered 429 at once, and nothing is queued. A
        # repeated Idempotency-Key gets its first job's answer, which spends nothing more.
        for draft in drafts:
            if draft.idempotency_key not in known:
                await refuse_over_budget(state, tenant, draft.request, draft.priority)
    ids = await state.queue.enqueue_many([draft.spec(tenant, caller_waits=will_wait) for draft in drafts],
                                         will_wait=will_wait)
    for draft, job_id in zip(drafts, ids, strict=True):
        if draft.idempotency_key is not None and draft.idempotency_key not in known and not derived_keys:
            # Two first uses at once: the other may have won the key in between.
            await _check_repeat(state, draft, job_id)
    for draft in drafts:
        state.metrics.enqueued.labels(draft.kind, draft.priority.name.lower()).inc()
    return ids


async def _check_repeat(state: GatewayState, draft: JobDraft, job_id: str) -> None:
    """A repeated Idempotency-Key answers with the first job, so the request must be the same:
    its kind (chat or embeddings, whichever endpoint), its body and its callback URL. Another
    request under the same key is refused with 409, naming the first job. Keys are per tenant
    (scoped_idempotency_key), so only the tenant's own jobs are ever compared."""
    job = await state.queue.get(job_id)
    if job is None:
        return  # the first job has expired since: the key now names this one
    first_kind = job.payload.get("kind")
    if first_kind != draft.kind:
        reason = f"for a {first_kind} request, not {draft.kind}"
    elif (job.payload.get("body"), job.payload.get("origin")) != (draft.payload.get("body"),
                                                                  draft.payload.get("origin")):
        # The origin too: a request sent natively may differ where its chat body cannot say.
        reason = "with another request body"
    elif job.callback_url != draft.callback_url:
        reason = "with another callback_url"
    else:
        return
    raise ApiError(409, f"the Idempotency-Key was first used {reason}: repeat the same request to get "
                   "its job, or use a new key", code="idempotency_key_reused", param=IDEMPOTENCY_HEADER,
                   job_id=job_id)
