"""The recommender: records interactions incrementally and answers queries from shared state.

`Recommender` keeps nothing another replica would need: user profiles, recent and purchased items,
co-occurrence neighbour lists, trending lists and the item catalogue live in its `RecsStore`
(memory:// or redis://). In process it keeps only a copy of the catalogue as a numpy matrix for
nearest-item search, refreshed from the store's version counter before each call.

Recording (`record`) costs, per interaction, O(dimension) for the profile plus one pair per recent
item of the user within the session window; each user's events are one atomic store update, and
the co-occurrence and trending additions that follow are log-adds, so replicas recording at the
same time never lose each other's updates. Replaying the same interactions counts them again.

Serving (`recommend`):

1. candidates: the co-occurrence neighbours of the user's recent items and of the query's context
   item, the items nearest the user's profile (one matrix-vector product over the catalogue), the
   globally trending items, and — when purchased items are allowed (`exclude_purchased=False`) —
   the items the user bought before (their buy-again counts; the "repeat" signal);
2. filters: in the catalogue, in stock (unknown stock counts as in stock; `in_stock_only`), price
   range (an item without a price fails any price bound), categories (any of them), not purchased
   by the user (`exclude_purchased`), never an item the user bought within the session window
   before now, never the context item itself;
3. the blended score of `tidegate.recs.score`, highest first (ties by item id);
4. with `diversity` d > 0, maximal marginal relevance: each next item maximises
   `(1 - d) · score - d · (max cosine similarity to the items already chosen)`;
5. a user without history (unknown, or nothing recorded) is a cold start: trending within the
   context item's categories, else the query's categories, else globally, blended with the
   context item's co-occurrence neighbours; a narrower scope with too few items is followed by
   the wider ones, so the list is in rank order by scope first, then by score.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime

import numpy as np
import numpy.typing as npt

from tidegate.errors import ConfigError, InvalidRecsInput
from tidegate.recs import explain
from tidegate.recs.catalog import Catalog
from tidegate.recs.model import (
    Interaction,
    InteractionKind,
    Item,
    Recommendation,
    RecQuery,
    RecResult,
    RecsSettings,
)
from tidegate.recs.score import Signals, blend, decayed, log_add, log_weight
from tidegate.recs.store.base import RecsStore, UserEvent, UserOutcome, UserParams, UserState
from tidegate.recs.vectors import item_vector
from tidegate.sync.values import JsonValue

__all__ = ["Recommender"]

MIN_POOL = 50  # candidates scored per query at least (more for a larger n)
POOL_PER_ITEM = 4
MAX_TRENDING_PAGES = 4  # pages of a trending list read looking for items that pass the filters
Rows = npt.NDArray[np.bool_]


def _utc_now() -> datetime:
    return datetime.now(UTC)


@dataclass(slots=True)
class _Scored:
    """A candidate while a query is answered."""

    row: int
    item_id: str
    signals: Signals
    score: float
    anchor: str | None = None  # the anchor contributing most to its co-occurrence
    scope: str | None = None  # the trending scope it was found in (cold start)


@dataclass(frozen=True, slots=True)
class _RowsPass:
    """One query's passes over the catalogue rows, valid while `Catalog.changes` is `changes`:
    which rows pass its filters, and each row's cosine similarity with the user's profile (None:
    no profile). Computed once, used for the nearest items and for the scores."""

    changes: int
    mask: Rows
    similarities: npt.NDArray[np.float32] | None


class Recommender:
    """Incremental recommendations over a `RecsStore`; several instances on one Redis store serve
    the same answers. `clock` gives the reading time of every decayed signal (tests inject it)."""

    def __init__(
        self,
        store: RecsStore,
        settings: RecsSettings | None = None,
        *,
        clock: Callable[[], datetime] = _utc_now,
    ) -> None:
        self.store = store
        self.settings = settings if settings is not None else RecsSettings()
        self._clock = clock
        self._half_life_s = self.settings.decay_hours * 3600.0
        self._trending_half_life_s = self.settings.trending_decay_hours * 3600.0
        self._repeat_half_life_s = self.settings.repeat_decay_hours * 3600.0
        weights = self.settings.kind_weights
        self._weights = {kind.value: float(weights[kind.value]) for kind in InteractionKind}
        # The context item stands for a look right now, as strong as the strongest interaction.
        self._context_weight = max(self._weights.values())
        self._params = UserParams(
            half_life_s=self._half_life_s,
            session_window_s=float(self.settings.session_window_s),
            recent_items=self.settings.recent_items,
            max_purchased=self.settings.max_purchased,
            co_occurrence_half_life_s=self.settings.co_occurrence_decay_hours * 3600.0,
            repeat_half_life_s=self._repeat_half_life_s,
            max_repeat=self.settings.max_repeat,
        )
        self._catalog = Catalog(self.settings.dimension)
        self._sync_lock = asyncio.Lock()

    # ------------------------------------------------------------------ catalogue

    async def upsert_item(self, item: Item) -> None:
        """Add or replace an item. Its vector is its embedding (`item.vector`, projected to the
        dimension) or the feature hash of its text; a new embedding swaps the vector. Only the
        name, categories, price, stock and vector are kept."""
        _check_item(item)
        vector = item_vector(item, self.settings.dimension).astype(np.float32)
        # Rounded to float32 once, here, so every replica and backend holds the same numbers.
        stored = replace(item, description="", vector=tuple(float(x) for x in vector))
        await self.store.put_item(stored)
        async with self._sync_lock:
            self._catalog.put(stored)

    async def remove_item(self, item_id: str) -> None:
        """Remove an item: it is never recommended again (until upserted again), whether as a
        neighbour, a trending item or a nearest item."""
        _check_id("item_id", item_id)
        await self.store.delete_item(item_id)
        async with self._sync_lock:
            self._catalog.remove(item_id)

    async def item(self, item_id: str) -> Item | None:
        """The item as the recommender holds it (name, categories, price, stock and its unit
        vector; no description), or None when it is not in the catalogue."""
        _check_id("item_id", item_id)
        await self._sync()
        return self._catalog.get(item_id)

    async def _sync(self) -> None:
        async with self._sync_lock:
            await self._catalog.sync(self.store)

    # ------------------------------------------------------------------ interactions

    async def record(self, interactions: Sequence[Interaction]) -> None:
        """Apply interactions to the profiles, co-occurrence and trending state. The whole batch is
        checked first: one bad interaction raises InvalidRecsInput and nothing is written."""
        for interaction in interactions:
            _check_interaction(interaction, self._weights)
        if not interactions:
            return
        await self._sync()
        by_user: dict[str, list[UserEvent]] = {}
        trending: dict[str | None, dict[str, float]] = {}
        newest_s = -math.inf
        for interaction in interactions:
            at_s = interaction.at.timestamp()
            newest_s = max(newest_s, at_s)
            weight = self._weights[interaction.kind.value]
            item = self._catalog.get(interaction.item_id)
            events = by_user.get(interaction.user_id)
            if events is None:
                events = by_user[interaction.user_id] = []
            events.append(UserEvent(
                interaction.item_id, at_s, weight, interaction.kind is InteractionKind.PURCHASE,
                None if item is None else item.vector,
            ))
            if weight > 0:
                value = log_weight(weight, at_s, self._trending_half_life_s)
                for scope in (None, *(item.categories if item is not None else ())):
                    _log_add_into(trending.setdefault(scope, {}), interaction.item_id, value)
        outcomes = await self.store.record_users(list(by_user.items()), self._params)
        neighbours = _pair_sums(outcomes)
        # Independent log-adds: sent together, so a batch costs about two round trips.
        await asyncio.gather(
            self.store.add_neighbours(neighbours, self.settings.max_neighbours),
            self.store.add_trending(trending, self.settings.max_trending),
            self.store.note_update(
                at_s=self._now().timestamp(),
                interaction_at_s=newest_s,
                new_users=sum(outcome.new_user for outcome in outcomes),
            ),
        )

    # ------------------------------------------------------------------ serving

    async def recommend(self, query: RecQuery) -> RecResult:
        """Up to `query.n` items for the user, best first (see the module docstring); fewer when
        fewer items have a signal and pass the filters (none at all before anything was recorded).
        Never raises for an unknown user or context item; a malformed query raises
        InvalidRecsInput."""
        _check_query(query, self.settings)
        now = self._now()
        now_s = now.timestamp()
        await self._sync()
        state = await self.store.user_state(query.user_id)
        cold = state is None or not (state.recent or any(state.profile))
        # All reads from the store come first and are kept by item id; the ranking below runs
        # without awaiting, against the catalogue as it is then, so a catalogue refresh by a
        # concurrent call can never slip a removed or filtered item in.
        anchors = self._anchors(None if cold else state, query.context, now_s)
        excluded = self._excluded(query, state, now_s)
        pool = max(MIN_POOL, POOL_PER_ITEM * query.n)
        if cold:
            lists, tiers = await asyncio.gather(
                self._neighbour_lists(anchors), self._cold_start_tiers(query, excluded, pool)
            )
            ranked = self._rank_cold_start(query, excluded, anchors, lists, tiers)
        else:
            assert state is not None
            lists, trending = await asyncio.gather(
                self._neighbour_lists(anchors), self._trending_entries(None, query, excluded, pool)
            )
            candidates = {item_id for neighbours in lists.values() for item_id, _ in neighbours}
            rows_pass = self._rows_pass(query, state, excluded)
            candidates |= set(trending) | self._nearest(rows_pass, pool)
            if not query.exclude_purchased:
                candidates |= set(state.repeat)
            missing = sorted(candidates - set(trending))
            values = await self.store.trending_scores(None, missing)
            trending.update({item_id: v for item_id, v in zip(missing, values, strict=True) if v is not None})
            if rows_pass.changes != self._catalog.changes:  # the catalogue moved while awaiting
                rows_pass = self._rows_pass(query, state, excluded)
            ranked = self._rank_personalised(query, state, rows_pass, anchors, lists, trending, candidates)
        chosen = self._diversified(ranked, query.n, query.diversity)
        items = tuple(self._recommendation(scored, query, state) for scored in chosen)
        return RecResult(query.user_id, items, cold, now)

    async def _neighbour_lists(self, anchors: Mapping[str, float]) -> dict[str, list[tuple[str, float]]]:
        return await self.store.neighbours(list(anchors), self.settings.max_neighbours) if anchors else {}

    def _excluded(self, query: RecQuery, state: UserState | None, now_s: float) -> set[str]:
        """Items never to recommend for this query: the context item, the user's purchases (or
        only those within the session window, when purchased items are allowed)."""
        excluded = {query.context} if query.context else set()
        if state is not None:
            window_s = self.settings.session_window_s
            excluded.update(
                item_id for item_id, at_s in state.purchased.items()
                if query.exclude_purchased or now_s - at_s <= window_s
            )
        return excluded

    def _eligible(self, query: RecQuery, excluded: Iterable[str]) -> Rows:
        """Rows of the catalogue that pass the query's filters."""
        catalog = self._catalog
        used = len(catalog.items)
        mask = catalog.alive[:used].copy()
        if query.in_stock_only:
            mask &= catalog.in_stock[:used]
        price = catalog.price[:used]
        with np.errstate(invalid="ignore"):  # NaN (unknown price) compares False: excluded
            if query.min_price is not None:
                mask &= price >= query.min_price
            if query.max_price is not None:
                mask &= price <= query.max_price
        if query.categories:
            mask &= catalog.category_mask(query.categories)
        for item_id in excluded:
            row = catalog.rows.get(item_id)
            if row is not None:
                mask[row] = False
        return mask

    def _allowed(self, item_id: str, query: RecQuery, excluded: set[str]) -> bool:
        """`_eligible` for one item: only steers how much of a trending list to read."""
        item = self._catalog.get(item_id)
        if item is None or item_id in excluded:
            return False
        if query.in_stock_only and item.stock is not None and item.stock <= 0:
            return False
        if query.min_price is not None and (item.price is None or item.price < query.min_price):
            return False
        if query.max_price is not None and (item.price is None or item.price > query.max_price):
            return False
        return not query.categories or any(category in item.categories for category in query.categories)

    def _anchors(self, state: UserState | None, context: str | None, now_s: float) -> dict[str, float]:
        """Items whose neighbours are candidates, with log2 weights (decayed to 0 at the epoch:
        only their differences matter)."""
        anchors: dict[str, float] = {}
        for entry in state.recent if state is not None else ():
            if entry.weight > 0:
                _log_add_into(anchors, entry.item_id, log_weight(entry.weight, entry.at_s, self._half_life_s))
        if context:
            _log_add_into(anchors, context, log_weight(self._context_weight, now_s, self._half_life_s))
        return anchors

    async def _trending_entries(
        self, scope: str | None, query: RecQuery, excluded: set[str], want: int
    ) -> dict[str, float]:
        """The most popular items of the scope (id → log popularity), read page by page until
        `want` of them pass the filters (or the list or the page budget ends)."""
        entries: dict[str, float] = {}
        allowed, start, page = 0, 0, max(2 * want, MIN_POOL)
        for _ in range(MAX_TRENDING_PAGES):
            found = await self.store.trending_top(scope, start, page)
            for item_id, value in found:
                entries[item_id] = value
                allowed += self._allowed(item_id, query, excluded)
            if allowed >= want or len(found) < page:
                break
            start += page
        return entries

    def _rows_pass(self, query: RecQuery, state: UserState, excluded: set[str]) -> _RowsPass:
        """The eligibility mask and profile similarities over the catalogue as it is now."""
        return _RowsPass(self._catalog.changes, self._eligible(query, excluded),
                         self._profile_similarities(state))

    def _nearest(self, rows_pass: _RowsPass, want: int) -> set[str]:
        """Ids of the eligible items nearest the user's profile."""
        if rows_pass.similarities is None:
            return set()
        rows = _top_rows(np.where(rows_pass.mask, rows_pass.similarities, -np.inf), want)
        return {item_id for row in rows if (item_id := self._id(row)) is not None}

    def _co_occurrence(
        self, anchors: Mapping[str, float], lists: Mapping[str, Sequence[tuple[str, float]]], mask: Rows,
    ) -> dict[int, tuple[float, str]]:
        """Eligible rows co-occurring with the anchors: (normalised signal, strongest anchor)."""
        terms: dict[int, list[tuple[float, str]]] = {}
        for anchor, neighbours in lists.items():
            for item_id, value in neighbours:
                row = self._catalog.rows.get(item_id)
                if row is not None and mask[row]:
                    terms.setdefault(row, []).append((anchors[anchor] + value, anchor))
        if not terms:
            return {}
        # Sums of 2^term, scaled by the largest term so that nothing overflows or underflows.
        top = max(term for found in terms.values() for term, _ in found)
        sums = {row: sum(2.0 ** (term - top) for term, _ in found) for row, found in terms.items()}
        largest = max(sums.values())
        return {row: (sums[row] / largest, max(terms[row])[1]) for row in terms}

    def _rank_personalised(
        self, query: RecQuery, state: UserState, rows_pass: _RowsPass, anchors: Mapping[str, float],
        lists: Mapping[str, Sequence[tuple[str, float]]], trending: Mapping[str, float], candidates: set[str],
    ) -> list[_Scored]:
        mask, similarities = rows_pass.mask, rows_pass.similarities
        co = self._co_occurrence(anchors, lists, mask)
        rows = self._catalog.rows
        top = max((value for item_id, value in trending.items() if item_id in rows), default=None)
        # Buy-again: each count over the user's largest (forward decay: the ratio of the logs'
        # powers is the ratio of the counts at any reading time).
        repeat = {} if query.exclude_purchased else state.repeat
        repeat_top = max(repeat.values(), default=0.0)
        scored = []
        for item_id in candidates:
            row = self._catalog.rows.get(item_id)
            if row is None or not mask[row]:
                continue
            value = trending.get(item_id)
            signals = Signals(
                profile=0.0 if similarities is None else max(0.0, min(1.0, float(similarities[row]))),
                co_occurrence=co[row][0] if row in co else 0.0,
                trending=2.0 ** (value - top) if value is not None and top is not None else 0.0,
                repeat=2.0 ** (repeat[item_id] - repeat_top) if item_id in repeat else 0.0,
            )
            anchor = co[row][1] if row in co else None
            scored.append(_Scored(row, item_id, signals, blend(signals, self.settings), anchor))
        return _ranked(scored)

    def _tiers(self, query: RecQuery) -> list[tuple[str | None, ...]]:
        """Cold-start trending scopes, narrowest first: the context item's categories, the
        query's categories, everything."""
        context = self._catalog.get(query.context) if query.context else None
        tiers: list[tuple[str | None, ...]] = []
        candidates: list[tuple[str | None, ...]] = [
            context.categories if context is not None else (), query.categories, (None,)
        ]
        for scopes in candidates:
            if scopes and scopes not in tiers:
                tiers.append(scopes)
        return tiers

    async def _cold_start_tiers(
        self, query: RecQuery, excluded: set[str], want: int
    ) -> list[dict[str | None, dict[str, float]]]:
        """The trending entries of each cold-start tier, read until `want` items pass."""
        tiers = []
        allowed: set[str] = set()
        for scopes in self._tiers(query):
            tier = {scope: await self._trending_entries(scope, query, excluded, want) for scope in scopes}
            tiers.append(tier)
            for entries in tier.values():
                allowed.update(i for i in entries if self._allowed(i, query, excluded))
            if len(allowed) >= want:
                break
        return tiers

    def _rank_cold_start(
        self, query: RecQuery, excluded: set[str], anchors: Mapping[str, float],
        lists: Mapping[str, Sequence[tuple[str, float]]],
        tiers: Sequence[Mapping[str | None, Mapping[str, float]]],
    ) -> list[_Scored]:
        mask = self._eligible(query, excluded)
        co = self._co_occurrence(anchors, lists, mask)
        chosen: list[_Scored] = []
        seen: set[int] = set()
        for index, tier in enumerate(tiers):
            best: dict[int, tuple[float, str | None]] = {}  # row -> (log popularity, its scope)
            top: float | None = None
            for scope, entries in tier.items():
                for item_id, value in entries.items():
                    row = self._catalog.rows.get(item_id)
                    if row is None:
                        continue
                    top = value if top is None else max(top, value)
                    if mask[row] and (row not in best or best[row][0] < value):
                        best[row] = (value, scope)
            rows = (set(best) | (set(co) if index == 0 else set())) - seen
            tier_scored = []
            for row in rows:
                popularity, scope = best.get(row, (None, None))
                signals = Signals(
                    co_occurrence=co[row][0] if row in co else 0.0,
                    trending=2.0 ** (popularity - top) if popularity is not None and top is not None else 0.0,
                )
                anchor = co[row][1] if row in co else None
                found = self._id(row)
                if found is not None:
                    score = blend(signals, self.settings)
                    tier_scored.append(_Scored(row, found, signals, score, anchor, scope))
            chosen += _ranked(tier_scored)
            seen |= rows
        return chosen

    def _profile_similarities(self, state: UserState) -> npt.NDArray[np.float32] | None:
        """Cosine similarity of every catalogue row with the user's profile (None: no profile)."""
        profile = np.asarray(state.profile, dtype=np.float64)
        norm = float(np.linalg.norm(profile)) if profile.size else 0.0
        if norm == 0.0 or not math.isfinite(norm) or profile.size != self.settings.dimension:
            return None
        matrix, _ = self._catalog.view()
        # einsum, not `@`: a matrix-vector product this size goes to BLAS, which splits it over
        # threads that spin and wait for each other; on cores shared with other processes one
        # descheduled thread stalls the query for milliseconds (measured: p99 x10 on 2 busy
        # cores). einsum's own loop runs in this thread and is as fast as one BLAS thread.
        unit = (profile / norm).astype(np.float32)
        similarities: npt.NDArray[np.float32] = np.einsum("ij,j->i", matrix, unit)
        return similarities

    def _diversified(self, ranked: list[_Scored], n: int, diversity: float) -> list[_Scored]:
        """The first `n`, or with diversity the maximal-marginal-relevance choice of `n`."""
        if diversity <= 0.0 or len(ranked) <= 1:
            return ranked[:n]
        pool = ranked[: max(POOL_PER_ITEM * n, MIN_POOL)]
        vectors = self._catalog.matrix[[scored.row for scored in pool]].astype(np.float64)
        relevance = np.array([scored.score for scored in pool])
        closest = np.zeros(len(pool))  # max similarity to anything chosen so far
        left = np.ones(len(pool), dtype=bool)
        chosen: list[_Scored] = []
        while len(chosen) < n and left.any():
            marginal = np.where(left, (1.0 - diversity) * relevance - diversity * closest, -np.inf)
            pick = int(np.argmax(marginal))  # the first of equals: the higher ranked
            chosen.append(pool[pick])
            left[pick] = False
            closest = np.maximum(closest, vectors @ vectors[pick])
        return chosen

    # ------------------------------------------------------------------ explanations

    def _recommendation(self, scored: _Scored, query: RecQuery, state: UserState | None) -> Recommendation:
        reason = self._reason(scored, query, state) if query.explain else None
        return Recommendation(scored.item_id, scored.score, scored.signals.as_dict(), reason)

    def _reason(self, scored: _Scored, query: RecQuery, state: UserState | None) -> str:
        item = self._catalog.get(scored.item_id)
        parts = scored.signals.weighted(self.settings)
        strongest = max(("repeat", "co_occurrence", "profile", "trending"), key=lambda name: parts[name])
        if strongest == "repeat" and parts[strongest] > 0 and state is not None:
            count = decayed(state.repeat[scored.item_id], self._now().timestamp(), self._repeat_half_life_s)
            return explain.buy_again(count)
        if strongest == "co_occurrence" and scored.anchor is not None and parts[strongest] > 0:
            return explain.bought_together(explain.item_name(self._catalog.get(scored.anchor), scored.anchor))
        if strongest == "profile" and parts[strongest] > 0 and state is not None:
            return self._similar_reason(scored, state)
        preferred = [scored.scope] if scored.scope is not None else list(query.categories)
        return explain.trending_in(item, preferred)

    def _similar_reason(self, scored: _Scored, state: UserState) -> str:
        best: tuple[float, str, float] | None = None
        vector = self._catalog.matrix[scored.row]
        for entry in state.recent:
            row = self._catalog.rows.get(entry.item_id)
            if row is None or entry.item_id == scored.item_id:
                continue
            similarity = float(self._catalog.matrix[row] @ vector)
            if best is None or similarity > best[0]:
                best = (similarity, entry.item_id, entry.weight)
        if best is None:
            return explain.similar_to(None)
        name = explain.item_name(self._catalog.get(best[1]), best[1])
        return explain.similar_to(name, explain.verb_for_weight(best[2], self._weights))

    # ------------------------------------------------------------------ health

    async def health(self) -> dict[str, JsonValue]:
        """Item and user counts, when interactions were last recorded and the newest interaction
        recorded (ISO 8601 UTC), and `freshness_s`: seconds since the last recording."""
        await self._sync()
        stats = await self.store.stats()
        now_s = self._now().timestamp()
        return {
            "store": self.store.kind,
            "items": stats.items,
            "users": stats.users,
            "catalog_version": self._catalog.version,
            "last_update_at": _iso(stats.last_update_s),
            "last_interaction_at": _iso(stats.last_interaction_s),
            "freshness_s": None if stats.last_update_s is None else max(0.0, now_s - stats.last_update_s),
        }

    # ------------------------------------------------------------------ helpers

    def _now(self) -> datetime:
        now = self._clock()
        if now.tzinfo is None:
            raise ConfigError("the recommender's clock returned a naive datetime: it must be timezone-aware")
        return now

    def _id(self, row: int) -> str | None:
        item = self._catalog.items[row] if row < len(self._catalog.items) else None
        return None if item is None else item.item_id


# ---------------------------------------------------------------------- pure helpers


def _pair_sums(outcomes: Iterable[UserOutcome]) -> dict[str, dict[str, float]]:
    """The batch's co-occurrence pairs in both directions, log-added per item and neighbour (a
    loop over every pair of a batch: kept free of calls but `log_add` on a repeated pair)."""
    sums: dict[str, dict[str, float]] = {}
    for outcome in outcomes:
        for item_id, other, value in outcome.pairs:
            adds = sums.get(item_id)
            if adds is None:
                adds = sums[item_id] = {}
            held = adds.get(other)
            adds[other] = value if held is None else log_add(held, value)
            adds = sums.get(other)
            if adds is None:
                adds = sums[other] = {}
            held = adds.get(item_id)
            adds[item_id] = value if held is None else log_add(held, value)
    return sums


def _log_add_into(sums: dict[str, float], key: str, value: float) -> None:
    current = sums.get(key)
    sums[key] = value if current is None else log_add(current, value)


def _top_rows(values: npt.NDArray[np.floating], count: int) -> set[int]:
    """Rows of the `count` largest positive values."""
    positive = int(np.count_nonzero(values > 0))
    if positive == 0:
        return set()
    count = min(count, positive)
    top = np.argpartition(-values, count - 1)[:count]
    return {int(row) for row in top if values[row] > 0}


def _ranked(scored: Iterable[_Scored]) -> list[_Scored]:
    return sorted(scored, key=lambda candidate: (-candidate.score, candidate.item_id))


def _iso(at_s: float | None) -> str | None:
    return None if at_s is None else datetime.fromtimestamp(at_s, UTC).isoformat().replace("+00:00", "Z")


# ---------------------------------------------------------------------- validation


def _check_id(field: str, value: object) -> None:
    if not isinstance(value, str) or not value:
        raise InvalidRecsInput(f"{field} must be a non-empty string, not {value!r}")


def _finite(field: str, value: object, *, minimum: float | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InvalidRecsInput(f"{field} must be a finite number, not {value!r}")
    if minimum is not None and value < minimum:
        raise InvalidRecsInput(f"{field} must be >= {minimum}, not {value!r}")


def _check_item(item: Item) -> None:
    if not isinstance(item, Item):
        raise InvalidRecsInput(f"expected an Item, not {type(item).__name__}")
    _check_id("item_id", item.item_id)
    for field in ("name", "description"):
        if not isinstance(getattr(item, field), str):
            raise InvalidRecsInput(f"item {item.item_id!r}: {field} must be a string")
    if not isinstance(item.categories, tuple) or not all(isinstance(c, str) and c for c in item.categories):
        raise InvalidRecsInput(f"item {item.item_id!r}: categories must be a tuple of non-empty strings")
    if item.price is not None:
        _finite(f"item {item.item_id!r}: price", item.price, minimum=0.0)
    if item.stock is not None and (isinstance(item.stock, bool) or not isinstance(item.stock, int)):
        raise InvalidRecsInput(f"item {item.item_id!r}: stock must be an integer or None, not {item.stock!r}")
    if item.vector is not None:
        if not isinstance(item.vector, tuple | list):
            raise InvalidRecsInput(f"item {item.item_id!r}: vector must be a sequence of numbers")
        for value in item.vector:
            _finite(f"item {item.item_id!r}: vector element", value)


def _check_interaction(interaction: Interaction, weights: Mapping[str, float]) -> None:
    if not isinstance(interaction, Interaction):
        raise InvalidRecsInput(f"expected an Interaction, not {type(interaction).__name__}")
    _check_id("user_id", interaction.user_id)
    _check_id("item_id", interaction.item_id)
    if not isinstance(interaction.kind, InteractionKind) or interaction.kind.value not in weights:
        kinds = ", ".join(kind.value for kind in InteractionKind)
        raise InvalidRecsInput(f"kind must be one of {kinds}, not {interaction.kind!r}")
    if not isinstance(interaction.at, datetime) or interaction.at.tzinfo is None:
        raise InvalidRecsInput(f"at must be a timezone-aware datetime, not {interaction.at!r}")
    if isinstance(interaction.quantity, bool) or not isinstance(interaction.quantity, int) \
            or interaction.quantity < 1:
        raise InvalidRecsInput(f"quantity must be an integer >= 1, not {interaction.quantity!r}")


def _check_query(query: RecQuery, settings: RecsSettings) -> None:
    if not isinstance(query, RecQuery):
        raise InvalidRecsInput(f"expected a RecQuery, not {type(query).__name__}")
    _check_id("user_id", query.user_id)
    if isinstance(query.n, bool) or not isinstance(query.n, int) or not 1 <= query.n <= settings.max_n:
        raise InvalidRecsInput(f"n must be an integer from 1 to {settings.max_n}, not {query.n!r}")
    if query.context is not None:
        _check_id("context", query.context)
    if not isinstance(query.categories, tuple) or not all(isinstance(c, str) and c for c in query.categories):
        raise InvalidRecsInput("categories must be a tuple of non-empty strings")
    for field in ("min_price", "max_price"):
        if getattr(query, field) is not None:
            _finite(field, getattr(query, field), minimum=0.0)
    if query.min_price is not None and query.max_price is not None and query.min_price > query.max_price:
        raise InvalidRecsInput(f"min_price {query.min_price} is above max_price {query.max_price}")
    _finite("diversity", query.diversity, minimum=0.0)
    if query.diversity > 1.0:
        raise InvalidRecsInput(f"diversity must be from 0 to 1, not {query.diversity!r}")
