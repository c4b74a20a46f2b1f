"""The gateway's fast path for POST /v1/chat/completions and /v1/embeddings answers exactly as
FastAPI's own routes do: the same requests, sent to the app with and without it (one state, one
worker), get the same status, the same error documents and the same headers."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import httpx
import orjson
import pytest
from starlette.types import ASGIApp, Receive, Scope, Send

from conftest import QueueFactory
from support.gateway import Gateway, open_gateway
from tidegate.gateway.app import create_app
from tidegate.gateway.openai.fast_path import FastPath

pytestmark = pytest.mark.sqlite_only  # the path is the gateway's, whatever the queue

HELLO = {"role": "user", "content": "Say hello"}
CHAT = {"model": "auto", "messages": [HELLO]}
JSON = {"Content-Type": "application/json"}
OVER_THE_LIMIT = b"(a body one byte over the gateway's limit)"
SUCCEED = ("chat", "embeddings")

# (name, path, tenant or None, extra headers, body): each is answered without reaching a worker,
# but the first two, which succeed.
CASES: list[tuple[str, str, str | None, dict[str, str], bytes]] = [
    ("chat", "/v1/chat/completions", "acme", {}, orjson.dumps(CHAT)),
    ("embeddings", "/v1/embeddings", "acme", {}, orjson.dumps({"model": "text-embedding-3-small",
                                                                "input": "hello"})),
    ("not JSON", "/v1/chat/completions", "acme", {}, b'{"model": '),
    ("not UTF-8", "/v1/chat/completions", "acme", {}, b'{"model": "caf\xe9"}'),
    ("not an object", "/v1/chat/completions", "acme", {}, b"[1, 2]"),
    ("empty", "/v1/chat/completions", "acme", {}, b""),
    ("NaN", "/v1/chat/completions", "acme", {}, b'{"model": "auto", "temperature": NaN, "messages": []}'),
    ("no messages", "/v1/chat/completions", "acme", {}, orjson.dumps({"model": "auto"})),
    ("wrong type", "/v1/chat/completions", "acme", {}, orjson.dumps({**CHAT, "temperature": "hot"})),
    ("unknown model", "/v1/chat/completions", "acme", {}, orjson.dumps({**CHAT, "model": "gpt-0"})),
    ("model not allowed", "/v1/chat/completions", "narrow", {}, orjson.dumps({**CHAT, "model": "gpt-4.1"})),
    ("wrong kind of model", "/v1/embeddings", "acme", {}, orjson.dumps({"model": "gpt-4.1", "input": "x"})),
    ("bad priority", "/v1/chat/completions", "acme", {"X-Priority": "urgent"}, orjson.dumps(CHAT)),
    ("priority above the tenant's", "/v1/chat/completions", "acme", {"X-Priority": "critical"},
     orjson.dumps(CHAT)),
    ("body priority above the tenant's", "/v1/chat/completions", "acme", {},
     orjson.dumps({**CHAT, "priority": "critical"})),
    ("bad timeout", "/v1/chat/completions", "acme", {"X-Tidegate-Timeout": "-1"}, orjson.dumps(CHAT)),
    ("bad idempotency key", "/v1/chat/completions", "acme", {"Idempotency-Key": "has space"},
     orjson.dumps(CHAT)),
    ("no key", "/v1/chat/completions", None, {}, orjson.dumps(CHAT)),
    ("unknown key", "/v1/chat/completions", None, {"Authorization": "Bearer tg_nope"}, orjson.dumps(CHAT)),
    ("malformed authorization", "/v1/chat/completions", None, {"Authorization": "Basic abc"},
     orjson.dumps(CHAT)),
    ("invalid body and no key", "/v1/chat/completions", None, {}, b"[]"),
    ("text/plain", "/v1/chat/completions", "acme", {"Content-Type": "text/plain"}, orjson.dumps(CHAT)),
    ("too many messages", "/v1/chat/completions", "acme", {},
     orjson.dumps({**CHAT, "messages": [HELLO] * 10_001})),
    ("over the body limit", "/v1/chat/completions", "acme", {}, OVER_THE_LIMIT),
]
# What differs between two successful answers of the same request.
_PER_JOB = {"x-tidegate-job-id", "x-tidegate-queue-wait-ms", "x-tidegate-upstream-latency-ms",
            "x-tidegate-cost-usd", "content-length", "date"}


class ScopeRecorder:
    """An ASGI app that keeps the scope of each request it passes on, as the app left it."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.scopes: list[Scope] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.scopes.append(scope)
        await self.app(scope, receive, send)


@contextlib.asynccontextmanager
async def two_apps(gw: Gateway) -> AsyncIterator[tuple[httpx.AsyncClient, httpx.AsyncClient, ScopeRecorder]]:
    """Clients of the gateway's app with its fast path and of the same app without it, and the
    recorder of the scopes the first one served."""
    fast = ScopeRecorder(create_app(gw.state))
    plain = create_app(gw.state)
    plain.user_middleware = [entry for entry in plain.user_middleware
                             if entry.cls is not FastPath]  # type: ignore[comparison-overlap]
    async with (httpx.AsyncClient(transport=httpx.ASGITransport(app=fast), base_url="http://gw") as a,
                httpx.AsyncClient(transport=httpx.ASGITransport(app=plain), base_url="http://gw") as b):
        yield a, b, fast


def _comparable(answer: httpx.Response) -> dict[str, Any]:
    headers = {name: value for name, value in answer.headers.items() if name not in _PER_JOB}
    if answer.status_code == 200:
        document = answer.json()
        return {"status": 200, "headers": headers, "object": document["object"], "model": document["model"]}
    return {"status": answer.status_code, "headers": headers, "body": answer.json()}


@pytest.mark.parametrize(("name", "path", "tenant", "headers", "body"), CASES,
                         ids=[case[0] for case in CASES])
async def test_the_fast_path_answers_as_fastapis_routes_do(
    queue_factory: QueueFactory, name: str, path: str, tenant: str | None, headers: dict[str, str],
    body: bytes,
) -> None:
    async with open_gateway(queue_factory) as gw, two_apps(gw) as (fast, plain, served):
        sent = {**JSON, **(gw.auth(tenant) if tenant else {}), **headers}
        if body == OVER_THE_LIMIT:
            body = b" " * gw.state.max_body_bytes + b"{}"

        through_fast = await fast.post(path, content=body, headers=sent)
        through_plain = await plain.post(path, content=body, headers=sent)

        assert _comparable(through_fast) == _comparable(through_plain)
        if name in SUCCEED:
            assert through_fast.status_code == 200
            # FastAPI's router, which the fast path leaves out, names the endpoint it called
            [scope] = served.scopes
            assert "endpoint" not in scope and scope["route"].path == path
        else:
            assert 400 <= through_fast.status_code < 500
            assert through_fast.json()["error"]["code"]


async def test_the_fast_path_counts_its_requests_under_the_routes_template(
    queue_factory: QueueFactory,
) -> None:
    async with open_gateway(queue_factory) as gw, gw.openai("acme") as client:
        await client.chat.completions.create(**CHAT)  # type: ignore[call-overload]

        metrics = (await gw.http.get("/metrics")).text
        counted = 'tidegate_gateway_requests_total{method="POST",route="/v1/chat/completions",status="200"}'
        assert f"{counted} 1.0" in metrics
