"""The demo's world: how the simulated provider's models behave, which tenants exist and what they
may do, which requests they send at which priority, and when.

The provider's limits are set here once, in the simulator's settings; `tidegate up` copies them
into the worker's config (`up.with_simulator_limits`), as a real deployment copies its provider's
published limits, so the worker paces under exactly the limits the provider enforces.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from tidegate.config import BudgetConfig, CallbackConfig, RoutingConfig, SyncConfig, TidegateConfig
from tidegate.jobs import Priority
from tidegate.simulator.settings import ModelBehaviour, SimulatorSettings

__all__ = [
    "BUDGET_TENANT",
    "DENIED_MODEL",
    "PROFILES",
    "TENANTS",
    "Arrivals",
    "DemoSettings",
    "DemoTenant",
    "Mode",
    "ModelProfile",
    "Phase",
    "Planned",
    "Workload",
    "budget_for",
    "demo_config",
    "estimated_capacity_per_s",
    "simulator_settings",
]

Z99 = 2.3263478740408408  # the standard normal's 99th percentile
MAX_TOKENS = 300
# The worker's own time per call besides the provider's latency (queue writes, budget, HTTP), on
# a small laptop-class machine; only used to estimate the capacity shown in the live view.
OVERHEAD_PER_CALL_S = 0.01
# The budget tenant's daily budget per request the run plans to send: a little less than what
# its share of them costs at full price, so the router steps it down to cheaper models part way
# through (and may refuse it near the end). Reservations count as spent until settled and reserve the
# most a call can cost (max_tokens of output), so a small run still needs room for those.
BUDGET_USD_PER_REQUEST = Decimal("0.00005")
MIN_BUDGET_USD = Decimal("0.01")

Mode = Literal["sync", "stream", "async"]
Kind = Literal["chat", "embeddings"]


class DemoSettings(BaseModel):
    """How long and how busy a demo run is. The defaults are what `tidegate demo` runs."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    duration_s: float = Field(60.0, gt=0)  # the whole run: load, then the drain
    # Mean arrivals over the load, in requests (a batch counts its jobs).
    rate_per_s: float = Field(40.0, gt=0)
    concurrency: int = Field(6, ge=1)  # the worker's calls in flight: what bounds the capacity
    latency_scale: float = Field(1.0, gt=0)  # multiplies every model's latency (tests run faster)
    # Share of provider calls answered 503 (retried by the worker).
    error_rate: float = Field(0.01, ge=0, le=1)
    seed: int = 7
    refresh_s: float = Field(0.5, gt=0)  # how often the gateway's stats are read (and the live view redrawn)
    load_share: float = Field(0.8, gt=0, le=1)  # share of the duration during which requests arrive
    # The shop's own writes meanwhile (captured by the change flow, fed to the recommender):
    # ShopLoad's mix at this rate, and a click of the demo user this often.
    shop_rate_per_s: float = Field(8.0, ge=0)
    click_every_s: float = Field(1.5, ge=0)

    @property
    def load_s(self) -> float:
        """How long requests keep arriving."""
        return self.duration_s * self.load_share


# ---------------------------------------------------------------------- the provider


@dataclass(frozen=True, slots=True)
class ModelProfile:
    """How one simulated model answers, and the provider's request limit for it."""

    latency_ms: float  # median
    latency_p99_ms: float
    rpm: int  # requests per minute

    def mean_latency_s(self, scale: float) -> float:
        """The mean of the simulator's lognormal latency with this median and p99."""
        sigma = math.log(self.latency_p99_ms / self.latency_ms) / Z99
        return self.latency_ms * scale * math.exp(sigma * sigma / 2) / 1000


PROFILES: dict[str, ModelProfile] = {
    "claude-sonnet-4.5": ModelProfile(220, 900, rpm=1_200),
    "gpt-4.1": ModelProfile(180, 700, rpm=3_000),
    "gemini-2.5-flash": ModelProfile(120, 450, rpm=6_000),
    "deepseek-v3.2": ModelProfile(150, 600, rpm=6_000),
    # The bulk backfill's model: its limit is below what the surge sends, so that surge is paced.
    "text-embedding-3-small": ModelProfile(40, 160, rpm=1_800),
}


def simulator_settings(settings: DemoSettings) -> SimulatorSettings:
    """The simulated provider: per-model latency and request limits, a few 503s."""
    models = {
        name: {"latency_ms": profile.latency_ms * settings.latency_scale,
               "latency_p99_ms": profile.latency_p99_ms * settings.latency_scale,
               "rpm": profile.rpm}
        for name, profile in PROFILES.items()
    }
    defaults = ModelBehaviour(completion_tokens=120, completion_tokens_p99=500,
                              unavailable_rate=settings.error_rate)
    return SimulatorSettings(seed=settings.seed, window_s=60.0, defaults=defaults, models=models)


def demo_config(queue_url: str, shop_url: str) -> TidegateConfig:
    """What `tidegate up` runs for the demo: no provider (so the simulator), default routing,
    budgets refused, not deferred, once spent, so a run never waits for a budget that only
    resets at midnight, and the demo shop at `shop_url` for the change flow. Every field is
    given, so a tidegate.toml in the working folder or TIDEGATE_* variables cannot change what
    the demo shows."""
    return TidegateConfig(queue_url=queue_url, providers=(), routing=RoutingConfig(),
                          budgets=BudgetConfig(on_exhausted="reject"), callbacks=CallbackConfig(),
                          sync=SyncConfig(source_url=shop_url))


# ---------------------------------------------------------------------- tenants


@dataclass(frozen=True, slots=True)
class DemoTenant:
    """A tenant the demo creates through the admin API."""

    name: str
    max_priority: Priority
    default_priority: Priority
    allowed_models: tuple[str, ...] | None = None
    budgeted: bool = False  # gets the run's small daily budget

    def body(self, budget_usd: Decimal) -> dict[str, Any]:
        """The PUT /v1/admin/tenants/{name} body."""
        return {"max_priority": self.max_priority.name.lower(),
                "default_priority": self.default_priority.name.lower(),
                "daily_budget_usd": str(budget_usd) if self.budgeted else None,
                "allowed_models": None if self.allowed_models is None else list(self.allowed_models)}


BUDGET_TENANT = "initech"
# umbrella may use the cheap models only; now and then it names another one and is refused (403).
DENIED_MODEL = "gpt-4.1"
TENANTS: tuple[DemoTenant, ...] = (
    DemoTenant("acme", Priority.CRITICAL, Priority.HIGH),
    DemoTenant("globex", Priority.HIGH, Priority.NORMAL),
    DemoTenant("umbrella", Priority.NORMAL, Priority.LOW,
               allowed_models=("gemini-2.5-flash", "deepseek-v3.2", "text-embedding-3-small")),
    DemoTenant(BUDGET_TENANT, Priority.HIGH, Priority.NORMAL, budgeted=True),
)


def budget_for(planned_requests: int) -> Decimal:
    """The budget tenant's daily budget for a run of `planned_requests`."""
    return max(MIN_BUDGET_USD, (BUDGET_USD_PER_REQUEST * planned_requests).quantize(Decimal("0.0001")))


# ---------------------------------------------------------------------- what is sent

# Share of requests per level, in percent: a little urgent work, a long tail of background work.
MIX: dict[Priority, int] = {
    Priority.CRITICAL: 2,
    Priority.HIGH: 8,
    Priority.NORMAL: 20,
    Priority.LOW: 25,
    Priority.BULK: 45,
}
# The model each level usually lands on (the first of its routing tier; bulk jobs are embeddings).
USUAL_MODEL: dict[Priority, str] = {
    Priority.CRITICAL: "claude-sonnet-4.5",
    Priority.HIGH: "gpt-4.1",
    Priority.NORMAL: "gemini-2.5-flash",
    Priority.LOW: "deepseek-v3.2",
    Priority.BULK: "text-embedding-3-small",
}
STREAM_EVERY = 5  # of high and normal chat calls, one in this many is streamed
EMBED_EVERY = 4  # of normal calls, one in this many is an embedding (a search query)
DENIED_EVERY = 150  # one request in this many names a model its tenant may not use

_WORDS = ("order", "refund", "shipping", "invoice", "account", "password", "delivery", "size",
          "colour", "warranty", "discount", "basket", "payment", "card", "address", "return",
          "product", "review", "stock", "price", "customer", "cotton", "leather", "battery")
_TASKS: dict[Priority, str] = {
    Priority.CRITICAL: "Decide whether this checkout looks fraudulent and say why in one line.",
    Priority.HIGH: "Reply to this customer in the support chat.",
    Priority.NORMAL: "Summarise this support ticket for the next agent.",
    Priority.LOW: "Tag this product review with topics and a sentiment.",
    Priority.BULK: "Write a one-line product description.",
}


@dataclass(frozen=True, slots=True)
class Planned:
    """One request the load generator sends: a synchronous call (streamed or not) or one job of
    an asynchronous batch (POST /v1/jobs, then polled)."""

    number: int  # 1, 2, ... in the order planned
    mode: Mode
    kind: Kind
    priority: Priority
    tenant: str
    body: dict[str, Any]  # the OpenAI-style request body


class Workload:
    """A seeded, endless stream of demo requests: the mix of priorities, tenants and calls.

    It opens with one request of each kind and level and one refused request, so that even a
    run of a few seconds shows every level, a stream, an embedding, async jobs and a 403."""

    def __init__(self, seed: int) -> None:
        self._rng = random.Random(seed)
        self._levels = [p for p, share in MIX.items() for _ in range(share)]
        self._count = 0
        self._by_level: dict[Priority, int] = dict.fromkeys(Priority, 0)

    def take(self, n: int) -> list[Planned]:
        """The next `n` requests."""
        return [self._next() for _ in range(n)]

    def _next(self) -> Planned:
        self._count += 1
        opening = (Priority.CRITICAL, Priority.HIGH, Priority.NORMAL, Priority.LOW, Priority.BULK)
        if self._count <= len(opening):
            priority = opening[self._count - 1]
        elif self._count % DENIED_EVERY == len(opening) + 1:
            return self._denied()
        else:
            priority = self._rng.choice(self._levels)
        self._by_level[priority] += 1
        nth = self._by_level[priority]
        tenant = self._rng.choice([t.name for t in TENANTS if t.max_priority <= priority])
        if self._count <= len(opening):
            tenant = TENANTS[0].name  # no budget, every model: the opening is always answered
        if priority is Priority.BULK:
            return self._planned("async", "embeddings", priority, tenant, self._embedding())
        if priority is Priority.LOW:
            mode: Mode = "async" if nth % 2 else "sync"
            return self._planned(mode, "chat", priority, tenant, self._chat(priority))
        if priority is Priority.NORMAL and nth % EMBED_EVERY == 1:
            return self._planned("sync", "embeddings", priority, tenant, self._embedding())
        streamed = priority in (Priority.HIGH, Priority.NORMAL) and nth % STREAM_EVERY == 1
        return self._planned("stream" if streamed else "sync", "chat", priority, tenant,
                             self._chat(priority, stream=streamed))

    def _denied(self) -> Planned:
        body = {**self._chat(Priority.NORMAL), "model": DENIED_MODEL}
        return self._planned("sync", "chat", Priority.NORMAL, "umbrella", body)

    def _planned(self, mode: Mode, kind: Kind, priority: Priority, tenant: str,
                 body: dict[str, Any]) -> Planned:
        return Planned(self._count, mode, kind, priority, tenant, body)

    def _chat(self, priority: Priority, *, stream: bool = False) -> dict[str, Any]:
        messages = [{"role": "system", "content": _TASKS[priority]},
                    {"role": "user", "content": self._text(40, 300)}]
        body: dict[str, Any] = {"model": "auto", "messages": messages, "max_tokens": MAX_TOKENS}
        if stream:
            body["stream"] = True
        return body

    def _embedding(self) -> dict[str, Any]:
        return {"model": "auto", "input": f"Product: {self._text(30, 120)}"}

    def _text(self, low: int, high: int) -> str:
        return " ".join(self._rng.choices(_WORDS, k=self._rng.randint(low, high)))


# ---------------------------------------------------------------------- arrivals

# The load, as (end of phase as a share of the load time, arrival rate as a multiple of the mean,
# name): under capacity, then a surge well over it (the backlog forms), then quiet (it drains).
_SHAPE: tuple[tuple[float, float, str], ...] = ((0.25, 0.6, "steady"), (0.60, 1.7, "surge"),
                                                (1.00, 0.4, "quiet"))
_MEAN_FACTOR = sum((end - start) * factor for (start, _, _), (end, factor, _)
                   in zip(((0.0, 0.0, ""), *_SHAPE[:-1]), _SHAPE, strict=True))
PHASES: tuple[tuple[float, float, str], ...] = tuple(
    (end, factor / _MEAN_FACTOR, name) for end, factor, name in _SHAPE)


@dataclass(frozen=True, slots=True)
class Phase:
    """Where the load is: its name and the arrival rate now."""

    name: str
    rate_per_s: float


class Arrivals:
    """The load's schedule: how many requests are due by a given time."""

    def __init__(self, load_s: float, rate_per_s: float) -> None:
        self.load_s = load_s
        self.rate_per_s = rate_per_s

    def phase(self, t_s: float) -> Phase:
        """The phase at `t_s` seconds into the run ("drain" after the load)."""
        share = t_s / self.load_s
        for end, factor, name in PHASES:
            if share < end:
                return Phase(name, factor * self.rate_per_s)
        return Phase("drain", 0.0)

    def due(self, t_s: float) -> int:
        """Requests due by `t_s`: the integral of the rate, whole requests."""
        total, start = 0.0, 0.0
        for end, factor, _ in PHASES:
            stop = min(end, max(t_s / self.load_s, 0.0))
            if stop > start:
                total += (stop - start) * self.load_s * factor * self.rate_per_s
            start = end
        return int(total + 1e-9)

    @property
    def planned(self) -> int:
        """Requests the whole run sends."""
        return self.due(self.load_s)


def estimated_capacity_per_s(settings: DemoSettings) -> float:
    """Calls per second the worker can finish, roughly: its concurrency over the time a call
    holds a slot (the mix's mean latency and the worker's own overhead)."""
    total = sum(MIX.values())
    mean_s = sum(share / total * PROFILES[USUAL_MODEL[p]].mean_latency_s(settings.latency_scale)
                 for p, share in MIX.items())
    return settings.concurrency / (mean_s + OVERHEAD_PER_CALL_S)
