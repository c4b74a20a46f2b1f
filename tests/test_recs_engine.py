"""The recommender over both stores (memory://, redis://): incremental state equals a from-scratch
recomputation, decay over (injected) time, filters and exclusions, deletes and stock-outs, vector
swaps, cold starts, explanations, diversity, validation and replicas sharing one Redis store.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from support.redis_keys import delete_keys
from tidegate.errors import ConfigError, InvalidRecsInput
from tidegate.recs import (
    DEFAULT_KIND_WEIGHTS,
    Interaction,
    InteractionKind,
    Item,
    Recommender,
    RecQuery,
    RecResult,
    RecsSettings,
    RecsStore,
    recs_store_for,
)

BACKENDS = ["memory", "redis"]
T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
HOUR = timedelta(hours=1)
VIEW, CART, BUY = InteractionKind.VIEW, InteractionKind.ADD_TO_CART, InteractionKind.PURCHASE
SETTINGS = RecsSettings(dimension=8, decay_hours=1.0, co_occurrence_decay_hours=1.0, trending_decay_hours=1.0,
                        repeat_decay_hours=1.0, session_window_s=1800.0)


def unit(*components: float) -> tuple[float, ...]:
    """An 8-float vector with the given leading components."""
    return (*components, *([0.0] * (8 - len(components))))


# ---------------------------------------------------------------------- fixtures


class Clock:
    """The recommender's clock; tests move it."""

    def __init__(self, now: datetime = T0) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


@dataclass
class Engines:
    """Makes recommenders on one backend: `fresh()` on new, empty state; `replica()` on the state
    of the last `fresh()` (another process on the same Redis; the same store in memory)."""

    backend: str
    url: str
    clock: Clock = field(default_factory=Clock)
    prefixes: list[str] = field(default_factory=list)
    stores: list[RecsStore] = field(default_factory=list)

    async def fresh(self, settings: RecsSettings = SETTINGS) -> Recommender:
        self.prefixes.append(f"t{uuid.uuid4().hex[:12]}")
        store = await recs_store_for(self.url, prefix=self.prefixes[-1]).open()
        self.stores.append(store)
        return Recommender(store, settings, clock=self.clock)

    async def replica(self, settings: RecsSettings = SETTINGS) -> Recommender:
        if self.backend == "memory":
            return Recommender(self.stores[-1], settings, clock=self.clock)
        store = await recs_store_for(self.url, prefix=self.prefixes[-1]).open()
        self.stores.append(store)
        return Recommender(store, settings, clock=self.clock)

    async def aclose(self) -> None:
        for store in self.stores:
            await store.close()
        await self.wipe()

    async def wipe(self) -> None:
        """Delete every Redis key of the prefixes used."""
        if self.backend == "redis":
            for prefix in self.prefixes:
                await delete_keys(self.url, f"{{{prefix}:*")


@pytest.fixture(params=BACKENDS)
async def engines(request: pytest.FixtureRequest) -> AsyncIterator[Engines]:
    backend: str = request.param
    url = "memory://" if backend == "memory" else request.getfixturevalue("redis_server")
    factory = Engines(backend, url)
    try:
        yield factory
    finally:
        await factory.aclose()


@pytest.fixture
async def rec(engines: Engines) -> Recommender:
    return await engines.fresh()


def touch(user: str, item_id: str, kind: InteractionKind = VIEW, at: datetime = T0) -> Interaction:
    return Interaction(user, item_id, kind, at)


def ids(result: RecResult) -> list[str]:
    return [r.item_id for r in result.items]


async def shop(rec: Recommender, *items: Item) -> None:
    for item in items:
        await rec.upsert_item(item)


# ---------------------------------------------------------------------- the reference


@dataclass(frozen=True)
class Event:
    user: str
    item: str
    kind: InteractionKind
    at_s: float


def reference_scores(
    items: dict[str, Item], events: Sequence[Event], user: str, now_s: float, settings: RecsSettings,
    context: str | None = None, exclude_purchased: bool = True,
) -> dict[str, tuple[float, dict[str, float]]]:
    """Every eligible candidate's blended score and signals, recomputed from the whole event
    list as tidegate.recs.score documents them (lists and recent items unbounded)."""
    w = {kind: settings.kind_weights[kind.value] for kind in InteractionKind}

    def decay(at_s: float, hours: float = settings.decay_hours) -> float:
        return float(2.0 ** (-(now_s - at_s) / (hours * 3600.0)))

    def vector(item_id: str) -> list[float]:
        raw = items[item_id].vector
        assert raw is not None
        norm = math.sqrt(sum(x * x for x in raw))
        return [x / norm for x in raw]

    mine = [e for e in events if e.user == user]
    # Profile: the decayed, kind-weighted sum of item vectors.
    profile = [sum(w[e.kind] * decay(e.at_s) * vector(e.item)[k] for e in mine)
               for k in range(settings.dimension)]
    profile_norm = math.sqrt(sum(x * x for x in profile))
    # Recent items: latest time, largest weight at that time.
    latest: dict[str, tuple[float, float]] = {}
    for e in mine:
        held = latest.get(e.item)
        if held is None or e.at_s > held[0]:
            latest[e.item] = (e.at_s, w[e.kind])
        elif e.at_s == held[0]:
            latest[e.item] = (e.at_s, max(held[1], w[e.kind]))
    anchors = {item_id: weight * decay(at_s) for item_id, (at_s, weight) in latest.items()}
    if context is not None:
        anchors[context] = anchors.get(context, 0.0) + max(w.values())
    # Co-occurrence: pairs of one user's events within the window, at the weaker weight, decayed
    # from the later of the two times; the earlier item as it stood when the later came.
    neighbour: dict[tuple[str, str], float] = {}
    for who in {e.user for e in events}:
        theirs = [e for e in events if e.user == who]
        for k, later in enumerate(theirs):
            held_before: dict[str, tuple[float, float]] = {}
            for e in theirs[:k]:
                held = held_before.get(e.item)
                if held is None or e.at_s > held[0]:
                    held_before[e.item] = (e.at_s, w[e.kind])
                elif e.at_s == held[0]:
                    held_before[e.item] = (e.at_s, max(held[1], w[e.kind]))
            for other, (at_s, weight) in held_before.items():
                if other != later.item and abs(later.at_s - at_s) <= settings.session_window_s:
                    value = min(weight, w[later.kind]) * decay(max(at_s, later.at_s),
                                                               settings.co_occurrence_decay_hours)
                    for pair in ((later.item, other), (other, later.item)):
                        neighbour[pair] = neighbour.get(pair, 0.0) + value
    trend: dict[str, float] = {}
    for e in events:
        trend[e.item] = trend.get(e.item, 0.0) + w[e.kind] * decay(e.at_s, settings.trending_decay_hours)
    # Buy-again: each purchase counts 1, decayed with its own half-life.
    again: dict[str, float] = {}
    last_bought: dict[str, float] = {}
    for e in mine:
        if e.kind is BUY:
            again[e.item] = again.get(e.item, 0.0) + decay(e.at_s, settings.repeat_decay_hours)
            last_bought[e.item] = max(e.at_s, last_bought.get(e.item, e.at_s))
    if exclude_purchased:
        bought, again = set(last_bought), {}
    else:  # only what is in the basket right now stays out
        bought = {c for c, at_s in last_bought.items() if now_s - at_s <= settings.session_window_s}
    again_top = max(again.values(), default=0.0)
    eligible = [item_id for item_id in items if item_id not in bought and item_id != context]
    co = {c: sum(a * neighbour.get((anchor, c), 0.0) for anchor, a in anchors.items()) for c in eligible}
    co_top = max(co.values(), default=0.0)
    trend_top = max((trend.get(item_id, 0.0) for item_id in items), default=0.0)
    scores = {}
    for c in eligible:
        dot = sum(p * x for p, x in zip(profile, vector(c), strict=True))
        similarity = dot / profile_norm if profile_norm else 0.0
        signals = {
            "profile": max(0.0, min(1.0, similarity)),
            "co_occurrence": co[c] / co_top if co_top > 0 else 0.0,
            "trending": trend.get(c, 0.0) / trend_top if trend_top > 0 else 0.0,
        }
        repeat = again[c] / again_top if c in again else 0.0
        if repeat > 0:
            signals["repeat"] = repeat
        if any(value > 0 for value in signals.values()):
            score = (settings.weight_profile * signals["profile"]
                     + settings.weight_co_occurrence * signals["co_occurrence"]
                     + settings.weight_trending * signals["trending"]
                     + settings.weight_repeat * repeat)
            scores[c] = (score, signals)
    return scores


CATALOGUE = {
    f"p{k}": Item(f"p{k}", name=f"Product {k}", categories=(f"c{k % 3}",),
                  vector=unit(*[math.cos(k * 0.7 + j) for j in range(4)]))
    for k in range(8)
}
# Every decayed signal with a half-life of its own (a mix-up shows), and a repeat weight that
# lets the other signals still order the list.
REFERENCE_SETTINGS = RecsSettings(
    dimension=8, decay_hours=1.0, session_window_s=1200.0, recent_items=64, max_neighbours=64,
    co_occurrence_decay_hours=2.0, trending_decay_hours=0.5, repeat_decay_hours=3.0, weight_repeat=0.8,
)

event_lists = st.lists(
    st.builds(
        Event,
        st.sampled_from(["u1", "u2", "u3"]),
        st.sampled_from(sorted(CATALOGUE)),
        st.sampled_from(list(InteractionKind)),
        st.integers(0, 40).map(lambda k: T0.timestamp() + 300.0 * k),  # ties and gaps past the window
    ),
    min_size=1, max_size=25,
).map(lambda events: sorted(events, key=lambda e: e.at_s))


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(events=event_lists, cuts=st.lists(st.integers(0, 25), max_size=3),
       later_s=st.floats(0, 4 * 3600.0), context=st.none() | st.sampled_from(sorted(CATALOGUE)),
       exclude_purchased=st.booleans())
async def test_incremental_state_scores_as_a_recomputation_from_the_events(
    engines: Engines, events: list[Event], cuts: list[int], later_s: float, context: str | None,
    exclude_purchased: bool,
) -> None:
    rec = await engines.fresh(REFERENCE_SETTINGS)
    await shop(rec, *CATALOGUE.values())
    # Given the events, recorded in batches cut at random places
    bounds = [0, *sorted(min(cut, len(events)) for cut in cuts), len(events)]
    for start, end in itertools.pairwise(bounds):
        await rec.record([Interaction(e.user, e.item, e.kind, datetime.fromtimestamp(e.at_s, UTC))
                          for e in events[start:end]])
    now_s = events[-1].at_s + later_s
    engines.clock.now = datetime.fromtimestamp(now_s, UTC)

    for user in sorted({e.user for e in events}):
        # When the user's recommendations are asked for
        query = RecQuery(user, n=4, context=context, exclude_purchased=exclude_purchased)
        result = await rec.recommend(query)
        expected = reference_scores(CATALOGUE, events, user, now_s, REFERENCE_SETTINGS, context,
                                    exclude_purchased)

        # Then each item scores as recomputed, and they are the best of the recomputation (to
        # the profile's 16-bit fixed point)
        assert not result.cold_start
        for recommendation in result.items:
            score, signals = expected[recommendation.item_id]
            assert recommendation.score == pytest.approx(score, abs=2e-3)
            assert dict(recommendation.signals) == pytest.approx(signals, abs=2e-3)
        best = sorted((score for score, _ in expected.values()), reverse=True)[:4]
        assert [r.score for r in result.items] == pytest.approx(best, abs=2e-3)


# ---------------------------------------------------------------------- decay


async def test_after_one_half_life_a_signal_weighs_half(engines: Engines, rec: Recommender) -> None:
    await shop(rec, Item("old", vector=unit(1.0)), Item("new", vector=unit(0.0, 1.0)),
               Item("like-old", vector=unit(1.0)), Item("like-new", vector=unit(0.0, 1.0)))
    # Given one view of "old" and, one half-life later, one view of "new"
    await rec.record([touch("fan", "old", at=T0), touch("other", "old", at=T0)])
    await rec.record([touch("fan", "new", at=T0 + HOUR), touch("other", "new", at=T0 + HOUR)])

    for later in (timedelta(0), 5 * HOUR):
        engines.clock.now = T0 + HOUR + later
        signals = {r.item_id: r.signals for r in (await rec.recommend(RecQuery("fan", n=10))).items}
        cold = {r.item_id: r.signals for r in (await rec.recommend(RecQuery("nobody", n=10))).items}

        # Then the older view weighs half in the profile and in trending, whenever it is read
        assert signals["like-old"]["profile"] / signals["like-new"]["profile"] == pytest.approx(0.5, rel=2e-3)
        assert cold["old"]["trending"] == pytest.approx(0.5)
        assert cold["new"]["trending"] == pytest.approx(1.0)


async def test_recent_items_weigh_their_neighbours_by_decay(engines: Engines, rec: Recommender) -> None:
    await shop(rec, *(Item(name, vector=unit(1.0)) for name in ("a", "b", "x", "y")))
    # Given a pair (a, x) and a pair (b, y), each of the same strength
    await rec.record([touch("s1", "a", at=T0), touch("s1", "x", at=T0)])
    await rec.record([touch("s2", "b", at=T0), touch("s2", "y", at=T0)])
    # When the user viewed a, and b one half-life later
    await rec.record([touch("me", "a", at=T0), touch("me", "b", at=T0 + HOUR)])
    engines.clock.now = T0 + 2 * HOUR

    signals = {r.item_id: r.signals for r in (await rec.recommend(RecQuery("me", n=10))).items}

    assert signals["y"]["co_occurrence"] == pytest.approx(1.0)
    assert signals["x"]["co_occurrence"] == pytest.approx(0.5)


# ---------------------------------------------------------------------- filters and exclusions


@pytest.fixture
async def stocked(rec: Recommender) -> Recommender:
    await shop(
        rec,
        Item("cheap", name="Cheap mug", categories=("kitchen",), price=2.0, stock=10),
        Item("mid", name="Mid mug", categories=("kitchen",), price=20.0, stock=None),
        Item("dear", name="Dear lamp", categories=("home",), price=200.0, stock=3),
        Item("gone", name="Gone lamp", categories=("home",), price=20.0, stock=0),
        Item("free", name="Unpriced", categories=("home",)),
    )
    await rec.record([touch(f"u{k}", item_id, BUY, at=T0 - 2 * HOUR) for k in range(3)
                      for item_id in ("cheap", "mid", "dear", "gone", "free")])
    return rec


async def test_price_category_and_stock_filters_hold(stocked: Recommender) -> None:
    rec = stocked

    assert set(ids(await rec.recommend(RecQuery("new", n=10)))) == {"cheap", "mid", "dear", "free"}
    assert set(ids(await rec.recommend(RecQuery("new", n=10, in_stock_only=False)))) == {
        "cheap", "mid", "dear", "gone", "free"}
    assert set(ids(await rec.recommend(RecQuery("new", n=10, min_price=10, max_price=100)))) == {"mid"}
    assert set(ids(await rec.recommend(RecQuery("new", n=10, max_price=100, in_stock_only=False)))) == {
        "cheap", "mid", "gone"}  # an unknown price fails a price bound
    assert set(ids(await rec.recommend(RecQuery("new", n=10, categories=("home",))))) == {"dear", "free"}
    both = RecQuery("u0", n=10, categories=("home", "kitchen"), exclude_purchased=False)
    assert set(ids(await rec.recommend(both))) == {"cheap", "mid", "dear", "free"}


async def test_purchased_items_never_come_back_and_the_one_just_bought_never(
    engines: Engines, stocked: Recommender,
) -> None:
    rec = stocked
    earlier = T0 - 2 * HOUR
    await rec.record([touch("me", "cheap", VIEW, at=earlier), touch("me", "mid", BUY, at=earlier)])
    engines.clock.now = T0 + 2 * HOUR

    assert "mid" not in ids(await rec.recommend(RecQuery("me", n=10)))
    assert "mid" in ids(await rec.recommend(RecQuery("me", n=10, exclude_purchased=False)))

    # When the user buys "dear" now: never recommended now, even when purchases are allowed
    await rec.record([touch("me", "dear", BUY, at=engines.clock.now)])
    for exclude in (True, False):
        result = await rec.recommend(RecQuery("me", n=10, exclude_purchased=exclude))
        assert "dear" not in ids(result)
        assert ("mid" in ids(result)) is not exclude


# ---------------------------------------------------------------------- buy again


BUY_AGAIN = RecsSettings(dimension=8, decay_hours=1.0, repeat_decay_hours=10.0, weight_repeat=4.0,
                         session_window_s=1800.0)


async def test_buy_again_counts_decay_with_their_own_half_life(engines: Engines) -> None:
    rec = await engines.fresh(BUY_AGAIN)
    await shop(rec, Item("flour", name="Flour", vector=unit(1.0)),
               Item("yeast", name="Yeast", vector=unit(0.0, 1.0)),
               Item("salt", name="Salt", vector=unit(0.0, 0.0, 1.0)))
    # Given flour bought at T0, and yeast one repeat half-life (10 h) later
    await rec.record([touch("baker", "flour", BUY, at=T0)])
    await rec.record([touch("baker", "yeast", BUY, at=T0 + 10 * HOUR)])
    engines.clock.now = T0 + 11 * HOUR

    # Then flour's count is half of yeast's (the profile's 1 h half-life would make it 2^-10)
    result = await rec.recommend(RecQuery("baker", n=3, exclude_purchased=False))
    signals = {r.item_id: r.signals for r in result.items}
    assert signals["yeast"]["repeat"] == pytest.approx(1.0)
    assert signals["flour"]["repeat"] == pytest.approx(0.5, rel=1e-6)
    assert "repeat" not in signals.get("salt", {})

    # When flour is bought once more, far later: the old purchase still counts, decayed
    engines.clock.now = T0 + 30 * HOUR
    await rec.record([touch("baker", "flour", BUY, at=T0 + 20 * HOUR)])
    signals = {r.item_id: r.signals
               for r in (await rec.recommend(RecQuery("baker", n=3, exclude_purchased=False))).items}
    # flour: 2^-2 + 1 at T0 + 20 h against yeast's 2^-1 there
    assert signals["flour"]["repeat"] == pytest.approx(1.0)
    assert signals["yeast"]["repeat"] == pytest.approx(0.5 / 1.25, rel=1e-6)


async def test_buy_again_ranks_the_users_staples_only_when_purchases_are_allowed(engines: Engines) -> None:
    rec = await engines.fresh(BUY_AGAIN)
    await shop(rec, *(Item(f"i{k}", name=f"Item {k}", vector=unit(*([0.0] * k), 1.0)) for k in range(6)))
    # Given a customer who bought i0 three times and i1 once, and others who buy i2…i4
    for day in range(3):
        await rec.record([touch("me", "i0", BUY, at=T0 + day * HOUR)])
    await rec.record([touch("me", "i1", BUY, at=T0 + 2 * HOUR)])
    await rec.record([touch(f"u{k}", f"i{2 + k % 3}", BUY, at=T0 + 3 * HOUR) for k in range(9)])
    engines.clock.now = T0 + 4 * HOUR

    # Then with purchases allowed the staples come first, explained by the customer's own buying
    result = await rec.recommend(RecQuery("me", n=4, exclude_purchased=False, explain=True))
    assert ids(result)[:2] == ["i0", "i1"]
    reasons = {r.item_id: r.reason for r in result.items}
    assert reasons["i0"] == "you buy this regularly"  # about 2.4 purchases, decayed
    assert reasons["i1"] == "bought again by you"
    # And with purchases excluded nothing of theirs comes back, and no repeat signal shows
    excluded = await rec.recommend(RecQuery("me", n=4, explain=True))
    assert not {"i0", "i1"} & set(ids(excluded))
    assert all("repeat" not in r.signals for r in excluded.items)

    # And an item just bought (within the session window) stays out even when purchases are allowed
    await rec.record([touch("me", "i0", BUY, at=engines.clock.now)])
    assert "i0" not in ids(await rec.recommend(RecQuery("me", n=4, exclude_purchased=False)))


async def test_the_context_item_is_never_recommended(stocked: Recommender) -> None:
    for user in ("new", "u1"):
        result = await stocked.recommend(RecQuery(user, n=10, context="cheap", exclude_purchased=False))
        assert "cheap" not in ids(result) and result.items


# ---------------------------------------------------------------------- deletes, stock-outs, vectors


async def test_deleted_and_sold_out_items_disappear_from_every_path(rec: Recommender) -> None:
    items = [Item(name, name=name.title(), categories=("toys",), vector=unit(1.0, 0.1 * k))
             for k, name in enumerate(("ball", "kite", "yoyo"))]
    await shop(rec, *items)
    # Given kite co-occurs with ball, trends, and is near the user's profile
    await rec.record([touch("u1", "ball"), touch("u1", "kite", BUY), touch("u2", "kite", BUY),
                      touch("me", "ball")])
    assert "kite" in ids(await rec.recommend(RecQuery("me", n=10)))
    assert "kite" in ids(await rec.recommend(RecQuery("nobody", n=10)))

    # When it sells out, then comes back
    await rec.upsert_item(Item("kite", name="Kite", categories=("toys",), stock=0, vector=unit(1.0, 0.1)))
    assert "kite" not in ids(await rec.recommend(RecQuery("me", n=10)))
    assert "kite" not in ids(await rec.recommend(RecQuery("nobody", n=10, context="ball")))
    await rec.upsert_item(Item("kite", name="Kite", categories=("toys",), stock=4, vector=unit(1.0, 0.1)))
    assert "kite" in ids(await rec.recommend(RecQuery("me", n=10)))

    # When it is deleted
    await rec.remove_item("kite")
    for query in (RecQuery("me", n=10), RecQuery("nobody", n=10), RecQuery("nobody", n=10, context="ball"),
                  RecQuery("me", n=10, in_stock_only=False, exclude_purchased=False)):
        assert "kite" not in ids(await rec.recommend(query))
    await rec.record([touch("u3", "kite", BUY), touch("u3", "ball", BUY)])  # late events for it
    assert "kite" not in ids(await rec.recommend(RecQuery("me", n=10)))


async def test_a_vector_swap_changes_profile_similarity(engines: Engines, rec: Recommender) -> None:
    await shop(rec, Item("seen", vector=unit(1.0)), Item("other", vector=unit(0.0, 1.0)))
    await rec.record([touch("me", "seen")])
    before = {r.item_id: r.signals["profile"] for r in (await rec.recommend(RecQuery("me", n=5))).items}
    assert before.get("other", 0.0) == pytest.approx(0.0)

    # When the embedding refresh gives "other" a vector like the one the user viewed
    await rec.upsert_item(Item("other", vector=unit(2.0, 0.0)))

    for replica in (rec, await engines.replica()):
        result = await replica.recommend(RecQuery("me", n=5))
        after = {r.item_id: r.signals["profile"] for r in result.items}
        assert after["other"] == pytest.approx(1.0, abs=1e-6)


async def test_items_without_embeddings_are_similar_by_their_text() -> None:
    from tidegate.recs.vectors import item_vector

    red = item_vector(Item("1", name="Red enamel mug", categories=("kitchen",)), 64)
    mug = item_vector(Item("2", name="Blue enamel mug", categories=("kitchen",)), 64)
    lamp = item_vector(Item("3", name="Brass desk lamp", categories=("lighting",)), 64)
    long_embedding = item_vector(Item("4", vector=tuple(float(k % 7) for k in range(1536))), 64)

    assert float(red @ mug) > float(red @ lamp)
    assert float(red @ red) == pytest.approx(1.0)
    assert long_embedding.shape == (64,) and float(long_embedding @ long_embedding) == pytest.approx(1.0)
    assert (item_vector(Item("2", name="Blue enamel mug", categories=("kitchen",)), 64) == mug).all()


# ---------------------------------------------------------------------- cold start, n, explanations


@pytest.fixture
async def trending(rec: Recommender) -> Recommender:
    await shop(
        rec,
        Item("headphones", name="Headphones", categories=("audio",), vector=unit(1.0)),
        Item("speaker", name="Speaker", categories=("audio",), vector=unit(0.0, 1.0)),
        Item("tent", name="Tent", categories=("outdoor",), vector=unit(0.0, 0.0, 1.0)),
        Item("stove", name="Stove", categories=("outdoor",), vector=unit(0.0, 0.0, 0.0, 1.0)),
    )
    # tent is the most popular overall; speaker leads in audio
    await rec.record([touch(f"t{k}", "tent", BUY, at=T0 + timedelta(hours=3)) for k in range(5)]
                     + [touch(f"s{k}", "speaker", BUY, at=T0 + timedelta(hours=3)) for k in range(3)]
                     + [touch("h0", "headphones", at=T0 + timedelta(hours=3))]
                     + [touch("o1", "stove", at=T0 + timedelta(hours=3))])
    return rec


async def test_cold_start_is_trending_in_context(engines: Engines, trending: Recommender) -> None:
    rec = trending
    engines.clock.now = T0 + timedelta(hours=3)

    globally = await rec.recommend(RecQuery("stranger", n=2))
    assert globally.cold_start and ids(globally) == ["tent", "speaker"]

    in_context = await rec.recommend(RecQuery("stranger", n=1, context="headphones", explain=True))
    assert ids(in_context) == ["speaker"] and in_context.items[0].reason == "trending in audio"

    by_category = await rec.recommend(RecQuery("stranger", n=2, categories=("outdoor",), explain=True))
    assert ids(by_category) == ["tent", "stove"]
    assert [r.reason for r in by_category.items] == ["trending in outdoor"] * 2

    # A narrow context with too few items is followed by the wider scopes
    assert ids(await rec.recommend(RecQuery("stranger", n=3, context="headphones"))) == [
        "speaker", "tent", "stove"]


async def test_an_unknown_user_or_item_never_errors(rec: Recommender) -> None:
    empty = await rec.recommend(RecQuery("ghost", n=10, context="no-such-item", categories=("none",)))
    assert empty.cold_start and empty.items == ()

    await rec.upsert_item(Item("a"))
    await rec.record([touch("u", "unknown-item", BUY), touch("u", "a")])
    result = await rec.recommend(RecQuery("ghost", n=10, context="unknown-item"))
    assert ids(result) == ["a"]


async def test_n_is_bounded(trending: Recommender) -> None:
    assert len((await trending.recommend(RecQuery("stranger", n=2))).items) == 2
    assert len((await trending.recommend(RecQuery("stranger", n=100))).items) == 4
    for n in (0, -1, 101):
        with pytest.raises(InvalidRecsInput, match="n must be an integer from 1 to 100"):
            await trending.recommend(RecQuery("stranger", n=n))


async def test_explanations_name_the_strongest_signal(engines: Engines, rec: Recommender) -> None:
    await shop(
        rec,
        Item("camera", name="Camera", categories=("photo",), vector=unit(1.0)),
        Item("lens", name="Lens", categories=("photo",), vector=unit(0.0, 1.0)),
        Item("bag", name="Camera bag", categories=("photo",), vector=unit(0.9, 0.1)),
        Item("novel", name="Novel", categories=("books",), vector=unit(0.0, 0.0, 1.0)),
    )
    # lens is bought with cameras; novel is hugely popular; bag is like the camera the user viewed
    await rec.record([touch(f"b{k}", item_id, BUY) for k in range(3) for item_id in ("camera", "lens")]
                     + [touch(f"r{k}", "novel", BUY) for k in range(40)]
                     + [touch("me", "camera", VIEW)])

    reasons = {r.item_id: r.reason for r in (await rec.recommend(RecQuery("me", n=10, explain=True))).items}
    plain = await rec.recommend(RecQuery("me", n=10))

    assert reasons["lens"] == "bought together with Camera"
    assert reasons["bag"] == "similar to Camera you viewed"
    assert reasons["novel"] == "trending in books"
    assert all(r.reason is None for r in plain.items)


async def test_diversity_prefers_items_unlike_those_above(rec: Recommender) -> None:
    await shop(rec, Item("seen", vector=unit(1.0, 0.1)), Item("twin-a", vector=unit(1.0, 0.0)),
               Item("twin-b", vector=unit(1.0, 0.01)), Item("apart", vector=unit(0.6, 0.8)))
    await rec.record([touch("me", "seen")])

    assert ids(await rec.recommend(RecQuery("me", n=2))) == ["seen", "twin-b"]
    diverse = await rec.recommend(RecQuery("me", n=3, diversity=0.8))
    assert ids(diverse)[0] == "seen" and ids(diverse)[1] == "apart"


# ---------------------------------------------------------------------- replicas, health, validation


async def test_replicas_see_each_others_interactions_and_items(engines: Engines) -> None:
    first = await engines.fresh()
    second = await engines.replica()
    await shop(first, Item("a", vector=unit(1.0)), Item("b", vector=unit(0.0, 1.0)))

    await first.record([touch("u1", "a"), touch("u1", "b")])
    await second.record([touch("me", "a")])

    for rec in (first, second):
        result = await rec.recommend(RecQuery("me", n=5, explain=True))
        assert ids(result) == ["a", "b"] and result.items[1].reason == "bought together with a"
    await second.remove_item("b")
    assert ids(await first.recommend(RecQuery("me", n=5))) == ["a"]
    assert await first.item("b") is None
    held = await first.item("a")
    assert held is not None and held.vector == pytest.approx(unit(1.0))


async def test_replicas_recording_at_once_lose_no_update(engines: Engines) -> None:
    first = await engines.fresh()
    second = await engines.replica()
    await shop(first, *(Item(f"i{k}", vector=unit(1.0, 0.1 * k)) for k in range(10)))

    # When both record purchases of one user at the same moment, one call per item
    await asyncio.gather(*(
        rec.record([touch("me", f"i{k}", BUY), touch(f"other{k}", "i0", VIEW)])
        for k in range(10) for rec in (first, second)
    ))

    # Then every purchase is held, and the popularity of i0 counts every call
    state = await first.store.user_state("me")
    assert state is not None and set(state.purchased) == {f"i{k}" for k in range(10)}
    assert len(state.recent) == 10
    popularity = dict(await second.store.trending_top(None, 0, 20))
    buy, view = SETTINGS.kind_weights["purchase"], SETTINGS.kind_weights["view"]
    assert 2 ** (popularity["i0"] - T0.timestamp() / 3600.0) == pytest.approx(2 * buy + 20 * view)
    assert 2 ** (popularity["i5"] - T0.timestamp() / 3600.0) == pytest.approx(2 * buy)
    assert (await second.health())["users"] == 11


async def test_health_counts_and_freshness(engines: Engines, rec: Recommender) -> None:
    await shop(rec, Item("a"), Item("b"))
    assert (await rec.health())["last_update_at"] is None

    await rec.record([touch("u1", "a", at=T0 - HOUR), touch("u2", "b", at=T0 - HOUR)])
    engines.clock.now = T0 + timedelta(seconds=30)
    health = await rec.health()

    assert health["items"] == 2 and health["users"] == 2 and health["store"] == engines.backend
    assert health["last_update_at"] == "2026-03-01T12:00:00Z"
    assert health["last_interaction_at"] == "2026-03-01T11:00:00Z"
    assert health["freshness_s"] == pytest.approx(30.0)


async def test_bad_input_is_refused_naming_the_field_and_nothing_is_written(rec: Recommender) -> None:
    await rec.upsert_item(Item("a"))
    naive = datetime(2026, 1, 1)
    with pytest.raises(InvalidRecsInput, match="timezone-aware"):
        await rec.record([touch("u", "a"), Interaction("u", "a", VIEW, naive)])
    assert (await rec.recommend(RecQuery("u", n=3))).cold_start  # the good one was not written either
    with pytest.raises(InvalidRecsInput, match="user_id"):
        await rec.record([touch("", "a")])
    with pytest.raises(InvalidRecsInput, match="quantity"):
        await rec.record([Interaction("u", "a", VIEW, T0, quantity=0)])
    with pytest.raises(InvalidRecsInput, match="vector"):
        await rec.upsert_item(Item("b", vector=(1.0, math.nan)))
    with pytest.raises(InvalidRecsInput, match="price"):
        await rec.upsert_item(Item("b", price=-1.0))
    with pytest.raises(InvalidRecsInput, match="min_price"):
        await rec.recommend(RecQuery("u", min_price=5.0, max_price=1.0))
    with pytest.raises(InvalidRecsInput, match="diversity"):
        await rec.recommend(RecQuery("u", diversity=1.5))
    with pytest.raises(InvalidRecsInput, match="item_id"):
        await rec.remove_item("")


async def test_a_replica_with_another_dimension_is_told_so(engines: Engines, rec: Recommender) -> None:
    await rec.upsert_item(Item("a", name="A"))
    other = await engines.replica(RecsSettings(dimension=16))

    with pytest.raises(ConfigError, match="vector of 8 floats, but this recommender's dimension is 16"):
        await other.recommend(RecQuery("u"))


async def test_a_replica_reloads_its_catalogue_when_the_store_was_emptied(redis_server: str) -> None:
    engines = Engines("redis", redis_server)
    try:
        rec = await engines.fresh()
        await shop(rec, Item("a", vector=unit(1.0)), Item("b", vector=unit(0.0, 1.0)))
        await rec.record([touch("u", "a"), touch("u", "b")])
        await engines.wipe()
        other = await engines.replica()
        await other.upsert_item(Item("c", vector=unit(1.0)))
        await other.record([touch("v", "c")])

        assert ids(await rec.recommend(RecQuery("stranger"))) == ["c"]
        assert (await rec.health())["items"] == 1
    finally:
        await engines.aclose()


def test_settings_are_checked() -> None:
    store = recs_store_for("memory://")
    with pytest.raises(ConfigError, match="decay_hours"):
        Recommender(store, RecsSettings(decay_hours=0))
    for name in ("co_occurrence_decay_hours", "trending_decay_hours", "repeat_decay_hours"):
        with pytest.raises(ConfigError, match=name):
            bad: dict[str, Any] = {name: 0.0}
            Recommender(store, RecsSettings.model_validate(bad))
    with pytest.raises(ConfigError, match="weight_repeat"):
        Recommender(store, RecsSettings(weight_repeat=-1.0))
    with pytest.raises(ConfigError, match="max_repeat"):
        Recommender(store, RecsSettings(max_repeat=0))
    with pytest.raises(ConfigError, match="kind_weights"):
        Recommender(store, RecsSettings(kind_weights={"view": 1.0}))
    with pytest.raises(ConfigError, match="dimension"):
        Recommender(store, RecsSettings(dimension=0))


def test_the_configuration_weighs_every_interaction_kind_and_no_other() -> None:
    # The kinds are the recommender's; the configuration, in the core below it, names them by value.
    assert set(DEFAULT_KIND_WEIGHTS) == {kind.value for kind in InteractionKind}
    assert set(RecsSettings().kind_weights) == {kind.value for kind in InteractionKind}
