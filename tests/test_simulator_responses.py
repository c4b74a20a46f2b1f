"""The simulated provider's Responses endpoint, spoken to with the official OpenAI SDK: a
Response and its typed events parse strictly as the SDK's own models; function tools are called,
built-in tools accepted, reasoning given its item; limits and refusals are OpenAI-shaped. A
compaction (`/v1/responses/compact`) is answered as OpenAI answers it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import openai
import orjson
import pytest
from openai import AsyncOpenAI
from openai.types.responses import CompactedResponse, FunctionToolParam, Response, ResponseStreamEvent
from pydantic import TypeAdapter

from tidegate.simulator import Simulator, SimulatorSettings

MODEL = "gpt-4.1"
STREAM_EVENT: TypeAdapter[ResponseStreamEvent] = TypeAdapter(ResponseStreamEvent)
LOOKUP: FunctionToolParam = {"type": "function", "name": "lookup", "strict": True, "parameters": {
    "type": "object", "properties": {"term": {"type": "string"}}, "required": ["term"],
    "additionalProperties": False}}


@pytest.fixture
def simulator() -> Simulator:
    return Simulator(SimulatorSettings(seed=5, require_api_key="sk-sim-1"))


@pytest.fixture
async def sdk(simulator: Simulator) -> AsyncIterator[AsyncOpenAI]:
    async with (simulator.running() as url,
                AsyncOpenAI(base_url=url, api_key="sk-sim-1", max_retries=0) as client):
        yield client


async def test_a_response_has_reasoning_text_and_usage(simulator: Simulator, sdk: AsyncOpenAI) -> None:
    raw = await sdk.responses.with_raw_response.create(
        model=MODEL, input="Name a colour.", instructions="Be brief.", tools=[{"type": "web_search_preview"}],
        reasoning={"effort": "low", "summary": "auto"}, max_output_tokens=500)
    response = raw.parse()

    Response.model_validate_json(raw.content)
    assert response.id.startswith("resp_") and response.status == "completed" and response.model == MODEL
    reasoning, message = response.output
    assert reasoning.type == "reasoning" and reasoning.summary[0].text
    assert message.type == "message" and response.output_text
    assert response.usage is not None and response.usage.output_tokens_details.reasoning_tokens > 0
    assert response.instructions == "Be brief." and response.tools[0].type == "web_search_preview"
    assert simulator.received("/v1/responses")[-1]["reasoning"] == {"effort": "low", "summary": "auto"}


async def test_a_stream_is_the_typed_event_sequence(sdk: AsyncOpenAI) -> None:
    stream = await sdk.responses.create(model=MODEL, input="Name a colour.", stream=True)
    events = [event async for event in stream]

    for event in events:
        STREAM_EVENT.validate_python(event.model_dump(exclude_unset=True))
    kinds = [event.type for event in events]
    assert kinds[:3] == ["response.created", "response.in_progress", "response.output_item.added"]
    assert kinds[-1] == "response.completed"
    assert [event.sequence_number for event in events] == list(range(len(events)))
    text = "".join(event.delta for event in events if event.type == "response.output_text.delta")
    assert text and events[-1].response.output_text == text  # type: ignore[union-attr]


@pytest.mark.parametrize("streamed", [False, True], ids=["whole", "streamed"])
async def test_a_function_tool_is_called(sdk: AsyncOpenAI, streamed: bool) -> None:
    response: Response
    if streamed:
        async with sdk.responses.stream(model=MODEL, input="Look up tides.", tools=[LOOKUP]) as stream:
            response = await stream.get_final_response()
    else:
        response = await sdk.responses.create(model=MODEL, input="Look up tides.", tools=[LOOKUP])

    [call] = response.output
    assert call.type == "function_call" and call.name == "lookup" and call.arguments == '{"term":"tide"}'


async def test_a_cut_answer_is_incomplete(sdk: AsyncOpenAI) -> None:
    response = await sdk.responses.create(model=MODEL, input="Name a colour.", max_output_tokens=16)

    assert response.status == "incomplete" and response.incomplete_details is not None
    assert response.incomplete_details.reason == "max_output_tokens"


async def test_bad_requests_are_refused_in_openais_shape(sdk: AsyncOpenAI) -> None:
    bad: list[dict[str, Any]] = [{"input": []}, {"input": [{"type": "bogus"}]},
                                 {"input": "Hi", "stream": "yes"}, {"input": "Hi", "service_tier": "gold"}]
    for body in bad:
        with pytest.raises(openai.BadRequestError) as refused:
            await sdk.post("/responses", cast_to=Response, body={"model": MODEL, **body})
        error = refused.value.body
        assert isinstance(error, dict) and error["code"] and error["message"]


async def test_a_compaction_is_the_user_messages_then_an_opaque_item_read_back_as_input(
    simulator: Simulator, sdk: AsyncOpenAI,
) -> None:
    raw = await sdk.responses.with_raw_response.compact(
        model=MODEL, instructions="Keep names.",
        input=[{"role": "user", "content": "Plan a trip."}, {"role": "assistant", "content": "To Oslo?"},
               {"role": "user", "content": [{"type": "input_text", "text": "Yes."}]}])
    compacted = raw.parse()

    # Strictly as the SDK's models, but the user messages: its output types name none (OpenAI's docs do)
    document = orjson.loads(raw.content)
    CompactedResponse.model_validate({**document, "output": document["output"][-1:]})
    assert compacted.object == "response.compaction" and compacted.id.startswith("resp_")
    output = orjson.loads(raw.content)["output"]
    assert [(item["type"], item.get("role")) for item in output] == [
        ("message", "user"), ("message", "user"), ("compaction", None)]
    assert [item["content"][0]["text"] for item in output[:2]] == ["Plan a trip.", "Yes."]
    assert output[-1]["encrypted_content"] and compacted.usage.output_tokens > 0
    # The output goes on as the next response's input
    response = await sdk.responses.create(model=MODEL, input=[*output, {"role": "user", "content": "Go on"}])
    assert response.status == "completed"
    assert simulator.received("/v1/responses/compact")[-1]["instructions"] == "Keep names."
    with pytest.raises(openai.NotFoundError) as unknown:  # it stores no response
        await sdk.responses.compact(model=MODEL, previous_response_id="resp_1")
    assert unknown.value.code == "previous_response_not_found"
