"""The methods compared on the Online Retail replay, behind one small interface.

Every method sees the same purchases in the same order. The evaluator calls, for each test
invoice: `advance(now)` (a nightly batch retrains when a new day has begun), `top(...)` for the
customer (before the invoice is fed) and then `feed(invoice)`. History invoices are only fed.

- `TidegateMethod`: tidegate.recs.Recommender on a memory:// store; items upserted from the
  catalogue, each invoice recorded as purchase interactions at the invoice's time (the
  recommender's clock is the replay's clock).
- `Popularity`: items by the number of invoices that hold them, all history up to now.
- `DecayedPopularity`: the same count, exponentially decayed (half-life in days).
- `Repeat`: the customer's own items by how many of their invoices hold them (most recent first
  on ties), then popularity: the "buy it again" list a wholesaler's order form would show.
- `DailyBatch`: an `implicit` model (item-kNN or ALS) refit once per UK day on all purchases up
  to the previous midnight, serving what it computed overnight (its user rows are frozen at
  the refit as well; only the exclusion of already-bought items sees today's purchases).
- `TidegateBuyAgain`: the prototype that measured a buy-again signal before the engine had one,
  re-ranking the engine's answer from outside it (not part of tidegate; kept as a comparison
  row for the engine's own "repeat" signal, which replaced it).
"""

from __future__ import annotations

import math
import time
import warnings
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Set
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from typing import Any, Protocol

import numpy as np

from bench.common import BenchmarkError
from bench.recs_quality_data import RETAIL_ZONE, Invoice
from tidegate.testing import Interaction, InteractionKind, Item, RecQuery, RecsSettings


class Method(Protocol):
    """One recommender under evaluation."""

    name: str
    seconds: float  # CPU time spent inside the method (feeding, fitting, answering)

    async def start(self, catalogue: dict[str, Item]) -> None:
        """Learn the catalogue (before any purchase)."""

    async def feed(self, invoice: Invoice) -> None:
        """Learn one purchase."""

    async def advance(self, now: datetime) -> None:
        """The replay's clock moved to `now` (before the queries at that time)."""

    async def top(self, customer: str, n: int, exclude: Set[str]) -> list[str]:
        """The customer's top `n` item ids, none of them in `exclude`."""

    async def close(self) -> None:
        """Release what `start` opened."""


class _Timed:
    """Adds up the CPU time of this process (all its threads) since `started`: unlike wall time,
    it does not grow when other work on a shared machine takes the cores."""

    seconds: float = 0.0

    def _add(self, started: float) -> None:
        self.seconds += time.process_time() - started


# ---------------------------------------------------------------------------- popularity


class _Ranking:
    """Item scores over the catalogue with a lazily sorted order, for top-n with exclusions."""

    def __init__(self, codes: list[str]) -> None:
        self.codes = codes
        self.index = {code: i for i, code in enumerate(codes)}
        self.scores = np.zeros(len(codes))
        self._order: np.ndarray[Any, np.dtype[np.intp]] | None = None

    def changed(self) -> None:
        self._order = None

    def top(self, n: int, exclude: Set[str] = frozenset(), skip: Set[str] = frozenset()) -> list[str]:
        if self._order is None:
            # Stable sort on the negated score: ties keep catalogue order, so runs repeat exactly.
            self._order = np.argsort(-self.scores, kind="stable")
        found: list[str] = []
        for i in self._order:
            code = self.codes[i]
            if code not in exclude and code not in skip:
                found.append(code)
                if len(found) == n:
                    break
        return found


class Popularity(_Timed):
    """Global popularity: invoices holding each item, all history up to now."""

    def __init__(self, name: str = "popularity") -> None:
        self.name = name
        self.seconds = 0.0
        self._ranking = _Ranking([])

    async def start(self, catalogue: dict[str, Item]) -> None:
        self._ranking = _Ranking(sorted(catalogue))

    async def feed(self, invoice: Invoice) -> None:
        started = time.process_time()
        for code in invoice.items:
            self._ranking.scores[self._ranking.index[code]] += 1.0
        self._ranking.changed()
        self._add(started)

    async def advance(self, now: datetime) -> None:
        return None

    async def top(self, customer: str, n: int, exclude: Set[str]) -> list[str]:
        started = time.process_time()
        try:
            return self._ranking.top(n, exclude)
        finally:
            self._add(started)

    async def close(self) -> None:
        return None


class DecayedPopularity(Popularity):
    """Popularity with an exponential decay: an invoice `half_life_days` old counts half."""

    def __init__(self, half_life_days: float) -> None:
        super().__init__(f"popularity, {half_life_days:g} d half-life")
        self._half_life_s = half_life_days * 86_400.0
        self._at: datetime | None = None

    def _decay_to(self, now: datetime) -> None:
        if self._at is not None and now > self._at:
            self._ranking.scores *= math.exp2(-(now - self._at).total_seconds() / self._half_life_s)
            self._ranking.changed()
        self._at = now

    async def feed(self, invoice: Invoice) -> None:
        started = time.process_time()
        self._decay_to(invoice.at)
        self._add(started)
        await super().feed(invoice)


class Repeat(Popularity):
    """The customer's own most-bought items (by invoices holding them, latest first on ties),
    then global popularity. With the bought items excluded it is popularity."""

    def __init__(self) -> None:
        super().__init__("repeat, then popularity")
        self._bought: dict[str, dict[str, tuple[int, datetime]]] = defaultdict(dict)

    async def feed(self, invoice: Invoice) -> None:
        started = time.process_time()
        mine = self._bought[invoice.customer]
        for code in invoice.items:
            count, _ = mine.get(code, (0, invoice.at))
            mine[code] = (count + 1, invoice.at)
        self._add(started)
        await super().feed(invoice)

    async def top(self, customer: str, n: int, exclude: Set[str]) -> list[str]:
        started = time.process_time()
        try:
            mine = self._bought.get(customer, {})
            own = sorted((code for code in mine if code not in exclude),
                         key=lambda code: (mine[code][0], mine[code][1]), reverse=True)[:n]
            return own + self._ranking.top(n - len(own), exclude, set(own)) if len(own) < n else own
        finally:
            self._add(started)


# ---------------------------------------------------------------------------- daily batch


@dataclass(frozen=True, slots=True)
class BatchSpec:
    """Which `implicit` model the nightly batch fits, and how the matrix is weighted."""

    name: str
    kind: str  # "cosine", "bm25", "tfidf" (item-kNN) or "als"
    neighbours: int = 100  # item-kNN: K
    factors: int = 64  # ALS
    regularization: float = 0.05
    iterations: int = 15
    alpha: float = 1.0
    bm25_weighting: bool = True  # ALS: BM25-weight the invoice counts before the fit


BATCH_SPECS: dict[str, BatchSpec] = {
    "knn-cosine": BatchSpec("daily batch: item-kNN cosine", "cosine"),
    "knn-bm25": BatchSpec("daily batch: item-kNN BM25", "bm25"),
    "knn-tfidf": BatchSpec("daily batch: item-kNN TF-IDF", "tfidf"),
    "als": BatchSpec("daily batch: ALS", "als"),
}


@dataclass(slots=True)
class _Frozen:
    """What the last nightly fit left: the model, its user rows and its popularity fallback."""

    model: Any
    user_index: dict[str, int]
    user_items: Any  # scipy.sparse.csr_matrix, users x items
    popular: list[str]


@dataclass(slots=True)
class DailyBatch(_Timed):
    """An `implicit` recommender refit at the first query of each UK day on all purchases so far."""

    spec: BatchSpec
    seed: int = 7
    name: str = ""
    seconds: float = 0.0
    fits: int = 0
    fit_seconds: float = 0.0
    _codes: list[str] = field(default_factory=list)
    _item_index: dict[str, int] = field(default_factory=dict)
    _counts: dict[str, Counter[int]] = field(default_factory=lambda: defaultdict(Counter))
    _day: date | None = None
    _frozen: _Frozen | None = None

    def __post_init__(self) -> None:
        self.name = self.name or self.spec.name

    async def start(self, catalogue: dict[str, Item]) -> None:
        self._codes = sorted(catalogue)
        self._item_index = {code: i for i, code in enumerate(self._codes)}

    async def feed(self, invoice: Invoice) -> None:
        started = time.process_time()
        mine = self._counts[invoice.customer]
        for code in invoice.items:
            mine[self._item_index[code]] += 1
        self._add(started)

    async def advance(self, now: datetime) -> None:
        day = now.astimezone(RETAIL_ZONE).date()
        if day != self._day:
            started = time.process_time()
            self._frozen = self._fit()
            self._day = day
            self.fits += 1
            self.fit_seconds += time.process_time() - started
            self._add(started)

    def _fit(self) -> _Frozen:
        from scipy.sparse import csr_matrix  # type: ignore[import-untyped]

        users = sorted(self._counts)
        rows, cols, values = [], [], []
        for row, user in enumerate(users):
            for col, count in self._counts[user].items():
                rows.append(row)
                cols.append(col)
                values.append(float(count))
        user_items = csr_matrix((values, (rows, cols)), shape=(len(users), len(self._codes)))
        popularity = np.asarray((user_items > 0).sum(axis=0)).ravel()
        popular = [self._codes[i] for i in np.argsort(-popularity, kind="stable")[:200]]
        model = _fit_model(self.spec, user_items, self.seed)
        return _Frozen(model, {user: row for row, user in enumerate(users)}, user_items, popular)

    async def top(self, customer: str, n: int, exclude: Set[str]) -> list[str]:
        started = time.process_time()
        try:
            frozen = self._frozen
            if frozen is None:
                raise BenchmarkError(f"{self.name}: asked before its first fit")
            found: list[str] = []
            row = frozen.user_index.get(customer)
            if row is not None:
                # Ask for more than n: items bought since the fit are dropped below.
                ids, _ = frozen.model.recommend(row, frozen.user_items[row], N=n + 50,
                                                filter_already_liked_items=bool(exclude))
                found = [code for code in (self._codes[i] for i in ids) if code not in exclude][:n]
            if len(found) < n:  # a customer new since the fit, or too few neighbours: last night's top
                taken = set(found)
                found += [c for c in frozen.popular if c not in exclude and c not in taken][: n - len(found)]
            return found
        finally:
            self._add(started)

    async def close(self) -> None:
        return None


def _fit_model(spec: BatchSpec, user_items: Any, seed: int) -> Any:
    with warnings.catch_warnings():
        # implicit's own cosine/BM25 normalisation hands a COO matrix to its kNN and warns about it.
        warnings.filterwarnings("ignore", message="Method expects CSR input")
        return _fit(spec, user_items, seed)


def _fit(spec: BatchSpec, user_items: Any, seed: int) -> Any:
    from implicit.als import AlternatingLeastSquares
    from implicit.nearest_neighbours import (
        BM25Recommender,
        CosineRecommender,
        TFIDFRecommender,
        bm25_weight,
    )

    model: Any
    if spec.kind == "als":
        model = AlternatingLeastSquares(factors=spec.factors, regularization=spec.regularization,
                                        iterations=spec.iterations, alpha=spec.alpha, random_state=seed)
        weighted = bm25_weight(user_items, K1=100, B=0.8).tocsr() if spec.bm25_weighting else user_items
        model.fit(weighted, show_progress=False)
        return model
    makers: dict[str, Callable[[], Any]] = {
        "cosine": lambda: CosineRecommender(K=spec.neighbours),
        "bm25": lambda: BM25Recommender(K=spec.neighbours),
        "tfidf": lambda: TFIDFRecommender(K=spec.neighbours),
    }
    if spec.kind not in makers:
        raise BenchmarkError(f"unknown batch model {spec.kind!r}: use one of cosine, bm25, tfidf, als")
    model = makers[spec.kind]()
    model.fit(user_items, show_progress=False)
    return model


# ---------------------------------------------------------------------------- tidegate


@dataclass(slots=True)
class TidegateMethod(_Timed):
    """tidegate.recs.Recommender on a memory:// store, fed purchase by purchase."""

    name: str
    settings: RecsSettings
    seconds: float = 0.0
    _now: datetime = field(default_factory=lambda: datetime(2010, 12, 1, tzinfo=UTC))
    _stack: AsyncExitStack = field(default_factory=AsyncExitStack)
    _recommender: Any = None

    async def start(self, catalogue: dict[str, Item]) -> None:
        from tidegate.testing import Recommender, recs_store_for

        store = await self._stack.enter_async_context(recs_store_for("memory://"))
        self._recommender = Recommender(store, self.settings, clock=lambda: self._now)
        started = time.process_time()
        for item in catalogue.values():
            await self._recommender.upsert_item(item)
        self._add(started)

    async def feed(self, invoice: Invoice) -> None:
        started = time.process_time()
        self._now = invoice.at
        await self._recommender.record(list(interactions_of(invoice)))
        self._add(started)

    async def advance(self, now: datetime) -> None:
        self._now = now

    async def top(self, customer: str, n: int, exclude: Set[str]) -> list[str]:
        started = time.process_time()
        try:
            # The engine keeps its own record of what was bought; `exclude` is what the
            # evaluation holds as bought, and the same set when the engine is right.
            query = RecQuery(user_id=customer, n=n, in_stock_only=False, exclude_purchased=bool(exclude))
            result = await self._recommender.recommend(query)
            return [rec.item_id for rec in result.items]
        finally:
            self._add(started)

    async def close(self) -> None:
        await self._stack.aclose()


def interactions_of(invoice: Invoice) -> Iterable[Interaction]:
    """An invoice as the purchase interactions the change flow would deliver."""
    for code, quantity in zip(invoice.items, invoice.quantities, strict=True):
        yield Interaction(invoice.customer, code, InteractionKind.PURCHASE, invoice.at, quantity)


@dataclass(slots=True)
class TidegateBuyAgain(TidegateMethod):
    """A prototype of a "buy again" signal for the engine, outside it: the engine's list (its
    top 50 with their blended scores) re-ranked with `weight · again(c)` added for items the
    customer bought before, where again(c) is the customer's purchase count of c decayed with
    `half_life_days` (or only the decay of its last purchase with `count=False`: what the
    engine's purchased set already holds), divided by the customer's largest. Items bought within
    the engine's session window stay out, as the engine keeps them out. Only the any-item list
    changes: with the purchases excluded there is nothing to buy again."""

    weight: float = 1.0
    half_life_days: float = 30.0
    count: bool = True
    pool: int = 50
    _bought: dict[str, dict[str, tuple[float, datetime]]] = field(default_factory=lambda: defaultdict(dict))

    async def feed(self, invoice: Invoice) -> None:
        await TidegateMethod.feed(self, invoice)
        started = time.process_time()
        mine, half_life_s = self._bought[invoice.customer], self.half_life_days * 86_400.0
        for code in invoice.items:
            value, at = mine.get(code, (0.0, invoice.at))
            decayed = value * math.exp2(-(invoice.at - at).total_seconds() / half_life_s)
            mine[code] = (decayed + 1.0 if self.count else 1.0, invoice.at)
        self._add(started)

    async def top(self, customer: str, n: int, exclude: Set[str]) -> list[str]:
        if exclude:
            return await TidegateMethod.top(self, customer, n, exclude)
        started = time.process_time()
        try:
            query = RecQuery(user_id=customer, n=self.pool, in_stock_only=False, exclude_purchased=False)
            result = await self._recommender.recommend(query)
            scores = {rec.item_id: rec.score for rec in result.items}
            half_life_s, window_s = self.half_life_days * 86_400.0, self.settings.session_window_s
            again = {code: value * math.exp2(-(self._now - at).total_seconds() / half_life_s)
                     for code, (value, at) in self._bought.get(customer, {}).items()
                     if (self._now - at).total_seconds() > window_s}
            top = max(again.values(), default=0.0)
            for code, value in again.items():
                scores[code] = scores.get(code, 0.0) + self.weight * value / top
            return sorted(scores, key=lambda code: (-scores[code], code))[:n]
        finally:
            self._add(started)
