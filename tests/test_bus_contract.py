"""One contract suite for every event bus: memory://, redis:// (Redis Streams on the session's
redis-server), redis+cluster:// (on the session's Redis Cluster) and kafka:// (the session's Tansu
broker). Backend-only cases are marked `memory_only`, `redis_only` (both Redis forms) or
`kafka_only`.

Each test works under its own stream/topic prefix, so tests never see each other's changes.
Timings are shortened (reclaim after 0.5 s, Kafka sessions of 2 s) to keep the suite quick.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Iterator, Sequence
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from support.redis_keys import REDIS_BACKENDS, delete_keys, redis_client, redis_url_of
from support.waiting import eventually, eventually_sync
from tidegate.errors import BusUnavailable, ConfigError, InvalidChange, MissingDependency
from tidegate.sync.buses.base import BusBase, SubscriptionBase, bus_for
from tidegate.sync.changes import Change, Op, Version, changes_from_json
from tidegate.sync.contracts import Delivery, Subscription

BACKENDS = ["memory", *REDIS_BACKENDS, "kafka"]
ONLY = {"memory_only": ("memory",), "redis_only": REDIS_BACKENDS, "kafka_only": ("kafka",)}
FAST: dict[str, Any] = {  # BusSettings fields, as bus_for's keyword options
    "reclaim_idle_s": 0.5,
    "reclaim_interval_s": 0.1,
    "partitions": 3,
    "session_timeout_s": 2.0,
    "heartbeat_interval_s": 0.2,
    "request_timeout_s": 5.0,
}
WAIT_S = 20.0  # the longest any test waits for deliveries (Kafka group joins take a second or two)
COMMIT = datetime(2026, 3, 4, 5, 6, 7, 890123, tzinfo=UTC)


# ---------------------------------------------------------------------- fixtures and helpers


class BusFactory:
    """Opens buses on one backend under this test's own prefix; closes them at teardown."""

    def __init__(self, backend: str, url: str) -> None:
        self.backend = backend
        self.url = url
        self.prefix = f"t{uuid.uuid4().hex[:12]}"
        self._opened: list[BusBase] = []

    async def open(self, **options: Any) -> BusBase:
        """An opened bus; keyword arguments are BusSettings fields."""
        bus = bus_for(self.url, prefix=self.prefix, **{**FAST, **options})
        assert isinstance(bus, BusBase)
        await bus.__aenter__()
        self._opened.append(bus)
        return bus

    async def aclose(self) -> None:
        """Close every bus opened here, newest first."""
        while self._opened:
            await self._opened.pop().__aexit__(None, None, None)


@pytest.fixture(params=BACKENDS, ids=BACKENDS)
async def bus_factory(request: pytest.FixtureRequest) -> AsyncIterator[BusFactory]:
    """A BusFactory per backend; servers are requested only for the backends that need them."""
    backend: str = request.param
    allowed = {backend for marker, only in ONLY.items() if request.node.get_closest_marker(marker)
               for backend in only}
    if allowed and backend not in allowed:
        pytest.skip(f"not for the {backend} bus")
    if backend == "memory":
        factory = BusFactory(backend, "memory://")
    elif backend in REDIS_BACKENDS:
        factory = BusFactory(backend, redis_url_of(request, backend))
    else:
        factory = BusFactory(backend, request.getfixturevalue("kafka_broker").bus_url)
    try:
        yield factory
    finally:
        await factory.aclose()
        if backend in REDIS_BACKENDS:
            await delete_keys(factory.url, f"{factory.prefix}:*")


@pytest.fixture
async def bus(bus_factory: BusFactory) -> BusBase:
    """One opened bus of the backend under test."""
    return await bus_factory.open()


def change(entity_id: str | int, n: int, entity_type: str = "product") -> Change:
    """Version n of one entity."""
    return Change.of_row(entity_type=entity_type, op=Op.INSERT if n == 1 else Op.UPDATE, key_columns=["id"],
                         version=Version(n, 0), commit_time=COMMIT,
                         after={"id": str(entity_id), "n": n, "name": f"item {entity_id} v{n}"})


def key(c: Change) -> tuple[str, str, Version]:
    """What identifies one change in these tests."""
    return (c.entity_type, c.entity_id, c.version)


async def fetch_until(sub: Subscription, count: int, *, ack: bool = True, max_count: int = 100,
                      timeout_s: float = WAIT_S) -> list[Delivery]:
    """Deliveries until `count` arrived (or the time is up), acking each batch if `ack`."""
    got: list[Delivery] = []
    deadline = time.monotonic() + timeout_s
    while len(got) < count and time.monotonic() < deadline:
        batch = await sub.fetch(max_count, timeout_s=0.5)
        if ack and batch:
            await sub.ack(batch)
        got += batch
    return got


async def fetch_through(sub: Subscription, last: Change, *, timeout_s: float = WAIT_S) -> list[Change]:
    """Everything delivered until `last` arrives (inclusive), acked. Use with changes of one
    entity, whose order every bus keeps, to see all that came before `last`."""
    got: list[Change] = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        batch = await sub.fetch(100, timeout_s=0.5)
        if batch:
            await sub.ack(batch)
        got += [d.change for d in batch]
        if any(key(c) == key(last) for c in got):
            return got
    pytest.fail(f"{key(last)} did not arrive within {timeout_s}s; got {[key(c) for c in got]}")


async def settle(factory: BusFactory, subs: Sequence[SubscriptionBase]) -> None:
    """Wait until every Kafka consumer of the group holds partitions (the group is formed), so
    the test does not measure a rebalance; the other buses need no forming."""
    if factory.backend != "kafka":
        return
    partitions = FAST["partitions"] * len(subs[0].entity_types)  # every topic's

    def assignments() -> list[set[Any]]:
        return [sub._consumer.assignment() for sub in subs]  # type: ignore[attr-defined]

    await eventually(assignments, "every consumer of the Kafka group holds partitions", timeout_s=WAIT_S,
                     every_s=0.1, until=lambda held: all(held) and len(set().union(*held)) == partitions)


# ---------------------------------------------------------------------- the contract


async def test_a_change_equals_itself_after_the_bus(bus: BusBase) -> None:
    rich = Change.of_row(
        entity_type="public.order_line", op=Op.UPDATE, key_columns=["order_id", "line"],
        version=Version(0x1_0000_0000_0002, 7), commit_time=COMMIT, xid=991, captured_at=1772600767.25,
        after={"order_id": 5, "line": 2, "price": Decimal("19.90"), "note": "crème brûlée ☕",
               "tags": ["a", "b"], "attrs": {"size": None, "ok": True}, "at": COMMIT},
        before={"order_id": 5, "line": 2, "price": Decimal("18.00")},
        unchanged=("description",),
    )
    deleted = Change.of_row(entity_type="public.order_line", op=Op.DELETE, key_columns=["order_id", "line"],
                            version=Version(0x1_0000_0000_0003, 0), commit_time=COMMIT,
                            before={"order_id": 5, "line": 2})
    truncated = Change.of_row(entity_type="public.order_line", op=Op.TRUNCATE, key_columns=[],
                              version=Version(0x1_0000_0000_0004, 0), commit_time=COMMIT)
    async with bus.subscribe("g", "c1", ["public.order_line"]) as sub:
        await bus.publish([rich, deleted, truncated])
        got = [d.change for d in await fetch_until(sub, 3)]

    # (The truncate's entity id is "*": on Kafka it may come first, from another partition.)
    by_version = {c.version: c for c in got}
    assert len(got) == 3
    assert by_version == {c.version: c for c in (rich, deleted, truncated)}
    assert by_version[rich.version].captured_at == rich.captured_at  # not part of ==, carried still


async def test_one_consumer_sees_each_entity_in_order(bus: BusBase) -> None:
    # Given 30 entities with 8 versions each, published interleaved in several batches
    published = [change(entity, n) for n in range(1, 9) for entity in range(30)]
    async with bus.subscribe("g", "c1", ["product"]) as sub:
        for start in range(0, len(published), 37):
            await bus.publish(published[start:start + 37])
        # When one consumer reads everything
        got = [d.change for d in await fetch_until(sub, len(published), max_count=50)]

    # Then each entity's versions came once each, in order
    assert Counter(key(c) for c in got) == Counter(key(c) for c in published)
    for entity in range(30):
        versions = [c.version.lsn for c in got if c.entity_id == str(entity)]
        assert versions == list(range(1, 9)), f"entity {entity}: {versions}"


async def test_each_group_gets_every_change(bus: BusBase) -> None:
    published = [change(entity, 1) for entity in range(20)] + [change(0, 1, "user")]
    async with bus.subscribe("cache", "c1", ["product", "user"]) as cache, \
            bus.subscribe("recommender", "r1", ["product", "user"]) as recs:
        await bus.publish(published)
        for sub in (cache, recs):
            got = [d.change for d in await fetch_until(sub, len(published))]
            assert sorted(map(key, got)) == sorted(map(key, published))


async def test_consumers_of_one_group_share_the_work(bus_factory: BusFactory, bus: BusBase) -> None:
    # Given two consumers of one group (the group formed before anything is published)
    published = [change(entity, 1) for entity in range(60)]
    async with bus.subscribe("g", "c1", ["product"]) as first, \
            bus.subscribe("g", "c2", ["product"]) as second:
        await settle(bus_factory, [first, second])
        # (In several publishes: on Redis one publish's changes may share a stream entry, which
        # goes to one consumer whole.)
        for start in range(0, len(published), 5):
            await bus.publish(published[start:start + 5])
        seen: dict[str, list[Change]] = {"c1": [], "c2": []}
        done = asyncio.Event()

        async def consume(sub: SubscriptionBase) -> None:
            deadline = time.monotonic() + WAIT_S
            while not done.is_set() and time.monotonic() < deadline:
                batch = await sub.fetch(5, timeout_s=0.2)
                if batch:
                    await sub.ack(batch)
                    seen[sub.consumer] += [d.change for d in batch]
                    await asyncio.sleep(0.005)  # the work the batch takes, so both take turns
                if sum(map(len, seen.values())) >= len(published):
                    done.set()

        # When both consume and ack
        await asyncio.gather(consume(first), consume(second))
        leftovers = await first.fetch(100, timeout_s=0.3) + await second.fetch(100, timeout_s=0.3)

    # Then every change was delivered exactly once, and both did part of the work
    delivered = [key(c) for got in seen.values() for c in got]
    assert sorted(delivered) == sorted(map(key, published))
    assert seen["c1"] and seen["c2"]
    assert leftovers == []


async def test_unacked_deliveries_go_to_another_consumer_when_theirs_closes(bus: BusBase) -> None:
    published = [change(7, n) for n in range(1, 6)]
    await bus.publish(published)
    # Given a consumer that fetched everything and closed (died) without acking
    async with bus.subscribe("g", "first", ["product"]) as first:
        taken = await fetch_until(first, len(published), ack=False)
    assert [d.change for d in taken] == published

    # When another consumer of the group fetches, it gets them, in order
    async with bus.subscribe("g", "second", ["product"]) as second:
        got = await fetch_until(second, len(published))
        assert [d.change for d in got] == published
        # And once it acked them, they are done
        sentinel = change(7, 6)
        await bus.publish([sentinel])
        assert await fetch_through(second, sentinel) == [sentinel]


@pytest.mark.memory_only
@pytest.mark.redis_only
async def test_a_hung_consumers_deliveries_are_reclaimed_after_the_idle_time(bus: BusBase) -> None:
    published = [change(3, n) for n in range(1, 4)]
    async with bus.subscribe("g", "hung", ["product"]) as hung, \
            bus.subscribe("g", "alive", ["product"]) as alive:
        await bus.publish(published)
        # Given a consumer that fetched and then stopped acking (still open)
        assert len(await fetch_until(hung, 3, ack=False)) == 3
        # When another consumer waits longer than reclaim_idle_s (0.5 s)
        got = await fetch_until(alive, 3)
        # Then it gets the hung consumer's deliveries, and acking there settles them for good
        assert [d.change for d in got] == published
        assert await hung.fetch(10, timeout_s=0.8) == []
        assert await alive.fetch(10, timeout_s=0.8) == []


async def test_acked_changes_never_come_back_even_after_a_restart(bus: BusBase) -> None:
    published = [change(1, n) for n in range(1, 6)]
    await bus.publish(published)
    async with bus.subscribe("g", "c1", ["product"]) as sub:
        assert [d.change for d in await fetch_until(sub, 5)] == published
        assert await sub.fetch(10, timeout_s=0.3) == []

    # After a restart of the consumer, only what came after is delivered
    sentinel = change(1, 6)
    await bus.publish([sentinel])
    async with bus.subscribe("g", "c1", ["product"]) as again:
        assert await fetch_through(again, sentinel) == [sentinel]


async def test_an_ack_covers_only_the_deliveries_acked(bus_factory: BusFactory, bus: BusBase) -> None:
    # Given three changes of one entity (one partition on Kafka), published one by one (one
    # stream entry each on Redis), the 2nd and 3rd acked, the 1st not
    published = [change(9, n) for n in range(1, 4)]
    for one in published:
        await bus.publish([one])
    async with bus.subscribe("g", "c1", ["product"]) as sub:
        got = await fetch_until(sub, 3, ack=False)
        await sub.ack(got[1:])

    # When the consumer restarts
    sentinel = change(9, 4)
    await bus.publish([sentinel])
    async with bus.subscribe("g", "c1", ["product"]) as again:
        redelivered = await fetch_through(again, sentinel)

    if bus_factory.backend == "kafka":
        # Offsets commit only up to the first unacked delivery: the 1st and all after it return.
        assert redelivered == [*published, sentinel]
    else:
        # Acks are per entry: only the unacked 1st returns.
        assert redelivered == [published[0], sentinel]


async def test_a_group_created_after_publishing_gets_what_the_bus_retained(bus: BusBase) -> None:
    published = [change(entity, 1) for entity in range(10)]
    await bus.publish(published)
    async with bus.subscribe("late", "c1", ["product"]) as sub:
        got = [d.change for d in await fetch_until(sub, len(published))]
    assert sorted(map(key, got)) == sorted(map(key, published))


async def test_fetch_waits_for_the_timeout_without_busy_polling(bus_factory: BusFactory,
                                                                bus: BusBase) -> None:
    async with bus.subscribe("g", "c1", ["product"]) as sub:
        await settle(bus_factory, [sub])
        started, cpu_started = time.monotonic(), time.process_time()
        assert await sub.fetch(10, timeout_s=1.5) == []
        waited, cpu = time.monotonic() - started, time.process_time() - cpu_started
    assert waited >= 1.4  # it waited (the timeout), rather than returning at once
    # A busy loop would burn the whole 1.5 s of CPU; waiting on the server or an event costs ms.
    assert cpu < 0.5, f"fetch used {cpu:.2f}s of CPU while waiting {waited:.2f}s"


async def test_a_waiting_fetch_returns_what_is_published_meanwhile(bus_factory: BusFactory,
                                                                   bus: BusBase) -> None:
    async with bus.subscribe("g", "c1", ["product"]) as sub:
        await settle(bus_factory, [sub])
        waiting = asyncio.create_task(sub.fetch(10, timeout_s=30))
        # Time for the fetch to block (each bus blocks in its own way, none visible from here); a
        # change published before it blocks is returned all the same, so this cannot fail a test.
        await asyncio.sleep(0.2)
        await bus.publish([change(1, 1)])
        # Well before its 30 s timeout, the fetch hands the change over
        got = await asyncio.wait_for(waiting, timeout=10)
    assert [d.change for d in got] == [change(1, 1)]


async def test_a_fetch_waiting_on_several_entity_types_wakes_for_any_of_them(bus_factory: BusFactory,
                                                                           bus: BusBase) -> None:
    # On a Redis Cluster the two streams live on two slots: the fetch waits on both at once
    async with bus.subscribe("g", "c1", ["product", "user"]) as sub:
        await settle(bus_factory, [sub])
        for n, entity_type in enumerate(["user", "product", "user"], start=1):
            waiting = asyncio.create_task(sub.fetch(10, timeout_s=30))
            await asyncio.sleep(0.2)  # time for the fetch to block (see the test above)
            await bus.publish([change(n, 1, entity_type)])
            got = await asyncio.wait_for(waiting, timeout=10)
            assert [d.change for d in got] == [change(n, 1, entity_type)]
            await sub.ack(got)
        # The waits that the first answer ended left nothing behind, handed out or not
        assert await sub.fetch(10, timeout_s=0.5) == []
    async with bus.subscribe("g", "c2", ["product", "user"]) as other:
        assert await other.fetch(10, timeout_s=1) == []


async def test_malformed_entries_are_counted_and_do_not_wedge_the_group(bus_factory: BusFactory,
                                                                       bus: BusBase) -> None:
    if bus_factory.backend == "memory":
        pytest.skip("memory:// carries Change objects: publish refuses anything else (tested below)")
    good = change(4, 1)
    async with bus.subscribe("g", "c1", ["product"]) as sub:
        # Given entries some other writer put on the bus that are not changes, then a change
        await _write_raw(bus_factory, bus, "product", "4", [b"not json", b'{"op": "insert"}'])
        await bus.publish([good])
        # Then the consumer gets the change, and counts the others
        assert await fetch_through(sub, good) == [good]
        assert bus.malformed == 2
    # And they were acked: a restarted consumer does not see them again
    sentinel = change(4, 2)
    await bus.publish([sentinel])
    async with bus.subscribe("g", "c1", ["product"]) as again:
        assert await fetch_through(again, sentinel) == [sentinel]
    assert bus.malformed == 2


async def _write_raw(factory: BusFactory, bus: BusBase, entity_type: str, entity_id: str,
                     values: list[bytes]) -> None:
    """Write entries straight into the bus's stream or topic, bypassing `publish`."""
    if factory.backend in REDIS_BACKENDS:
        client = redis_client(factory.url)
        try:
            key = f"{factory.prefix}:{{{entity_type}}}:changes"
            for index, value in enumerate(values):
                # One entry with the change field holding junk, others lacking the field.
                await client.xadd(key, {"change" if index == 0 else "other": value})
        finally:
            await client.aclose()
        return
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(bootstrap_servers=bus.bootstrap_servers)  # type: ignore[attr-defined]
    await producer.start()
    try:
        for value in values:
            await producer.send_and_wait(f"{factory.prefix}.{entity_type}.changes", value=value,
                                         key=entity_id.encode())
    finally:
        await producer.stop()


async def test_a_subscription_is_usable_only_between_enter_and_exit(bus: BusBase) -> None:
    sub = bus.subscribe("g", "c1", ["product"])
    with pytest.raises(BusUnavailable, match="not open"):
        await sub.fetch(1, 0)
    async with sub:
        await sub.fetch(1, 0)
    with pytest.raises(BusUnavailable):
        await sub.fetch(1, 0)
    with pytest.raises(BusUnavailable, match="subscribe again"):
        async with sub:
            pass


async def test_a_closed_or_unreachable_bus_raises_bus_unavailable(bus_factory: BusFactory,
                                                                 tmp_path: Path) -> None:
    # Publishing to a bus whose server went away
    async with _server_that_goes_away(bus_factory, tmp_path) as (url, stop), \
            bus_for(url, prefix=bus_factory.prefix, **FAST) as gone:
        await gone.publish([change(1, 1)])
        await stop(gone)
        with pytest.raises(BusUnavailable):
            await gone.publish([change(1, 2)])
    # Using a bus after it closed
    closed = await bus_factory.open()
    await closed.__aexit__(None, None, None)
    with pytest.raises(BusUnavailable, match="closed"):
        await closed.publish([change(1, 3)])
    with pytest.raises(BusUnavailable):
        async with closed.subscribe("g", "c1", ["product"]):
            pass


@contextlib.asynccontextmanager
async def _server_that_goes_away(factory: BusFactory, tmp_path: Path) -> AsyncIterator[tuple[str, Any]]:
    """A bus URL on a private server of the backend, and a coroutine function that stops the
    server under a bus (memory: the bus itself closes)."""
    if factory.backend == "memory":
        yield "memory://", _close
    elif factory.backend == "redis":
        with _private_redis(tmp_path) as (url, proc):
            yield url, _stopper(proc)
    elif factory.backend == "redis-cluster":
        from support.redis_cluster import running_cluster

        with running_cluster(tmp_path, masters=1) as cluster:
            yield cluster.url, _stopper(cluster.nodes[0].process)
    else:
        from bench.tansu_broker import running_broker

        with running_broker(tmp_path) as broker:
            yield broker.bus_url, _stopper(broker.proc)


async def _close(bus: BusBase) -> None:
    await bus.__aexit__(None, None, None)


def _stopper(proc: subprocess.Popen[bytes]) -> Any:
    async def stop(bus: BusBase) -> None:
        proc.kill()
        await asyncio.to_thread(proc.wait)
    return stop


@contextlib.contextmanager
def _private_redis(workdir: Path) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """A redis-server of this test alone (the session's one must survive the test)."""
    import redis

    binary = shutil.which("redis-server")
    assert binary, "redis-server is not on PATH"
    sock = workdir / "redis.sock"
    proc = subprocess.Popen([binary, "--port", "0", "--unixsocket", str(sock), "--save", "",
                             "--appendonly", "no", "--dir", str(workdir)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        def answers() -> bool:
            assert proc.poll() is None, f"redis-server exited with {proc.returncode}"
            with contextlib.suppress(redis.exceptions.RedisError), \
                    redis.Redis(unix_socket_path=str(sock)) as client:
                return bool(client.ping())
            return False

        eventually_sync(answers, "redis-server answers on its socket", timeout_s=10, every_s=0.05)
        yield f"unix://{sock}", proc
    finally:
        proc.kill()
        proc.wait()


# ---------------------------------------------------------------------- backend-only cases


@pytest.mark.redis_only
@pytest.mark.parametrize("changes_per_entry", [1, 5, 100])
async def test_redis_streams_stay_within_their_cap_of_changes(bus_factory: BusFactory,
                                                              changes_per_entry: int) -> None:
    bus = await bus_factory.open(max_len=50, changes_per_entry=changes_per_entry)
    for start in range(0, 1000, 100):
        await bus.publish([change(n, 1) for n in range(start, start + 100)])
    entries = await _stream_entries(bus_factory, "product")
    held = sum(len(_changes_of(fields)) for _, fields in entries)
    # Never below the cap (in changes, whatever an entry holds); above it by at most the last
    # publish (trimmed with the next one) and what trimming whole stream nodes leaves.
    assert 50 <= held <= 300, (held, len(entries))
    assert all(len(_changes_of(fields)) <= changes_per_entry for _, fields in entries)


async def _stream_entries(factory: BusFactory, entity_type: str) -> list[tuple[bytes, dict[bytes, bytes]]]:
    client = redis_client(factory.url)
    try:
        entries: list[tuple[bytes, dict[bytes, bytes]]] = await client.xrange(
            f"{factory.prefix}:{{{entity_type}}}:changes")
    finally:
        await client.aclose()
    return entries


def _changes_of(fields: dict[bytes, bytes]) -> list[Change]:
    if b"changes" in fields:
        return [Change.from_object(event) for event in changes_from_json(fields[b"changes"])]
    return [Change.from_json(fields[b"change"])]


@pytest.mark.redis_only
async def test_redis_counts_pending_entries_the_cap_trimmed(bus_factory: BusFactory) -> None:
    bus = await bus_factory.open(max_len=1)
    async with bus.subscribe("g", "hung", ["product"]) as hung, \
            bus.subscribe("g", "alive", ["product"]) as alive:
        await bus.publish([change(1, 1)])
        assert len(await hung.fetch(10, timeout_s=1)) == 1
        # The pending entry is trimmed away by later publishing (whole nodes of 100 go at once)
        for start in range(0, 400, 100):
            await bus.publish([change(n, 2) for n in range(start, start + 100)])
        # When the alive consumer reclaims it (after 0.5 s idle), it is gone: counted as lost
        deadline = time.monotonic() + WAIT_S
        delivered: list[Change] = []
        while bus.lost == 0 and time.monotonic() < deadline:  # type: ignore[attr-defined]
            batch = await alive.fetch(500, timeout_s=0.2)
            await alive.ack(batch)
            delivered += [d.change for d in batch]
        assert bus.lost == 1  # type: ignore[attr-defined]
        assert change(1, 1) not in delivered


@pytest.mark.redis_only
async def test_redis_entries_of_the_one_change_form_read_on_beside_the_new_ones(
        bus_factory: BusFactory) -> None:
    # Given a stream written by a version that put one change in each entry, then by this one
    bus = await bus_factory.open()
    old = [change(2, n) for n in range(1, 4)]
    client = redis_client(bus_factory.url)
    try:
        for one in old:
            await client.xadd(f"{bus_factory.prefix}:{{product}}:changes", {"change": one.to_json()})
    finally:
        await client.aclose()
    new = [change(2, n) for n in range(4, 8)]
    await bus.publish(new)
    # When a consumer reads it, it gets both forms' changes, in order
    async with bus.subscribe("g", "c1", ["product"]) as sub:
        assert await fetch_through(sub, new[-1]) == [*old, *new]
    # And entries this version writes with changes_per_entry=1 are in the old form
    one_each = await bus_factory.open(changes_per_entry=1)
    await one_each.publish([change(2, 8), change(2, 9)])
    entries = await _stream_entries(bus_factory, "product")
    assert [list(fields) for _, fields in entries[-2:]] == [[b"change"], [b"change"]]
    assert bus.malformed == 0


@pytest.mark.redis_only
async def test_redis_an_entry_is_acked_once_every_change_it_carries_is(bus_factory: BusFactory) -> None:
    # Given one publish of 10 changes of one entity: one stream entry
    bus = await bus_factory.open()
    published = [change(8, n) for n in range(1, 11)]
    await bus.publish(published)
    assert len(await _stream_entries(bus_factory, "product")) == 1
    async with bus.subscribe("g", "c1", ["product"]) as sub:
        # When a consumer takes it 3 changes a fetch, acking all but the last fetch's
        got: list[Delivery] = []
        for _ in range(4):
            batch = await sub.fetch(3, timeout_s=1)
            assert 0 < len(batch) <= 3
            got += batch
        assert [d.change for d in got] == published
        await sub.ack(got[:9])
        pending = await _pending(bus_factory, "product", "g")
    # Then the entry stays pending, and a restarted consumer gets all of it again
    assert pending == 1
    async with bus.subscribe("g", "c1", ["product"]) as again:
        redelivered = await fetch_until(again, 10)
        assert [d.change for d in redelivered] == published
        assert await _pending(bus_factory, "product", "g") == 0  # all acked: the entry is done
    sentinel = change(8, 11)
    await bus.publish([sentinel])
    async with bus.subscribe("g", "c1", ["product"]) as last:
        assert await fetch_through(last, sentinel) == [sentinel]


async def _pending(factory: BusFactory, entity_type: str, group: str) -> int:
    client = redis_client(factory.url)
    try:
        summary = await client.xpending(f"{factory.prefix}:{{{entity_type}}}:changes", group)
    finally:
        await client.aclose()
    return int(summary["pending"])


@pytest.mark.redis_only
async def test_redis_a_large_publish_is_split_into_bounded_entries(bus_factory: BusFactory) -> None:
    # Given a transaction of 250 changes, three of them with a 200 kB column
    bus = await bus_factory.open()
    published = [change(n, 1) for n in range(250)]
    for n in (10, 11, 12):
        published[n] = Change.of_row(entity_type="product", op=Op.INSERT, key_columns=["id"],
                                     version=Version(1, n), commit_time=COMMIT,
                                     after={"id": str(n), "text": "x" * 200_000})
    await bus.publish(published)
    # Then no entry holds more than 100 changes nor (past one change) more than 512 kB
    entries = await _stream_entries(bus_factory, "product")
    sizes = [len(_changes_of(fields)) for _, fields in entries]
    assert sum(sizes) == 250 and max(sizes) <= 100
    assert all(len(fields[b"changes"]) <= 512 * 1024 for _, fields in entries)
    assert len(entries) >= 4  # the three large changes do not fit in one entry
    # And a consumer gets them all, in order
    async with bus.subscribe("g", "c1", ["product"]) as sub:
        got = await fetch_until(sub, 250, max_count=70)
    assert [d.change for d in got] == published


@pytest.mark.redis_only
async def test_redis_a_malformed_change_in_an_entry_costs_only_itself(bus_factory: BusFactory) -> None:
    bus = await bus_factory.open()
    good = [change(6, 1), change(6, 2)]
    raw = b"[" + good[0].to_json() + b',{"op": "insert"},' + good[1].to_json() + b"]"
    client = redis_client(bus_factory.url)
    try:
        await client.xadd(f"{bus_factory.prefix}:{{product}}:changes", {"changes": raw})
        await client.xadd(f"{bus_factory.prefix}:{{product}}:changes", {"changes": b"[not json"})
        await client.xadd(f"{bus_factory.prefix}:{{product}}:changes", {"changes": good[0].to_json()})
    finally:
        await client.aclose()
    sentinel = change(6, 3)
    await bus.publish([sentinel])
    async with bus.subscribe("g", "c1", ["product"]) as sub:
        assert await fetch_through(sub, sentinel) == [*good, sentinel]
        assert await _pending(bus_factory, "product", "g") == 0
    # The bad change in the array, the entry that is not JSON, the one that is not an array
    assert bus.malformed == 3


@pytest.mark.memory_only
async def test_memory_publishers_wait_while_a_group_is_full(bus_factory: BusFactory) -> None:
    bus = await bus_factory.open(max_len=10)
    async with bus.subscribe("g", "c1", ["product"]) as sub:
        await bus.publish([change(n, 1) for n in range(10)])
        # Given a stream holding max_len changes the group still needs, a publisher waits
        blocked = asyncio.create_task(bus.publish([change(10, 1)]))
        room = bus._writable  # type: ignore[attr-defined]  # the memory bus's condition for room
        await eventually(lambda: room._waiters, "the publisher waits for room")
        assert not blocked.done()
        # Until the group acks some
        batch = await sub.fetch(3, timeout_s=1)
        await asyncio.sleep(0.05)  # a window for a wrong wake-up: what is asserted is that none comes
        assert not blocked.done()  # fetched is not done: the group still needs them
        await sub.ack(batch)
        await asyncio.wait_for(blocked, timeout=5)
        got = await fetch_until(sub, 8)
    assert [c.entity_id for c in (d.change for d in got)] == [str(n) for n in range(3, 11)]
    assert bus.trimmed == 0  # type: ignore[attr-defined]


@pytest.mark.memory_only
async def test_memory_keeps_the_newest_changes_while_no_group_reads(bus_factory: BusFactory) -> None:
    bus = await bus_factory.open(max_len=10)
    await bus.publish([change(n, 1) for n in range(25)])
    async with bus.subscribe("late", "c1", ["product"]) as sub:
        got = await fetch_until(sub, 10)
        assert await sub.fetch(10, timeout_s=0.1) == []
    assert [d.change.entity_id for d in got] == [str(n) for n in range(15, 25)]
    assert bus.trimmed == 15  # type: ignore[attr-defined]


@pytest.mark.memory_only
async def test_memory_refuses_to_publish_what_is_not_a_change(bus: BusBase) -> None:
    async with bus.subscribe("g", "c1", ["product"]) as sub:
        with pytest.raises(InvalidChange, match=r"item 1 .* dict"):
            await bus.publish([change(1, 1), {"entity_type": "product"}])  # type: ignore[list-item]
        assert await sub.fetch(10, timeout_s=0.1) == []


_KILLED_CONSUMER = """
import asyncio, sys
from tidegate.sync.buses.base import bus_for

async def main(url, prefix):
    async with bus_for(url, prefix=prefix, partitions=1, session_timeout_s=2.0,
                       heartbeat_interval_s=0.2) as bus:
        async with bus.subscribe("g", "doomed", ["product"]) as sub:
            got = []
            while len(got) < 3:
                got += await sub.fetch(10, timeout_s=1)
            print("fetched", len(got), flush=True)
            await asyncio.sleep(3600)

asyncio.run(main(sys.argv[1], sys.argv[2]))
"""


@pytest.mark.kafka_only
async def test_kafka_a_killed_consumers_partitions_go_to_the_group(bus_factory: BusFactory) -> None:
    bus = await bus_factory.open(partitions=1)
    published = [change(5, n) for n in range(1, 4)]
    await bus.publish(published)
    # Given a consumer process that fetched without acking and is then killed (no goodbye)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _KILLED_CONSUMER, bus_factory.url, bus_factory.prefix,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    try:
        assert proc.stdout is not None
        line = await asyncio.wait_for(proc.stdout.readline(), timeout=WAIT_S)
        assert line.startswith(b"fetched"), line
    finally:
        proc.send_signal(signal.SIGKILL)
        await proc.wait()
    # When another consumer joins, once the dead one's session expired it gets the partition
    async with bus.subscribe("g", "survivor", ["product"]) as survivor:
        got = await fetch_until(survivor, 3)
    assert [d.change for d in got] == published


@pytest.mark.kafka_only
async def test_kafka_acks_hold_when_a_rebalance_follows_at_once(bus_factory: BusFactory) -> None:
    # Given a consumer that acked everything it fetched (commits leave in the background)
    bus = await bus_factory.open(partitions=1)
    published = [change(6, n) for n in range(1, 4)]
    await bus.publish(published)
    sentinel = change(6, 4)
    seen: list[Change] = []
    async with bus.subscribe("g", "c1", ["product"]) as first:
        assert [d.change for d in await fetch_until(first, 3)] == published
        # When a second consumer joins right after the ack (the partition may move to it)
        async with bus.subscribe("g", "c2", ["product"]) as second:
            await bus.publish([sentinel])
            deadline = time.monotonic() + WAIT_S
            while sentinel not in seen and time.monotonic() < deadline:
                for sub in (first, second):
                    batch = await sub.fetch(100, timeout_s=0.2)
                    if batch:
                        await sub.ack(batch)
                    seen += [d.change for d in batch]
    # Then whichever consumer holds the partition resumes after the acked changes
    assert seen == [sentinel]


@pytest.mark.kafka_only
async def test_kafka_an_ack_and_close_stay_bounded_when_the_broker_dies(bus_factory: BusFactory,
                                                                       tmp_path: Path) -> None:
    # Given a consumer holding deliveries when its broker is killed
    async with _server_that_goes_away(bus_factory, tmp_path) as (url, stop), \
            bus_for(url, prefix=bus_factory.prefix, **FAST) as gone:
        await gone.publish([change(1, 1), change(1, 2)])
        sub = gone.subscribe("g", "c1", ["product"])
        async with sub:
            got = await fetch_until(sub, 2, ack=False)
            assert len(got) == 2
            await stop(gone)
            # When it acks them (the commit cannot reach the broker) and closes
            started = time.monotonic()
            await asyncio.wait_for(sub.ack(got), timeout=1.0)  # the ack does not wait for the commit
        # Then closing gave up on the commit after the request timeout rather than hanging
        closed_after_s = time.monotonic() - started
    assert closed_after_s < FAST["request_timeout_s"] + 10


@pytest.mark.kafka_only
async def test_kafka_a_broker_refusing_the_idempotent_producer_is_named(bus_factory: BusFactory) -> None:
    # The Tansu broker answers aiokafka's InitProducerId (v0) with an error (see bench/tansu_broker.py)
    with pytest.raises(BusUnavailable, match="idempotence=false"):
        await bus_factory.open(idempotence=True)


# ---------------------------------------------------------------------- URLs and settings


def test_bus_urls_pick_the_backend_and_refuse_what_cannot_work() -> None:
    assert type(bus_for("memory://")).__name__ == "MemoryBus"
    assert type(bus_for("redis://127.0.0.1:1/0")).__name__ == "RedisBus"
    assert type(bus_for("kafka://127.0.0.1:1,127.0.0.2:1")).__name__ == "KafkaBus"
    with pytest.raises(ConfigError, match="unsupported bus URL"):
        bus_for("nats://127.0.0.1:4222")
    with pytest.raises(ConfigError, match="max_len"):
        bus_for("memory://?max_len=0")
    with pytest.raises(ConfigError, match="heartbeat_interval_s"):
        bus_for("kafka://127.0.0.1:9092", session_timeout_s=1, heartbeat_interval_s=2)
    with pytest.raises(ConfigError, match="credentials"):
        bus_for("kafka://user:secret@127.0.0.1:9092")
    with pytest.raises(ConfigError, match="cannot name a Kafka topic"):
        bus_for("kafka://127.0.0.1:9092").topic("odd table")  # type: ignore[attr-defined]
    assert bus_for("redis://h:1/0?max_len=5", prefix="shop").settings.max_len == 5  # type: ignore[attr-defined]
    with pytest.raises(ConfigError, match="fetch_max_wait_ms"):
        bus_for("kafka://127.0.0.1:9092?fetch_max_wait_ms=0")  # 0: the consumer would poll in a busy loop
    waiting = bus_for("kafka://127.0.0.1:9092?fetch_max_wait_ms=250")
    assert waiting.settings.fetch_max_wait_ms == 250  # type: ignore[attr-defined]


def _closed_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


@pytest.mark.parametrize("scheme", ["redis", "kafka"])
async def test_an_unreachable_server_is_named_without_its_password(scheme: str) -> None:
    port = _closed_port()
    url = f"redis://:hunter2@127.0.0.1:{port}/0" if scheme == "redis" else f"kafka://127.0.0.1:{port}"
    with pytest.raises(BusUnavailable) as caught:
        async with bus_for(url, request_timeout_s=2):
            pass
    assert f"127.0.0.1:{port}" in str(caught.value)
    assert "hunter2" not in str(caught.value)


@pytest.mark.parametrize(("scheme", "module", "extra"), [("redis", "redis", "redis"),
                                                        ("kafka", "aiokafka", "kafka")])
def test_a_missing_driver_names_the_extra_to_install(monkeypatch: pytest.MonkeyPatch, scheme: str,
                                                     module: str, extra: str) -> None:
    # As without the extra installed: the driver cannot be imported.
    monkeypatch.setitem(sys.modules, module, None)
    for name in [m for m in sys.modules if m == module or m.startswith(f"{module}.")]:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.delitem(sys.modules, f"tidegate.sync.buses.{scheme}", raising=False)
    with pytest.raises(MissingDependency, match=rf"tidegate\[{extra}\]"):
        bus_for(f"{scheme}://127.0.0.1:1")
