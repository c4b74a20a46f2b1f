"""The simulated provider's Anthropic Messages endpoint, spoken to with the official Anthropic SDK:
Messages and their streams, tool calls, stop sequences, and its limits and faults in Anthropic's
error shape."""

from __future__ import annotations

from collections.abc import AsyncIterator

import anthropic
import pytest
from anthropic.types import Message, MessageParam, ThinkingBlock, ThinkingConfigEnabledParam, ToolParam

from tidegate.simulator import Simulator, SimulatorSettings
from tidegate.simulator.server import InjectedFault

MODEL = "claude-sonnet-4.5"
HELLO: list[MessageParam] = [{"role": "user", "content": "Name a colour."}]
LOOKUP: ToolParam = {"name": "lookup", "input_schema": {
    "type": "object", "properties": {"term": {"type": "string"}, "limit": {"type": "integer"}},
    "required": ["term"]}}


@pytest.fixture
def simulator() -> Simulator:
    return Simulator(SimulatorSettings(seed=5, require_api_key="sk-sim-1"))


@pytest.fixture
async def sdk(simulator: Simulator) -> AsyncIterator[anthropic.AsyncAnthropic]:
    async with (simulator.running() as url,
                anthropic.AsyncAnthropic(base_url=url.removesuffix("/v1"), api_key="sk-sim-1",
                                         max_retries=0) as client):
        yield client


async def test_a_message_has_text_usage_and_a_stop_reason(sdk: anthropic.AsyncAnthropic) -> None:
    message = await sdk.messages.create(model=MODEL, max_tokens=50, system="Be brief.", messages=HELLO)

    assert message.id.startswith("msg_") and message.model == MODEL
    [block] = message.content
    assert block.type == "text" and block.text
    assert message.stop_reason in ("end_turn", "max_tokens")
    assert message.usage.input_tokens > 0 and message.usage.output_tokens == len(block.text.split(" "))


async def test_a_stop_sequence_ends_the_message(sdk: anthropic.AsyncAnthropic) -> None:
    message = await sdk.messages.create(model=MODEL, max_tokens=200, messages=HELLO, stop_sequences=["e"])

    assert (message.stop_reason, message.stop_sequence) == ("stop_sequence", "e")
    assert all("e" not in block.text for block in message.content if block.type == "text")


async def test_a_stream_is_anthropics_event_sequence(sdk: anthropic.AsyncAnthropic) -> None:
    async with sdk.messages.stream(model=MODEL, max_tokens=20, messages=HELLO) as stream:
        kinds = [event.type async for event in stream]
        final = await stream.get_final_message()

    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert kinds.count("content_block_start") == kinds.count("content_block_stop") == 1
    assert final.content[0].type == "text" and final.content[0].text
    assert final.usage.input_tokens > 0 and final.usage.output_tokens > 0


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_tools_lead_to_a_tool_use_and_a_result_to_text(
    sdk: anthropic.AsyncAnthropic, stream: bool,
) -> None:
    called: Message
    if stream:
        async with sdk.messages.stream(model=MODEL, max_tokens=50, messages=HELLO, tools=[LOOKUP]) as events:
            called = await events.get_final_message()
    else:
        called = await sdk.messages.create(model=MODEL, max_tokens=50, messages=HELLO, tools=[LOOKUP])
    assert called.stop_reason == "tool_use"
    [use] = called.content
    assert use.type == "tool_use" and (use.name, use.input) == ("lookup", {"term": "tide"})

    answered = await sdk.messages.create(model=MODEL, max_tokens=50, tools=[LOOKUP], messages=[
        *HELLO, {"role": "assistant", "content": called.content},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "teal"}]}])
    assert answered.stop_reason != "tool_use" and answered.content[0].type == "text"


async def test_refusals_are_anthropic_shaped(simulator: Simulator, sdk: anthropic.AsyncAnthropic) -> None:
    with pytest.raises(anthropic.BadRequestError) as missing:
        # The SDK's own check would refuse it first: its plain POST sends it as it is.
        await sdk.post("/v1/messages", cast_to=Message, body={"model": MODEL, "messages": HELLO})
    assert missing.value.body == {"type": "error", "error": {"type": "invalid_request_error",
                                                             "message": "max_tokens: Field required"}}

    with pytest.raises(anthropic.NotFoundError):
        await sdk.messages.create(model="claude-none", max_tokens=5, messages=HELLO)

    async with anthropic.AsyncAnthropic(base_url=sdk.base_url, api_key="wrong", max_retries=0) as stranger:
        with pytest.raises(anthropic.AuthenticationError):
            await stranger.messages.create(model=MODEL, max_tokens=5, messages=HELLO)

    simulator.inject(MODEL, InjectedFault("unavailable"))
    with pytest.raises(anthropic.InternalServerError) as unavailable:
        await sdk.messages.create(model=MODEL, max_tokens=5, messages=HELLO)
    assert isinstance(unavailable.value.body, dict)
    assert unavailable.value.body["error"]["type"] == "overloaded_error"

    simulator.configure({"models": {MODEL: {"rpm": 1}}})
    await sdk.messages.create(model=MODEL, max_tokens=5, messages=HELLO)
    with pytest.raises(anthropic.RateLimitError) as limited:
        await sdk.messages.create(model=MODEL, max_tokens=5, messages=HELLO)
    assert int(limited.value.response.headers["retry-after"]) >= 1


async def test_a_fault_half_way_through_a_stream_cuts_it(simulator: Simulator,
                                                         sdk: anthropic.AsyncAnthropic) -> None:
    simulator.configure({"defaults": {"completion_tokens": 10, "completion_tokens_p99": 11}})
    simulator.inject(MODEL, InjectedFault("malformed"))
    received: list[str] = []
    with pytest.raises(ValueError):  # the SDK cannot read the torn event
        async with sdk.messages.stream(model=MODEL, max_tokens=50, messages=HELLO) as stream:
            async for text in stream.text_stream:
                received.append(text)

    assert received  # the first half came before the torn event
    assert simulator.stats()[MODEL].faults["malformed"] == 1


async def test_the_key_is_read_from_x_api_key_or_a_bearer_token(sdk: anthropic.AsyncAnthropic) -> None:
    async with (anthropic.AsyncAnthropic(base_url=sdk.base_url, auth_token="sk-sim-1",
                                         max_retries=0) as bearer,
                anthropic.AsyncAnthropic(base_url=sdk.base_url, api_key=None, max_retries=0,
                                         default_headers={"x-api-key": "sk-sim-1"}) as by_header):
        for client in (bearer, by_header):
            assert (await client.messages.create(model=MODEL, max_tokens=5, messages=HELLO)).content


async def test_a_service_tier_is_anthropics_and_the_usage_names_the_tier_served(
    sdk: anthropic.AsyncAnthropic,
) -> None:
    message = await sdk.messages.create(model=MODEL, max_tokens=8, messages=HELLO,
                                        service_tier="standard_only")
    async with sdk.messages.stream(model=MODEL, max_tokens=8, messages=HELLO,
                                   service_tier="auto") as stream:
        streamed = await stream.get_final_message()
    with pytest.raises(anthropic.BadRequestError) as refused:
        await sdk.messages.create(model=MODEL, max_tokens=8, messages=HELLO,
                                  extra_body={"service_tier": "flex"})

    assert message.usage.service_tier == streamed.usage.service_tier == "standard"
    assert "service_tier" in refused.value.message


async def test_thinking_opens_the_answer_with_a_signed_thinking_block(sdk: anthropic.AsyncAnthropic) -> None:
    thinking: ThinkingConfigEnabledParam = {"type": "enabled", "budget_tokens": 1024}
    message = await sdk.messages.create(model=MODEL, max_tokens=2048, messages=HELLO, thinking=thinking,
                                        extra_body={"top_k": 5})
    async with sdk.messages.stream(model=MODEL, max_tokens=2048, messages=HELLO, thinking=thinking) as stream:
        kinds = [event.type async for event in stream]
        final = await stream.get_final_message()

    for answer in (message, final):
        assert [block.type for block in answer.content] == ["thinking", "text"]
        first = answer.content[0]
        assert isinstance(first, ThinkingBlock) and first.thinking and first.signature
    assert kinds.count("content_block_start") == kinds.count("content_block_stop") == 2
    assert "thinking" in kinds and "signature" in kinds


async def test_a_thinking_budget_or_top_k_out_of_range_is_refused(sdk: anthropic.AsyncAnthropic) -> None:
    for extra in ({"thinking": {"type": "enabled", "budget_tokens": 100}},
                  {"thinking": {"type": "enabled", "budget_tokens": 4096}},  # not below max_tokens
                  {"top_k": -1}):
        with pytest.raises(anthropic.BadRequestError) as refused:
            await sdk.messages.create(model=MODEL, max_tokens=2048, messages=HELLO, extra_body=extra)
        assert refused.value.response.json()["error"]["type"] == "invalid_request_error"
