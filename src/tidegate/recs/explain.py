"""Short reasons for recommended items, named after the signal that weighed most in the score.

- co-occurrence: "bought together with <X>", X the anchor (a recent item of the user, or the
  context item) that contributed most;
- profile: "similar to <Y> you viewed" (or "… you added to your cart", "… you bought", after the
  kind of the user's interaction with Y), Y the recent item most like the candidate;
- repeat (buy-again): "you buy this regularly" when the user's decayed purchase count of the item
  is at least `REGULAR_COUNT` (several recent purchases), else "bought again by you";
- trending: "trending in <category>" (the query's category when the item has it, else its first
  one), "trending now" for an item without categories.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from tidegate.recs.model import InteractionKind, Item

__all__ = [
    "REGULAR_COUNT", "bought_together", "buy_again", "item_name", "similar_to", "trending_in",
    "verb_for_weight",
]

_VERBS = {
    InteractionKind.VIEW.value: "viewed",
    InteractionKind.ADD_TO_CART.value: "added to your cart",
    InteractionKind.PURCHASE.value: "bought",
}


REGULAR_COUNT = 2.0
"""A decayed purchase count from which an item is one the user "buys regularly"."""


def buy_again(count: float) -> str:
    """The reason for an item the user bought before, by its decayed purchase count."""
    return "you buy this regularly" if count >= REGULAR_COUNT else "bought again by you"


def item_name(item: Item | None, item_id: str) -> str:
    """How a reason names an item: its name, else its id."""
    return item.name if item is not None and item.name else item_id


def bought_together(anchor_name: str) -> str:
    return f"bought together with {anchor_name}"


def similar_to(name: str | None, verb: str = "viewed") -> str:
    return f"similar to {name} you {verb}" if name else "similar to items you viewed"


def trending_in(item: Item | None, preferred: Sequence[str] = ()) -> str:
    categories = item.categories if item is not None else ()
    for category in preferred:
        if category in categories:
            return f"trending in {category}"
    return f"trending in {categories[0]}" if categories else "trending now"


def verb_for_weight(weight: float, kind_weights: Mapping[str, float]) -> str:
    """The verb of the strongest interaction kind whose weight is `weight` ("viewed" when none)."""
    for kind in (InteractionKind.PURCHASE, InteractionKind.ADD_TO_CART, InteractionKind.VIEW):
        if kind_weights.get(kind.value) == weight:
            return _VERBS[kind.value]
    return "viewed"
