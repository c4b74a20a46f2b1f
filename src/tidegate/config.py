"""Typed settings of a tidegate deployment: `tidegate.toml` (or the file named by
TIDEGATE_CONFIG) overlaid by `TIDEGATE_*` environment variables (nested with `__`).

Every settings object of a process lives here as a section of `TidegateConfig`, so each can be set
from the file and the environment: `[worker]`, `[gateway]`, `[up]`, `[recs]`, `[tracing]`, `[storage]`,
`[sync.pipeline]` and `[sync.verify]` beside the providers, routing, budgets, callbacks and change
flow. A command's flags go over a section with `Section.given`.

Money is configured in USD (decimals, never floats) and kept internally as integer micro-dollars.
API keys are never stored here: a provider names the environment variable that holds its key.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from decimal import Decimal
from pathlib import Path
from typing import Annotated, Any, Literal, Self

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    ValidatorFunctionWrapHandler,
    field_validator,
    model_validator,
)
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from tidegate.errors import ConfigError
from tidegate.jobs import Priority

DEFAULT_CONFIG_FILE = "tidegate.toml"

ServiceTier = Literal["auto", "default", "flex", "priority"]
"""The processing tiers of OpenAI's `service_tier` field a caller may ask for. `auto` lets the
provider choose (the project's setting, usually `default`)."""
PricedTier = Literal["default", "flex", "priority"]
"""A tier a call can be billed at (`auto` resolves to one of them)."""
NativeApi = Literal["responses"]
"""A client API an OpenAI-compatible upstream may serve natively (`ProviderConfig.native_apis`)."""


class TierPrice(BaseModel):
    """A model's prices at one service tier (USD per 1M tokens)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    input_usd_per_1m: Decimal = Field(ge=0)  # USD per 1M input tokens
    output_usd_per_1m: Decimal = Field(ge=0)  # USD per 1M output tokens
    # USD per 1M input tokens read from the prompt cache at this tier; unset: the input price above.
    cached_input_usd_per_1m: Decimal | None = Field(None, ge=0)


class ModelConfig(BaseModel):
    """One model a provider serves, with its prices and limits."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(min_length=1)  # what callers and routing tiers name it
    input_usd_per_1m: Decimal = Field(ge=0)  # USD per 1M input tokens
    output_usd_per_1m: Decimal = Field(ge=0)  # USD per 1M output tokens (reasoning tokens included)
    # Prompt caching (tidegate.costs): USD per 1M input tokens read from the provider's cache
    # (OpenAI's cached input, Anthropic's cache hits); unset, they cost the input price, which
    # over-estimates them (providers bill them at a tenth to a half of it).
    cached_input_usd_per_1m: Decimal | None = Field(None, ge=0)
    # USD per 1M input tokens written to Anthropic's 5-minute and 1-hour caches; unset, the input
    # price times Anthropic's published multipliers, 1.25 and 2.
    cache_write_5m_usd_per_1m: Decimal | None = Field(None, ge=0)
    cache_write_1h_usd_per_1m: Decimal | None = Field(None, ge=0)
    rpm: int | None = Field(None, gt=0)  # requests per minute; None = no limit known
    tpm: int | None = Field(None, gt=0)  # tokens (input + output) per minute
    # The window rpm and tpm count over. Providers state limits per minute; a shorter window
    # suits a simulator in tests.
    rate_window_s: float = Field(60.0, gt=0)
    max_concurrency: int = Field(64, gt=0)  # calls in flight to this model, per worker
    context_tokens: int = Field(128_000, gt=0)  # its context window, in tokens
    # The endpoint it is called at: chat completions, embeddings, or OpenAI's legacy completions
    # (`completion`, e.g. gpt-3.5-turbo-instruct) and moderations (`moderation`). A provider
    # offers /v1/completions or /v1/moderations by serving a model of that kind.
    kind: Literal["chat", "embeddings", "completion", "moderation"] = "chat"
    # Prices at other service tiers than `default` (whose prices are the ones above), e.g.
    # {flex = {input_usd_per_1m = 1.0, output_usd_per_1m = 4.0, cached_input_usd_per_1m = 0.25}};
    # a tier not listed costs the default prices times the provider's `tier_price_factors`, else
    # the default prices.
    tier_prices: dict[PricedTier, TierPrice] = Field(default_factory=dict)


class ProviderBatchConfig(BaseModel):
    """When a provider's own batch API (OpenAI's Files + Batch, or Anthropic's Message Batches
    for an `api = "anthropic"` provider: half the price, answered within 24 h) serves a job
    instead of a live call (`tidegate.dispatch.provider_batches`).

    A job goes there when its priority is in `priorities`, its kind in `kinds`, it does not
    stream, and its deadline is set and at least `min_deadline_s` away when it is claimed. A
    worker gathers such jobs for up to `gather_s` (or `max_lines` of them) into one provider batch,
    then looks at the batch every `poll_s` until it ended. `discount` is the batch's price factor.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    discount: Decimal = Field(Decimal("0.5"), ge=0)  # the batch price, as a share of the default prices
    min_deadline_s: float = Field(86_400.0, ge=0)  # only jobs whose deadline is at least this far
    priorities: tuple[str, ...] = ("bulk",)  # levels that may go (never critical or high)
    kinds: tuple[Literal["chat", "embeddings"], ...] = ("chat", "embeddings")  # job kinds that may go
    max_lines: int = Field(1000, ge=1, le=50_000)  # OpenAI takes up to 50,000 lines a batch
    gather_s: float = Field(2.0, gt=0)  # how long a worker gathers jobs into one batch
    poll_s: float = Field(60.0, gt=0)  # how often a batch is looked at until it ended
    completion_window: str = "24h"  # the window asked of the provider

    @field_validator("priorities")
    @classmethod
    def _levels_by_name(cls, priorities: tuple[str, ...]) -> tuple[str, ...]:
        levels = tuple(Priority.parse(name) for name in priorities)
        urgent = [level.name.lower() for level in levels if level <= Priority.HIGH]
        if urgent:  # a day's wait is never what an urgent job is for
            raise ValueError(f"{', '.join(urgent)} jobs are always served live, not by a provider batch")
        return tuple(level.name.lower() for level in levels)

    def admits(self, priority: Priority) -> bool:
        """Whether jobs at `priority` may go to a provider batch."""
        return priority.name.lower() in self.priorities


class ProviderConfig(BaseModel):
    """An upstream: OpenAI-compatible (`api = "openai"`, the default) or Anthropic's Messages API
    (`api = "anthropic"`, its base_url e.g. https://api.anthropic.com/v1).

    `service_tiers` is the tier policy: the `service_tier` sent for a job whose caller named none,
    by the job's priority (e.g. {critical = "priority", bulk = "flex"}); empty (the default), no
    tier is sent that the caller did not ask for. `tier_price_factors` prices a tier for every
    model without prices of its own at that tier (OpenAI's flex: 0.5 of the default prices).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")  # names it in logs and metrics
    base_url: str = Field(min_length=1)  # e.g. https://api.openai.com/v1
    api: Literal["openai", "anthropic"] = "openai"  # the adapter that calls it (providers.adapters)
    api_key_env: str | None = None  # the environment variable holding the key
    timeout_s: float = Field(60.0, gt=0)  # one upstream call's timeout
    models: tuple[ModelConfig, ...] = ()
    # The tier sent by priority when the caller names none.
    service_tiers: dict[str, ServiceTier] = Field(default_factory=dict)
    # A tier's prices as a factor of the default ones.
    tier_price_factors: dict[PricedTier, Decimal] = Field(default_factory=dict)
    native_apis: tuple[NativeApi, ...] = ()  # client APIs it serves itself, passed through as written
    batch: ProviderBatchConfig | None = None  # None: this provider's batch API is not used

    @model_validator(mode="after")
    def _native_apis_of_openai(self) -> ProviderConfig:
        if self.native_apis and self.api != "openai":
            raise ValueError(f"native_apis {list(self.native_apis)} is for OpenAI-compatible upstreams "
                             f"(api = \"openai\"), not api = {self.api!r}")
        return self

    def speaks(self, api: str) -> bool:
        """Whether the upstream serves the client API `api` ("responses", "anthropic") natively."""
        return api in self.native_apis or (api == "anthropic" and self.api == "anthropic")

    @field_validator("service_tiers")
    @classmethod
    def _tiers_by_priority(cls, tiers: dict[str, ServiceTier]) -> dict[str, ServiceTier]:
        # Keyed by the level's name, so the file reads {critical = "priority"} and any spelling
        # Priority.parse takes ("CRITICAL", "0") means the same level.
        return {Priority.parse(name).name.lower(): tier for name, tier in tiers.items()}

    @field_validator("tier_price_factors")
    @classmethod
    def _positive_factors(cls, factors: dict[PricedTier, Decimal]) -> dict[PricedTier, Decimal]:
        for tier, factor in factors.items():
            if factor < 0:
                raise ValueError(f"the price factor of tier {tier!r} must be >= 0, not {factor}")
        return factors

    @model_validator(mode="after")
    def _batch_api_serves(self) -> ProviderConfig:
        # Anthropic's Message Batches answer Messages requests only, within 24 h.
        if self.batch is None or self.api != "anthropic":
            return self
        if "embeddings" in self.batch.kinds:
            raise ValueError(f"provider {self.name!r}: Anthropic has no embeddings, so its `batch` section "
                             "needs kinds = [\"chat\"]")
        if self.batch.completion_window != "24h":
            raise ValueError(f"provider {self.name!r}: Anthropic's Message Batches end within 24h, not "
                             f"completion_window = {self.batch.completion_window!r}")
        return self

    def tier_for(self, priority: Priority) -> ServiceTier | None:
        """The tier the policy sends for a job at `priority` whose caller named none."""
        return self.service_tiers.get(priority.name.lower())

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

    # Per priority, the models `auto` tries, best first.
    tiers: dict[str, tuple[str, ...]] = Field(default_factory=_default_tiers)
    embedding_model: str = "text-embedding-3-small"  # what embeddings with model `auto` use
    long_context_model: str | None = "gemini-2.5-flash"  # tried first for a long input
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

    global_daily_usd: Decimal | None = Field(None, ge=0)  # the whole deployment's, per UTC day
    tenant_daily_usd: dict[str, Decimal] = Field(default_factory=dict)  # by tenant name
    default_tenant_daily_usd: Decimal | None = Field(None, ge=0)  # for a tenant without one of its own
    # What a job the budget has no room for today does (see tidegate.coord.budget): wait for
    # budget to free up, end dead at once, or first try the cheapest model that fits.
    on_exhausted: Literal["defer", "reject", "step_down"] = "defer"
    defer_s: float = Field(300.0, gt=0)  # how long a deferred job waits before it tries again
    # How long a job may wait for budget in all, from its creation, before it ends dead: longer
    # than a day, so at least one daily reset passes.
    defer_max_s: float = Field(90_000.0, gt=0)

    @property
    def limited(self) -> bool:
        """Whether any daily budget is configured (a worker then needs a ledger of its own)."""
        return bool(self.global_daily_usd is not None or self.tenant_daily_usd
                    or self.default_tenant_daily_usd is not None)

    def tenant_limit_usd(self, tenant: str, own: Decimal | None = None) -> Decimal | None:
        """A tenant's daily budget, in the order the workers apply: its own (`own`, set in the
        tenant store) over the one configured for it, over the default."""
        if own is not None:
            return own
        return self.tenant_daily_usd.get(tenant, self.default_tenant_daily_usd)


class CallbackConfig(BaseModel):
    """Result callbacks: signed POSTs to the job's callback_url."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    secret_env: str = "TIDEGATE_CALLBACK_SECRET"  # the variable holding the signing secret
    allow_private: bool = False  # loopback, private and link-local targets are refused unless set
    max_attempts: int = Field(5, ge=1)  # deliveries tried before giving up
    timeout_s: float = Field(10.0, gt=0)  # one delivery's timeout


class Section(BaseModel):
    """A settings object of one part of tidegate: frozen, and unknown keys are refused."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    def given(self, **options: Any) -> Self:
        """This section with the options that are not None in place of its values, checked like
        the file's (a ConfigError names what is wrong): a command's flags (None: left out) over
        the file and environment."""
        update = {name: value for name, value in options.items() if value is not None}
        if not update:
            return self
        try:
            return self.model_validate({**self.model_dump(), **update})
        except ValidationError as exc:
            raise ConfigError(str(exc)) from None


class WorkerSettings(Section):
    """How one worker process behaves (`[worker]`)."""

    worker_id: str | None = Field(None, min_length=1)  # its name in leases and logs; None: one is made
    priorities: tuple[int, ...] | None = None  # levels served; None = all
    concurrency: int = Field(16, ge=1)  # calls in flight at most
    lease_s: float = Field(30.0, gt=0)  # a claimed job's lease, renewed while it runs
    # Longer pacing waits park the job instead of holding a slot. Short enough that jobs waiting
    # for a paced model cannot fill every slot (at 200 req/s, 0.2 s is ~40 waiters).
    pace_wait_max_s: float = Field(0.2, ge=0)
    shutdown_grace_s: float = Field(30.0, ge=0)  # on SIGTERM, how long calls in flight may finish
    claim_wait_s: float = Field(1.0, gt=0)  # a blocking claim's timeout (a stop ends its wait at once)
    model_cooldown_s: float = Field(30.0, ge=0)  # how long a model that keeps failing is skipped
    # Slots beyond `concurrency` that only jobs at `urgent_level` or more urgent may take. Under
    # overload every slot holds lower work waiting for the model's pacing, and an urgent job that
    # arrives would wait for one to free (one pacing interval, ~5 ms at 200 req/s, 20 ms at p99):
    # with a few slots of its own it is claimed at once and paced first. Lower work keeps all of
    # `concurrency` and never takes these (a slot lent to it is held for a whole call). None: a
    # sixteenth of `concurrency`, rounded down, at most 4 (1 of the default 16, 4 of 64 or more:
    # what a burst of urgent arrivals between two freed slots needs); 0: no reserve.
    urgent_reserve: int | None = Field(None, ge=0)
    urgent_level: Priority = Priority.HIGH  # the least urgent level that may use the reserve

    @field_validator("priorities")
    @classmethod
    def _known_levels(cls, levels: tuple[int, ...] | None) -> tuple[int, ...] | None:
        for level in levels or ():
            Priority(level)  # a ValueError names a level that does not exist
        return levels

    @field_validator("urgent_level", mode="before")
    @classmethod
    def _level_by_name(cls, level: object) -> Priority:
        return Priority.parse(level)

    @model_validator(mode="after")
    def _reserve_leaves_room(self) -> Self:
        if self.urgent_reserve is not None and self.urgent_reserve >= self.concurrency:
            raise ValueError(f"urgent_reserve ({self.urgent_reserve}) must be below concurrency "
                             f"({self.concurrency}): a few slots for urgent arrivals, not a second worker")
        return self

    def reserved_slots(self) -> int:
        """The slots kept for urgent levels on top of `concurrency`, always fewer than it (a copy
        made with a lower concurrency and no new validation is clamped here)."""
        wanted = min(self.concurrency // 16, 4) if self.urgent_reserve is None else self.urgent_reserve
        return max(min(wanted, self.concurrency - 1), 0)


class GatewaySettings(Section):
    """How a gateway listens and what it accepts (`[gateway]`; `TIDEGATE_GATEWAY_<NAME>` also
    sets one, as before it was a section of the file).

    `allow_unauthenticated_local`: while the gateway is bound to a loopback address and the
    tenant store holds no tenant and no key, requests are served as the built-in local tenant
    without an API key (embedded mode). Creating any tenant or key, or binding anything but
    loopback, makes a valid key mandatory.
    """

    host: str = "127.0.0.1"  # the address to bind; beyond loopback a key is required
    port: int = Field(8080, ge=0, le=65535)  # 0: any free port
    # How long a synchronous call (chat, embeddings) waits for its job before answering 504 with
    # the job id; a client may ask for another wait with X-Tidegate-Timeout, up to the maximum.
    request_timeout_s: float = Field(60.0, gt=0)
    max_request_timeout_s: float = Field(600.0, gt=0)
    # The longest long-poll of GET /v1/jobs/{id}?wait=
    max_wait_s: float = Field(60.0, gt=0)
    # Larger request bodies are refused with 413 before they are read in full. None: what the
    # queue takes as one job (its max_payload_bytes) plus BODY_ENVELOPE_BYTES for the request's
    # own fields; a value above that is lowered to it (see GatewayState.max_body_bytes), so no
    # body is read and parsed only for the queue to refuse it.
    max_body_bytes: int | None = Field(None, gt=0)
    max_messages: int = Field(1_000, gt=0)  # messages in one chat request
    max_batch: int = Field(1_000, gt=0)  # jobs in one POST /v1/jobs
    # The Files API: the largest upload (413 beyond), and the most lines one batch may have (as
    # OpenAI's Batch API: 50,000). A file is kept whole in the queue's backend, hence the bound.
    max_file_bytes: int = Field(100 * 1024 * 1024, gt=0)
    max_batch_lines: int = Field(50_000, gt=0)
    # How often, at most, a batch's progress is read from its jobs (each read costs one job read
    # per unfinished line); between two readings its stored counts answer.
    batch_progress_s: float = Field(1.0, ge=0)
    # Every gateway sweeps the batches in progress this often (up to `batch_sweep_limit` of them
    # a round, those checked longest ago first), so their answers are collected before the
    # queue's retention drops their jobs even when nobody asks about them; and deletes up to as
    # many expired files a round. Checked against the queue's `finished_ttl_s` at start.
    batch_sweep_s: float = Field(60.0, gt=0)
    batch_sweep_limit: int = Field(100, gt=0)
    # How long a batch's output and error files are kept (OpenAI's: 30 days); None: until deleted.
    batch_output_retention_s: int | None = Field(30 * 86_400, gt=0)
    # How long a `batch` upload without `expires_after` is kept (OpenAI's: 30 days); None: until
    # deleted. A batch in progress keeps its input past it (tidegate.gateway.batches.sweep).
    batch_upload_retention_s: int | None = Field(30 * 86_400, gt=0)
    allow_unauthenticated_local: bool = True  # see the section's description
    # How many recent results feed the p50/p99 figures of GET /v1/stats.
    stats_window: int = Field(2_000, gt=0)
    readiness_timeout_s: float = Field(2.0, gt=0)  # how long GET /readyz waits for the queue
    # Gateway processes on the one port (SO_REUSEPORT), one per core: each runs one event loop.
    processes: int = Field(1, ge=1)
    # One log line per request (uvicorn's access log). Off by default: it cost a tenth of the
    # gateway's CPU per call (BENCHMARKS.md), and /metrics counts every request by route and status.
    access_log: bool = False


class UpSettings(Section):
    """What `tidegate up` starts (`[up]`); the simulator it starts when no provider is configured
    is given to `run_up` apart."""

    host: str = "127.0.0.1"  # the address to bind; beyond loopback a key is required
    port: int = Field(8080, ge=0, le=65535)  # the gateway's port; 0: any free port
    concurrency: int = Field(32, ge=1)  # the in-process worker's calls in flight
    # On stop, how long calls still open may finish (the worker serving them meanwhile) before
    # the gateway cuts them (their jobs stay queued), and the worker its own calls before it
    # releases them: one grace for both, counted from the stop.
    shutdown_grace_s: float = Field(30.0, ge=0)
    # The change flow of `config.sync` beside the request flow (`tidegate up` points it at the
    # demo shop first: tidegate.demo.embedded).
    change_flow: bool = True
    # The admin key `up` serves with, given rather than made (TIDEGATE_ADMIN_KEY, or
    # TIDEGATE_UP__ADMIN_KEY): a tidegate key, tg_<12 hex>_<secret>, stored hashed at start. None:
    # `up` makes one at its first start and keeps it (tidegate.app.admin_key).
    admin_key: SecretStr | None = None


class StorageSettings(Section):
    """`[storage]`: how stores in an older format are opened. "auto" migrates them forward when
    they open (in one transaction); "check" refuses them, naming the store and both formats, for
    operators who run `tidegate migrate --apply` themselves. A store newer than the code is
    refused either way (TIDEGATE_STORAGE__MIGRATE)."""

    migrate: Literal["auto", "check"] = "auto"  # see the section's description


class TracingSettings(Section):
    """OpenTelemetry traces (`[tracing]`, or TIDEGATE_TRACING__ENABLED=true): off by default, and
    then nothing of OpenTelemetry is imported. On, each process exports its spans with OTLP over
    HTTP (`pip install 'tidegate[otel]'`) to `otlp_endpoint`, else to where the standard
    OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or OTEL_EXPORTER_OTLP_ENDPOINT variables point
    (http://localhost:4318 without either)."""

    enabled: bool = False  # export spans (needs the otel extra)
    otlp_endpoint: str | None = Field(None, min_length=1)  # the traces URL: http://host:4318/v1/traces
    service_name: str = Field("tidegate", min_length=1)  # the spans' service.name
    sample_ratio: float = Field(1.0, ge=0, le=1)  # of new traces; a caller's sampled flag is followed


# How much each kind of interaction weighs, keyed by the recommender's InteractionKind values
# (tidegate.recs.model, which checks that the two name the same kinds).
DEFAULT_KIND_WEIGHTS: Mapping[str, float] = {"view": 1.0, "add_to_cart": 3.0, "purchase": 5.0}

Count = Annotated[int, Field(ge=1)]
Weight = Annotated[float, Field(ge=0, allow_inf_nan=False)]
HalfLife = Annotated[float, Field(gt=0, allow_inf_nan=False)]


class RecsSettings(Section):
    """How the recommender weighs and decays its signals (`[recs]`). A value it cannot work with
    is refused with a ConfigError naming the setting."""

    dimension: Count = 64  # the size of item and profile vectors
    decay_hours: HalfLife = 24.0  # half-life of profiles and of the recent items' anchor weights
    # How much each interaction kind weighs.
    kind_weights: Mapping[str, Weight] = Field(default_factory=lambda: dict(DEFAULT_KIND_WEIGHTS))
    session_window_s: Weight = 1800.0  # items touched within this window co-occur
    recent_items: Count = 20  # per user, for co-occurrence and candidates
    max_neighbours: Count = 50  # per item
    # The blended score: weights of each normalised signal (documented in tidegate.recs.score).
    weight_profile: Weight = 0.5
    weight_co_occurrence: Weight = 0.35
    weight_trending: Weight = 0.15
    max_n: Count = 100  # the most items one query may ask for
    # Bounds of the shared state (added after the first release of this type; defaults keep the
    # earlier behaviour for every catalogue of up to this many items).
    max_trending: Count = 10_000  # items kept per trending list (global, each category)
    # The purchased set is exact: "exclude purchased" must never let a bought item through, and
    # a set entry is ~50 bytes, so even a wholesaler buying a whole catalogue of thousands of
    # items fits; this bound only protects the store from a runaway id stream.
    max_purchased: Count = 100_000  # purchases remembered per user (for "exclude purchased")
    # Half-lives of the shared signals (hours), apart from the profile's: a co-occurrence or a
    # sale is evidence about the items for weeks, whereas a profile follows a user's current
    # intent. Chosen on the validation month of bench/recs_quality.py (see BENCHMARKS.md).
    co_occurrence_decay_hours: HalfLife = 24.0 * 7
    trending_decay_hours: HalfLife = 24.0 * 7
    # Buy-again: per user, each purchased item's purchase count decayed with this half-life (a
    # re-order cycle is weeks to months), the `max_repeat` strongest kept; its weight in the
    # blended score applies only when purchased items are allowed (documented in score.py).
    repeat_decay_hours: HalfLife = 24.0 * 90
    weight_repeat: Weight = 2.0
    max_repeat: Count = 1000

    @field_validator("kind_weights")
    @classmethod
    def _every_kind_weighed(cls, weights: Mapping[str, float]) -> Mapping[str, float]:
        missing = [kind for kind in DEFAULT_KIND_WEIGHTS if kind not in weights]
        if missing:
            raise ValueError(f"needs a weight for every interaction kind; missing {', '.join(missing)}")
        return weights

    @model_validator(mode="wrap")
    @classmethod
    def _as_config_error(cls, data: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        # The recommender's callers catch ConfigError (a TidegateError), as they did when these
        # checks were written by hand.
        try:
            return handler(data)
        except ValidationError as exc:
            raise ConfigError("; ".join(
                f"recommender setting {'.'.join(map(str, error['loc']))}: {error['msg']}, "
                f"not {error['input']!r}" for error in exc.errors())) from None


def default_consumer_name() -> str:
    """A consumer name unique to this process on this host."""
    return f"{socket.gethostname()}-{os.getpid()}"


class PipelineSettings(Section):
    """How the pipeline batches and how far it lets the source run ahead of the sinks
    (`[sync.pipeline]`; `group` and `batch_size` default to `[sync]`'s)."""

    group: str = Field("tidegate-sync", min_length=1)  # the consumer group on the bus
    consumer: str = Field(default_factory=default_consumer_name, min_length=1)  # its name in the group
    # Changes published, and deliveries fetched and applied, together.
    batch_size: int = Field(500, ge=1)
    # Published, not yet applied: the producer waits beyond this.
    max_pending_changes: int = Field(20_000, ge=1)
    fetch_timeout_s: float = Field(0.5, gt=0)  # the longest wait for deliveries in one fetch
    # On stop: how long to let the consumer apply what is in flight.
    drain_timeout_s: float = Field(10.0, ge=0)
    # How often the source's status (slot, lag) feeds the metrics.
    status_interval_s: float = Field(5.0, gt=0)
    # Once the snapshot is applied and the stream caught up, freeze the loaded heap out of the
    # garbage collector's reach (tidegate._eventloop.freeze_loaded; only in tidegate's processes).
    freeze_loaded: bool = True


class VerifySettings(Section):
    """How hard and how long `sync verify` looks (`[sync.verify]`)."""

    batch_size: int = Field(1000, ge=1)  # rows read and compared at once
    max_rows_per_s: float | None = Field(20_000.0, gt=0)  # None: as fast as the database answers
    # The longest wait, per round, for the sync to apply a position.
    settle_timeout_s: float = Field(60.0, gt=0)
    rounds: int = Field(3, ge=1)  # looks at a suspect after the pass
    repair: bool = False  # write drifted rows as the database holds them
    examples: int = Field(5, ge=0)  # entity ids kept per kind in the report


class RefreshRule(BaseModel):
    """An AI refresh rule of the change flow: when one of `columns` of an `entity_type` row
    changes (or the row is inserted), enqueue an embedding of `text` (a format string over the
    row's columns) at `priority`. Jobs carry an idempotency key derived from (entity, version),
    so a replayed change never enqueues twice."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    entity_type: str = Field(min_length=1)  # the table whose changes trigger it
    columns: tuple[str, ...] = Field(min_length=1)  # a change to any of these (or an insert) triggers it
    text: str = Field(min_length=1)  # e.g. "{name}\n{description}"
    priority: Priority = Priority.LOW  # of the embedding jobs
    model: str | None = None  # None: the routing's embedding model
    tenant: str = "tidegate-sync"  # the jobs' tenant (budgets, metrics)


class SyncConfig(BaseModel):
    """The change flow: where changes come from, travel and land."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    source_url: str = "sqlite:///.tidegate/shop.db"  # or postgresql://user@host:port/db
    bus_url: str = "memory://"  # redis://… (Streams) or kafka://host:port
    cache_url: str = "memory://"  # or redis://…
    tables: tuple[str, ...] = ("products", "users", "interactions")  # the tables followed
    slot: str = Field("tidegate", pattern=r"^[a-z0-9_]+$")  # PostgreSQL replication slot
    publication: str = Field("tidegate", pattern=r"^[a-z0-9_]+$")  # PostgreSQL publication
    prefix: str = Field("tidegate", pattern=r"^[A-Za-z0-9_.-]+$")  # bus topics and cache keys
    group: str = Field("tidegate-sync", min_length=1)  # the pipeline's consumer group on the bus
    source_timezone: str = "UTC"  # the zone naive timestamps of the source are read in
    heartbeat_s: float | None = Field(10.0, gt=0)  # PostgreSQL: keeps an idle slot from pinning WAL
    tombstone_ttl_s: float = Field(86_400.0, gt=0)  # how late a change may arrive after a delete
    entry_ttl_s: float | None = Field(None, gt=0)  # cached rows expire after this; None: never
    batch_size: int = Field(500, ge=1)  # the default of [sync.pipeline] batch_size
    refresh: tuple[RefreshRule, ...] = ()
    pipeline: PipelineSettings = Field(default_factory=PipelineSettings)
    verify: VerifySettings = Field(default_factory=VerifySettings)

    @model_validator(mode="before")
    @classmethod
    def _pipeline_follows_sync(cls, data: Any) -> Any:
        # `group` and `batch_size` were the pipeline's settings in `[sync]` before it had a
        # section: they stay its defaults, and `[sync.pipeline]` wins where it sets them too.
        if not isinstance(data, dict) or isinstance(data.get("pipeline"), PipelineSettings):
            return data
        pipeline = dict(data.get("pipeline") or {})
        for name in ("group", "batch_size"):
            if name in data:
                pipeline.setdefault(name, data[name])
        return {**data, "pipeline": pipeline}


class TidegateConfig(BaseSettings):
    """Everything a tidegate process needs; see the module docstring for where it comes from."""

    model_config = SettingsConfigDict(
        env_prefix="TIDEGATE_", env_nested_delimiter="__", extra="forbid", frozen=True
    )

    # sqlite:///path/to/file.db, redis://host:port/db or redis+cluster://host:port; the query holds
    # the queue's own options (tidegate.queue.settings.QueueSettings).
    queue_url: str = "sqlite:///.tidegate/tidegate.db"
    providers: tuple[ProviderConfig, ...] = ()
    routing: RoutingConfig = Field(default_factory=RoutingConfig)
    budgets: BudgetConfig = Field(default_factory=BudgetConfig)
    callbacks: CallbackConfig = Field(default_factory=CallbackConfig)
    sync: SyncConfig = Field(default_factory=SyncConfig)
    worker: WorkerSettings = Field(default_factory=WorkerSettings)
    gateway: GatewaySettings = Field(default_factory=GatewaySettings)
    up: UpSettings = Field(default_factory=UpSettings)
    recs: RecsSettings = Field(default_factory=RecsSettings)
    tracing: TracingSettings = Field(default_factory=TracingSettings)
    storage: StorageSettings = Field(default_factory=StorageSettings)

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
        return (init_settings, env_settings, _GatewayEnv(settings_cls), _AdminKeyEnv(settings_cls),
                TomlConfigSettingsSource(settings_cls, toml_file=path))

    @classmethod
    def load(cls, **overrides: Any) -> TidegateConfig:
        """Read the file and environment; keyword overrides win. A value that cannot work, or a
        key no section knows, is a ConfigError naming it."""
        try:
            return cls(**overrides)
        except ValidationError as exc:
            path = os.environ.get("TIDEGATE_CONFIG", DEFAULT_CONFIG_FILE)
            raise ConfigError(f"invalid configuration ({path} and TIDEGATE_* variables): {exc}") from None

    def find_model(self, name: str) -> tuple[ProviderConfig, ModelConfig] | None:
        """The first provider serving a model of that name."""
        for provider in self.providers:
            for model in provider.models:
                if model.name == name:
                    return provider, model
        return None


class _GatewayEnv(PydanticBaseSettingsSource):
    """`TIDEGATE_GATEWAY_<NAME>`: the variables GatewaySettings read on its own before it was a
    section of the file. Below TIDEGATE_GATEWAY__<NAME> (the nested spelling), above the file."""

    PREFIX = "tidegate_gateway_"

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        """Unused: `__call__` reads the variables of the whole section at once."""
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        names = set(GatewaySettings.model_fields)
        found = {key.lower().removeprefix(self.PREFIX): value for key, value in os.environ.items()
                 if key.lower().startswith(self.PREFIX)}
        given = {name: value for name, value in found.items() if name in names}
        return {"gateway": given} if given else {}


class _AdminKeyEnv(PydanticBaseSettingsSource):
    """`TIDEGATE_ADMIN_KEY`: `up.admin_key` under the short name operators look for. Below
    TIDEGATE_UP__ADMIN_KEY (the nested spelling), above the file."""

    NAME = "TIDEGATE_ADMIN_KEY"

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        """Unused: `__call__` reads the one variable."""
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        value = os.environ.get(self.NAME)
        return {"up": {"admin_key": value}} if value else {}
