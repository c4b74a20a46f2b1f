"""The entity cache contract: one suite, run against memory:// and redis:// through `caches`.

Compare-and-set on versions (duplicates and older changes are stale and never regress state),
tombstones and truncate floors, TTLs, single-flight loads on a miss, optimistic application
writes, checkpoints, scan/count, and the Redis-only parts (hash tags, shared state between
processes, a server that goes away). Memory TTLs run on an injected clock; Redis TTLs run on the
server's clock, so the Redis cases wait the TTL out.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from support.own_redis import OwnRedis, own_redis_server
from support.redis_keys import REDIS_BACKENDS, delete_keys, redis_client, redis_url_of
from support.waiting import eventually
from tidegate.errors import CacheUnavailable, ConfigError, InvalidChange, VersionConflict
from tidegate.sync import ApplyOutcome, Change, Op, Version, checksum
from tidegate.sync.cache import ZERO_VERSION, BaseEntityCache, MemoryEntityCache, cache_for
from tidegate.sync.values import Row

BACKENDS = ["memory", *REDIS_BACKENDS]
COMMIT = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
SHORT_TTL_S = 0.3  # long enough for a few round trips on a busy machine, short enough to wait out
PAST_TTL_S = 0.6
APPLIED, STALE = ApplyOutcome.APPLIED, ApplyOutcome.STALE


# ---------------------------------------------------------------------- helpers


def change(op: Op, entity_id: str, lsn: int, ordinal: int = 0, *, entity_type: str = "products",
           **values: Any) -> Change:
    """A change of row `entity_id` (key column "id") at version (lsn, ordinal)."""
    version = Version(lsn, ordinal)
    if op is Op.TRUNCATE:
        return Change.of_row(entity_type=entity_type, op=op, key_columns=["id"], version=version,
                             commit_time=COMMIT)
    row = {"id": entity_id, **values}
    if op is Op.DELETE:
        return Change.of_row(entity_type=entity_type, op=op, key_columns=["id"], version=version,
                             commit_time=COMMIT, before=row)
    return Change.of_row(entity_type=entity_type, op=op, key_columns=["id"], version=version,
                         commit_time=COMMIT, after=row)


def insert(entity_id: str, lsn: int, ordinal: int = 0, **values: Any) -> Change:
    return change(Op.INSERT, entity_id, lsn, ordinal, **values)


def update(entity_id: str, lsn: int, ordinal: int = 0, **values: Any) -> Change:
    return change(Op.UPDATE, entity_id, lsn, ordinal, **values)


def delete(entity_id: str, lsn: int, ordinal: int = 0, **values: Any) -> Change:
    return change(Op.DELETE, entity_id, lsn, ordinal, **values)


def truncate(lsn: int, ordinal: int = 0, entity_type: str = "products") -> Change:
    return change(Op.TRUNCATE, "*", lsn, ordinal, entity_type=entity_type)


def outcomes(results: Sequence[Any]) -> list[ApplyOutcome]:
    return [result.outcome for result in results]


async def live_ids(cache: BaseEntityCache, entity_type: str = "products") -> set[str]:
    return {entry.entity_id async for entry in cache.scan(entity_type)}


class FakeClock:
    """A monotonic clock the memory cache reads; tests move it instead of sleeping."""

    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Caches:
    """Opens caches of one backend that share one test's storage, as several processes would
    (memory caches share nothing: each is its own store)."""

    backend: str
    url: str
    prefix: str = ""
    clock: FakeClock = field(default_factory=FakeClock)
    opened: list[BaseEntityCache] = field(default_factory=list)
    prefixes: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.fresh()

    def fresh(self) -> None:
        """Storage of its own from now on: a new Redis prefix (every new memory cache is empty)."""
        self.prefix = f"t{uuid.uuid4().hex[:12]}"
        self.prefixes.append(self.prefix)

    def make(self, **options: Any) -> BaseEntityCache:
        if self.backend == "memory":
            return MemoryEntityCache(clock=self.clock, **options)
        return cache_for(self.url, prefix=self.prefix, **options)

    async def open(self, **options: Any) -> BaseEntityCache:
        cache = await self.make(**options).open()
        self.opened.append(cache)
        return cache

    async def advance(self, seconds: float) -> None:
        """Let `seconds` pass for TTLs: the memory cache's clock, the Redis server's real time."""
        if self.backend == "memory":
            self.clock.now += seconds
        else:
            await asyncio.sleep(seconds)

    async def aclose(self) -> None:
        for cache in self.opened:
            await cache.close()
        if self.backend in REDIS_BACKENDS:
            for prefix in self.prefixes:
                await delete_keys(self.url, f"{{{prefix}:*", f"{prefix}:sync:checkpoints")


@pytest.fixture(params=BACKENDS)
async def caches(request: pytest.FixtureRequest) -> AsyncIterator[Caches]:
    backend: str = request.param
    url = "memory://" if backend == "memory" else redis_url_of(request, backend)
    factory = Caches(backend, url)
    try:
        yield factory
    finally:
        await factory.aclose()


@pytest.fixture
async def cache(caches: Caches) -> BaseEntityCache:
    return await caches.open()


# ---------------------------------------------------------------------- insert, update, delete


async def test_an_insert_is_cached_with_its_version_checksum_and_first_revision(
    cache: BaseEntityCache,
) -> None:
    first = insert("p1", 10, name="kettle", price="19.90")

    [result] = await cache.apply([first])

    assert (result.change, result.outcome, result.previous) == (first, APPLIED, None)
    entry = await cache.get("products", "p1")
    assert entry is not None
    assert entry.data == {"id": "p1", "name": "kettle", "price": "19.90"}
    assert (entry.version, entry.revision, entry.checksum) == (Version(10, 0), 1, first.checksum)
    assert not entry.deleted
    assert await cache.get_entity("products", "p1") == entry.data
    assert await cache.get("products", "p2") is None
    assert await cache.get("users", "p1") is None


async def test_a_newer_update_replaces_the_row_and_reports_the_previous_one(cache: BaseEntityCache) -> None:
    await cache.apply([insert("p1", 10, price="19.90")])

    [result] = await cache.apply([update("p1", 11, price="17.50")])

    assert result.outcome is APPLIED
    assert result.previous == {"id": "p1", "price": "19.90"}
    entry = await cache.get("products", "p1")
    assert entry is not None
    assert (entry.data, entry.version, entry.revision) == ({"id": "p1", "price": "17.50"}, Version(11, 0), 2)


async def test_duplicates_and_older_versions_are_stale_and_change_nothing(cache: BaseEntityCache) -> None:
    await cache.apply([insert("p1", 10, price="1"), update("p1", 12, price="3")])
    before = await cache.get("products", "p1")

    results = await cache.apply([update("p1", 12, price="3"), update("p1", 11, price="2"),
                                 insert("p1", 10, price="1")])

    assert outcomes(results) == [STALE, STALE, STALE]
    assert [r.previous for r in results] == [{"id": "p1", "price": "3"}] * 3
    assert await cache.get("products", "p1") == before


async def test_the_ordinal_orders_changes_that_share_a_commit_position(cache: BaseEntityCache) -> None:
    results = await cache.apply([update("p1", 50, 2, v="third"), update("p1", 50, 0, v="first"),
                                 update("p1", 50, 1, v="second")])

    assert outcomes(results) == [APPLIED, STALE, STALE]
    entry = await cache.get("products", "p1")
    assert entry is not None and entry.data == {"id": "p1", "v": "third"}


async def test_versions_beyond_double_precision_compare_exactly(cache: BaseEntityCache) -> None:
    # 2**60 and 2**60 + 1 are the same double: a store comparing Lua numbers would call this stale.
    base = 2**60
    await cache.apply([insert("p1", base, v="old")])

    results = await cache.apply([update("p1", base + 1, v="new"), update("p1", base, 2**32 - 1, v="older")])

    assert outcomes(results) == [APPLIED, STALE]
    entry = await cache.get("products", "p1")
    assert entry is not None
    assert (entry.data, entry.version) == ({"id": "p1", "v": "new"}, Version(base + 1, 0))


async def test_a_batch_applies_in_order_and_chains_previous_rows(cache: BaseEntityCache) -> None:
    results = await cache.apply([insert("p1", 1, n=1), update("p1", 2, n=2), update("p1", 3, n=3)])

    assert outcomes(results) == [APPLIED] * 3
    assert [r.previous for r in results] == [None, {"id": "p1", "n": 1}, {"id": "p1", "n": 2}]
    entry = await cache.get("products", "p1")
    assert entry is not None and entry.revision == 3


async def test_a_batch_spanning_types_answers_in_the_order_given(cache: BaseEntityCache) -> None:
    batch = [insert("p1", 1), change(Op.INSERT, "u1", 2, entity_type="users", name="ann"),
             update("p1", 3, n=1), change(Op.INSERT, "u1", 1, entity_type="users", name="old")]

    results = await cache.apply(batch)

    assert [r.change for r in results] == batch
    assert outcomes(results) == [APPLIED, APPLIED, APPLIED, STALE]
    assert results[3].previous == {"id": "u1", "name": "ann"}
    assert await cache.get_entity("users", "u1") == {"id": "u1", "name": "ann"}
    assert await cache.count("products") == 1
    assert await cache.count("users") == 1
    assert await cache.apply([]) == []


async def test_composite_keys_are_cached_under_their_json_array_id(cache: BaseEntityCache) -> None:
    line = Change.of_row(entity_type="order_lines", op=Op.INSERT, key_columns=["order_id", "line"],
                         version=Version(7, 0), commit_time=COMMIT,
                         after={"order_id": 42, "line": "a", "qty": 2})
    gone = Change.of_row(entity_type="order_lines", op=Op.DELETE, key_columns=["order_id", "line"],
                         version=Version(8, 0), commit_time=COMMIT, before={"order_id": 42, "line": "b"})

    await cache.apply([line, gone])

    assert line.entity_id == '[42,"a"]'
    assert await cache.get_entity("order_lines", '[42,"a"]') == {"order_id": 42, "line": "a", "qty": 2}
    tombstone = await cache.get("order_lines", '[42,"b"]')
    assert tombstone is not None and tombstone.deleted
    assert await live_ids(cache, "order_lines") == {'[42,"a"]'}


async def test_delete_leaves_a_tombstone_that_keeps_late_changes_out(cache: BaseEntityCache) -> None:
    await cache.apply([insert("p1", 10, price="1")])

    [removed] = await cache.apply([delete("p1", 12)])
    late = await cache.apply([update("p1", 11, price="2"), insert("p1", 12, price="9")])

    assert (removed.outcome, removed.previous) == (APPLIED, {"id": "p1", "price": "1"})
    assert outcomes(late) == [STALE, STALE]
    assert [r.previous for r in late] == [None, None]
    tombstone = await cache.get("products", "p1")
    assert tombstone is not None and tombstone.deleted
    assert (tombstone.data, tombstone.version, tombstone.revision) == (None, Version(12, 0), 2)
    assert await cache.get_entity("products", "p1") is None
    assert await cache.count("products") == 0
    assert await live_ids(cache) == set()

    # A newer insert brings it back; the revision keeps counting through the tombstone.
    [again] = await cache.apply([insert("p1", 13, price="5")])
    entry = await cache.get("products", "p1")
    assert again.outcome is APPLIED and again.previous is None
    assert entry is not None and (entry.data, entry.revision) == ({"id": "p1", "price": "5"}, 3)


async def test_a_delete_arriving_first_still_beats_the_older_insert(cache: BaseEntityCache) -> None:
    results = await cache.apply([delete("p1", 20), insert("p1", 5, price="1")])

    assert outcomes(results) == [APPLIED, STALE]
    entry = await cache.get("products", "p1")
    assert entry is not None and entry.deleted and entry.version == Version(20, 0)


# ---------------------------------------------------------------------- truncate


async def test_truncate_removes_the_type_and_makes_older_changes_stale(cache: BaseEntityCache) -> None:
    await cache.apply([insert("p1", 1), insert("p2", 2), delete("p3", 3),
                       change(Op.INSERT, "u1", 4, entity_type="users")])

    [cut] = await cache.apply([truncate(10)])

    assert (cut.outcome, cut.previous) == (APPLIED, None)
    assert await cache.count("products") == 0
    assert await live_ids(cache) == set()
    assert [await cache.get("products", i) for i in ("p1", "p2", "p3")] == [None, None, None]
    assert await cache.get_entity("users", "u1") == {"id": "u1"}  # other types untouched

    late = await cache.apply([update("p1", 9, v="late"), insert("p4", 10), delete("p2", 5), truncate(8)])
    assert outcomes(late) == [STALE, STALE, STALE, STALE]
    assert await cache.count("products") == 0

    newer = await cache.apply([insert("p1", 10, 1, v="new"), truncate(10)])
    assert outcomes(newer) == [APPLIED, STALE]
    assert await cache.get_entity("products", "p1") == {"id": "p1", "v": "new"}


async def test_truncate_keeps_entries_written_by_newer_changes(cache: BaseEntityCache) -> None:
    # Delivered out of order: the insert at 30 happened after the truncate at 20.
    await cache.apply([insert("p1", 10), insert("p2", 30)])

    await cache.apply([truncate(20)])

    assert await live_ids(cache) == {"p2"}


# ---------------------------------------------------------------------- TTLs


async def test_an_expired_tombstone_no_longer_stops_an_older_change(caches: Caches) -> None:
    # The tombstone TTL bounds how late a change may arrive: within it, a change older than the
    # delete is stale; after it, the delete is forgotten and an older change applies again.
    cache = await caches.open(tombstone_ttl_s=SHORT_TTL_S)
    await cache.apply([insert("p1", 10, v="a"), delete("p1", 12)])
    assert outcomes(await cache.apply([update("p1", 11, v="late")])) == [STALE]

    await caches.advance(PAST_TTL_S)

    assert await cache.get("products", "p1") is None
    [late] = await cache.apply([update("p1", 11, v="very late")])
    assert (late.outcome, late.previous) == (APPLIED, None)
    entry = await cache.get("products", "p1")
    assert entry is not None and (entry.data, entry.revision) == ({"id": "p1", "v": "very late"}, 1)


async def test_live_entries_expire_after_the_entry_ttl(caches: Caches) -> None:
    cache = await caches.open(entry_ttl_s=SHORT_TTL_S)
    await cache.apply([insert("p1", 1), insert("p2", 2)])
    assert await cache.count("products") == 2

    await caches.advance(PAST_TTL_S)

    assert await cache.get("products", "p1") is None
    assert await cache.get_entity("products", "p2") is None
    assert await cache.count("products") == 0
    assert await live_ids(cache) == set()
    assert [i async for i in cache.scan_ids("products")] == []
    # Expired means forgotten: even an older change applies, and a load caches again.
    assert outcomes(await cache.apply([insert("p1", 1)])) == [APPLIED]
    loads: list[str] = []

    async def load() -> Row:
        loads.append("p2")
        return {"id": "p2", "fresh": True}

    assert await cache.get_entity("products", "p2", load) == {"id": "p2", "fresh": True}
    assert await cache.get_entity("products", "p2", load) == {"id": "p2", "fresh": True}
    assert loads == ["p2"]


async def test_without_a_live_ttl_entries_stay(caches: Caches) -> None:
    cache = await caches.open(tombstone_ttl_s=SHORT_TTL_S)
    await cache.apply([insert("p1", 1)])

    await caches.advance(PAST_TTL_S)

    assert await cache.get_entity("products", "p1") == {"id": "p1"}


# ---------------------------------------------------------------------- get_entity: single flight


async def test_a_thousand_concurrent_misses_share_one_load(cache: BaseEntityCache) -> None:
    calls = 0
    started, release = asyncio.Event(), asyncio.Event()

    async def load() -> Row:
        nonlocal calls
        calls += 1
        started.set()
        await release.wait()
        return {"id": "p1", "name": "loaded"}

    readers = [asyncio.create_task(cache.get_entity("products", "p1", load)) for _ in range(1_000)]
    await started.wait()
    # Hold the load until every reader has missed and joined it, so they truly overlap.
    await eventually(lambda: cache._flights.waiting(("products", "p1")), "every reader joins the load",
                     until=lambda waiting: waiting >= 1_000, every_s=0.005)
    release.set()
    rows = await asyncio.gather(*readers)

    assert calls == 1
    assert rows == [{"id": "p1", "name": "loaded"}] * 1_000
    assert rows[0] is not None and rows[1] is not None
    rows[0]["name"] = "mutated by one caller"
    assert rows[1]["name"] == "loaded"
    entry = await cache.get("products", "p1")
    assert entry is not None
    assert (entry.version, entry.revision) == (ZERO_VERSION, 1)
    assert entry.checksum == checksum({"id": "p1", "name": "loaded"})


async def test_a_loaded_row_is_replaced_by_any_change_from_the_source(cache: BaseEntityCache) -> None:
    async def load() -> Row:
        return {"id": "p1", "name": "from the database"}

    await cache.get_entity("products", "p1", load)

    [result] = await cache.apply([update("p1", 1, name="from the stream")])

    assert (result.outcome, result.previous) == (APPLIED, {"id": "p1", "name": "from the database"})
    assert await cache.get_entity("products", "p1") == {"id": "p1", "name": "from the stream"}


async def test_a_loader_error_reaches_every_waiter_and_is_not_cached(cache: BaseEntityCache) -> None:
    calls = 0
    started, release = asyncio.Event(), asyncio.Event()

    async def failing() -> Row:
        nonlocal calls
        calls += 1
        started.set()
        await release.wait()
        raise ConnectionError("the database is away")

    readers = [asyncio.create_task(cache.get_entity("products", "p1", failing)) for _ in range(100)]
    await started.wait()
    # Every reader first misses on a read of its own (a round trip on Redis): the failure is
    # released once all of them wait for the one load, so none arrives after it and (rightly,
    # since a failure is not cached) starts another.
    await eventually(lambda: cache._flights.waiting(("products", "p1")), "every reader waits for the load",
                     until=lambda waiting: waiting >= len(readers), every_s=0.005)
    release.set()
    outcomes_ = await asyncio.gather(*readers, return_exceptions=True)

    assert calls == 1
    assert all(isinstance(o, ConnectionError) and "away" in str(o) for o in outcomes_)
    assert await cache.get("products", "p1") is None

    async def working() -> Row:
        return {"id": "p1"}

    assert await cache.get_entity("products", "p1", working) == {"id": "p1"}


async def test_a_waiter_that_gives_up_does_not_cancel_the_shared_load(cache: BaseEntityCache) -> None:
    calls = 0
    started, release = asyncio.Event(), asyncio.Event()

    async def load() -> Row:
        nonlocal calls
        calls += 1
        started.set()
        await release.wait()
        return {"id": "p1"}

    impatient = asyncio.create_task(cache.get_entity("products", "p1", load))
    await started.wait()
    patient = asyncio.create_task(cache.get_entity("products", "p1", load))
    await eventually(lambda: cache._flights.waiting(("products", "p1")), "both readers wait for the load",
                     until=lambda waiting: waiting >= 2, every_s=0.005)
    impatient.cancel()
    await asyncio.wait([impatient])  # it has given up before the load ends
    release.set()

    assert await patient == {"id": "p1"}
    assert impatient.cancelled()
    assert calls == 1
    assert await cache.get_entity("products", "p1") == {"id": "p1"}


async def test_a_tombstone_answers_none_without_loading(cache: BaseEntityCache) -> None:
    await cache.apply([delete("p1", 5)])

    async def load() -> Row:
        raise AssertionError("a deleted entity must not be loaded")

    assert await cache.get_entity("products", "p1", load) is None


async def test_a_miss_without_a_loader_or_with_nothing_to_load_caches_nothing(cache: BaseEntityCache) -> None:
    calls = 0

    async def nothing() -> Row | None:
        nonlocal calls
        calls += 1
        return None

    assert await cache.get_entity("products", "p1") is None
    assert await cache.get_entity("products", "p1", nothing) is None
    assert await cache.get_entity("products", "p1", nothing) is None
    assert calls == 2
    assert await cache.get("products", "p1") is None


async def test_a_change_written_during_a_load_wins_over_the_loaded_row(cache: BaseEntityCache) -> None:
    async def load() -> Row:
        await cache.apply([insert("p1", 5, name="from the stream")])
        return {"id": "p1", "name": "read before the change"}

    row = await cache.get_entity("products", "p1", load)

    assert row == {"id": "p1", "name": "from the stream"}
    entry = await cache.get("products", "p1")
    assert entry is not None and entry.version == Version(5, 0)


async def test_a_load_overlapping_a_truncate_is_answered_but_not_cached(cache: BaseEntityCache) -> None:
    async def load() -> Row:
        await cache.apply([truncate(5)])
        return {"id": "p1", "name": "maybe gone"}

    assert await cache.get_entity("products", "p1", load) == {"id": "p1", "name": "maybe gone"}
    assert await cache.get("products", "p1") is None


async def test_a_loader_must_return_a_row(cache: BaseEntityCache) -> None:
    async def load() -> Any:
        return ["not", "a", "row"]

    with pytest.raises(InvalidChange, match="loader of products 'p1' returned a list"):
        await cache.get_entity("products", "p1", load)


# ---------------------------------------------------------------------- application writes


async def test_update_merges_at_the_expected_revision_and_keeps_the_source_version(
    cache: BaseEntityCache,
) -> None:
    source = insert("p1", 10, name="kettle", price="19.90")
    await cache.apply([source])

    revision = await cache.update("products", "p1", {"price": "17.00", "stock": 3}, expected_revision=1)

    assert revision == 2
    entry = await cache.get("products", "p1")
    merged = {"id": "p1", "name": "kettle", "price": "17.00", "stock": 3}
    assert entry is not None
    assert (entry.data, entry.version, entry.revision, entry.checksum) == (
        merged, Version(10, 0), 2, checksum(merged))
    # A replay of the change the row came from does not undo the write; the next change does.
    assert outcomes(await cache.apply([source])) == [STALE]
    [nxt] = await cache.apply([update("p1", 11, name="kettle", price="18.00")])
    assert (nxt.outcome, nxt.previous) == (APPLIED, merged)
    entry = await cache.get("products", "p1")
    assert entry is not None and (entry.data, entry.revision) == ({"id": "p1", "name": "kettle",
                                                                    "price": "18.00"}, 3)


async def test_update_at_a_stale_revision_conflicts_and_writes_nothing(cache: BaseEntityCache) -> None:
    await cache.apply([insert("p1", 10, price="1"), update("p1", 11, price="2")])
    before = await cache.get("products", "p1")

    with pytest.raises(VersionConflict) as conflict:
        await cache.update("products", "p1", {"price": "0"}, expected_revision=1)

    assert conflict.value.current_revision == 2
    assert "revision 2, not 1" in str(conflict.value)
    assert await cache.get("products", "p1") == before


async def test_update_of_a_missing_entity_creates_it_only_at_revision_zero(cache: BaseEntityCache) -> None:
    with pytest.raises(VersionConflict) as conflict:
        await cache.update("products", "p1", {"id": "p1", "name": "new"}, expected_revision=3)
    assert conflict.value.current_revision == 0
    assert await cache.get("products", "p1") is None

    assert await cache.update("products", "p1", {"id": "p1", "name": "new"}, expected_revision=0) == 1

    entry = await cache.get("products", "p1")
    assert entry is not None and (entry.data, entry.version) == ({"id": "p1", "name": "new"}, ZERO_VERSION)
    assert outcomes(await cache.apply([insert("p1", 1, name="from the source")])) == [APPLIED]


async def test_update_of_a_tombstone_needs_the_tombstones_revision(cache: BaseEntityCache) -> None:
    await cache.apply([insert("p1", 10), delete("p1", 11)])

    with pytest.raises(VersionConflict) as conflict:
        await cache.update("products", "p1", {"name": "x"}, expected_revision=0)
    assert conflict.value.current_revision == 2

    assert await cache.update("products", "p1", {"name": "x"}, expected_revision=2) == 3
    entry = await cache.get("products", "p1")
    # The row starts from the changes alone and keeps the delete's version: the next change wins.
    assert entry is not None and (entry.data, entry.version) == ({"name": "x"}, Version(11, 0))
    assert outcomes(await cache.apply([update("p1", 10, v="older")])) == [STALE]


async def test_force_update_merges_whatever_the_revision(cache: BaseEntityCache) -> None:
    await cache.apply([insert("p1", 10, price="1"), update("p1", 11, price="2")])

    assert await cache.force_update("products", "p1", {"stock": 0}) == 3
    assert await cache.force_update("products", "p2", {"id": "p2"}) == 1

    entry = await cache.get("products", "p1")
    assert entry is not None
    assert (entry.data, entry.version) == ({"id": "p1", "price": "2", "stock": 0}, Version(11, 0))
    assert await cache.get_entity("products", "p2") == {"id": "p2"}


async def test_fifty_concurrent_updates_at_one_revision_have_one_winner(caches: Caches) -> None:
    # On Redis the writers are spread over two caches, as two processes would be.
    first, second = await caches.open(), await caches.open()
    await first.apply([insert("p1", 10, stock=100)])
    if caches.backend == "memory":
        second = first

    async def write(index: int) -> int | VersionConflict:
        target = first if index % 2 else second
        try:
            return await target.update("products", "p1", {"stock": index}, expected_revision=1)
        except VersionConflict as conflict:
            return conflict

    results = await asyncio.gather(*(write(i) for i in range(50)))

    winners = [i for i, r in enumerate(results) if not isinstance(r, VersionConflict)]
    assert len(winners) == 1
    assert results[winners[0]] == 2
    assert all(r.current_revision == 2 for r in results if isinstance(r, VersionConflict))
    entry = await first.get("products", "p1")
    assert entry is not None and (entry.data, entry.revision) == ({"id": "p1", "stock": winners[0]}, 2)


async def test_concurrent_force_updates_lose_no_write(caches: Caches) -> None:
    first, second = await caches.open(), await caches.open()
    await first.apply([insert("p1", 10)])
    if caches.backend == "memory":
        second = first

    await asyncio.gather(*((first if i % 2 else second).force_update("products", "p1", {f"f{i}": i})
                           for i in range(50)))

    entry = await first.get("products", "p1")
    assert entry is not None
    assert entry.data == {"id": "p1", **{f"f{i}": i for i in range(50)}}
    assert entry.revision == 51


async def test_application_writes_take_canonical_values(cache: BaseEntityCache) -> None:
    from decimal import Decimal

    await cache.force_update("products", "p1",
                             {"price": Decimal("9.50"), "at": datetime(2026, 1, 1, tzinfo=UTC)})

    assert await cache.get_entity("products", "p1") == {"price": "9.50", "at": "2026-01-01T00:00:00.000000Z"}


# ---------------------------------------------------------------------- scan, count, checkpoints


async def test_scan_and_count_see_live_entries_of_one_type(cache: BaseEntityCache) -> None:
    # More entries than one page of the Redis scan.
    await cache.apply([insert(f"p{i}", i + 1, n=i) for i in range(1_200)])
    await cache.apply([delete(f"p{i}", 5_000 + i) for i in range(0, 1_200, 3)])
    await cache.apply([change(Op.INSERT, "u1", 1, entity_type="users")])

    entries = [entry async for entry in cache.scan("products")]

    expected = {f"p{i}" for i in range(1_200) if i % 3}
    assert len(entries) == len(expected) == 800
    assert {e.entity_id for e in entries} == expected
    assert sorted([i async for i in cache.scan_ids("products")]) == sorted(expected)
    assert [i async for i in cache.scan_ids("nothing")] == []
    assert all(e.data == {"id": e.entity_id, "n": int(e.entity_id[1:])} for e in entries)
    assert await cache.count("products") == 800
    assert await cache.count("users") == 1
    assert await cache.count("nothing") == 0
    assert [e async for e in cache.scan("nothing")] == []


async def test_get_many_reads_entries_and_tombstones_in_the_order_asked(cache: BaseEntityCache) -> None:
    # More ids than one page of get_many.
    await cache.apply([insert(f"p{i}", i + 1, n=i) for i in range(1_100)])
    await cache.apply([delete("p7", 9_000)])
    ids = ["p1099", "absent", "p7", *(f"p{i}" for i in range(1_050))]

    entries = await cache.get_many("products", ids)

    assert len(entries) == len(ids)
    assert entries[1] is None
    assert entries[2] is not None and entries[2].deleted and entries[2].version == Version(9_000, 0)
    assert entries[0] == await cache.get("products", "p1099")
    assert [e.entity_id if e else None for e in entries[3:]] == [f"p{i}" for i in range(1_050)]
    assert all(e.data == {"id": e.entity_id, "n": int(e.entity_id[1:])}
               for e in entries[3:] if e and not e.deleted)
    assert await cache.get_many("products", []) == []
    assert await cache.get_many("users", ["p1"]) == [None]


async def test_get_many_leaves_out_expired_entries(caches: Caches) -> None:
    cache = await caches.open(entry_ttl_s=SHORT_TTL_S)
    await cache.apply([insert("p1", 1)])
    await caches.advance(PAST_TTL_S)

    assert await cache.get_many("products", ["p1"]) == [None]


async def test_repair_replaces_the_entry_read_keeping_its_version(cache: BaseEntityCache) -> None:
    await cache.apply([insert("p1", 10, price="1")])
    held = await cache.get("products", "p1")
    row = {"id": "p1", "price": "2"}

    assert await cache.repair("products", "p1", row, checksum(row), held) is True

    entry = await cache.get("products", "p1")
    assert entry is not None and held is not None
    assert (entry.data, entry.version, entry.revision) == (row, Version(10, 0), 2)
    assert entry.checksum == checksum(row)
    # A later change from the source still wins; an older one stays out.
    assert outcomes(await cache.apply([update("p1", 9, price="0")])) == [STALE]
    assert outcomes(await cache.apply([update("p1", 11, price="3")])) == [APPLIED]
    assert (await cache.get_entity("products", "p1")) == {"id": "p1", "price": "3"}


async def test_repair_writes_nothing_over_an_entry_that_changed_since_it_was_read(
    cache: BaseEntityCache,
) -> None:
    await cache.apply([insert("p1", 10, price="1")])
    held = await cache.get("products", "p1")
    await cache.apply([update("p1", 11, price="newer")])
    row = {"id": "p1", "price": "2"}

    assert await cache.repair("products", "p1", row, checksum(row), held) is False
    with pytest.raises(InvalidChange, match="another entity"):
        await cache.repair("products", "p2", row, checksum(row), held)  # held is p1's
    assert await cache.get_entity("products", "p1") == {"id": "p1", "price": "newer"}
    # Something appeared where nothing was held: refused too.
    assert await cache.repair("products", "p1", row, checksum(row), None) is False


async def test_repair_of_a_missing_row_writes_it_at_the_zero_version(cache: BaseEntityCache) -> None:
    row = {"id": "p1", "price": "2"}

    assert await cache.repair("products", "p1", row, checksum(row), None) is True

    entry = await cache.get("products", "p1")
    assert entry is not None and (entry.data, entry.version, entry.revision) == (row, ZERO_VERSION, 1)
    assert outcomes(await cache.apply([insert("p1", 1, price="from the source")])) == [APPLIED]


async def test_repair_with_no_row_leaves_a_tombstone_at_the_entrys_version(cache: BaseEntityCache) -> None:
    await cache.apply([insert("p1", 10, price="1")])
    held = await cache.get("products", "p1")

    assert await cache.repair("products", "p1", None, "sum", held) is True

    entry = await cache.get("products", "p1")
    assert entry is not None and entry.deleted and entry.version == Version(10, 0)
    assert await cache.count("products") == 0
    assert await live_ids(cache) == set()
    assert outcomes(await cache.apply([insert("p1", 12, price="again")])) == [APPLIED]


async def test_checkpoints_round_trip_json_values(cache: BaseEntityCache) -> None:
    assert await cache.get_checkpoint("snapshot") is None

    await cache.put_checkpoint("snapshot", {"table": "products", "last_key": [42, "a"], "done": False})
    await cache.put_checkpoint("position", 2**40)
    await cache.put_checkpoint("position", 2**41)

    snapshot = await cache.get_checkpoint("snapshot")
    assert snapshot == {"table": "products", "last_key": [42, "a"], "done": False}
    assert await cache.get_checkpoint("position") == 2**41
    with pytest.raises(TypeError, match="checkpoint 'bad' must be a JSON value"):
        await cache.put_checkpoint("bad", {1, 2})


# ---------------------------------------------------------------------- validation and lifecycle


async def test_bad_input_is_refused_naming_what_is_wrong_and_writes_nothing(cache: BaseEntityCache) -> None:
    with pytest.raises(InvalidChange, match="Change objects, not dict"):
        await cache.apply([insert("p1", 1), {"op": "insert"}])  # type: ignore[list-item]
    assert await cache.get("products", "p1") is None
    with pytest.raises(InvalidChange, match="version"):
        await cache.apply([insert("p1", 2**64)])
    with pytest.raises(InvalidChange, match="entity id"):
        await cache.get("products", "")
    with pytest.raises(InvalidChange, match="entity type"):
        await cache.count("")
    with pytest.raises(InvalidChange, match="must be a row"):
        await cache.update("products", "p1", ["x"], expected_revision=0)  # type: ignore[arg-type]
    with pytest.raises(InvalidChange, match="expected_revision"):
        await cache.update("products", "p1", {"x": 1}, expected_revision=-1)
    with pytest.raises(InvalidChange, match="canonical"):
        await cache.force_update("products", "p1", {"x": float("nan")})
    assert await cache.get("products", "p1") is None


async def test_cache_for_picks_the_backend_and_refuses_what_cannot_work(caches: Caches) -> None:
    assert isinstance(cache_for("memory://"), MemoryEntityCache)
    with pytest.raises(ConfigError, match="unsupported entity cache URL 'kafka://h:9092'"):
        cache_for("kafka://h:9092")
    with pytest.raises(ConfigError, match="prefix"):
        cache_for("redis://h:6379/0", prefix="a{b}")
    with pytest.raises(ConfigError, match="tombstone_ttl_s"):
        cache_for(caches.url, tombstone_ttl_s=0)
    with pytest.raises(ConfigError, match="entry_ttl_s"):
        cache_for(caches.url, entry_ttl_s=-1)
    with pytest.raises(ConfigError, match=r"ftp://user:\*\*\*@h/") as refused:
        cache_for("ftp://user:pwd@h/")
    assert "pwd" not in str(refused.value)


async def test_a_cache_is_usable_only_while_open(caches: Caches) -> None:
    cache = caches.make()
    with pytest.raises(CacheUnavailable, match="not opened"):
        await cache.get("products", "p1")

    async with cache:
        await cache.apply([insert("p1", 1)])

    with pytest.raises(CacheUnavailable, match="closed"):
        await cache.get("products", "p1")
    with pytest.raises(CacheUnavailable, match="create a new one"):
        await cache.open()


# ---------------------------------------------------------------------- any delivery order


@dataclass(frozen=True)
class Step:
    entity_id: str | None  # None: a truncate
    op: Op
    value: int


steps = st.lists(
    st.one_of(
        st.builds(Step, st.sampled_from(["a", "b", "c"]),
                  st.sampled_from([Op.INSERT, Op.UPDATE, Op.UPDATE, Op.DELETE]), st.integers(0, 99)),
        st.just(Step(None, Op.TRUNCATE, 0)),
    ),
    min_size=1, max_size=25,
)


def versioned(history: list[Step], new_transaction: list[bool]) -> list[Change]:
    """The steps as committed changes: a transaction may hold several (one LSN, ordinals)."""
    changes, lsn, ordinal = [], 100, 0
    for step, fresh in zip(history, new_transaction, strict=True):
        if fresh:
            lsn, ordinal = lsn + 8, 0
        else:
            ordinal += 1
        if step.op is Op.TRUNCATE:
            changes.append(truncate(lsn, ordinal))
        else:
            changes.append(change(step.op, step.entity_id or "", lsn, ordinal, value=step.value))
    return changes


def final_state(changes: list[Change]) -> dict[str, Change]:
    """What the cache must hold: per entity its newest change, unless a newer truncate wiped it."""
    floor = max((c.version for c in changes if c.op is Op.TRUNCATE), default=None)
    newest: dict[str, Change] = {}
    for c in changes:
        if c.op is not Op.TRUNCATE and (c.entity_id not in newest or c.version > newest[c.entity_id].version):
            newest[c.entity_id] = c
    return {i: c for i, c in newest.items() if floor is None or c.version > floor}


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
async def test_any_delivery_order_with_duplicates_ends_in_the_newest_state(
    caches: Caches, data: st.DataObject,
) -> None:
    history = data.draw(steps, label="history")
    committed = versioned(history, data.draw(st.lists(st.booleans(), min_size=len(history),
                                                       max_size=len(history)), label="new transaction"))
    repeats = data.draw(st.lists(st.sampled_from(committed), max_size=10), label="redelivered")
    delivery = data.draw(st.permutations(committed + repeats), label="delivery order")
    cuts = sorted(data.draw(st.sets(st.integers(1, max(len(delivery) - 1, 1)), max_size=5), label="batches"))

    caches.fresh()  # each example gets its own storage
    cache = await caches.open()
    try:
        nothing = Version(-1, 0)
        seen = dict.fromkeys(("a", "b", "c"), nothing)
        floor = nothing
        for start, end in zip([0, *cuts], [*cuts, len(delivery)], strict=True):
            batch = delivery[start:end]
            await cache.apply(batch)
            floor = max([floor, *(c.version for c in batch if c.op is Op.TRUNCATE)])
            # Never a regression: what an entity shows (its entry, or the truncate that removed
            # it) only moves forward.
            for entity_id in seen:
                entry = await cache.get("products", entity_id)
                shown = max(nothing if entry is None else entry.version, floor)
                assert shown >= seen[entity_id]
                seen[entity_id] = shown

        expected = final_state(committed)
        for entity_id in ("a", "b", "c"):
            entry = await cache.get("products", entity_id)
            if entity_id not in expected:
                assert entry is None
                continue
            newest = expected[entity_id]
            assert entry is not None
            assert entry.version == newest.version
            assert entry.data == (None if newest.op is Op.DELETE else newest.after)
        live = {i for i, c in expected.items() if c.op is not Op.DELETE}
        assert await live_ids(cache) == live
        assert await cache.count("products") == len(live)
    finally:
        await cache.close()


# ---------------------------------------------------------------------- Redis only


async def test_redis_keys_of_one_type_share_one_cluster_slot(redis_url: str) -> None:
    from redis.crc import key_slot

    prefix = f"t{uuid.uuid4().hex[:12]}"
    weird = "we}ird{type"
    async with cache_for(redis_url, prefix=prefix, tombstone_ttl_s=60) as cache:
        await cache.apply([insert("p1", 1), delete("p2", 2), truncate(1, 5),
                           change(Op.INSERT, "x", 1, entity_type=weird)])
        client = redis_client(redis_url)
        try:
            for entity_type in ("products", weird):
                keys = [k async for k in client.scan_iter(match=f"{{{prefix}:{entity_type[:2]}*")]
                assert len(keys) >= 2
                assert len({key_slot(k) for k in keys}) == 1
            assert await cache.get_entity(weird, "x") == {"id": "x"}
        finally:
            await delete_keys(redis_url, f"{{{prefix}:*", f"{prefix}:sync:checkpoints")
            await client.aclose()


@pytest.fixture
async def redis_caches(redis_url: str) -> AsyncIterator[Caches]:
    factory = Caches("redis", redis_url)
    try:
        yield factory
    finally:
        await factory.aclose()


async def test_redis_caches_with_one_prefix_share_entries_and_checkpoints(redis_caches: Caches) -> None:
    caches = redis_caches
    writer, reader = await caches.open(), await caches.open()

    await writer.apply([insert("p1", 1, v=1)])
    await writer.put_checkpoint("position", 99)

    assert await reader.get_entity("products", "p1") == {"id": "p1", "v": 1}
    assert await reader.get_checkpoint("position") == 99
    assert outcomes(await reader.apply([insert("p1", 1, v=1)])) == [STALE]
    other = await cache_for(caches.url, prefix=caches.prefix + "x").open()
    try:
        assert await other.get("products", "p1") is None
    finally:
        await other.close()


async def test_redis_applies_a_batch_in_one_script_call_per_entity_type(redis_server: str) -> None:
    import redis.asyncio as aioredis

    caches = Caches("redis", redis_server)
    cache = await caches.open()
    await cache.apply([insert("warm-up", 1)])  # loads the script into the server
    client = aioredis.Redis.from_url(redis_server)
    try:
        async def script_calls() -> int:
            stats = await client.info("commandstats")
            return int(stats.get("cmdstat_evalsha", {}).get("calls", 0))

        before = await script_calls()
        batch = [insert(f"p{i}", 10 + i) for i in range(200)]
        batch += [change(Op.INSERT, f"u{i}", 10 + i, entity_type="users") for i in range(100)]
        results = await cache.apply(batch)
        calls = await script_calls() - before
    finally:
        await client.aclose()
        await caches.aclose()

    assert outcomes(results) == [APPLIED] * 300
    assert calls == 2


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[OwnRedis]:
    """A redis-server this test may stop, with a password, on a free loopback port."""
    with own_redis_server(tmp_path) as server:
        yield server


async def test_redis_going_away_raises_cache_unavailable_without_the_password(own_redis: OwnRedis) -> None:
    cache = await cache_for(own_redis.url).open()
    try:
        await cache.apply([insert("p1", 1)])

        own_redis.process.terminate()
        await asyncio.to_thread(own_redis.process.wait, 10)

        attempts: list[Callable[[], Awaitable[object]]] = [
            lambda: cache.apply([insert("p1", 2)]), lambda: cache.get("products", "p1"),
            lambda: cache.count("products"), lambda: cache.get_checkpoint("x"),
            lambda: cache.update("products", "p1", {}, 1),
        ]
        for attempt in attempts:
            with pytest.raises(CacheUnavailable) as failure:
                await attempt()
            assert "127.0.0.1" in str(failure.value)
            assert "s3cret" not in str(failure.value)
    finally:
        await cache.close()


async def test_an_unreachable_redis_fails_on_open_naming_the_url(own_redis: OwnRedis) -> None:
    own_redis.process.terminate()
    await asyncio.to_thread(own_redis.process.wait, 10)
    cache = cache_for(own_redis.url)

    expected = r"cannot reach the entity cache at redis://:\*\*\*@127\.0\.0\.1"
    with pytest.raises(CacheUnavailable, match=expected) as failure:
        await cache.open()

    assert "s3cret" not in str(failure.value)
