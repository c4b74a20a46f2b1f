"""Model health for fallback: a model that keeps failing is skipped for a while."""

from __future__ import annotations

import time
from collections.abc import Callable


class ModelHealth:
    """Counts consecutive retryable failures per model. After `threshold` of them the model is
    skipped for `cooldown_s`; then one job may try it again (half-open), and a success clears it."""

    def __init__(
        self, threshold: int, cooldown_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.threshold = threshold
        self.cooldown_s = cooldown_s
        self._clock = clock
        self._failures: dict[str, int] = {}
        self._skip_until: dict[str, float] = {}

    def failure(self, model: str) -> None:
        """Record a retryable failure (5xx, timeout, connection, malformed body)."""
        count = self._failures.get(model, 0) + 1
        self._failures[model] = count
        if count >= self.threshold:
            self._skip_until[model] = self._clock() + self.cooldown_s

    def success(self, model: str) -> None:
        """A success clears the model's record."""
        self._failures.pop(model, None)
        self._skip_until.pop(model, None)

    def failing(self) -> frozenset[str]:
        """Models to skip now."""
        now = self._clock()
        return frozenset(model for model, until in self._skip_until.items() if until > now)
