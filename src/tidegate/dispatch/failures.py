"""The structured failure a worker records with a job it gives up on (`Job.failure`): the status
and OpenAI-shaped error that a caller waiting for the job is answered, decided where the reason
is known rather than read back out of the error text later.

- A request the provider refused (a 4xx no retry can cure) keeps the provider's status, message,
  type, code and param, so an OpenAI SDK raises what it would have raised calling the provider.
  401 and 403 are the exception: they refuse tidegate's own provider key or account, which the
  caller can do nothing about, so they answer 502 rather than tell the caller its key is wrong.
- A router refusal answers 404 (unknown model), 403 (not allowed for the tenant) or 400.
- A spent daily budget answers 429 `insufficient_quota`, as OpenAI does for a spent quota, its
  code saying why: `budget_exhausted` (no room left today), `budget_exceeds_limit` (the job is
  estimated above the whole daily limit) or `budget_deferred_too_long`.
- Retries that ran out (429, 5xx, timeouts, cut connections) answer 502 with the last error.
"""

from __future__ import annotations

from typing import Final

from tidegate.errors import RoutingError, RoutingRefusal, UpstreamError
from tidegate.jobs import JobFailure

__all__ = [
    "budget_refused",
    "internal_error",
    "invalid_job",
    "retries_exhausted",
    "routing_refused",
    "stream_cut",
    "upstream_refused",
]

MESSAGE_LIMIT: Final = 2_000  # characters of a failure's message; the error history keeps the rest
# Provider statuses that refuse tidegate's credentials or account, not the caller's request.
_OUR_CREDENTIALS: Final = frozenset({401, 403})
# The router's refusals: (status, OpenAI error type, param).
_ROUTING: Final[dict[RoutingRefusal, tuple[int, str, str | None]]] = {
    "model_not_found": (404, "invalid_request_error", "model"),
    "model_not_allowed": (403, "permission_error", "model"),
    "wrong_model_kind": (400, "invalid_request_error", "model"),
    "invalid_request": (400, "invalid_request_error", None),
    "model_not_available": (400, "invalid_request_error", "model"),
}


def _clip(message: str) -> str:
    return message if len(message) <= MESSAGE_LIMIT else message[: MESSAGE_LIMIT - 1] + "…"


def upstream_refused(exc: UpstreamError, model: str) -> JobFailure:
    """A request the provider refused with a status no retry can change (exc.kind "client")."""
    status = exc.status if exc.status is not None and 400 <= exc.status < 500 else 400
    body = exc.body
    if status in _OUR_CREDENTIALS:
        return {"status": 502, "type": "upstream_error", "code": "upstream_auth_error",
                "message": _clip(f"the provider refused tidegate's access to {model} (HTTP {status}): "
                                 f"{body.message if body else exc}"),
                "upstream_status": status, "model": model}
    failure: JobFailure = {
        "status": status,
        "type": (body.type if body else None) or "invalid_request_error",
        "code": (body.code if body else None) or "upstream_client_error",
        "message": _clip(body.message if body else str(exc)),
        "upstream_status": status,
        "model": model,
    }
    if body is not None and body.param is not None:
        failure["param"] = body.param
    return failure


def retries_exhausted(error: str, attempts: int, *, model: str = "", upstream_status: int | None = None
                      ) -> JobFailure:
    """A failure that retries could have cured, on the job's last attempt: 502 with its error."""
    failure: JobFailure = {"status": 502, "type": "upstream_error", "code": "upstream_error",
                           "message": _clip(f"the job failed after {attempts} attempt(s): {error}")}
    if upstream_status is not None:
        failure["upstream_status"] = upstream_status
    if model:
        failure["model"] = model
    return failure


def stream_cut(error: str, model: str) -> JobFailure:
    """A stream that failed after some of its chunks were relayed: it cannot be retried."""
    return {"status": 502, "type": "upstream_error", "code": "stream_interrupted", "message": _clip(error),
            "model": model}


def routing_refused(exc: RoutingError) -> JobFailure:
    """The router would not route the job (see RoutingRefusal)."""
    status, type_, param = _ROUTING[exc.refusal]
    failure: JobFailure = {"status": status, "type": type_, "code": exc.refusal, "message": _clip(str(exc))}
    if param is not None:
        failure["param"] = param
    return failure


def budget_refused(reason: str, message: str) -> JobFailure:
    """A job a budget ended (see tidegate.dispatch.budget.budget_outcome): `reason` is the code,
    e.g. `budget_exceeds_limit` for a job above the whole daily limit."""
    return {"status": 429, "type": "insufficient_quota", "code": reason, "message": _clip(message)}


def invalid_job(message: str) -> JobFailure:
    """A job whose payload is no AI request a worker can send."""
    return {"status": 400, "type": "invalid_request_error", "code": "invalid_request",
            "message": _clip(message)}


def internal_error(message: str, attempts: int) -> JobFailure:
    """A failure of tidegate itself (a bug), on the job's last attempt."""
    return {"status": 500, "type": "api_error", "code": "internal_error",
            "message": _clip(f"the job failed after {attempts} attempt(s): {message}")}
