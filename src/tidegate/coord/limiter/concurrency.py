"""The adaptive concurrency limit of one worker: how many calls per key it may have in flight."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["AdaptiveConcurrency", "ConcurrencyState"]


@dataclass(frozen=True, slots=True)
class ConcurrencyState:
    """One key's adaptive concurrency, for metrics."""

    limit: int  # calls allowed at once now
    max_limit: int  # the ceiling (the model's max_concurrency)
    in_flight: int  # calls holding a slot


@dataclass(slots=True)
class _Window:
    limit: int
    max_limit: int
    in_flight: int = 0


class AdaptiveConcurrency:
    """Calls in flight per key in this worker, under an AIMD limit (as TCP does): each success
    adds 1 up to the ceiling, each throttle (429) halves it, never below 1. A key starts at its
    ceiling, the model's max_concurrency (or at `start` when given, if lower).

    In-process and per worker: a throttled provider shrinks every worker's window on its own,
    and the shared RateLimiter keeps their sum under the provider's limits. Not thread-safe:
    use it from one event loop.
    """

    def __init__(self, *, start: int | None = None, default_max: int = 64) -> None:
        if start is not None and start < 1:
            raise ValueError(f"start must be >= 1, got {start}")
        if default_max < 1:
            raise ValueError(f"default_max must be >= 1, got {default_max}")
        self.start = start
        self.default_max = default_max
        self._windows: dict[str, _Window] = {}

    def try_acquire(self, key: str, max_concurrency: int | None = None) -> bool:
        """Take a slot for a call on `key` if one is free. `max_concurrency` (the model's) sets
        the key's ceiling; a later, different value moves it."""
        window = self._window(key, max_concurrency)
        if window.in_flight >= window.limit:
            return False
        window.in_flight += 1
        return True

    def release(self, key: str) -> None:
        """Give back a slot taken by `try_acquire`."""
        window = self._windows.get(key)
        if window is None or window.in_flight <= 0:
            raise ValueError(f"release of {key!r} without a matching try_acquire")
        window.in_flight -= 1

    def on_success(self, key: str) -> None:
        """A call on `key` succeeded without throttling: one more slot, up to the ceiling."""
        window = self._window(key, None)
        window.limit = min(window.limit + 1, window.max_limit)

    def on_throttled(self, key: str) -> None:
        """A call on `key` was throttled (429): halve the slots, keeping at least one."""
        window = self._window(key, None)
        window.limit = max(window.limit // 2, 1)

    def limit(self, key: str) -> int:
        """The key's current limit (its starting limit if it was never used)."""
        return self._window(key, None).limit

    def in_flight(self, key: str) -> int:
        """Slots of the key held now."""
        window = self._windows.get(key)
        return 0 if window is None else window.in_flight

    def snapshot(self) -> dict[str, ConcurrencyState]:
        """Every key's limit, ceiling and slots in use."""
        return {
            key: ConcurrencyState(limit=w.limit, max_limit=w.max_limit, in_flight=w.in_flight)
            for key, w in self._windows.items()
        }

    def _window(self, key: str, max_concurrency: int | None) -> _Window:
        window = self._windows.get(key)
        if window is None:
            ceiling = max_concurrency or self.default_max
            start = ceiling if self.start is None else min(self.start, ceiling)
            window = self._windows[key] = _Window(limit=start, max_limit=ceiling)
        elif max_concurrency is not None and max_concurrency != window.max_limit:
            window.max_limit = max_concurrency
            window.limit = min(window.limit, max_concurrency)
        return window
