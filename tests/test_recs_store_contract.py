"""The recommendation store contract: one suite, run against memory://, redis:// and redis+cluster://
through `stores`.

The catalogue and its change log, per-user state (decayed profile, co-occurrence pairs, recent and
purchased items, buy-again counts) checked against a from-scratch reference over random event lists, log-added
bounded lists (neighbours, trending), bookkeeping, lifecycle, and the Redis-only parts (hash tags,
shared state between processes, a server that goes away).
"""

from __future__ import annotations

import math
import random
import struct
import subprocess
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from support.own_redis import own_redis_server
from support.redis_keys import REDIS_BACKENDS, delete_keys, redis_client, redis_url_of
from tidegate.errors import CacheUnavailable, ConfigError
from tidegate.recs import Item, RecsStore, recs_store_for
from tidegate.recs.score import log_add, log_weight
from tidegate.recs.store.base import RecentItem, UserEvent, UserParams
from tidegate.recs.store.memory import (
    BoundedScores,
    ItemCodes,
    MemoryRecsStore,
    UserRecord,
    pack_user,
    unpack_user,
)

BACKENDS = ["memory", *REDIS_BACKENDS]
T0 = 1_767_225_600.0  # 2026-01-01T00:00:00Z
HOUR = 3600.0
# Each decayed sum with a half-life of its own, so a mix-up shows.
PARAMS = UserParams(half_life_s=HOUR, session_window_s=1800.0, recent_items=50, max_purchased=50,
                    co_occurrence_half_life_s=2 * HOUR, repeat_half_life_s=3 * HOUR, max_repeat=50)
VECTORS = {"a": (1.0, 0.0, 0.0, 0.0), "b": (0.0, 1.0, 0.0, 0.0), "c": (0.6, 0.8, 0.0, 0.0)}


# ---------------------------------------------------------------------- fixtures


@dataclass
class Stores:
    """Opens stores sharing one test's state: the one memory store, or one Redis prefix."""

    backend: str
    url: str
    prefix: str = field(default_factory=lambda: f"t{uuid.uuid4().hex[:12]}")
    opened: list[RecsStore] = field(default_factory=list)

    async def open(self) -> RecsStore:
        if self.backend == "memory" and self.opened:
            return self.opened[0]
        store = await recs_store_for(self.url, prefix=self.prefix).open()
        self.opened.append(store)
        return store

    async def aclose(self) -> None:
        for store in self.opened:
            await store.close()
        if self.backend in REDIS_BACKENDS:
            await delete_keys(self.url, f"{{{self.prefix}:*")


@pytest.fixture(params=BACKENDS)
async def stores(request: pytest.FixtureRequest) -> AsyncIterator[Stores]:
    backend: str = request.param
    url = "memory://" if backend == "memory" else redis_url_of(request, backend)
    factory = Stores(backend, url)
    try:
        yield factory
    finally:
        await factory.aclose()


@pytest.fixture
async def store(stores: Stores) -> RecsStore:
    return await stores.open()


def item(item_id: str, *categories: str, price: float | None = None, stock: int | None = None) -> Item:
    vector = VECTORS.get(item_id, (0.0, 0.0, 1.0, 0.0))
    return Item(item_id, name=item_id.upper(), categories=categories, price=price, stock=stock, vector=vector)


def event(item_id: str, at_s: float, weight: float = 1.0, *, purchase: bool = False,
          vector: bool = True) -> UserEvent:
    return UserEvent(item_id, at_s, weight, purchase, VECTORS.get(item_id) if vector else None)


# ---------------------------------------------------------------------- catalogue


async def test_put_items_are_read_back_from_the_change_log(store: RecsStore) -> None:
    shoe = item("a", "shoes", price=9.5, stock=3)

    assert await store.items_version() == 0
    assert await store.put_item(shoe) == 1
    assert await store.put_item(item("b")) == 2

    changes = await store.items_since(0)
    assert changes.complete and changes.version == 2
    assert changes.changes == (("a", shoe), ("b", item("b")))
    assert (await store.items_since(2)).changes == ()


async def test_items_since_pages_and_gives_each_item_once_at_its_latest_state(store: RecsStore) -> None:
    for name in "abcde":
        await store.put_item(item(name))
    newer = item("b", "new", price=1.0)
    await store.put_item(newer)
    await store.delete_item("c")

    first = await store.items_since(0, limit=2)
    assert not first.complete
    seen = list(first.changes)
    page = first
    while not page.complete:
        page = await store.items_since(page.version, limit=2)
        seen += page.changes

    assert page.version == await store.items_version() == 7
    assert dict(seen) == {"a": item("a"), "b": newer, "c": None, "d": item("d"), "e": item("e")}
    assert [item_id for item_id, _ in seen] == ["a", "d", "e", "b", "c"]  # in change order


async def test_delete_item_returns_the_item_and_clears_its_trending_and_neighbours(store: RecsStore) -> None:
    await store.put_item(item("a", "shoes"))
    await store.add_trending({None: {"a": 1.0, "b": 1.0}, "shoes": {"a": 1.0}}, 10)
    await store.add_neighbours({"a": {"b": 1.0}, "b": {"a": 1.0}}, 10)

    assert await store.delete_item("a") == item("a", "shoes")

    assert [item_id for item_id, _ in await store.trending_top(None, 0, 10)] == ["b"]
    assert await store.trending_top("shoes", 0, 10) == []
    # Other lists still name it: readers skip ids that are not in the catalogue.
    assert await store.neighbours(["a", "b"], 10) == {"b": [("a", 1.0)]}
    assert await store.delete_item("a") is None
    assert await store.items_version() == 2  # a delete of nothing is no change


# ---------------------------------------------------------------------- users: explicit cases


async def test_a_profile_decays_to_the_newest_event_and_adds_older_ones_decayed(store: RecsStore) -> None:
    await store.record_users([("u", [event("a", T0, 2.0), event("b", T0 + HOUR, 1.0)])], PARAMS)
    state = await store.user_state("u")
    assert state is not None
    assert state.profile_at_s == T0 + HOUR
    assert state.profile == pytest.approx((1.0, 1.0, 0.0, 0.0))  # 2 · ½ + 1

    await store.record_users([("u", [event("a", T0 - HOUR, 4.0)])], PARAMS)  # late: two half-lives old

    state = await store.user_state("u")
    assert state is not None
    assert state.profile_at_s == T0 + HOUR
    assert state.profile == pytest.approx((2.0, 1.0, 0.0, 0.0))


async def test_an_event_without_a_vector_leaves_the_profile_alone(store: RecsStore) -> None:
    await store.record_users([("u", [event("a", T0), event("x", T0 + HOUR, vector=False)])], PARAMS)

    state = await store.user_state("u")
    assert state is not None
    assert state.profile == pytest.approx(VECTORS["a"]) and state.profile_at_s == T0
    assert [entry.item_id for entry in state.recent] == ["x", "a"]


async def test_pairs_come_from_recent_items_within_the_window_at_the_weaker_weight(store: RecsStore) -> None:
    outcome, = await store.record_users(
        [("u", [event("a", T0, 5.0), event("b", T0 + 600, 3.0), event("a", T0 + 601, 1.0),
                event("c", T0 + 2401, 1.0)])],
        PARAMS,
    )

    assert outcome.new_user
    pairs: list[tuple[str, str, object]] = [(a, b, pytest.approx(value)) for a, b, value in outcome.pairs]
    assert pairs == [
        # log weights with the co-occurrence half-life, not the profile's
        ("b", "a", log_weight(3.0, T0 + 600, 2 * HOUR)),
        ("a", "b", log_weight(1.0, T0 + 601, 2 * HOUR)),
        # a, touched again at +601, is 1800 s away; b is not
        ("c", "a", log_weight(1.0, T0 + 2401, 2 * HOUR)),
    ]
    again, = await store.record_users([("u", [event("b", T0 + 9000)])], PARAMS)
    assert not again.new_user and again.pairs == ()


async def test_recent_items_keep_the_newest_and_purchases_keep_the_latest_time(store: RecsStore) -> None:
    params = UserParams(half_life_s=HOUR, session_window_s=0.0, recent_items=2, max_purchased=2,
                        max_repeat=2)
    await store.record_users([("u", [
        event("a", T0, 5.0, purchase=True), event("b", T0 + 1), event("c", T0 + 2, purchase=True),
        event("a", T0 + 3, 5.0, purchase=True), event("d", T0 + 4, purchase=True),
        event("d", T0 + 1, 3.0, purchase=True),  # older than what is held: changes nothing
    ])], params)

    state = await store.user_state("u")
    assert state is not None
    assert state.recent == (RecentItem("d", T0 + 4, 1.0), RecentItem("a", T0 + 3, 5.0))
    assert state.purchased == {"a": T0 + 3, "d": T0 + 4}
    # the buy-again counts keep the two largest: a and d were bought twice, c once
    assert set(state.repeat) == {"a", "d"}


async def test_buy_again_counts_log_add_each_purchase_and_keep_the_largest(store: RecsStore) -> None:
    h = 3 * HOUR
    params = UserParams(half_life_s=HOUR, session_window_s=0.0, recent_items=5, max_purchased=10,
                        repeat_half_life_s=h, max_repeat=3)
    # a bought twice, one half-life apart; b, c, d once at the same time (a tie at the bound)
    await store.record_users([("u", [event("a", T0, purchase=True), event("b", T0 + h, purchase=True),
                                     event("c", T0 + h, purchase=True), event("x", T0 + h)])], params)
    await store.record_users([("u", [event("d", T0 + h, purchase=True), event("a", T0 + h, purchase=True)])],
                             params)

    state = await store.user_state("u")
    assert state is not None
    # a: 2^(T0/h) + 2^((T0+h)/h) = 1.5 · 2^((T0+h)/h); the tie among b, c, d drops the smallest id
    assert dict(state.repeat) == pytest.approx({"a": log_weight(1.5, T0 + h, h),
                                                "c": log_weight(1.0, T0 + h, h),
                                                "d": log_weight(1.0, T0 + h, h)}, rel=1e-12)
    # a view is no purchase; the purchased set (its own bound) holds all four
    assert set(state.purchased) == {"a", "b", "c", "d"}


async def test_the_purchased_set_is_exact_for_a_wholesaler(store: RecsStore) -> None:
    from tidegate.recs import RecsSettings

    settings = RecsSettings()
    params = UserParams(half_life_s=HOUR, session_window_s=0.0, recent_items=settings.recent_items,
                        max_purchased=settings.max_purchased, max_repeat=settings.max_repeat)
    # A customer who bought 2,500 distinct products (the retail data's largest bought ~1,800)
    bought = [f"p{k:04d}" for k in range(2500)]
    for start in range(0, len(bought), 500):
        chunk = enumerate(bought[start:start + 500], start)
        batch = [event(code, T0 + k, purchase=True) for k, code in chunk]
        await store.record_users([("w", batch)], params)

    state = await store.user_state("w")
    assert state is not None
    assert set(state.purchased) == set(bought)  # every one of them stays excluded
    assert len(state.repeat) == settings.max_repeat  # only the counts are bounded: the newest kept
    assert set(state.repeat) == set(bought[-settings.max_repeat:])


async def test_equal_times_keep_the_larger_weight_and_the_entry_updated_last_first(store: RecsStore) -> None:
    await store.record_users([("u", [event("a", T0, 3.0), event("b", T0), event("a", T0, 1.0)])], PARAMS)

    state = await store.user_state("u")
    assert state is not None
    assert state.recent == (RecentItem("a", T0, 3.0), RecentItem("b", T0, 1.0))


async def test_an_unknown_user_has_no_state(store: RecsStore) -> None:
    assert await store.user_state("nobody") is None
    assert await store.record_users([], PARAMS) == []


# ---------------------------------------------------------------------- users: against a reference


def reference_user(events: Sequence[UserEvent], params: UserParams) -> tuple[
    tuple[float, ...], float, list[tuple[str, float, float]], dict[str, float], list[tuple[str, str, float]],
    dict[str, float],
]:
    """Profile, its time, recent items (newest first), purchases, pairs and buy-again counts (log2
    of the sum of 2^(t / repeat half-life) over the item's purchases), from the event list.

    A recent entry is the item's latest time and the largest weight at that time; among equal
    times, the entry whose last event at that time came later ranks first."""
    timed = [e for e in events if e.vector is not None]
    profile_at = max((e.at_s for e in timed), default=0.0)
    dimension = len(next(iter(VECTORS.values())))
    profile = tuple(
        sum(e.weight * 2.0 ** ((e.at_s - profile_at) / params.half_life_s) * e.vector[k]  # type: ignore[index]
            for e in timed)
        for k in range(dimension)
    ) if timed else ()

    def entry(item_id: str, before: int) -> tuple[float, float, int] | None:
        seen = [(e.at_s, index) for index, e in enumerate(events[:before]) if e.item_id == item_id]
        if not seen:
            return None
        latest = max(at for at, _ in seen)
        at_latest = [index for at, index in seen if at == latest]
        return latest, max(events[index].weight for index in at_latest), max(at_latest)

    pairs = []
    for index, e in enumerate(events):
        for other in dict.fromkeys(x.item_id for x in events[:index]):
            held = entry(other, index)
            if other != e.item_id and held is not None and abs(e.at_s - held[0]) <= params.session_window_s:
                weight = min(e.weight, held[1])
                if weight > 0:
                    value = log_weight(weight, max(e.at_s, held[0]), params.pair_half_life_s)
                    pairs.append((e.item_id, other, value))
    entries = {item_id: entry(item_id, len(events)) for item_id in dict.fromkeys(e.item_id for e in events)}
    ranked = sorted(entries.items(), key=lambda kv: (kv[1][0], kv[1][2]), reverse=True)  # type: ignore[index]
    recent = [(item_id, held[0], held[1]) for item_id, held in ranked if held is not None]
    purchased: dict[str, float] = {}
    for e in events:
        if e.purchase:
            purchased[e.item_id] = max(e.at_s, purchased.get(e.item_id, e.at_s))
    repeat = {}
    for item_id in purchased:
        exponents = [e.at_s / params.repeat_half_life_s
                     for e in events if e.purchase and e.item_id == item_id]
        top = max(exponents)
        repeat[item_id] = top + math.log2(sum(2.0 ** (x - top) for x in exponents))
    return profile, profile_at, recent, purchased, pairs, repeat


events_strategy = st.lists(
    st.builds(
        lambda item_id, offset, weight, purchase: UserEvent(
            item_id, T0 + offset, weight, purchase, VECTORS.get(item_id)),
        st.sampled_from(["a", "b", "c", "x"]),  # x: not in the catalogue, no vector
        st.integers(0, 3) .map(lambda k: k * 900.0),  # equal times happen, some beyond the window
        st.sampled_from([0.0, 1.0, 3.0, 5.0]),
        st.booleans(),
    ),
    min_size=1, max_size=12,
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(events=events_strategy, split=st.integers(0, 12))
async def test_user_updates_match_a_recomputation_from_the_events(
    stores: Stores, events: list[UserEvent], split: int,
) -> None:
    store = await stores.open()
    user = f"u{uuid.uuid4().hex[:8]}"
    split = min(split, len(events))
    batches = [chunk for chunk in (events[:split], events[split:]) if chunk]
    pairs: list[tuple[str, str, float]] = []
    for chunk in batches:
        outcome, = await store.record_users([(user, chunk)], PARAMS)
        pairs += outcome.pairs
    state = await store.user_state(user)
    profile, profile_at, recent, purchased, expected_pairs, repeat = reference_user(events, PARAMS)

    assert state is not None
    # kept in fixed point: one rounding per batch (to within 2^-15 of the largest component)
    assert state.profile == pytest.approx(profile, rel=5e-3, abs=5e-3)
    if profile:
        assert state.profile_at_s == profile_at
    assert [(e.item_id, e.at_s, e.weight) for e in state.recent] == recent
    assert dict(state.purchased) == purchased
    assert dict(state.repeat) == pytest.approx(repeat, rel=1e-12)
    pairs.sort()  # the order of pairs within an event is not part of the contract
    expected_pairs.sort()
    assert [(a, b) for a, b, _ in pairs] == [(a, b) for a, b, _ in expected_pairs]
    expected_values = [value for _, _, value in expected_pairs]
    assert [value for _, _, value in pairs] == pytest.approx(expected_values, rel=1e-12)


# ---------------------------------------------------------------------- neighbours and trending


async def test_neighbour_weights_log_add_and_the_list_keeps_the_strongest(store: RecsStore) -> None:
    await store.add_neighbours({"a": {"b": 0.0, "c": 1.0, "d": 0.5}}, 10)
    await store.add_neighbours({"a": {"b": 0.0}}, 10)  # 2^0 + 2^0 = 2^1

    ranked = (await store.neighbours(["a"], 10))["a"]
    assert [item_id for item_id, _ in ranked] == ["c", "b", "d"]  # equal scores: larger id first
    assert [value for _, value in ranked] == pytest.approx([1.0, 1.0, 0.5])

    await store.add_neighbours({"a": {"e": 2.0, "f": 0.75}}, 3)  # past the bound: the weakest go

    assert [item_id for item_id, _ in (await store.neighbours(["a"], 10))["a"]] == ["e", "c", "b"]
    assert [item_id for item_id, _ in (await store.neighbours(["a"], 2))["a"]] == ["e", "c"]
    assert await store.neighbours(["nobody"], 10) == {}


async def test_one_call_log_adds_several_members_of_several_lists(store: RecsStore) -> None:
    first = {"a": {"x": 0.1, "y": 1 / 3, "z": 2.5}, "b": {"x": 7.25, "w": -1.5}}
    second = {"a": {"y": 0.2, "z": 2.5, "v": 0.3, "u": 1e-9}, "b": {"w": 40.0}, "c": {"x": 0.7}}
    await store.add_neighbours(first, 4)
    await store.add_neighbours(second, 4)  # a: five members past a bound of four, in one call

    lists = await store.neighbours(["a", "b", "c"], 10)
    expected = {"a": [("z", log_add(2.5, 2.5)), ("y", log_add(1 / 3, 0.2)), ("v", 0.3), ("x", 0.1)],
                "b": [("w", log_add(-1.5, 40.0)), ("x", 7.25)], "c": [("x", 0.7)]}
    assert {key: [member for member, _ in ranked] for key, ranked in lists.items()} == {
        key: [member for member, _ in ranked] for key, ranked in expected.items()}
    # Added values are kept as they were sent; a log-add within an ulp (Lua has no log1p).
    for key, ranked in expected.items():
        assert [value for _, value in lists[key]] == pytest.approx([value for _, value in ranked], rel=1e-15)
    assert lists["a"][2:] == [("v", 0.3), ("x", 0.1)] and lists["c"] == [("x", 0.7)]


async def test_bound_ties_drop_the_smallest_id_first(store: RecsStore) -> None:
    await store.add_trending({None: {"b": 1.0, "a": 1.0, "c": 1.0}}, 2)

    assert [item_id for item_id, _ in await store.trending_top(None, 0, 10)] == ["c", "b"]


async def test_trending_scopes_are_separate_and_read_in_pages(store: RecsStore) -> None:
    await store.add_trending({None: {"a": 3.0, "b": 2.0, "c": 1.0}, "shoes": {"b": 5.0}}, 100)
    await store.add_trending({None: {"c": 3.0}}, 100)

    top = await store.trending_top(None, 0, 2)
    assert [item_id for item_id, _ in top] == ["c", "a"]
    assert top[0][1] == pytest.approx(log_add(1.0, 3.0))
    assert [item_id for item_id, _ in await store.trending_top(None, 2, 2)] == ["b"]
    assert await store.trending_top("shoes", 0, 5) == [("b", 5.0)]
    assert await store.trending_scores("shoes", ["a", "b"]) == [None, 5.0]
    assert await store.trending_scores("hats", ["a"]) == [None]


async def test_a_large_trending_batch_keeps_the_most_popular(store: RecsStore) -> None:
    adds = {f"i{k:05d}": k / 1000.0 for k in range(12_000)}

    await store.add_trending({None: adds, "half": dict(list(adds.items())[::2])}, 10_000)

    assert [item_id for item_id, _ in await store.trending_top(None, 9_999, 5)] == ["i02000"]
    assert (await store.trending_top(None, 0, 1))[0][0] == "i11999"
    assert len(await store.trending_top("half", 0, 10_000)) == 6_000


async def test_stats_count_items_and_users_and_keep_the_newest_times(store: RecsStore) -> None:
    assert (await store.stats()).last_update_s is None
    await store.put_item(item("a"))
    await store.note_update(at_s=T0 + 10, interaction_at_s=T0, new_users=2)
    await store.note_update(at_s=T0 + 5, interaction_at_s=T0 + 1, new_users=1)

    stats = await store.stats()
    assert (stats.items, stats.users) == (1, 3)
    assert (stats.last_update_s, stats.last_interaction_s) == (T0 + 10, T0 + 1)


# ---------------------------------------------------------------------- lifecycle


async def test_a_closed_store_refuses_calls_and_cannot_reopen(stores: Stores) -> None:
    store = recs_store_for(stores.url, prefix=stores.prefix)
    with pytest.raises(CacheUnavailable, match="not opened"):
        await store.items_version()
    async with store:
        await store.items_version()
    with pytest.raises(CacheUnavailable, match="closed"):
        await store.items_version()
    with pytest.raises(CacheUnavailable, match="closed"):
        await store.open()


def test_store_urls_and_prefixes_are_checked() -> None:
    assert isinstance(recs_store_for("memory://"), MemoryRecsStore)
    with pytest.raises(ConfigError, match="memory:// or redis://"):
        recs_store_for("postgres://user:pw@host/db")
    with pytest.raises(ConfigError, match="prefix"):
        recs_store_for("redis://127.0.0.1:1/0", prefix="a{b}")


# ---------------------------------------------------------------------- memory only


def test_memory_packed_users_keep_every_value_and_round_the_profile_to_fixed_point() -> None:
    codes = ItemCodes()
    record = UserRecord(
        profile=[0.1, -2.5, 1e-30, 3.0], profile_at_s=T0 + 0.123456,
        recent=[("b", T0 + 60.5, 3.0), ("a", T0, 0.25)],
        purchased={"a": T0 + 1e-6, "c": T0 - 7.0}, repeat={"a": 123.456789, "c": -1.5},
    )
    unpacked = unpack_user(pack_user(record, codes), codes)
    # the largest component, 3.0, is below 2^2: each is kept in steps of 2^(2 - 14)
    assert unpacked.profile == [math.floor(x * 2**12 + 0.5) / 2**12 for x in record.profile]
    assert (unpacked.profile_at_s, unpacked.recent) == (record.profile_at_s, record.recent)
    assert (unpacked.purchased, unpacked.repeat) == (record.purchased, record.repeat)
    assert len(codes) == 3  # ids are shared across users as codes
    assert unpack_user(pack_user(UserRecord(), codes), codes) == UserRecord()


def test_a_bounded_list_drops_the_weakest_before_and_after_it_keeps_a_heap() -> None:
    # Given additions in chunks, each chunk followed by a trim (the first trims build the heap)
    scores, reference = BoundedScores(), dict[str, float]()
    for chunk in range(12):
        adds = [(f"m{(chunk * 5 + k) % 9}", float((chunk + k) % 4)) for k in range(5)]
        scores.add_all(adds)
        for member, value in adds:
            reference[member] = value if member not in reference else log_add(reference[member], value)
        scores.trim(4)
        # Then the same members are kept as by sorting (weakest first, ties: the smallest id)
        weakest_first = sorted(reference.items(), key=lambda kv: (kv[1], kv[0]))
        for member, _ in weakest_first[:max(0, len(reference) - 4)]:
            del reference[member]
        assert scores.scores == reference


def test_a_bounded_lists_head_follows_additions_trims_and_removals() -> None:
    # Given a long list read by its head between writes (trending under a stream of interactions)
    rng = random.Random(7)
    scores, reference = BoundedScores(), dict[str, float]()
    for step in range(300):
        adds = [(f"m{rng.randrange(400)}", rng.choice([0.5, 1.0, float(step % 7)]))
                for _ in range(rng.randrange(1, 6))]
        scores.update(adds, 300)
        for member, value in adds:
            reference[member] = value if member not in reference else log_add(reference[member], value)
        weakest_first = sorted(reference.items(), key=lambda kv: (kv[1], kv[0]))
        for member, _ in weakest_first[:max(0, len(reference) - 300)]:
            del reference[member]
        if step % 50 == 49:
            removed = rng.choice(sorted(reference))
            scores.remove(removed)
            del reference[removed]
        # Then each read of the head is the head of the whole ranking
        count = rng.choice([5, 10, 20])
        expected = sorted(reference.items(), key=lambda kv: (kv[1], kv[0]), reverse=True)[:count]
        assert scores.top(0, count) == expected


# ---------------------------------------------------------------------- Redis only


@pytest.fixture
async def redis_stores(redis_url: str) -> AsyncIterator[Stores]:
    factory = Stores("redis", redis_url)
    try:
        yield factory
    finally:
        await factory.aclose()


async def test_redis_stores_with_one_prefix_share_state(redis_stores: Stores) -> None:
    writer, reader = await redis_stores.open(), await redis_stores.open()

    await writer.put_item(item("a"))
    await writer.record_users([("u", [event("a", T0)])], PARAMS)
    await writer.add_trending({None: {"a": 1.0}}, 10)

    assert (await reader.items_since(0)).changes == (("a", item("a")),)
    assert await reader.user_state("u") == await writer.user_state("u")
    assert await reader.trending_top(None, 0, 1) == [("a", 1.0)]


async def test_redis_keys_carry_a_hash_tag_per_unit(redis_stores: Stores) -> None:
    store = await redis_stores.open()
    await store.put_item(item("a", "shoes"))
    await store.record_users([("u1", [event("a", T0, purchase=True), event("b", T0 + 1)])], PARAMS)
    await store.add_neighbours({"a": {"b": 1.0}}, 10)
    await store.add_trending({None: {"a": 1.0}, "shoes": {"a": 1.0}}, 10)
    await store.note_update(at_s=T0, interaction_at_s=T0, new_users=1)

    client = redis_client(redis_stores.url)
    try:
        keys = sorted([key.decode() async for key in client.scan_iter(match=f"*{redis_stores.prefix}*")])
    finally:
        await client.aclose()
    p = redis_stores.prefix
    assert keys == sorted([
        f"{{{p}:recs:items}}:data", f"{{{p}:recs:items}}:log", f"{{{p}:recs:items}}:version",
        f"{{{p}:recs:user:u1}}:state",
        f"{{{p}:recs:item:a}}:neighbours",
        f"{{{p}:recs:trending}}:all", f"{{{p}:recs:trending}}:category:shoes",
        f"{{{p}:recs}}:meta", f"{{{p}:recs}}:formats",
    ])


async def test_redis_reads_a_user_of_the_earlier_layout_and_replaces_it_on_the_next_write(
    redis_stores: Stores,
) -> None:
    # Given a user written in the earlier layout: a hash of msgpack profile and recent items
    store = await redis_stores.open()
    key = f"{{{redis_stores.prefix}:recs:user:u}}:state"
    client = redis_client(redis_stores.url)
    try:
        await client.hset(key, mapping={"p": msgpack.packb([T0, 1.0, 0.0, 0.0, 0.0]),
                                        "r": msgpack.packb(["a", T0, 1.0])})
        # Then it reads as it was written
        held = await store.user_state("u")
        assert held is not None
        assert held.profile == (1.0, 0.0, 0.0, 0.0) and held.profile_at_s == T0
        assert held.recent == (RecentItem("a", T0, 1.0),)
        # When the user interacts again, the state is the same as if it had been the new layout
        outcome, = await store.record_users([("u", [event("b", T0 + 60)])], PARAMS)
        assert outcome.new_user is False and [(a, b) for a, b, _ in outcome.pairs] == [("b", "a")]
        assert await client.type(key) == b"string"
    finally:
        await client.aclose()
    state = await store.user_state("u")
    assert state is not None
    assert [entry.item_id for entry in state.recent] == ["b", "a"]
    assert state.profile_at_s == T0 + 60


async def test_redis_keeps_the_profile_rounded_as_the_memory_store_does(redis_stores: Stores) -> None:
    # Given the same events, with profiles of every magnitude
    rng = random.Random(3)
    params = UserParams(half_life_s=HOUR, session_window_s=1800.0, recent_items=5, max_purchased=3,
                        max_repeat=2)
    batches = []
    for user in range(40):
        size = 10.0 ** rng.randrange(-9, 7)
        events = [UserEvent(f"i{rng.randrange(8)}", T0 + rng.randrange(0, 7200), rng.choice([1.0, 3.0, 0.5]),
                            rng.random() < 0.4, tuple(size * rng.uniform(-1, 1) for _ in range(8)))
                  for _ in range(rng.randrange(1, 12))]
        batches.append((f"u{user}", events))
    memory, redis_store = await recs_store_for("memory://").open(), await redis_stores.open()
    try:
        for user_id, events in batches:
            for start in range(0, len(events), 3):
                await memory.record_users([(user_id, events[start:start + 3])], params)
                await redis_store.record_users([(user_id, events[start:start + 3])], params)
        # Then both stores hold the same state to the bit
        for user_id, _ in batches:
            assert await redis_store.user_state(user_id) == await memory.user_state(user_id)
    finally:
        await memory.close()


async def test_redis_folds_a_user_of_the_earlier_string_layout_into_one_string(redis_stores: Stores) -> None:
    # Given a user written by the earlier string layout: float32 profile, recent items, and the
    # purchases and buy-again counts in sorted sets of their own
    store = await redis_stores.open()
    tag = f"{{{redis_stores.prefix}:recs:user:u}}"
    client = redis_client(redis_stores.url)
    try:
        earlier = struct.pack("<dI4f", T0, 4, 0.5, 0.25, 0.0, 0.0) + msgpack.packb(["a", T0, 5.0])
        await client.set(f"{tag}:state", earlier)
        await client.zadd(f"{tag}:bought", {"a": T0})
        await client.zadd(f"{tag}:again", {"a": 7.5})
        # Then it reads as it was written
        held = await store.user_state("u")
        assert held is not None
        assert (held.profile, held.profile_at_s) == ((0.5, 0.25, 0.0, 0.0), T0)
        assert held.recent == (RecentItem("a", T0, 5.0),)
        assert (held.purchased, held.repeat) == ({"a": T0}, {"a": 7.5})
        # When the user interacts again, everything is one string and the sorted sets are gone
        await store.record_users([("u", [event("b", T0 + 60, purchase=True)])], PARAMS)
        assert await client.exists(f"{tag}:bought", f"{tag}:again") == 0
    finally:
        await client.aclose()
    state = await store.user_state("u")
    assert state is not None
    assert [entry.item_id for entry in state.recent] == ["b", "a"]
    assert set(state.purchased) == {"a", "b"} and state.repeat["a"] == 7.5


@pytest.fixture
def stopped_redis_url(tmp_path: Path) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """A password-protected redis-server of this test's own, which the test may stop."""
    with own_redis_server(tmp_path) as server:
        yield server.url, server.process


async def test_redis_going_away_raises_cache_unavailable_without_the_password(
    stopped_redis_url: tuple[str, subprocess.Popen[bytes]],
) -> None:
    url, process = stopped_redis_url
    store = await recs_store_for(url).open()
    try:
        await store.put_item(item("a"))
        process.terminate()
        process.wait(timeout=10)

        with pytest.raises(CacheUnavailable) as failure:
            await store.record_users([("u", [event("a", T0)])], PARAMS)
        assert "127.0.0.1" in str(failure.value) and "s3cret" not in str(failure.value)
        with pytest.raises(CacheUnavailable):
            await store.user_state("u")
    finally:
        await store.close()
    with pytest.raises(CacheUnavailable, match=r"cannot reach the recommendation store at redis://:\*\*\*@"):
        await recs_store_for(url).open()


def test_log_add_is_the_log_of_the_sum() -> None:
    assert log_add(3.0, 3.0) == pytest.approx(4.0)
    assert log_add(-math.inf, 2.5) == 2.5
    assert 2 ** log_add(1.0, 0.0) == pytest.approx(3.0)
