"""The gateway's FastAPI application, built around an open GatewayState.

    async with open_gateway_state(config) as state:   # tidegate.app.gateway
        app = create_app(state)          # serve with uvicorn, or test with httpx's ASGITransport

The app owns nothing: whoever opened the state closes it, so tests and `tidegate up` can share
their queue, relay and metrics with in-process workers.

Authentication (see tidegate.gateway.core.auth): `Authorization: Bearer <key>`. In embedded mode (a
loopback bind and no tenant or key in the store) requests without a key are served as the
built-in local tenant; once a key exists, or on any other bind, a valid key is required.
"""

from __future__ import annotations

import inspect
from typing import Any

from fastapi import FastAPI

from tidegate import __version__
from tidegate.gateway import jobs, ops, recs
from tidegate.gateway.admin import dashboard, provider_batches
from tidegate.gateway.admin import routes as admin_routes
from tidegate.gateway.anthropic import routes as anthropic_routes
from tidegate.gateway.batches import file_routes
from tidegate.gateway.batches import routes as batch_routes
from tidegate.gateway.core.errors import install_error_handlers
from tidegate.gateway.core.middleware import UPLOAD_LIMIT_SETTING, BodyCap, BodyLimit, RequestMetrics
from tidegate.gateway.core.openapi import install_openapi
from tidegate.gateway.core.state import GatewayState
from tidegate.gateway.core.traces import ServerSpans
from tidegate.gateway.openai import routes as openai_routes
from tidegate.gateway.openai.fast_path import FastPath
from tidegate.gateway.responses import routes as responses_routes
from tidegate.tracing import tracer

__all__ = ["create_app"]

_DESCRIPTION = """\
An OpenAI-compatible gateway in front of a durable priority queue.

* **OpenAI-compatible**: point an OpenAI SDK at `/v1`. Each call is queued at its priority
  (`X-Priority` header or `priority` body field: critical, high, normal, low, bulk or 0-4) and
  answered with the provider's response plus `X-Tidegate-*` headers, or with an OpenAI-shaped
  error (`{"error": {"message", "type", "param", "code"}}`) saying why not: invalid requests answer 400,
  never 422, and a job that died answers the status its worker recorded.
* **Responses**: OpenAI's Responses API (`client.responses.*`), each response a job of the queue:
  create (waiting, streamed or in the background), retrieve, cancel, delete, input items.
* **Anthropic Messages**: point an Anthropic SDK at the gateway (`/v1/messages`): each message
  is queued the same way and answered as a Message, errors in Anthropic's shape.
* **Files and Batches**: OpenAI's Files and Batch APIs; every line of a batch is a job at the
  batch's priority (bulk by default), so interactive calls overtake it.
* **Jobs**: enqueue work (one job or a batch) and fetch, long-poll or cancel it later.
* **Recommendations**: a user's recommendations (one or a batch of users), computed
  incrementally from the change flow; direct ingestion of interactions; the model's freshness.
* **Admin**: queue statistics, dead letters, tenants and API keys (admin tenants only).
  A live page of them is at `/dashboard`.

Authenticate with `Authorization: Bearer <api key>` (or `x-api-key: <api key>`, as Anthropic's
SDKs send it). A gateway bound to loopback with no tenant or key configured serves requests
without a key (embedded mode).
"""

_TAGS = [
    {"name": "OpenAI-compatible", "description": "Chat completions, embeddings and models."},
    {"name": "Responses", "description": "OpenAI's Responses API: each response is a queued job."},
    {"name": "Anthropic Messages", "description": "Anthropic's Messages API over the same queue."},
    {"name": "Files", "description": "Uploaded files: batch input, and the output batches write."},
    {"name": "Batches", "description": "OpenAI's Batch API: a file of requests, each a job at bulk."},
    {"name": "Jobs", "description": "Asynchronous jobs: enqueue, poll, cancel."},
    {"name": "Recommendations", "description": "Real-time recommendations, interactions and freshness."},
    {"name": "Admin", "description": "Statistics, dead letters, tenants and keys (admin only)."},
    {"name": "Operations", "description": "Metrics, liveness and readiness."},
]


# FastAPI's own OpenTelemetry instrumentation (in recent releases) looks the global providers up
# on every request; the gateway counts its requests itself (/metrics), so it is turned off.
# Older releases have none to turn off.
_NO_NATIVE_TELEMETRY: dict[str, Any] = (
    {"telemetry": {"tracing": False, "metrics": False, "logs": False}}
    if "telemetry" in inspect.signature(FastAPI).parameters else {}
)


def create_app(state: GatewayState) -> FastAPI:
    """The gateway application serving `state`."""
    app = FastAPI(title="tidegate gateway", version=__version__, description=_DESCRIPTION,
                  openapi_tags=_TAGS, **_NO_NATIVE_TELEMETRY)
    app.state.gateway = state
    install_error_handlers(app)
    install_openapi(app, max_body_bytes=state.max_body_bytes, settings=state.settings)
    modules = (openai_routes, responses_routes, anthropic_routes, file_routes, batch_routes, jobs, recs,
               admin_routes, provider_batches, ops, dashboard)
    for module in modules:
        app.include_router(module.router)
    # The last added runs first: metrics see every answer, including a 413; the fast path runs
    # inside the body limit, on the body it lets through.
    app.add_middleware(FastPath, gateway=app)
    # An upload's body holds a whole file: its own limit, the file's plus the multipart envelope.
    upload_bytes = state.settings.max_file_bytes + file_routes.MULTIPART_ENVELOPE_BYTES
    uploads = {file_routes.UPLOADS_PATH: BodyCap(upload_bytes, UPLOAD_LIMIT_SETTING)}
    app.add_middleware(BodyLimit, max_bytes=state.max_body_bytes, paths=uploads,
                       routes=[route for module in modules for route in module.router.routes])
    app.add_middleware(RequestMetrics, metrics=state.metrics)
    if tracer().enabled:  # off, requests do not even pass through it
        app.add_middleware(ServerSpans)
    return app
