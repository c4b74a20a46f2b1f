"""Prices that match the invoice: prompt-cache reads at the cached-input price, Anthropic's cache
writes at the price of their lifetime, reasoning tokens billed once as output; the counts kept in
the stored result (older results still read) and shown by every dialect; and the budget ledger
settled to the cached-priced cost. Each cost is checked against a hand computation in
micro-dollars (USD per 1M tokens is micro-dollars per token).

The end-to-end cases run a real worker (and gateway) against the simulator, whose prompt cache
reports a repeated prefix as cached (tidegate.simulator.caching): a system prompt of 4096
characters is 1028 tokens to it, so a second question after it reports 1024 cached tokens (whole
blocks of 128), or, marked `cache_control` on Anthropic's API, 1028 written then 1028 read."""

from __future__ import annotations

from collections.abc import AsyncIterator
from decimal import Decimal
from typing import Any, Literal

import anthropic
import orjson
import pytest
from anthropic.types import MessageParam, TextBlockParam
from anthropic.types import Usage as AnthropicUsage

from conftest import QueueFactory
from support.dispatch import queue_url_of, running_worker, sim_config, wait_final
from support.gateway import Gateway, open_gateway, three_providers
from tidegate.ai import AIResult, Usage
from tidegate.config import BudgetConfig, ModelConfig, ProviderBatchConfig, ProviderConfig, TierPrice
from tidegate.coord.budget import budget_ledger_for
from tidegate.costs import at_tier, cost_micros
from tidegate.dispatch.tiers import batch_priced
from tidegate.gateway.anthropic.dialect import message_of
from tidegate.gateway.responses.output import response_usage
from tidegate.jobs import Job, JobState
from tidegate.providers.adapters.anthropic import MessagesDecoder, chat_completion
from tidegate.providers.adapters.native import messages_usage, responses_usage
from tidegate.queue import Queue
from tidegate.simulator.server import Simulator
from tidegate.simulator.settings import SimulatorSettings

GPT = ModelConfig(name="gpt-4.1", input_usd_per_1m=Decimal("2.00"), output_usd_per_1m=Decimal("8.00"),
                  cached_input_usd_per_1m=Decimal("0.50"))
# Anthropic's Sonnet prices, its cache writes left to the published multipliers (1.25 and 2)
CLAUDE = ModelConfig(name="claude-sonnet-4.5", input_usd_per_1m=Decimal("3.00"),
                     output_usd_per_1m=Decimal("15.00"), cached_input_usd_per_1m=Decimal("0.30"))
LONG = ("tide " * 820)[:4096]  # 1024 tokens of text to the simulator, 1028 as a message
# A Message's usage with every kind of token: 11 plain input, 1000 read, 1500 written, 120 thinking
MESSAGE_USAGE: dict[str, Any] = {
    "input_tokens": 11, "cache_creation_input_tokens": 1500, "cache_read_input_tokens": 1000,
    "cache_creation": {"ephemeral_5m_input_tokens": 1000, "ephemeral_1h_input_tokens": 500},
    "output_tokens": 200, "output_tokens_details": {"thinking_tokens": 120}}


# ---------------------------------------------------------------------- the price of each kind


def test_cached_input_costs_the_cached_price_and_the_rest_the_input_price() -> None:
    usage = Usage(1_200, 100, 1_300, cached_input_tokens=1_024)

    # (1200 - 1024) x 2.00 + 1024 x 0.50 + 100 x 8.00 = 352 + 512 + 800
    assert cost_micros(GPT, usage) == 1_664
    # Without a cached price, a cache read costs the input price: 1200 x 2.00 + 100 x 8.00
    assert cost_micros(GPT.model_copy(update={"cached_input_usd_per_1m": None}), usage) == 3_200


def test_reasoning_tokens_are_billed_once_as_the_output_they_are_part_of() -> None:
    reasoned = Usage(100, 500, 600, reasoning_tokens=400)

    # 100 x 2.00 + 500 x 8.00: the 400 reasoning tokens are among the 500 output tokens
    assert cost_micros(GPT, reasoned) == 4_200 == cost_micros(GPT, Usage(100, 500, 600))


def test_anthropic_cache_reads_and_writes_are_priced_by_lifetime() -> None:
    usage = messages_usage(MESSAGE_USAGE)

    # 11 x 3.00 + 1000 x 0.30 + 1000 x 3.75 (1.25 x 3.00) + 500 x 6.00 (2 x 3.00) + 200 x 15.00
    assert cost_micros(CLAUDE, usage) == 33 + 300 + 3_750 + 3_000 + 3_000
    # Write prices of its own, when the model names them: 1000 x 4.00 + 500 x 7.00
    named = CLAUDE.model_copy(update={"cache_write_5m_usd_per_1m": Decimal("4"),
                                      "cache_write_1h_usd_per_1m": Decimal("7")})
    assert cost_micros(named, usage) == 33 + 300 + 4_000 + 3_500 + 3_000


def test_a_batch_discount_and_a_tier_scale_the_cached_price_too() -> None:
    usage = Usage(1_200, 100, 1_300, cached_input_tokens=1_024)
    provider = ProviderConfig(name="p", base_url="http://127.0.0.1:9/v1", models=(GPT,),
                              batch=ProviderBatchConfig(discount=Decimal("0.5")))
    flex = TierPrice(input_usd_per_1m=Decimal("1"), output_usd_per_1m=Decimal("4"),
                     cached_input_usd_per_1m=Decimal("0.25"))
    tiered = GPT.model_copy(update={"tier_prices": {"flex": flex}})

    # Half of every price: 176 x 1.00 + 1024 x 0.25 + 100 x 4.00
    assert cost_micros(batch_priced(GPT, provider), usage) == 176 + 256 + 400
    # A factor of 1.75 on every price: 1664 x 1.75
    assert cost_micros(at_tier(GPT, "priority", {"priority": Decimal("1.75")}), usage) == 2_912
    # A tier's own prices, its cached one included
    assert cost_micros(at_tier(tiered, "flex"), usage) == 176 + 256 + 400
    # A tier's own prices without a cached one: cache reads at the tier's input price
    plain = GPT.model_copy(update={"tier_prices": {"flex": flex.model_copy(
        update={"cached_input_usd_per_1m": None})}})
    assert cost_micros(at_tier(plain, "flex"), usage) == 1_200 + 400


# ---------------------------------------------------------------------- stored, mapped, shown


def test_the_counts_round_trip_through_a_stored_result_in_openai_s_shape() -> None:
    usage = Usage(2_511, 200, 2_711, cached_input_tokens=1_000, cache_write_5m_tokens=1_000,
                  cache_write_1h_tokens=500, reasoning_tokens=120)

    stored = AIResult({"object": "chat.completion"}, usage=usage, cost_micros=1).to_json()

    assert stored["usage"] == {
        "prompt_tokens": 2_511, "completion_tokens": 200, "total_tokens": 2_711,
        "prompt_tokens_details": {
            "cached_tokens": 1_000, "cache_write_tokens": 1_500,
            "cache_write_tokens_details": {"ttl_5m_tokens": 1_000, "ttl_1h_tokens": 500}},
        "completion_tokens_details": {"reasoning_tokens": 120}}
    again = AIResult.from_json(orjson.loads(orjson.dumps(stored)))
    assert again is not None and again.usage == usage
    assert Usage.from_json(usage.to_json()) == usage


def test_a_result_stored_before_the_details_existed_reads_them_as_zeros() -> None:
    # As 0.1.0 wrote a result: no "v", no details
    old = {"response": {"object": "chat.completion"}, "model": "gpt-4.1",
           "usage": {"prompt_tokens": 12, "completion_tokens": 5, "total_tokens": 17},
           "cost_usd": "0.000064", "cost_micros": 64}

    result = AIResult.from_json(old)

    assert result is not None and result.usage == Usage(12, 5, 17)
    usage = result.usage
    assert (usage.cached_input_tokens, usage.cache_write_tokens, usage.reasoning_tokens) == (0, 0, 0)
    assert result.to_json()["usage"] == old["usage"]


def test_anthropic_s_usage_counts_every_prompt_token_and_the_cache_apart() -> None:
    message = {"id": "msg_1", "type": "message", "model": "claude-sonnet-4.5", "stop_reason": "end_turn",
               "content": [{"type": "text", "text": "Red."}], "usage": MESSAGE_USAGE}

    completion = chat_completion(message)

    # Anthropic's input_tokens leave the cache's out; OpenAI's prompt_tokens count them
    assert messages_usage(MESSAGE_USAGE) == Usage(2_511, 200, 2_711, 1_000, 1_000, 500, 120)
    assert completion["usage"]["prompt_tokens"] == 2_511
    assert completion["usage"]["prompt_tokens_details"]["cached_tokens"] == 1_000
    # Without the lifetimes (an older API version), every write is a 5-minute one
    undated = {"input_tokens": 11, "cache_creation_input_tokens": 1_500, "output_tokens": 2}
    assert messages_usage(undated) == Usage(1_511, 2, 1_513, cache_write_5m_tokens=1_500)
    # Shown to an Anthropic caller again in Anthropic's own counts
    assert message_of(completion)["usage"] == {**MESSAGE_USAGE, "service_tier": "standard"}


def test_a_streamed_message_s_usage_keeps_the_cache_counts_of_its_start() -> None:
    decoder = MessagesDecoder()
    start = {"type": "message_start", "message": {"id": "msg_1", "model": "claude-sonnet-4.5",
                                                  "usage": {**MESSAGE_USAGE, "output_tokens": 1}}}
    delta = {"type": "message_delta", "delta": {"stop_reason": "end_turn"},
             "usage": {"input_tokens": 11, "cache_read_input_tokens": 1_000, "output_tokens": 200}}

    for event in (start, delta):
        decoder(orjson.dumps(event))
    [last], ended = decoder(orjson.dumps({"type": "message_stop"}))

    assert ended and Usage.from_json(orjson.loads(last)["usage"]) == messages_usage(MESSAGE_USAGE)


def test_the_responses_api_shows_cache_reads_writes_and_reasoning_in_its_details() -> None:
    usage = messages_usage(MESSAGE_USAGE)

    shown = response_usage(usage.to_json())

    assert shown == {"input_tokens": 2_511, "output_tokens": 200, "total_tokens": 2_711,
                     "input_tokens_details": {"cached_tokens": 1_000, "cache_write_tokens": 1_500},
                     "output_tokens_details": {"reasoning_tokens": 120}}
    assert responses_usage(shown) == Usage(2_511, 200, 2_711, 1_000, 1_500, 0, 120)


# ---------------------------------------------------------------------- end to end: the worker


@pytest.fixture
async def simulator() -> AsyncIterator[tuple[Simulator, str]]:
    sim = Simulator(SimulatorSettings(seed=3, window_s=1.0))
    async with sim.running() as base_url:
        yield sim, base_url


async def answered(queue: Queue, question: str) -> Job:
    """A gpt-4.1 chat job after the long system prompt, once it ended."""
    messages = [{"role": "system", "content": LONG}, {"role": "user", "content": question}]
    job_id = await queue.enqueue({"kind": "chat", "body": {"model": "gpt-4.1", "messages": messages}},
                                 tenant="acme")
    [job] = await wait_final(queue, [job_id])
    assert job.state is JobState.SUCCEEDED, job.last_error
    return job


async def test_a_call_reporting_cached_tokens_costs_the_price_table_and_the_ledger_settles_it(
    queue_factory: QueueFactory, simulator: tuple[Simulator, str],
) -> None:
    # Given a tenant with a budget, so the worker reserves and settles every call in the ledger
    _, base_url = simulator
    queue = await queue_factory.open()
    config = sim_config(base_url, queue_url=queue_url_of(queue_factory),
                        budgets=BudgetConfig(tenant_daily_usd={"acme": Decimal("1.00")}))
    # When two questions follow the same long system prompt, one after the other
    async with running_worker(queue, config):
        first = await answered(queue, "Name a colour.")
        second = await answered(queue, "Name a shape.")
    # Then the second reports the system prompt as cached: 1024 of its 1039 prompt tokens
    usage = second.result["usage"]
    assert (usage["prompt_tokens"], usage["prompt_tokens_details"]) == (1_039, {"cached_tokens": 1_024})
    assert "prompt_tokens_details" not in first.result["usage"]
    # and each costs what the price table says (gpt-4.1: 2.00 input, 0.50 cached, 8.00 output)
    first_output, second_output = first.result["usage"]["completion_tokens"], usage["completion_tokens"]
    assert first.result["cost_micros"] == 1_039 * 2 + first_output * 8
    assert second.result["cost_micros"] == (1_039 - 1_024) * 2 + 1_024 // 2 + second_output * 8
    # and the ledger holds exactly what the two cost
    async with budget_ledger_for(config.queue_url) as ledger:
        spent = await ledger.spend_today()
    assert spent["acme"] == first.result["cost_micros"] + second.result["cost_micros"]


# ---------------------------------------------------------------------- end to end: the gateway


def marked(ttl: Literal["5m", "1h"]) -> list[TextBlockParam]:
    """The long system prompt as one text block that ends a cache breakpoint."""
    return [{"type": "text", "text": LONG, "cache_control": {"type": "ephemeral", "ttl": ttl}}]


async def job_of(gw: Gateway, job_id: str) -> dict[str, Any]:
    """The result of a job that succeeded (a streamed one may end its stream before its result is
    stored)."""
    [job] = await wait_final(gw.queue, [job_id])
    assert job.state is JobState.SUCCEEDED and isinstance(job.result, dict)
    return job.result


def counts(usage: AnthropicUsage) -> tuple[int, int, int]:
    """A Message's plain input tokens, cache reads and cache writes."""
    return usage.input_tokens, usage.cache_read_input_tokens or 0, usage.cache_creation_input_tokens or 0


@pytest.mark.sqlite_only  # the counts are the job's result: every backend stores it alike
async def test_the_openai_sdk_sees_its_cached_tokens_and_the_job_is_charged_for_them(
    queue_factory: QueueFactory,
) -> None:
    async with open_gateway(queue_factory) as gw, gw.openai("acme") as client:
        costs = []
        for question in ("Name a colour.", "Name a shape."):
            raw = await client.chat.completions.with_raw_response.create(model="gpt-4.1", messages=[
                {"role": "system", "content": LONG}, {"role": "user", "content": question}])
            completion = raw.parse()
            result = await job_of(gw, raw.headers["X-Tidegate-Job-Id"])
            costs.append((completion.usage, result["cost_micros"]))

        # and a stream, whose usage chunk counts the cache too
        streamed = await client.chat.completions.with_raw_response.create(
            model="gpt-4.1", stream=True, stream_options={"include_usage": True},
            messages=[{"role": "system", "content": LONG}, {"role": "user", "content": "Name a fruit."}])
        chunks = [chunk async for chunk in streamed.parse()]
        result = await job_of(gw, streamed.headers["X-Tidegate-Job-Id"])
        costs.append((chunks[-1].usage, result["cost_micros"]))

    for usage, cost in costs[1:]:
        assert usage is not None and usage.prompt_tokens_details is not None
        assert (usage.prompt_tokens, usage.prompt_tokens_details.cached_tokens) == (1_039, 1_024)
        # (1039 - 1024) x 2.00 + 1024 x 0.50 + output x 8.00
        assert cost == 15 * 2 + 1_024 // 2 + usage.completion_tokens * 8


@pytest.mark.sqlite_only
async def test_an_anthropic_caller_sees_its_cache_writes_then_reads_and_is_charged_for_each(
    queue_factory: QueueFactory,
) -> None:
    asked: list[MessageParam] = [{"role": "user", "content": "Name a colour."}]
    async with (open_gateway(queue_factory, configure=three_providers) as gw,
                anthropic.AsyncAnthropic(base_url=gw.url, api_key=None, max_retries=0,
                                         default_headers={"x-api-key": gw.keys["acme"]}) as client):
        raw = await client.messages.with_raw_response.create(
            model="claude-sonnet-4.5", max_tokens=50, system=marked("1h"), messages=asked)
        written, first = (await raw.parse()).usage, await job_of(gw, raw.headers["X-Tidegate-Job-Id"])
        async with client.messages.stream(model="claude-sonnet-4.5", max_tokens=50, system=marked("1h"),
                                          messages=asked) as stream:
            read = (await stream.get_final_message()).usage
            second = await job_of(gw, stream.response.headers["X-Tidegate-Job-Id"])

    # The first call writes the 1028-token system prompt for an hour, the second (a stream) reads it
    assert counts(written) == (11, 0, 1_028) and counts(read) == (11, 1_028, 0)
    assert written.cache_creation is not None and written.cache_creation.ephemeral_1h_input_tokens == 1_028
    assert first["usage"]["prompt_tokens"] == second["usage"]["prompt_tokens"] == 1_039
    # Sonnet: 3.00 input, 6.00 for an hour's write, 0.30 for a read, 15.00 output
    assert first["cost_micros"] == 11 * 3 + 1_028 * 6 + written.output_tokens * 15
    assert second["cost_micros"] == 11 * 3 + 309 + read.output_tokens * 15  # 1028 x 0.30 = 308.4, up


@pytest.mark.sqlite_only
async def test_a_reasoning_response_records_its_reasoning_and_bills_it_once(
    queue_factory: QueueFactory,
) -> None:
    async with open_gateway(queue_factory, configure=three_providers) as gw, gw.openai("acme") as client:
        raw = await client.responses.with_raw_response.create(
            model="gpt-4.1", input="Name a colour.", reasoning={"effort": "low"})
        response = raw.parse()
        result = await job_of(gw, raw.headers["X-Tidegate-Job-Id"])

    usage = response.usage
    assert usage is not None and usage.output_tokens_details.reasoning_tokens > 0
    assert result["usage"]["completion_tokens"] == usage.output_tokens  # reasoning included
    assert result["usage"]["completion_tokens_details"] == {
        "reasoning_tokens": usage.output_tokens_details.reasoning_tokens}
    assert result["cost_micros"] == usage.input_tokens * 2 + usage.output_tokens * 8
