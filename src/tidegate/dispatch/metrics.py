"""Prometheus metrics of the dispatcher. One `DispatchMetrics` per registry, so tests and
several workers in one process can keep their own."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from tidegate._labels import Labelled

_WAIT_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)
_LATENCY_BUCKETS_S = (0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 15, 30, 60, 120)


class DispatchMetrics:
    """Jobs by outcome, queue wait and upstream latency, tokens, cost, 429s, in-flight, limiter,
    and the jobs sent through providers' own batch APIs."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.jobs = Labelled(Counter(
            "tidegate_jobs", "AI jobs handled by workers, by outcome",
            ["outcome", "priority", "model"], registry=r,
        ))
        self.queue_wait = Labelled(Histogram(
            "tidegate_queue_wait_seconds", "Time from claimable to claimed",
            ["priority"], buckets=_WAIT_BUCKETS_S, registry=r,
        ))
        self.upstream_latency = Labelled(Histogram(
            "tidegate_upstream_latency_seconds", "Provider call duration",
            ["priority", "model"], buckets=_LATENCY_BUCKETS_S, registry=r,
        ))
        self.tokens = Labelled(Counter(
            "tidegate_tokens", "Tokens used, by direction", ["model", "direction"], registry=r,
        ))
        self.cost_usd = Labelled(Counter(
            "tidegate_cost_usd", "Spend in USD", ["model", "tenant"], registry=r,
        ))
        self.throttled = Labelled(Counter(
            "tidegate_upstream_429", "429 answers from providers", ["model"], registry=r,
        ))
        self.deferred = Labelled(Counter(
            "tidegate_jobs_deferred", "Jobs parked without counting an attempt, by reason",
            ["reason"], registry=r,
        ))
        self.budget_refusals = Labelled(Counter(
            "tidegate_budget_refusals", "Reservations a budget refused, by what became of the job "
            "(dead, deferred, stepped_down) and why", ["outcome", "reason"], registry=r,
        ))
        self.in_flight = Labelled(Gauge(
            "tidegate_in_flight", "Provider calls under way", ["model"], registry=r,
        ))
        self.concurrency_limit = Labelled(Gauge(
            "tidegate_concurrency_limit", "Adaptive (AIMD) concurrency limit per model",
            ["model"], registry=r,
        ))
        self.provider_batches = Labelled(Counter(
            "tidegate_provider_batches", "Batches submitted to a provider's own batch API",
            ["provider"], registry=r,
        ))
        self.provider_batch_jobs = Labelled(Counter(
            "tidegate_provider_batch_jobs", "Jobs sent through a provider's own batch API, by what became "
            "of them (submitted, collected, served_live)", ["provider", "outcome"], registry=r,
        ))
        self.paused_until = Labelled(Gauge(
            "tidegate_limiter_paused_until_seconds",
            "Unix time until which a model is paused after a 429 (0 = not paused)",
            ["model"], registry=r,
        ))
