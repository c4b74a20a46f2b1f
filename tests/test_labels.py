"""Labelled: a metric's children found again without prometheus_client's checks."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter

from tidegate._labels import Labelled


def test_the_same_values_give_the_same_child_and_counts_reach_the_registry() -> None:
    registry = CollectorRegistry()
    jobs = Labelled(Counter("jobs", "jobs", ["outcome", "model"], registry=registry))

    jobs.labels("succeeded", "m").inc()
    jobs.labels("succeeded", "m").inc(2)
    jobs.labels("dead", "m").inc()

    assert jobs.labels("succeeded", "m") is jobs.metric.labels("succeeded", "m")
    assert registry.get_sample_value("jobs_total", {"outcome": "succeeded", "model": "m"}) == 3
    assert registry.get_sample_value("jobs_total", {"outcome": "dead", "model": "m"}) == 1
