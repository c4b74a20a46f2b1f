"""Freshness of the recommendations under a steady stream of interactions: PostgreSQL → the change
flow (memory bus) → entity cache → `RecsSink` → recommender, measured from both ends (see
`bench.recs_bench_probe`).

One measured system is the recommender's state in memory or on Redis; the entity cache goes
with it, as `tidegate up` wires them (`open_recommendations` puts the recommender's store on the
change flow's cache URL). For each:

    setup      a fresh database on the private cluster with the shop's tables (the demo shop's
               columns in PostgreSQL types), seeded with the catalogue, the users and a history
               of interactions; the change flow takes them with its initial snapshot
    warm-up    the writer at the measured rate for a few seconds, waited for; the probe users'
               first views
    measured   the writer (its own process) inserts interactions at the rate for the duration,
               one per transaction, while the prober probes; then everything is waited for
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from psycopg2.extras import execute_values  # type: ignore[import-untyped]

from bench.common import BenchmarkError, percentile
from bench.recs_bench_data import Shop, user_id
from bench.recs_bench_probe import Prober, ProbeReport, Recorder
from bench.recs_bench_writer import run_writer
from bench.sync_cpu import CpuWatch
from bench.sync_servers import WRITER_OPTIONS, PostgresServer
from bench.sync_writer import WriterResult
from tidegate.testing import PipelineSettings, SyncConfig, TidegateConfig, open_recommendations, open_sync

SHOP_DDL = """
CREATE TABLE products (
    id text PRIMARY KEY,
    name text NOT NULL,
    description text NOT NULL,
    price numeric NOT NULL,
    stock integer NOT NULL,
    categories text NOT NULL,
    embeddings text NULL,
    updated_at timestamp NOT NULL
);
CREATE TABLE users (
    id text PRIMARY KEY,
    name text NOT NULL,
    country text NOT NULL,
    created_at timestamp NOT NULL
);
CREATE TABLE interactions (
    id bigserial PRIMARY KEY,
    user_id text NOT NULL,
    product_id text NOT NULL,
    kind text NOT NULL CHECK (kind IN ('view', 'add_to_cart', 'purchase')),
    quantity integer NOT NULL DEFAULT 1,
    created_at timestamp NOT NULL
);
CREATE INDEX interactions_user ON interactions (user_id, created_at);
"""
WARMUP_S = 3.0
SNAPSHOT_TIMEOUT_S = 180.0
CATCH_UP_TIMEOUT_S = 60.0
POLL_S = 0.05

Progress = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class FreshPlan:
    """What each system runs."""

    products: int
    users: int
    history: int  # interactions in the database before the change flow starts
    rate_per_s: float
    duration_s: float
    probe_rate_per_s: float
    probe_users: int
    poll_s: float
    gc_freeze: bool = False  # the pipeline's freeze_loaded once the snapshot is applied (tidegate's default)


@dataclass(slots=True)
class FreshResult:
    """Everything measured for one system."""

    store: str
    snapshot_s: float = 0.0
    writer: WriterResult | None = None
    sink_s: list[float] = field(default_factory=list)  # commit → recommender updated, per interaction
    histogram: dict[str, Any] = field(default_factory=dict)  # the RecsSink's own histogram
    probes: ProbeReport = field(default_factory=ProbeReport)
    caught_up_s: float | None = None  # last applied - writer's last commit
    cpu: dict[str, float] = field(default_factory=dict)
    gc: dict[str, float] = field(default_factory=dict)  # full collections while writing (GcPauses)
    gc_frozen: bool = False
    window_s: float = 0.0  # from the first write to the last interaction applied (the CPU's window)
    # redis-server's INFO commandstats over the same window: command -> (calls, µs of server time)
    commands: dict[str, tuple[int, float]] = field(default_factory=dict)

    def cpu_by_process_us(self) -> dict[str, float]:
        """µs of CPU per interaction written, per process: this one (change flow, recommender,
        prober), the writer, PostgreSQL, redis-server and the rest of the machine."""
        if self.writer is None or not self.sink_s:
            return {}
        count = len(self.sink_s)
        used = {"process": self.cpu.get("bench", 0.0) - self.writer.cpu_s, "writer": self.writer.cpu_s,
                "postgres": self.cpu.get("postgres", 0.0), "redis-server": self.cpu.get("redis-server", 0.0),
                "other": self.cpu.get("other", 0.0)}
        return {name: seconds / count * 1e6 for name, seconds in used.items()}

    @property
    def cpu_per_interaction_us(self) -> float | None:
        """CPU of this process (change flow, recommender, prober) per interaction written, in µs:
        less sensitive to the rest of the machine than the latencies."""
        if self.writer is None or not self.sink_s or "bench" not in self.cpu:
            return None
        return (self.cpu["bench"] - self.writer.cpu_s) / len(self.sink_s) * 1e6

    @property
    def probe_share(self) -> float | None:
        """The prober's recommend() calls' wall time summed, over the write time: they share the
        change flow's event loop (over 100 % when calls overlap, waiting on Redis or the CPU)."""
        if self.writer is None or self.writer.seconds <= 0:
            return None
        return sum(self.probes.calls_s) / self.writer.seconds

    def sink_quantiles(self) -> dict[str, float | None]:
        """p50/p99/max of commit → recommender updated, in ms."""
        return _quantiles(self.sink_s)

    def probe_quantiles(self, kind: str | None = None) -> dict[str, float | None]:
        """p50/p99/max of commit → recommend() reflects it, in ms (one kind, or all)."""
        return _quantiles([s.reflected_s for s in self.probes.samples if kind in (None, s.kind)])


def _quantiles(samples_s: Sequence[float]) -> dict[str, float | None]:
    if not samples_s:
        return {"count": 0, "p50_ms": None, "p99_ms": None, "max_ms": None}
    return {"count": len(samples_s), "p50_ms": percentile(samples_s, 0.5),
            "p99_ms": percentile(samples_s, 0.99), "max_ms": max(samples_s) * 1000}


def _seed_database(server: PostgresServer, name: str, shop: Shop, history: int) -> None:
    rng = np.random.default_rng(11)
    with contextlib.closing(server.connect(name)) as conn, conn.cursor() as cur:
        cur.execute(SHOP_DDL)
        execute_values(cur, "INSERT INTO products (id, name, description, price, stock, categories, "
                            "updated_at) VALUES %s",
                       [(*p.row(), "2026-01-01 00:00:00") for p in shop.products], page_size=2000)
        execute_values(cur, "INSERT INTO users (id, name, country, created_at) VALUES %s",
                       [(user_id(n), f"Customer {n}", "United Kingdom", "2026-01-01 00:00:00")
                        for n in range(shop.users)], page_size=2000)
        rows = [(i.user_id, i.item_id, i.kind.value, 1, i.at.replace(tzinfo=None))
                for i in shop.history(history, rng)]
        execute_values(cur, "INSERT INTO interactions (user_id, product_id, kind, quantity, created_at) "
                            "VALUES %s", rows, page_size=2000)
        cur.execute("ANALYZE")


async def _wait_until(done: Callable[[], bool], what: str, timeout_s: float,
                      failed: Callable[[], BaseException | None]) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        if (error := failed()) is not None:
            raise BenchmarkError(f"the change flow stopped while waiting until {what}: {error!r}") from error
        if time.monotonic() > deadline:
            raise BenchmarkError(f"timed out after {timeout_s:.0f} s waiting until {what}")
        await asyncio.sleep(POLL_S)


async def measure(store: str, plan: FreshPlan, server: PostgresServer, redis_url: str | None,
                  pids: dict[str, int], folder: Path, progress: Progress) -> FreshResult:
    """Set up, warm up and measure one system (`store`: memory or redis)."""
    if store == "redis" and redis_url is None:
        raise BenchmarkError("no redis-server was started")
    shop = Shop(plan.products, plan.users)
    name = await asyncio.to_thread(server.create_database)
    try:
        await asyncio.to_thread(_seed_database, server, name, shop, plan.history)
        suffix = uuid.uuid4().hex[:8]
        config = TidegateConfig(sync=SyncConfig(
            source_url=f"postgresql://postgres@127.0.0.1:{server.port}/{name}", bus_url="memory://",
            cache_url="memory://" if store == "memory" else str(redis_url),
            slot=f"recs_{suffix}", publication=f"recs_{suffix}", prefix=f"benchrecs{suffix}",
            heartbeat_s=None, pipeline=PipelineSettings(freeze_loaded=plan.gc_freeze)))
        # The cluster's default is synchronous_commit=off, where a commit reaches the WAL sender
        # only at the WAL writer's next flush (up to 200 ms later): writers turn it on, as
        # bench/sync.py's do (see WRITER_OPTIONS).
        dsn = server.dsn(name, options=WRITER_OPTIONS)
        result = FreshResult(store, gc_frozen=plan.gc_freeze)
        stats = CommandStats(redis_url if store == "redis" else None)
        return await _run(result, plan, shop, config, dsn, pids, stats, folder, progress)
    finally:
        await asyncio.to_thread(server.drop_database, name)


async def _run(result: FreshResult, plan: FreshPlan, shop: Shop, config: TidegateConfig, dsn: str,
               pids: dict[str, int], stats: CommandStats, folder: Path, progress: Progress) -> FreshResult:
    store = result.store
    recorder = Recorder()
    stop = asyncio.Event()
    async with contextlib.AsyncExitStack() as stack:
        recs = await open_recommendations(stack, config, queue=None, cache=None)
        pipeline = await stack.enter_async_context(open_sync(config, sinks=[recs.sink, recorder]))
        started = time.monotonic()
        task = asyncio.create_task(pipeline.run(stop))

        def failed() -> BaseException | None:
            return (task.exception() or BenchmarkError("it ended")) if task.done() else None

        try:
            seeded = plan.products + plan.users + plan.history
            progress(f"{store}: snapshot of {seeded:,} rows")
            await _wait_until(lambda: sum(recorder.snapshot.values()) >= seeded, "the snapshot is applied",
                              SNAPSHOT_TIMEOUT_S, failed)
            result.snapshot_s = time.monotonic() - started
            progress(f"{store}: snapshot applied in {result.snapshot_s:.1f} s; warm-up")
            writer_log = folder / f"writer-{store}.log"
            warm = await run_writer(dsn, writer_log, products=plan.products, users=plan.users,
                                    rate_per_s=plan.rate_per_s, duration_s=WARMUP_S, seed=1)
            await _wait_until(lambda: recorder.streamed >= warm.changes, "the warm-up is applied",
                              CATCH_UP_TIMEOUT_S, failed)
            async with Prober(recs.sink.recommender, recorder, dsn, shop.popular(500), users=plan.probe_users,
                              rate_per_s=plan.probe_rate_per_s, poll_s=plan.poll_s) as prober:
                await prober.prepare(CATCH_UP_TIMEOUT_S)
                await _measured(result, plan, recorder, prober, dsn, writer_log, pids, stats, failed,
                                progress)
            result.histogram = _histogram(recs.sink.monitor.freshness())
        finally:
            stop.set()
            await asyncio.wait({task}, timeout=30)
            if not task.done():
                task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    return result


async def _measured(result: FreshResult, plan: FreshPlan, recorder: Recorder, prober: Prober, dsn: str,
                    writer_log: Path, pids: dict[str, int], stats: CommandStats,
                    failed: Callable[[], BaseException | None], progress: Progress) -> None:
    progress(f"{result.store}: {plan.rate_per_s:,.0f} interactions/s for {plan.duration_s:.0f} s, "
             f"{plan.probe_rate_per_s:g} probes/s")
    recorder.new_window()
    base = recorder.streamed
    done_probing = asyncio.Event()
    probing = asyncio.create_task(prober.run(done_probing))
    watch = CpuWatch(trees=pids)
    watch.start()
    await stats.start()
    started = time.monotonic()
    pauses = GcPauses()
    try:
        writer = await run_writer(dsn, writer_log, products=plan.products, users=plan.users,
                                  rate_per_s=plan.rate_per_s, duration_s=plan.duration_s, seed=2)
    finally:
        done_probing.set()
        await probing
        result.gc = pauses.stop()
    report = prober.report
    probes = len(report.samples) + sum(report.timeouts.values())
    written = writer.changes + probes
    await _wait_until(lambda: recorder.streamed - base >= written, "every interaction is applied",
                      CATCH_UP_TIMEOUT_S, failed)
    result.cpu = watch.stop()
    result.window_s = time.monotonic() - started
    result.commands = await stats.stop()
    result.writer = writer
    result.sink_s = list(recorder.latencies_s)
    result.probes = prober.report
    result.caught_up_s = max(recorder.last_applied_s - writer.ended, 0.0)


class CommandStats:
    """redis-server's INFO commandstats between `start()` and `stop()` (nothing without a URL):
    which commands and scripts the server spent its time on."""

    def __init__(self, url: str | None) -> None:
        self.url = url
        self._before: dict[str, tuple[int, float]] = {}

    async def _read(self) -> dict[str, tuple[int, float]]:
        if self.url is None:
            return {}
        import redis.asyncio as aioredis

        client = aioredis.from_url(self.url)
        try:
            info = await client.info("commandstats")
        finally:
            await client.aclose()
        return {name.removeprefix("cmdstat_"): (int(v["calls"]), float(v["usec"]))
                for name, v in info.items()}

    async def start(self) -> None:
        """Take the first reading."""
        self._before = await self._read()

    async def stop(self) -> dict[str, tuple[int, float]]:
        """Calls and µs of server time per command since `start()`, the costliest first."""
        after = await self._read()
        used = {}
        for name, (calls, usec) in after.items():
            calls_before, usec_before = self._before.get(name, (0, 0.0))
            used[name] = (calls - calls_before, usec - usec_before)
        return dict(sorted(((n, v) for n, v in used.items() if v[0]), key=lambda kv: -kv[1][1]))


class GcPauses:
    """The full (generation 2) collections of this process from now until `stop()`: each one
    stops the event loop, pipeline and recommender together, for as long as it walks every
    container object the process holds."""

    def __init__(self) -> None:
        self._started = 0.0
        self.pauses_s: list[float] = []
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if info.get("generation") != 2:
            return
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.pauses_s.append(time.perf_counter() - self._started)

    def stop(self) -> dict[str, float]:
        """How many, the longest and the total, in ms."""
        gc.callbacks.remove(self._callback)
        pauses = self.pauses_s
        return {"count": len(pauses), "max_ms": max(pauses, default=0.0) * 1000,
                "total_ms": sum(pauses) * 1000}


def _histogram(quantiles: Any) -> dict[str, Any]:
    return {"count": quantiles.count, "p50_ms": quantiles.p50_ms, "p99_ms": quantiles.p99_ms}
