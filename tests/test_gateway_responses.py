"""The official OpenAI SDK's Responses API, unchanged, against a real gateway over HTTP with a
worker and the simulated provider behind it, on both queue backends: every response is a job
of the queue, rendered back as a response."""

from __future__ import annotations

import base64
import uuid
from collections.abc import AsyncIterator
from typing import Any

import openai
import orjson
import pytest
import pytest_asyncio
from openai import AsyncOpenAI
from openai.types.responses import (
    CompactedResponse,
    FunctionToolParam,
    Response,
    ResponseCompactionItem,
    ResponseItem,
    ResponseStreamEvent,
)
from pydantic import TypeAdapter

from conftest import BACKENDS
from support.gateway import Gateway, module_gateway
from support.waiting import eventually
from tidegate.ai import AIRequest, AIResult
from tidegate.costs import estimate_input_tokens
from tidegate.gateway.responses.compaction import COMPACTION_PROMPT
from tidegate.gateway.responses.dialect import RESPONSES
from tidegate.gateway.responses.schemas import ResponseCreateRequest
from tidegate.gateway.responses.summaries import SUMMARY_PREFIX
from tidegate.jobs import JobState, Priority
from tidegate.simulator.server import InjectedFault

pytestmark = pytest.mark.asyncio(loop_scope="module")

STREAM_EVENT: TypeAdapter[ResponseStreamEvent] = TypeAdapter(ResponseStreamEvent)
ITEM: TypeAdapter[ResponseItem] = TypeAdapter(ResponseItem)
WEATHER: FunctionToolParam = {
    "type": "function", "name": "get_weather", "description": "The weather in a city.", "strict": True,
    "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                    "unit": {"type": "string", "enum": ["c", "f"]}},
                   "required": ["city", "unit"], "additionalProperties": False},
}


@pytest_asyncio.fixture(scope="module", loop_scope="module", params=BACKENDS)
async def gw(request: pytest.FixtureRequest,
             tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Gateway]:
    """One gateway, worker and simulator per backend, shared by the module's tests."""
    async with module_gateway(request, tmp_path_factory) as gateway:
        yield gateway


@pytest_asyncio.fixture(loop_scope="module")
async def acme(gw: Gateway) -> AsyncIterator[AsyncOpenAI]:
    async with gw.openai("acme") as client:
        yield client


async def enqueued(gw: Gateway) -> float:
    """Jobs the gateway has enqueued so far."""
    value = gw.state.metrics.registry.get_sample_value(
        "tidegate_gateway_jobs_enqueued_total", {"kind": "chat", "priority": "normal"})
    return value or 0.0


async def until_finished(client: AsyncOpenAI, response_id: str) -> Response:
    """The response once it is neither queued nor in progress."""
    return await eventually(lambda: client.responses.retrieve(response_id), f"{response_id} is finished",
                            until=lambda response: response.status not in ("queued", "in_progress"))


def job_id(response: Response) -> str:
    assert response.id.startswith("resp_")
    return response.id.removeprefix("resp_")


async def test_a_text_input_is_answered_by_a_job_at_the_callers_priority(
    gw: Gateway, acme: AsyncOpenAI
) -> None:
    raw = await acme.responses.with_raw_response.create(model="gpt-4.1", input="Say hello",
                                                        extra_headers={"X-Priority": "high"})
    response = raw.parse()

    Response.model_validate_json(raw.content)  # every field the SDK's model requires, strictly
    assert response.object == "response" and response.status == "completed"
    assert response.output_text and response.model == "gpt-4.1"
    assert response.output[0].type == "message"
    usage = response.usage
    assert usage is not None and usage.input_tokens > 0 and usage.output_tokens > 0
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    job = await gw.queue.get(job_id(response))
    assert job is not None and job.state is JobState.SUCCEEDED
    assert (job.tenant, job.priority) == ("acme", Priority.HIGH)
    assert raw.headers["X-Tidegate-Job-Id"] == job.id
    assert job.payload["body"]["messages"] == [{"role": "user", "content": "Say hello"}]


async def test_an_idempotency_key_repeats_the_first_response(gw: Gateway, acme: AsyncOpenAI) -> None:
    key = {"Idempotency-Key": f"resp-{uuid.uuid4().hex}"}
    first = await acme.responses.create(model="gpt-4.1", input="Say hello", extra_headers=key)
    calls = gw.sim.stats()["gpt-4.1"].received

    again = await acme.responses.create(model="gpt-4.1", input="Say hello", extra_headers=key)

    assert (again.id, again.output_text) == (first.id, first.output_text)
    assert gw.sim.stats()["gpt-4.1"].received == calls  # the provider was not called again
    with pytest.raises(openai.ConflictError) as reused:
        await acme.responses.create(model="gpt-4.1", input="Something else", extra_headers=key)
    assert reused.value.code == "idempotency_key_reused"


async def test_instructions_items_and_settings_reach_the_upstream_and_are_echoed(
    gw: Gateway, acme: AsyncOpenAI
) -> None:
    items: list[Any] = [
        {"role": "developer", "content": "Answer in English."},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi "},
                                                        {"type": "input_text", "text": "there"}]},
        {"role": "assistant", "content": [{"type": "output_text", "text": "Hello!"}]},
        {"role": "user", "content": "Again"}]
    response = await acme.responses.create(
        model="auto", instructions="Be brief.", max_output_tokens=50, temperature=0.2, top_p=0.9,
        metadata={"ticket": "T-1"}, input=items)

    assert response.status in ("completed", "incomplete")
    assert (response.instructions, response.metadata) == ("Be brief.", {"ticket": "T-1"})
    assert (response.temperature, response.top_p, response.max_output_tokens) == (0.2, 0.9, 50)
    job = await gw.queue.get(job_id(response))
    assert job is not None
    body = job.payload["body"]
    assert body["messages"] == [
        {"role": "system", "content": "Be brief."}, {"role": "system", "content": "Answer in English."},
        {"role": "user", "content": "Hi there"}, {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "Again"}]
    assert (body["max_completion_tokens"], body["temperature"], body["top_p"]) == (50, 0.2, 0.9)
    assert "metadata" not in body and "instructions" not in body


async def test_a_json_schema_format_and_reasoning_effort_become_their_chat_fields(
    gw: Gateway, acme: AsyncOpenAI
) -> None:
    schema = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"],
              "additionalProperties": False}
    response = await acme.responses.create(
        model="gpt-4.1", input="Name a colour.", reasoning={"effort": "low"}, prompt_cache_key="colours",
        text={"format": {"type": "json_schema", "name": "colour", "schema": schema, "strict": True}})

    job = await gw.queue.get(job_id(response))
    assert job is not None
    body = job.payload["body"]
    assert body["response_format"] == {"type": "json_schema", "json_schema": {
        "name": "colour", "schema": schema, "strict": True}}
    assert (body["reasoning_effort"], body["prompt_cache_key"]) == ("low", "colours")
    assert response.text is not None and response.text.format is not None
    assert response.text.format.type == "json_schema"


async def test_a_cut_answer_is_incomplete_with_its_reason(acme: AsyncOpenAI) -> None:
    response = await acme.responses.create(model="gpt-4.1", input="Tell me a long story", max_output_tokens=1)

    assert response.status == "incomplete"
    assert response.incomplete_details is not None
    assert response.incomplete_details.reason == "max_output_tokens"


async def test_a_function_tool_is_called_and_its_output_answered_in_a_continued_response(
    gw: Gateway, acme: AsyncOpenAI
) -> None:
    # Given a tool the model calls
    first = await acme.responses.create(model="gpt-4.1", input="Weather in Paris?", tools=[WEATHER])

    Response.model_validate(first.to_dict())  # strictly, as the SDK's model requires
    [call] = first.output
    assert call.type == "function_call" and call.name == "get_weather"
    assert orjson.loads(call.arguments) == {"city": "tide", "unit": "c"}
    assert call.call_id and not first.output_text
    assert first.tools[0].type == "function" and first.tools[0].name == "get_weather"
    # When its output is sent back, continuing the response
    second = await acme.responses.create(
        model="gpt-4.1", previous_response_id=first.id, tools=[WEATHER],
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "18 degrees, sunny"}])

    # Then the model answers in text, having seen the whole exchange
    assert second.status == "completed" and second.output_text
    assert second.previous_response_id == first.id
    job = await gw.queue.get(job_id(second))
    assert job is not None
    assert job.payload["body"]["messages"] == [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": call.call_id, "type": "function",
             "function": {"name": "get_weather", "arguments": call.arguments}}]},
        {"role": "tool", "tool_call_id": call.call_id, "content": "18 degrees, sunny"}]


async def test_function_call_items_sent_back_statelessly_become_the_chat_tool_turn(
    gw: Gateway, acme: AsyncOpenAI
) -> None:
    call = {"type": "function_call", "name": "get_weather"}
    items: list[Any] = [
        {"role": "user", "content": "Weather in Oslo and Rome?"},
        {**call, "call_id": "call_a", "arguments": '{"city": "Oslo"}'},
        {**call, "call_id": "call_b", "arguments": '{"city": "Rome"}'},
        {"type": "function_call_output", "call_id": "call_a", "output": "2 degrees"},
        {"type": "function_call_output", "call_id": "call_b",
         "output": [{"type": "input_text", "text": "20"}]},
    ]
    response = await acme.responses.create(model="gpt-4.1", tools=[WEATHER], tool_choice="auto", input=items)

    assert response.output_text
    job = await gw.queue.get(job_id(response))
    assert job is not None
    messages = job.payload["body"]["messages"]
    assert [call["id"] for call in messages[1]["tool_calls"]] == ["call_a", "call_b"]
    assert messages[2:] == [{"role": "tool", "tool_call_id": "call_a", "content": "2 degrees"},
                            {"role": "tool", "tool_call_id": "call_b", "content": "20"}]
    assert job.payload["body"]["tool_choice"] == "auto"
    assert job.payload["body"]["tools"][0]["function"]["name"] == "get_weather"


async def test_a_chain_carries_the_earlier_input_and_output_but_not_its_instructions(
    gw: Gateway, acme: AsyncOpenAI
) -> None:
    first = await acme.responses.create(model="gpt-4.1", instructions="Be terse.", input="My name is Ada.")
    second = await acme.responses.create(model="gpt-4.1", instructions="Be kind.", input="What is my name?",
                                         previous_response_id=first.id)

    job = await gw.queue.get(job_id(second))
    assert job is not None
    assert job.payload["body"]["messages"] == [
        {"role": "system", "content": "Be kind."}, {"role": "user", "content": "My name is Ada."},
        {"role": "assistant", "content": first.output_text}, {"role": "user", "content": "What is my name?"}]


async def test_a_stream_has_the_typed_event_sequence_and_the_final_response(acme: AsyncOpenAI) -> None:
    async with acme.responses.stream(model="gpt-4.1", input="Say hello") as stream:
        events = [event async for event in stream]
        final = await stream.get_final_response()

    kinds = [event.type for event in events]
    assert kinds[:5] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added", "response.output_text.delta"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done",
                          "response.output_item.done", "response.completed"]
    assert [event.sequence_number for event in events] == list(range(len(events)))
    deltas = "".join(event.delta for event in events if event.type == "response.output_text.delta")
    assert final.status == "completed" and final.output_text == deltas and deltas
    assert final.usage is not None and final.usage.output_tokens > 0
    assert final.id == events[0].response.id  # type: ignore[union-attr]


async def test_a_streamed_tool_call_has_its_argument_events(acme: AsyncOpenAI) -> None:
    stream = await acme.responses.create(model="gpt-4.1", input="Weather?", tools=[WEATHER], stream=True)
    events = [event async for event in stream]

    for event in events:
        STREAM_EVENT.validate_python(event.to_dict())  # every field the SDK's models require, strictly
    kinds = [event.type for event in events]
    assert "response.function_call_arguments.delta" in kinds
    done = next(event for event in events if event.type == "response.function_call_arguments.done")
    assert orjson.loads(done.arguments) == {"city": "tide", "unit": "c"}
    completed = events[-1]
    assert completed.type == "response.completed"
    [call] = completed.response.output
    assert call.type == "function_call" and call.arguments == done.arguments and call.call_id
    # The job's stored answer keeps the call, for retrieval and for a continued response.
    stored = await until_finished(acme, completed.response.id)
    assert [(item.type, getattr(item, "call_id", None)) for item in stored.output] == [
        ("function_call", call.call_id)]


async def test_a_stream_cut_off_by_the_provider_ends_with_response_failed(
    gw: Gateway, acme: AsyncOpenAI
) -> None:
    gw.sim.inject("gpt-4.1", InjectedFault("reset"))  # strikes half way through the stream
    stream = await acme.responses.create(model="gpt-4.1", input="Say hello", stream=True)
    events = [event async for event in stream]

    for event in events:
        STREAM_EVENT.validate_python(event.to_dict())
    kinds = [event.type for event in events]
    assert "response.output_text.delta" in kinds  # the client had the first half
    failed = events[-1]
    assert failed.type == "response.failed" and failed.response.status == "failed"
    assert failed.response.error is not None and failed.response.error.message
    stored = await until_finished(acme, failed.response.id)
    assert stored.status == "failed" and stored.error is not None


async def test_a_stream_refused_before_its_first_event_is_an_http_error(
    gw: Gateway, acme: AsyncOpenAI
) -> None:
    gw.sim.inject("gpt-4.1", InjectedFault("status", status=422, message="unsupported parameter"))

    with pytest.raises(openai.UnprocessableEntityError, match="unsupported parameter"):
        await acme.responses.create(model="gpt-4.1", input="Say hello", stream=True)


async def test_a_service_tier_goes_upstream_and_the_response_names_the_tier_it_ran_at(
    gw: Gateway, acme: AsyncOpenAI
) -> None:
    flex = await acme.responses.create(model="gpt-4.1", input="Say hello", service_tier="flex")
    auto = await acme.responses.create(model="gpt-4.1", input="Say hello", service_tier="auto")
    async with acme.responses.stream(model="gpt-4.1", input="Say hello", service_tier="priority") as stream:
        events = [event async for event in stream]

    job = await gw.queue.get(job_id(flex))
    assert job is not None and job.payload["body"]["service_tier"] == "flex"
    assert (flex.service_tier, (await acme.responses.retrieve(flex.id)).service_tier) == ("flex", "flex")
    assert auto.service_tier == "default"  # the provider's answer: auto ran at its default tier
    created, completed = events[0], events[-1]
    assert created.type == "response.created" and created.response.service_tier == "priority"
    assert completed.type == "response.completed" and completed.response.service_tier == "priority"


async def test_the_legacy_endpoints_answer_404_naming_what_is_served(acme: AsyncOpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as completions:
        await acme.completions.create(model="gpt-4.1", prompt="Say hello")
    with pytest.raises(openai.NotFoundError) as moderations:
        await acme.moderations.create(input="Say hello")
    with pytest.raises(openai.NotFoundError) as unknown:
        await acme.get("/nowhere", cast_to=object)

    for refused in (completions.value, moderations.value):
        assert refused.code == "unsupported_endpoint"
        assert "/v1/chat/completions" in refused.message and "/v1/responses" in refused.message
    assert unknown.value.code == "unknown_url" and "/v1/responses" in unknown.value.message


async def test_a_background_response_is_queued_then_retrieved(acme: AsyncOpenAI) -> None:
    response = await acme.responses.create(model="gpt-4.1", input="Say hello", background=True)

    assert response.status in ("queued", "in_progress", "completed") and response.background
    response = await until_finished(acme, response.id)
    assert response.status == "completed" and response.output_text


async def test_a_background_response_streams_its_numbered_events_and_stays_retrievable(
    acme: AsyncOpenAI
) -> None:
    stream = await acme.responses.create(model="gpt-4.1", input="Say hello", background=True, stream=True)
    events = [event async for event in stream]

    assert [event.sequence_number for event in events] == list(range(len(events)))
    first, last = events[0], events[-1]
    assert first.type == "response.created" and first.response.background
    assert last.type == "response.completed"
    stored = await acme.responses.retrieve(first.response.id)
    assert (stored.status, stored.output_text) == ("completed", last.response.output_text)


async def test_a_stream_is_resumed_after_an_event_numbered_as_it_was(acme: AsyncOpenAI) -> None:
    stream = await acme.responses.create(model="gpt-4.1", input="Say hello", background=True, stream=True)
    events = [event async for event in stream]
    created = events[0]
    assert created.type == "response.created"
    response_id = created.response.id

    resumed = await acme.responses.retrieve(response_id, stream=True, starting_after=2)
    rest = [event async for event in resumed]
    whole = await acme.responses.retrieve(response_id, stream=True)

    def shown(seen: list[ResponseStreamEvent]) -> list[tuple[str, int, str | None]]:
        return [(event.type, event.sequence_number, getattr(event, "delta", None)) for event in seen]

    # Several deltas: what is replayed is the relayed stream, not the stored answer in one delta.
    assert sum(event.type == "response.output_text.delta" for event in events) > 1
    assert shown(rest) == shown(events[3:])
    assert shown([event async for event in whole]) == shown(events)
    assert rest[-1].type == "response.completed"


async def test_a_response_that_was_not_streamed_streams_from_its_stored_answer(
    gw: Gateway, acme: AsyncOpenAI
) -> None:
    started = await acme.responses.create(model="gpt-4.1", input="Say hello", background=True)
    finished = await until_finished(acme, started.id)

    events = [event async for event in await acme.responses.retrieve(started.id, stream=True)]

    assert [event.sequence_number for event in events] == list(range(len(events)))
    assert events[-1].type == "response.completed"
    assert events[-1].response.output_text == finished.output_text
    async with gw.openai("globex") as globex:
        with pytest.raises(openai.NotFoundError):
            await globex.responses.retrieve(started.id, stream=True)


async def test_a_background_response_is_cancelled_and_only_a_background_one_may_be(
    gw: Gateway, acme: AsyncOpenAI
) -> None:
    gw.sim.configure({"defaults": {"latency_ms": 5000}})
    try:
        started = await acme.responses.create(model="gpt-4.1", input="Say hello", background=True)
        cancelled = await acme.responses.cancel(started.id)
    finally:
        gw.sim.configure({"defaults": {"latency_ms": 0}})

    assert cancelled.status == "cancelled"
    assert (await acme.responses.retrieve(started.id)).status == "cancelled"
    job = await gw.queue.get(job_id(started))
    assert job is not None and job.state is JobState.CANCELLED
    waited = await acme.responses.create(model="gpt-4.1", input="Say hello")
    with pytest.raises(openai.BadRequestError) as refused:
        await acme.responses.cancel(waited.id)
    assert refused.value.code == "not_background"


async def test_a_deleted_response_is_gone(gw: Gateway, acme: AsyncOpenAI) -> None:
    response = await acme.responses.create(model="gpt-4.1", input="Say hello")

    await acme.responses.delete(response.id)

    with pytest.raises(openai.NotFoundError) as missing:
        await acme.responses.retrieve(response.id)
    assert missing.value.code == "response_not_found"
    assert await gw.queue.get(job_id(response)) is None
    with pytest.raises(openai.NotFoundError):
        await acme.responses.delete(response.id)


async def test_a_response_still_running_is_cancelled_when_deleted(gw: Gateway, acme: AsyncOpenAI) -> None:
    gw.sim.configure({"defaults": {"latency_ms": 5000}})
    try:
        started = await acme.responses.create(model="gpt-4.1", input="Say hello", background=True)
        await acme.responses.delete(started.id)
    finally:
        gw.sim.configure({"defaults": {"latency_ms": 0}})

    assert await gw.queue.get(job_id(started)) is None
    with pytest.raises(openai.NotFoundError):
        await acme.responses.retrieve(started.id)


async def test_input_items_are_listed_newest_first_with_paging(acme: AsyncOpenAI) -> None:
    response = await acme.responses.create(model="gpt-4.1", input=[
        {"role": "user", "content": "one"}, {"role": "assistant", "content": "two"},
        {"role": "user", "content": [{"type": "input_text", "text": "three"}]}])

    newest = await acme.responses.input_items.list(response.id)
    for item in newest.data:
        ITEM.validate_python(item.to_dict())  # strictly, as the SDK's models require
    page = await acme.responses.input_items.list(response.id, order="asc", limit=2)

    assert [item.model_dump()["content"][0]["text"] for item in newest.data] == ["three", "two", "one"]
    assert [item.model_dump()["role"] for item in page.data] == ["user", "assistant"]
    assert page.has_more
    rest = await acme.responses.input_items.list(response.id, order="asc", after=page.data[-1].id or "")
    assert [item.id for item in rest.data] == [newest.data[0].id] and not rest.has_more


async def test_another_tenant_sees_no_response_of_acmes(gw: Gateway, acme: AsyncOpenAI) -> None:
    response = await acme.responses.create(model="gpt-4.1", input="Say hello", background=True)

    async with gw.openai("globex") as globex:
        before = await enqueued(gw)
        for attempt in (globex.responses.retrieve(response.id), globex.responses.delete(response.id),
                        globex.responses.cancel(response.id), globex.responses.input_items.list(response.id),
                        globex.responses.create(model="gpt-4.1", input="Go on",
                                                previous_response_id=response.id)):
            with pytest.raises(openai.NotFoundError) as refused:
                await attempt
            assert refused.value.code == "response_not_found"
        assert await enqueued(gw) == before
    assert (await acme.responses.retrieve(response.id)).id == response.id


async def test_a_response_not_stored_cannot_be_retrieved_or_continued(acme: AsyncOpenAI) -> None:
    response = await acme.responses.create(model="gpt-4.1", input="Say hello", store=False)

    assert response.output_text
    with pytest.raises(openai.NotFoundError):
        await acme.responses.retrieve(response.id)
    with pytest.raises(openai.NotFoundError):
        await acme.responses.create(model="gpt-4.1", input="Go on", previous_response_id=response.id)


@pytest.mark.parametrize(("request_body", "code", "param"), [
    ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "unsupported_input_item", "input[0].type"),
    ({"input": "Hi", "tools": [{"type": "web_search"}]}, "unsupported_tool", "tools[0].type"),
    ({"input": "Hi", "tools": [{"type": "function"}]}, "invalid_value", "tools[0].name"),
    ({"input": "Hi", "prompt": {"id": "pmpt_1"}}, "unsupported_parameter", "prompt"),
    ({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "file-unknown"}]}]},
     "file_not_found", "input[0].content[0].file_id"),
    ({"input": [{"role": "user", "content": [{"type": "input_file", "file_url": "https://a.example/f.pdf"}]}]},
     "unsupported_content", "input[0].content[0].file_data"),
    ({"input": [{"role": "assistant", "content": [{"type": "input_file", "file_data": "data:,x"}]}]},
     "unsupported_content", "input[0].content[0].type"),
    ({"input": "Hi", "tool_choice": {"type": "file_search"}}, "unsupported_tool_choice", "tool_choice"),
    ({"input": "Hi", "background": True, "store": False}, "unsupported_parameter", "store"),
    ({"input": "Hi", "previous_response_id": "resp_unknown"}, "response_not_found", "previous_response_id"),
    ({"input": 7}, "invalid_request", "input.str"),  # the first form the union tried
    ({"input": "Hi", "service_tier": "turbo"}, "invalid_request", "service_tier"),
])
async def test_what_cannot_be_translated_is_refused_and_nothing_is_queued(
    gw: Gateway, request_body: dict[str, Any], code: str, param: str
) -> None:
    before = await enqueued(gw)

    answer = await gw.http.post("/v1/responses", json={"model": "gpt-4.1", **request_body},
                                headers=gw.auth("acme"))

    assert answer.status_code == (404 if code.endswith("_not_found") else 400), answer.text
    error = answer.json()["error"]
    assert (error["code"], error["param"]) == (code, param)
    assert await enqueued(gw) == before


def file_input(file_id: str, text: str = "What does this file say?") -> list[Any]:
    """A user message asking about an uploaded file."""
    return [{"role": "user", "content": [{"type": "input_text", "text": text},
                                         {"type": "input_file", "file_id": file_id}]}]


async def test_a_user_data_file_is_read_by_a_response_inlined_in_its_job(
    gw: Gateway, acme: AsyncOpenAI
) -> None:
    uploaded = await acme.files.create(file=("notes.txt", b"The tide turns at noon."), purpose="user_data")

    response = await acme.responses.create(model="gpt-4.1", input=file_input(uploaded.id))
    count = await acme.responses.input_tokens.count(model="gpt-4.1", input=file_input(uploaded.id))
    bare = await acme.responses.input_tokens.count(model="gpt-4.1", input="What does this file say?")

    assert (uploaded.purpose, uploaded.bytes, uploaded.expires_at) == ("user_data", 23, None)
    assert response.status == "completed"
    job = await gw.queue.get(job_id(response))
    assert job is not None
    file_data = "data:text/plain;base64," + base64.b64encode(b"The tide turns at noon.").decode()
    assert job.payload["body"]["messages"] == [{"role": "user", "content": [
        {"type": "text", "text": "What does this file say?"},
        {"type": "file", "file": {"file_data": file_data, "filename": "notes.txt"}}]}]
    assert count.input_tokens > bare.input_tokens
    assert [file.id for file in (await acme.files.list(purpose="user_data")).data] == [uploaded.id]


async def test_a_file_of_another_tenant_or_purpose_is_not_read(gw: Gateway, acme: AsyncOpenAI) -> None:
    private = await acme.files.create(file=("notes.txt", b"acme's own"), purpose="user_data")
    for_batches = await acme.files.create(file=("lines.jsonl", b"{}\n"), purpose="batch")
    before = await enqueued(gw)

    async with gw.openai("globex") as globex:
        with pytest.raises(openai.NotFoundError) as unseen:
            await globex.responses.create(model="gpt-4.1", input=file_input(private.id))
        with pytest.raises(openai.NotFoundError):
            await globex.files.retrieve(private.id)
    with pytest.raises(openai.BadRequestError) as wrong_purpose:
        await acme.responses.create(model="gpt-4.1", input=file_input(for_batches.id))
    with pytest.raises(openai.BadRequestError) as not_a_batch:
        await acme.batches.create(input_file_id=private.id, endpoint="/v1/responses",
                                  completion_window="24h")

    assert (unseen.value.code, unseen.value.param) == ("file_not_found", "input[0].content[1].file_id")
    assert wrong_purpose.value.code == "invalid_file_purpose"
    assert not_a_batch.value.code == "invalid_file_purpose"
    assert await enqueued(gw) == before


async def test_input_tokens_are_counted_as_the_budget_estimates_them_and_nothing_is_queued(
    gw: Gateway, acme: AsyncOpenAI
) -> None:
    before = await enqueued(gw)

    short = await acme.responses.input_tokens.count(model="gpt-4.1", input="Say hello")
    longer = await acme.responses.input_tokens.count(model="gpt-4.1", input="Say hello",
                                                     instructions="Be brief. " * 20, tools=[WEATHER])
    unnamed = await acme.responses.input_tokens.count(input="Say hello")

    request = ResponseCreateRequest(model="gpt-4.1", input="Say hello")
    assert short.object == "response.input_tokens"
    assert short.input_tokens == estimate_input_tokens(RESPONSES.translate(request).body)
    assert longer.input_tokens > short.input_tokens + 40  # 200 characters of instructions, and a tool
    assert unnamed.input_tokens == short.input_tokens  # the model left out is "auto"
    assert await enqueued(gw) == before


async def test_input_tokens_of_a_continued_response_count_its_conversation(acme: AsyncOpenAI) -> None:
    first = await acme.responses.create(model="gpt-4.1", input="Say hello " * 10)

    alone = await acme.responses.input_tokens.count(model="gpt-4.1", input="Go on")
    continued = await acme.responses.input_tokens.count(model="gpt-4.1", input="Go on",
                                                        previous_response_id=first.id)

    assert continued.input_tokens > alone.input_tokens + 25  # the first input and its answer


@pytest.mark.parametrize(("tenant", "request_body", "status", "code", "param"), [
    ("acme", {"input": "Hi", "stream": True}, 400, "invalid_request", "stream"),
    ("acme", {"input": "Hi", "tools": [{"type": "web_search"}]}, 400, "unsupported_tool", "tools[0].type"),
    ("acme", {"instructions": None}, 400, "empty_input", "input"),
    ("acme", {"input": "Hi", "model": "no-such-model"}, 404, "model_not_found", "model"),
    ("acme", {"input": "Hi", "previous_response_id": "resp_unknown"}, 404, "response_not_found",
     "previous_response_id"),
    ("narrow", {"input": "Hi", "model": "gpt-4.1"}, 403, "model_not_allowed", "model"),
])
async def test_input_tokens_of_a_bad_request_are_refused_as_a_response_would_be(
    gw: Gateway, tenant: str, request_body: dict[str, Any], status: int, code: str, param: str
) -> None:
    assert await refusal(gw, "/v1/responses/input_tokens", request_body, tenant) == (status, code, param)


async def refusal(gw: Gateway, path: str, body: dict[str, Any], tenant: str) -> tuple[int, str, str]:
    """The status of an error answer to `body` posted to `path`, and its OpenAI-shaped error's code
    and param."""
    answer = await gw.http.post(path, json=body, headers=gw.auth(tenant))
    assert answer.status_code >= 400, answer.text
    error = answer.json()["error"]
    return answer.status_code, error["code"], error["param"]


def texts(items: list[Any]) -> list[str]:
    """The text of each message item's content parts, joined."""
    return ["".join(part.text for part in item.content) for item in items]


async def test_a_conversation_is_compacted_into_its_user_messages_and_the_models_summary(
    gw: Gateway, acme: AsyncOpenAI
) -> None:
    # Given a stored response, whose conversation goes on with one more user message
    first = await acme.responses.create(model="gpt-4.1", input="Say hello")

    # When it is compacted at high priority
    raw = await acme.responses.with_raw_response.compact(
        model="gpt-4.1", previous_response_id=first.id, instructions="Keep names.",
        input=[{"role": "user", "content": "And the weather?"}], extra_headers={"X-Priority": "high"})
    compacted = raw.parse()

    # Then a job of acme's at that priority asked the model for a summary of the whole conversation
    job = await gw.queue.get(raw.headers["X-Tidegate-Job-Id"])
    assert job is not None and job.state is JobState.SUCCEEDED
    assert (job.tenant, job.priority) == ("acme", Priority.HIGH)
    assert "origin" not in job.payload  # a chat completion, not a response
    assert job.payload["body"]["messages"] == [
        {"role": "system", "content": "Keep names."}, {"role": "user", "content": "Say hello"},
        {"role": "assistant", "content": first.output_text},
        {"role": "user", "content": "And the weather?"}, {"role": "user", "content": COMPACTION_PROMPT}]
    # and the answer is the user messages, then tidegate's compaction item holding that summary
    result = AIResult.from_json(job.result)
    assert result is not None and result.response is not None
    summary = result.response["choices"][0]["message"]["content"]
    # Strictly as the SDK's models, but the user messages: its output types name none (OpenAI's docs do)
    document = orjson.loads(raw.content)
    CompactedResponse.model_validate({**document, "output": document["output"][-1:]})
    assert (compacted.id, compacted.object) == (f"resp_{job.id}", "response.compaction")
    assert [item.type for item in compacted.output] == ["message", "message", "compaction"]
    assert texts(compacted.output[:2]) == ["Say hello", "And the weather?"]
    item = compacted.output[2]
    assert isinstance(item, ResponseCompactionItem)
    assert item.encrypted_content == SUMMARY_PREFIX + summary
    assert compacted.usage.input_tokens > 0 and compacted.usage.output_tokens > 0
    with pytest.raises(openai.NotFoundError):  # a compaction is not a response
        await acme.responses.retrieve(compacted.id)


async def test_a_compacted_conversation_goes_on_in_the_next_response_with_its_summary_read(
    gw: Gateway, acme: AsyncOpenAI
) -> None:
    raw = await acme.responses.with_raw_response.compact(model="gpt-4.1", input="Plan a trip to Oslo.")
    # The output as it came (its user messages have input_text parts, which the SDK's output types
    # do not name: dumping them warns), then a new turn
    output = orjson.loads(raw.content)["output"]
    summary = output[-1]["encrypted_content"].removeprefix(SUMMARY_PREFIX)
    next_input = [*output, {"role": "user", "content": "Go on"}]

    follow_up = await acme.responses.create(model="gpt-4.1", input=next_input)
    count = await acme.responses.input_tokens.count(model="gpt-4.1", input=next_input)

    assert follow_up.status == "completed" and follow_up.output_text
    job = await gw.queue.get(job_id(follow_up))
    assert job is not None
    assert job.payload["body"]["messages"] == [
        {"role": "user", "content": "Plan a trip to Oslo."},
        {"role": "system", "content": "Summary of the earlier conversation, written when it was "
                                      f"compacted:\n\n{summary}"},
        {"role": "user", "content": "Go on"}]
    assert count.input_tokens == estimate_input_tokens(AIRequest.from_payload(job.payload).body)
    listed = await acme.responses.input_items.list(follow_up.id, order="asc")
    assert [(item.type, item.model_dump()["role"]) for item in listed.data] == [
        ("message", "user"), ("message", "developer"), ("message", "user")]


async def test_another_tenants_response_cannot_be_compacted_and_nothing_is_queued(
    gw: Gateway, acme: AsyncOpenAI
) -> None:
    response = await acme.responses.create(model="gpt-4.1", input="Say hello")

    async with gw.openai("globex") as globex:
        before = await enqueued(gw)
        with pytest.raises(openai.NotFoundError) as refused:
            await globex.responses.compact(model="gpt-4.1", previous_response_id=response.id)
        assert await enqueued(gw) == before
    assert (refused.value.code, refused.value.param) == ("response_not_found", "previous_response_id")


@pytest.mark.parametrize(("tenant", "request_body", "status", "code", "param"), [
    ("acme", {"model": "gpt-4.1"}, 400, "empty_input", "input"),
    ("acme", {"model": "gpt-4.1", "input": []}, 400, "empty_input", "input"),
    ("acme", {"input": "Hi"}, 400, "invalid_request", "model"),
    ("acme", {"model": "gpt-4.1", "input": 7}, 400, "invalid_request", "input.str"),
    ("acme", {"model": "gpt-4.1", "input": "Hi", "stream": True}, 400, "unsupported_parameter", "stream"),
    ("acme", {"model": "gpt-4.1", "input": "Hi", "service_tier": "turbo"}, 400, "invalid_request",
     "service_tier"),
    ("acme", {"model": "gpt-4.1", "input": [{"role": "wizard", "content": "Hi"}]}, 400, "invalid_value",
     "input[0].role"),
    ("acme", {"model": "gpt-4.1", "input": [{"type": "compaction", "encrypted_content": "gAAAA"}]}, 400,
     "unsupported_input_item", "input[0].type"),
    ("acme", {"model": "no-such-model", "input": "Hi"}, 404, "model_not_found", "model"),
    ("acme", {"model": "gpt-4.1", "previous_response_id": "resp_unknown"}, 404, "response_not_found",
     "previous_response_id"),
    ("narrow", {"model": "gpt-4.1", "input": "Hi"}, 403, "model_not_allowed", "model"),
])
async def test_a_bad_compaction_is_refused_in_openais_shape_and_nothing_is_queued(
    gw: Gateway, tenant: str, request_body: dict[str, Any], status: int, code: str, param: str
) -> None:
    before = await enqueued(gw)

    assert await refusal(gw, "/v1/responses/compact", request_body, tenant) == (status, code, param)
    assert await enqueued(gw) == before


async def test_an_agent_of_the_openai_agents_sdk_runs_a_function_tool_through_the_queue(
    gw: Gateway, acme: AsyncOpenAI
) -> None:
    if not gw.state.config.queue_url.startswith("sqlite"):
        pytest.skip("the Agents SDK meets the queue only through the routes, tested on every backend")
    import agents  # here: the SDK takes seconds to import, which the module's other tests need not wait

    # Its default model speaks the Responses API; its traces would go to OpenAI: they are off.
    agents.set_tracing_disabled(True)
    asked: list[str] = []

    @agents.function_tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        asked.append(city)
        return f"18 degrees and sunny in {city}"

    agent = agents.Agent(name="forecaster", instructions="Answer with the weather.", tools=[get_weather],
                         model=agents.OpenAIResponsesModel(model="gpt-4.1", openai_client=acme))
    before = await enqueued(gw)

    result = await agents.Runner.run(agent, "What is the weather in Paris?")

    assert asked == ["tide"]  # the simulated model's argument for a string
    assert isinstance(result.final_output, str) and result.final_output
    assert [item.type for item in result.new_items] == ["tool_call_item", "tool_call_output_item",
                                                        "message_output_item"]
    assert await enqueued(gw) == before + 2  # one job per model turn


async def test_a_stored_answer_streams_as_the_same_typed_events() -> None:
    # A worker without a relay stores the whole answer; the gateway streams it as parts.
    request = RESPONSES.translate(ResponseCreateRequest(model="auto", input="Weather?", stream=True))
    call = RESPONSES.call("job1", request, created_at=1_700_000_000)
    completion = {"object": "chat.completion", "model": "gpt-4.1", "choices": [{
        "index": 0, "finish_reason": "tool_calls", "message": {
            "role": "assistant", "content": "Let me look.",
            "tool_calls": [{"id": "call_1", "type": "function",
                            "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]}}],
        "usage": {"prompt_tokens": 9, "completion_tokens": 4, "total_tokens": 13}, "service_tier": "flex"}
    renderer = call.stream(request)

    parts = renderer.whole_answer(AIResult(completion, model="gpt-4.1"), "job1")
    frames = [renderer.frame(part) for part in parts]
    body = b"".join(frame for frame in frames if frame is not None) + renderer.end_frame()

    events = [STREAM_EVENT.validate_python(orjson.loads(line.removeprefix(b"data: ")))
              for line in body.split(b"\n") if line.startswith(b"data: ")]
    final = events[-1]
    assert final.type == "response.completed"
    assert final.response.id == "resp_job1" and final.response.output_text == "Let me look."
    assert [item.type for item in final.response.output] == ["message", "function_call"]
    assert final.response.usage is not None and final.response.usage.total_tokens == 13
    assert final.response.service_tier == "flex"
    assert [event.sequence_number for event in events] == list(range(len(events)))
