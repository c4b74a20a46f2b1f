"""Input that passes a loose check but would break the server, idempotency keys reused for another
request, and the shape of every error answer.

- Limits agree across layers: the body read limit follows the queue's job size, `dimensions`,
  `n`, `max_tokens`, embeddings inputs and list offsets are bounded, and the OpenAPI document says
  so with the same numbers.
- An Idempotency-Key reused for another request answers 409 on every endpoint; the same request
  gets the first job.
- Every error of every operation is `{"error": {"message", "type", "param", "code"}}` with a code,
  as the official SDK reads it: unknown key, wrong method, unreadable or oversized body, oversized
  headers, a stream cut off by the provider.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from conftest import QueueFactory
from support.gateway import CHAT, Gateway, open_gateway
from support.waiting import eventually
from tidegate.config import CallbackConfig
from tidegate.gateway.core.http_server import MAX_HEADER_BYTES
from tidegate.gateway.core.limits import (
    MAX_CHOICES,
    MAX_EMBEDDING_DIMENSIONS,
    MAX_EMBEDDING_INPUTS,
    MAX_OFFSET,
    MAX_OUTPUT_TOKENS,
    MAX_PAGE,
)
from tidegate.gateway.core.settings import BODY_ENVELOPE_BYTES, MIB, GatewaySettings
from tidegate.simulator.server import InjectedFault

HELLO: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Say hello"}]


@pytest.fixture
async def gw(queue_factory: QueueFactory) -> AsyncIterator[Gateway]:
    """A gateway with a worker and the simulator, configured with a body limit above what its
    queue takes (8 MiB over a queue of 1 MiB jobs, small enough that the oversized bodies these
    tests send stay cheap), which it must lower. Loopback callbacks are allowed: a repeated
    request may name one (and is refused before anything calls it)."""
    async with open_gateway(queue_factory, settings=GatewaySettings(max_body_bytes=8 * MIB),
                            queue_settings={"max_payload_bytes": MIB},
                            config_update={"callbacks": CallbackConfig(allow_private=True)}) as gateway:
        yield gateway


def assert_error_in_shape(answer: httpx.Response, path: str, status: int, code: str) -> None:
    """The answer is the error shape of the API `path` belongs to: Anthropic's for its Messages
    routes, OpenAI's for every other, with the code given."""
    if not path.startswith("/v1/messages"):
        assert_openai_error(answer, status, code)
        return
    assert answer.status_code == status, (path, answer.text)
    assert answer.headers["content-type"].startswith("application/json"), answer.headers
    body = answer.json()
    assert body.get("type") == "error", (path, body)
    error = body["error"]
    assert isinstance(error["type"], str) and error["type"] and isinstance(error["message"], str), error
    assert error["code"] == code, (path, error)


def assert_openai_error(answer: httpx.Response, status: int, code: str | None = None) -> dict[str, Any]:
    """The answer is the API's error shape with a non-null code (and `code` when given)."""
    assert answer.status_code == status, answer.text
    assert answer.headers["content-type"].startswith("application/json"), answer.headers
    error: dict[str, Any] = answer.json()["error"]
    assert {"message", "type", "param", "code"} <= set(error), error
    assert isinstance(error["message"], str) and error["message"]
    assert isinstance(error["type"], str) and error["type"]
    assert isinstance(error["code"], str) and error["code"], error
    if code is not None:
        assert error["code"] == code, error
    return error


# ---------------------------------------------------------------------- limits


@pytest.mark.parametrize("query", [f"offset={2**63}", f"offset={MAX_OFFSET + 1}", "offset=-1", "limit=1001",
                                   "limit=0"])
async def test_a_dead_letter_page_beyond_its_bounds_is_refused_with_400(gw: Gateway, query: str) -> None:
    answer = await gw.http.get(f"/v1/dlq?{query}", headers=gw.auth("ops"))

    error = assert_openai_error(answer, 400, "invalid_request")
    assert query.split("=")[0] in error["message"]


async def test_the_farthest_documented_offset_answers_an_empty_page(gw: Gateway) -> None:
    answer = await gw.http.get(f"/v1/dlq?offset={MAX_OFFSET}", headers=gw.auth("ops"))

    assert answer.status_code == 200, answer.text
    assert answer.json() == {"data": [], "limit": 100, "offset": MAX_OFFSET}


@pytest.mark.parametrize("path", ["/v1/admin/keys", "/v1/admin/tenants"])
async def test_the_admin_lists_are_paged_within_bounds(gw: Gateway, path: str) -> None:
    everything = (await gw.http.get(path, headers=gw.auth("ops"))).json()
    second = (await gw.http.get(f"{path}?limit=1&offset=1", headers=gw.auth("ops"))).json()
    beyond = (await gw.http.get(f"{path}?offset={MAX_OFFSET}", headers=gw.auth("ops"))).json()
    too_far = await gw.http.get(f"{path}?offset={2**63}", headers=gw.auth("ops"))
    too_many = await gw.http.get(f"{path}?limit={MAX_PAGE + 1}", headers=gw.auth("ops"))

    assert len(everything) >= 6 and second == everything[1:2] and beyond == []
    assert_openai_error(too_far, 400, "invalid_request")
    assert_openai_error(too_many, 400, "invalid_request")


async def test_embeddings_dimensions_are_bounded_like_openais(gw: Gateway) -> None:
    async with gw.openai("acme") as client:
        # Far beyond any model: refused at the door, nothing queued
        with pytest.raises(openai.BadRequestError) as huge:
            await client.embeddings.create(model="auto", input="red shoes", dimensions=1_000_000)
        assert await gw.depth() == 0
        # Within the gateway's bound but above the model's own size: the provider refuses it
        with pytest.raises(openai.BadRequestError) as above_model:
            await client.embeddings.create(model="auto", input="red shoes", dimensions=257)
        # Shorter than the model's own: served at that size
        short = await client.embeddings.create(model="auto", input=["a", "b"], dimensions=8)

    assert huge.value.code == "invalid_request"
    assert str(MAX_EMBEDDING_DIMENSIONS) in huge.value.message
    assert "dimensions" in above_model.value.message
    assert [len(item.embedding) for item in short.data] == [8, 8]


@pytest.mark.parametrize(("path", "body", "param"), [
    ("/v1/chat/completions", {**CHAT, "n": MAX_CHOICES + 1}, "n"),
    ("/v1/chat/completions", {**CHAT, "max_tokens": MAX_OUTPUT_TOKENS + 1}, "max_tokens"),
    ("/v1/chat/completions", {**CHAT, "max_completion_tokens": 2**63}, "max_completion_tokens"),
    ("/v1/embeddings", {"model": "auto", "input": ["a"] * (MAX_EMBEDDING_INPUTS + 1)}, "input"),
    ("/v1/embeddings", {"model": "auto", "input": [[1, 2]] * (MAX_EMBEDDING_INPUTS + 1)}, "input"),
    ("/v1/jobs", {"kind": "embeddings", "body": {"model": "auto", "input": "a", "dimensions": 10**9}},
     "body.dimensions"),
    ("/v1/jobs", {"kind": "chat", "body": {**CHAT, "n": 10**6}}, "body"),
])
async def test_counts_that_would_make_an_unbounded_answer_are_refused(
    gw: Gateway, path: str, body: dict[str, Any], param: str
) -> None:
    answer = await gw.http.post(path, json=body, headers=gw.auth("acme"))

    error = assert_openai_error(answer, 400, "invalid_request")
    assert error["param"] is not None and error["param"].startswith(param.split(".")[0]), error
    assert await gw.depth() == 0


async def test_the_body_limit_is_the_queues_job_size_plus_the_requests_own_fields(gw: Gateway) -> None:
    limit = gw.queue.settings.max_payload_bytes + BODY_ENVELOPE_BYTES

    # The configured 8 MiB is lowered to what the queue takes
    assert gw.state.max_body_bytes == limit
    # A 2 MB body is refused from its Content-Length, before it is read, and nothing is queued
    big = {"kind": "chat", "body": {"messages": [{"role": "user", "content": "x" * 2_000_000}]}}
    refused = await gw.http.post("/v1/jobs", json=big, headers=gw.auth("acme"))
    error = assert_openai_error(refused, 413, "request_too_large")
    # The refusal names the limit and the settings that make it, so an operator knows what to raise
    assert str(limit) in error["message"]
    assert "gateway.max_body_bytes (TIDEGATE_GATEWAY__MAX_BODY_BYTES)" in error["message"]
    assert "max_payload_bytes" in error["message"]
    # A job just under the queue's own cap still gets through
    fits = {"kind": "chat", "body": {"model": "auto",
                                     "messages": [{"role": "user", "content": "x" * (limit - 80 * 1024)}]}}
    accepted = await gw.http.post("/v1/jobs", json=fits, headers=gw.auth("acme"))
    assert accepted.status_code == 202, accepted.text[:300]


async def test_the_default_body_limit_holds_a_million_token_context(queue_factory: QueueFactory) -> None:
    # Given a gateway on the defaults, and a chat of 1,048,576 tokens of English (~4 bytes each),
    # what gpt-4.1's and gemini-2.5-flash's context windows take
    async with open_gateway(queue_factory, worker=False) as gateway:
        context = "word " * 1_048_576
        messages = [{"role": "user", "content": context}]
        body = {"kind": "chat", "body": {"model": "gpt-4.1", "messages": messages}}

        answer = await gateway.http.post("/v1/jobs", json=body, headers=gateway.auth("acme"))

        # Then it is queued as one job, with room to spare (16 MiB holds ~16 bytes a token)
        assert answer.status_code == 202, answer.text[:300]
        assert gateway.state.max_body_bytes == 16 * MIB + BODY_ENVELOPE_BYTES
        assert await gateway.depth() == 1


async def test_an_upload_over_its_limit_names_the_file_setting(queue_factory: QueueFactory) -> None:
    async with open_gateway(queue_factory, worker=False,
                            settings=GatewaySettings(max_file_bytes=1024)) as gateway:
        # An upload far over the limit, refused from its Content-Length before any of it is sent
        head = (f"POST /v1/files HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {gateway.keys['acme']}"
                "\r\nContent-Type: multipart/form-data; boundary=x\r\nContent-Length: 10000000"
                "\r\n\r\n").encode()

        status, _, body = await _raw_exchange(gateway, head, [])

        assert status == 413
        error = json.loads(body)["error"]
        assert error["code"] == "request_too_large"
        assert "gateway.max_file_bytes (TIDEGATE_GATEWAY__MAX_FILE_BYTES)" in error["message"]


async def test_a_smaller_configured_body_limit_is_kept(queue_factory: QueueFactory) -> None:
    async with open_gateway(queue_factory, worker=False,
                            settings=GatewaySettings(max_body_bytes=4096)) as gateway:
        assert gateway.state.max_body_bytes == 4096
        answer = await gateway.http.post("/v1/embeddings", json={"input": "x" * 5000},
                                         headers=gateway.auth("acme"))
        assert_openai_error(answer, 413, "request_too_large")


async def _raw_exchange(
    gw: Gateway, head: bytes, pieces: list[bytes], *, pause_s: float = 0.0
) -> tuple[int, dict[str, str], bytes]:
    """Send a raw HTTP/1.1 request (its head, then its pieces) and read the answer (status,
    headers, body of its Content-Length); a write the server no longer reads is abandoned."""
    host, port = gw.url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        raw_head = b""
        for piece in [head, *pieces]:
            try:
                writer.write(piece)
                await asyncio.wait_for(writer.drain(), timeout=2.0)
            except (TimeoutError, ConnectionError):
                break  # the server stopped reading: its answer is waiting
            with contextlib.suppress(TimeoutError):  # stop sending once the answer has come
                raw_head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=pause_s or 0.001)
                break
        raw_head = raw_head or await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=10.0)
        lines = raw_head.decode("latin-1").rstrip("\r\n").split("\r\n")
        fields = (line.partition(":") for line in lines[1:])
        headers = {name.lower(): value.strip() for name, _, value in fields}
        body = await asyncio.wait_for(reader.readexactly(int(headers["content-length"])), timeout=10.0)
        return int(lines[0].split()[1]), headers, body
    finally:
        writer.close()


async def test_an_oversized_chunked_body_is_refused_before_it_ends(gw: Gateway) -> None:
    # Given a chunked upload that passes the limit and never sends its last chunk
    chunk = b"x" * 65_536
    count = gw.state.max_body_bytes // len(chunk) + 2
    head = (f"POST /v1/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {gw.keys['acme']}\r\n"
            "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n").encode()
    pieces = [f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n" for _ in range(count)]

    # When it is sent, Then the gateway answers 413 without waiting for the end of the body
    status, headers, body = await _raw_exchange(gw, head, pieces)

    assert status == 413
    error = json.loads(body)["error"]
    assert error["code"] == "request_too_large"
    assert headers["content-type"].startswith("application/json")
    assert await gw.depth() == 0


async def test_headers_over_the_limit_answer_431_in_the_apis_shape(gw: Gateway) -> None:
    answer = await gw.http.get("/v1/models", headers={**gw.auth("acme"), "X-Big": "a" * 200_000})

    error = assert_openai_error(answer, 431, "request_headers_too_large")
    assert str(MAX_HEADER_BYTES) in error["message"]


async def test_a_head_the_http_server_refuses_itself_is_answered_in_the_apis_shape(gw: Gateway) -> None:
    # A 200 KB header arriving in pieces: the HTTP server refuses it before the app sees anything
    head = b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: "
    pieces = [b"a" * 10_000 for _ in range(20)] + [b"\r\n\r\n"]

    status, headers, body = await _raw_exchange(gw, head, pieces, pause_s=0.01)

    assert status == 431
    assert headers["content-type"] == "application/json"
    error = json.loads(body)["error"]
    assert error["code"] == "request_headers_too_large" and error["type"] == "invalid_request_error"
    assert str(MAX_HEADER_BYTES) in error["message"]


async def test_a_request_line_the_http_server_cannot_parse_is_answered_in_the_apis_shape(gw: Gateway) -> None:
    status, headers, body = await _raw_exchange(gw, b"GET /v1/models HTTP/1.1 extra\r\n\r\n", [])

    assert status == 400
    assert headers["content-type"] == "application/json"
    assert json.loads(body)["error"]["code"] == "invalid_http_request"


async def test_the_document_publishes_the_limits_the_code_checks(gw: Gateway) -> None:
    document = (await gw.http.get("/openapi.json")).json()
    schemas = document["components"]["schemas"]
    dlq = {p["name"]: p["schema"] for p in document["paths"]["/v1/dlq"]["get"]["parameters"]}
    chat = schemas["ChatCompletionRequest"]["properties"]

    dimensions = schemas["EmbeddingsRequest"]["properties"]["dimensions"]
    assert dimensions["anyOf"][0]["maximum"] == MAX_EMBEDDING_DIMENSIONS
    assert chat["n"]["anyOf"][0]["maximum"] == MAX_CHOICES
    assert chat["max_tokens"]["anyOf"][0]["maximum"] == MAX_OUTPUT_TOKENS
    assert dlq["offset"]["maximum"] == MAX_OFFSET and dlq["limit"]["maximum"] == 1000
    assert document["info"]["x-tidegate-limits"] == {
        "max_body_bytes": gw.state.max_body_bytes, "max_header_bytes": MAX_HEADER_BYTES,
        "max_messages": gw.state.settings.max_messages, "max_batch": gw.state.settings.max_batch}
    assert chat["messages"]["maxItems"] == gw.state.settings.max_messages
    assert schemas["JobBatch"]["properties"]["jobs"]["maxItems"] == gw.state.settings.max_batch
    too_large = document["paths"]["/v1/jobs"]["post"]["responses"]["413"]["description"]
    assert str(gw.state.max_body_bytes) in too_large


# ---------------------------------------------------------------------- idempotency


async def test_a_key_reused_on_the_jobs_endpoint_for_another_kind_is_a_conflict(gw: Gateway) -> None:
    headers = {**gw.auth("acme"), "Idempotency-Key": f"k-{uuid.uuid4().hex}"}
    chat = await gw.http.post("/v1/chat/completions", json=CHAT, headers=headers)
    assert chat.status_code == 200, chat.text
    chat_id = chat.headers["X-Tidegate-Job-Id"]

    reused = await gw.http.post("/v1/jobs", headers=headers,
                                json={"kind": "embeddings", "body": {"model": "auto", "input": "hello"}})
    repeated = await gw.http.post("/v1/jobs", json={"kind": "chat", "body": CHAT}, headers=headers)

    error = assert_openai_error(reused, 409, "idempotency_key_reused")
    assert error["param"] == "Idempotency-Key" and error["job_id"] == chat_id
    assert "chat" in error["message"] and "embeddings" in error["message"]
    # The same request under the same key is the first job, whichever endpoint it comes to
    assert repeated.status_code == 202 and repeated.json() == {"ids": [chat_id]}


async def test_a_key_reused_with_another_body_is_a_conflict_on_every_endpoint(gw: Gateway) -> None:
    key = f"k-{uuid.uuid4().hex}"
    headers = {**gw.auth("acme"), "Idempotency-Key": key}
    first = await gw.http.post("/v1/jobs", headers=headers,
                               json={"kind": "embeddings", "body": {"model": "auto", "input": "one"}})
    assert first.status_code == 202, first.text
    [first_id] = first.json()["ids"]

    other_body = await gw.http.post("/v1/jobs", headers=headers,
                                    json={"kind": "embeddings", "body": {"model": "auto", "input": "two"}})
    other_sync = await gw.http.post("/v1/embeddings", json={"model": "auto", "input": "two"}, headers=headers)
    other_callback = await gw.http.post("/v1/jobs", json={
        "kind": "embeddings", "body": {"model": "auto", "input": "one"}, "callback_url": "http://127.0.0.1:9/hook"},
        headers=headers)
    same_sync = await gw.http.post("/v1/embeddings", json={"model": "auto", "input": "one"}, headers=headers)
    # Keys are per tenant: another tenant's same key is its own job
    other_tenant = await gw.http.post("/v1/jobs", headers={**gw.auth("globex"), "Idempotency-Key": key},
                                      json={"kind": "embeddings", "body": {"model": "auto", "input": "two"}})

    for answer in (other_body, other_sync, other_callback):
        assert assert_openai_error(answer, 409, "idempotency_key_reused")["job_id"] == first_id
    assert same_sync.status_code == 200 and same_sync.headers["X-Tidegate-Job-Id"] == first_id
    assert other_tenant.status_code == 202 and other_tenant.json()["ids"] != [first_id]


async def test_a_batch_with_a_conflicting_key_queues_nothing(gw: Gateway) -> None:
    key = f"k-{uuid.uuid4().hex}"
    headers = {**gw.auth("bulkco"), "Idempotency-Key": key}
    jobs = [{"kind": "embeddings", "body": {"model": "auto", "input": text}} for text in ("a", "b")]
    first = await gw.http.post("/v1/jobs", json={"jobs": jobs}, headers=headers)
    assert first.status_code == 202, first.text
    await _drained(gw)

    # job 1 of the batch (key:1) now asks for something else; a new job 2 comes along
    changed = [jobs[0], {"kind": "embeddings", "body": {"model": "auto", "input": "c"}}, jobs[1]]
    answer = await gw.http.post("/v1/jobs", json={"jobs": changed}, headers=headers)

    assert assert_openai_error(answer, 409, "idempotency_key_reused")["job_id"] == first.json()["ids"][1]
    assert await gw.depth() == 0  # job 2 was not queued either


async def _drained(gw: Gateway) -> None:
    await eventually(gw.queue.stats, "the worker drains the queue",
                     until=lambda stats: stats.depth == 0 and stats.in_flight == 0)


# ---------------------------------------------------------------------- every error's shape


def _operations(document: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [(path, method, operation) for path, item in document["paths"].items()
            for method, operation in item.items() if "Operations" not in operation.get("tags", ())]


def _concrete(path: str) -> str:
    return re.sub(r"\{[^}]+\}", "x", path)


def _matches(template: str, url: str) -> bool:
    """Whether a documented path template (`/v1/responses/{response_id}`) matches `url`."""
    return re.fullmatch(re.sub(r"\\\{[^}]+\\\}", "[^/]+", re.escape(template)), url) is not None


async def test_every_operation_refuses_an_unknown_key_and_a_wrong_method_in_the_apis_shape(
    gw: Gateway,
) -> None:
    document = (await gw.http.get("/openapi.json")).json()
    operations = _operations(document)
    assert len(operations) > 15

    for path, method, _ in operations:
        url = _concrete(path)
        unknown = await gw.http.request(method.upper(), url, headers={"Authorization": "Bearer sk-nope"})
        assert_error_in_shape(unknown, path, 401, "invalid_api_key")
        missing = await gw.http.request(method.upper(), url)
        assert_error_in_shape(missing, path, 401, "missing_api_key")
    for path in document["paths"]:
        # Every documented path the URL matches allows its methods: /v1/responses/input_tokens is
        # also /v1/responses/{response_id} (GET, DELETE), as in OpenAI's API.
        allowed = {method.upper() for template, item in document["paths"].items()
                   if _matches(template, _concrete(path)) for method in item}
        wrong = next(m for m in ("PATCH", "PUT", "DELETE", "POST", "GET") if m not in allowed)
        answer = await gw.http.request(wrong, _concrete(path), headers=gw.auth("ops"))
        assert_error_in_shape(answer, path, 405, "method_not_allowed")
        assert set(answer.headers["Allow"].split(", ")) == allowed, (path, answer.headers["Allow"])
    assert_openai_error(await gw.http.get("/v1/nowhere", headers=gw.auth("ops")), 404, "unknown_url")


BAD_BODIES = [
    pytest.param(b'{"input": "caf\xe9"}', 400, "invalid_json", id="invalid-utf8"),
    pytest.param(b"[" * 100_000 + b"]" * 100_000, 400, "invalid_json", id="deeply-nested"),
    pytest.param(b'{"input": ', 400, "invalid_request", id="truncated-json"),
    pytest.param(b"[1, 2]", 400, "invalid_request", id="not-an-object"),
]


@pytest.mark.parametrize(("body", "status", "code"), BAD_BODIES)
async def test_every_operation_with_a_body_refuses_an_unreadable_one_in_the_apis_shape(
    gw: Gateway, body: bytes, status: int, code: str
) -> None:
    document = (await gw.http.get("/openapi.json")).json()
    # JSON bodies: an upload (multipart, with a limit of its own) is tested with the Files API.
    with_body = [(path, method) for path, method, operation in _operations(document)
                 if "application/json" in operation.get("requestBody", {}).get("content", {})]
    assert len(with_body) >= 6

    for path, method in with_body:
        answer = await gw.http.request(method.upper(), _concrete(path), content=body,
                                       headers={**gw.auth("ops"), "Content-Type": "application/json"})
        assert_error_in_shape(answer, path, status, code)
        too_large = await gw.http.request(
            method.upper(), _concrete(path), content=b" " * (gw.state.max_body_bytes + 1),
            headers={**gw.auth("ops"), "Content-Type": "application/json"})
        assert_error_in_shape(too_large, path, 413, "request_too_large")


async def test_the_sdk_reads_a_code_from_every_kind_of_refusal(gw: Gateway) -> None:
    async with gw.openai(api_key="sk-nope") as stranger, gw.openai("acme") as client:
        with pytest.raises(openai.AuthenticationError) as unknown:
            await stranger.models.list()
        with pytest.raises(openai.BadRequestError) as bad:
            await client.chat.completions.create(model="auto", messages=HELLO, n=MAX_CHOICES + 1)
        with pytest.raises(openai.NotFoundError) as no_model:
            await client.chat.completions.create(model="gpt-9", messages=HELLO)
        with pytest.raises(openai.PermissionDeniedError) as too_high:
            await client.chat.completions.create(model="auto", messages=HELLO,
                                                 extra_headers={"X-Priority": "critical"})
        with pytest.raises(openai.APIStatusError) as too_large:
            await client.embeddings.create(model="auto", input="x" * (gw.state.max_body_bytes + 1))
        key = {"Idempotency-Key": f"k-{uuid.uuid4().hex}"}
        await client.embeddings.create(model="auto", input="one", extra_headers=key)
        with pytest.raises(openai.ConflictError) as reused:
            await client.chat.completions.create(model="auto", messages=HELLO, extra_headers=key)

    assert unknown.value.code == "invalid_api_key"
    assert bad.value.code == "invalid_request"
    assert no_model.value.code == "model_not_found"
    assert too_high.value.code == "priority_not_allowed"
    assert (too_large.value.status_code, too_large.value.code) == (413, "request_too_large")
    assert reused.value.code == "idempotency_key_reused"


async def test_the_error_event_of_a_stream_cut_off_by_the_provider_has_a_code(gw: Gateway) -> None:
    async with gw.openai("acme") as client:
        gw.sim.inject("gpt-4.1", InjectedFault("reset"))  # strikes half way through the stream
        stream = await client.chat.completions.create(model="gpt-4.1", messages=HELLO, stream=True)
        received = []
        with pytest.raises(openai.APIError) as failed:
            async for chunk in stream:
                received.append(chunk)

    assert received
    assert isinstance(failed.value.body, dict)
    assert {"message", "type", "param", "code"} <= set(failed.value.body)
    assert failed.value.code == "stream_failed"
