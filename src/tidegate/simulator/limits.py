"""The simulated provider's own rate limit (a sliding window per model) and what it observed.

A sliding window of accepted requests is the strictest reading of "N per window": whatever
instant a test picks, the window ending there holds at most N requests, and `ModelStats` keeps
the accepted timestamps so a test can check exactly that.
"""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Admission", "ModelStats", "SlidingWindow", "max_in_window"]


@dataclass(frozen=True, slots=True)
class Admission:
    """The limiter's answer for one request, and the numbers for the x-ratelimit-* headers.

    `retry_after_s` is set when refused: how long until the request would fit. The `reset_*_s`
    are how long until the budget grows again (the oldest counted request leaves the window).
    """

    accepted: bool
    retry_after_s: float | None
    remaining_requests: int | None
    remaining_tokens: int | None
    reset_requests_s: float
    reset_tokens_s: float


class SlidingWindow:
    """Requests and tokens accepted in the last `window_s` seconds, for one model."""

    def __init__(self) -> None:
        self._events: deque[tuple[float, int]] = deque()  # (accepted at, tokens), oldest first
        self._tokens = 0

    def _expire(self, now: float, window_s: float) -> None:
        events = self._events
        while events and events[0][0] <= now - window_s:
            self._tokens -= events.popleft()[1]

    def admit(self, now: float, window_s: float, tokens: int, rpm: int | None, tpm: int | None) -> Admission:
        """Count the request if it fits both limits (None: unlimited); say when it would fit
        if not."""
        self._expire(now, window_s)
        events = self._events
        waits: list[float] = []
        if rpm is not None and len(events) >= rpm:
            # The request fits once enough of the oldest leave that fewer than rpm remain.
            waits.append(events[len(events) - rpm][0] + window_s - now)
        if tpm is not None and self._tokens + tokens > tpm:
            waits.append(self._token_wait(now, window_s, tokens, tpm))
        accepted = not waits
        if accepted:
            events.append((now, tokens))
            self._tokens += tokens
        reset_s = max(0.0, events[0][0] + window_s - now) if events else 0.0
        return Admission(
            accepted=accepted,
            retry_after_s=max(waits) if waits else None,
            remaining_requests=None if rpm is None else max(0, rpm - len(events)),
            remaining_tokens=None if tpm is None else max(0, tpm - self._tokens),
            reset_requests_s=reset_s,
            reset_tokens_s=reset_s,
        )

    def _token_wait(self, now: float, window_s: float, tokens: int, tpm: int) -> float:
        if tokens > tpm:  # never fits; a real provider says the same after a full window
            return window_s
        excess = self._tokens + tokens - tpm
        for accepted_at, counted in self._events:
            excess -= counted
            if excess <= 0:
                return accepted_at + window_s - now
        return window_s

    def clear(self) -> None:
        """Forget every counted request."""
        self._events.clear()
        self._tokens = 0


def max_in_window(timestamps_s: list[float], window_s: float) -> int:
    """The most timestamps that any window (t - window_s, t] holds: the same counting as the
    limiter, so a run that respected a limit of N never shows more than N here."""
    ordered = sorted(timestamps_s)
    best = start = 0
    for end, t in enumerate(ordered):
        while ordered[start] <= t - window_s:
            start += 1
        best = max(best, end - start + 1)
    return best


@dataclass
class ModelStats:
    """What the simulator saw for one model since it started (or was reset).

    `accepted_at_s` are the times, in seconds since the simulator started, of requests the rate
    limiter let through (at most `stats_max_timestamps` of the most recent are kept).
    """

    received: int = 0
    accepted: int = 0
    by_status: Counter[int] = field(default_factory=Counter)
    faults: Counter[str] = field(default_factory=Counter)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    accepted_at_s: deque[float] = field(default_factory=deque)

    def max_in_window(self, window_s: float) -> int:
        """The most accepted requests that any window of that length held."""
        return max_in_window(list(self.accepted_at_s), window_s)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (status codes become strings, as JSON keys must be)."""
        return {
            "received": self.received,
            "accepted": self.accepted,
            "by_status": {str(status): n for status, n in sorted(self.by_status.items())},
            "faults": dict(sorted(self.faults.items())),
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "accepted_at_s": list(self.accepted_at_s),
        }
