"""The dispatch benchmark's scenario: load shape, priority mix, simulated provider and the
tidegate config that dispatches against it. Pure data; nothing here does I/O.

Capacity is shared on purpose. tidegate's default routing sends each priority tier to its own
model, and each model has its own rate limit: CRITICAL would then never compete with BULK for
upstream capacity, and a priority-vs-FIFO comparison would measure little. Here every tier routes
to one model whose limit is `capacity_factor` x the nominal arrival rate, so nominal load fits
with headroom and `overload_factor` x nominal does not: the queue's order decides who waits.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from tidegate import Priority
from tidegate.testing import (
    ModelBehaviour,
    ModelConfig,
    ProviderConfig,
    RoutingConfig,
    SimulatorSettings,
    TidegateConfig,
    WorkerSettings,
)

PRIORITIES: tuple[Priority, ...] = tuple(Priority)
DEFAULT_MIX_TEXT = "critical=5,high=15,normal=30,low=25,bulk=25"
# The model every tier routes to. A price-table name, so the simulator serves it without an
# extra-model table and `tidegate simulate` can be configured by flags alone.
SHARED_MODEL = "deepseek-v3.2"
PROVIDER = "sim"
FIFO_LEVEL = Priority.NORMAL  # FIFO runs enqueue everything here; one level is plain FIFO
# The rate windows of the worker's limiter and of the simulated provider. One second rather than
# a provider's minute: each phase lasts tens of seconds, and a 60 s window would carry the
# nominal phase's requests into the overload phase's admissions.
RATE_WINDOW_S = 1.0


def parse_mix(text: str) -> dict[Priority, float]:
    """`"critical=5,high=15,…"` → shares per priority summing to 1. Missing classes get 0."""
    weights = dict.fromkeys(PRIORITIES, 0.0)
    for part in text.split(","):
        if not part.strip():
            continue
        name, sep, value = part.partition("=")
        if not sep:
            raise ValueError(f"mix entry {part!r} is not name=weight")
        weight = float(value)
        if weight < 0 or not math.isfinite(weight):
            raise ValueError(f"mix weight of {name.strip()} must be >= 0, got {value}")
        weights[Priority.parse(name)] = weight
    total = sum(weights.values())
    if total <= 0:
        raise ValueError(f"mix {text!r} has no positive weight")
    return {priority: weight / total for priority, weight in weights.items()}


def format_mix(mix: dict[Priority, float]) -> str:
    """`CRITICAL 5 %, HIGH 15 %, …` for the report."""
    return ", ".join(f"{p.name} {100 * share:.0f} %" for p, share in mix.items() if share > 0)


@dataclass(frozen=True, slots=True)
class Phase:
    """A stretch of the load at one arrival rate; times are seconds from the start of the load."""

    name: str
    start_s: float
    end_s: float
    rate_per_s: float

    @property
    def duration_s(self) -> float:
        """How long the phase lasts."""
        return self.end_s - self.start_s


@dataclass(frozen=True, slots=True)
class Scenario:
    """Everything one benchmark run is configured with (the command line fills it)."""

    users: int = 1000
    tenants: int = 10
    rate_per_min: float = 10_000.0
    overload_factor: float = 3.0
    nominal_s: float = 40.0
    overload_s: float = 40.0
    drain_s: float = 15.0  # at most this long to drain the backlog; the rest is cancelled
    mix: dict[Priority, float] = field(default_factory=lambda: parse_mix(DEFAULT_MIX_TEXT))
    concurrency: int = 64  # per worker
    urgent_reserve: int | None = None  # of those, kept for HIGH and CRITICAL; None: the worker's default
    workers: int = 1
    capacity_factor: float = 1.3  # the provider's limit as a multiple of the nominal rate
    # The simulated provider enforces its limit this much above what the worker is configured
    # with: the worker's GCRA lets a burst of 10 % of the limit through (DEFAULT_BURST_FRACTION),
    # which a strict sliding window would answer with 429s. 1.0 makes the two equal.
    sim_limit_factor: float = 1.1
    latency_ms: float = 80.0
    latency_p99_ms: float = 400.0
    max_tokens: int = 64  # caps the simulated completion, which costs CPU to generate
    seed: int = 7

    @property
    def nominal_rate_per_s(self) -> float:
        """The nominal arrival rate (10,000/min ≈ 167/s)."""
        return self.rate_per_min / 60.0

    @property
    def reserved_slots(self) -> int:
        """Each worker's slots that only HIGH and CRITICAL may take."""
        settings = WorkerSettings(concurrency=self.concurrency, urgent_reserve=self.urgent_reserve)
        return settings.reserved_slots()

    @property
    def worker_limit(self) -> int:
        """Requests per RATE_WINDOW_S the worker paces to: the dispatch capacity."""
        return max(1, round(self.nominal_rate_per_s * self.capacity_factor * RATE_WINDOW_S))

    @property
    def provider_limit(self) -> int:
        """Requests per RATE_WINDOW_S the simulated provider accepts before it answers 429."""
        return max(1, math.ceil(self.worker_limit * self.sim_limit_factor))

    @property
    def capacity_per_s(self) -> float:
        """Completions per second the configured limit allows."""
        return self.worker_limit / RATE_WINDOW_S

    @property
    def load_s(self) -> float:
        """How long arrivals last."""
        return self.nominal_s + self.overload_s

    def phases(self) -> tuple[Phase, ...]:
        """Nominal load, then the same users at `overload_factor` x the rate."""
        nominal = self.nominal_rate_per_s
        return (
            Phase("nominal", 0.0, self.nominal_s, nominal),
            Phase("overload", self.nominal_s, self.load_s, nominal * self.overload_factor),
        )

    def simulator_settings(self, *, limited: bool = True) -> SimulatorSettings:
        """The simulated provider: lognormal latency, a sliding-window limit per model."""
        behaviour = ModelBehaviour(
            latency_ms=self.latency_ms,
            latency_p99_ms=self.latency_p99_ms,
            rpm=self.provider_limit if limited else None,
        )
        return SimulatorSettings(seed=self.seed, window_s=RATE_WINDOW_S, defaults=behaviour)

    def simulator_flags(self) -> list[str]:
        """The same settings as `tidegate simulate` flags (for the simulator subprocess)."""
        return [
            "--seed", str(self.seed),
            "--window-s", str(RATE_WINDOW_S),
            "--latency-ms", str(self.latency_ms),
            "--latency-p99-ms", str(self.latency_p99_ms),
            "--rpm", str(self.provider_limit),
        ]

    def tidegate_config(self, base_url: str, queue_url: str, *, limited: bool = True,
                        concurrency: int | None = None) -> TidegateConfig:
        """One provider (the simulator) with one model every priority tier routes to."""
        model = ModelConfig(
            name=SHARED_MODEL,
            input_usd_per_1m=Decimal("0.28"),
            output_usd_per_1m=Decimal("0.42"),
            rpm=self.worker_limit if limited else None,
            tpm=None,  # only requests bind: token limits would add a second, noisier constraint
            rate_window_s=RATE_WINDOW_S,
            max_concurrency=concurrency or self.concurrency,
        )
        provider = ProviderConfig(name=PROVIDER, base_url=base_url, models=(model,))
        tiers = {priority.name.lower(): (SHARED_MODEL,) for priority in PRIORITIES}
        routing = RoutingConfig(tiers=tiers, embedding_model=SHARED_MODEL, long_context_model=None)
        return TidegateConfig(queue_url=queue_url, providers=(provider,), routing=routing)

    def chat_payload(self, user: int, n: int) -> dict[str, Any]:
        """One AI chat job as the gateway would enqueue it (model routed by tier)."""
        body = {
            "model": "auto",
            "max_tokens": self.max_tokens,
            "user": f"user-{user:04d}",
            "messages": [{"role": "user", "content": f"Question {n} from user {user}: summarise my order."}],
        }
        return {"kind": "chat", "body": body}
