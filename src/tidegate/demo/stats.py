"""What the demo measures: each request's final outcome as the client saw it (status, queue wait
from the X-Tidegate-Queue-Wait-Ms header or the job's result, end-to-end latency, model, cost),
and the gateway's own numbers from GET /v1/stats (queue depth per level, retries, 429s, budgets).
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from tidegate.demo.load import Mode
from tidegate.demo.recs import RecsReading
from tidegate.jobs import Priority

__all__ = [
    "NO_MODEL",
    "OK",
    "BudgetState",
    "DemoSummary",
    "GatewayReading",
    "GroupRow",
    "LiveRow",
    "Outcome",
    "Snapshot",
    "Tally",
    "percentile",
]

OK = "ok"
NO_MODEL = "(no answer)"
THROUGHPUT_WINDOW_S = 3.0


@dataclass(frozen=True, slots=True)
class Outcome:
    """One request's final outcome, as the client saw it.

    `result` is "ok", or what went wrong: the HTTP status of a refused or failed call ("403",
    "429", "502", ...), the final state of an async job that did not succeed ("dead",
    "expired", "cancelled"), "stream error" for a stream that ended in an error event, or
    "connection error"."""

    number: int
    mode: Mode
    priority: Priority
    tenant: str
    result: str
    model: str | None = None
    cost_usd: Decimal = Decimal(0)
    wait_ms: float | None = None  # queue wait of the attempt that answered
    e2e_ms: float | None = None  # sync: request to full answer; async: accepted to finished
    finished_s: float = 0.0  # seconds after the run started
    error: str | None = None  # the gateway's message, for errors

    @property
    def ok(self) -> bool:
        """Whether the request was answered."""
        return self.result == OK


class Tally:
    """Requests sent and their outcomes, as they come in."""

    def __init__(self) -> None:
        self.sent: Counter[Priority] = Counter()
        self.sent_by_mode: Counter[Mode] = Counter()
        self.batches = 0
        self.outcomes: list[Outcome] = []
        self._numbers: set[int] = set()

    def record_sent(self, priority: Priority, mode: Mode) -> None:
        """Count a request as sent."""
        self.sent[priority] += 1
        self.sent_by_mode[mode] += 1

    def record(self, outcome: Outcome) -> None:
        """Record a request's final outcome. A second outcome for one request is a bug."""
        if outcome.number in self._numbers:
            raise RuntimeError(f"request {outcome.number} got two outcomes")
        self._numbers.add(outcome.number)
        self.outcomes.append(outcome)

    @property
    def total_sent(self) -> int:
        """Requests sent so far."""
        return sum(self.sent.values())

    @property
    def outstanding(self) -> int:
        """Requests sent without a final outcome yet."""
        return self.total_sent - len(self.outcomes)

    def answered_per_s(self, now_s: float) -> float:
        """Outcomes per second over the last few seconds."""
        recent = sum(1 for o in self.outcomes[-2000:] if o.finished_s > now_s - THROUGHPUT_WINDOW_S)
        return recent / min(THROUGHPUT_WINDOW_S, max(now_s, 1e-3))


# ---------------------------------------------------------------------- numbers


def percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile (always a value that was measured); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(math.ceil(q / 100 * len(ordered)), 1)
    return ordered[min(rank, len(ordered)) - 1]


@dataclass(frozen=True, slots=True)
class GroupRow:
    """The outcomes of one priority level or one model."""

    label: str
    count: int
    answered: int
    errors: dict[str, int]  # by result, e.g. {"403": 2}
    wait_p50_ms: float | None
    wait_p99_ms: float | None
    e2e_p50_ms: float | None
    e2e_p99_ms: float | None
    cost_usd: Decimal

    @classmethod
    def of(cls, label: str, outcomes: Sequence[Outcome]) -> GroupRow:
        """Summarise `outcomes`; waits and latencies count answered requests only."""
        answered = [o for o in outcomes if o.ok]
        waits = [o.wait_ms for o in answered if o.wait_ms is not None]
        e2e = [o.e2e_ms for o in answered if o.e2e_ms is not None]
        return cls(
            label=label,
            count=len(outcomes),
            answered=len(answered),
            errors=dict(sorted(Counter(o.result for o in outcomes if not o.ok).items())),
            wait_p50_ms=percentile(waits, 50),
            wait_p99_ms=percentile(waits, 99),
            e2e_p50_ms=percentile(e2e, 50),
            e2e_p99_ms=percentile(e2e, 99),
            cost_usd=sum((o.cost_usd for o in outcomes), Decimal(0)),
        )


def by_priority(outcomes: Iterable[Outcome]) -> tuple[GroupRow, ...]:
    """A row per priority level, every level, CRITICAL first."""
    groups: dict[Priority, list[Outcome]] = defaultdict(list)
    for outcome in outcomes:
        groups[outcome.priority].append(outcome)
    return tuple(GroupRow.of(p.name.lower(), groups[p]) for p in Priority)


def by_model(outcomes: Iterable[Outcome]) -> tuple[GroupRow, ...]:
    """A row per model, over the answered requests, largest spend first (an answer whose model
    the client could not learn last, under NO_MODEL)."""
    groups: dict[str, list[Outcome]] = defaultdict(list)
    for outcome in outcomes:
        if outcome.ok:
            groups[outcome.model or NO_MODEL].append(outcome)
    rows = (GroupRow.of(name, rows) for name, rows in groups.items())
    return tuple(sorted(rows, key=lambda row: (row.label == NO_MODEL, -row.cost_usd, row.label)))


# ---------------------------------------------------------------------- the gateway's numbers


@dataclass(frozen=True, slots=True)
class BudgetState:
    """The budget tenant's day so far, from the gateway."""

    tenant: str
    limit_usd: Decimal
    spent_usd: Decimal  # settled, plus what is reserved for calls under way


@dataclass(frozen=True, slots=True)
class GatewayReading:
    """What GET /v1/stats says: the queue now, and the in-process worker's counts."""

    depth: dict[Priority, int] = field(default_factory=dict)  # waiting to be claimed, per level
    in_flight: int = 0
    delayed: int = 0  # parked (paced, or waiting out a retry's backoff) until their time
    dead: int = 0
    retried: int = 0  # failed attempts retried (the provider's 503s, 429s)
    throttled: int = 0  # 429s from the provider
    budget: BudgetState | None = None

    @classmethod
    def parse(cls, stats: Mapping[str, Any], budget_tenant: str) -> GatewayReading:
        """Read the parts the demo shows out of a GET /v1/stats answer."""
        depth = {Priority.parse(name): int(level["depth"])
                 for name, level in (stats.get("levels") or {}).items()}
        models = (stats.get("dispatch_by_model") or {}).values()
        budget = None
        row = (stats.get("budgets_today") or {}).get(budget_tenant)
        if row is not None and row.get("daily_budget_usd") is not None:
            budget = BudgetState(budget_tenant, Decimal(str(row["daily_budget_usd"])),
                                 Decimal(str(row["spent_usd"])))
        return cls(
            depth=depth,
            in_flight=int(stats.get("in_flight", 0)),
            delayed=int(stats.get("delayed", 0)),
            dead=int(stats.get("dead", 0)),
            retried=sum(int(model.get("jobs", {}).get("retried", 0)) for model in models),
            throttled=sum(int(model.get("throttled_429", 0)) for model in models),
            budget=budget,
        )


# ---------------------------------------------------------------------- live and final


@dataclass(frozen=True, slots=True)
class LiveRow:
    """One priority level right now."""

    priority: Priority
    sent: int
    done: int
    queued: int  # waiting in the queue, from the gateway
    row: GroupRow  # the outcomes so far


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Everything the live view shows at one moment."""

    elapsed_s: float
    phase: str  # "steady", "surge", "quiet", then "drain"
    arrival_per_s: float
    answered_per_s: float
    capacity_per_s: float
    rows: tuple[LiveRow, ...]
    models: tuple[GroupRow, ...]
    gateway: GatewayReading
    outstanding: int
    recs: RecsReading | None = None  # the demo user's recommendations, as last read

    @classmethod
    def of(cls, tally: Tally, gateway: GatewayReading, *, elapsed_s: float, phase: str,
           arrival_per_s: float, capacity_per_s: float, recs: RecsReading | None = None) -> Snapshot:
        """The live numbers from the outcomes so far and the gateway's last reading."""
        levels = by_priority(tally.outcomes)
        rows = tuple(LiveRow(p, tally.sent[p], levels[p].count, gateway.depth.get(p, 0), levels[p])
                     for p in Priority)
        return cls(elapsed_s=elapsed_s, phase=phase, arrival_per_s=arrival_per_s,
                   answered_per_s=tally.answered_per_s(elapsed_s), capacity_per_s=capacity_per_s,
                   rows=rows, models=by_model(tally.outcomes), gateway=gateway,
                   outstanding=tally.outstanding, recs=recs)


@dataclass(frozen=True, slots=True)
class DemoSummary:
    """What a demo run measured: every request's outcome, and the gateway's last numbers."""

    dashboard_url: str
    queue_url: str
    concurrency: int
    rate_per_s: float
    capacity_per_s: float  # the estimate shown; the worker's concurrency bounds it
    load_s: float  # from the start until the last request was sent
    elapsed_s: float  # from the start until the last outcome
    peak_backlog: int  # most jobs waiting in the queue (and parked) at one reading
    sent: dict[Priority, int]
    sent_by_mode: dict[Mode, int]
    batches: int
    outcomes: tuple[Outcome, ...]
    by_priority: tuple[GroupRow, ...]  # every level, CRITICAL first
    by_model: tuple[GroupRow, ...]  # largest spend first
    gateway: GatewayReading  # the last reading, after the drain
    recs: RecsReading | None = None  # the recommender, read after the drain

    @property
    def total_sent(self) -> int:
        """Requests sent (each job of a batch counts)."""
        return sum(self.sent.values())

    @property
    def lost(self) -> int:
        """Requests sent without a final outcome: zero, unless something is broken."""
        return self.total_sent - len(self.outcomes)

    @property
    def answered(self) -> int:
        """Requests answered."""
        return sum(1 for o in self.outcomes if o.ok)

    @property
    def errors(self) -> dict[str, int]:
        """Requests not answered, by result."""
        return dict(sorted(Counter(o.result for o in self.outcomes if not o.ok).items()))

    @property
    def total_cost_usd(self) -> Decimal:
        """What the answered requests cost."""
        return sum((o.cost_usd for o in self.outcomes), Decimal(0))

    def level(self, priority: Priority) -> GroupRow:
        """The row of one priority level."""
        return self.by_priority[int(priority)]
