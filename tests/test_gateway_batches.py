"""The Files and Batch APIs with the official OpenAI SDK, unchanged, against a real gateway over
HTTP with a worker and the simulated provider behind it, on SQLite and on Redis: uploads, batches
run to completion with one output line per request, malformed lines in the error file, cancel,
tenant isolation, and every line a job at bulk that interactive calls overtake.

One gateway per backend serves the whole module (its waits and limits small, so every case is
quick); each case uploads its own files."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import openai
import orjson
import pytest
import pytest_asyncio
from openai import AsyncOpenAI
from openai.types import Batch
from openai.types.responses import FunctionToolParam, Response

from conftest import BACKENDS
from support.gateway import Gateway, module_gateway, serving
from support.waiting import eventually
from tidegate.app.gateway import open_gateway_state
from tidegate.gateway.core.settings import GatewaySettings
from tidegate.jobs import JobState, Priority
from tidegate.simulator.server import InjectedFault

pytestmark = pytest.mark.asyncio(loop_scope="module")

MAX_FILE_BYTES = 64 * 1024
MAX_LINES = 100
SETTINGS = GatewaySettings(max_file_bytes=MAX_FILE_BYTES, max_batch_lines=MAX_LINES, batch_progress_s=0.05)
ENDED = ("completed", "failed", "expired", "cancelled")
SLOW_MODEL = "deepseek-v3.2"


@pytest_asyncio.fixture(scope="module", loop_scope="module", params=BACKENDS)
async def gw(request: pytest.FixtureRequest,
             tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Gateway]:
    """A gateway with a worker (8 calls at a time) and the simulator, on each queue backend."""
    async with module_gateway(request, tmp_path_factory, settings=SETTINGS) as gateway:
        yield gateway


@contextlib.contextmanager
def slow(gw: Gateway, model: str, latency_ms: float) -> Iterator[None]:
    """The simulator answers `model` after `latency_ms` for the block."""
    gw.sim.configure({"models": {model: {"latency_ms": latency_ms}}})
    try:
        yield
    finally:
        gw.sim.configure({"models": {model: {"latency_ms": 0.0}}})


def chat_line(custom_id: str, text: str = "Say hello", model: str = "gemini-2.5-flash") -> dict[str, Any]:
    """One request line of a chat batch."""
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": model, "messages": [{"role": "user", "content": text}]}}


WEATHER: FunctionToolParam = {
    "type": "function", "name": "get_weather", "description": "The weather in a city.", "strict": True,
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
                   "additionalProperties": False},
}


def responses_line(custom_id: str, **body: Any) -> dict[str, Any]:
    """One request line of a Responses batch."""
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/responses",
            "body": {"model": "gpt-4.1", **body}}


def jsonl(lines: list[dict[str, Any] | str]) -> bytes:
    """Lines as JSON Lines (a string goes in as it is: a malformed line)."""
    return b"".join((line.encode() if isinstance(line, str) else orjson.dumps(line)) + b"\n"
                    for line in lines)


async def upload(client: AsyncOpenAI, lines: list[dict[str, Any] | str]) -> str:
    """The id of a new `batch` file of these lines."""
    file = await client.files.create(file=("requests.jsonl", jsonl(lines)), purpose="batch")
    return file.id


async def ended(client: AsyncOpenAI, batch_id: str, timeout_s: float = 20.0) -> Batch:
    """The batch, polled as a client would until it has ended."""
    return await eventually(lambda: client.batches.retrieve(batch_id), f"batch {batch_id} ends",
                            until=lambda batch: batch.status in ENDED, timeout_s=timeout_s, every_s=0.05)


async def lines_of(client: AsyncOpenAI, file_id: str | None) -> list[dict[str, Any]]:
    """The JSON lines of a file (none for no file)."""
    if file_id is None:
        return []
    content = await client.files.content(file_id)
    return [orjson.loads(line) for line in content.content.splitlines()]


def counts(batch: Batch) -> tuple[int, int, int]:
    """The batch's request counts: total, completed, failed."""
    assert batch.request_counts is not None
    return batch.request_counts.total, batch.request_counts.completed, batch.request_counts.failed


def status_of(exc: openai.APIStatusError) -> tuple[int, str]:
    error = exc.response.json()["error"]
    return exc.status_code, error["code"]


async def declared_upload(gw: Gateway, length: int) -> tuple[int, dict[str, Any]]:
    """The answer to an upload whose head declares `length` bytes of body, none of them sent."""
    host, port = gw.url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(f"POST /v1/files HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {gw.keys['acme']}"
                     f"\r\nContent-Type: multipart/form-data; boundary=b\r\nContent-Length: {length}\r\n\r\n"
                     .encode())
        head = (await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)).decode("latin-1")
        size = next(int(line.split(":")[1]) for line in head.split("\r\n")
                    if line.lower().startswith("content-length"))
        body = await asyncio.wait_for(reader.readexactly(size), 10)
        return int(head.split()[1]), orjson.loads(body)["error"]
    finally:
        writer.close()


# ---------------------------------------------------------------------- files


async def test_files_are_uploaded_listed_retrieved_read_and_deleted(gw: Gateway) -> None:
    async with gw.openai("acme") as client:
        content = jsonl([chat_line("a"), chat_line("b")])
        created = await client.files.create(file=("mine.jsonl", content), purpose="batch")

        assert (created.object, created.purpose, created.bytes, created.filename) == (
            "file", "batch", len(content), "mine.jsonl")
        assert created.id.startswith("file-")
        assert (await client.files.retrieve(created.id)).id == created.id
        assert (await client.files.content(created.id)).content == content
        listed = [file.id async for file in client.files.list(purpose="batch")]
        assert created.id in listed
        assert created.id not in [file.id async for file in client.files.list(purpose="batch_output")]

        deleted = await client.files.delete(created.id)
        assert (deleted.id, deleted.deleted) == (created.id, True)
        with pytest.raises(openai.NotFoundError) as gone:
            await client.files.retrieve(created.id)
        assert status_of(gone.value) == (404, "file_not_found")
        assert created.id not in [file.id async for file in client.files.list()]


async def test_a_file_past_its_expiry_is_gone_before_any_sweep_deletes_it(gw: Gateway) -> None:
    async with gw.openai("acme") as client:
        # Given a file whose expiry has passed, still stored (this gateway sweeps once a minute)
        file_id = await upload(client, [chat_line("a")])
        stored = await gw.state.batches.get_file(file_id)
        assert stored is not None
        content = await gw.state.batches.file_content(file_id)
        assert content is not None
        lapsed = stored.model_copy(update={"expires_at": int(time.time()) - 1})
        await gw.state.batches.put_file(lapsed, content)

        # Then the API knows it no more: not retrieved, not read, not taken by a batch
        for attempt in (client.files.retrieve(file_id), client.files.content(file_id)):
            with pytest.raises(openai.NotFoundError) as gone:
                await attempt
            assert status_of(gone.value) == (404, "file_not_found")
        with pytest.raises(openai.NotFoundError) as refused:
            await client.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions",
                                        completion_window="24h")
        assert status_of(refused.value) == (404, "file_not_found")
        assert await gw.state.batches.get_file(file_id) is not None


async def test_an_upload_over_the_limit_is_refused_with_413(gw: Gateway) -> None:
    async with gw.openai("acme") as client:
        before = [file.id async for file in client.files.list()]
        with pytest.raises(openai.APIStatusError) as just_over:
            await client.files.create(file=("big.jsonl", b"x" * (MAX_FILE_BYTES + 1)), purpose="batch")
        with pytest.raises(openai.APIStatusError) as user_data_over:
            await client.files.create(file=("big.txt", b"x" * (MAX_FILE_BYTES + 1)), purpose="user_data")
        far_status, far_error = await declared_upload(gw, MAX_FILE_BYTES * 3)

        assert status_of(just_over.value) == status_of(user_data_over.value) == (413, "file_too_large")
        # A body far over is refused from its Content-Length, before any of it is read
        assert (far_status, far_error["code"]) == (413, "request_too_large")
        assert [file.id async for file in client.files.list()] == before


async def test_a_purpose_not_served_or_a_body_not_multipart_is_refused_with_400(gw: Gateway) -> None:
    async with gw.openai("acme") as client:
        with pytest.raises(openai.BadRequestError) as refused:
            await client.files.create(file=("tune.jsonl", b"{}\n"), purpose="fine-tune")
        as_json = await gw.http.post("/v1/files", json={"purpose": "batch"}, headers=gw.auth("acme"))

        assert status_of(refused.value) == (400, "invalid_purpose")
        assert "batch" in refused.value.response.json()["error"]["message"]
        assert as_json.status_code == 400, as_json.text
        error = as_json.json()["error"]
        assert (error["code"], error["param"]) == ("invalid_request", "file")


# ---------------------------------------------------------------------- batches


async def test_a_chat_batch_completes_with_one_answer_per_line_each_job_at_bulk(gw: Gateway) -> None:
    async with gw.openai("acme") as client:
        ids = [f"req-{n}" for n in range(6)]
        file_id = await upload(client, [chat_line(custom_id, f"Say {custom_id}") for custom_id in ids])

        created = await client.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions",
                                              completion_window="24h", metadata={"run": "nightly"})
        batch = await ended(client, created.id)

        assert created.status in ("in_progress", "finalizing", "completed")
        assert created.request_counts is not None and created.request_counts.total == 6
        assert batch.status == "completed" and batch.metadata == {"run": "nightly"}
        assert batch.request_counts is not None
        assert counts(batch) == (6, 6, 0)
        assert batch.error_file_id is None and batch.completed_at is not None
        output = await lines_of(client, batch.output_file_id)
        assert sorted(line["custom_id"] for line in output) == sorted(ids)
        for line in output:
            assert line["error"] is None and line["response"]["status_code"] == 200
            assert line["response"]["body"]["object"] == "chat.completion"
            assert line["response"]["body"]["choices"][0]["message"]["content"]
            # Each line was a job of the tenant at bulk, as the jobs API shows it
            job_id = line["response"]["request_id"]
            view = (await gw.http.get(f"/v1/jobs/{job_id}", headers=gw.auth("acme"))).json()
            assert (view["priority"], view["tenant"], view["state"]) == ("bulk", "acme", "succeeded")
        out_file = await client.files.retrieve(batch.output_file_id or "")
        assert out_file.purpose == "batch_output"
        assert batch.id in [listed.id async for listed in client.batches.list()]


async def test_malformed_lines_go_to_the_error_file_while_the_rest_succeed(gw: Gateway) -> None:
    async with gw.openai("acme") as client:
        file_id = await upload(client, [
            chat_line("good-1"),
            "{not json",
            {"custom_id": "wrong-url", "method": "POST", "url": "/v1/embeddings", "body": {"input": "x"}},
            {"custom_id": "no-messages", "method": "POST", "url": "/v1/chat/completions",
             "body": {"model": "gpt-4.1"}},
            chat_line("good-1"),  # a custom_id used twice
            chat_line("unknown-model", model="no-such-model"),
            chat_line("good-2"),
        ])

        batch = await ended(client, (await client.batches.create(
            input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h")).id)

        assert batch.status == "completed"
        assert batch.request_counts is not None
        assert counts(batch) == (7, 2, 5)
        assert sorted(line["custom_id"] for line in await lines_of(client, batch.output_file_id)) == [
            "good-1", "good-2"]
        errors = await lines_of(client, batch.error_file_id)
        assert [(line["custom_id"], line["error"]["code"]) for line in errors] == [
            (None, "invalid_json"), ("wrong-url", "mismatched_url"), ("no-messages", "invalid_request"),
            ("good-1", "duplicate_custom_id"), ("unknown-model", "model_not_found")]
        assert all(line["response"] is None for line in errors)
        assert all(line["error"]["message"].startswith("line ") for line in errors)


async def test_a_request_the_provider_refuses_is_dead_lettered_into_the_error_file(gw: Gateway) -> None:
    async with gw.openai("acme") as client:
        # Given a provider that refuses the next request for one model with a 400
        gw.sim.inject("claude-sonnet-4.5", InjectedFault("status", status=400, message="bad input", times=1))
        file_id = await upload(client, [chat_line("refused", model="claude-sonnet-4.5"), chat_line("fine")])

        batch = await ended(client, (await client.batches.create(
            input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h")).id)

        # Then the batch completes; the refused line keeps the provider's status and error
        assert batch.status == "completed" and counts(batch) == (2, 1, 1)
        assert [line["custom_id"] for line in await lines_of(client, batch.output_file_id)] == ["fine"]
        [refused] = await lines_of(client, batch.error_file_id)
        assert refused["custom_id"] == "refused" and refused["error"] is None
        assert refused["response"]["status_code"] == 400
        assert "bad input" in refused["response"]["body"]["error"]["message"]
        job = await gw.queue.get(refused["response"]["request_id"])
        assert job is not None and job.state is JobState.DEAD  # in the dead-letter queue like any job


async def test_a_batch_of_only_bad_lines_fails_with_its_errors(gw: Gateway) -> None:
    async with gw.openai("acme") as client:
        file_id = await upload(client, ["[1, 2]", "{}"])

        batch = await client.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions",
                                            completion_window="24h")

        assert batch.status == "failed" and batch.failed_at is not None
        assert batch.errors is not None and [error.code for error in batch.errors.data or []] == [
            "invalid_json", "invalid_custom_id"]
        assert [error.line for error in batch.errors.data or []] == [1, 2]


async def test_an_embeddings_batch(gw: Gateway) -> None:
    async with gw.openai("acme") as client:
        file_id = await upload(client, [
            {"custom_id": f"e{n}", "method": "POST", "url": "/v1/embeddings",
             "body": {"model": "text-embedding-3-small", "input": f"item {n}"}} for n in range(3)])

        batch = await ended(client, (await client.batches.create(
            input_file_id=file_id, endpoint="/v1/embeddings", completion_window="24h")).id)

        assert batch.status == "completed"
        output = await lines_of(client, batch.output_file_id)
        assert sorted(line["custom_id"] for line in output) == ["e0", "e1", "e2"]
        assert all(line["response"]["body"]["data"][0]["embedding"] for line in output)


async def test_a_responses_batch_answers_with_response_objects_and_refuses_what_the_route_refuses(
        gw: Gateway) -> None:
    async with gw.openai("acme") as client, gw.openai("globex") as globex:
        earlier = await client.responses.create(model="gpt-4.1", input="Remember the word tide.")
        foreign = await globex.responses.create(model="gpt-4.1", input="Hi")
        file_id = await upload(client, [
            responses_line("text", input="Say hello", instructions="Be brief."),
            responses_line("tool", input="Weather in Paris?", tools=[WEATHER]),
            responses_line("continued", input="Which word?", previous_response_id=earlier.id),
            responses_line("built-in", input="Hi", tools=[{"type": "web_search"}]),
            responses_line("streamed", input="Hi", stream=True),
            responses_line("background", input="Hi", background=True),
            responses_line("foreign", input="Hi", previous_response_id=foreign.id),
        ])

        batch = await ended(client, (await client.batches.create(
            input_file_id=file_id, endpoint="/v1/responses", completion_window="24h")).id)

        assert batch.status == "completed" and counts(batch) == (7, 3, 4)
        errors = await lines_of(client, batch.error_file_id)
        assert [(line["custom_id"], line["error"]["code"]) for line in errors] == [
            ("built-in", "unsupported_tool"), ("streamed", "unsupported_parameter"),
            ("background", "unsupported_parameter"), ("foreign", "response_not_found")]
        output = {line["custom_id"]: line for line in await lines_of(client, batch.output_file_id)}
        assert list(output) == ["text", "tool", "continued"]
        bodies: dict[str, Response] = {}
        for custom_id, line in output.items():
            assert line["error"] is None and line["response"]["status_code"] == 200
            body = bodies[custom_id] = Response.model_validate(line["response"]["body"])
            job_id = line["response"]["request_id"]
            assert body.id == f"resp_{job_id}" and body.status == "completed"
            # Each line is a response of the tenant, retrievable as any other, and a job at bulk
            retrieved = await client.responses.retrieve(body.id)
            assert retrieved.model_dump() == body.model_dump()
            job = await gw.queue.get(job_id)
            assert job is not None and (job.priority, job.tenant) == (Priority.BULK, "acme")
        assert bodies["text"].output_text and bodies["text"].instructions == "Be brief."
        [call] = bodies["tool"].output
        assert call.type == "function_call" and call.name == "get_weather" and call.call_id
        assert bodies["continued"].previous_response_id == earlier.id
        continued = await gw.queue.get(output["continued"]["response"]["request_id"])
        assert continued is not None
        first = continued.payload["body"]["messages"][0]
        assert first == {"role": "user", "content": "Remember the word tide."}


async def test_the_openapi_document_lists_the_endpoints_a_batch_may_call(gw: Gateway) -> None:
    document = (await gw.http.get("/openapi.json")).json()

    endpoint = document["components"]["schemas"]["BatchRequest"]["properties"]["endpoint"]
    assert endpoint["enum"] == ["/v1/chat/completions", "/v1/embeddings", "/v1/responses",
                                "/v1/completions", "/v1/moderations"]


async def test_a_refused_batch_request_leaves_nothing(gw: Gateway) -> None:
    async with gw.openai("acme") as client:
        file_id = await upload(client, [chat_line("a")])
        too_many = await upload(client, [chat_line(f"n{n}") for n in range(MAX_LINES + 1)])
        before = [batch.id async for batch in client.batches.list()]
        depth = await gw.depth()

        with pytest.raises(openai.BadRequestError) as unserved:
            await client.batches.create(input_file_id=file_id, endpoint="/v1/moderations",
                                        completion_window="24h")
        with pytest.raises(openai.PermissionDeniedError) as above:
            await client.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions",
                                        completion_window="24h", extra_body={"priority": "critical"})
        with pytest.raises(openai.BadRequestError) as lines:
            await client.batches.create(input_file_id=too_many, endpoint="/v1/chat/completions",
                                        completion_window="24h")
        with pytest.raises(openai.BadRequestError) as window:
            await client.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions",
                                        completion_window="10d")  # type: ignore[arg-type]
        with pytest.raises(openai.NotFoundError) as unknown:
            await client.batches.create(input_file_id="file-nope", endpoint="/v1/chat/completions",
                                        completion_window="24h")

        assert status_of(unserved.value) == (400, "unsupported_endpoint")
        assert "/v1/responses" in unserved.value.response.json()["error"]["message"]
        assert status_of(above.value) == (403, "priority_not_allowed")
        assert status_of(lines.value) == (400, "too_many_lines")
        assert status_of(window.value) == (400, "invalid_request")
        assert status_of(unknown.value) == (404, "file_not_found")
        assert [batch.id async for batch in client.batches.list()] == before
        assert await gw.depth() == depth


async def test_a_batch_may_ask_for_a_priority_within_the_tenants_entitlement(gw: Gateway) -> None:
    async with gw.openai("acme") as client:
        file_id = await upload(client, [chat_line("a")])

        batch = await ended(client, (await client.batches.create(
            input_file_id=file_id, endpoint="/v1/chat/completions",
            completion_window="1h",  # type: ignore[arg-type]  # tidegate's: the SDK knows only 24h
            extra_body={"priority": "high"})).id)

        [line] = await lines_of(client, batch.output_file_id)
        job = await gw.queue.get(line["response"]["request_id"])
        assert job is not None and job.priority is Priority.HIGH
        assert job.deadline is not None and batch.expires_at is not None
        assert abs(job.deadline.timestamp() - batch.expires_at) < 2  # the window is the deadline
        assert batch.expires_at - batch.created_at == 3600


async def test_a_repeated_create_with_an_idempotency_key_returns_the_first_batch(gw: Gateway) -> None:
    async with gw.openai("acme") as client:
        file_id = await upload(client, [chat_line("a"), chat_line("b")])
        key = {"Idempotency-Key": f"nightly-{uuid.uuid4().hex}"}

        first = await client.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions",
                                            completion_window="24h", extra_headers=key)
        again = await client.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions",
                                            completion_window="24h", extra_headers=key)

        assert again.id == first.id
        batch = await ended(client, first.id)
        assert batch.request_counts is not None and batch.request_counts.total == 2
        assert len(await lines_of(client, batch.output_file_id)) == 2


async def test_a_create_that_stopped_is_resumed_by_its_repeat_without_doubling_a_job(gw: Gateway) -> None:
    async with gw.openai("acme") as client:
        file_id = await upload(client, [chat_line("a"), chat_line("b")])
        key = {"Idempotency-Key": f"resume-{uuid.uuid4().hex}"}
        first = await ended(client, (await client.batches.create(
            input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h",
            extra_headers=key)).id)
        jobs = sorted(line["response"]["request_id"] for line in await lines_of(client, first.output_file_id))
        # Given its gateway stopped after writing the jobs, before storing the lines: the batch
        # is left validating, for longer than a create takes
        stored = await gw.state.batches.get_batch(first.id)
        assert stored is not None
        left = stored.update(status="validating", created_at=stored.created_at - 3600, completed_at=None,
                             finalizing_at=None, in_progress_at=None, output_file_id=None)
        assert await gw.state.batches.swap_batch(left, "completed")
        await gw.state.batches.put_lines(first.id, [])

        # When the client repeats the create
        again = await client.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions",
                                            completion_window="24h", extra_headers=key)

        # Then the batch is resumed with the jobs it had, none enqueued twice
        assert again.id == first.id and again.status != "validating"
        resumed = await ended(client, again.id)
        assert resumed.status == "completed" and resumed.created_at == left.created_at
        output = await lines_of(client, resumed.output_file_id)
        assert sorted(line["response"]["request_id"] for line in output) == jobs


async def test_cancel_stops_the_lines_not_started_and_keeps_the_finished(gw: Gateway) -> None:
    async with gw.openai("acme") as client:
        with slow(gw, SLOW_MODEL, 300):
            ids = [f"c{n}" for n in range(40)]
            file_id = await upload(client, [chat_line(custom_id, model=SLOW_MODEL) for custom_id in ids])
            created = await client.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions",
                                                  completion_window="24h")

            cancelling = await client.batches.cancel(created.id)
            batch = await ended(client, created.id)

        assert cancelling.status in ("cancelling", "cancelled")
        assert batch.status == "cancelled" and batch.cancelled_at is not None
        output = await lines_of(client, batch.output_file_id)
        errors = await lines_of(client, batch.error_file_id)
        assert batch.request_counts is not None
        assert batch.request_counts.completed == len(output) and batch.request_counts.failed == len(errors)
        assert len(output) + len(errors) == 40 and len(errors) >= 20  # most never started
        assert {line["error"]["code"] for line in errors} == {"batch_cancelled"}
        assert sorted(line["custom_id"] for line in output + errors) == sorted(ids)
        for line in output:
            job = await gw.queue.get(line["response"]["request_id"])
            assert job is not None and job.state is JobState.SUCCEEDED
        with pytest.raises(openai.ConflictError) as again:
            await client.batches.cancel(created.id)
        assert status_of(again.value) == (409, "batch_not_cancellable")


async def test_a_critical_call_overtakes_a_running_batch(gw: Gateway) -> None:
    async with gw.openai("acme") as acme, gw.openai("ops") as ops:
        with slow(gw, SLOW_MODEL, 200):
            # Given a batch of 40 slow lines running on a worker of 8 slots
            file_id = await upload(acme, [chat_line(f"o{n}", model=SLOW_MODEL) for n in range(40)])
            batch = await acme.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions",
                                              completion_window="24h")
            await eventually(lambda: gw.state.batches.get_lines(batch.id), "every line is queued as a job",
                             until=lambda lines: len(lines) == 40 and all(line.job_id for line in lines))
            await eventually(gw.queue.stats, "the worker runs lines", until=lambda stats: stats.in_flight > 0)

            # When a critical call comes after it
            raw = await ops.chat.completions.with_raw_response.create(
                model=SLOW_MODEL, messages=[{"role": "user", "content": "now"}],
                extra_headers={"X-Priority": "critical"})
            lines = await gw.state.batches.get_lines(batch.id)
            jobs = await asyncio.gather(*(gw.queue.get(line.job_id or "") for line in lines))

            # Then it was answered while lines queued before it had still not started
            assert raw.parse().choices[0].message.content
            waiting = [job for job in jobs if job is not None and job.state is JobState.QUEUED]
            assert len(waiting) >= 5
            assert all(job is not None and job.priority is Priority.BULK for job in jobs)
            critical = await gw.queue.get(raw.headers["X-Tidegate-Job-Id"])
            assert critical is not None and critical.priority is Priority.CRITICAL
            assert max(job.created_at for job in waiting) < critical.created_at
            done = await ended(acme, batch.id, timeout_s=30)
        assert done.status == "completed"


async def test_files_and_batches_are_invisible_to_other_tenants(gw: Gateway) -> None:
    async with gw.openai("acme") as acme, gw.openai("globex") as globex:
        file_id = await upload(acme, [chat_line("a")])
        batch = await acme.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions",
                                          completion_window="24h")

        for attempt in (globex.files.retrieve(file_id), globex.files.content(file_id),
                        globex.files.delete(file_id), globex.batches.retrieve(batch.id),
                        globex.batches.cancel(batch.id),
                        globex.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions",
                                              completion_window="24h")):
            with pytest.raises(openai.NotFoundError) as hidden:
                await attempt
            assert hidden.value.response.json()["error"]["code"] in ("file_not_found", "batch_not_found")
        assert file_id not in [file.id async for file in globex.files.list()]
        assert batch.id not in [listed.id async for listed in globex.batches.list()]
        assert (await acme.files.retrieve(file_id)).id == file_id
        assert (await ended(acme, batch.id)).status == "completed"


async def test_batches_are_listed_newest_first_in_pages(gw: Gateway) -> None:
    async with gw.openai("bulkco") as client:
        file_id = await upload(client, [chat_line("a")])
        made = [(await client.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions",
                                             completion_window="24h")).id for _ in range(3)]

        first = await client.batches.list(limit=2)
        listed = [batch.id async for batch in await client.batches.list(limit=2)]

        assert len(first.data) == 2 and first.has_more
        assert sorted(listed) == sorted(made) and len(listed) == 3


async def test_another_gateway_replica_serves_the_same_files_and_batches(gw: Gateway) -> None:
    # Given a second gateway on the same queue, as a replica in another process would be
    async with open_gateway_state(gw.state.config, settings=SETTINGS, recs_url=None) as state, \
            serving(state) as other_url, \
            AsyncOpenAI(base_url=f"{other_url}/v1", api_key=gw.keys["acme"], max_retries=0) as other, \
            gw.openai("acme") as client:
        # When a file is uploaded to one and its batch made and followed on the other
        file_id = await upload(client, [chat_line("a"), chat_line("b")])
        batch = await other.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions",
                                           completion_window="24h")
        done = await ended(other, batch.id)

        # Then each serves what the other stored
        assert done.status == "completed"
        assert (await client.batches.retrieve(batch.id)).status == "completed"
        output = await lines_of(client, done.output_file_id)
        assert sorted(line["custom_id"] for line in output) == ["a", "b"]
