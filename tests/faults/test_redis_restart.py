"""Redis restarts under running clients: each component comes back by itself once the server is
back, without a caller waiting for a safety poll, and counts the reconnection.

A server of the test's own is killed (SIGKILL, so nothing is flushed or announced) and started again
on the same port: with an append-only file fsynced at every write where the data must survive, or
without persistence where the test is about the server losing everything (the script cache, the
streams and their consumer groups)."""

from __future__ import annotations

import asyncio
import shutil
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

import tidegate.app.sync
from support.cluster import start_gateway, start_worker, write_config
from support.redis_keys import redis_client
from support.waiting import eventually, eventually_sync
from test_sync_pipeline import _shop_matches
from tidegate._redis import RECONNECT_REGISTRY
from tidegate.app.sync import supervise_sync
from tidegate.config import SyncConfig, TidegateConfig
from tidegate.coord.budget import RedisBudgetLedger
from tidegate.coord.limiter import RedisRateLimiter
from tidegate.coord.relay import RedisRelay
from tidegate.coord.tenants import Tenant, tenant_store_for
from tidegate.demo.shop import ShopLoad, create_shop
from tidegate.errors import BusUnavailable, DispatchUnavailable
from tidegate.jobs import JobState, Priority
from tidegate.queue import Queue
from tidegate.recs import Item, recs_store_for
from tidegate.simulator.server import Simulator
from tidegate.simulator.settings import SimulatorSettings
from tidegate.sync.buses.base import bus_for
from tidegate.sync.cache import cache_for
from tidegate.sync.changes import Change, Op, Version
from tidegate.sync.contracts import Subscription

pytestmark = pytest.mark.timeout(120)

FALLBACK_S = 5.0  # the queue's safety poll: what a waiter sees when the listener is dead
PROMPT_S = 2.0  # what "promptly" means here: well under the fallback
MODEL = "deepseek-v3.2"
COMMIT = datetime(2026, 1, 1, tzinfo=UTC)


class RestartableRedis:
    """A redis-server on a fixed loopback port that the test may kill and start again."""

    def __init__(self, folder: Path, *, persistent: bool) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            pytest.fail("redis-server is not on PATH: apt-get install redis-server", pytrace=False)
        self.binary = binary
        self.folder = folder
        self.persistent = persistent
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Start it and return once it answers PING as this process."""
        import redis

        persistence = ["--appendonly", "yes", "--appendfsync", "always"] if self.persistent else \
            ["--appendonly", "no"]
        self.process = subprocess.Popen(
            [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             *persistence, "--dir", str(self.folder)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
        process = self.process

        def answering_pid() -> int:
            if process.poll() is not None:
                pytest.fail("the test's own redis-server exited", pytrace=False)
            with redis.Redis(port=self.port, socket_connect_timeout=0.5) as client:
                return int(client.info("server")["process_id"])

        try:
            pid = eventually_sync(answering_pid, "the test's own redis-server answers", timeout_s=10,
                                  ignoring=(redis.exceptions.ConnectionError,))
        except AssertionError as exc:
            pytest.fail(str(exc), pytrace=False)
        if pid != process.pid:
            pytest.fail(f"port {self.port} is answered by another redis-server", pytrace=False)

    def kill(self) -> None:
        """SIGKILL, as a crash or an OOM kill does: nothing is flushed, no client is told."""
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=10)

    def restart(self) -> None:
        self.kill()
        self.start()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=10)


@pytest.fixture
def durable_redis(tmp_path: Path) -> Iterator[RestartableRedis]:
    """A server whose data survives a restart (append-only file, fsync at every write)."""
    server = RestartableRedis(tmp_path, persistent=True)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def volatile_redis(tmp_path: Path) -> Iterator[RestartableRedis]:
    """A server that loses everything when restarted, its script cache included."""
    server = RestartableRedis(tmp_path, persistent=False)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def reconnects(component: str) -> float:
    """This process's count of reconnections of `component`."""
    value = RECONNECT_REGISTRY.get_sample_value("tidegate_redis_reconnects_total", {"component": component})
    return value or 0.0


async def eventually_more(component: str, than: float, timeout_s: float = 10.0) -> None:
    await eventually(lambda: reconnects(component), f"{component} counts a reconnection",
                     until=lambda count: count > than, timeout_s=timeout_s)


async def listening(queue: Queue, server: RestartableRedis) -> None:
    """Until Redis counts a subscriber of the queue's job-done channel: its listener stands."""
    channel = queue._done_channel  # type: ignore[attr-defined]
    client = redis_client(server.url)
    try:
        await eventually(lambda: client.pubsub_numsub(channel), "the job-done listener has subscribed",
                         until=lambda counts: counts[0][1] >= 1)
    finally:
        await client.aclose()


async def blocked_in_a_read(server: RestartableRedis) -> None:
    """Until Redis counts a client blocked in a read (XREAD or XREADGROUP with BLOCK): the
    component under test waits for news on its connection."""
    client = redis_client(server.url)
    try:
        await eventually(lambda: client.info("clients"), "a read is blocked on the server",
                         until=lambda info: info["blocked_clients"] >= 1)
    finally:
        await client.aclose()


async def connection_lost(caplog: pytest.LogCaptureFixture, component: str) -> None:
    """Until `component` has noticed that its connection is gone: it logs so once an outage."""
    await eventually(lambda: f"{component} lost its Redis connection" in caplog.text,
                     f"the {component} notices the loss")


# ---------------------------------------------------------------------- the queue


async def test_a_wait_in_flight_across_a_restart_returns_as_soon_as_its_job_completes(
    durable_redis: RestartableRedis,
) -> None:
    async with Queue.from_url(f"{durable_redis.url}?name=q", maintenance_interval_s=None) as queue:
        before = reconnects("queue")
        # Given a caller waiting for a job, its listener subscribed
        job_id = await queue.enqueue({"n": 1})
        waiting = asyncio.create_task(queue.wait(job_id, timeout_s=30))
        await listening(queue, durable_redis)
        assert not waiting.done()

        # When Redis restarts, and only then the job is claimed and completed
        await asyncio.to_thread(durable_redis.restart)
        [job] = await queue.claim("w1", limit=1, lease_s=30, timeout_s=5)
        await queue.complete(job, {"ok": True})
        completed_at = time.monotonic()

        # Then the wait returns its result at once, not at the next safety poll
        finished = await asyncio.wait_for(waiting, FALLBACK_S + 5)
        waited_s = time.monotonic() - completed_at
        assert finished is not None and finished.state is JobState.SUCCEEDED
        assert waited_s < PROMPT_S, f"the wait returned {waited_s:.2f}s after the job completed"
        assert reconnects("queue") > before


async def test_a_job_finished_while_the_listener_was_down_still_ends_its_wait_promptly(
    durable_redis: RestartableRedis, caplog: pytest.LogCaptureFixture,
) -> None:
    # Its announcement went to a listener that was not subscribed: every waiter re-reads its job
    # once the listener has subscribed again.
    async with (
        Queue.from_url(f"{durable_redis.url}?name=q", maintenance_interval_s=None) as queue,
        Queue.from_url(f"{durable_redis.url}?name=q", maintenance_interval_s=None) as worker_side,
    ):
        job_id = await queue.enqueue({"n": 1})
        waiting = asyncio.create_task(queue.wait(job_id, timeout_s=30))
        await listening(queue, durable_redis)
        # Given the waiting side loses its connection (its server is gone) ...
        await asyncio.to_thread(durable_redis.kill)
        await connection_lost(caplog, "queue")
        # ... and the job completes on the restarted server before the listener is back
        await asyncio.to_thread(durable_redis.start)
        [job] = await worker_side.claim("w1", limit=1, lease_s=30, timeout_s=5)
        await worker_side.complete(job, {"ok": True})
        completed_at = time.monotonic()

        finished = await asyncio.wait_for(waiting, FALLBACK_S + 5)
        assert finished is not None and finished.state is JobState.SUCCEEDED
        assert time.monotonic() - completed_at < PROMPT_S


async def test_closing_a_queue_whose_redis_is_down_is_bounded(
    durable_redis: RestartableRedis, caplog: pytest.LogCaptureFixture,
) -> None:
    queue = await Queue.from_url(f"{durable_redis.url}?name=q", maintenance_interval_s=None).open()
    job_id = await queue.enqueue({"n": 1})
    waiting = asyncio.create_task(queue.wait(job_id, timeout_s=1))
    await listening(queue, durable_redis)
    await asyncio.to_thread(durable_redis.kill)
    await connection_lost(caplog, "queue")  # the listener is in its reconnect loop now
    started = time.monotonic()
    await asyncio.wait_for(queue.close(), 5)
    assert time.monotonic() - started < PROMPT_S
    await asyncio.gather(waiting, return_exceptions=True)


# ---------------------------------------------------------------------- gateway and worker


@pytest.fixture
async def served(durable_redis: RestartableRedis, tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    """A `tidegate gateway` and a `tidegate worker` on the restartable Redis, the simulated
    provider on this loop; yields a client of the gateway with a tenant's key."""
    queue_url = f"{durable_redis.url}?name=q"
    sim = Simulator(SimulatorSettings(seed=3, defaults={"latency_ms": 5}))
    async with sim.running() as sim_url:
        config = write_config(tmp_path / "tidegate.toml", sim_url, (MODEL,))
        tenant = Tenant(name="app", max_priority=Priority.CRITICAL, default_priority=Priority.NORMAL)
        async with tenant_store_for(queue_url, auth_cache_s=0) as store:
            await store.put_tenant(tenant)
            _, key = await store.create_key(tenant.name)
        gateway = await start_gateway("gw", queue_url, config, tmp_path)
        try:
            worker = await start_worker("w1", queue_url, config, tmp_path, "--lease-s", "5")
            try:
                async with httpx.AsyncClient(base_url=gateway.url, timeout=30.0,
                                             headers={"Authorization": f"Bearer {key}"}) as http:
                    yield http
            finally:
                assert await worker.stop() == 0, worker.describe()
        finally:
            assert await gateway.stop() == 0, gateway.describe()


async def _chat(http: httpx.AsyncClient) -> float:
    """One synchronous chat completion; returns how long it took."""
    started = time.monotonic()
    answer = await http.post("/v1/chat/completions",
                             json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}]})
    assert answer.status_code == 200, answer.text
    return time.monotonic() - started


def _gateway_reconnects(text: str) -> float:
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "tidegate_redis_reconnects_total" and sample.labels.get("component") == "queue":
                return sample.value
    return 0.0


async def test_the_next_synchronous_call_after_a_restart_is_answered_without_the_fallback(
    durable_redis: RestartableRedis, served: httpx.AsyncClient
) -> None:
    http = served
    # Given a gateway that has answered synchronous calls (its job-done listener subscribed)
    for _ in range(3):
        assert await _chat(http) < PROMPT_S
    # When Redis restarts
    await asyncio.to_thread(durable_redis.restart)
    # Then the next synchronous call is answered well before the 5 s safety poll
    took_s = await _chat(http)
    print(f"first call after the restart: {took_s * 1000:.0f} ms")
    assert took_s < PROMPT_S, f"the first call after the restart took {took_s:.2f}s"
    # And the gateway counted its job-done listener's reconnection
    assert _gateway_reconnects((await http.get("/metrics")).text) >= 1


# ---------------------------------------------------------------------- limiter and budget


async def test_the_limiter_and_the_budget_keep_working_across_a_restart(
    durable_redis: RestartableRedis,
) -> None:
    name = f"t{uuid.uuid4().hex[:8]}"
    async with RedisRateLimiter(durable_redis.url, name) as limiter, \
            RedisBudgetLedger(durable_redis.url, name) as ledger:
        assert await limiter.acquire("sim/m", tokens=10, rpm=600, tpm=None) == 0.0
        reservation = await ledger.reserve("app", 1_000, tenant_limit_micros=10_000, global_limit_micros=None)
        before = reconnects("rate_limiter")

        # While Redis is down, a call fails in bounded time with the store's own error
        await asyncio.to_thread(durable_redis.kill)
        started = time.monotonic()
        with pytest.raises(DispatchUnavailable):
            await limiter.acquire("sim/m", tokens=10, rpm=600, tpm=None)
        assert time.monotonic() - started < 5

        # A call under way when Redis comes back goes through (it may be sent twice): under way
        # means refused once at least, and waiting for its next attempt
        outage = limiter._redis.outage  # type: ignore[union-attr]
        refused = outage._failures  # the attempts of this outage so far: none of this call's yet
        pending = asyncio.create_task(limiter.pause("sim/m", 0.01))
        await eventually(lambda: outage._failures, "the call has been refused by the dead server",
                         until=lambda failures: failures > refused)
        await asyncio.to_thread(durable_redis.start)
        await asyncio.wait_for(pending, 5)

        # And afterwards every operation works again
        assert await limiter.acquire("sim/m", tokens=10, rpm=600, tpm=None) >= 0.0
        await ledger.settle(reservation, 400)
        status = await ledger.status("app", tenant_limit_micros=10_000, global_limit_micros=None)
        assert status.tenant_spent_micros == 400
        second = await ledger.reserve("app", 2_000, tenant_limit_micros=10_000, global_limit_micros=None)
        await ledger.release(second)
        assert reconnects("rate_limiter") > before


# ---------------------------------------------------------------------- the change-flow bus


def _change(entity_id: str, n: int) -> Change:
    return Change.of_row(entity_type="product", op=Op.INSERT if n == 1 else Op.UPDATE,
                         key_columns=["id"], version=Version(n, 0), commit_time=COMMIT,
                         after={"id": entity_id, "n": n})


async def _fetch_until(subscription: Subscription, count: int, timeout_s: float = 10.0) -> list[Change]:
    """Changes fetched and acked until `count` arrived; BusUnavailable is retried, as the sync
    pipeline's supervisor does."""
    got: list[Change] = []

    async def fetch_more() -> int:
        batch = await subscription.fetch(100, timeout_s=0.5)
        await subscription.ack(batch)
        got.extend(delivery.change for delivery in batch)
        return len(got)

    await eventually(fetch_more, f"{count} changes arrived", until=lambda arrived: arrived >= count,
                     timeout_s=timeout_s, every_s=0.1, ignoring=(BusUnavailable,))
    return got


async def test_a_stream_consumer_resumes_after_a_restart_and_gets_what_was_published_since(
    durable_redis: RestartableRedis, caplog: pytest.LogCaptureFixture,
) -> None:
    async with bus_for(durable_redis.url) as bus, bus.subscribe("cache", "c1", ["product"]) as sub:
        before = reconnects("bus")
        await bus.publish([_change("p1", 1)])
        assert [c.version for c in await _fetch_until(sub, 1)] == [Version(1, 0)]

        # Given a fetch blocked in its read when Redis dies
        fetching = asyncio.create_task(sub.fetch(100, timeout_s=5))
        await blocked_in_a_read(durable_redis)
        await asyncio.to_thread(durable_redis.kill)
        await connection_lost(caplog, "bus")
        # When it is back and a change is published
        await asyncio.to_thread(durable_redis.start)
        await bus.publish([_change("p1", 2)])

        # Then that fetch reconnects and hands out the change published since, and only that:
        # what was acked before the restart is not delivered again
        batch = await asyncio.wait_for(fetching, 10) or await sub.fetch(100, timeout_s=2)
        assert [d.change.version for d in batch] == [Version(2, 0)]
        await sub.ack(batch)
        assert await sub.fetch(100, timeout_s=0.3) == []
        assert reconnects("bus") > before


async def test_a_restart_without_persistence_recreates_the_group_says_so_once_and_delivers_what_follows(
    volatile_redis: RestartableRedis,
) -> None:
    async with bus_for(volatile_redis.url) as bus, bus.subscribe("cache", "c1", ["product"]) as sub:
        await bus.publish([_change("p1", 1)])
        assert len(await _fetch_until(sub, 1)) == 1

        # The restarted server has neither the stream nor the group
        await asyncio.to_thread(volatile_redis.restart)
        with pytest.raises(BusUnavailable, match="vanished"):
            await sub.fetch(100, timeout_s=0.5)

        await bus.publish([_change("p1", 2), _change("p2", 1)])
        got = await _fetch_until(sub, 2)
        assert sorted((c.entity_id, c.version) for c in got) == [("p1", Version(2, 0)), ("p2", Version(1, 0))]


# ---------------------------------------------------------------------- scripts after a restart


async def test_the_entity_cache_runs_its_scripts_again_after_a_restart_emptied_the_script_cache(
    volatile_redis: RestartableRedis,
) -> None:
    async with cache_for(volatile_redis.url) as cache:
        [first] = await cache.apply([_change("p1", 1)])
        await asyncio.to_thread(volatile_redis.restart)
        # A pooled connection to the old server and NOSCRIPT from the new one, both healed
        [again] = await cache.apply([_change("p1", 2)])
        entry = await cache.get("product", "p1")
        assert entry is not None and entry.version == Version(2, 0) and entry.data == {"id": "p1", "n": 2}
        assert first.outcome == again.outcome


async def test_the_recommendation_store_runs_its_scripts_again_after_a_restart(
    volatile_redis: RestartableRedis,
) -> None:
    async with recs_store_for(volatile_redis.url) as store:
        await store.put_item(Item("a", name="A", vector=(1.0, 0.0)))
        await asyncio.to_thread(volatile_redis.restart)
        # A script called alone and scripts queued in a pipeline, on a server that knows neither
        await store.put_item(Item("b", name="B", vector=(0.0, 1.0)))
        await store.add_neighbours({"b": {"c": 1.5}}, max_neighbours=10)
        changes = await store.items_since(0)
        assert [(item_id, item is not None) for item_id, item in changes.changes] == [("b", True)]
        assert await store.neighbours(["b"], 10) == {"b": [("c", 1.5)]}


# ---------------------------------------------------------------------- the stream relay


async def test_a_relayed_stream_read_across_a_restart_continues_from_its_last_chunk(
    durable_redis: RestartableRedis, caplog: pytest.LogCaptureFixture,
) -> None:
    relay = RedisRelay(durable_redis.url, f"t{uuid.uuid4().hex[:8]}")
    try:
        before = reconnects("relay")
        await relay.publish("job1", b"one")
        received: list[bytes] = []

        async def read() -> None:
            async for chunk in relay.subscribe("job1", timeout_s=10):
                received.append(chunk)

        reading = asyncio.create_task(read())
        await eventually(lambda: list(received), "the first chunk arrives")
        assert received == [b"one"]
        # When Redis restarts under the blocked read, and the answer goes on afterwards
        await blocked_in_a_read(durable_redis)
        await asyncio.to_thread(durable_redis.kill)
        await connection_lost(caplog, "relay")
        await asyncio.to_thread(durable_redis.start)
        await relay.publish("job1", b"two")
        await relay.finish("job1")
        # Then the subscriber gets the rest, once, and the end of the stream
        await asyncio.wait_for(reading, 10)
        assert received == [b"one", b"two"]
        assert reconnects("relay") > before
    finally:
        await relay.close()


# ---------------------------------------------------------------------- the change flow


async def stream_entries(server: RestartableRedis) -> int:
    """Entries in the server's streams: how much the change flow has published to its bus."""
    client = redis_client(server.url)
    try:
        return sum([await client.xlen(key) async for key in client.scan_iter(_type="STREAM")])
    finally:
        await client.aclose()


async def test_the_change_flow_heals_a_bus_restart_that_lost_the_streams_and_the_cache_equals_the_db(
    volatile_redis: RestartableRedis, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(tidegate.app.sync, "RESTART_AFTER_S", 0.2)  # reopened at once, for a short test
    # Given the change flow from a SQLite shop over Redis Streams into a cache, as `tidegate up`
    # supervises it, under a steady write load
    shop = tmp_path / "shop.db"
    create_shop(shop, products=60, users=20, interactions=60)
    sync = SyncConfig(source_url=f"sqlite:///{shop}", bus_url=volatile_redis.url, cache_url="memory://",
                      prefix=f"t{uuid.uuid4().hex[:8]}")
    config = TidegateConfig.load(queue_url="sqlite:///unused.db").model_copy(update={"sync": sync})
    stop = asyncio.Event()
    async with cache_for("memory://") as cache:
        flow = asyncio.create_task(supervise_sync(config, stop, cache=cache))
        try:
            await _shop_matches(shop, cache)
            published = await stream_entries(volatile_redis)
            load = asyncio.create_task(ShopLoad(shop).run(rate_per_s=200, duration_s=2.0))
            await eventually(lambda: stream_entries(volatile_redis), "the flow publishes writes of the load",
                             until=lambda entries: entries > published)
            assert not load.done(), "the load ended before the flow published any of it: no restart mid-load"
            # When Redis restarts without persistence mid-load: the streams, the consumer group
            # and whatever was published and not yet applied are gone
            await asyncio.to_thread(volatile_redis.restart)
            written = await load
            assert sum(written.values()) > 100
            # Then the flow replays from its confirmed position: every column of every row equals
            # the database again
            await _shop_matches(shop, cache)
        finally:
            stop.set()
            await asyncio.wait_for(flow, 30)
