"""The gateway's OpenAPI document, made to say what the gateway does where FastAPI's generated one
says otherwise.

- No 422: FastAPI documents its validation error (422, `HTTPValidationError`) on every route with
  parameters or a body, but the gateway answers such requests 400 with an OpenAI-shaped error
  (see errors.install_error_handlers), which each route documents.
- Request headers carry the schema their check uses (intake.HEADER_SCHEMAS): FastAPI would
  describe them as free strings, or null.
- The limits JSON Schema cannot state are given in words where they apply (each 413 names the
  body limit) and as numbers under `info.x-tidegate-limits`; every other bound is the schemas' own
  maximum / maxLength, from the constants of tidegate.gateway.core.limits.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import FastAPI
from pydantic import BaseModel, WithJsonSchema

from tidegate.gateway.core.http_server import MAX_HEADER_BYTES
from tidegate.gateway.core.intake import HEADER_SCHEMAS
from tidegate.gateway.core.settings import GatewaySettings

__all__ = ["documented_as", "install_openapi"]

_VALIDATION_SCHEMAS = ("HTTPValidationError", "ValidationError")
_COMPONENTS = "#/components/schemas/{model}"
# The models that document a body a route decodes itself (see `documented_as`), by name.
_DOCUMENTED: dict[str, type[BaseModel]] = {}


def documented_as(model: type[BaseModel]) -> WithJsonSchema:
    """The schema of a route's raw JSON body (`Annotated[dict[str, Any], documented_as(model)]`)
    that the route decodes itself, with the typed contract (tidegate.contract): the document
    names `model`'s schema for it, and holds that schema among its components."""
    _DOCUMENTED[model.__name__] = model
    return WithJsonSchema({"$ref": _COMPONENTS.format(model=model.__name__)})


def install_openapi(app: FastAPI, *, max_body_bytes: int, settings: GatewaySettings) -> None:
    """Make `app.openapi()` (and so /openapi.json and /docs) serve the corrected document, which
    states the request body limit `max_body_bytes` and the limits of `settings`."""
    generate: Callable[[], dict[str, Any]] = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            document = generate()  # FastAPI's, which it caches in app.openapi_schema
            correct(document)
            publish_limits(document, max_body_bytes, settings)
        return app.openapi_schema or {}

    app.openapi = openapi  # type: ignore[method-assign]


def correct(document: dict[str, Any]) -> None:
    """Remove the 422 answers and their schemas; give each known header its real schema; add the
    schemas of the bodies routes decode themselves (`documented_as`)."""
    for path_item in document.get("paths", {}).values():
        for operation in path_item.values():
            if not isinstance(operation, dict):
                continue
            operation.get("responses", {}).pop("422", None)
            for parameter in operation.get("parameters", ()):
                schema = HEADER_SCHEMAS.get(parameter.get("name", ""))
                if parameter.get("in") == "header" and schema is not None:
                    parameter["schema"] = dict(schema)
    schemas = document.setdefault("components", {}).setdefault("schemas", {})
    for name in _VALIDATION_SCHEMAS:
        schemas.pop(name, None)
    for name, model in _DOCUMENTED.items():
        schema = model.model_json_schema(ref_template=_COMPONENTS)
        schemas.update(schema.pop("$defs", {}))
        schemas[name] = schema


def publish_limits(document: dict[str, Any], max_body_bytes: int, settings: GatewaySettings) -> None:
    """State the limits the schemas cannot know on their own: the body and header sizes (in each
    413's description, and under `info.x-tidegate-limits` as numbers), and the gateway's
    configured counts of messages and batched jobs (as the schemas' maxItems)."""
    document.setdefault("info", {})["x-tidegate-limits"] = {
        "max_body_bytes": max_body_bytes, "max_header_bytes": MAX_HEADER_BYTES,
        "max_messages": settings.max_messages, "max_batch": settings.max_batch}
    schemas = document.get("components", {}).get("schemas", {})
    for model, field, limit in (("ChatCompletionRequest", "messages", settings.max_messages),
                                ("JobBatch", "jobs", settings.max_batch)):
        prop = schemas.get(model, {}).get("properties", {}).get(field)
        if prop is not None:
            prop["maxItems"] = limit
    for path_item in document.get("paths", {}).values():
        for operation in path_item.values():
            if not isinstance(operation, dict):
                continue
            responses = operation.setdefault("responses", {})
            if "413" in responses:
                responses["413"]["description"] = (
                    f"The request body is over {max_body_bytes} bytes (what the queue takes as one job, "
                    "plus the request's own fields).")
            responses.setdefault("431", {
                "description": f"The request headers are over {MAX_HEADER_BYTES} bytes in all.",
                "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorResponse"}}},
            })
