"""What a gateway measures: Prometheus metrics of its requests, and a bounded window of the
results it has handed out, from which GET /v1/stats reports throughput, p50/p99 waits and spend
per model without a query to Prometheus."""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, date, datetime

from prometheus_client import CollectorRegistry, Counter, Histogram

from tidegate._labels import Labelled
from tidegate.ai import AIResult
from tidegate.jobs import Job, JobState

__all__ = ["GatewayMetrics", "Percentiles", "RecentResults"]

_LATENCY_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
_TTFT_BUCKETS_S = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 15, 30, 60)


class GatewayMetrics:
    """The gateway's Prometheus metrics, in a registry of their own so several gateways (tests)
    can live in one process."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.requests = Labelled(Counter(
            "tidegate_gateway_requests", "HTTP requests answered, by route template and status",
            ["route", "method", "status"], registry=r,
        ))
        self.latency = Labelled(Histogram(
            "tidegate_gateway_request_seconds", "Time from request to the end of the answer",
            ["route", "method"], buckets=_LATENCY_BUCKETS_S, registry=r,
        ))
        self.ttft = Labelled(Histogram(
            "tidegate_gateway_ttft_seconds",
            "Streamed completions: time from request to the first content chunk sent",
            ["priority"], buckets=_TTFT_BUCKETS_S, registry=r,
        ))
        self.enqueued = Labelled(Counter(
            "tidegate_gateway_jobs_enqueued", "Jobs enqueued by this gateway",
            ["kind", "priority"], registry=r,
        ))


@dataclass(frozen=True, slots=True)
class Percentiles:
    """p50 and p99 of a sample (None when it is empty)."""

    p50: float | None
    p99: float | None
    count: int


@dataclass(frozen=True, slots=True)
class _Sample:
    finished_at_s: float  # epoch seconds
    priority: int
    queue_wait_ms: float | None
    upstream_latency_ms: float | None
    model: str | None


class RecentResults:
    """The last `size` succeeded jobs this gateway has seen (answered, polled or long-polled),
    one entry per job id, and their spend per model today.

    It only knows what passes through this gateway: with several replicas each reports its
    own share. Used from the event loop only, so it needs no lock."""

    def __init__(self, size: int, *, clock: Callable[[], float] = time.time) -> None:
        self.size = size
        self._clock = clock
        self._samples: OrderedDict[str, _Sample] = OrderedDict()
        self._spend_day: date | None = None
        self._spend_by_model: dict[str, int] = {}

    def record(self, job: Job, result: AIResult | None) -> None:
        """Take in a job's result (`result_of(job)`, read once by the caller) if it succeeded
        and was not seen yet."""
        if job.state is not JobState.SUCCEEDED or result is None:
            return
        finished = job.finished_at.timestamp() if job.finished_at else self._clock()
        sample = _Sample(finished, int(job.priority), result.timings.queue_wait_ms,
                         result.timings.upstream_latency_ms, result.model)
        cost = result.cost_micros
        if job.id in self._samples:
            return
        self._samples[job.id] = sample
        while len(self._samples) > self.size:
            self._samples.popitem(last=False)
        day = datetime.fromtimestamp(finished, UTC).date()
        if day != self._spend_day:
            if self._spend_day is not None and day < self._spend_day:
                return  # yesterday's late result: today's figures are what is shown
            self._spend_day, self._spend_by_model = day, {}
        if sample.model is not None and cost is not None:
            self._spend_by_model[sample.model] = self._spend_by_model.get(sample.model, 0) + cost

    def throughput(self, window_s: float = 60.0) -> int:
        """Jobs seen that finished within the last `window_s` (at most `size`)."""
        since = self._clock() - window_s
        return sum(1 for sample in self._samples.values() if sample.finished_at_s >= since)

    def queue_wait_ms(self, priority: int | None = None) -> Percentiles:
        """p50/p99 of the queue wait of the jobs in the window: all of them, or those of one
        priority level."""
        return _percentiles([s.queue_wait_ms for s in self._samples.values()
                             if priority is None or s.priority == priority])

    def upstream_latency_ms(self) -> Percentiles:
        """p50/p99 of the provider latency of the jobs in the window."""
        return _percentiles([s.upstream_latency_ms for s in self._samples.values()])

    def spend_by_model_micros(self) -> dict[str, int]:
        """Spend per model of the jobs seen today (UTC)."""
        today = datetime.fromtimestamp(self._clock(), UTC).date()
        return dict(self._spend_by_model) if self._spend_day == today else {}


def _percentiles(values: list[float | None]) -> Percentiles:
    known = sorted(value for value in values if value is not None)
    if not known:
        return Percentiles(None, None, 0)
    return Percentiles(_nearest_rank(known, 0.50), _nearest_rank(known, 0.99), len(known))


def _nearest_rank(ordered: list[float], quantile: float) -> float:
    # Nearest-rank: always a value that was observed, never an interpolation between two.
    index = max(math.ceil(quantile * len(ordered)) - 1, 0)
    return ordered[index]

