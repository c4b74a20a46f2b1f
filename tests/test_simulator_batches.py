"""The simulated provider's Files and Batch APIs, spoken to with the official OpenAI SDK: a batch's
life and files in OpenAI's shapes, failing lines, whole-batch faults, cancellation, listing, file
deletion, the bounds of an upload, and the counts a test reads to see what was submitted."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import openai
import orjson
import pytest
from openai.types import Batch, CreateEmbeddingResponse
from openai.types.chat import ChatCompletion

from support.waiting import eventually
from tidegate.simulator import Simulator, SimulatorSettings

CHAT_MODEL = "deepseek-v3.2"
EMBEDDING_MODEL = "text-embedding-3-small"
KEY = "sk-sim-1"
ENDED = ("completed", "failed", "expired", "cancelled")


@pytest.fixture
def simulator() -> Simulator:
    return Simulator(SimulatorSettings(seed=5, require_api_key=KEY, batch_latency_s=0.05,
                                       batch_max_file_bytes=64 * 1024))


@pytest.fixture
async def sdk(simulator: Simulator) -> AsyncIterator[openai.AsyncOpenAI]:
    async with (simulator.running() as url,
                openai.AsyncOpenAI(base_url=url, api_key=KEY, max_retries=0) as client):
        yield client


def chat_line(custom_id: str, model: str = CHAT_MODEL, **body: Any) -> dict[str, Any]:
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": model, "messages": [{"role": "user", "content": f"Say {custom_id}."}],
                     "max_tokens": 20, **body}}


def jsonl(lines: list[dict[str, Any]]) -> bytes:
    return b"".join(orjson.dumps(line) + b"\n" for line in lines)


async def start(sdk: openai.AsyncOpenAI, lines: list[dict[str, Any]],
                endpoint: str = "/v1/chat/completions") -> Batch:
    uploaded = await sdk.files.create(file=("input.jsonl", jsonl(lines)), purpose="batch")
    return await sdk.batches.create(input_file_id=uploaded.id, endpoint=endpoint,  # type: ignore[arg-type]
                                    completion_window="24h", metadata={"job": "j-1"})


async def ended(sdk: openai.AsyncOpenAI, batch_id: str) -> Batch:
    # polled, as a provider's batch is: nothing announces its end
    return await eventually(lambda: sdk.batches.retrieve(batch_id), f"batch {batch_id} ends",
                            until=lambda batch: batch.status in ENDED, every_s=0.01)


async def records(sdk: openai.AsyncOpenAI, file_id: str | None) -> dict[str, dict[str, Any]]:
    if file_id is None:
        return {}
    content = await sdk.files.content(file_id)
    return {record["custom_id"]: record for record in map(orjson.loads, content.content.splitlines())}


async def test_a_batch_answers_every_line_in_its_output_file(sdk: openai.AsyncOpenAI) -> None:
    created = await start(sdk, [chat_line("a"), chat_line("b"), chat_line("c")])
    assert (created.status, created.endpoint, created.metadata) == ("validating", "/v1/chat/completions",
                                                                    {"job": "j-1"})

    batch = await ended(sdk, created.id)

    assert batch.status == "completed" and batch.error_file_id is None
    counts = batch.request_counts
    assert counts is not None and (counts.total, counts.completed, counts.failed) == (3, 3, 0)
    assert batch.in_progress_at and batch.finalizing_at and batch.completed_at
    assert batch.output_file_id is not None
    output = await sdk.files.retrieve(batch.output_file_id)
    assert output.purpose == "batch_output" and output.bytes > 0
    answers = await records(sdk, batch.output_file_id)
    assert set(answers) == {"a", "b", "c"}
    for custom_id, record in answers.items():
        assert record["error"] is None and record["id"].startswith("batch_req_")
        response = record["response"]
        assert response["status_code"] == 200 and response["request_id"].startswith("req_")
        completion = ChatCompletion.model_validate(response["body"])
        assert completion.model == CHAT_MODEL and completion.choices[0].message.content, custom_id


async def test_an_embeddings_batch_answers_with_vectors(sdk: openai.AsyncOpenAI) -> None:
    lines = [{"custom_id": f"e{i}", "method": "POST", "url": "/v1/embeddings",
              "body": {"model": EMBEDDING_MODEL, "input": f"text {i}"}} for i in range(2)]

    batch = await ended(sdk, (await start(sdk, lines, "/v1/embeddings")).id)

    answers = await records(sdk, batch.output_file_id)
    assert batch.status == "completed" and set(answers) == {"e0", "e1"}
    vectors = [CreateEmbeddingResponse.model_validate(answers[key]["response"]["body"]).data[0].embedding
               for key in ("e0", "e1")]
    assert vectors[0] != vectors[1] and len(vectors[0]) > 0


async def test_failing_lines_go_to_the_error_file_with_their_status(sdk: openai.AsyncOpenAI) -> None:
    lines = [chat_line("good"), chat_line("unknown", model="no-such-model"), chat_line("bad", messages="hi")]

    batch = await ended(sdk, (await start(sdk, lines)).id)

    assert batch.status == "completed" and batch.request_counts is not None
    assert (batch.request_counts.completed, batch.request_counts.failed) == (1, 2)
    assert set(await records(sdk, batch.output_file_id)) == {"good"}
    errors = await records(sdk, batch.error_file_id)
    assert set(errors) == {"unknown", "bad"}
    unknown, bad = errors["unknown"]["response"], errors["bad"]["response"]
    assert unknown["status_code"] == 404 and unknown["body"]["error"]["code"] == "model_not_found"
    assert bad["status_code"] == 400 and bad["body"]["error"]["param"] == "messages"


async def test_a_file_that_is_not_a_batchs_fails_the_batch_naming_its_lines(sdk: openai.AsyncOpenAI) -> None:
    lines = [chat_line("a"), chat_line("a"), {**chat_line("b"), "url": "/v1/embeddings"}]

    batch = await ended(sdk, (await start(sdk, lines)).id)

    assert batch.status == "failed" and batch.failed_at and batch.output_file_id is None
    assert batch.errors is not None and batch.errors.data is not None
    assert [(error.code, error.line) for error in batch.errors.data] == [("duplicate_custom_id", 2),
                                                                        ("invalid_url", 3)]


@pytest.mark.parametrize("fault", ["failed", "expired"])
async def test_a_fault_setting_ends_the_whole_batch_so(simulator: Simulator, sdk: openai.AsyncOpenAI,
                                                       fault: str) -> None:
    simulator.configure({"batch_fault": fault})

    batch = await ended(sdk, (await start(sdk, [chat_line("a"), chat_line("b")])).id)

    assert batch.status == fault and batch.output_file_id is None
    if fault == "expired":
        errors = await records(sdk, batch.error_file_id)
        assert set(errors) == {"a", "b"}
        assert all(record["response"] is None and record["error"]["code"] == "batch_expired"
                   for record in errors.values())
    assert simulator.stats_dict()["batches"]["lines"] == 0  # no line was answered


async def test_a_cancelled_batch_answers_nothing_and_cannot_be_cancelled_again(
    simulator: Simulator, sdk: openai.AsyncOpenAI,
) -> None:
    simulator.configure({"batch_latency_s": 3600})
    batch = await start(sdk, [chat_line("a")])

    cancelling = await sdk.batches.cancel(batch.id)
    cancelled = await ended(sdk, batch.id)

    assert cancelling.status in ("cancelling", "cancelled")
    assert cancelled.status == "cancelled" and cancelled.output_file_id is cancelled.error_file_id is None
    assert simulator.stats_dict()["batches"]["lines"] == 0
    with pytest.raises(openai.ConflictError) as refused:
        await sdk.batches.cancel(batch.id)
    assert refused.value.code == "batch_not_cancellable"


async def test_batches_are_listed_newest_first_page_by_page(sdk: openai.AsyncOpenAI) -> None:
    started = [(await start(sdk, [chat_line("a")])).id for _ in range(3)]

    first = await sdk.batches.list(limit=2)
    listed = [batch.id async for batch in await sdk.batches.list(limit=2)]

    assert [batch.id for batch in first.data] == started[:0:-1] and first.has_more
    assert listed == started[::-1]


async def test_uploads_are_bounded_and_checked(sdk: openai.AsyncOpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as large:
        await sdk.files.create(file=("big.jsonl", b"x" * (64 * 1024 + 1)), purpose="batch")
    with pytest.raises(openai.BadRequestError) as purpose:
        await sdk.files.create(file=("tune.jsonl", b"{}\n"), purpose="fine-tune")

    assert (large.value.code, large.value.param) == ("file_too_large", "file")
    assert (purpose.value.code, purpose.value.param) == ("invalid_value", "purpose")


async def test_unknown_ids_and_bad_creations_are_refused_with_a_code(sdk: openai.AsyncOpenAI) -> None:
    uploaded = await sdk.files.create(file=("input.jsonl", jsonl([chat_line("a")])), purpose="batch")

    with pytest.raises(openai.NotFoundError) as batch:
        await sdk.batches.retrieve("batch_missing")
    with pytest.raises(openai.NotFoundError) as file:
        await sdk.batches.create(input_file_id="file-missing", endpoint="/v1/chat/completions",
                                 completion_window="24h")
    with pytest.raises(openai.BadRequestError) as endpoint:
        await sdk.batches.create(input_file_id=uploaded.id, endpoint="/v1/completions",
                                 completion_window="24h")
    with pytest.raises(openai.AuthenticationError):
        await sdk.with_options(api_key="sk-wrong").files.retrieve(uploaded.id)

    assert (batch.value.code, file.value.code) == ("batch_not_found", "file_not_found")
    assert (endpoint.value.code, endpoint.value.param) == ("invalid_value", "endpoint")


async def test_the_stats_count_batches_and_lines_outside_the_rate_limits(simulator: Simulator,
                                                                         sdk: openai.AsyncOpenAI) -> None:
    simulator.configure({"models": {CHAT_MODEL: {"rpm": 1}}})

    batch = await ended(sdk, (await start(sdk, [chat_line(f"l{i}") for i in range(5)])).id)
    live = await sdk.chat.completions.create(model=CHAT_MODEL, messages=[{"role": "user", "content": "Hi"}])

    assert batch.status == "completed" and batch.request_counts is not None
    assert batch.request_counts.completed == 5 and live.choices
    stats = simulator.stats_dict()
    assert stats["batches"]["created"] == 1 and stats["batches"]["files"] == 1
    assert stats["batches"]["lines"] == 5 and stats["batches"]["lines_by_status"] == {"200": 5}
    assert stats["batches"]["lines_by_model"] == {CHAT_MODEL: 5}
    assert stats["batches"]["ended"] == {"completed": 1}
    assert stats["models"][CHAT_MODEL]["accepted"] == 1  # only the live request


async def test_uploads_and_listings_refuse_what_is_not_theirs(simulator: Simulator) -> None:
    headers = {"Authorization": f"Bearer {KEY}"}
    async with simulator.running() as url, aiohttp.ClientSession(headers=headers) as http:
        async with http.post(f"{url}/files", json={"purpose": "batch"}) as not_a_form:
            refused_json = (not_a_form.status, (await not_a_form.json())["error"]["code"])
        form = aiohttp.FormData()
        form.add_field("file", b"{}\n", filename="input.jsonl")
        async with http.post(f"{url}/files", data=form) as no_purpose:
            refused_form = (no_purpose.status, (await no_purpose.json())["error"]["param"])
        async with http.get(f"{url}/batches", params={"limit": "0"}) as listing:
            refused_limit = (listing.status, (await listing.json())["error"]["code"])

    assert refused_json == (400, "invalid_request")
    assert refused_form == (400, "purpose")
    assert refused_limit == (400, "invalid_value")


async def test_a_deleted_file_is_gone_and_deleting_it_again_is_refused_with_a_code(
    sdk: openai.AsyncOpenAI,
) -> None:
    batch = await ended(sdk, (await start(sdk, [chat_line("a")])).id)

    deleted = await sdk.files.delete(batch.input_file_id)

    assert (deleted.id, deleted.object, deleted.deleted) == (batch.input_file_id, "file", True)
    for again in (sdk.files.retrieve, sdk.files.delete):
        with pytest.raises(openai.NotFoundError) as gone:
            await again(batch.input_file_id)
        assert gone.value.code == "file_not_found"
    # The batch that ran on it keeps its record and its output
    assert (await sdk.batches.retrieve(batch.id)).input_file_id == batch.input_file_id
    assert list(await records(sdk, batch.output_file_id)) == ["a"]
