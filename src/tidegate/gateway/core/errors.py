"""Every error the gateway answers is OpenAI-shaped: `{"error": {"message", "type", "param",
"code"}}`, always with a code, and with the status an OpenAI client expects, so the official SDKs
raise their usual exception types and carry the code. (A route of another dialect answers in its
dialect's shape: see tidegate.gateway.core.dialect.)

Four sources feed one response builder: `ApiError` (a refusal the gateway decides itself), the
TidegateError tree (mapped by class in `TIDEGATE_ERRORS`), FastAPI's own validation, routing and
body-reading errors, and any other exception (500 `internal_error`). What the HTTP server refuses
before the app runs is answered in the same shape by tidegate.gateway.core.http_server.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import BaseRoute, Match
from starlette.types import Scope

from tidegate.errors import (
    BudgetExhausted,
    CallbackRefused,
    DispatchClosed,
    DispatchUnavailable,
    InvalidJob,
    InvalidPriority,
    JobNotFound,
    PayloadTooLarge,
    QueueClosed,
    QueueFull,
    QueueUnavailable,
    RoutingError,
    TenantNotFound,
    TidegateError,
    UpstreamError,
)

__all__ = [
    "ERROR_DESCRIPTIONS",
    "ApiError",
    "ErrorBody",
    "ErrorResponse",
    "ErrorShape",
    "error_body",
    "error_response",
    "error_responses",
    "headers_too_large",
    "install_error_handlers",
    "openai_error",
    "retry_after_header",
    "served_api_paths",
    "shape_before_routing",
    "unsupported_endpoint",
]

log = logging.getLogger("tidegate.gateway")


class ErrorBody(BaseModel):
    """The inside of an error answer."""

    model_config = ConfigDict(json_schema_extra={"examples": [{
        "message": "priority 'critical' is above this key's maximum 'high'",
        "type": "permission_error", "code": "priority_not_allowed", "param": None,
    }]})

    message: str
    type: str
    code: str | None = None
    param: str | None = None
    job_id: str | None = Field(None, description="The job concerned, when there is one (504: poll it).")


class ErrorResponse(BaseModel):
    """An error answer, as OpenAI's API shapes it."""

    error: ErrorBody


_DEFAULT_TYPES: Mapping[int, str] = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    409: "conflict_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    431: "invalid_request_error",
    429: "rate_limit_error",
    502: "upstream_error",
    503: "service_unavailable",
    504: "timeout_error",
}


class ApiError(Exception):
    """A refusal decided by the gateway: its HTTP status, OpenAI error type and code, and any
    headers (Retry-After). Not part of the TidegateError tree: it exists only at the HTTP edge."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        code: str | None = None,
        type_: str | None = None,
        param: str | None = None,
        job_id: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type_ or _DEFAULT_TYPES.get(status, "api_error")
        self.code = code
        self.param = param
        self.job_id = job_id
        self.headers = dict(headers or {})

    def located(self, where: str) -> ApiError:
        """The same error, its message and param prefixed with where it was found ("jobs.3")."""
        param = where if self.param is None else f"{where}.{self.param}"
        return ApiError(self.status, f"{where}: {self.message}", code=self.code, type_=self.type,
                        param=param, job_id=self.job_id, headers=self.headers)


def retry_after_header(seconds: float) -> dict[str, str]:
    """Retry-After in whole seconds, rounded up and at least 1 (a 0 invites a busy loop)."""
    return {"Retry-After": str(max(1, math.ceil(seconds)))}


# Most specific first: the first class a raised error is an instance of decides.
TIDEGATE_ERRORS: Sequence[tuple[type[TidegateError], int, str, str]] = (
    (InvalidPriority, 400, "invalid_request_error", "invalid_priority"),
    (PayloadTooLarge, 413, "invalid_request_error", "payload_too_large"),
    (InvalidJob, 400, "invalid_request_error", "invalid_job"),
    (CallbackRefused, 400, "invalid_request_error", "callback_refused"),
    (RoutingError, 400, "invalid_request_error", "model_not_available"),
    (QueueFull, 429, "rate_limit_error", "queue_full"),
    (BudgetExhausted, 429, "insufficient_quota", "budget_exhausted"),
    (JobNotFound, 404, "not_found_error", "job_not_found"),
    (TenantNotFound, 404, "not_found_error", "tenant_not_found"),
    (QueueUnavailable, 503, "service_unavailable", "queue_unavailable"),
    (QueueClosed, 503, "service_unavailable", "queue_closed"),
    (DispatchUnavailable, 503, "service_unavailable", "store_unavailable"),
    (DispatchClosed, 503, "service_unavailable", "store_closed"),
    (UpstreamError, 502, "upstream_error", "upstream_error"),
)


def api_error_from(exc: TidegateError) -> ApiError:
    """The answer for an error of the TidegateError tree."""
    for cls, status, type_, code in TIDEGATE_ERRORS:
        if isinstance(exc, cls):
            headers = retry_after_header(exc.retry_after_s) if isinstance(exc, QueueFull) else None
            return ApiError(status, str(exc), code=code, type_=type_, headers=headers)
    return ApiError(500, str(exc), code="internal_error", type_="api_error")


def error_body(error: ApiError) -> dict[str, Any]:
    """The `error` object of an answer in OpenAI's shape (message, type, param, code), with the
    job's id when there is one."""
    body: dict[str, Any] = {"message": error.message, "type": error.type, "param": error.param,
                            "code": error.code}
    if error.job_id is not None:
        body["job_id"] = error.job_id
    return body


def headers_too_large(limit_bytes: int) -> ApiError:
    """The refusal of a request whose line and headers are over `limit_bytes`."""
    return ApiError(431, f"the request headers are over the limit of {limit_bytes} bytes",
                    code="request_headers_too_large")


ErrorShape = Callable[[ApiError], dict[str, Any]]
"""What the body of an error answer is made of: a dialect's `error_body`
(tidegate.gateway.core.dialect); `openai_error` for every route that belongs to no dialect."""


def openai_error(error: ApiError) -> dict[str, Any]:
    """An error answer's body in OpenAI's shape: `{"error": {...}}` (see error_body)."""
    return {"error": error_body(error)}


def error_response(error: ApiError, shape: ErrorShape = openai_error) -> Response:
    """The HTTP response for an ApiError, its body in `shape`."""
    headers = dict(error.headers)
    if error.job_id is not None:
        headers.setdefault("X-Tidegate-Job-Id", error.job_id)
    return Response(orjson.dumps(shape(error)), status_code=error.status, headers=headers,
                    media_type="application/json")


def shape_before_routing(routes: Sequence[BaseRoute], scope: Scope) -> ErrorShape:
    """The error shape of the route `scope` will reach, for an answer made before routing (a
    body refused from its declared size): the dialect's of a dialect's route, else OpenAI's."""
    for route in routes:
        match, _ = route.matches(scope)
        if match is Match.FULL:
            shape = getattr(route, "error_shape", None)
            return shape if callable(shape) else openai_error
    return openai_error


def _shape_of(request: Request) -> ErrorShape:
    """The error shape of the route that matched: its dialect's (routes made by a dialect's
    `router()` carry it), else OpenAI's."""
    shape = getattr(request.scope.get("route"), "error_shape", None)
    return shape if callable(shape) else openai_error


# Parts of a validation error's location that name no field of the request: FastAPI's "body" and
# the tags of the job-or-batch union (see schemas.JobsRequest).
_NOT_FIELDS = frozenset({"body", "single-job", "job-batch"})


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    """One readable sentence naming each bad field, and the first field as `param`."""
    problems: list[str] = []
    first: str | None = None
    for error in exc.errors():
        kind = error.get("type", "")
        if kind == "json_invalid":
            detail = error.get("ctx", {}).get("error", "")
            return f"the request body is not valid JSON: {detail}".strip(), None
        # FastAPI prefixes "body"; a tagged union adds its tag. Neither is the caller's field.
        loc = [str(part) for part in error.get("loc", ()) if part not in _NOT_FIELDS]
        where = ".".join(loc) or "body"
        first = first or where
        if kind == "missing" and not loc:
            problems.append("a JSON request body is required")
        elif not loc:
            problems.append("the request body must be a JSON object")
        else:
            problems.append(f"{where}: {error.get('msg', 'invalid')}")
    return "invalid request: " + "; ".join(problems[:10]), first


def install_error_handlers(app: FastAPI) -> None:
    """Answer every error the app raises, in the shape of the route's dialect (OpenAI's for a
    route of none, and for a request that matched no route)."""

    async def on_api_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, ApiError)
        return error_response(exc, _shape_of(request))

    async def on_tidegate_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, TidegateError)
        error = api_error_from(exc)
        if error.status >= 500:
            log.warning("%s %s: %s: %s", request.method, request.url.path, type(exc).__name__, exc)
        return error_response(error, _shape_of(request))

    async def on_validation_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestValidationError)
        message, param = _validation_message(exc)
        return error_response(ApiError(400, message, code="invalid_request", param=param), _shape_of(request))

    async def on_http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, StarletteHTTPException)
        return error_response(_http_error(request, exc), _shape_of(request))

    async def on_unexpected_error(request: Request, exc: Exception) -> Response:
        # Starlette logs the traceback; the caller still gets the API's own shape.
        return error_response(ApiError(500, "internal error: the gateway could not answer this request",
                                       code="internal_error", type_="api_error"), _shape_of(request))

    app.add_exception_handler(ApiError, on_api_error)
    app.add_exception_handler(TidegateError, on_tidegate_error)
    app.add_exception_handler(RequestValidationError, on_validation_error)
    app.add_exception_handler(StarletteHTTPException, on_http_error)
    app.add_exception_handler(Exception, on_unexpected_error)


# The code of each HTTP error that the routing or the body reading raise themselves.
_HTTP_CODES: Mapping[int, str] = {
    400: "invalid_request", 404: "unknown_url", 405: "method_not_allowed", 413: "request_too_large",
}


def _http_error(request: Request, exc: StarletteHTTPException) -> ApiError:
    """An error the framework raised (no route, wrong method, an unreadable body), as an ApiError
    with a code: the status's own, or `http_<status>`."""
    status = exc.status_code
    code = _HTTP_CODES.get(status, f"http_{status}")
    message = str(exc.detail)
    headers = dict(exc.headers or {})
    if status == 404:
        message, code = _not_found(request)
    elif status == 405:
        allowed = _allowed_methods(request)
        headers["Allow"] = ", ".join(allowed)
        message = f"{request.method} is not allowed on {request.url.path}: use {', '.join(allowed)}"
    elif status == 400 and message == "There was an error parsing the body":
        # FastAPI's answer to a body json.loads cannot read but that is no JSONDecodeError:
        # invalid UTF-8, or nesting deeper than the parser's recursion limit.
        message = ("the request body is not valid JSON: it must be UTF-8 text, nested at most a few "
                   "hundred levels deep")
        code = "invalid_json"
    return ApiError(status, message, code=code, headers=headers)


# OpenAI's legacy endpoints, served only when a configured provider offers them (a model of their
# kind), with the served route that does the same work, if one does.
_UNSERVED: Mapping[str, str | None] = {"/v1/completions": "/v1/chat/completions", "/v1/moderations": None}
_API_PREFIX = "/v1/"


def _not_found(request: Request) -> tuple[str, str]:
    """The message and code of a URL no route serves. Under /v1/ the message names the API paths
    the gateway serves, read from its OpenAPI document (made from its routes, and cached by the
    app) so that it names each route as soon as it exists."""
    path = request.url.path
    message = f"unknown URL {request.method} {path}"
    if not path.startswith(_API_PREFIX):
        return message, "unknown_url"
    served = ", ".join(served_api_paths(request.app.openapi().get("paths") or {}))
    return f"{message}: this gateway serves {served} (and the paths under them)", "unknown_url"


def unsupported_endpoint(request: Request, path: str, unoffered: Collection[str]) -> ApiError:
    """The 404 of a legacy endpoint (`path`) that no configured provider offers, naming the API
    paths the gateway serves but those of `unoffered` (legacy endpoints not offered either)."""
    served = ", ".join(served for served in served_api_paths(request.app.openapi().get("paths") or {})
                       if served not in unoffered)
    instead = _UNSERVED.get(path)
    use = f": use {instead}" if instead else ""
    return ApiError(404, f"{path} is not served by this gateway (no configured provider offers it){use}. "
                    f"It serves {served} (and the paths under them)", code="unsupported_endpoint")


def served_api_paths(paths: Iterable[str]) -> list[str]:
    """The API paths (under /v1/) among an OpenAPI document's `paths` that take no path
    parameter, in the document's order."""
    return [path for path in paths if path.startswith(_API_PREFIX) and "{" not in path]


def _allowed_methods(request: Request) -> list[str]:
    """Every method some route serves at this path (routing's own 405 names the first route's)."""
    routes = request.app.router.routes
    return [method for method in _METHODS
            if any(route.matches({**request.scope, "method": method})[0] is Match.FULL for route in routes)]


_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")


# What each error status means, for the OpenAPI document; a route may say more of its own case.
ERROR_DESCRIPTIONS: Mapping[int | str, str] = {
    400: "The request is malformed or refused as it stands (bad JSON, a wrong type, an unknown "
         "priority, a bad header); the message names what is wrong and nothing was queued.",
    401: "Missing or invalid API key.",
    403: "The key's tenant may not do this: use this priority or model, or call the admin API.",
    404: "Not found.",
    409: "The request conflicts with the state of a job.",
    413: "The request body is over the configured limit.",
    429: "Over the tenant's rate limit or the queue's admission limit: retry after `Retry-After` seconds.",
    502: "The provider failed.",
    503: "The queue's backend or another shared store cannot be reached.",
    504: "No answer in time.",
}
_RETRY_AFTER = {"Retry-After": {"description": "Seconds to wait before trying again (a 429 about "
                                "a spent daily budget has none).",
                                "schema": {"type": "integer", "minimum": 1}}}


def error_responses(
    *statuses: int | str, described: Mapping[int | str, str] | None = None,
    model: type[BaseModel] = ErrorResponse,
) -> dict[int | str, dict[str, Any]]:
    """The OpenAPI `responses` of these error statuses, each answering a `model` (a dialect's
    error shape; OpenAI's ErrorResponse unless said), with the route's own description where
    `described` gives one (a status only described is included)."""
    own = dict(described or {})
    responses: dict[int | str, dict[str, Any]] = {}
    for status in dict.fromkeys([*statuses, *own]):
        response: dict[str, Any] = {"model": model,
                                    "description": own.get(status) or ERROR_DESCRIPTIONS[status]}
        if status == 429:
            response["headers"] = _RETRY_AFTER
        responses[status] = response
    return responses
