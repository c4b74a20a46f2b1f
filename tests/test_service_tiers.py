"""Service tiers through the whole path: the official SDK's `service_tier` goes upstream and comes
back in the answer, the provider's tier policy picks one by priority when the caller did not, and
the job is charged the prices of the tier it ran at."""

from __future__ import annotations

import math
from decimal import Decimal
from typing import Any

import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from conftest import QueueFactory
from support.gateway import Gateway, open_gateway
from tidegate.ai import AIRequest, Usage, result_of
from tidegate.config import BudgetConfig, ModelConfig, PricedTier, ProviderConfig, TidegateConfig, TierPrice
from tidegate.contract import decode, requested_tier
from tidegate.costs import at_tier, billed_tier, cost_micros, estimate_cost_micros, usd_to_micros
from tidegate.dispatch.tiers import priced, tier_of, with_tier
from tidegate.jobs import Priority

pytestmark = pytest.mark.sqlite_only  # the tier is a field of the job: every backend carries it alike

HELLO: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Say hello"}]
MODEL = "deepseek-v3.2"  # 0.28 / 0.42 USD per 1M tokens at the default tier
FLEX = TierPrice(input_usd_per_1m=Decimal("0.14"), output_usd_per_1m=Decimal("0.21"))
PRIORITY_FACTOR = Decimal("1.75")


def with_tiers(policy: dict[str, Any] | None = None) -> Any:
    """A `configure` for open_gateway: the simulator's provider with flex prices of its own for
    MODEL, a price factor for priority, and the tier policy `policy`."""

    def configure(config: TidegateConfig) -> TidegateConfig:
        provider = config.providers[0]
        models = tuple(model.model_copy(update={"tier_prices": {"flex": FLEX}}) if model.name == MODEL
                       else model for model in provider.models)
        tiered = provider.model_copy(update={"models": models, "service_tiers": policy or {},
                                             "tier_price_factors": {"priority": PRIORITY_FACTOR}})
        return config.model_copy(update={"providers": (tiered,)})

    return configure


async def charged(gw: Gateway, job_id: str) -> tuple[int, int, int]:
    """The job's cost in micros and the tokens it was charged for."""
    job = await gw.queue.get(job_id)
    assert job is not None
    result = result_of(job)
    assert result is not None and result.usage is not None and result.cost_micros is not None
    return result.cost_micros, result.usage.input_tokens, result.usage.output_tokens


async def test_the_sdks_service_tier_goes_upstream_comes_back_and_sets_the_price(
    queue_factory: QueueFactory,
) -> None:
    async with open_gateway(queue_factory, configure=with_tiers()) as gw, gw.openai("acme") as client:
        raw = await client.chat.completions.with_raw_response.create(
            model=MODEL, messages=HELLO, service_tier="flex")
        completion = raw.parse()

        assert completion.service_tier == "flex"
        job_id = raw.headers["X-Tidegate-Job-Id"]
        job = await gw.queue.get(job_id)
        assert job is not None and job.payload["body"]["service_tier"] == "flex"
        cost, prompt, output = await charged(gw, job_id)
        assert cost == math.ceil(prompt * FLEX.input_usd_per_1m + output * FLEX.output_usd_per_1m)
        assert raw.headers["X-Tidegate-Cost-Usd"] == str(Decimal(cost).scaleb(-6))


async def test_a_streamed_call_shows_its_tier_in_the_chunks_and_is_charged_at_it(
    queue_factory: QueueFactory,
) -> None:
    async with open_gateway(queue_factory, configure=with_tiers()) as gw, gw.openai("acme") as client:
        raw = await client.chat.completions.with_raw_response.create(
            model=MODEL, messages=HELLO, service_tier="priority", stream=True)
        chunks = [chunk async for chunk in raw.parse()]

        assert chunks and {chunk.service_tier for chunk in chunks} == {"priority"}
        job = await gw.queue.get(raw.headers["X-Tidegate-Job-Id"])
        assert job is not None and job.result["response"]["service_tier"] == "priority"
        cost, prompt, output = await charged(gw, job.id)
        assert cost == math.ceil(PRIORITY_FACTOR * (prompt * Decimal("0.28") + output * Decimal("0.42")))


async def test_a_stream_served_from_the_whole_answer_names_its_tier_too(queue_factory: QueueFactory) -> None:
    async with open_gateway(queue_factory, worker_streams=False, configure=with_tiers()) as gw, \
            gw.openai("acme") as client:
        stream = await client.chat.completions.create(model=MODEL, messages=HELLO, service_tier="flex",
                                                      stream=True)
        chunks = [chunk async for chunk in stream]

        assert chunks and {chunk.service_tier for chunk in chunks} == {"flex"}


async def test_embeddings_take_a_tier_too(queue_factory: QueueFactory) -> None:
    async with open_gateway(queue_factory, configure=with_tiers()) as gw, gw.openai("acme") as client:
        raw = await client.embeddings.with_raw_response.create(
            model="text-embedding-3-small", input="red shoes", extra_body={"service_tier": "auto"})

        assert raw.http_response.json()["service_tier"] == "default"  # auto, served at default
        assert raw.parse().data


async def test_the_policy_maps_critical_to_priority_and_bulk_to_flex_unless_the_caller_chose(
    queue_factory: QueueFactory,
) -> None:
    policy = {"critical": "priority", "bulk": "flex"}
    async with open_gateway(queue_factory, configure=with_tiers(policy)) as gw:
        async def call(tenant: str, priority: str, **extra: Any) -> tuple[Any, str]:
            async with gw.openai(tenant) as client:
                raw = await client.chat.completions.with_raw_response.create(
                    model=MODEL, messages=HELLO, extra_headers={"X-Priority": priority}, **extra)
            return raw.parse(), raw.headers["X-Tidegate-Job-Id"]

        critical, critical_id = await call("ops", "critical")
        bulk, bulk_id = await call("bulkco", "bulk")
        normal, _ = await call("acme", "normal")
        chosen, _ = await call("bulkco", "bulk", service_tier="default")

        tiers = (critical.service_tier, bulk.service_tier, chosen.service_tier)
        assert tiers == ("priority", "flex", "default")
        assert normal.service_tier is None  # no policy for NORMAL: nothing sent, nothing claimed
        cost, prompt, output = await charged(gw, bulk_id)
        assert cost == math.ceil(prompt * FLEX.input_usd_per_1m + output * FLEX.output_usd_per_1m)
        cost, prompt, output = await charged(gw, critical_id)
        assert cost == math.ceil(PRIORITY_FACTOR * (prompt * Decimal("0.28") + output * Decimal("0.42")))


async def test_the_budget_is_reserved_at_the_price_of_the_tier_sent(queue_factory: QueueFactory) -> None:
    # Given a daily budget between what the call can cost at flex prices and at default prices
    limit_usd = Decimal("0.0002")
    budgets = BudgetConfig(tenant_daily_usd={"acme": limit_usd}, on_exhausted="reject")
    gateway = open_gateway(queue_factory, configure=with_tiers(), config_update={"budgets": budgets})
    async with gateway as gw, gw.openai("acme") as client:
        ask = {"model": MODEL, "messages": HELLO, "max_tokens": 600}
        model = default_model(gw.state.config)
        at_flex, at_default = (estimate_cost_micros(at_tier(model, tier), decode("chat", ask))
                               for tier in ("flex", "default"))
        assert at_flex < usd_to_micros(limit_usd) < at_default

        # When the call asks for the default tier, then for flex
        with pytest.raises(openai.RateLimitError) as refused:
            await client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=600,
                                                 service_tier="default")
        flex = await client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=600,
                                                    service_tier="flex")

        # Then only the flex reservation fits the budget
        assert refused.value.response.json()["error"]["code"] == "budget_exceeds_limit"
        assert flex.service_tier == "flex" and flex.choices


def default_model(config: TidegateConfig) -> ModelConfig:
    """MODEL as the gateway's config has it (its flex prices included)."""
    found = config.find_model(MODEL)
    assert found is not None
    return found[1]


@pytest.mark.parametrize("kind", ["chat", "embeddings"])
async def test_an_unknown_tier_is_refused_with_400_and_nothing_is_queued(
    queue_factory: QueueFactory, kind: str,
) -> None:
    async with open_gateway(queue_factory, worker=False) as gw, gw.openai("acme") as client:
        with pytest.raises(openai.BadRequestError) as refused:
            if kind == "chat":
                await client.chat.completions.create(model=MODEL, messages=HELLO,
                                                     extra_body={"service_tier": "turbo"})
            else:
                await client.embeddings.create(model="text-embedding-3-small", input="x",
                                               extra_body={"service_tier": "turbo"})

        error = refused.value.response.json()["error"]
        assert error["code"] == "invalid_request" and error["param"] == "service_tier"
        assert error["type"] == "invalid_request_error" and "service_tier" in error["message"]
        assert await gw.depth() == 0


def test_a_tier_is_priced_by_the_models_own_price_then_the_providers_factor() -> None:
    flex = TierPrice(input_usd_per_1m=Decimal("1"), output_usd_per_1m=Decimal("4"))
    model = ModelConfig(name="m", input_usd_per_1m=Decimal("2"), output_usd_per_1m=Decimal("8"),
                        tier_prices={"flex": flex})
    factors: dict[PricedTier, Decimal] = {"priority": Decimal("1.75"), "flex": Decimal("0.1")}

    assert cost_micros(at_tier(model, "flex", factors), Usage(1000, 1000)) == 5000  # its own flex prices
    assert cost_micros(at_tier(model, "priority", factors), Usage(1000, 1000)) == 17500
    assert at_tier(model, "auto", factors) is at_tier(model, None, factors) is model
    assert at_tier(model, "priority") is model  # no factor for the tier: the default prices
    assert [billed_tier("flex", "default"), billed_tier("flex", None), billed_tier("auto", "scale")] == [
        "default", "flex", "default"]


def test_the_budget_reserved_is_priced_at_the_tier_the_call_is_sent_with() -> None:
    model = ModelConfig(name="m", input_usd_per_1m=Decimal("2"), output_usd_per_1m=Decimal("8"))
    provider = ProviderConfig(name="p", base_url="http://127.0.0.1:1/v1", models=(model,),
                              service_tiers={"BULK": "flex"}, tier_price_factors={"flex": Decimal("0.5")})
    request = AIRequest.of("chat", {"model": "m", "messages": [{"role": "user", "content": "hi"}],
                                    "max_tokens": 100})

    tier = tier_of(request, provider, Priority.BULK)
    sent = with_tier(request, tier)

    assert tier == "flex" and requested_tier(sent.body) == "flex" and requested_tier(request.body) is None
    assert tier_of(request, provider, Priority.NORMAL) is None
    assert tier_of(with_tier(request, "priority"), provider, Priority.BULK) == "priority"  # the caller's
    full = estimate_cost_micros(model, request.body)
    assert estimate_cost_micros(priced(model, provider, tier), sent.body) == math.ceil(full / 2)
