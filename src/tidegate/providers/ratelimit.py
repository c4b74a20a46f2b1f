"""What a provider says about its rate limits: the `x-ratelimit-*` headers and `Retry-After`.

Parsing is lenient by design: a header that is absent or that this code cannot read becomes None,
never an exception, because a provider's odd header must not fail a call that otherwise worked.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime

__all__ = ["RateLimitInfo", "parse_duration_s", "parse_retry_after"]

# OpenAI writes resets in Go's duration format ("6m0s", "1m30.5s", "20ms"); some providers send
# plain seconds ("30", "0.5"). Go also allows h, us/µs and ns, so those are read as well.
_UNIT_S = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}
_NUMBER = r"(?:\d+(?:\.\d*)?|\.\d+)"
_PLAIN_SECONDS = re.compile(_NUMBER)
_GO_DURATION = re.compile(rf"(?:{_NUMBER}(?:ns|us|µs|ms|s|m|h))+")
_GO_PART = re.compile(rf"({_NUMBER})(ns|us|µs|ms|s|m|h)")


def parse_duration_s(value: str | None) -> float | None:
    """Seconds in an OpenAI-style duration ("1s", "6m0s", "20ms", "1m30.5s") or plain seconds
    ("30", "0.5"); None when absent or unreadable."""
    if value is None:
        return None
    text = value.strip()
    if _PLAIN_SECONDS.fullmatch(text):
        return float(text)
    if not _GO_DURATION.fullmatch(text):
        return None
    return sum(float(number) * _UNIT_S[unit] for number, unit in _GO_PART.findall(text))


def parse_retry_after(value: str | None, now: datetime | None = None) -> float | None:
    """Seconds to wait from a `Retry-After` value in either of its forms (RFC 9110): delta-seconds
    ("120", and the fractional "1.5" some providers send) or an HTTP-date, counted from `now`
    (default: the current UTC time). Never negative; None when absent or unreadable."""
    if value is None:
        return None
    text = value.strip()
    if _PLAIN_SECONDS.fullmatch(text):
        return float(text)
    try:
        when = parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:  # "-0000" means UTC without saying so
        when = when.replace(tzinfo=UTC)
    reference = now if now is not None else datetime.now(UTC)
    if reference.tzinfo is None:
        reference = reference.replace(tzinfo=UTC)
    return max(0.0, (when - reference).total_seconds())


def _parse_count(value: str | None) -> int | None:
    if value is None:
        return None
    text = value.strip()
    if text.isdigit():
        return int(text)
    # A few providers write counts as floats ("59.0"); a fraction of a request means nothing.
    try:
        number = float(text)
    except ValueError:
        return None
    return int(number) if math.isfinite(number) and number >= 0 else None


@dataclass(frozen=True, slots=True)
class RateLimitInfo:
    """The provider's view of its limits after a response; each field None when not sent.

    `reset_*_s` is how long until that budget grows again, in seconds.
    """

    limit_requests: int | None = None
    limit_tokens: int | None = None
    remaining_requests: int | None = None
    remaining_tokens: int | None = None
    reset_requests_s: float | None = None
    reset_tokens_s: float | None = None

    @classmethod
    def from_headers(cls, headers: Mapping[str, str]) -> RateLimitInfo:
        """Read the `x-ratelimit-*` headers; `headers` must look names up case-insensitively or
        hold lowercase names (aiohttp's and httpx's header objects do the former)."""
        return cls(
            limit_requests=_parse_count(headers.get("x-ratelimit-limit-requests")),
            limit_tokens=_parse_count(headers.get("x-ratelimit-limit-tokens")),
            remaining_requests=_parse_count(headers.get("x-ratelimit-remaining-requests")),
            remaining_tokens=_parse_count(headers.get("x-ratelimit-remaining-tokens")),
            reset_requests_s=parse_duration_s(headers.get("x-ratelimit-reset-requests")),
            reset_tokens_s=parse_duration_s(headers.get("x-ratelimit-reset-tokens")),
        )

    @property
    def known(self) -> bool:
        """Whether the provider sent any rate-limit header at all."""
        return any(getattr(self, name) is not None for name in self.__slots__)

    def wait_hint_s(self) -> float | None:
        """How long until a request can pass, judged from the headers alone (used when a 429
        carries no Retry-After): the reset of each exhausted budget, or of every budget when
        none is reported exhausted."""
        exhausted = [
            reset
            for remaining, reset in ((self.remaining_requests, self.reset_requests_s),
                                     (self.remaining_tokens, self.reset_tokens_s))
            if remaining == 0 and reset is not None
        ]
        candidates = exhausted or [r for r in (self.reset_requests_s, self.reset_tokens_s) if r is not None]
        return max(candidates) if candidates else None
