"""The official Anthropic SDK, unchanged, against a real gateway over HTTP (/v1/messages), with a
worker and the simulated OpenAI-compatible provider behind it: each call goes through the queue.

One gateway serves the whole module (SQLite queue), on an event loop of its own (an anyio
blocking portal), so the tests use the SDK's synchronous client."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
from anthropic.types import Message, MessageParam, ToolParam
from anyio.from_thread import BlockingPortal, start_blocking_portal

from conftest import QueueFactory
from support.dispatch import PROVIDER
from support.gateway import Gateway, open_gateway
from tidegate.contract import ChatMessage, ChatRequest, decode
from tidegate.gateway.anthropic.dialect import message_of
from tidegate.jobs import JobState, Priority
from tidegate.providers.adapters.anthropic import chat_completion, messages_body
from tidegate.simulator.server import InjectedFault

HELLO: list[MessageParam] = [{"role": "user", "content": "Say hello"}]
WEATHER: ToolParam = {
    "name": "get_weather", "description": "The weather in a city.",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"},
                                                      "unit": {"type": "string", "enum": ["c", "f"]}},
                     "required": ["city", "unit"]},
}


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Gateway, BlockingPortal]]:
    """A gateway with a worker and the simulator on a SQLite queue, and the portal running it."""
    factory = QueueFactory("sqlite", f"sqlite:///{tmp_path_factory.mktemp('anthropic') / 'queue.db'}")
    with start_blocking_portal() as portal:
        try:
            with portal.wrap_async_context_manager(open_gateway(factory)) as gw:
                yield gw, portal
        finally:
            portal.call(factory.aclose)


@pytest.fixture
def gw(served: tuple[Gateway, BlockingPortal]) -> Gateway:
    return served[0]


def client(gw: Gateway, tenant: str = "acme") -> anthropic.Anthropic:
    """The SDK pointed at the gateway, its key sent as x-api-key (recent SDKs send an `api_key` as
    a Bearer token); no retries, so a test sees each answer as it is."""
    return anthropic.Anthropic(base_url=gw.url, api_key=None, default_headers={"x-api-key": gw.keys[tenant]},
                               max_retries=0)


@pytest.fixture
def sdk(gw: Gateway) -> Iterator[anthropic.Anthropic]:
    """acme's client, closed afterwards."""
    with client(gw) as opened:
        yield opened


def job_of(served: tuple[Gateway, BlockingPortal], job_id: str) -> Any:
    gw, portal = served
    return portal.call(gw.queue.get, job_id)


def test_a_message_is_queued_at_the_priority_asked_and_answered_as_a_message(
    served: tuple[Gateway, BlockingPortal], gw: Gateway, sdk: anthropic.Anthropic,
) -> None:
    raw = sdk.messages.with_raw_response.create(
        model="auto", max_tokens=64, system="Answer briefly.", messages=HELLO,
        extra_headers={"X-Priority": "high"}, metadata={"user_id": "u-1"})
    message = raw.parse()

    assert message.id.startswith("msg_") and message.type == "message" and message.role == "assistant"
    [block] = message.content
    assert block.type == "text" and block.text
    assert message.stop_reason in ("end_turn", "max_tokens")
    assert message.usage.input_tokens > 0 and message.usage.output_tokens > 0
    assert message.model == raw.headers["X-Tidegate-Model"] == "gpt-4.1"  # the high tier
    job = job_of(served, raw.headers["X-Tidegate-Job-Id"])
    assert job is not None and job.state is JobState.SUCCEEDED
    assert (job.tenant, job.priority) == ("acme", Priority.HIGH)
    body = job.payload["body"]
    assert body["messages"][0] == {"role": "system", "content": "Answer briefly."}
    assert (body["max_tokens"], body["user"]) == (64, "u-1")
    assert job.result["usage"]["prompt_tokens"] == message.usage.input_tokens


def test_anthropics_service_tier_is_mapped_to_the_jobs_and_the_tier_used_is_reported(
    served: tuple[Gateway, BlockingPortal], sdk: anthropic.Anthropic,
) -> None:
    standard = sdk.messages.with_raw_response.create(model="auto", max_tokens=16, messages=HELLO,
                                                     service_tier="standard_only")
    auto = sdk.messages.with_raw_response.create(model="auto", max_tokens=16, messages=HELLO,
                                                 service_tier="auto")
    with sdk.messages.stream(model="auto", max_tokens=16, messages=HELLO,
                             service_tier="standard_only") as stream:
        streamed = stream.get_final_message()

    asked = job_of(served, standard.headers["X-Tidegate-Job-Id"]).payload["body"]
    assert asked["service_tier"] == "default"  # standard_only is the provider's default tier
    assert "service_tier" not in job_of(served, auto.headers["X-Tidegate-Job-Id"]).payload["body"]
    assert standard.parse().usage.service_tier == streamed.usage.service_tier == "standard"
    assert auto.parse().usage.service_tier == "standard"  # no tier policy: the provider's default


def test_the_tier_a_job_ran_at_is_named_in_anthropics_words() -> None:
    completion = {"id": "chatcmpl-1", "model": "m", "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "Hi"}, "finish_reason": "stop"}]}
    tiers = [message_of({**completion, "service_tier": tier})["usage"]["service_tier"]
             for tier in ("priority", "flex", "default", "auto", None)]

    assert tiers == ["priority", "batch", "standard", "standard", "standard"]


def test_a_stop_sequence_met_is_named(sdk: anthropic.Anthropic) -> None:
    message = sdk.messages.create(model="deepseek-v3.2", max_tokens=200, messages=HELLO,
                                         stop_sequences=["e"])

    assert (message.stop_reason, message.stop_sequence) == ("stop_sequence", "e")
    assert all("e" not in block.text for block in message.content if block.type == "text")


def test_a_stream_gives_text_deltas_and_a_final_message_with_usage(sdk: anthropic.Anthropic) -> None:
    with sdk.messages.stream(model="auto", max_tokens=32, messages=HELLO) as stream:
        deltas = list(stream.text_stream)
        final = stream.get_final_message()

    assert len(deltas) > 1
    [block] = final.content
    assert block.type == "text" and block.text == "".join(deltas)
    assert final.id.startswith("msg_") and final.stop_reason in ("end_turn", "max_tokens")
    assert final.usage.input_tokens > 0 and final.usage.output_tokens > 0


def test_a_stream_cut_off_by_the_provider_ends_with_an_error_event(
    served: tuple[Gateway, BlockingPortal], gw: Gateway, sdk: anthropic.Anthropic,
) -> None:
    # Given a provider that resets the connection half way through its stream
    served[1].call(gw.sim.inject, "claude-sonnet-4.5", InjectedFault("reset"))
    received: list[str] = []
    with (pytest.raises(anthropic.APIStatusError) as failed,
          sdk.messages.stream(model="claude-sonnet-4.5", max_tokens=32, messages=HELLO) as stream):
        received.extend(stream.text_stream)

    assert received  # the client had the first half when the error came
    body = failed.value.body  # the error event's data
    assert isinstance(body, dict) and body["type"] == "error"
    assert (body["error"]["type"], body["error"]["code"]) == ("api_error", "stream_failed")
    assert body["error"]["message"]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_tool_round_trip(sdk: anthropic.Anthropic, stream: bool) -> None:
    # Given a question the model answers with a tool call
    asked: list[MessageParam] = [{"role": "user", "content": "Weather in Paris?"}]
    first: Message
    if stream:
        with sdk.messages.stream(model="auto", max_tokens=64, messages=asked, tools=[WEATHER]) as events:
            first = events.get_final_message()
    else:
        first = sdk.messages.create(model="auto", max_tokens=64, messages=asked, tools=[WEATHER],
                                    tool_choice={"type": "any"})
    assert first.stop_reason == "tool_use"
    [call] = first.content
    assert call.type == "tool_use" and call.name == "get_weather"
    assert call.input == {"city": "tide", "unit": "c"}

    # When the tool's result is sent back
    answered = sdk.messages.create(model="auto", max_tokens=64, tools=[WEATHER], messages=[
        *asked, {"role": "assistant", "content": first.content},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "18 C"}]},
    ])

    # Then the model answers in text
    assert answered.stop_reason in ("end_turn", "max_tokens")
    assert answered.content[0].type == "text" and answered.content[0].text


def test_count_tokens_estimates_as_tidegate_does(sdk: anthropic.Anthropic) -> None:
    short = sdk.messages.count_tokens(model="auto", messages=HELLO)
    longer = sdk.messages.count_tokens(model="gpt-4.1", messages=HELLO, system="Be brief. " * 20,
                                       tools=[WEATHER])

    # "Say hello" (3) + 4 for the message + 3 to prime the reply (tidegate.costs)
    assert short.input_tokens == 10
    assert longer.input_tokens > short.input_tokens + 40


def test_both_key_headers_are_accepted(gw: Gateway) -> None:
    with (anthropic.Anthropic(base_url=gw.url, auth_token=gw.keys["globex"], max_retries=0) as by_bearer,
          client(gw, "globex") as by_api_key):
        for sdk in (by_bearer, by_api_key):
            raw = sdk.messages.with_raw_response.create(model="auto", max_tokens=8, messages=HELLO)
            assert raw.parse().content
            assert raw.headers["X-Tidegate-Priority"] == "normal"  # globex's default


def _refused(error: anthropic.APIStatusError, kind: str, code: str) -> None:
    body = error.response.json()
    assert body["type"] == "error"
    assert (body["error"]["type"], body["error"]["code"]) == (kind, code)
    assert body["error"]["message"]


def test_errors_come_as_the_sdks_exception_types_in_anthropics_shape(
    gw: Gateway, sdk: anthropic.Anthropic,
) -> None:
    with pytest.raises(anthropic.BadRequestError) as missing:
        # The SDK's own check would refuse it first: its plain POST sends it as it is.
        sdk.post("/v1/messages", cast_to=Message, body={"model": "auto", "messages": HELLO})
    _refused(missing.value, "invalid_request_error", "invalid_request")
    assert "max_tokens" in missing.value.response.json()["error"]["message"]

    with (anthropic.Anthropic(base_url=gw.url, api_key="nope", max_retries=0) as stranger,
          pytest.raises(anthropic.AuthenticationError) as bad_key):
        stranger.messages.create(model="auto", max_tokens=8, messages=HELLO)
    _refused(bad_key.value, "authentication_error", "invalid_api_key")

    with pytest.raises(anthropic.NotFoundError) as unknown:
        sdk.messages.create(model="claude-opus-9", max_tokens=8, messages=HELLO)
    _refused(unknown.value, "not_found_error", "model_not_found")

    with pytest.raises(anthropic.BadRequestError) as top_k:
        sdk.messages.create(model="auto", max_tokens=8, messages=HELLO, extra_body={"top_k": 5})
    _refused(top_k.value, "invalid_request_error", "unsupported_parameter")

    with pytest.raises(anthropic.PermissionDeniedError) as too_high:
        sdk.messages.create(model="auto", max_tokens=8, messages=HELLO,
                                   extra_headers={"X-Priority": "critical"})
    _refused(too_high.value, "permission_error", "priority_not_allowed")

    # No provider here speaks the Messages API natively: what a chat completion cannot carry is refused.
    with pytest.raises(anthropic.BadRequestError) as thinking:
        sdk.messages.create(model="auto", max_tokens=2048, messages=HELLO,
                            thinking={"type": "enabled", "budget_tokens": 1024})
    _refused(thinking.value, "invalid_request_error", "unsupported_parameter")

    with pytest.raises(anthropic.BadRequestError) as unknown_field:
        sdk.messages.create(model="auto", max_tokens=8, messages=HELLO, extra_body={"container": "c-1"})
    _refused(unknown_field.value, "invalid_request_error", "invalid_request")


def _enqueued(gw: Gateway) -> float:
    """Jobs the gateway has enqueued so far (its metric)."""
    return sum(sample.value for metric in gw.state.metrics.registry.collect() for sample in metric.samples
               if sample.name == "tidegate_gateway_jobs_enqueued_total")


def test_refused_calls_queue_nothing(gw: Gateway) -> None:
    before = _enqueued(gw)
    for body in ({"model": "auto", "messages": HELLO},  # no max_tokens
                 {"model": "auto", "max_tokens": 8, "messages": []},
                 {"model": "auto", "max_tokens": 8, "messages": HELLO, "top_k": 3},
                 {"model": "auto", "max_tokens": 8, "stop_sequences": ["a", "b", "c", "d", "e"],
                  "messages": HELLO},
                 {"model": "auto", "max_tokens": 8, "messages": [*HELLO, {"role": "assistant", "content": [
                     {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}}]}]},
                 {"model": "auto", "max_tokens": 8, "messages": [*HELLO, {"role": "assistant", "content": [
                     {"type": "tool_use", "id": "t1", "name": "f", "input": {"n": 2**70}}]}]},
                 {"model": "auto", "max_tokens": 8, "messages": HELLO, "thinking": {"type": "enabled"}},
                 {"model": "auto", "max_tokens": 8, "messages": HELLO, "service_tier": "priority"}):
        answer = httpx.post(f"{gw.url}/v1/messages", json=body, headers={"x-api-key": gw.keys["acme"]})
        assert answer.status_code == 400, answer.text
        assert answer.json()["error"]["code"]

    assert _enqueued(gw) == before
    with client(gw) as sdk:  # while a valid call is counted
        sdk.messages.create(model="auto", max_tokens=8, messages=HELLO)
    assert _enqueued(gw) == before + 1


async def test_a_stream_is_served_from_the_whole_answer_when_the_worker_cannot_relay(tmp_path: Path) -> None:
    factory = QueueFactory("sqlite", f"sqlite:///{tmp_path / 'queue.db'}")
    try:
        async with (open_gateway(factory, worker_streams=False) as gw,
                    anthropic.AsyncAnthropic(base_url=gw.url, api_key=gw.keys["acme"], max_retries=0) as sdk):
            async with sdk.messages.stream(model="auto", max_tokens=16, messages=HELLO) as stream:
                text = "".join([delta async for delta in stream.text_stream])
                final = await stream.get_final_message()
            async with sdk.messages.stream(model="auto", max_tokens=16, messages=HELLO,
                                           tools=[WEATHER]) as stream:
                called = await stream.get_final_message()
    finally:
        await factory.aclose()

    assert text and final.content[0].type == "text" and final.content[0].text == text
    assert final.usage.input_tokens > 0 and final.usage.output_tokens > 0
    assert called.stop_reason == "tool_use"
    assert [(block.type, getattr(block, "input", None)) for block in called.content] == [
        ("tool_use", {"city": "tide", "unit": "c"})]


# ---------------------------------------------------------------------- an Anthropic upstream

UPSTREAM_KEY_ENV = "TIDEGATE_TEST_ANTHROPIC_UPSTREAM_KEY"


@pytest.fixture(scope="module")
def native(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Gateway, BlockingPortal]]:
    """A gateway whose provider is the simulator's Anthropic Messages endpoint (`api =
    "anthropic"`). The simulator requires a key, which tidegate's Anthropic adapter sends as
    x-api-key, and which only the simulator's Messages endpoint reads from there: a call answered
    proves it went there."""
    factory = QueueFactory("sqlite", f"sqlite:///{tmp_path_factory.mktemp('native') / 'queue.db'}")
    with pytest.MonkeyPatch.context() as patch, start_blocking_portal() as portal:
        patch.setenv(UPSTREAM_KEY_ENV, "sk-upstream-1")
        try:
            with portal.wrap_async_context_manager(open_gateway(
                    factory, provider_update={"api": "anthropic", "api_key_env": UPSTREAM_KEY_ENV})) as gw:
                portal.call(gw.sim.configure, {"require_api_key": "sk-upstream-1"})
                yield gw, portal
        finally:
            portal.call(factory.aclose)


def test_chat_completions_are_served_by_an_anthropic_upstream(native: tuple[Gateway, BlockingPortal]) -> None:
    gw, portal = native
    with openai.OpenAI(base_url=f"{gw.url}/v1", api_key=gw.keys["acme"], max_retries=0) as sdk:
        raw = sdk.chat.completions.with_raw_response.create(
            model="claude-sonnet-4.5", max_tokens=30, stop=["e"],
            messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hello"}])
        completion = raw.parse()
        chunks = list(sdk.chat.completions.create(model="auto", max_tokens=10, messages=[
            {"role": "user", "content": "Say hello"}], stream=True, stream_options={"include_usage": True}))

    [choice] = completion.choices
    assert choice.finish_reason == "stop" and "e" not in (choice.message.content or "")
    assert completion.usage is not None and completion.usage.prompt_tokens > 0
    job = portal.call(gw.queue.get, raw.headers["X-Tidegate-Job-Id"])
    assert job is not None and job.result["provider"] == PROVIDER
    assert "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0


def test_messages_are_served_by_an_anthropic_upstream(native: tuple[Gateway, BlockingPortal]) -> None:
    gw, _ = native
    with client(gw) as sdk:
        message = sdk.messages.create(model="auto", max_tokens=200, messages=HELLO, stop_sequences=["e"])
        with sdk.messages.stream(model="auto", max_tokens=16, messages=HELLO) as stream:
            text = "".join(stream.text_stream)
            final = stream.get_final_message()
        asked: list[MessageParam] = [{"role": "user", "content": "Weather in Paris?"}]
        called = sdk.messages.create(model="auto", max_tokens=64, messages=asked, tools=[WEATHER])
        with sdk.messages.stream(model="auto", max_tokens=64, messages=asked, tools=[WEATHER]) as stream:
            streamed_call = stream.get_final_message()
        [call] = called.content
        assert call.type == "tool_use"
        answered = sdk.messages.create(model="auto", max_tokens=64, tools=[WEATHER], messages=[
            *asked, {"role": "assistant", "content": called.content},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": call.id, "content": "18 C"}]}])

    assert (message.stop_reason, message.stop_sequence) == ("stop_sequence", "e")
    assert text and final.content[0].type == "text" and final.content[0].text == text
    assert final.usage.input_tokens > 0 and final.usage.output_tokens > 0
    assert called.stop_reason == streamed_call.stop_reason == "tool_use"
    assert call.input == {"city": "tide", "unit": "c"}
    assert [(block.type, getattr(block, "input", None)) for block in streamed_call.content] == [
        ("tool_use", {"city": "tide", "unit": "c"})]
    assert answered.stop_reason != "tool_use" and answered.content[0].type == "text"


def test_a_tier_crosses_an_anthropic_upstream_in_its_own_words(
    native: tuple[Gateway, BlockingPortal],
) -> None:
    gw, portal = native
    # The simulator's Messages endpoint refuses any tier but auto and standard_only, and serves
    # both at standard: an answer proves the tier was sent in Anthropic's words.
    with openai.OpenAI(base_url=f"{gw.url}/v1", api_key=gw.keys["acme"], max_retries=0) as sdk:
        raw = sdk.chat.completions.with_raw_response.create(
            model="claude-sonnet-4.5", max_tokens=10, messages=[{"role": "user", "content": "Hi"}],
            service_tier="flex")
        chunks = list(sdk.chat.completions.create(model="claude-sonnet-4.5", max_tokens=10, stream=True,
                                                  messages=[{"role": "user", "content": "Hi"}],
                                                  service_tier="priority"))
    with client(gw) as anthropic_sdk:
        message = anthropic_sdk.messages.create(model="auto", max_tokens=10, messages=HELLO,
                                                service_tier="standard_only")

    assert raw.parse().service_tier == "default"  # flex was sent as standard_only, served at standard
    job = portal.call(gw.queue.get, raw.headers["X-Tidegate-Job-Id"])
    assert job is not None and job.result["response"]["service_tier"] == "default"
    assert chunks and {chunk.service_tier for chunk in chunks} == {"default"}
    assert message.usage.service_tier == "standard"


def test_the_adapter_speaks_anthropics_tiers_both_ways() -> None:
    hello = [ChatMessage(role="user", content="Hi")]
    sent = [messages_body(ChatRequest(model="m", messages=hello, service_tier=tier), "m").get("service_tier")
            for tier in ("auto", "priority", "default", "flex", None)]
    message: dict[str, Any] = {"id": "msg_1", "model": "m", "content": [{"type": "text", "text": "Hi"}],
                               "stop_reason": "end_turn", "usage": {"input_tokens": 1, "output_tokens": 1}}
    answered = [chat_completion({**message, "usage": {**message["usage"], "service_tier": tier}})
                .get("service_tier") for tier in ("standard", "priority", "batch")]

    assert sent == ["auto", "auto", "standard_only", "standard_only", None]
    assert answered == ["default", "priority", "flex"]
    assert "service_tier" not in chat_completion(message)


def test_the_adapter_sends_a_file_part_as_a_document_block() -> None:
    part = {"type": "file", "file": {"file_data": "data:application/pdf;base64,JVBERi0=",
                                     "filename": "report.pdf"}}
    chat = decode("chat", {"model": "m", "messages": [
        {"role": "user", "content": [{"type": "text", "text": "Sum up"}, part]}]})
    assert isinstance(chat, ChatRequest)
    body = messages_body(chat, "m")

    assert body["messages"] == [{"role": "user", "content": [
        {"type": "text", "text": "Sum up"},
        {"type": "document", "title": "report.pdf",
         "source": {"type": "base64", "media_type": "application/pdf", "data": "JVBERi0="}}]}]
