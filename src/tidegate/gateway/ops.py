"""Operations endpoints: GET /metrics (Prometheus), GET /healthz (the process is up) and
GET /readyz (the queue answers). None needs an API key: probes and scrapers carry none, and
nothing here names a tenant's data."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from tidegate.errors import TidegateError
from tidegate.gateway.core.auth import StateDep

__all__ = ["router"]

router = APIRouter(tags=["Operations"])


@router.get("/metrics", summary="Prometheus metrics", response_class=Response,
            responses={200: {"content": {CONTENT_TYPE_LATEST: {"schema": {"type": "string"}}},
                             "description": "Prometheus text format."}})
async def metrics(state: StateDep) -> Response:
    """The gateway's request counts, latencies and time to first token, and the metrics of any
    extra registry (workers running in the same process)."""
    text = b"".join(generate_latest(registry) for registry in state.registries)
    return Response(text, media_type=CONTENT_TYPE_LATEST)


@router.get("/healthz", summary="Liveness")
async def healthz() -> dict[str, str]:
    """200 while the process serves requests."""
    return {"status": "ok"}


@router.get("/readyz", summary="Readiness",
            responses={503: {"description": "The queue's backend does not answer."}})
async def readyz(state: StateDep) -> JSONResponse:
    """200 when the queue answers a cheap stats call in time, 503 otherwise."""
    try:
        await asyncio.wait_for(state.queue.stats(), state.settings.readiness_timeout_s)
    except (TidegateError, TimeoutError) as exc:
        reason = "timed out" if isinstance(exc, TimeoutError) else str(exc)
        return JSONResponse({"status": "unavailable", "reason": reason}, status_code=503)
    return JSONResponse({"status": "ready"})
