"""Typed settings of a tidegate deployment: `tidegate.toml` (or the file named by
TIDEGATE_CONFIG) overlaid by `TIDEGATE_*` environment variables (nested with `__`).

Money is configured in USD (decimals, never floats) and kept internally as integer micro-dollars.
API keys are never stored here: a provider names the environment variable that holds its key.
"""

from __future__ import annotations

import os
from decimal import Decimal
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from tidegate.jobs import Priority

DEFAULT_CONFIG_FILE = "tidegate.toml"
SIMULATED_PROVIDER = "simulated"


class ModelConfig(BaseModel):
    """One model a provider serves, with its prices and limits."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(min_length=1)
    input_usd_per_1m: Decimal = Field(ge=0)
    output_usd_per_1m: Decimal = Field(ge=0)
    rpm: int | None = Field(None, gt=0)  # requests per minute; None = no limit known
    tpm: int | None = Field(None, gt=0)  # tokens (input + output) per minute
    # The window rpm and tpm count over. Providers state limits per minute; a shorter window
    # suits a simulator in tests.
    rate_window_s: float = Field(60.0, gt=0)
    max_concurrency: int = Field(64, gt=0)
    context_tokens: int = Field(128_000, gt=0)
    kind: Literal["chat", "embeddings"] = "chat"


class ProviderConfig(BaseModel):
    """An OpenAI-compatible upstream."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")
    base_url: str = Field(min_length=1)  # e.g. https://api.openai.com/v1
    api_key_env: str | None = None  # the environment variable holding the key
    timeout_s: float = Field(60.0, gt=0)
    models: tuple[ModelConfig, ...] = ()

    def api_key(self) -> SecretStr | None:
        """The key from the environment, wrapped so it never prints."""
        if self.api_key_env is None:
            return None
        value = os.environ.get(self.api_key_env)
        return SecretStr(value) if value else None


def _default_tiers() -> dict[str, tuple[str, ...]]:
    return {
        "critical": ("claude-sonnet-4.5", "gpt-4.1", "gemini-2.5-flash"),
        "high": ("gpt-4.1", "gemini-2.5-flash", "deepseek-v3.2"),
        "normal": ("gemini-2.5-flash", "deepseek-v3.2"),
        "low": ("deepseek-v3.2", "gemini-2.5-flash"),
        "bulk": ("deepseek-v3.2",),
    }


class RoutingConfig(BaseModel):
    """How `model: "auto"` is resolved. Each tier lists models best first; a job falls back along
    its tier when a model keeps failing, and steps down towards the cheap end when budget runs low."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    tiers: dict[str, tuple[str, ...]] = Field(default_factory=_default_tiers)
    embedding_model: str = "text-embedding-3-small"
    long_context_model: str | None = "gemini-2.5-flash"
    long_context_tokens: int = Field(100_000, gt=0)  # estimated input above this → long context
    low_budget_fraction: float = Field(0.2, ge=0, le=1)  # below this share left → cheaper models
    fallback_after_failures: int = Field(2, ge=1)  # consecutive failures of a model before fallback

    @model_validator(mode="after")
    def _tiers_named_by_priority(self) -> RoutingConfig:
        for name in self.tiers:
            Priority.parse(name)
        return self


class BudgetConfig(BaseModel):
    """Daily budgets (UTC days). None means unlimited."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    global_daily_usd: Decimal | None = Field(None, ge=0)
    tenant_daily_usd: dict[str, Decimal] = Field(default_factory=dict)
    default_tenant_daily_usd: Decimal | None = Field(None, ge=0)
    # What a job the budget has no room for today does (see tidegate.coord.budget): wait for
    # budget to free up, end dead at once, or first try the cheapest model that fits.
    on_exhausted: Literal["defer", "reject", "step_down"] = "defer"
    defer_s: float = Field(300.0, gt=0)  # how long a deferred job waits before it tries again
    # How long a job may wait for budget in all, from its creation, before it ends dead: longer
    # than a day, so at least one daily reset passes.
    defer_max_s: float = Field(90_000.0, gt=0)


class CallbackConfig(BaseModel):
    """Result callbacks: signed POSTs to the job's callback_url."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    secret_env: str = "TIDEGATE_CALLBACK_SECRET"
    allow_private: bool = False  # loopback, private and link-local targets are refused unless set
    max_attempts: int = Field(5, ge=1)
    timeout_s: float = Field(10.0, gt=0)


class RefreshRule(BaseModel):
    """An AI refresh rule of the change flow: when one of `columns` of an `entity_type` row
    changes (or the row is inserted), enqueue an embedding of `text` (a format string over the
    row's columns) at `priority`. Jobs carry an idempotency key derived from (entity, version),
    so a replayed change never enqueues twice."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    entity_type: str = Field(min_length=1)
    columns: tuple[str, ...] = Field(min_length=1)
    text: str = Field(min_length=1)  # e.g. "{name}\n{description}"
    priority: Priority = Priority.LOW
    model: str | None = None  # None: the routing's embedding model
    tenant: str = "tidegate-sync"


class SyncConfig(BaseModel):
    """The change flow: where changes come from, travel and land."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    source_url: str = "sqlite:///.tidegate/shop.db"  # or postgresql://user@host:port/db
    bus_url: str = "memory://"  # redis://… (Streams) or kafka://host:port
    cache_url: str = "memory://"  # or redis://…
    tables: tuple[str, ...] = ("products", "users", "interactions")
    slot: str = Field("tidegate", pattern=r"^[a-z0-9_]+$")  # PostgreSQL replication slot
    publication: str = Field("tidegate", pattern=r"^[a-z0-9_]+$")
    prefix: str = Field("tidegate", pattern=r"^[A-Za-z0-9_.-]+$")  # bus topics and cache keys
    group: str = Field("tidegate-sync", min_length=1)  # the pipeline's consumer group on the bus
    source_timezone: str = "UTC"  # the zone naive timestamps of the source are read in
    heartbeat_s: float | None = Field(10.0, gt=0)  # PostgreSQL: keeps an idle slot from pinning WAL
    tombstone_ttl_s: float = Field(86_400.0, gt=0)  # how late a change may arrive after a delete
    entry_ttl_s: float | None = Field(None, gt=0)
    batch_size: int = Field(500, ge=1)
    refresh: tuple[RefreshRule, ...] = ()


def default_models() -> tuple[ModelConfig, ...]:
    """The shipped price table (USD per 1M tokens); input prices are configurable."""
    return (
        ModelConfig(name="deepseek-v3.2", input_usd_per_1m=Decimal("0.28"),
                    output_usd_per_1m=Decimal("0.42"), rpm=3000, tpm=2_000_000),
        ModelConfig(name="gemini-2.5-flash", input_usd_per_1m=Decimal("0.30"),
                    output_usd_per_1m=Decimal("2.50"), rpm=2000, tpm=4_000_000,
                    context_tokens=1_048_576),
        ModelConfig(name="gpt-4.1", input_usd_per_1m=Decimal("2.00"),
                    output_usd_per_1m=Decimal("8.00"), rpm=1000, tpm=1_000_000,
                    context_tokens=1_047_576),
        ModelConfig(name="claude-sonnet-4.5", input_usd_per_1m=Decimal("3.00"),
                    output_usd_per_1m=Decimal("15.00"), rpm=1000, tpm=800_000,
                    context_tokens=200_000),
        ModelConfig(name="text-embedding-3-small", input_usd_per_1m=Decimal("0.02"),
                    output_usd_per_1m=Decimal("0"), rpm=3000, tpm=5_000_000,
                    context_tokens=8_192, kind="embeddings"),
    )


class TidegateConfig(BaseSettings):
    """Everything a tidegate process needs; see the module docstring for where it comes from."""

    model_config = SettingsConfigDict(
        env_prefix="TIDEGATE_", env_nested_delimiter="__", extra="forbid", frozen=True
    )

    queue_url: str = "sqlite:///.tidegate/tidegate.db"
    providers: tuple[ProviderConfig, ...] = ()
    routing: RoutingConfig = Field(default_factory=RoutingConfig)
    budgets: BudgetConfig = Field(default_factory=BudgetConfig)
    callbacks: CallbackConfig = Field(default_factory=CallbackConfig)
    sync: SyncConfig = Field(default_factory=SyncConfig)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        path = Path(os.environ.get("TIDEGATE_CONFIG", DEFAULT_CONFIG_FILE))
        return (init_settings, env_settings, TomlConfigSettingsSource(settings_cls, toml_file=path))

    @classmethod
    def load(cls, **overrides: Any) -> TidegateConfig:
        """Read the file and environment; keyword overrides win."""
        return cls(**overrides)

    def with_simulator(self, base_url: str) -> TidegateConfig:
        """This config with the simulated provider serving the default models, for when no real
        provider is configured (demo, tests, benchmarks)."""
        simulated = ProviderConfig(name=SIMULATED_PROVIDER, base_url=base_url, models=default_models())
        return self.model_copy(update={"providers": (simulated,)})

    def find_model(self, name: str) -> tuple[ProviderConfig, ModelConfig] | None:
        """The first provider serving a model of that name."""
        for provider in self.providers:
            for model in provider.models:
                if model.name == name:
                    return provider, model
        return None
