"""The demo's shop side: while the requests flow, the demo writes to the shop's database as a
shop's application would (`ShopLoad`: interactions, price and stock changes, new and deleted
products), and one customer — the demo user, the most active one in the shop — keeps clicking,
putting in the cart and buying. Every write is captured by the change flow, applied to the entity
cache and to the recommender; the demo reads that user's top recommendations and the commit →
recommendation-updated latency back through the API (GET /v1/recommendations/{user},
GET /v1/health), as the dashboard does.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import random
import sqlite3
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tidegate._sqlite import connect, immediate
from tidegate.demo.shop import ShopLoad

__all__ = ["RecsReading", "RecsWatch", "ShopDriver", "TopItem", "most_active_user"]

SHOWN = 5  # the demo user's items shown in the live view and the summary
_CLICK_KINDS = ("view", "view", "view", "add_to_cart", "purchase")


def most_active_user(path: str | Path) -> str | None:
    """The shop's customer with the most interactions (ties: the smallest id); None when none."""
    with contextlib.closing(sqlite3.connect(str(path))) as conn:
        row = conn.execute("SELECT user_id FROM interactions GROUP BY user_id "
                           "ORDER BY count(*) DESC, user_id LIMIT 1").fetchone()
    return None if row is None else str(row[0])


def product_names(path: str | Path, ids: Sequence[str]) -> dict[str, str]:
    """The names of these products (those that still exist)."""
    if not ids:
        return {}
    with contextlib.closing(sqlite3.connect(str(path))) as conn:
        marks = ",".join("?" * len(ids))
        return {str(i): str(n) for i, n in conn.execute(
            f"SELECT id, name FROM products WHERE id IN ({marks})", list(ids))}


class ShopDriver:
    """Writes to the demo shop at `path`: ShopLoad's mix at `rate_per_s`, and a click of the demo
    user every `click_every_s` (a view mostly, now and then an add to cart or a purchase, which
    takes the stock down like ShopLoad's)."""

    def __init__(self, path: str | Path, user: str | None, *, rate_per_s: float, click_every_s: float,
                 seed: int) -> None:
        self.path = str(path)
        self.user = user
        self.rate_per_s = rate_per_s
        self.click_every_s = click_every_s
        self.load = ShopLoad(self.path, seed=seed)
        self.clicks: Counter[str] = Counter()  # the demo user's, by kind
        self._rng = random.Random(seed)

    @property
    def writes(self) -> dict[str, int]:
        """What was written, by kind (ShopLoad's kinds, and the demo user's clicks)."""
        done = {kind: n for kind, n in self.load.counts.items() if kind != "skipped"}
        if self.clicks:
            done["demo_user"] = sum(self.clicks.values())
        return done

    async def run(self, duration_s: float, stop: asyncio.Event) -> None:
        """Write for `duration_s` (or until `stop`), then close the connections."""
        try:
            async with asyncio.TaskGroup() as group:
                if self.rate_per_s > 0:
                    group.create_task(self.load.run(self.rate_per_s, duration_s, stop))
                if self.user is not None and self.click_every_s > 0:
                    group.create_task(self._clicks(duration_s, stop))
        finally:
            await asyncio.to_thread(self.load.close)

    async def _clicks(self, duration_s: float, stop: asyncio.Event) -> None:
        loop = asyncio.get_running_loop()
        end = loop.time() + duration_s
        conn = await asyncio.to_thread(connect, self.path, "")
        try:
            products = await asyncio.to_thread(
                lambda: [r[0] for r in conn.execute("SELECT id FROM products ORDER BY rowid LIMIT 50")])
            while products and loop.time() < end and not stop.is_set():
                kind = self._rng.choice(_CLICK_KINDS)
                product = self._rng.choice(products)
                click = functools.partial(self._click, product=product, kind=kind)
                await asyncio.to_thread(immediate, conn, click)
                self.clicks[kind] += 1
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), self.click_every_s)
        finally:
            await asyncio.to_thread(conn.close)

    def _click(self, conn: sqlite3.Connection, product: str, kind: str) -> None:
        now = datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
        conn.execute("INSERT INTO interactions (user_id, product_id, kind, quantity, created_at) "
                     "VALUES (?, ?, ?, 1, ?)", (self.user, product, kind, now))
        if kind == "purchase":
            conn.execute("UPDATE products SET stock = max(stock - 1, 0), updated_at = ? WHERE id = ?",
                         (now, product))


@dataclass(frozen=True, slots=True)
class TopItem:
    """One of the demo user's recommendations: its id, name (from the shop) and reason."""

    item_id: str
    name: str
    reason: str | None


@dataclass(frozen=True, slots=True)
class RecsReading:
    """The recommender as the demo last read it through the API."""

    user: str | None
    top: tuple[TopItem, ...] = ()
    cold_start: bool = True
    changes: int = 0  # times the user's top list changed since the first reading
    p50_ms: float | None = None  # commit → recommendation updated
    p99_ms: float | None = None
    measured: int = 0  # changes measured
    items: int | None = None
    users: int | None = None
    shop_writes: Mapping[str, int] = field(default_factory=dict)
    error: str | None = None  # why the last reading failed, if it did


class RecsWatch:
    """Reads the demo user's recommendations and the recommender's health, counting how often the
    user's top list changes."""

    def __init__(self, path: str | Path, user: str | None) -> None:
        self.path = str(path)
        self.user = user
        self._last: tuple[str, ...] | None = None
        self._changes = 0
        self._names: dict[str, str] = {}

    async def read(self, health: Mapping[str, Any], answer: Mapping[str, Any] | None,
                   shop_writes: Mapping[str, int]) -> RecsReading:
        """A reading from the API's answers (GET /v1/health, GET /v1/recommendations/{user})."""
        latency = health.get("commit_to_updated") or {}
        top: tuple[TopItem, ...] = ()
        cold = True
        if answer is not None:
            items = list(answer.get("items") or ())
            ids = tuple(str(item["item_id"]) for item in items)
            if self._last is not None and ids != self._last:
                self._changes += 1
            self._last = ids
            missing = [i for i in ids[:SHOWN] if i not in self._names]
            if missing:
                self._names.update(await asyncio.to_thread(product_names, self.path, missing))
            top = tuple(TopItem(i, self._names.get(i, i), item.get("reason"))
                        for i, item in zip(ids, items[:SHOWN], strict=False))
            cold = bool(answer.get("cold_start", True))
        return RecsReading(
            user=self.user, top=top, cold_start=cold, changes=self._changes,
            p50_ms=latency.get("p50_ms"), p99_ms=latency.get("p99_ms"),
            measured=int(latency.get("count") or 0),
            items=health.get("items"), users=health.get("users"), shop_writes=dict(shop_writes),
        )
