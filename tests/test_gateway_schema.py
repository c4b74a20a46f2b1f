"""Schemathesis against the gateway's own OpenAPI document: every operation, called with generated
requests (valid and invalid), answers without a 5xx, with a status and content type its document
lists, and with a body and headers that match the schemas it declares.

The gateway is real: uvicorn on a loopback port, a worker and the simulated provider behind it, on
each queue backend. It runs on an event loop of its own (an anyio blocking portal) because
schemathesis calls it synchronously. Short gateway waits bound every call: a synchronous call
that gets no result in time answers its documented 504. Generation is seeded and deterministic,
with no example database, so CI sends the same requests every run.
"""

from __future__ import annotations

import asyncio
import tempfile
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import schemathesis
from anyio.from_thread import start_blocking_portal

from conftest import BACKENDS, QueueFactory, _delete_redis_queue
from gateway_support import CHAT, Gateway, open_gateway
from tidegate.config import TidegateConfig, default_models
from tidegate.gateway.app import create_app
from tidegate.gateway.settings import GatewaySettings
from tidegate.gateway.state import GatewayState

# Waits short enough that no generated call can hold the run: a synchronous call answers 504
# after `request_timeout_s` (X-Tidegate-Timeout may ask for up to `max_request_timeout_s`), and a
# long-poll returns after `max_wait_s`.
SETTINGS = GatewaySettings(request_timeout_s=1.0, max_request_timeout_s=2.0, max_wait_s=1.0)
SEED = 20_240_501
MAX_EXAMPLES = 25  # per operation, tenant and backend, in the fuzzing phase
REQUEST_TIMEOUT_S = 10.0  # the client's own guard, well above any wait the gateway may take
CHECKS = (
    "not_a_server_error",
    "status_code_conformance",
    "content_type_conformance",
    "response_schema_conformance",
    "response_headers_conformance",
)
# An admin, who may call every operation, and a plain tenant, who gets the documented 403s.
TENANTS = ["ops", "acme"]

# The document types priorities, timeouts, idempotency keys and model names as free strings, so
# generated values would almost all be refused at admission. In most calls of the fuzzing phase
# these parameters take a realistic value (in the others a generated one), so the calls get
# through to the queue, the worker and the simulator. Two shared idempotency keys make repeats
# meet across endpoints.
DICTIONARIES: dict[str, list[str]] = {
    "priorities": ["critical", "high", "normal", "low", "bulk", "0", "4"],
    "timeouts": ["0.2", "1", "30"],
    "idempotency_keys": ["repeat-1", "repeat-2"],
    "models": ["auto", *(model.name for model in default_models())],
}
BINDINGS: dict[str, tuple[str, float]] = {  # parameter → (dictionary, probability of using it)
    "header.X-Priority": ("priorities", 0.8),
    "body.priority": ("priorities", 0.8),
    "body.jobs[*].priority": ("priorities", 0.8),
    "header.X-Tidegate-Timeout": ("timeouts", 0.8),
    "header.Idempotency-Key": ("idempotency_keys", 0.2),
    "body.model": ("models", 0.8),
}


def _openapi_document() -> dict[str, Any]:
    """The gateway's OpenAPI document, as `create_app` builds it.

    Schemathesis makes one test per operation at collection time, before any fixture runs (its
    fixture-based loader does not work with pytest 9.2), so the document comes from an app built
    around a throwaway state: it depends on the routes only, which
    test_the_running_gateway_serves_the_tested_document checks."""

    async def build() -> dict[str, Any]:
        with tempfile.TemporaryDirectory() as tmp:
            async with GatewayState.open(TidegateConfig(queue_url=f"sqlite:///{tmp}/queue.db")) as state:
                return create_app(state).openapi()

    return asyncio.run(build())


DOCUMENT = _openapi_document()
schema = schemathesis.openapi.from_dict(DOCUMENT, config=schemathesis.Config.from_dict({
    "seed": SEED,
    "request-timeout": REQUEST_TIMEOUT_S,
    "generation": {"max-examples": MAX_EXAMPLES, "deterministic": True, "database": "none"},
    "checks": {"enabled": False, **{name: {"enabled": True} for name in CHECKS}},
    "dictionaries": {name: {"values": values} for name, values in DICTIONARIES.items()},
    "parameters": {key: {"dictionary": name, "probability": probability}
                   for key, (name, probability) in BINDINGS.items()},
}))


@pytest.fixture(scope="module", params=BACKENDS)
def gateway(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    """A gateway with a worker and the simulator on each queue backend, served from an event
    loop in another thread. A worker that crashed fails its teardown."""
    backend: str = request.param
    if backend == "sqlite":
        factory = QueueFactory(backend, f"sqlite:///{tmp_path_factory.mktemp('schema') / 'queue.db'}")
    else:
        factory = QueueFactory(backend, request.getfixturevalue("redis_server"),
                               {"name": f"t{uuid.uuid4().hex[:12]}"})
    with start_blocking_portal() as portal:
        try:
            with portal.wrap_async_context_manager(open_gateway(factory, settings=SETTINGS)) as gw:
                yield gw
        finally:
            portal.call(factory.aclose)
            if backend == "redis":
                portal.call(_delete_redis_queue, factory.url, factory.queue_name)


def test_the_running_gateway_serves_the_tested_document(gateway: Gateway) -> None:
    assert httpx.get(f"{gateway.url}/openapi.json").json() == DOCUMENT


@pytest.mark.parametrize("tenant", TENANTS)
@schema.parametrize()
def test_every_operation_answers_as_its_schema_says(
    case: schemathesis.Case, gateway: Gateway, tenant: str
) -> None:
    case.call_and_validate(base_url=gateway.url, headers=gateway.auth(tenant))


def _job(extra: str) -> str:
    """A chat job as raw JSON text (which, unlike a dict, can hold `Infinity`) with `extra`."""
    return '{"kind": "chat", "body": {"messages": [{"role": "user", "content": "hi"}]}, ' + extra + "}"


# Requests that once answered 500, or were queued as a job no worker could read (a deadline past
# the year 9999 crashed every worker that claimed it). Kept here because random generation finds
# them only sometimes.
TAMED = [
    pytest.param("DELETE", "/v1/dlq?older_than_s=1e300", None, id="purge-older-than-overflows"),
    pytest.param("POST", "/v1/jobs", _job('"timeout_s": 1e12'), id="deadline-unreadable"),
    pytest.param("POST", "/v1/jobs", _job('"timeout_s": Infinity'), id="deadline-infinite"),
    pytest.param("POST", "/v1/jobs", _job('"callback_url": "http://[::1/"'), id="callback-bad-ipv6"),
    pytest.param("POST", "/v1/jobs", _job('"callback_url": "http://a:99999/"'), id="callback-bad-port"),
    pytest.param("POST", "/v1/jobs", _job('"callback_url": "http://a..b/"'), id="callback-empty-label"),
]


@pytest.mark.parametrize(("method", "path", "body"), TAMED)
def test_requests_that_broke_the_gateway_are_refused_with_400(
    gateway: Gateway, method: str, path: str, body: str | None
) -> None:
    answer = httpx.request(method, f"{gateway.url}{path}", content=body,
                           headers={**gateway.auth("ops"), "Content-Type": "application/json"})

    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["type"] == "invalid_request_error"


def test_an_idempotency_key_repeated_on_the_other_endpoint_is_a_conflict(gateway: Gateway) -> None:
    # Given a chat completion made with an Idempotency-Key
    headers = {**gateway.auth("acme"), "Idempotency-Key": f"kind-{uuid.uuid4().hex}"}
    chat = httpx.post(f"{gateway.url}/v1/chat/completions", json=CHAT, headers=headers,
                      timeout=REQUEST_TIMEOUT_S)
    assert chat.status_code == 200, chat.text

    # When the same key comes with an embeddings request
    answer = httpx.post(f"{gateway.url}/v1/embeddings", json={"input": "hello"}, headers=headers,
                        timeout=REQUEST_TIMEOUT_S)

    # Then it is refused, naming the chat job, rather than answered with a chat completion
    assert answer.status_code == 409, answer.text
    assert answer.json()["error"]["code"] == "idempotency_key_reused"
    assert answer.headers["X-Tidegate-Job-Id"] == chat.headers["X-Tidegate-Job-Id"]
