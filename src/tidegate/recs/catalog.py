"""The in-process copy of the item catalogue: a matrix of unit item vectors for nearest-item
search by one numpy dot product, with arrays of prices and stock for vectorised filters.

A `Catalog` follows the store's catalogue version: `sync` asks the store for its version (one
round trip) and, when it moved, applies only the items changed since (`RecsStore.items_since`).
Removed items leave a free row that the next new item reuses, so the matrix does not grow with
churn.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TypeVar

import numpy as np
import numpy.typing as npt

from tidegate.errors import ConfigError
from tidegate.recs.model import Item
from tidegate.recs.store.base import RecsStore

__all__ = ["Catalog"]

G = TypeVar("G", bound=np.generic)
SYNC_PAGE = 2000  # items per items_since round trip


class Catalog:
    """Item rows: `matrix[row]` is the unit vector of `items[row]` (a zero row when free)."""

    def __init__(self, dimension: int) -> None:
        self.dimension = dimension
        # Bumped by every change of the rows (the store's version does not see local puts):
        # what was computed over the rows at one count holds while it is the same.
        self.changes = 0
        self._clear()

    def _clear(self) -> None:
        self.version = 0
        self.changes += 1
        self.items: list[Item | None] = []
        self.rows: dict[str, int] = {}
        self.matrix: npt.NDArray[np.float32] = np.zeros((0, self.dimension), dtype=np.float32)
        self.price: npt.NDArray[np.float64] = np.zeros(0)  # NaN: unknown
        self.in_stock: npt.NDArray[np.bool_] = np.zeros(0, dtype=bool)
        self.alive: npt.NDArray[np.bool_] = np.zeros(0, dtype=bool)
        self._free: list[int] = []
        self._by_category: dict[str, set[int]] = {}

    def __len__(self) -> int:
        return len(self.rows)

    def get(self, item_id: str) -> Item | None:
        row = self.rows.get(item_id)
        return None if row is None else self.items[row]

    def vector(self, item_id: str) -> tuple[float, ...] | None:
        item = self.get(item_id)
        return None if item is None else item.vector

    async def sync(self, store: RecsStore) -> None:
        """Catch up with the store's catalogue (nothing to do when its version has not moved)."""
        version = await store.items_version()
        if version == self.version:
            return
        if version < self.version:  # the store was emptied or replaced: start again
            self._clear()
        while True:
            page = await store.items_since(self.version, SYNC_PAGE)
            for item_id, item in page.changes:
                if item is None:
                    self.remove(item_id)
                else:
                    self.put(item)
            self.version = page.version
            if page.complete:
                return

    def put(self, item: Item) -> None:
        """Add or replace an item; its `vector` must be its unit vector of `dimension` floats."""
        if item.vector is None or len(item.vector) != self.dimension:
            held = 0 if item.vector is None else len(item.vector)
            raise ConfigError(
                f"the recommendation store holds item {item.item_id!r} with a vector of {held} floats, "
                f"but this recommender's dimension is {self.dimension}: use the same settings everywhere "
                "or another store prefix"
            )
        self.changes += 1
        row = self.rows.get(item.item_id)
        if row is None:
            row = self._free.pop() if self._free else self._grow()
            self.rows[item.item_id] = row
        else:
            self._uncategorise(row)
        self.items[row] = item
        self.matrix[row] = np.asarray(item.vector, dtype=np.float32)
        self.price[row] = np.nan if item.price is None else item.price
        self.in_stock[row] = item.stock is None or item.stock > 0
        self.alive[row] = True
        for category in item.categories:
            self._by_category.setdefault(category, set()).add(row)

    def remove(self, item_id: str) -> None:
        row = self.rows.pop(item_id, None)
        if row is None:
            return
        self.changes += 1
        self._uncategorise(row)
        self.items[row] = None
        self.matrix[row] = 0.0
        self.alive[row] = False
        self.in_stock[row] = False
        self._free.append(row)

    def category_mask(self, categories: Iterable[str]) -> npt.NDArray[np.bool_]:
        """Rows of items in any of `categories`."""
        mask = np.zeros(len(self.items), dtype=bool)
        for category in categories:
            rows = self._by_category.get(category)
            if rows:
                mask[list(rows)] = True
        return mask

    def _uncategorise(self, row: int) -> None:
        item = self.items[row]
        if item is not None:
            for category in item.categories:
                rows = self._by_category.get(category)
                if rows is not None:
                    rows.discard(row)
                    if not rows:
                        del self._by_category[category]

    def _grow(self) -> int:
        row = len(self.items)
        if row == self.matrix.shape[0]:
            capacity = max(64, 2 * row)
            self.matrix = _resized(self.matrix, (capacity, self.dimension))
            self.price = _resized(self.price, (capacity,))
            self.in_stock = _resized(self.in_stock, (capacity,))
            self.alive = _resized(self.alive, (capacity,))
        self.items.append(None)
        return row

    def view(self) -> tuple[npt.NDArray[np.float32], int]:
        """The used part of the matrix and its row count."""
        used = len(self.items)
        return self.matrix[:used], used


def _resized(array: npt.NDArray[G], shape: tuple[int, ...]) -> npt.NDArray[G]:
    grown = np.zeros(shape, dtype=array.dtype)
    grown[: array.shape[0]] = array
    return grown
