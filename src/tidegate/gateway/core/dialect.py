"""The seam between the gateway and the API shapes it speaks: a dialect. It is the one seam for
every shape, in and out: OpenAI's chat completions and embeddings (`tidegate.gateway.openai.dialect`),
OpenAI's Responses API (`tidegate.gateway.responses.dialect`) and Anthropic's Messages
(`tidegate.gateway.anthropic.dialect`) each implement it, in the package of their surface.

Everything between the HTTP edge and the queue is shared: the intake (priority, entitlements,
limits, idempotency, enqueue: tidegate.gateway.core.intake), the wait for the job and what its
ending means (tidegate.gateway.core.outcomes), the relay of a stream
(tidegate.gateway.core.streaming). A dialect is what differs from one API to another: how a
request body reads and what the answers look like.

A new dialect (Anthropic Messages, say) is a package of its surface under `tidegate.gateway`:
`dialect.py` with one `Dialect` subclass, `schemas.py` with the pydantic models of its bodies
(which its routes name for validation and the OpenAPI document) and `routes.py`. It implements:

- `request(kind, body)`: a body its routes validated (OpenAI's: decoded into the typed contract,
  tidegate.contract; the other dialects': their pydantic models) → the `AIRequest` that is queued;
- `parse(kind, body, where)`: a raw body (one inside another document) → an `AIRequest`, a body
  that does not validate refused with an `ApiError` naming `where`;
- `answer(result, headers)`: the job's `AIResult` → the HTTP response of a call that waited;
- `stream(request)`: a `StreamRenderer` that turns the job's `StreamPart`s into SSE frames;
- `error_body(error)`: an `ApiError` → the body of an error answer. The app's error handlers
  use it for every error of a route made by the dialect's `router()`, validation errors included.

Its routes (a thin module like tidegate.gateway.openai.routes) parse with it, hand the AIRequest
to `intake.submit`, wait with `outcomes.succeeded` or relay with `streaming.stream_job`, and
answer with it.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from typing import Any, ClassVar, TypeVar

from fastapi import APIRouter
from fastapi.responses import Response
from fastapi.routing import APIRoute
from pydantic import BaseModel, ValidationError

from tidegate.ai import AIRequest, AIResult, Kind, Origin, OriginApi, StreamPart
from tidegate.contract import InvalidRequestBody, RequestBody, decode
from tidegate.gateway.core.errors import ApiError

__all__ = ["Dialect", "StreamRenderer", "decoded", "decoded_origin", "validated"]

_Body = TypeVar("_Body", bound=BaseModel)


def validated(model: type[_Body], body: Mapping[str, Any], where: str) -> _Body:
    """A raw body checked against a route's model: a body that does not validate is a 400
    naming each bad field from `where` (for `Dialect.parse`)."""
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join([where, *map(str, error['loc'])])}: {error['msg']}" for error in exc.errors()[:10]
        )
        raise ApiError(400, f"invalid request: {problems}", code="invalid_request", param=where) from None


def decoded(kind: Kind, body: object, where: str = "") -> RequestBody:
    """A raw body decoded into the struct of its kind (tidegate.contract), once: a body that does
    not decode is a 400 naming the field (inside another document: from `where`, its `param`)."""
    try:
        return decode(kind, body)
    except InvalidRequestBody as exc:
        raise _refused(exc, where) from None


def decoded_origin(api: OriginApi, body: Mapping[str, Any], *, native_only: bool = False,
                   context: tuple[dict[str, Any], ...] = ()) -> Origin:
    """The origin of a job made from a request in `api`'s shape, its body (as its route validated
    it) decoded into its struct (tidegate.contract) once; a 400 naming the field it refuses."""
    try:
        return Origin.of(api, body, native_only=native_only, context=context)
    except InvalidRequestBody as exc:
        raise _refused(exc, "") from None


def _refused(exc: InvalidRequestBody, where: str) -> ApiError:
    field = f"{where}.{exc.param}" if where else exc.param
    return ApiError(400, f"invalid request: {field}: {exc.detail}", code="invalid_request",
                    param=where or field)


class StreamRenderer(abc.ABC):
    """Writes one job's stream as server-sent events. `saw_content` turns true at the frame of the
    first content (the time to first token is measured there), `failed` at an error frame."""

    def __init__(self) -> None:
        self.saw_content = False
        self.failed = False

    @abc.abstractmethod
    def frame(self, part: StreamPart) -> bytes | None:
        """The SSE frame of one part, or None when this API shows nothing of it."""

    @abc.abstractmethod
    def error_frame(self, error: ApiError) -> bytes:
        """The frame that ends a stream which failed after it started."""

    @abc.abstractmethod
    def end_frame(self) -> bytes:
        """The frame that ends a stream which did not fail."""

    @abc.abstractmethod
    def whole_answer(self, result: AIResult, job_id: str) -> list[StreamPart]:
        """A stored (non-streamed) answer as the parts of a stream, so that a streaming client is
        served when the worker could not stream (it had no relay)."""


class Dialect(abc.ABC):
    """One API shape the gateway speaks (see the module's docstring for what a subclass does)."""

    name: ClassVar[str]

    @abc.abstractmethod
    def request(self, kind: Kind, body: Any) -> AIRequest:
        """The job request of a body this dialect's route validated (its struct or its model)."""

    @abc.abstractmethod
    def parse(self, kind: Kind, body: Mapping[str, Any], where: str) -> AIRequest:
        """The job request of a raw body, validated as this dialect's route would validate it."""

    @abc.abstractmethod
    def answer(self, result: AIResult, headers: Mapping[str, str]) -> Response:
        """The response to a call whose job succeeded."""

    @abc.abstractmethod
    def stream(self, request: AIRequest) -> StreamRenderer:
        """A renderer of this request's stream."""

    @abc.abstractmethod
    def error_body(self, error: ApiError) -> dict[str, Any]:
        """The body of an error answer."""

    def router(self, **options: Any) -> APIRouter:
        """An APIRouter (FastAPI's `options`) whose routes answer errors in this dialect's shape."""
        shape = self.error_body

        class DialectRoute(APIRoute):
            """A route of this dialect; tidegate.gateway.core.errors reads its `error_shape`."""

            error_shape = staticmethod(shape)

        return APIRouter(route_class=DialectRoute, **options)
