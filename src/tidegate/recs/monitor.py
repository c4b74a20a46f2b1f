"""What the recommender's feed measures: commit → recommendation updated per change (a Prometheus
histogram), changes mapped or refused, item vectors swapped by embedding jobs, and which users
are the most active lately (the dashboard's default user).

One `RecsMonitor` is shared by the change-flow sink, the refresh watcher and the API of one
process; `tidegate up` exports its registry on /metrics.
"""

from __future__ import annotations

import math
from collections import Counter as CountOf

from prometheus_client import CollectorRegistry, Counter, Histogram

from tidegate._labels import Labelled

__all__ = ["ActivityTracker", "Quantiles", "RecsMonitor", "histogram_quantiles"]

# The promise is tens of milliseconds: fine buckets there, coarse ones for trouble.
_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.035, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1, 2.5,
              5, 10, 30, 60)


class ActivityTracker:
    """The most active users lately, in bounded memory: counts halve once `capacity` users are
    tracked, and users left at zero are forgotten, so recent activity wins over old."""

    def __init__(self, capacity: int = 10_000) -> None:
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        self.capacity = capacity
        self._counts: CountOf[str] = CountOf()

    def add(self, user_id: str, count: int = 1) -> None:
        """Count `count` interactions of the user."""
        self._counts[user_id] += count
        if len(self._counts) > self.capacity:
            self._counts = CountOf({user: n // 2 for user, n in self._counts.items() if n // 2 > 0})

    def most_active(self) -> str | None:
        """The user with the most recent interactions (None before any)."""
        top = self._counts.most_common(1)
        return top[0][0] if top else None


class Quantiles:
    """p50/p99 in milliseconds of a histogram (None without observations) and its count."""

    __slots__ = ("count", "p50_ms", "p99_ms")

    def __init__(self, p50_ms: float | None, p99_ms: float | None, count: int) -> None:
        self.p50_ms = p50_ms
        self.p99_ms = p99_ms
        self.count = count


def histogram_quantiles(histogram: Histogram) -> Quantiles:
    """p50/p99 of a histogram (every label set together), interpolated linearly inside the
    bucket each falls in, as Prometheus' histogram_quantile does."""
    cumulative: dict[float, float] = {}
    for metric in histogram.collect():
        for sample in metric.samples:
            if sample.name.endswith("_bucket"):
                bound = float(sample.labels["le"])
                cumulative[bound] = cumulative.get(bound, 0.0) + sample.value
    bounds = sorted(cumulative)
    total = cumulative.get(math.inf, 0.0)
    if total <= 0:
        return Quantiles(None, None, 0)

    def quantile(q: float) -> float:
        rank = q * total
        lower, below = 0.0, 0.0
        for bound in bounds:
            count = cumulative[bound]
            if count >= rank:
                if math.isinf(bound):
                    return lower  # beyond the last finite bucket: its bound is the best estimate
                inside = count - below
                return lower + (bound - lower) * ((rank - below) / inside if inside else 1.0)
            lower, below = bound, count
        return lower

    return Quantiles(round(quantile(0.5) * 1000, 3), round(quantile(0.99) * 1000, 3), int(total))


class RecsMonitor:
    """The recommender feed's metrics (one set per registry) and its activity tracker."""

    def __init__(self, registry: CollectorRegistry | None = None, *, tracked_users: int = 10_000) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.commit_to_updated = Histogram(
            "tidegate_recs_commit_to_updated_seconds",
            "From the source commit to the recommender updated with the change",
            ["entity_type"], buckets=_BUCKETS_S, registry=r,
        )
        self.changes = Counter(
            "tidegate_recs_changes", "Changes the recommender's sink handled, by table and outcome "
            "(applied, malformed, ignored)", ["entity_type", "outcome"], registry=r,
        )
        self.interactions = Counter(
            "tidegate_recs_interactions", "Interactions recorded, by source (change_flow, api)",
            ["source"], registry=r,
        )
        self.vector_swaps = Counter(
            "tidegate_recs_vector_swaps", "Item vectors replaced by an embedding refresh job's result",
            registry=r,
        )
        self.refresh_dropped = Counter(
            "tidegate_recs_refresh_dropped", "Embedding refresh jobs whose result was not used, by reason",
            ["reason"], registry=r,
        )
        self.activity = ActivityTracker(tracked_users)
        # Children bound once, for the per-change path.
        self.commit_to_updated_of = Labelled(self.commit_to_updated).labels
        self.changes_of = Labelled(self.changes).labels

    def freshness(self) -> Quantiles:
        """Commit → recommendation updated: p50/p99 and how many changes were measured."""
        return histogram_quantiles(self.commit_to_updated)
