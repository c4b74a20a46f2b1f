"""Model routing: tiers by priority, explicit models, tenant entitlements, long context, budget
step-down, fallback past failing models, and inputs no model can hold. Uses the shipped price
table and tiers (config.default_models, RoutingConfig defaults)."""

from __future__ import annotations

from decimal import Decimal

import pytest

from tidegate.config import ModelConfig, ProviderConfig, RoutingConfig, TidegateConfig
from tidegate.dispatch.router import RouteDecision, Router
from tidegate.errors import RoutingError
from tidegate.jobs import Priority
from tidegate.simulator.catalogue import default_models

SMALL = 1_000  # estimated input tokens of an ordinary request


def _router(routing: RoutingConfig | None = None, models: tuple[ModelConfig, ...] | None = None) -> Router:
    provider = ProviderConfig(name="sim", base_url="http://127.0.0.1:9/v1",
                              models=default_models() if models is None else models)
    return Router(TidegateConfig(providers=(provider,), routing=routing or RoutingConfig()))


def _auto(router: Router, priority: Priority = Priority.NORMAL, tokens: int = SMALL, *,
          budget_fraction_left: float | None = None, allowed_models: frozenset[str] | None = None,
          exclude: frozenset[str] = frozenset()) -> RouteDecision:
    return router.route(kind="chat", requested_model=None, priority=priority,
                        estimated_input_tokens=tokens, budget_fraction_left=budget_fraction_left,
                        allowed_models=allowed_models, exclude=exclude)


@pytest.mark.parametrize(("priority", "model", "fallbacks"), [
    (Priority.CRITICAL, "claude-sonnet-4.5", ("gpt-4.1", "gemini-2.5-flash")),
    (Priority.HIGH, "gpt-4.1", ("gemini-2.5-flash", "deepseek-v3.2")),
    (Priority.NORMAL, "gemini-2.5-flash", ("deepseek-v3.2",)),
    (Priority.LOW, "deepseek-v3.2", ("gemini-2.5-flash",)),
    (Priority.BULK, "deepseek-v3.2", ()),
])
def test_auto_uses_the_tier_of_the_priority(
    priority: Priority, model: str, fallbacks: tuple[str, ...]
) -> None:
    decision = _auto(_router(), priority)

    assert (decision.model.name, decision.fallbacks) == (model, fallbacks)
    assert decision.provider.name == "sim"
    assert decision.reason == f"tier {priority.name.lower()}"


@pytest.mark.parametrize("requested", [None, "", "auto"])
def test_no_model_or_auto_both_route(requested: str | None) -> None:
    decision = _router().route(kind="chat", requested_model=requested, priority=Priority.HIGH,
                               estimated_input_tokens=SMALL)
    assert decision.model.name == "gpt-4.1"


def test_an_explicit_model_is_respected_as_is() -> None:
    router = _router()
    decision = router.route(kind="chat", requested_model="claude-sonnet-4.5", priority=Priority.BULK,
                            estimated_input_tokens=SMALL, budget_fraction_left=0.0,
                            exclude=frozenset({"claude-sonnet-4.5"}))

    # Never swapped for priority, budget or failures: the caller chose it
    assert decision.model.name == "claude-sonnet-4.5"
    assert (decision.reason, decision.fallbacks) == ("requested", ())


def test_an_unknown_explicit_model_is_refused() -> None:
    with pytest.raises(RoutingError, match=r"'gpt-9'.*unknown"):
        _router().route(kind="chat", requested_model="gpt-9", priority=Priority.NORMAL,
                        estimated_input_tokens=SMALL)


def test_an_explicit_model_the_tenant_may_not_use_is_refused() -> None:
    with pytest.raises(RoutingError, match=r"'gpt-4.1'.*not allowed"):
        _router().route(kind="chat", requested_model="gpt-4.1", priority=Priority.NORMAL,
                        estimated_input_tokens=SMALL, allowed_models=frozenset({"deepseek-v3.2"}))


def test_a_model_of_the_other_kind_is_refused() -> None:
    with pytest.raises(RoutingError, match=r"'text-embedding-3-small' serves embeddings requests, not chat"):
        _router().route(kind="chat", requested_model="text-embedding-3-small", priority=Priority.NORMAL,
                        estimated_input_tokens=SMALL)
    with pytest.raises(RoutingError, match="serves chat requests, not embeddings"):
        _router().route(kind="embeddings", requested_model="gpt-4.1", priority=Priority.NORMAL,
                        estimated_input_tokens=SMALL)


def test_allowed_models_narrow_auto_routing() -> None:
    decision = _auto(_router(), Priority.CRITICAL, allowed_models=frozenset({"gemini-2.5-flash", "gpt-4.1"}))

    assert (decision.model.name, decision.fallbacks) == ("gpt-4.1", ("gemini-2.5-flash",))


@pytest.mark.parametrize("priority", list(Priority))
def test_a_tenant_allowed_none_of_the_tier_is_served_by_its_own_models_at_every_priority(
    priority: Priority,
) -> None:
    decision = _auto(_router(), priority, allowed_models=frozenset({"gpt-4.1", "text-embedding-3-small"}))

    assert (decision.model.name, decision.fallbacks) == ("gpt-4.1", ())


def test_the_tenants_own_models_go_cheapest_first_when_the_tier_allows_none() -> None:
    # normal's tier is gemini and deepseek; this tenant may use neither
    decision = _auto(_router(), Priority.NORMAL,
                     allowed_models=frozenset({"claude-sonnet-4.5", "gpt-4.1"}))

    # by output price: gpt-4.1 8.00 < claude 15.00
    assert (decision.model.name, decision.fallbacks) == ("gpt-4.1", ("claude-sonnet-4.5",))
    assert decision.reason == "tier normal has no model the tenant may use: its own, cheapest first"


def test_a_tier_with_an_allowed_model_keeps_to_it() -> None:
    # critical lists gpt-4.1: the tier, filtered, decides (deepseek is allowed but not in it)
    decision = _auto(_router(), Priority.CRITICAL, allowed_models=frozenset({"gpt-4.1", "deepseek-v3.2"}))

    assert (decision.model.name, decision.fallbacks) == ("gpt-4.1", ())


@pytest.mark.parametrize("allowed", [frozenset(), frozenset({"text-embedding-3-small"}),
                                     frozenset({"gpt-9"})])
def test_a_tenant_that_may_use_no_chat_model_is_refused_as_not_allowed(allowed: frozenset[str]) -> None:
    with pytest.raises(RoutingError, match="no chat model may serve this tenant") as refused:
        _auto(_router(), Priority.HIGH, allowed_models=allowed)

    assert refused.value.refusal == "model_not_allowed"


def test_the_tenants_own_models_still_must_hold_the_input() -> None:
    # deepseek holds 128k tokens: the tenant's one model cannot take 200k
    with pytest.raises(RoutingError, match=r"deepseek-v3\.2 holds") as refused:
        _auto(_router(RoutingConfig(long_context_model=None)), Priority.CRITICAL, 200_000,
              allowed_models=frozenset({"deepseek-v3.2"}))

    assert refused.value.refusal == "model_not_available"


def test_embeddings_use_the_embedding_model_unless_one_is_named() -> None:
    embedding = ModelConfig(name="embed-large", input_usd_per_1m=Decimal("0.13"),
                            output_usd_per_1m=Decimal("0"), kind="embeddings")
    router = _router(models=(*default_models(), embedding))

    default = router.route(kind="embeddings", requested_model=None, priority=Priority.CRITICAL,
                           estimated_input_tokens=SMALL, exclude=frozenset({"text-embedding-3-small"}))
    named = router.route(kind="embeddings", requested_model="embed-large", priority=Priority.NORMAL,
                         estimated_input_tokens=SMALL)

    # Vectors of different models do not mix: an embedding model has no fallbacks
    assert (default.model.name, default.fallbacks) == ("text-embedding-3-small", ())
    assert named.model.name == "embed-large"
    with pytest.raises(RoutingError, match="not allowed"):
        router.route(kind="embeddings", requested_model=None, priority=Priority.NORMAL,
                     estimated_input_tokens=SMALL, allowed_models=frozenset({"embed-large"}))


def test_long_inputs_go_to_the_long_context_model_first() -> None:
    router = _router()

    # 150k tokens at high priority: the long-context model first, then what still fits
    high = _auto(router, Priority.HIGH, 150_000)
    assert (high.model.name, high.fallbacks) == ("gemini-2.5-flash", ("gpt-4.1",))
    assert "long context" in high.reason
    # at bulk, the long-context model serves although the tier does not list it
    bulk = _auto(router, Priority.BULK, 150_000)
    assert (bulk.model.name, bulk.fallbacks) == ("gemini-2.5-flash", ())


def test_models_too_small_for_the_input_are_dropped() -> None:
    # Below the long-context threshold, but above deepseek's 128k window
    router = _router(RoutingConfig(long_context_tokens=500_000))
    decision = _auto(router, Priority.LOW, 130_000)

    assert (decision.model.name, decision.fallbacks) == ("gemini-2.5-flash", ())


def test_low_budget_steps_down_to_the_cheapest_model_of_the_tier() -> None:
    router = _router()

    decision = _auto(router, Priority.CRITICAL, budget_fraction_left=0.1)
    plenty = _auto(router, Priority.CRITICAL, budget_fraction_left=0.5)

    # by output price: gemini 2.50 < gpt-4.1 8.00 < claude 15.00
    assert (decision.model.name, decision.fallbacks) == ("gemini-2.5-flash", ("gpt-4.1", "claude-sonnet-4.5"))
    assert "budget low: stepped down" in decision.reason
    assert plenty.model.name == "claude-sonnet-4.5"


def test_low_budget_looks_beyond_the_tier_when_nothing_in_it_is_left() -> None:
    decision = _auto(_router(), Priority.CRITICAL, budget_fraction_left=0.05,
                     exclude=frozenset({"claude-sonnet-4.5", "gpt-4.1", "gemini-2.5-flash"}))

    assert decision.model.name == "deepseek-v3.2"
    assert "beyond the tier" in decision.reason


def test_failing_models_are_skipped_for_the_next_in_the_tier() -> None:
    decision = _auto(_router(), Priority.CRITICAL, exclude=frozenset({"claude-sonnet-4.5"}))

    assert (decision.model.name, decision.fallbacks) == ("gpt-4.1", ("gemini-2.5-flash",))
    assert decision.reason == "tier critical, fallback after claude-sonnet-4.5 failed"


def test_no_fallback_left_in_the_tier_is_a_routing_error() -> None:
    with pytest.raises(RoutingError, match=r"deepseek-v3\.2 is failing"):
        _auto(_router(), Priority.BULK, exclude=frozenset({"deepseek-v3.2"}))


def test_an_input_too_large_for_every_model_is_a_routing_error() -> None:
    with pytest.raises(RoutingError, match=r"~2000000 input tokens.*holds 1048576 tokens"):
        _auto(_router(), Priority.CRITICAL, 2_000_000)


def test_tier_names_not_served_by_any_provider_are_skipped() -> None:
    routing = RoutingConfig(tiers={"normal": ("not-served", "deepseek-v3.2")})
    router = _router(routing)

    assert _auto(router, Priority.NORMAL).model.name == "deepseek-v3.2"
    # a priority without a tier may use any chat model, in configuration order
    assert _auto(router, Priority.HIGH).model.name == "deepseek-v3.2"
