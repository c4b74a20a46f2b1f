"""The recommender's plain types: what goes in (items, interactions), what is asked (a query)
and what comes out (scored items with their reasons). No I/O here.

Signals, all decayed with time so that yesterday's behaviour counts less than this hour's:

- the user's profile: a decayed, interaction-weighted sum of the vectors of items they touched;
- co-occurrence: items touched by the same user within a session window, decayed, a bounded
  neighbour list per item;
- trending: decayed popularity, global and per category;
- buy-again ("repeat"): per user, a decayed purchase count of each item they bought, a candidate
  and a signal only when a query lets purchased items through (`exclude_purchased=False`).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime

__all__ = [
    "DEFAULT_KIND_WEIGHTS",
    "Interaction",
    "InteractionKind",
    "Item",
    "RecQuery",
    "RecResult",
    "Recommendation",
    "RecsSettings",
]


class InteractionKind(enum.StrEnum):
    """What a user did with an item; each kind weighs differently (view < cart < purchase)."""

    VIEW = "view"
    ADD_TO_CART = "add_to_cart"
    PURCHASE = "purchase"


DEFAULT_KIND_WEIGHTS: Mapping[str, float] = {"view": 1.0, "add_to_cart": 3.0, "purchase": 5.0}


@dataclass(frozen=True, slots=True)
class Interaction:
    """One user action on one item at a UTC time."""

    user_id: str
    item_id: str
    kind: InteractionKind
    at: datetime  # timezone-aware
    quantity: int = 1


@dataclass(frozen=True, slots=True)
class Item:
    """A recommendable product as the recommender sees it. `vector` is None when the item has
    none yet (it is then derived from the text and categories by feature hashing)."""

    item_id: str
    name: str = ""
    description: str = ""
    categories: tuple[str, ...] = ()
    price: float | None = None
    stock: int | None = None  # None: unknown, treated as in stock
    vector: tuple[float, ...] | None = None


@dataclass(frozen=True, slots=True)
class RecQuery:
    """What `GET /v1/recommendations/{user_id}` asks. `context` is an item the user is looking
    at (its neighbours become candidates; on a cold start its category frames the trending)."""

    user_id: str
    n: int = 10
    context: str | None = None
    categories: tuple[str, ...] = ()
    min_price: float | None = None
    max_price: float | None = None
    explain: bool = False
    in_stock_only: bool = True
    exclude_purchased: bool = True
    diversity: float = 0.0  # 0: pure score order; up to 1: penalise items like those above them


@dataclass(frozen=True, slots=True)
class Recommendation:
    """One recommended item, its blended score and the signals behind it."""

    item_id: str
    score: float
    # "profile", "co_occurrence", "trending"; and "repeat" when the item is one the user bought
    # before and the query lets purchased items through
    signals: Mapping[str, float] = field(default_factory=dict)
    reason: str | None = None  # with explain: "bought together with X", "you buy this regularly", ...


@dataclass(frozen=True, slots=True)
class RecResult:
    """The answer to a query."""

    user_id: str
    items: tuple[Recommendation, ...]
    cold_start: bool  # the user had no history: the items are trending (in context)
    generated_at: datetime


@dataclass(frozen=True, slots=True)
class RecsSettings:
    """How the recommender weighs and decays its signals."""

    dimension: int = 64  # the size of item and profile vectors
    decay_hours: float = 24.0  # half-life of profiles and of the recent items' anchor weights
    kind_weights: Mapping[str, float] = field(default_factory=lambda: dict(DEFAULT_KIND_WEIGHTS))
    session_window_s: float = 1800.0  # items touched within this window co-occur
    recent_items: int = 20  # per user, for co-occurrence and candidates
    max_neighbours: int = 50  # per item
    # The blended score: weights of each normalised signal (documented in tidegate.recs.score).
    weight_profile: float = 0.5
    weight_co_occurrence: float = 0.35
    weight_trending: float = 0.15
    max_n: int = 100
    # Bounds of the shared state (added after the first release of this type; defaults keep the
    # earlier behaviour for every catalogue of up to this many items).
    max_trending: int = 10_000  # items kept per trending list (global, each category)
    # The purchased set is exact: "exclude purchased" must never let a bought item through, and
    # a set entry is ~50 bytes, so even a wholesaler buying a whole catalogue of thousands of
    # items fits; this bound only protects the store from a runaway id stream.
    max_purchased: int = 100_000  # purchases remembered per user (for "exclude purchased")
    # Half-lives of the shared signals (hours), apart from the profile's: a co-occurrence or a
    # sale is evidence about the items for weeks, whereas a profile follows a user's current
    # intent. Chosen on the validation month of bench/recs_quality.py (see BENCHMARKS.md).
    co_occurrence_decay_hours: float = 24.0 * 7
    trending_decay_hours: float = 24.0 * 7
    # Buy-again: per user, each purchased item's purchase count decayed with this half-life (a
    # re-order cycle is weeks to months), the `max_repeat` strongest kept; its weight in the
    # blended score applies only when purchased items are allowed (documented in score.py).
    repeat_decay_hours: float = 24.0 * 90
    weight_repeat: float = 2.0
    max_repeat: int = 1000
