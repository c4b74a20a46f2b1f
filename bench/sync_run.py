"""One measured system of the change-flow benchmark: a fresh database, the pipeline process on
the system's bus and cache, then the two phases and the raw decode limit on the same backlog.

    warm-up    a short burst at the phase-1 rate, waited for (connections, topics, code paths)
    phase 1    the writer at a fixed rate (open loop) for a fixed time; every streamed change's
               commit → cache latency, and how long after the writer's last commit the
               pipeline had applied everything
    phase 2    the pipeline's source is held back while the writer commits a backlog as fast as
               it can; then released: the drain rate is backlog / (time the last change was
               applied - release)
    raw        pg_recvlogical (pgoutput, the same publication) from a slot created just before
               the backlog, to the backlog's end: the server's decode and send rate, the limit
               any client of the slot has
    verify     the cache against the database, row by row
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.common import BenchmarkError, check_count
from bench.sync_cpu import CpuWatch, SleeperProbe
from bench.sync_pipeline import PipelineProcess
from bench.sync_servers import (
    REPO_ROOT,
    SEED_ROWS,
    TABLE,
    Database,
    PostgresServer,
    create_database,
    drop_database,
    pg_recvlogical,
)
from bench.sync_writer import WriterResult, run_writer

WARMUP_CHANGES = 1_000
SNAPSHOT_TIMEOUT_S = 60.0
CATCH_UP_TIMEOUT_S = 60.0
PIPELINE_APP = "tidegate-sync"  # application_name of the source's replication connection
RAW_APP = "pg_recvlogical"

Progress = Callable[[str], None]  # one line of progress for the console


@dataclass(frozen=True, slots=True)
class SystemSpec:
    """A bus and a cache to measure, by key (`memory:memory` is bus memory, cache memory)."""

    bus: str
    cache: str

    @property
    def key(self) -> str:
        """`bus:cache`."""
        return f"{self.bus}:{self.cache}"

    @classmethod
    def parse(cls, key: str) -> SystemSpec:
        """`memory`, `redis`, `kafka`, optionally `:memory` or `:redis` for the cache (by default
        the bus's own kind, Redis for Kafka)."""
        bus, _, cache = key.partition(":")
        if bus not in ("memory", "redis", "kafka"):
            raise ValueError(f"unknown bus {bus!r}: memory, redis or kafka")
        cache = cache or ("memory" if bus == "memory" else "redis")
        if cache not in ("memory", "redis"):
            raise ValueError(f"unknown cache {cache!r}: memory or redis")
        return cls(bus, cache)


@dataclass(frozen=True, slots=True)
class Plan:
    """What each system runs."""

    rate_per_s: float
    duration_s: float
    backlog: int
    drain_timeout_s: float
    profile_dir: Path | None = None  # pipeline processes run under cProfile, stats written here
    plain_loop: bool = False  # pipeline processes on asyncio's loop and default collector


@dataclass(frozen=True, slots=True)
class Urls:
    """Where the shared servers listen (None: not started, no system needs it)."""

    redis: str | None
    kafka: str | None
    pids: Mapping[str, int]  # server process trees to meter: postgres, redis-server, tansu


@dataclass(slots=True)
class SystemResult:
    """Everything measured for one system."""

    spec: SystemSpec
    steady_writer: WriterResult | None = None
    steady: dict[str, Any] = field(default_factory=dict)  # the recorder's report
    steady_cpu: dict[str, float] = field(default_factory=dict)
    steady_stall: dict[str, float] = field(default_factory=dict)  # SleeperProbe during phase 1
    caught_up_s: float | None = None  # last applied - writer's last commit (None: never)
    backlog_writer: WriterResult | None = None
    drain: dict[str, Any] = field(default_factory=dict)
    drain_cpu: dict[str, float] = field(default_factory=dict)
    drained: int = 0
    raw_seconds: float | None = None
    raw_cpu: dict[str, float] = field(default_factory=dict)
    verified: dict[str, Any] = field(default_factory=dict)
    profile: Path | None = None

    @property
    def drain_seconds(self) -> float | None:
        """Release → last backlog change applied (None: the drain did not finish)."""
        reached, started = self.drain.get("reached"), self.drain.get("window_started")
        return reached - started if reached is not None and started is not None else None

    @property
    def drain_rate(self) -> float | None:
        """Backlog changes per second (over what was applied when the drain did not finish)."""
        seconds = self.drain_seconds
        if seconds:
            return self.drained / seconds
        last, started = self.drain.get("last_applied"), self.drain.get("window_started")
        return self.drain.get("count", 0) / (last - started) if last and started and last > started else None

    @property
    def raw_rate(self) -> float | None:
        """pg_recvlogical's changes per second over the backlog."""
        return self.drained / self.raw_seconds if self.raw_seconds and self.drained else None


def _bus_url(spec: SystemSpec, urls: Urls) -> str:
    url = {"memory": "memory://", "redis": urls.redis, "kafka": urls.kafka}[spec.bus]
    if url is None:
        raise BenchmarkError(f"no {spec.bus} server was started")
    return url


def _cache_url(spec: SystemSpec, urls: Urls) -> str:
    url = "memory://" if spec.cache == "memory" else urls.redis
    if url is None:
        raise BenchmarkError("no redis-server was started")
    return url


@contextlib.asynccontextmanager
async def _pipeline(spec: SystemSpec, urls: Urls, database: Database, folder: Path,
                    profile: Path | None, plain_loop: bool) -> AsyncIterator[PipelineProcess]:
    argv = ["--source-url", database.url, "--dsn", database.dsn, "--bus-url", _bus_url(spec, urls),
            "--cache-url", _cache_url(spec, urls), "--slot", database.slot,
            "--publication", database.publication, "--prefix", f"bench{database.suffix}",
            "--table", TABLE]
    if profile is not None:
        argv += ["--profile", str(profile)]
    if plain_loop:
        argv += ["--plain-loop"]
    log_path = folder / f"pipeline-{spec.bus}-{spec.cache}.log"
    async with PipelineProcess.running(argv, log_path, REPO_ROOT) as pipeline:
        if not await pipeline.wait_until(lambda: pipeline.snapshot >= SEED_ROWS,
                                         "the snapshot is applied", SNAPSHOT_TIMEOUT_S):
            raise pipeline.failure(f"the snapshot ({SEED_ROWS} rows) was not applied in time")
        yield pipeline


async def _caught_up(pipeline: PipelineProcess, base: int, changes: int, timeout_s: float) -> bool:
    return await pipeline.wait_until(lambda: pipeline.streamed - base >= changes,
                                     f"{changes} changes are applied", timeout_s)


def _watch(urls: Urls, pipeline: PipelineProcess, database: Database) -> CpuWatch:
    walsender = database.walsender_pid(PIPELINE_APP)
    return CpuWatch(trees={"pipeline": pipeline.pid, **urls.pids},
                    singles={"walsender": walsender} if walsender is not None else {})


async def measure(spec: SystemSpec, plan: Plan, server: PostgresServer, urls: Urls, folder: Path,
                  progress: Progress) -> SystemResult:
    """Run the warm-up, both phases, the raw decode and the check for one system."""
    result = SystemResult(spec)
    database = await asyncio.to_thread(create_database, server)
    writer_log = folder / f"writer-{spec.bus}-{spec.cache}.log"
    profile = plan.profile_dir / f"pipeline-{spec.bus}-{spec.cache}.prof" if plan.profile_dir else None
    try:
        async with _pipeline(spec, urls, database, folder, profile, plan.plain_loop) as pipeline:
            progress(f"{spec.key}: snapshot of {SEED_ROWS:,} rows applied; warm-up")
            base = (await pipeline.request("window"))["base"]
            warm = await run_writer(database.writer_dsn, writer_log, rate_per_s=plan.rate_per_s,
                                    changes=WARMUP_CHANGES, seed=1)
            if not await _caught_up(pipeline, base, warm.changes, CATCH_UP_TIMEOUT_S):
                raise pipeline.failure("the warm-up changes were not applied in time")

            await _steady(result, plan, pipeline, database, urls, writer_log, progress)
            await _backlog(result, plan, pipeline, database, urls, writer_log, progress)
            progress(f"{spec.key}: checking the cache against the database")
            result.verified = await pipeline.request("verify")
        if profile is not None:
            result.profile = profile
        await _raw(result, database, server, urls, progress)
    finally:
        await asyncio.to_thread(drop_database, database)
    return result


async def _steady(result: SystemResult, plan: Plan, pipeline: PipelineProcess, database: Database,
                  urls: Urls, writer_log: Path, progress: Progress) -> None:
    progress(f"{result.spec.key}: phase 1, {plan.rate_per_s:,.0f} changes/s for {plan.duration_s:.0f} s")
    base = (await pipeline.request("window"))["base"]
    watch, probe = _watch(urls, pipeline, database), SleeperProbe()
    watch.start()
    probe.start()
    writer = await run_writer(database.writer_dsn, writer_log, rate_per_s=plan.rate_per_s,
                              duration_s=plan.duration_s, seed=2)
    result.steady_stall = probe.stop()
    # Phase 2 counts from its own start: whatever phase 1 left behind must be applied first.
    if not await _caught_up(pipeline, base, writer.changes, CATCH_UP_TIMEOUT_S + plan.drain_timeout_s):
        raise pipeline.failure(f"phase 1's {writer.changes:,} changes were not all applied "
                               f"{CATCH_UP_TIMEOUT_S + plan.drain_timeout_s:.0f} s after the writer stopped")
    result.steady_cpu = watch.stop()
    result.steady_writer = writer
    result.steady = await pipeline.request("report")
    check_count(result.spec.key, "phase 1", "changes applied", writer.changes,
                min(result.steady["count"], writer.changes))
    result.caught_up_s = max(result.steady["last_applied"] - writer.ended, 0.0)


async def _backlog(result: SystemResult, plan: Plan, pipeline: PipelineProcess, database: Database,
                   urls: Urls, writer_log: Path, progress: Progress) -> None:
    progress(f"{result.spec.key}: phase 2, a backlog of {plan.backlog:,} changes")
    await pipeline.request("pause")
    await asyncio.to_thread(database.query, "SELECT pg_create_logical_replication_slot(%s, 'pgoutput')",
                            database.raw_slot)
    writer = await run_writer(database.writer_dsn, writer_log, changes=plan.backlog, seed=3)
    result.backlog_writer = writer
    result.drained = writer.changes
    end_lsn = await asyncio.to_thread(database.current_lsn)
    progress(f"{result.spec.key}: backlog written at {writer.rate:,.0f} changes/s; draining")
    watch = _watch(urls, pipeline, database)
    watch.start()
    base = (await pipeline.request("resume", target=writer.changes))["base"]
    done = await _caught_up(pipeline, base, writer.changes, plan.drain_timeout_s)
    result.drain_cpu = watch.stop()
    result.drain = await pipeline.request("report")
    result.drain["end_lsn"] = end_lsn
    if not done:
        progress(f"{result.spec.key}: the drain did not finish within {plan.drain_timeout_s:.0f} s")
        # The rest must still be applied before the cache can be checked against the database.
        if not await _caught_up(pipeline, base, writer.changes, plan.drain_timeout_s):
            raise pipeline.failure("the backlog was not applied even after twice the drain timeout")


async def _raw(result: SystemResult, database: Database, server: PostgresServer, urls: Urls,
               progress: Progress) -> None:
    """pg_recvlogical over the backlog, alone on the machine (the pipeline has stopped)."""
    progress(f"{result.spec.key}: pg_recvlogical over the same backlog")
    argv = [str(pg_recvlogical(server)), "--start", "--no-loop", "-S", database.raw_slot,
            "-d", database.name, "-h", "127.0.0.1", "-p", str(server.port), "-U", "postgres",
            "--endpos", str(result.drain["end_lsn"]), "-f", "/dev/null",
            "-o", "proto_version=1", "-o", f"publication_names={database.publication}"]
    watch = CpuWatch(trees=dict(urls.pids))
    watch.start()
    started = time.monotonic()
    process = await asyncio.create_subprocess_exec(
        *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE, env={"PGAPPNAME": RAW_APP, "PATH": "/usr/bin:/bin"})
    _, stderr = await process.communicate()
    result.raw_seconds = time.monotonic() - started
    result.raw_cpu = watch.stop()
    if process.returncode != 0:
        raise BenchmarkError(f"pg_recvlogical exited with {process.returncode}: {stderr.decode().strip()}")
