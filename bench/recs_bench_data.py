"""The synthetic shop every part of the recommendations benchmark uses: a catalogue of products
named like the demo shop's (feature-hashed vectors, categories from `tidegate.demo.shop`), a
population of users, and a stream of interactions drawn the way shops see them.

Draws (numpy, seeded, so each part sees the same shop):

- items: each user has a favourite category; 70 % of their interactions fall in it, the rest
  anywhere. Within either, popularity is Zipf-like over a fixed random ranking
  (p ∝ 1 / (rank + 10)^1.1), so a few hundred items take much of the traffic and the tail is long;
- users: activity is Zipf-like too (p ∝ 1 / (rank + 20)^1.0): a few heavy users, many occasional;
- kinds: 75 % views, 17 % adds to cart, 8 % purchases (the demo shop's `LoadMix`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import numpy as np
import numpy.typing as npt
import orjson

from tidegate.testing import Interaction, InteractionKind, Item, Recommender, categories_of

ADJECTIVES = ("Vintage", "Red", "Pink", "Blue", "Ivory", "Regency", "Rustic", "Polkadot", "Retro", "Floral",
              "Glass", "Enamel", "Wooden", "Zinc", "Paper", "Green", "Gold", "Silver", "Striped", "Spotty")
NOUNS = ("Heart Lantern", "Cake Stand", "Tea Cup", "Lunch Bag", "Storage Tin", "Photo Frame", "Doormat",
         "Candle Holder", "Bunting", "Christmas Bauble", "Alarm Clock", "Garden Planter", "Necklace",
         "Notebook", "Toy Theatre", "Tote Bag", "Wall Clock", "Cushion Cover", "Gift Wrap", "Jam Jar",
         "Birthday Card", "Doll House", "Flower Pot", "Tea Set", "Party Balloons")
MOTIFS = ("Birds", "Roses", "Stars", "Spots", "Owls", "Hearts", "Leaves", "Dogs", "Cats", "Bees", "Paisley",
          "Gingham", "Daisies", "Apples", "Snowflakes", "Robins", "Butterflies", "Strawberries", "Anchors",
          "Ducks")
KINDS = (InteractionKind.VIEW, InteractionKind.ADD_TO_CART, InteractionKind.PURCHASE)
KIND_SHARES = (0.75, 0.17, 0.08)
FAVOURITE_SHARE = 0.7
ITEM_SKEW, ITEM_OFFSET = 1.1, 10.0
USER_SKEW, USER_OFFSET = 1.0, 20.0
HISTORY_SPAN_S = 6 * 3600.0  # the seeded history spreads over the last six hours


def item_id(index: int) -> str:
    """A five-or-more-digit stock code, as the demo shop's."""
    return f"{10000 + index:05d}"


def user_id(index: int) -> str:
    """A customer number, as the demo shop's."""
    return str(100000 + index)


@dataclass(frozen=True, slots=True)
class Product:
    """One catalogue row, in the demo shop's columns."""

    item_id: str
    name: str
    description: str
    price: float
    stock: int
    categories: tuple[str, ...]

    def item(self) -> Item:
        """As the recommender takes it (what RecsSink makes of the row)."""
        return Item(self.item_id, self.name, self.description, self.categories, self.price, self.stock)

    def row(self) -> tuple[object, ...]:
        """(id, name, description, price, stock, categories JSON) for an INSERT."""
        return (self.item_id, self.name, self.description, self.price, self.stock,
                orjson.dumps(list(self.categories)).decode())


def _weights(count: int, skew: float, offset: float) -> npt.NDArray[np.float64]:
    ranks = np.arange(count, dtype=np.float64)
    weights: npt.NDArray[np.float64] = 1.0 / (ranks + offset) ** skew
    normalised: npt.NDArray[np.float64] = weights / weights.sum()
    return normalised


class Shop:
    """The catalogue, the users and the interaction draws (see the module docstring)."""

    def __init__(self, products: int, users: int, *, seed: int = 5) -> None:
        rng = np.random.default_rng(seed)
        adjectives, nouns, motifs = (rng.integers(0, len(words), products)
                                     for words in (ADJECTIVES, NOUNS, MOTIFS))
        prices = rng.uniform(0.4, 40.0, products)
        stock = rng.integers(1, 500, products)
        self.products = [self._product(i, int(adjectives[i]), int(nouns[i]), int(motifs[i]), float(prices[i]),
                                       int(stock[i])) for i in range(products)]
        self.users = users
        # Popularity follows a random ranking of the items, not their ids.
        self._ranking = rng.permutation(products)
        self._item_p = _weights(products, ITEM_SKEW, ITEM_OFFSET)
        by_category: dict[str, list[int]] = {}
        for index in self._ranking:  # most popular first within each category too
            by_category.setdefault(self.products[index].categories[0], []).append(int(index))
        self._categories = sorted(by_category)
        self._members = [np.array(by_category[c]) for c in self._categories]
        self._member_p = [_weights(len(m), ITEM_SKEW, ITEM_OFFSET) for m in self._members]
        self._favourite = rng.integers(0, len(self._categories), users)
        self._user_ranking = rng.permutation(users)
        self._user_p = _weights(users, USER_SKEW, USER_OFFSET)

    @staticmethod
    def _product(index: int, adjective: int, noun: int, motif: int, price: float, stock: int) -> Product:
        name = f"{ADJECTIVES[adjective]} {NOUNS[noun]} with {MOTIFS[motif]}"
        return Product(item_id(index), name, f"{name}.", round(price, 2), stock, tuple(categories_of(name)))

    def draw_users(self, count: int, rng: np.random.Generator) -> npt.NDArray[np.int64]:
        """User indices by activity."""
        ranks = rng.choice(self.users, size=count, p=self._user_p)
        drawn: npt.NDArray[np.int64] = self._user_ranking[ranks]
        return drawn

    def draw(self, count: int, rng: np.random.Generator) -> Iterator[tuple[int, int, InteractionKind]]:
        """`count` interactions: (user index, item index, kind)."""
        users = self.draw_users(count, rng)
        items = self._ranking[rng.choice(len(self.products), size=count, p=self._item_p)]
        favourite = np.where(rng.random(count) < FAVOURITE_SHARE, self._favourite[users], -1)
        for category, members in enumerate(self._members):
            chosen = np.flatnonzero(favourite == category)
            if chosen.size:
                picks = rng.choice(len(members), size=chosen.size, p=self._member_p[category])
                items[chosen] = members[picks]
        kinds = rng.choice(len(KINDS), size=count, p=KIND_SHARES)
        for user, item, kind in zip(users.tolist(), items.tolist(), kinds.tolist(), strict=True):
            yield user, item, KINDS[kind]

    def popular(self, count: int) -> list[str]:
        """The ids of the `count` most popular items."""
        return [self.products[int(i)].item_id for i in self._ranking[:count]]

    def history(self, count: int, rng: np.random.Generator, *, end: datetime | None = None,
                span_s: float = HISTORY_SPAN_S) -> list[Interaction]:
        """`count` interactions spread evenly over `span_s` before `end` (now), oldest first."""
        end = end or datetime.now(UTC)
        start = end - timedelta(seconds=span_s)
        step_s = span_s / max(count, 1)
        return [Interaction(user_id(user), self.products[item].item_id, kind,
                            start + timedelta(seconds=n * step_s))
                for n, (user, item, kind) in enumerate(self.draw(count, rng))]


async def seed(recommender: Recommender, products: Sequence[Product], history: Sequence[Interaction],
               batch: int = 500) -> None:
    """The catalogue, then the history in batches (as the change flow would feed them)."""
    for product in products:
        await recommender.upsert_item(product.item())
    for start in range(0, len(history), batch):
        await recommender.record(history[start:start + batch])
