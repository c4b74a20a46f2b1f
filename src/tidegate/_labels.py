"""Prometheus metrics whose labelled children are looked up once per set of label values.

prometheus_client's `labels()` checks and converts every value and takes the metric's lock on
each call: a few microseconds, and a request touches a dozen labelled metrics on its way through
the gateway and the worker. The children it returns live as long as the metric does, so keeping
them in a dict keyed by the values changes nothing but the cost of finding them again.
"""

from __future__ import annotations

from typing import Generic, TypeVar

from prometheus_client.metrics import MetricWrapperBase

__all__ = ["Labelled"]

M = TypeVar("M", bound=MetricWrapperBase)


class Labelled(Generic[M]):
    """`metric` (a labelled Counter, Gauge or Histogram), with `labels(*values)` remembered."""

    __slots__ = ("_children", "metric")

    def __init__(self, metric: M) -> None:
        self.metric = metric
        self._children: dict[tuple[str, ...], M] = {}

    def labels(self, *values: str) -> M:
        """The child of these label values, as `metric.labels(*values)` gives it."""
        child = self._children.get(values)
        if child is None:
            child = self._children[values] = self.metric.labels(*values)
        return child
