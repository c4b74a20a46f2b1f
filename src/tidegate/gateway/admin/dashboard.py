"""GET /dashboard: a live page of the queue for a person to keep open.

The page (static/dashboard.html, .css, .js) is plain HTML, CSS and JavaScript that polls the admin
API (GET /v1/stats, GET /v1/dlq, GET /v1/admin/provider-batches) and the batches (GET /v1/batches)
and redrives dead letters through it; it draws its own charts and loads nothing from outside this
gateway. Serving the files needs no key, since they hold no data: the API calls do, with the admin
key the page asks for (kept in the tab's sessionStorage and sent as `Authorization: Bearer`), or
none in embedded mode. `/dashboard#key=tg_…` opens it with the key (a bookmark, a headless
screenshot): the fragment never reaches the server, and the page takes it out of the address.
"""

from __future__ import annotations

import functools
from importlib.resources import files

from fastapi import APIRouter
from fastapi.responses import Response

from tidegate.gateway.core.errors import ApiError

__all__ = ["router"]

router = APIRouter(include_in_schema=False)

_PAGE = "dashboard.html"
_ASSETS = {
    "dashboard.css": "text/css; charset=utf-8",
    "dashboard.js": "text/javascript; charset=utf-8",
}
# Only this gateway's own files and API: an injected script or a data exfiltration attempt (say,
# through a provider's error message shown in the dead-letter table) has nowhere to load from or
# send to, and no other site may frame the page to trick a click on "Redrive all".
_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",  # revalidate, so an upgraded gateway serves its own page
}


@functools.cache
def _read(name: str) -> bytes:
    # Read once from the installed package (wheel or source tree); the files never change while
    # the process runs.
    return files("tidegate.gateway.admin").joinpath("static", name).read_bytes()


@router.get("/dashboard")
async def dashboard() -> Response:
    """The dashboard page."""
    return Response(_read(_PAGE), media_type="text/html; charset=utf-8", headers=_HEADERS)


@router.get("/dashboard/{name}")
async def dashboard_asset(name: str) -> Response:
    """The page's stylesheet and script; nothing else is served from the folder."""
    media_type = _ASSETS.get(name)
    if media_type is None:
        raise ApiError(404, f"no dashboard file named {name!r}", code="not_found")
    return Response(_read(name), media_type=media_type, headers=_HEADERS)
