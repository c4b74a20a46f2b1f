"""Schemathesis against the gateway's own OpenAPI document: every operation, called with generated
requests (valid and invalid), answers without a 5xx, with a status and content type its document
lists, and with a body and headers that match the schemas it declares.

The gateway is real: uvicorn on a loopback port, a worker and the simulated provider behind it, on
each queue backend. It runs on an event loop of its own (an anyio blocking portal) because
schemathesis calls it synchronously. Short gateway waits bound every call: a synchronous call
that gets no result in time answers its documented 504. Generation is seeded and deterministic,
with no example database, so CI sends the same requests every run.

The document itself is checked too: no operation documents FastAPI's 422 (the gateway answers 400),
every error is OpenAI-shaped (Anthropic-shaped on the Anthropic Messages routes), and each request
header's schema accepts exactly the values the gateway accepts.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import schemathesis
from anyio.from_thread import start_blocking_portal
from jsonschema import Draft202012Validator

from conftest import BACKENDS, drop_factory, new_factory
from support.gateway import CHAT, Gateway, open_gateway, with_legacy_models
from tidegate.app.gateway import open_gateway_state
from tidegate.config import TidegateConfig
from tidegate.gateway.app import create_app
from tidegate.gateway.core.settings import GatewaySettings
from tidegate.simulator.catalogue import default_models, legacy_models

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
# A synchronous call whose wait (X-Tidegate-Timeout, any number the document allows) ends before
# its result answers 504 by design, naming the job to poll: no server error. Every other 5xx is.
NOT_SERVER_ERRORS = ["2xx", "3xx", "4xx", "504"]
# An admin, who may call every operation, and a plain tenant, who gets the documented 403s.
TENANTS = ["ops", "acme"]

# The document types the body's priorities and model names as free strings, so generated values
# would almost all be refused at admission; header values follow their patterns but rarely name a
# level the tenant may use. In most calls of the fuzzing phase these parameters take a realistic
# value (in the others a generated one), so the calls get through to the queue, the worker and the
# simulator. Two shared idempotency keys make repeats meet across endpoints.
DICTIONARIES: dict[str, list[str]] = {
    "priorities": ["critical", "high", "normal", "low", "bulk", "0", "4"],
    "timeouts": ["0.2", "1", "30"],
    "idempotency_keys": ["repeat-1", "repeat-2"],
    "models": ["auto", *(model.name for model in (*default_models(), *legacy_models()))],
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
            async with open_gateway_state(TidegateConfig(queue_url=f"sqlite:///{tmp}/queue.db")) as state:
                return create_app(state).openapi()

    return asyncio.run(build())


DOCUMENT = _openapi_document()
schema = schemathesis.openapi.from_dict(DOCUMENT, config=schemathesis.Config.from_dict({
    "seed": SEED,
    "request-timeout": REQUEST_TIMEOUT_S,
    "generation": {"max-examples": MAX_EXAMPLES, "deterministic": True, "database": "none"},
    "checks": {"enabled": False, **{name: {"enabled": True} for name in CHECKS},
               "not_a_server_error": {"enabled": True, "expected-statuses": NOT_SERVER_ERRORS}},
    "dictionaries": {name: {"values": values} for name, values in DICTIONARIES.items()},
    "parameters": {key: {"dictionary": name, "probability": probability}
                   for key, (name, probability) in BINDINGS.items()},
}))


@pytest.fixture(scope="module", params=BACKENDS)
def gateway(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    """A gateway with a worker and the simulator on each queue backend, served from an event
    loop in another thread; its provider offers the legacy endpoints too, so they are called
    through. A worker that crashed fails its teardown."""
    factory = new_factory(request, tmp_path_factory.mktemp("gateway"))
    with start_blocking_portal() as portal:
        try:
            with portal.wrap_async_context_manager(
                    open_gateway(factory, settings=SETTINGS, configure=with_legacy_models)) as gw:
                yield gw
        finally:
            portal.call(drop_factory, factory)


def test_the_running_gateway_serves_the_tested_document(gateway: Gateway) -> None:
    assert httpx.get(f"{gateway.url}/openapi.json").json() == DOCUMENT


@pytest.mark.parametrize("tenant", TENANTS)
@schema.parametrize()
def test_every_operation_answers_as_its_schema_says(
    case: schemathesis.Case[Any], gateway: Gateway, tenant: str
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
    pytest.param("GET", f"/v1/dlq?offset={2**63}", None, id="dlq-offset-overflows"),
    pytest.param("PUT", "/v1/admin/tenants/big", f'{{"rpm": {2**63}}}', id="tenant-rpm-overflows"),
    pytest.param("PUT", "/v1/admin/tenants/big", '{"daily_budget_usd": "1e400"}', id="tenant-budget-huge"),
    pytest.param("POST", "/v1/embeddings", '{"input": "a", "dimensions": 1000000}', id="dimensions-huge"),
    pytest.param("PUT", "/v1/admin/tenants/big", r'{"allowed_models": ["\ud800"]}', id="lone-surrogate"),
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
    answer = httpx.post(f"{gateway.url}/v1/embeddings", json={"model": "auto", "input": "hello"},
                        headers=headers, timeout=REQUEST_TIMEOUT_S)

    # Then it is refused, naming the chat job, rather than answered with a chat completion
    assert answer.status_code == 409, answer.text
    assert answer.json()["error"]["code"] == "idempotency_key_reused"
    assert answer.headers["X-Tidegate-Job-Id"] == chat.headers["X-Tidegate-Job-Id"]


# ---------------------------------------------------------------------- the document itself

ERROR_SCHEMA = {"$ref": "#/components/schemas/ErrorResponse"}
# The routes of another dialect answer in its shape; a 431 comes from the HTTP server, before any
# route is known, and is OpenAI's on every route.
DIALECT_ERROR_SCHEMAS = {"Anthropic Messages": {"$ref": "#/components/schemas/AnthropicError"}}
OPERATIONS = [
    pytest.param(path, method, operation, id=f"{method.upper()} {path}")
    for path, item in DOCUMENT["paths"].items()
    for method, operation in item.items()
]


@pytest.mark.parametrize(("path", "method", "operation"), OPERATIONS)
def test_no_operation_documents_422_and_every_error_is_in_its_dialects_shape(
    path: str, method: str, operation: dict[str, Any]
) -> None:
    responses = operation["responses"]

    assert "422" not in responses
    if "Operations" in operation.get("tags", ()):
        return  # probes and scrapers get plain answers
    errors = {status: response for status, response in responses.items() if status[0] in "45"}
    assert {"401", "503"} <= set(errors)
    [tag] = operation["tags"]
    for status, response in errors.items():
        shape = ERROR_SCHEMA if status == "431" else DIALECT_ERROR_SCHEMAS.get(tag, ERROR_SCHEMA)
        assert response["content"]["application/json"]["schema"] == shape, status
    # What reads a body or headers can refuse them, with a 400 (not FastAPI's 422)
    if "requestBody" in operation or any(p["in"] == "header" for p in operation.get("parameters", ())):
        assert "400" in errors


def test_the_validation_error_schemas_are_gone_and_the_error_schema_is_openais() -> None:
    schemas = DOCUMENT["components"]["schemas"]

    assert not {"HTTPValidationError", "ValidationError"} & set(schemas)
    assert json.dumps(DOCUMENT).count("HTTPValidationError") == 0
    assert schemas["ErrorResponse"]["properties"]["error"] == {"$ref": "#/components/schemas/ErrorBody"}
    body = schemas["ErrorBody"]
    assert {"message", "type", "code"} <= set(body["properties"])
    assert set(body["required"]) == {"message", "type"}
    chat = DOCUMENT["paths"]["/v1/chat/completions"]["post"]["responses"]
    assert chat["400"]["content"]["application/json"]["schema"] == ERROR_SCHEMA
    assert chat["429"]["headers"]["Retry-After"]["schema"] == {"type": "integer", "minimum": 1}


def _header_schema(path: str, method: str, name: str) -> dict[str, Any]:
    [parameter] = [p for p in DOCUMENT["paths"][path][method]["parameters"] if p["name"] == name]
    assert parameter["in"] == "header" and parameter["required"] is False
    schema: dict[str, Any] = parameter["schema"]
    return schema


def test_the_request_headers_carry_their_constraints() -> None:
    priority = _header_schema("/v1/chat/completions", "post", "X-Priority")
    timeout = _header_schema("/v1/chat/completions", "post", "X-Tidegate-Timeout")
    key = _header_schema("/v1/jobs", "post", "Idempotency-Key")

    assert priority["type"] == "string"
    check = Draft202012Validator(priority)
    assert all(check.is_valid(value) for value in
               ["critical", "high", "normal", "low", "bulk", "HIGH", "Bulk", "0", "4"])
    assert not any(check.is_valid(value) for value in ["asap", "5", "01", "-1", " high", "highest", ""])
    assert timeout == {"type": "number", "exclusiveMinimum": 0, "maximum": 10 * 365 * 86_400,
                       "examples": [30]}
    assert (key["type"], key["minLength"], key["maxLength"]) == ("string", 1, 255)
    assert Draft202012Validator(key).is_valid("order-1234")
    assert not Draft202012Validator(key).is_valid("two words")


def _as_documented(schema: dict[str, Any], value: str) -> bool:
    """Whether the header value is one its schema allows (a number schema reads it as JSON)."""
    if schema["type"] == "number":
        try:
            value = json.loads(value, parse_constant=lambda name: None)
        except ValueError:
            return False
    return Draft202012Validator(schema).is_valid(value)


HEADER_VALUES = [
    *(("X-Priority", value) for value in ("high", "LOW", "Critical", "0", "4", "7", "01", "asap", "hi gh")),
    *(("Idempotency-Key", value) for value in (
        "abc-123", "k" * 255, "k" * 256, "two words", "tab\there", "caf\u00e9", "~!@#$%^&*()")),
    *(("X-Tidegate-Timeout", value) for value in (
        "1.5", "2", "2e0", "0", "-1", "soon", "inf", "NaN", "1e999", "315360000", "315360001", "1_0")),
]


@pytest.mark.parametrize(("name", "value"), HEADER_VALUES)
def test_the_gateway_accepts_a_header_value_exactly_when_its_schema_does(
    gateway: Gateway, name: str, value: str
) -> None:
    path = "/v1/chat/completions" if name == "X-Tidegate-Timeout" else "/v1/jobs"
    schema = _header_schema(path, "post", name)
    body = CHAT if path == "/v1/chat/completions" else {"kind": "chat", "body": CHAT}
    # As bytes: an HTTP client sends a header's text as Latin-1, and so the gateway reads it.
    headers = {key.encode(): text.encode() for key, text in gateway.auth("ops").items()}
    headers[name.encode()] = value.encode("latin-1")

    answer = httpx.post(f"{gateway.url}{path}", json=body, headers=headers, timeout=REQUEST_TIMEOUT_S)

    if _as_documented(schema, value):
        # Accepted: the call was queued (a synchronous one may still run out of time)
        assert answer.status_code in (200, 202, 504), answer.text
    else:
        assert answer.status_code == 400, answer.text
        error = answer.json()["error"]
        assert (error["type"], error["param"]) == ("invalid_request_error", name)
        assert name in error["message"]


def _enum_of(field: dict[str, Any]) -> set[str]:
    """The values a field takes (a nullable Literal is an anyOf of its enum and null)."""
    return {value for option in field.get("anyOf", [field]) for value in option.get("enum", ())}


def test_the_responses_and_messages_routes_document_their_service_tiers() -> None:
    schemas = DOCUMENT["components"]["schemas"]

    assert _enum_of(schemas["ResponseCreateRequest"]["properties"]["service_tier"]) == {
        "auto", "default", "flex", "priority"}
    assert _enum_of(schemas["MessagesRequest"]["properties"]["service_tier"]) == {"auto", "standard_only"}
    assert _enum_of(schemas["MessageUsage"]["properties"]["service_tier"]) == {
        "standard", "priority", "batch"}
    assert "service_tier" in schemas["ResponseObject"]["properties"]


def test_the_legacy_routes_document_their_bodies_answers_and_404() -> None:
    completions = DOCUMENT["paths"]["/v1/completions"]["post"]
    moderations = DOCUMENT["paths"]["/v1/moderations"]["post"]
    schemas = DOCUMENT["components"]["schemas"]

    assert {"model", "prompt"} <= set(schemas["CompletionRequest"]["required"])
    assert schemas["ModerationRequest"]["required"] == ["input"]
    assert "text/event-stream" in completions["responses"]["200"]["content"]
    assert "text/event-stream" not in moderations["responses"]["200"]["content"]
    for operation in (completions, moderations):
        assert "unsupported_endpoint" in operation["responses"]["404"]["description"]
