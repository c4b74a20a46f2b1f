"""Memory of the recommender's per-user state (profile vector, recent items, purchases), measured
for N users and extrapolated linearly to a million.

The users' events go straight to `RecsStore.record_users`, the call `Recommender.record` makes for
them, so only per-user state is built: co-occurrence and trending lists grow with the catalogue,
not with the users, and are left out. Two populations per store:

- typical: 1 + a geometric number of interactions per user (mean 8), items by popularity, kinds
  75 / 17 / 8 % view / cart / purchase (as `bench.recs_bench_data` draws them);
- full: 40 interactions per user, so every recent list is at its bound (20 items): the most a
  user's state holds short of many purchases.

memory://: the size of every object the store's user table holds, walked from it (`sys.getsizeof`
of each object once: the dict, user ids, records, profile lists and their floats, recent items,
purchases), so objects shared with the rest of the process are not counted twice. Item ids are
fresh strings per event, as rows decoded by the change flow are. (tracemalloc agrees within a few
per cent on small runs but slows the build several times.) redis://: `used_memory` of the private
redis-server before and after (a prefix of its own, nothing else writes meanwhile).
"""

from __future__ import annotations

import gc
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

import numpy as np
import redis.asyncio as aioredis

from bench.recs_bench_data import Shop
from tidegate.testing import (
    InteractionKind,
    RecsSettings,
    RecsStore,
    UserEvent,
    UserParams,
    item_vector,
    recs_store_for,
)

BATCH_USERS = 500
TYPICAL_MEAN = 8
FULL_EVENTS = 40
EVENT_SPACING_S = 60.0  # within the session window: the events make co-occurrence pairs too

Progress = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class MemoryRow:
    """One population on one store."""

    store: str
    population: str
    users: int
    events: int
    recent_per_user: float
    purchases_per_user: float
    bytes_used: int
    seconds: float

    @property
    def bytes_per_user(self) -> float:
        """Bytes of state per user."""
        return self.bytes_used / self.users

    @property
    def gb_per_million(self) -> float:
        """GB (10^9 bytes) for a million such users, extrapolated linearly."""
        return self.bytes_per_user * 1_000_000 / 1e9


class Population:
    """Users' events for one population, drawn once and replayed the same into each store."""

    def __init__(self, name: str, shop: Shop, users: int, counts: Sequence[int], seed: int) -> None:
        self.name = name
        self.users = users
        self.counts = list(counts)
        rng = np.random.default_rng(seed)
        self.draws = [(item, kind) for _, item, kind in shop.draw(sum(self.counts), rng)]
        dimension = RecsSettings().dimension
        used = {item for item, _ in self.draws}
        # The vectors as the recommender hands them to the store (float32-rounded, as upsert does).
        self.vectors = {index: tuple(float(x) for x in item_vector(shop.products[index].item(), dimension)
                                     .astype(np.float32)) for index in used}
        self.item_ids = {index: shop.products[index].item_id for index in used}

    def batches(self, prefix: str) -> Iterator[list[tuple[str, list[UserEvent]]]]:
        """Batches of (user id, events), BATCH_USERS users each."""
        weights = RecsSettings().kind_weights
        now_s = datetime.now(UTC).timestamp()
        position, batch = 0, []
        for user, count in enumerate(self.counts):
            events = []
            for step in range(count):
                item, kind = self.draws[position + step]
                fresh_id = "".join(self.item_ids[item])  # a string of its own, as a decoded row's
                events.append(UserEvent(fresh_id, now_s - (count - step) * EVENT_SPACING_S,
                                        weights[kind.value], kind is InteractionKind.PURCHASE,
                                        self.vectors[item]))
            position += count
            batch.append((f"{prefix}{user}", events))
            if len(batch) == BATCH_USERS:
                yield batch
                batch = []
        if batch:
            yield batch


def populations(shop: Shop, users: int, full_users: int) -> list[Population]:
    """The typical and the full population."""
    rng = np.random.default_rng(17)
    typical = (1 + rng.geometric(1 / TYPICAL_MEAN, users) - 1).clip(1, 200)
    return [Population("typical", shop, users, typical.tolist(), 18),
            Population("full", shop, full_users, [FULL_EVENTS] * full_users, 19)]


def _params() -> UserParams:
    settings = RecsSettings()
    return UserParams(half_life_s=settings.decay_hours * 3600.0, session_window_s=settings.session_window_s,
                      recent_items=settings.recent_items, max_purchased=settings.max_purchased)


async def _build(store: RecsStore, population: Population, prefix: str) -> float:
    params = _params()
    started = time.perf_counter()
    for batch in population.batches(prefix):
        await store.record_users(batch, params)
    return time.perf_counter() - started


async def _shape(store: RecsStore, population: Population, prefix: str,
                 sample: int = 500) -> tuple[float, float]:
    """Mean recent items and purchases held per user, over a sample."""
    states = [await store.user_state(f"{prefix}{n}") for n in range(min(sample, population.users))]
    held = [s for s in states if s is not None]
    return (sum(len(s.recent) for s in held) / len(held), sum(len(s.purchased) for s in held) / len(held))


def deep_size(root: object) -> int:
    """Bytes of `root` and of everything it refers to, each object once (classes left out)."""
    seen: set[int] = set()
    pending, total = [root], 0
    while pending:
        obj = pending.pop()
        if id(obj) in seen or isinstance(obj, type):
            continue
        seen.add(id(obj))
        total += sys.getsizeof(obj)
        pending.extend(gc.get_referents(obj))
    return total


async def measure_memory(population: Population) -> MemoryRow:
    """The memory:// store's bytes for the population."""
    async with recs_store_for("memory://") as store:
        seconds = await _build(store, population, "u")
        used = deep_size(store._users)  # type: ignore[attr-defined]  # the store's user table
        recent, purchases = await _shape(store, population, "u")
    return MemoryRow("memory", population.name, population.users, sum(population.counts), recent, purchases,
                     used, seconds)


async def measure_redis(population: Population, url: str, prefix: str) -> MemoryRow:
    """The redis:// store's `used_memory` growth for the population."""
    client = aioredis.Redis.from_url(url)
    try:
        async with recs_store_for(url, prefix=prefix) as store:
            before = int((await client.info("memory"))["used_memory"])
            seconds = await _build(store, population, "u")
            used = int((await client.info("memory"))["used_memory"]) - before
            recent, purchases = await _shape(store, population, "u")
    finally:
        await client.aclose()
    return MemoryRow("redis", population.name, population.users, sum(population.counts), recent, purchases,
                     used, seconds)


async def measure(shop: Shop, users: int, full_users: int, redis_url: str | None, stores: Sequence[str],
                  progress: Progress) -> list[MemoryRow]:
    """Every population on every store asked for."""
    rows = []
    for number, population in enumerate(populations(shop, users, full_users)):
        for store in stores:
            progress(f"memory, {store}: {population.users:,} {population.name} users "
                     f"({sum(population.counts):,} interactions)")
            if store == "memory":
                rows.append(await measure_memory(population))
            elif redis_url is not None:
                # As long as the default prefix ("tidegate"): key names are part of each user's
                # bytes, and this redis-server is the benchmark's own.
                prefix = f"tidegat{number}"
                rows.append(await measure_redis(population, redis_url, prefix))
    return rows
