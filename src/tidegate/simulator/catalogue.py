"""What the simulated provider serves, and how a config gains it as its provider.

The product knows nothing of the simulator: a gateway or worker serves the providers its config
names. Whoever starts one without a real provider (`tidegate up`, `tidegate worker` or
`tidegate gateway --simulator-url`, the demo, tests and benchmarks) gives it the simulated
provider's config here (`with_simulator`), so it offers what the simulator serves.
"""

from __future__ import annotations

from decimal import Decimal

from tidegate.config import ModelConfig, ProviderConfig, TidegateConfig

__all__ = ["SIMULATED_PROVIDER", "default_models", "legacy_models", "simulated_models", "with_simulator"]

SIMULATED_PROVIDER = "simulated"  # the provider's name in a config `with_simulator` made


def default_models() -> tuple[ModelConfig, ...]:
    """The price table the simulator serves (USD per 1M tokens, the providers' list prices, with
    their published limits): the models a config gains `with_simulator`.

    Cached input is each provider's published price of prompt-cache hits: DeepSeek's "cache hit"
    input (V3.2), Gemini's context-caching input (implicit caching; explicit caches also bill
    storage by the hour, which is not priced here), OpenAI's "cached input" and Anthropic's
    "cache hits", whose 5-minute and 1-hour cache writes are its published 1.25 and 2 times the
    input price (https://platform.claude.com/docs/en/about-claude/pricing)."""
    return (
        ModelConfig(name="deepseek-v3.2", input_usd_per_1m=Decimal("0.28"),
                    output_usd_per_1m=Decimal("0.42"), cached_input_usd_per_1m=Decimal("0.028"),
                    rpm=3000, tpm=2_000_000),
        ModelConfig(name="gemini-2.5-flash", input_usd_per_1m=Decimal("0.30"),
                    output_usd_per_1m=Decimal("2.50"), cached_input_usd_per_1m=Decimal("0.03"),
                    rpm=2000, tpm=4_000_000, context_tokens=1_048_576),
        ModelConfig(name="gpt-4.1", input_usd_per_1m=Decimal("2.00"),
                    output_usd_per_1m=Decimal("8.00"), cached_input_usd_per_1m=Decimal("0.50"),
                    rpm=1000, tpm=1_000_000, context_tokens=1_047_576),
        ModelConfig(name="claude-sonnet-4.5", input_usd_per_1m=Decimal("3.00"),
                    output_usd_per_1m=Decimal("15.00"), cached_input_usd_per_1m=Decimal("0.30"),
                    cache_write_5m_usd_per_1m=Decimal("3.75"), cache_write_1h_usd_per_1m=Decimal("6.00"),
                    rpm=1000, tpm=800_000, context_tokens=200_000),
        ModelConfig(name="text-embedding-3-small", input_usd_per_1m=Decimal("0.02"),
                    output_usd_per_1m=Decimal("0"), rpm=3000, tpm=5_000_000,
                    context_tokens=8_192, kind="embeddings"),
    )


def legacy_models() -> tuple[ModelConfig, ...]:
    """OpenAI's models of its legacy endpoints, with their prices (moderations are free): served
    by the simulator beside the price table, and by a real provider only when it lists them."""
    return (
        ModelConfig(name="gpt-3.5-turbo-instruct", input_usd_per_1m=Decimal("1.50"),
                    output_usd_per_1m=Decimal("2.00"), rpm=3500, tpm=90_000, context_tokens=4_096,
                    kind="completion"),
        ModelConfig(name="omni-moderation-latest", input_usd_per_1m=Decimal("0"),
                    output_usd_per_1m=Decimal("0"), rpm=1000, tpm=150_000, context_tokens=32_768,
                    kind="moderation"),
    )


def simulated_models() -> tuple[ModelConfig, ...]:
    """What the simulated provider serves: the price table and the legacy endpoints' models."""
    return (*default_models(), *legacy_models())


def with_simulator(config: TidegateConfig, base_url: str) -> TidegateConfig:
    """`config` with the simulator at `base_url` as its one provider, serving what the simulator
    serves (`simulated_models`): for when no real provider is configured."""
    simulated = ProviderConfig(name=SIMULATED_PROVIDER, base_url=base_url, models=simulated_models())
    return config.model_copy(update={"providers": (simulated,)})
