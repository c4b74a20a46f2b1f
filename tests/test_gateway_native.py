"""Native pass-through, with the official SDKs against a real gateway, a worker and the simulator
on both queue backends: a Responses request to a provider that speaks the Responses API itself,
and a Messages request to an Anthropic upstream, go as the client wrote them, and their answers
and events come back as the upstream gave them. What only the API itself can carry is taken when
every provider that may serve the model speaks it, and refused with a 400 otherwise.

The simulator is three providers here: `sim-responses` serves gpt-4.1 and speaks the Responses API
natively (`native_apis`), `sim-messages` serves claude-sonnet-4.5 over Anthropic's Messages API
(`api = "anthropic"`), and `sim` serves every other model over chat completions only. What the
simulator received (`Simulator.received`) shows what each upstream was sent."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import anthropic
import openai
import orjson
import pytest
import pytest_asyncio
from anthropic.types import MessageParam
from openai import AsyncOpenAI
from openai.types import Batch
from openai.types.responses import Response, ResponseStreamEvent, ToolParam
from pydantic import TypeAdapter

from conftest import BACKENDS
from support.dispatch import PROVIDER, wait_final
from support.gateway import Gateway, module_gateway, three_providers
from support.waiting import eventually
from tidegate.ai import AIResult
from tidegate.gateway.anthropic.dialect import ANTHROPIC
from tidegate.gateway.anthropic.schemas import MessagesRequest
from tidegate.gateway.core.dialect import StreamRenderer
from tidegate.gateway.responses.compaction import COMPACTION_PROMPT
from tidegate.gateway.responses.dialect import RESPONSES
from tidegate.gateway.responses.schemas import ResponseCreateRequest
from tidegate.gateway.responses.summaries import SUMMARY_PREFIX
from tidegate.jobs import JobState, Priority
from tidegate.simulator.server import InjectedFault

pytestmark = pytest.mark.asyncio(loop_scope="module")

RESPONSES_MODEL = "gpt-4.1"
MESSAGES_MODEL = "claude-sonnet-4.5"
CHAT_ONLY_MODEL = "deepseek-v3.2"
SEARCH: ToolParam = {"type": "web_search_preview"}
HELLO: list[MessageParam] = [{"role": "user", "content": "Say hello"}]
THINKING: dict[str, Any] = {"type": "enabled", "budget_tokens": 1024}
STREAM_EVENT: TypeAdapter[ResponseStreamEvent] = TypeAdapter(ResponseStreamEvent)


@pytest_asyncio.fixture(scope="module", loop_scope="module", params=BACKENDS)
async def gw(request: pytest.FixtureRequest,
             tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Gateway]:
    """One gateway, worker and simulator per backend, shared by the module's tests."""
    async with module_gateway(request, tmp_path_factory, configure=three_providers) as gateway:
        yield gateway


@pytest_asyncio.fixture(loop_scope="module")
async def acme(gw: Gateway) -> AsyncIterator[AsyncOpenAI]:
    async with gw.openai("acme") as client:
        yield client


@pytest_asyncio.fixture(loop_scope="module")
async def claude(gw: Gateway) -> AsyncIterator[anthropic.AsyncAnthropic]:
    async with anthropic.AsyncAnthropic(base_url=gw.url, api_key=None, max_retries=0,
                                        default_headers={"x-api-key": gw.keys["acme"]}) as client:
        yield client


def last_sent(gw: Gateway, path: str) -> dict[str, Any]:
    """The body the simulator last accepted at `path`."""
    return gw.sim.received(path)[-1]


# ---------------------------------------------------------------------- the Responses API


async def test_a_built_in_tool_and_reasoning_reach_a_responses_native_provider_as_sent(
    gw: Gateway, acme: AsyncOpenAI,
) -> None:
    raw = await acme.responses.with_raw_response.create(
        model=RESPONSES_MODEL, input="Find today's news", tools=[SEARCH], metadata={"ticket": "t-1"},
        reasoning={"effort": "low", "summary": "auto"}, include=["reasoning.encrypted_content"],
        extra_body={"priority": "high"})
    response = raw.parse()
    Response.model_validate_json(raw.content)  # every field the SDK's model requires, strictly

    # The upstream was sent the request as written: the model routed, tidegate's own fields out.
    sent = last_sent(gw, "/v1/responses")
    assert sent["tools"] == [SEARCH] and sent["reasoning"] == {"effort": "low", "summary": "auto"}
    assert sent["include"] == ["reasoning.encrypted_content"] and sent["metadata"] == {"ticket": "t-1"}
    assert (sent["model"], sent["store"]) == (RESPONSES_MODEL, False)
    assert "priority" not in sent and "background" not in sent
    # Its Response is the answer, under tidegate's id, with the reasoning item it gave.
    job_id = raw.headers["X-Tidegate-Job-Id"]
    assert response.id == f"resp_{job_id}" and response.status == "completed"
    assert [item.type for item in response.output] == ["reasoning", "message"]
    assert response.output_text and raw.http_response.json()["store"] is True
    assert response.usage is not None and response.usage.output_tokens_details.reasoning_tokens > 0
    # The job is billed by the Response's usage, and retrieving it shows the same response.
    job = await gw.queue.get(job_id)
    assert job is not None and job.state is JobState.SUCCEEDED and job.priority.name == "HIGH"
    assert job.payload["origin"]["native_only"] is True
    assert job.result["provider"] == "sim-responses" and job.result["cost_micros"] > 0
    assert job.result["usage"]["prompt_tokens"] == response.usage.input_tokens
    assert job.result["usage"]["completion_tokens"] == response.usage.output_tokens
    retrieved = await acme.responses.retrieve(response.id)
    assert retrieved.id == response.id and retrieved.output_text == response.output_text


async def test_a_translatable_request_to_a_native_provider_goes_natively_too(
    gw: Gateway, acme: AsyncOpenAI,
) -> None:
    response = await acme.responses.create(model=RESPONSES_MODEL, input="Say hello", instructions="Be brief.")

    sent = last_sent(gw, "/v1/responses")
    assert (sent["input"], sent["instructions"]) == ("Say hello", "Be brief.")
    assert response.id.startswith("resp_") and response.instructions == "Be brief."
    job = await gw.queue.get(response.id.removeprefix("resp_"))
    assert job is not None and "native_only" not in job.payload["origin"]


async def test_a_native_upstream_is_sent_the_request_field_for_field_in_the_order_it_was_validated(
    gw: Gateway, acme: AsyncOpenAI,
) -> None:
    # Given a request with a field tidegate does not name, a null, the API's defaults sent
    # explicitly, and tidegate's own fields
    raw = await acme.responses.with_raw_response.create(
        model=RESPONSES_MODEL, input="Say hello", temperature=1.0, parallel_tool_calls=True,
        metadata={"ticket": "t-2"}, store=True, background=False,
        extra_body={"instructions": None, "priority": "high", "a_field_tidegate_does_not_name": {"kept": 1}})

    # The upstream is sent it as written: the routed model, tidegate's own fields out, and
    # `store` false (the response is kept by tidegate, as its job).
    assert list(last_sent(gw, "/v1/responses").items()) == [
        ("model", RESPONSES_MODEL), ("input", "Say hello"), ("instructions", None), ("temperature", 1.0),
        ("parallel_tool_calls", True), ("metadata", {"ticket": "t-2"}),
        ("a_field_tidegate_does_not_name", {"kept": 1}), ("store", False)]
    # The job keeps the request as it was validated, and the response repeats tidegate's settings.
    job = await gw.queue.get(raw.headers["X-Tidegate-Job-Id"])
    assert job is not None and job.payload["origin"]["body"] == {
        "model": RESPONSES_MODEL, "input": "Say hello", "instructions": None, "temperature": 1.0,
        "parallel_tool_calls": True, "metadata": {"ticket": "t-2"}, "store": True, "background": False,
        "priority": "high", "a_field_tidegate_does_not_name": {"kept": 1}}
    answered = raw.http_response.json()
    assert (answered["store"], answered["background"]) == (True, False)


async def test_a_native_only_request_for_a_chat_only_model_is_refused_and_nothing_is_queued(
    gw: Gateway, acme: AsyncOpenAI,
) -> None:
    received = len(gw.sim.received("/v1/chat/completions"))
    for model in (CHAT_ONLY_MODEL, "auto"):  # auto may be routed to a chat-only provider
        with pytest.raises(openai.BadRequestError) as refused:
            await acme.responses.create(model=model, input="Find today's news", tools=[SEARCH])
        error = refused.value.body
        assert isinstance(error, dict) and (error["code"], error["param"]) == ("unsupported_tool",
                                                                             "tools[0].type")
    with pytest.raises(openai.BadRequestError) as summary:
        await acme.responses.create(model=CHAT_ONLY_MODEL, input="Hi", reasoning={"summary": "auto"})
    assert isinstance(summary.value.body, dict) and summary.value.body["code"] == "unsupported_parameter"
    assert len(gw.sim.received("/v1/chat/completions")) == received


async def test_a_native_stream_relays_the_upstreams_typed_events(gw: Gateway, acme: AsyncOpenAI) -> None:
    async with acme.responses.stream(model=RESPONSES_MODEL, input="Say hello", tools=[SEARCH],
                                     reasoning={"effort": "low"}) as stream:
        events = [event async for event in stream]
        final = await stream.get_final_response()
    raw = await acme.responses.create(model=RESPONSES_MODEL, input="Say hello", stream=True,
                                      reasoning={"effort": "low"})
    created = [event async for event in raw]

    assert last_sent(gw, "/v1/responses")["stream"] is True
    kinds = [event.type for event in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    assert "response.output_item.added" in kinds and "response.output_text.delta" in kinds
    assert [event.sequence_number for event in events] == list(range(len(events)))
    # The ids the client sees are tidegate's, the one it may retrieve.
    assert final.id.startswith("resp_") and events[0].response.id == final.id  # type: ignore[union-attr]
    text = "".join(event.delta for event in events if event.type == "response.output_text.delta")
    assert text and text == final.output_text
    assert [item.type for item in final.output] == ["reasoning", "message"]
    assert (await acme.responses.retrieve(final.id)).output_text == text
    # Each event of a plain `stream: true` parses strictly as the SDK's own type.
    for event in created:
        STREAM_EVENT.validate_python(event.model_dump(exclude_unset=True))
    assert created[-1].type == "response.completed" and created[-1].response.id.startswith("resp_")


async def test_a_continued_native_response_sends_the_earlier_items_upstream(
    gw: Gateway, acme: AsyncOpenAI,
) -> None:
    first = await acme.responses.create(model=RESPONSES_MODEL, input="Find the news", tools=[SEARCH],
                                        reasoning={"effort": "low"})
    second = await acme.responses.create(model=RESPONSES_MODEL, input="And tomorrow?", tools=[SEARCH],
                                         previous_response_id=first.id)

    sent = last_sent(gw, "/v1/responses")
    assert "previous_response_id" not in sent  # the upstream never saw tidegate's ids
    assert [item.get("type") for item in sent["input"]] == ["message", "reasoning", "message", "message"]
    assert sent["input"][0]["content"] == "Find the news" and sent["input"][-1]["content"] == "And tomorrow?"
    assert second.previous_response_id == first.id and second.status == "completed"


async def test_a_compaction_for_a_responses_native_model_is_its_upstreams_own(
    gw: Gateway, acme: AsyncOpenAI,
) -> None:
    # Given a stored native response
    first = await acme.responses.create(model=RESPONSES_MODEL, input="Find the news", tools=[SEARCH],
                                        reasoning={"effort": "low"})

    # When its conversation is compacted, with a field only OpenAI's endpoint knows
    raw = await acme.responses.with_raw_response.compact(
        model=RESPONSES_MODEL, previous_response_id=first.id, input="And tomorrow?",
        prompt_cache_retention="24h", extra_headers={"X-Priority": "high"})
    compacted = raw.parse()

    # Then the upstream's /responses/compact was sent the conversation as items, as written
    sent = last_sent(gw, "/v1/responses/compact")
    assert "previous_response_id" not in sent and "priority" not in sent
    assert (sent["model"], sent["prompt_cache_retention"]) == (RESPONSES_MODEL, "24h")
    assert [item.get("type") for item in sent["input"]] == ["message", "reasoning", "message", "message"]
    assert sent["input"][-1] == {"type": "message", "role": "user", "content": "And tomorrow?"}
    # and its answer, its encrypted compaction item in it, comes back as it gave it, under the job's id
    job = await gw.queue.get(raw.headers["X-Tidegate-Job-Id"])
    assert job is not None and job.priority is Priority.HIGH
    # (only a native provider may serve it: a reasoning item, and a field a chat completion lacks)
    assert job.payload["origin"]["api"] == "compact" and job.payload["origin"]["native_only"] is True
    assert job.result["provider"] == "sim-responses" and job.result["cost_micros"] > 0
    output = orjson.loads(raw.content)["output"]
    assert compacted.id == f"resp_{job.id}" and output == job.result["response"]["output"]
    assert [item["type"] for item in output] == ["message", "message", "compaction"]
    assert not output[-1]["encrypted_content"].startswith(SUMMARY_PREFIX)

    # A response given that output goes on natively with the upstream's own item
    follow_up = await acme.responses.create(model=RESPONSES_MODEL, input=[*output, {"role": "user",
                                                                                  "content": "Go on"}])
    assert follow_up.status == "completed"
    assert last_sent(gw, "/v1/responses")["input"][2] == output[2]
    # and a chat-only model cannot read it
    with pytest.raises(openai.BadRequestError) as refused:
        await acme.responses.create(model=CHAT_ONLY_MODEL, input=output)
    assert isinstance(refused.value.body, dict)
    assert (refused.value.body["code"], refused.value.body["param"]) == ("unsupported_input_item",
                                                                         "input[2].type")


async def test_tidegates_own_compaction_reaches_a_native_provider_as_the_summary_it_holds(
    gw: Gateway, acme: AsyncOpenAI,
) -> None:
    # Given a conversation compacted by a chat-only model: tidegate's own compaction item
    raw = await acme.responses.with_raw_response.compact(model=CHAT_ONLY_MODEL, input="Plan a trip.")
    output = orjson.loads(raw.content)["output"]
    summary = output[-1]["encrypted_content"].removeprefix(SUMMARY_PREFIX)

    # When a Responses-native model goes on from it
    await acme.responses.create(model=RESPONSES_MODEL, input=[*output, {"role": "user", "content": "Go on"}])

    # Then the upstream reads the summary as a developer message, not an item it cannot open
    assert output[-1]["encrypted_content"].startswith(SUMMARY_PREFIX)
    assert [item.get("role") for item in last_sent(gw, "/v1/responses")["input"]] == ["user", "developer",
                                                                                      "user"]
    assert last_sent(gw, "/v1/responses")["input"][1]["content"].endswith(summary)
    # and a field only OpenAI's endpoint knows is refused for that model, before anything is queued
    queued = gw.state.metrics.registry.get_sample_value(
        "tidegate_gateway_jobs_enqueued_total", {"kind": "chat", "priority": "normal"})
    with pytest.raises(openai.BadRequestError) as refused:
        await acme.responses.compact(model=CHAT_ONLY_MODEL, input="Plan a trip.",
                                     prompt_cache_retention="24h")
    assert gw.state.metrics.registry.get_sample_value(
        "tidegate_gateway_jobs_enqueued_total", {"kind": "chat", "priority": "normal"}) == queued
    assert isinstance(refused.value.body, dict)
    assert (refused.value.body["code"], refused.value.body["param"]) == ("unsupported_parameter",
                                                                         "prompt_cache_retention")


async def test_a_native_only_job_routed_to_a_chat_only_provider_fails_saying_why(gw: Gateway) -> None:
    # Given a job that only a Responses-native provider may serve, routed to a chat-only model
    # (as when the configuration changed after it was queued)
    payload = {"kind": "chat",
               "body": {"model": CHAT_ONLY_MODEL, "messages": [{"role": "user", "content": "Hi"}]},
               "origin": {"api": "responses", "native_only": True,
                          "body": {"model": CHAT_ONLY_MODEL, "input": "Hi", "tools": [SEARCH]}}}
    job_id = await gw.queue.enqueue(payload, tenant="acme")

    [job] = await wait_final(gw.queue, [job_id])

    # Then it fails at once, naming why, rather than be answered without what it asked for
    assert job.state is JobState.DEAD and job.attempts == 1
    assert job.failure is not None and job.failure["code"] == "native_api_required"
    assert "does not speak" in job.failure["message"]


async def test_a_compaction_job_routed_to_a_chat_only_provider_is_summarized_unless_only_native(
    gw: Gateway,
) -> None:
    # Given compaction jobs that reach a chat-only model (the configuration changed after they
    # were queued): one whose chat body is the summary request, one only a native provider may serve
    summarize = [{"role": "user", "content": "Plan a trip."}, {"role": "user", "content": COMPACTION_PROMPT}]
    payloads = [
        {"kind": "chat", "body": {"model": CHAT_ONLY_MODEL, "messages": summarize},
         "origin": {"api": "compact", "body": {"model": CHAT_ONLY_MODEL, "input": "Plan a trip."}}},
        {"kind": "chat", "body": {"model": CHAT_ONLY_MODEL, "messages": summarize[:1]},
         "origin": {"api": "compact", "native_only": True, "body": {
             "model": CHAT_ONLY_MODEL, "input": [{"type": "compaction", "encrypted_content": "gAAAA"}]}}}]
    compactions = len(gw.sim.received("/v1/responses/compact"))
    job_ids = [await gw.queue.enqueue(payload, tenant="acme") for payload in payloads]

    summarized, refused = await wait_final(gw.queue, job_ids)

    # Then the first is summarized by the chat model, and the second fails saying why
    assert summarized.state is JobState.SUCCEEDED and summarized.result is not None
    assert summarized.result["response"]["object"] == "chat.completion"
    assert last_sent(gw, "/v1/chat/completions")["messages"][-1]["content"] == COMPACTION_PROMPT
    assert refused.state is JobState.DEAD and refused.failure is not None
    assert refused.failure["code"] == "native_api_required" and "responses API" in refused.failure["message"]
    assert len(gw.sim.received("/v1/responses/compact")) == compactions


async def batch_of(client: AsyncOpenAI, lines: dict[str, dict[str, Any]]) -> Batch:
    """A `/v1/responses` batch of `lines` (bodies by custom_id), polled as a client would until it ended."""
    content = b"".join(orjson.dumps({"custom_id": custom_id, "method": "POST", "url": "/v1/responses",
                                     "body": body}) + b"\n" for custom_id, body in lines.items())
    file = await client.files.create(file=("requests.jsonl", content), purpose="batch")
    batch = await client.batches.create(input_file_id=file.id, endpoint="/v1/responses",
                                        completion_window="24h")
    ended = ("completed", "failed", "expired", "cancelled")
    return await eventually(lambda: client.batches.retrieve(batch.id), f"batch {batch.id} ends",
                            until=lambda batch: batch.status in ended, every_s=0.1)


def sent_asking(gw: Gateway, text: str) -> dict[str, Any]:
    """The last body the simulator accepted at /v1/responses whose input ends with `text`."""
    def last_text(body: dict[str, Any]) -> Any:
        given = body["input"]
        return given if isinstance(given, str) else given[-1].get("content")
    return [body for body in gw.sim.received("/v1/responses") if last_text(body) == text][-1]


async def file_lines(client: AsyncOpenAI, file_id: str | None) -> dict[str, dict[str, Any]]:
    """The lines of a batch's output or error file, by custom_id."""
    if file_id is None:
        return {}
    content = (await client.files.content(file_id)).content
    return {line["custom_id"]: line for line in map(orjson.loads, content.splitlines())}


async def test_a_batch_line_is_taken_natively_or_refused_as_the_route_would(
    gw: Gateway, acme: AsyncOpenAI,
) -> None:
    earlier = await acme.responses.create(model=RESPONSES_MODEL, input="Remember the word tide.")
    news = {"input": "Find the batch news", "tools": [SEARCH]}
    batch = await batch_of(acme, {
        "native": {**news, "model": RESPONSES_MODEL, "reasoning": {"effort": "low", "summary": "auto"},
                   "include": ["reasoning.encrypted_content"]},
        "continued": {"model": RESPONSES_MODEL, "input": "Which word, searched?", "tools": [SEARCH],
                      "previous_response_id": earlier.id},
        "chat-only": {**news, "model": CHAT_ONLY_MODEL},
        "auto": {**news, "model": "auto"},  # auto may be routed to a chat-only provider
        "summary": {"model": CHAT_ONLY_MODEL, "input": "Hi", "reasoning": {"summary": "auto"}},
    })

    # The lines for a model only Responses-native providers serve ran natively; the others are
    # the error file's, with the code the route answers them with.
    assert batch.status == "completed" and batch.request_counts is not None
    assert (batch.request_counts.completed, batch.request_counts.failed) == (2, 3)
    errors = await file_lines(acme, batch.error_file_id)
    assert {custom_id: line["error"]["code"] for custom_id, line in errors.items()} == {
        "chat-only": "unsupported_tool", "auto": "unsupported_tool", "summary": "unsupported_parameter"}
    output = await file_lines(acme, batch.output_file_id)
    assert list(output) == ["native", "continued"]
    # The upstream was sent each line as written, the continued one after the earlier items.
    native, continued = (sent_asking(gw, text) for text in ("Find the batch news", "Which word, searched?"))
    assert native["tools"] == [SEARCH] and native["reasoning"] == {"effort": "low", "summary": "auto"}
    assert native["include"] == ["reasoning.encrypted_content"] and native["model"] == RESPONSES_MODEL
    assert continued["tools"] == [SEARCH] and "previous_response_id" not in continued
    assert continued["input"][0]["content"] == "Remember the word tide."
    # Each answer is the upstream's own Response under tidegate's id, retrievable like any other.
    for custom_id, line in output.items():
        body = Response.model_validate(line["response"]["body"])
        job_id = line["response"]["request_id"]
        assert body.id == f"resp_{job_id}" and body.status == "completed" and body.output_text
        assert (await acme.responses.retrieve(body.id)).model_dump() == body.model_dump()
        job = await gw.queue.get(job_id)
        assert job is not None and job.payload["origin"]["native_only"] is True, custom_id
        assert job.priority is Priority.BULK and job.result["provider"] == "sim-responses"
    assert [item.type for item in Response.model_validate(output["native"]["response"]["body"]).output] == [
        "reasoning", "message"]
    assert Response.model_validate(output["continued"]["response"]["body"]).previous_response_id == earlier.id


# ---------------------------------------------------------------------- Anthropic's Messages API


async def test_top_k_and_thinking_reach_an_anthropic_provider_and_the_thinking_comes_back(
    gw: Gateway, claude: anthropic.AsyncAnthropic,
) -> None:
    raw = await claude.messages.with_raw_response.create(
        model=MESSAGES_MODEL, max_tokens=2048, messages=HELLO, extra_body={"top_k": 5},
        thinking={"type": "enabled", "budget_tokens": 1024})
    message = await raw.parse()

    sent = last_sent(gw, "/v1/messages")
    assert (sent["top_k"], sent["thinking"], sent["model"]) == (5, THINKING, MESSAGES_MODEL)
    assert sent["messages"] == HELLO and "priority" not in sent
    assert [block.type for block in message.content] == ["thinking", "text"]
    thinking = message.content[0]
    assert thinking.type == "thinking" and thinking.thinking and thinking.signature
    assert message.usage.input_tokens > 0 and message.usage.output_tokens > 0
    job = await gw.queue.get(raw.headers["X-Tidegate-Job-Id"])
    assert job is not None and job.result["provider"] == "sim-messages"
    assert job.result["usage"]["completion_tokens"] == message.usage.output_tokens

    # A conversation sent back with its thinking block goes on as it is.
    answered = await claude.messages.create(
        model=MESSAGES_MODEL, max_tokens=2048, thinking={"type": "enabled", "budget_tokens": 1024},
        messages=[*HELLO, {"role": "assistant", "content": message.content},
                  {"role": "user", "content": "Again"}])
    assert answered.content[-1].type == "text"
    assert last_sent(gw, "/v1/messages")["messages"][1]["content"][0]["type"] == "thinking"


async def test_top_k_for_a_chat_only_model_is_refused_in_anthropics_shape(
    claude: anthropic.AsyncAnthropic,
) -> None:
    for extra in ({"top_k": 5}, {"thinking": THINKING}):
        with pytest.raises(anthropic.BadRequestError) as refused:
            await claude.messages.create(model=CHAT_ONLY_MODEL, max_tokens=2048, messages=HELLO,
                                         extra_body=extra)
        body = refused.value.response.json()
        assert (body["error"]["type"], body["error"]["code"]) == ("invalid_request_error",
                                                                  "unsupported_parameter")


async def test_a_native_message_stream_relays_anthropics_events(
    gw: Gateway, claude: anthropic.AsyncAnthropic,
) -> None:
    async with claude.messages.stream(model=MESSAGES_MODEL, max_tokens=2048, messages=HELLO,
                                      thinking={"type": "enabled", "budget_tokens": 1024}) as stream:
        kinds = [event.type async for event in stream]
        final = await stream.get_final_message()

    assert last_sent(gw, "/v1/messages")["stream"] is True
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert "thinking" in kinds and "signature" in kinds and "text" in kinds  # the SDK's own events
    assert [block.type for block in final.content] == ["thinking", "text"]
    assert final.content[1].type == "text" and final.content[1].text
    assert final.usage.output_tokens > 0


async def test_a_translated_path_is_unchanged_for_a_chat_only_model(
    gw: Gateway, claude: anthropic.AsyncAnthropic, acme: AsyncOpenAI,
) -> None:
    message = await claude.messages.create(model=CHAT_ONLY_MODEL, max_tokens=32, messages=HELLO)
    response = await acme.responses.create(model=CHAT_ONLY_MODEL, input="Say hello")

    sent = gw.sim.received("/v1/chat/completions")[-2:]
    assert all(body["model"] == CHAT_ONLY_MODEL and "messages" in body for body in sent)
    assert message.content[0].type == "text" and response.output_text
    job = await gw.queue.get(response.id.removeprefix("resp_"))
    assert job is not None and job.result["provider"] == PROVIDER


async def test_a_native_stream_cut_off_by_the_provider_ends_with_response_failed(
    gw: Gateway, acme: AsyncOpenAI,
) -> None:
    # Given a Responses-native provider that resets the connection half way through its stream
    gw.sim.inject(RESPONSES_MODEL, InjectedFault("reset"))
    stream = await acme.responses.create(model=RESPONSES_MODEL, input="Say hello", stream=True,
                                         max_output_tokens=40)
    events = [event async for event in stream]

    # Then the client had the upstream's first events, then tidegate's response.failed, numbered on
    kinds = [event.type for event in events]
    assert kinds[0] == "response.created" and "response.output_text.delta" in kinds
    assert kinds[-1] == "response.failed" and "response.completed" not in kinds
    failed = events[-1]
    assert failed.type == "response.failed" and failed.response.error is not None
    assert failed.response.id == events[0].response.id  # type: ignore[union-attr]
    assert [event.sequence_number for event in events] == list(range(len(events)))


def sse_data(body: bytes) -> list[dict[str, Any]]:
    """The data of each server-sent event in `body`."""
    return [orjson.loads(line.removeprefix(b"data: ")) for line in body.split(b"\n")
            if line.startswith(b"data: ")]


def whole_stream(renderer: StreamRenderer, result: AIResult) -> bytes:
    """What a stream renders of a stored answer (a worker without a relay stored it whole)."""
    frames = [renderer.frame(part) for part in renderer.whole_answer(result, "job1")]
    return b"".join(frame for frame in frames if frame is not None) + renderer.end_frame()


async def test_a_stored_native_answer_streams_as_its_own_events() -> None:
    request = RESPONSES.translate(
        ResponseCreateRequest(model="auto", input="Hi", stream=True, tools=[dict(SEARCH)]), native=True)
    response = {"id": "resp_upstream", "object": "response", "created_at": 1, "status": "completed",
                "model": RESPONSES_MODEL, "output": [{"id": "msg_1", "type": "message", "role": "assistant",
                                                     "status": "completed", "content": [
                                                         {"type": "output_text", "text": "Hello",
                                                          "annotations": []}]}],
                "parallel_tool_calls": True, "tool_choice": "auto", "tools": [SEARCH], "error": None,
                "incomplete_details": None, "instructions": None, "metadata": {}, "temperature": 1.0,
                "top_p": 1.0, "store": False}
    message = {"id": "msg_upstream", "type": "message", "role": "assistant", "model": MESSAGES_MODEL,
               "content": [{"type": "thinking", "thinking": "hm", "signature": "s"},
                           {"type": "text", "text": "Hello"}],
               "stop_reason": "end_turn", "stop_sequence": None,
               "usage": {"input_tokens": 3, "output_tokens": 2}, "service_tier": "default"}

    responses = sse_data(whole_stream(RESPONSES.call("job1", request, 1).stream(request),
                                      AIResult(response, model=RESPONSES_MODEL)))
    messages = sse_data(whole_stream(ANTHROPIC.stream(ANTHROPIC.translate(MessagesRequest.model_validate(
        {"model": MESSAGES_MODEL, "max_tokens": 2048, "messages": HELLO, "stream": True}))),
        AIResult(message, model=MESSAGES_MODEL)))

    events = [STREAM_EVENT.validate_python(event) for event in responses]
    assert [event.type for event in events] == ["response.created", "response.completed"]
    final = events[-1]
    assert final.type == "response.completed" and final.response.id == "resp_job1"
    assert final.response.output_text == "Hello" and responses[-1]["response"]["store"] is True
    assert [event["type"] for event in messages] == [
        "message_start", "content_block_start", "content_block_stop", "content_block_start",
        "content_block_stop", "message_delta", "message_stop"]
    assert messages[1]["content_block"] == message["content"][0]  # type: ignore[index]
    assert "service_tier" not in messages[0]["message"]
