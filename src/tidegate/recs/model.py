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

# The settings are a section of the configuration, their weights keyed by the kinds below.
from tidegate.config import DEFAULT_KIND_WEIGHTS, RecsSettings

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
    """What a user did with an item; each kind weighs differently (view < cart < purchase), as
    `RecsSettings.kind_weights` says. The configuration, below the recommender, names the kinds
    by their values (`DEFAULT_KIND_WEIGHTS`); tests/test_recs_engine.py checks they agree."""

    VIEW = "view"
    ADD_TO_CART = "add_to_cart"
    PURCHASE = "purchase"


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
