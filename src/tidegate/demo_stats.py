"""What the demo measures, read back from the queue: each finished job's result (the worker writes
its model, cost, attempts and upstream latency there), the queue's stats, and the worker's metrics
for what results cannot show yet (retries of jobs still running, pacing, 429s)."""

from __future__ import annotations

import math
import time
from collections import defaultdict, deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Literal

from prometheus_client import Counter

from tidegate.dispatch.costs import micros_to_usd
from tidegate.dispatch.metrics import DispatchMetrics
from tidegate.jobs import Job, JobState, Priority
from tidegate.queue import Queue, QueueStats

__all__ = [
    "NO_MODEL",
    "BudgetState",
    "DeadCause",
    "DemoSummary",
    "GroupRow",
    "Harvester",
    "JobRecord",
    "LiveRow",
    "MetricsReader",
    "Outcomes",
    "Snapshot",
    "group_rows",
    "live_rows",
    "percentile",
]

# A sweep reads each level's oldest unfinished jobs; after this many that are still unfinished,
# the rest of that level is left for the next sweep.
MISSES_BEFORE_NEXT_LEVEL = 4
THROUGHPUT_WINDOW_S = 3.0
NO_MODEL = "(no answer)"

DeadCause = Literal["refused", "budget", "other"]


@dataclass(frozen=True, slots=True)
class JobRecord:
    """One demo job once final, as read back from the queue."""

    id: str
    priority: Priority
    tenant: str
    state: JobState
    attempts: int
    model: str | None  # the model that answered; None when none did
    # Queue wait as the worker records it (`queue_wait_ms`): from when the job last became
    # claimable to its claim, for the attempt that answered. None when no attempt answered.
    wait_ms: float | None
    latency_ms: float | None  # the answering call's upstream latency
    to_result_ms: float  # from enqueue to final: waits, pacing, retries and the call itself
    cost_micros: int
    route: str
    error: str | None
    finished_s: float  # seconds after the run started

    @property
    def retries(self) -> int:
        """Attempts beyond the first."""
        return max(self.attempts - 1, 0)

    @property
    def stepped_down(self) -> bool:
        """Routed to a cheaper model because its tenant's budget ran low."""
        return "budget low" in self.route

    @property
    def dead_cause(self) -> DeadCause | None:
        """Why a dead job died (None for any other state), read from its last error."""
        if self.state is not JobState.DEAD:
            return None
        error = self.error or ""
        if error.startswith("budget exhausted"):
            return "budget"
        if " answered HTTP 4" in error:
            return "refused"  # a request the provider refuses is not retried
        return "other"

    @classmethod
    def from_job(cls, job: Job, started_at: datetime) -> JobRecord:
        """The record of a final job."""
        finished = job.finished_at or job.created_at
        result = job.result if isinstance(job.result, dict) and job.state is JobState.SUCCEEDED else {}
        model = result.get("model")
        return cls(
            id=job.id,
            priority=job.priority,
            tenant=job.tenant,
            state=job.state,
            attempts=job.attempts,
            model=model if isinstance(model, str) else None,
            wait_ms=_number(result.get("queue_wait_ms")),
            latency_ms=_number(result.get("upstream_latency_ms")),
            to_result_ms=(finished - job.created_at).total_seconds() * 1000,
            cost_micros=int(result.get("cost_micros") or 0),
            route=str(result.get("route") or ""),
            error=job.last_error,
            finished_s=(finished - started_at).total_seconds(),
        )


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) else None


class Harvester:
    """Reads back the demo's jobs as they finish. It looks at each level's oldest unfinished jobs
    first (the queue serves a level in order), and only at levels where the worker's metrics say
    jobs finished since, so reading stays cheap however long the backlog grows."""

    def __init__(self, queue: Queue, started_at: datetime) -> None:
        self.queue = queue
        self.started_at = started_at
        self.records: list[JobRecord] = []
        self.enqueued: dict[Priority, int] = dict.fromkeys(Priority, 0)
        self.finished: dict[Priority, int] = dict.fromkeys(Priority, 0)
        self._pending: dict[Priority, list[str]] = {p: [] for p in Priority}

    def track(self, ids: Iterable[str], priorities: Iterable[Priority]) -> None:
        """Remember jobs just enqueued."""
        for job_id, priority in zip(ids, priorities, strict=True):
            self._pending[priority].append(job_id)
            self.enqueued[priority] += 1

    @property
    def outstanding(self) -> int:
        """Jobs enqueued and not read back final yet."""
        return sum(len(ids) for ids in self._pending.values())

    async def sweep(self, settled: Mapping[Priority, int]) -> int:
        """Read back jobs that finished since the last sweep, given how many the worker has
        settled per level; returns how many were found."""
        found = 0
        for priority, ids in self._pending.items():
            # The metrics can lag behind a job finished by something other than the worker (a
            # lease recovered without attempts left), so one job is always looked at.
            wanted = max(settled.get(priority, 0) - self.finished[priority], 1)
            found += await self._sweep_level(priority, ids, wanted)
        return found

    async def _sweep_level(self, priority: Priority, ids: list[str], wanted: int) -> int:
        # Jobs finish roughly in order; a few misses in a row (a retry waiting for its backoff)
        # are looked past, and then the rest are younger still.
        keep: list[str] = []
        found = misses = 0
        for index, job_id in enumerate(ids):
            if found >= wanted or misses >= MISSES_BEFORE_NEXT_LEVEL:
                keep.extend(ids[index:])
                break
            job = await self.queue.get(job_id)
            if job is not None and job.is_final:
                self.records.append(JobRecord.from_job(job, self.started_at))
                found += 1
            else:
                keep.append(job_id)
                misses += 1
        self._pending[priority] = keep
        self.finished[priority] += found
        return found


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
    """Finished jobs of one priority level or one model."""

    label: str
    count: int
    succeeded: int
    dead: int
    retries: int
    wait_p50_ms: float | None
    wait_p99_ms: float | None
    latency_p50_ms: float | None
    latency_p99_ms: float | None
    to_result_p99_ms: float | None  # enqueue to final, every job
    cost_usd: Decimal

    @classmethod
    def of(cls, label: str, records: Sequence[JobRecord]) -> GroupRow:
        """Summarise `records`; waits and latencies count answered jobs only."""
        answered = [r for r in records if r.state is JobState.SUCCEEDED]
        waits = [r.wait_ms for r in answered if r.wait_ms is not None]
        latencies = [r.latency_ms for r in answered if r.latency_ms is not None]
        return cls(
            label=label,
            count=len(records),
            succeeded=len(answered),
            dead=sum(1 for r in records if r.state is JobState.DEAD),
            retries=sum(r.retries for r in records),
            wait_p50_ms=percentile(waits, 50),
            wait_p99_ms=percentile(waits, 99),
            latency_p50_ms=percentile(latencies, 50),
            latency_p99_ms=percentile(latencies, 99),
            to_result_p99_ms=percentile([r.to_result_ms for r in records], 99),
            cost_usd=micros_to_usd(sum(r.cost_micros for r in records)),
        )


def group_rows(records: Sequence[JobRecord]) -> tuple[tuple[GroupRow, ...], tuple[GroupRow, ...]]:
    """Rows per priority level (every level, in order) and per model (by spend, largest first;
    jobs no model answered last, under NO_MODEL)."""
    by_priority: dict[Priority, list[JobRecord]] = defaultdict(list)
    by_model: dict[str, list[JobRecord]] = defaultdict(list)
    for record in records:
        by_priority[record.priority].append(record)
        by_model[record.model or NO_MODEL].append(record)
    levels = tuple(GroupRow.of(p.name.lower(), by_priority[p]) for p in Priority)
    models = sorted((GroupRow.of(name, rows) for name, rows in by_model.items()),
                    key=lambda row: (row.label == NO_MODEL, -row.cost_usd, row.label))
    return levels, tuple(models)


# ---------------------------------------------------------------------- the live view's numbers


@dataclass(frozen=True, slots=True)
class LiveRow:
    """One priority level right now."""

    priority: Priority
    enqueued: int
    done: int
    queued: int
    oldest_wait_ms: float  # how long the oldest queued job has waited so far
    running: int
    per_s: float
    retries: int
    dead: int
    wait_p50_ms: float | None
    wait_p99_ms: float | None
    latency_p50_ms: float | None
    latency_p99_ms: float | None


@dataclass(frozen=True, slots=True)
class Outcomes:
    """Jobs by (outcome, priority) as the worker counted them: succeeded, dead, retried."""

    counts: dict[tuple[str, Priority], int]

    def __call__(self, outcome: str, priority: Priority) -> int:
        return self.counts.get((outcome, priority), 0)

    def done(self) -> dict[Priority, int]:
        """Jobs settled (succeeded or dead) per level."""
        return {p: self("succeeded", p) + self("dead", p) for p in Priority}


class MetricsReader:
    """Counts from the worker's Prometheus metrics, which move the moment a job settles, and
    throughput over the last few seconds."""

    def __init__(self, metrics: DispatchMetrics) -> None:
        self.metrics = metrics
        self._history: deque[tuple[float, dict[Priority, int]]] = deque()

    def outcomes(self) -> Outcomes:
        """Jobs by (outcome, priority): succeeded, dead, retried, lease_lost."""
        counts: dict[tuple[str, Priority], int] = defaultdict(int)
        for family in self.metrics.jobs.collect():
            for sample in family.samples:
                if sample.name.endswith("_total"):
                    key = (sample.labels["outcome"], Priority.parse(sample.labels["priority"]))
                    counts[key] += int(sample.value)
        return Outcomes(counts)

    def answered_by_model(self) -> dict[str, int]:
        """Jobs answered per model so far."""
        answered: dict[str, int] = defaultdict(int)
        for family in self.metrics.jobs.collect():
            for sample in family.samples:
                if sample.name.endswith("_total") and sample.labels["outcome"] == "succeeded":
                    answered[sample.labels["model"]] += int(sample.value)
        return dict(answered)

    def spend_by_model(self) -> dict[str, float]:
        """USD spent per model so far (floats: for display only; the summary adds exact micros)."""
        spend: dict[str, float] = defaultdict(float)
        for family in self.metrics.cost_usd.collect():
            for sample in family.samples:
                if sample.name.endswith("_total"):
                    spend[sample.labels["model"]] += sample.value
        return dict(spend)

    def paced(self) -> int:
        """Jobs parked because a model's rate limit had no room for them soon enough."""
        return self._total(self.metrics.deferred, reason="rate_limit")

    def throttled(self) -> int:
        """429 answers from the provider."""
        return self._total(self.metrics.throttled)

    def rates(self, done: dict[Priority, int]) -> dict[Priority, float]:
        """Jobs finished per second per level over the last THROUGHPUT_WINDOW_S."""
        now = time.monotonic()
        self._history.append((now, done))
        while len(self._history) > 2 and now - self._history[1][0] >= THROUGHPUT_WINDOW_S:
            self._history.popleft()
        then, before = self._history[0]
        span = now - then
        if span <= 0:
            return dict.fromkeys(Priority, 0.0)
        return {p: (done[p] - before.get(p, 0)) / span for p in Priority}

    @staticmethod
    def _total(metric: Counter, **labels: str) -> int:
        total = 0.0
        for family in metric.collect():
            for sample in family.samples:
                if sample.name.endswith("_total") and all(sample.labels.get(k) == v
                                                          for k, v in labels.items()):
                    total += sample.value
        return int(total)


def live_rows(
    harvester: Harvester, stats: QueueStats, outcomes: Outcomes,
    rates: dict[Priority, float],
) -> tuple[LiveRow, ...]:
    """Every level's live row."""
    by_priority: dict[Priority, list[JobRecord]] = defaultdict(list)
    for record in harvester.records:
        by_priority[record.priority].append(record)
    rows = []
    for priority in Priority:
        group = GroupRow.of(priority.name.lower(), by_priority[priority])
        level = stats.levels.get(priority)
        rows.append(LiveRow(
            priority=priority,
            enqueued=harvester.enqueued[priority],
            done=outcomes("succeeded", priority) + outcomes("dead", priority),
            queued=level.depth if level else 0,
            oldest_wait_ms=level.oldest_wait_s * 1000 if level else 0.0,
            running=level.in_flight if level else 0,
            per_s=rates[priority],
            retries=outcomes("retried", priority),
            dead=outcomes("dead", priority),
            wait_p50_ms=group.wait_p50_ms,
            wait_p99_ms=group.wait_p99_ms,
            latency_p50_ms=group.latency_p50_ms,
            latency_p99_ms=group.latency_p99_ms,
        ))
    return tuple(rows)


# ---------------------------------------------------------------------- snapshots and the summary


@dataclass(frozen=True, slots=True)
class BudgetState:
    """The budget tenant's day so far."""

    tenant: str
    limit_usd: Decimal
    spent_usd: Decimal  # settled, plus what is reserved for calls under way
    stepped_down: int  # its jobs routed to a cheaper model because the budget ran low
    refused: int  # its jobs refused once the budget was spent


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Everything the live view shows at one moment."""

    elapsed_s: float
    phase: str  # "steady", "surge", "quiet" for timed load; "batch"; then "drain"
    arrival_per_s: float
    served_per_s: float  # jobs finished per second, lately
    rows: tuple[LiveRow, ...]
    backlog: int  # jobs waiting to be claimed
    delayed: int  # jobs parked (paced, in retry backoff) until their time
    spend_by_model: dict[str, float]
    answered_by_model: dict[str, int]
    paced: int
    throttled: int
    budget: BudgetState


@dataclass(frozen=True, slots=True)
class DemoSummary:
    """What a demo run measured, from every job's final state and result."""

    url: str
    timed: bool
    concurrency: int
    capacity_per_s: float  # the estimate the timed load was scaled to
    load_s: float  # from the start until the last job was enqueued
    elapsed_s: float  # from the start until the last job was final
    peak_backlog: int
    paced: int
    throttled: int
    records: tuple[JobRecord, ...]
    by_priority: tuple[GroupRow, ...]  # every level, CRITICAL first
    by_model: tuple[GroupRow, ...]  # largest spend first
    budget: BudgetState

    @property
    def jobs(self) -> int:
        """Jobs enqueued, all final."""
        return len(self.records)

    @property
    def total_cost_usd(self) -> Decimal:
        """Exact spend of the run."""
        return micros_to_usd(sum(record.cost_micros for record in self.records))

    @property
    def throughput_per_s(self) -> float:
        """Jobs finished per second over the run."""
        return self.jobs / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def level(self, priority: Priority) -> GroupRow:
        """The row of one priority level."""
        return self.by_priority[int(priority)]

    def retries(self) -> int:
        """Attempts beyond the first, over every job."""
        return sum(record.retries for record in self.records)

    def dead(self, cause: DeadCause | None = None) -> int:
        """Dead jobs (of one cause, or all)."""
        return sum(1 for record in self.records
                   if record.dead_cause is not None and cause in (None, record.dead_cause))
