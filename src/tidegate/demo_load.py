"""The demo's world: how the simulated provider's models behave, which tenants send what at which
priority, and when the jobs arrive.

The provider's limits are set here once and given to both sides, the simulator (which answers 429
past them) and the worker (which paces under them), as a real deployment copies its provider's
published limits into its config.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from tidegate.config import BudgetConfig, ModelConfig, RoutingConfig, TidegateConfig
from tidegate.jobs import JobSpec, Priority
from tidegate.providers.sim_settings import ModelBehaviour, SimulatorSettings

__all__ = [
    "PROFILES",
    "TENANTS",
    "DemoSettings",
    "ModelProfile",
    "Workload",
    "demo_config",
    "estimated_capacity_per_s",
    "simulator_settings",
]

Z99 = 2.3263478740408408  # the standard normal's 99th percentile

# Tenants; the last one has a small daily budget so that the router steps it down to cheaper models.
TENANTS = ("acme", "globex", "umbrella", "initech")
BUDGET_TENANT = "initech"
# initech's budget per job it is planned to send: about 85 % of what its jobs cost at full
# price, so the router steps it down to cheaper models part way through the run, and the cheap
# calls then last to its end. Reservations count as spent until settled, and one reserves the
# most a call can cost (max_tokens of output), so a small run still needs room for those.
BUDGET_USD_PER_JOB = Decimal("0.00028")
MIN_BUDGET_USD = Decimal("0.05")
MAX_TOKENS = 300
# The worker's own time per job besides the provider's latency (queue writes, budget, HTTP), as
# measured on a small laptop-class machine; only used to scale the timed load.
OVERHEAD_PER_JOB_S = 0.05


@dataclass(frozen=True, slots=True)
class DemoSettings:
    """How big and how fast a demo run is. The defaults are what `tidegate demo` runs."""

    seconds: float = 20.0  # timed load: how long jobs keep arriving before the drain
    jobs: int | None = None  # a fixed batch enqueued at once instead of timed load
    concurrency: int = 32  # the worker's calls in flight
    latency_scale: float = 1.0  # multiplies every model's latency (tests run faster)
    error_rate: float = 0.01  # share of provider calls answered 503 (retried)
    seed: int = 7
    refresh_s: float = 0.25  # how often the numbers are read back (and the live view redrawn)

    @property
    def timed(self) -> bool:
        """True for timed load, False for a fixed batch."""
        return self.jobs is None


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
    # The bulk backfill's model: its limit is what paces the surge of bulk work.
    "text-embedding-3-small": ModelProfile(40, 160, rpm=4_800),
}

# Share of jobs per level, in percent: a little urgent work, a long tail of background work.
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
# Timed load, as (end of phase as a share of the run, arrival rate as a share of capacity, name):
# under capacity, then a surge well over it (the backlog forms), then quiet (it drains).
PHASES: tuple[tuple[float, float, str], ...] = (
    (0.25, 0.6, "steady"),
    (0.60, 1.7, "surge"),
    (1.00, 0.4, "quiet"),
)
# One job in this many is a client bug the provider refuses with a 400: not retried, dead-lettered.
BAD_REQUEST_EVERY = 250

_WORDS = ("order", "refund", "shipping", "invoice", "account", "password", "delivery", "size",
          "colour", "warranty", "discount", "basket", "payment", "card", "address", "return",
          "product", "review", "stock", "price", "customer", "cotton", "leather", "battery")
_TASKS: dict[Priority, str] = {
    Priority.CRITICAL: "Decide whether this checkout looks fraudulent and say why in one line.",
    Priority.HIGH: "Reply to this customer in the support chat.",
    Priority.NORMAL: "Summarise this support ticket for the next agent.",
    Priority.LOW: "Tag this product review with topics and a sentiment.",
}


# ---------------------------------------------------------------------- the provider and the worker


def simulator_settings(settings: DemoSettings) -> SimulatorSettings:
    """The simulated provider: per-model latency and limits, a few 503s."""
    models = {
        name: {"latency_ms": profile.latency_ms * settings.latency_scale,
               "latency_p99_ms": profile.latency_p99_ms * settings.latency_scale,
               "rpm": profile.rpm}
        for name, profile in PROFILES.items()
    }
    defaults = ModelBehaviour(completion_tokens=120, completion_tokens_p99=500,
                              unavailable_rate=settings.error_rate)
    return SimulatorSettings(seed=settings.seed, window_s=60.0, defaults=defaults, models=models)


def demo_config(queue_url: str, base_url: str, budget_usd: Decimal) -> TidegateConfig:
    """The worker's config: the simulator as its provider, with the same limits the simulator
    enforces, and a small daily budget for one tenant (refused, not deferred, once spent, so a
    run never stalls on a budget that only resets at midnight)."""
    # Routing and budgets are given in full so a tidegate.toml in the working folder cannot
    # change what the demo shows.
    config = TidegateConfig(
        queue_url=queue_url,
        routing=RoutingConfig(),
        budgets=BudgetConfig(tenant_daily_usd={BUDGET_TENANT: budget_usd}, on_exhausted="reject"),
    ).with_simulator(base_url)
    provider = config.providers[0]
    models = tuple(_limited(model) for model in provider.models)
    return config.model_copy(update={"providers": (provider.model_copy(update={"models": models}),)})


def _limited(model: ModelConfig) -> ModelConfig:
    profile = PROFILES.get(model.name)
    if profile is None:
        return model
    # The simulator limits requests only; a token limit the worker alone knew would pace for nothing.
    return model.model_copy(update={"rpm": profile.rpm, "tpm": None, "rate_window_s": 60.0})


def estimated_capacity_per_s(settings: DemoSettings) -> float:
    """Jobs per second the worker can finish, roughly: its concurrency over the time a job holds
    a slot (the mix's mean latency and the worker's own overhead)."""
    total = sum(MIX.values())
    mean_s = sum(share / total * PROFILES[USUAL_MODEL[p]].mean_latency_s(settings.latency_scale)
                 for p, share in MIX.items())
    return settings.concurrency / (mean_s + OVERHEAD_PER_JOB_S)


def budget_for(planned_jobs: int) -> Decimal:
    """The budget tenant's daily budget for a run of `planned_jobs`."""
    return max(MIN_BUDGET_USD, BUDGET_USD_PER_JOB * planned_jobs / len(TENANTS))


# ---------------------------------------------------------------------- arrivals


@dataclass(frozen=True, slots=True)
class Phase:
    """Where the timed load is: its name and the arrival rate now."""

    name: str
    rate_per_s: float


class Arrivals:
    """The timed load's schedule: how many jobs are due by a given time."""

    def __init__(self, seconds: float, capacity_per_s: float) -> None:
        self.seconds = seconds
        self.capacity_per_s = capacity_per_s

    def phase(self, t_s: float) -> Phase:
        """The phase at `t_s` seconds into the run (the last one after the end)."""
        share = t_s / self.seconds
        for end, factor, name in PHASES:
            if share < end:
                return Phase(name, factor * self.capacity_per_s)
        return Phase("drain", 0.0)

    def due(self, t_s: float) -> int:
        """Jobs due by `t_s`: the integral of the rate, whole jobs."""
        total, start = 0.0, 0.0
        for end, factor, _ in PHASES:
            stop = min(end, max(t_s / self.seconds, 0.0))
            if stop > start:
                total += (stop - start) * self.seconds * factor * self.capacity_per_s
            start = end
        return int(total)

    @property
    def planned(self) -> int:
        """Jobs the whole run sends."""
        return self.due(self.seconds)


# ---------------------------------------------------------------------- jobs


class Workload:
    """An endless, seeded stream of demo jobs: the mix of priorities, tenants and requests."""

    def __init__(self, seed: int) -> None:
        self._rng = random.Random(seed)
        self._levels = [p for p, share in MIX.items() for _ in range(share)]
        self._count = 0

    def take(self, n: int) -> list[JobSpec]:
        """The next `n` jobs."""
        return [self._next() for _ in range(n)]

    def __iter__(self) -> Iterator[JobSpec]:
        while True:
            yield self._next()

    def _next(self) -> JobSpec:
        self._count += 1
        rng = self._rng
        tenant = rng.choice(TENANTS)
        if self._count % BAD_REQUEST_EVERY == BAD_REQUEST_EVERY // 2:
            payload = self._chat(Priority.NORMAL, temperature=3.0)  # over the API's 0-2
            return JobSpec(payload=payload, priority=Priority.NORMAL, tenant=tenant)
        priority = rng.choice(self._levels)
        if priority is Priority.BULK:
            payload = {"kind": "embeddings",
                       "body": {"model": "auto", "input": f"Product: {self._text(30, 120)}"}}
        else:
            payload = self._chat(priority)
        return JobSpec(payload=payload, priority=priority, tenant=tenant)

    def _chat(self, priority: Priority, **options: Any) -> dict[str, Any]:
        messages = [{"role": "system", "content": _TASKS[priority]},
                    {"role": "user", "content": self._text(40, 300)}]
        body = {"model": "auto", "messages": messages, "max_tokens": MAX_TOKENS, **options}
        return {"kind": "chat", "body": body}

    def _text(self, low: int, high: int) -> str:
        return " ".join(self._rng.choices(_WORDS, k=self._rng.randint(low, high)))
