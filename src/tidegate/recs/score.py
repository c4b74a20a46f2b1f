"""The recommender's arithmetic: time decay of its signals and the blended score.

**Decay.** Every signal decays with its own half-life `h` (`RecsSettings`: `decay_hours` for the
profile and the recent items' anchor weights, `co_occurrence_decay_hours`, `trending_decay_hours`,
`repeat_decay_hours` for the buy-again counts): an interaction of weight `w` at time `t` counts
`w · 2^(-(now - t) / h)` when read at `now`. Decayed sums are kept so that an update is one
addition and never rescans history:

- scalar sums (co-occurrence weights, trending popularity, buy-again counts) use *forward decay*
  against the Unix epoch, stored as base-2 logarithms: `L = log2(Σ w · 2^(t / h))`. Adding an
  event is a log-add, reading divides by `2^(now / h)` (`decayed`). Logarithms never overflow
  however long the process runs (the plain forward-decayed sum would pass 1e308 after about
  1,000 half-lives), and since every entry decays by the same factor, the order of entries by `L`
  is their order at any reading time: a sorted set of `L` values stays correctly ranked without
  ever being rewritten;
- vectors (user profiles) have signed components and cannot be kept as logarithms: a profile is
  stored as its value at its last update time `t_last`, and an update at `t >= t_last` first decays
  it to `t` (`S ← S · 2^(-(t - t_last)/h) + w · v`); an older event is added already decayed
  (`S ← S + w · 2^(-(t_last - t)/h) · v`). Both are O(dimension).

**The blended score** of a candidate item `c` for a user is

    score(c) = weight_profile · profile(c) + weight_co_occurrence · co(c) + weight_trending · trend(c)
               + weight_repeat · repeat(c)

with each signal normalised to [0, 1]:

- `profile(c)`: the cosine similarity of the user's profile vector and the item's vector, negative
  values counted as 0 (item vectors are unit length, so this is `max(0, p·v / |p|)`);
- `co(c)`: `Σ_a anchor(a) · N(a → c)` over the anchors `a` — the user's recent items, each weighted
  by its kind weight decayed since the user touched it, and the query's context item, weighted as
  the strongest interaction kind at the reading time — where `N(a → c)` is the decayed
  co-occurrence weight of `c` in `a`'s neighbour list; divided by the largest such sum among the
  eligible candidates, so the strongest co-occurring candidate scores 1;
- `trend(c)`: the item's decayed global popularity divided by that of the most popular item still
  in the catalogue (on a cold start, the popularity within the trending scope instead);
- `repeat(c)` (buy-again): only when the query lets purchased items through
  (`exclude_purchased=False`), else 0. The user's purchase count of `c`, each purchase weighing 1
  and decaying with `repeat_decay_hours`, divided by the user's largest such count, so the item
  they buy most (lately) scores 1. Every item in the user's kept counts is a candidate; an item
  bought within the session window before now stays out (it is in the basket being bought).

The weights come from `RecsSettings` (default 0.5 / 0.35 / 0.15, and 2 for repeat); they need not
sum to 1. Repeat weighs more than the three others together on purpose: on the replayed retail
data half of what a returning customer buys is a re-order, and the validation month scored
weights 2 and 4 alike and clearly above 0.5 and 1 (bench/recs_quality.py, BENCHMARKS.md); the
other signals then order the user's own items among themselves and fill the list after them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tidegate.recs.model import RecsSettings

__all__ = [
    "MAX_EXPONENT",
    "Signals",
    "blend",
    "decay_factor",
    "decayed",
    "log_add",
    "log_weight",
]

_LN2 = math.log(2.0)
MAX_EXPONENT = 1000.0
"""Exponents of 2 are clamped here: a reading far before the events (a clock set back) gives a
huge but finite number instead of an OverflowError."""


def log_weight(weight: float, at_s: float, half_life_s: float) -> float:
    """`log2(weight · 2^(at_s / half_life_s))`: one event of `weight` at `at_s` (seconds since the
    epoch) in forward-decayed log form. `weight` must be > 0."""
    return math.log2(weight) + at_s / half_life_s


def log_add(a: float, b: float) -> float:
    """`log2(2^a + 2^b)` without leaving log space (so without overflow)."""
    if a < b:
        a, b = b, a
    if b == -math.inf:
        return a
    return a + math.log1p(2.0 ** (b - a)) / _LN2


def decayed(log_value: float, now_s: float, half_life_s: float) -> float:
    """The value at `now_s` of a forward-decayed log sum (see `log_weight`)."""
    return math.pow(2.0, min(MAX_EXPONENT, log_value - now_s / half_life_s))


def decay_factor(elapsed_s: float, half_life_s: float) -> float:
    """`2^(-elapsed_s / half_life_s)`: what a weight of 1 is worth `elapsed_s` later."""
    return math.pow(2.0, min(MAX_EXPONENT, -elapsed_s / half_life_s))


@dataclass(frozen=True, slots=True)
class Signals:
    """A candidate's normalised signals, each in [0, 1] (see the module docstring)."""

    profile: float = 0.0
    co_occurrence: float = 0.0
    trending: float = 0.0
    repeat: float = 0.0

    def weighted(self, settings: RecsSettings) -> dict[str, float]:
        """Each signal times its weight: the parts the score is the sum of."""
        return {
            "profile": settings.weight_profile * self.profile,
            "co_occurrence": settings.weight_co_occurrence * self.co_occurrence,
            "trending": settings.weight_trending * self.trending,
            "repeat": settings.weight_repeat * self.repeat,
        }

    def as_dict(self) -> dict[str, float]:
        """The signals by name, as `Recommendation.signals` carries them; "repeat" only for an
        item the user bought before, asked for with purchased items allowed."""
        found = {"profile": self.profile, "co_occurrence": self.co_occurrence, "trending": self.trending}
        if self.repeat > 0:
            found["repeat"] = self.repeat
        return found


def blend(signals: Signals, settings: RecsSettings) -> float:
    """The blended score: the weighted sum of the normalised signals."""
    return (
        settings.weight_profile * signals.profile
        + settings.weight_co_occurrence * signals.co_occurrence
        + settings.weight_trending * signals.trending
        + settings.weight_repeat * signals.repeat
    )
