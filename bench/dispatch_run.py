"""One run of the dispatch benchmark: workers, load, drain, and the check that nothing was lost.

A run (`run_mode`) starts the workers on a fresh queue, lets `VirtualUsers` send the nominal and
overload phases, gives the backlog at most `drain_s` to drain, stops the workers gracefully,
cancels whatever is still unfinished (counted as "cut", never silently dropped) and then reads
every job it enqueued back from the queue: each must be in a final state, and the queue must be
empty, or the run fails with BenchmarkError.

`run_ceiling` measures something else: how many jobs per second the dispatch path (queue, worker,
HTTP client, simulator) completes on this machine with no rate limit, to compare with the seed's
"847 req/s".
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

from bench.common import BenchmarkError
from bench.dispatch_load import Arrival, Clock, DepthSample, DepthSampler, LoopLag, VirtualUsers
from bench.dispatch_scenario import Scenario
from bench.dispatch_sim import SimHandle
from bench.machine import CpuMeter
from tidegate import Job, JobState, Priority, Queue
from tidegate.testing import (
    DispatchMetrics,
    Given,
    Timings,
    Worker,
    WorkerSettings,
    open_worker_parts,
    rate_limiter_for,
    result_of,
)

Mode = Literal["priority", "fifo"]
T = TypeVar("T")

START_DELAY_S = 0.5  # every user task is created and waiting before the first arrival
DRAIN_POLL_S = 0.25
FETCH_CHUNK = 256  # jobs read (or cancelled) concurrently when settling a run
WORKER_LEASE_S = 30.0
WORKER_GRACE_S = 5.0
_TICKS_PER_S = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True, slots=True)
class JobOutcome:
    """What became of one request. Times are load-relative seconds (see `Clock`)."""

    arrival: Arrival
    state: JobState
    created_s: float
    finished_s: float  # for a cut job: when the benchmark cancelled it
    queue_wait_ms: float | None  # claim - claimable, as the worker recorded it (succeeded only)
    upstream_ms: float | None  # the provider call, as the worker timed it (succeeded only)
    attempts: int
    cut: bool  # cancelled by the benchmark because the drain ran out of time

    @property
    def end_to_end_ms(self) -> float:
        """Enqueue → final state, from the queue's own timestamps."""
        return (self.finished_s - self.created_s) * 1000.0


@dataclass(frozen=True, slots=True)
class CpuUse:
    """CPU time over a run, in core-seconds, by whom."""

    wall_s: float
    own_s: float  # this process: load generator, workers, queue client (and an in-process sim)
    helpers_s: dict[str, float]  # simulator subprocess, redis-server
    other_s: float  # everything else on the machine

    def share(self, seconds: float) -> str:
        """`84 %` of one core over the run."""
        return f"{100 * seconds / self.wall_s:.0f} %" if self.wall_s > 0 else "n/a"


@dataclass(slots=True)
class ModeResult:
    """One run of one mode, with everything the report needs."""

    mode: Mode
    outcomes: list[JobOutcome]
    samples: list[DepthSample]
    lags: list[tuple[float, float]]
    failures: list[str]
    drain_end_s: float
    drained: bool  # the backlog emptied before drain_s ran out
    sim_stats: dict[str, Any]
    cpu: CpuUse
    worker_counts: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class CeilingResult:
    """Completions per second of the unlimited dispatch path over a measured window."""

    rate_per_s: float
    window_s: float
    concurrency: int
    upstream_p50_ms: float
    ran_dry: bool  # the prefilled queue emptied inside the window: the figure is a lower bound
    cut: int
    cpu: CpuUse


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process from /proc (0.0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()  # after the parenthesised name
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _TICKS_PER_S


class _CpuWatch:
    """Readings of this process, its helpers and the machine at the start and end of a run."""

    def __init__(self, helpers: dict[str, int]) -> None:
        self._helpers = helpers
        self._meter = CpuMeter(pids=tuple(helpers.values()))
        self._own = 0.0
        self._helper_start: dict[str, float] = {}

    def start(self) -> None:
        self._meter.start()
        times = os.times()
        self._own = times.user + times.system
        self._helper_start = {name: process_cpu_s(pid) for name, pid in self._helpers.items()}

    def stop(self) -> CpuUse:
        self._meter.stop()
        times = os.times()
        return CpuUse(
            wall_s=self._meter.wall_s,
            own_s=times.user + times.system - self._own,
            helpers_s={name: process_cpu_s(pid) - self._helper_start[name]
                       for name, pid in self._helpers.items()},
            other_s=self._meter.other_s,
        )


def _worker_settings(scenario: Scenario, index: int, concurrency: int | None = None) -> WorkerSettings:
    return WorkerSettings(
        worker_id=f"bench-worker-{index}",
        concurrency=concurrency or scenario.concurrency,
        urgent_reserve=scenario.urgent_reserve,
        lease_s=WORKER_LEASE_S,
        shutdown_grace_s=WORKER_GRACE_S,
    )


@contextlib.asynccontextmanager
async def _running_workers(queue: Queue, queue_url: str, scenario: Scenario, sim: SimHandle, *,
                           count: int, limited: bool = True, concurrency: int | None = None,
                           ) -> AsyncIterator[DispatchMetrics]:
    """`count` workers on this loop sharing one limiter (as processes on one host share the
    Redis limiter), stopped gracefully when the block ends; a worker that crashed re-raises."""
    config = scenario.tidegate_config(sim.base_url, queue_url, limited=limited, concurrency=concurrency)
    metrics = DispatchMetrics()
    # A limiter name of its own per run: a Redis limiter's state outlives the run by a minute.
    limiter = rate_limiter_for(queue_url, name=f"bench-{uuid.uuid4().hex[:8]}")
    async with limiter, contextlib.AsyncExitStack() as stack:
        workers = []
        for i in range(count):
            # Parts of its own, as a worker process has (its upstream pool), the limiter shared.
            parts = await stack.enter_async_context(open_worker_parts(config, queue, Given(pacing=limiter)))
            workers.append(await stack.enter_async_context(
                Worker(parts, config, _worker_settings(scenario, i, concurrency), metrics=metrics)))
        tasks = [asyncio.create_task(w.run(), name=f"worker-{i}") for i, w in enumerate(workers)]
        try:
            yield metrics
        finally:
            for worker in workers:
                worker.request_stop()
            await asyncio.gather(*tasks)


async def run_mode(scenario: Scenario, mode: Mode, queue_url: str, sim: SimHandle,
                   helpers: dict[str, int]) -> ModeResult:
    """Nominal then overload load through a fresh queue, a bounded drain, and the final check."""
    await sim.reset()
    watch = _CpuWatch(helpers)
    async with Queue.from_url(queue_url) as queue:
        clock = Clock.starting_in(START_DELAY_S)
        load = VirtualUsers(scenario, queue, clock, fifo=mode == "fifo")
        sampler, lag = DepthSampler(queue, clock), LoopLag(clock)
        observers = [asyncio.create_task(sampler.run()), asyncio.create_task(lag.run())]
        try:
            async with _running_workers(queue, queue_url, scenario, sim, count=scenario.workers) as metrics:
                watch.start()
                await load.run()
                drained = await _drain(queue, clock, scenario.load_s + scenario.drain_s)
            cpu = watch.stop()  # after the workers stopped: their graceful drain is part of the run
            drain_end_s = clock.now()
        finally:
            for task in observers:
                task.cancel()
            ended = await asyncio.gather(*observers, return_exceptions=True)
        # A sampler that died early would leave a depth table with holes: say so, do not print it.
        crashed = [repr(e) for e in ended if isinstance(e, Exception)]
        if crashed:
            raise BenchmarkError(f"{mode}: an observer failed: {crashed[0]}")
        outcomes = await _settle(queue, load.arrivals, clock)
        await _check_empty(queue, mode)
        sim_stats = await sim.stats()
    return ModeResult(
        mode=mode, outcomes=outcomes, samples=sampler.samples, lags=lag.lags, failures=load.failures,
        drain_end_s=drain_end_s, drained=drained, sim_stats=sim_stats, cpu=cpu,
        worker_counts=_worker_counts(metrics),
    )


async def _drain(queue: Queue, clock: Clock, until_s: float) -> bool:
    """Wait until nothing waits, is parked or is leased, or until `until_s`; True if drained."""
    while clock.now() < until_s:
        stats = await queue.stats()
        if stats.depth == 0 and stats.delayed == 0 and stats.in_flight == 0:
            return True
        await asyncio.sleep(DRAIN_POLL_S)
    return False


async def _in_chunks(items: Sequence[T], call: Callable[[T], Awaitable[Any]]) -> list[Any]:
    """`call` on every item, FETCH_CHUNK at a time: concurrency for Redis, bounded memory."""
    out: list[Any] = []
    for start in range(0, len(items), FETCH_CHUNK):
        out.extend(await asyncio.gather(*(call(item) for item in items[start:start + FETCH_CHUNK])))
    return out


async def _settle(queue: Queue, arrivals: Sequence[Arrival], clock: Clock) -> list[JobOutcome]:
    """Read every job back; cancel the unfinished ones (the drain's cut); fail on any job that
    is missing or still not final afterwards."""
    jobs: list[Job | None] = await _in_chunks([a.job_id for a in arrivals], queue.get)
    unfinished = [a.job_id for a, job in zip(arrivals, jobs, strict=True)
                  if job is not None and not job.is_final]
    cut = set(unfinished)
    await _in_chunks(unfinished, queue.cancel)
    if cut:
        again = dict(zip(unfinished, await _in_chunks(unfinished, queue.get), strict=True))
        jobs = [again.get(a.job_id, job) for a, job in zip(arrivals, jobs, strict=True)]
    lost = [a.job_id for a, job in zip(arrivals, jobs, strict=True) if job is None]
    stuck = [f"{job.id}={job.state}" for job in jobs if job is not None and not job.is_final]
    if lost or stuck:
        raise BenchmarkError(f"{len(lost)} enqueued jobs are missing ({lost[:5]}) and {len(stuck)} "
                             f"are not final after the cut ({stuck[:5]})")
    return [_outcome(a, job, clock, a.job_id in cut and job.state is JobState.CANCELLED)
            for a, job in zip(arrivals, jobs, strict=True) if job is not None]


def _outcome(arrival: Arrival, job: Job, clock: Clock, cut: bool) -> JobOutcome:
    result = result_of(job) if job.state is JobState.SUCCEEDED else None
    timings = Timings() if result is None else result.timings
    finished = job.finished_at.timestamp() if job.finished_at is not None else time.time()
    return JobOutcome(
        arrival=arrival,
        state=job.state,
        created_s=clock.relative(job.created_at.timestamp()),
        finished_s=clock.relative(finished),
        queue_wait_ms=timings.queue_wait_ms,
        upstream_ms=timings.upstream_latency_ms,
        attempts=job.attempts,
        cut=cut,
    )


async def _check_empty(queue: Queue, what: str) -> None:
    stats = await queue.stats()
    if stats.depth or stats.delayed or stats.in_flight:
        raise BenchmarkError(f"{what}: the queue is not empty after the run: {stats.depth} waiting, "
                             f"{stats.delayed} delayed, {stats.in_flight} leased")


def _worker_counts(metrics: DispatchMetrics) -> dict[str, float]:
    """The workers' own counters: parked by pacing, 429s, retried and dead attempts."""
    def total(name: str, **labels: str) -> float:
        value = 0.0
        for family in metrics.registry.collect():
            for sample in family.samples:
                if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                    value += sample.value
        return value

    return {
        "parked (pacing)": total("tidegate_jobs_deferred_total", reason="rate_limit"),
        "429 answers": total("tidegate_upstream_429_total"),
        "retried attempts": total("tidegate_jobs_total", outcome="retried"),
        "dead": total("tidegate_jobs_total", outcome="dead"),
        "succeeded": total("tidegate_jobs_total", outcome="succeeded"),
    }


async def run_ceiling(scenario: Scenario, queue_url: str, sim: SimHandle, helpers: dict[str, int], *,
                      jobs: int, warmup_s: float, window_s: float, concurrency: int) -> CeilingResult:
    """Prefill `jobs` jobs, lift every rate limit, and count completions per second over
    `window_s` after `warmup_s`; then cancel the rest and check that every job is final."""
    await sim.reset()
    await sim.configure({"defaults": {"rpm": None}})
    watch = _CpuWatch(helpers)
    try:
        async with Queue.from_url(queue_url) as queue:
            clock = Clock.starting_in(0.0)
            specs = [{"payload": scenario.chat_payload(n % scenario.users, n), "priority": Priority.BULK,
                      "tenant": f"tenant-{n % scenario.tenants:02d}"} for n in range(jobs)]
            ids: list[str] = []
            for start in range(0, jobs, 1000):
                ids.extend(await queue.enqueue_many(specs[start:start + 1000]))
            async with _running_workers(queue, queue_url, scenario, sim, count=scenario.workers,
                                        limited=False, concurrency=concurrency) as metrics:
                await asyncio.sleep(warmup_s)
                watch.start()
                before = _worker_counts(metrics)["succeeded"]
                await asyncio.sleep(window_s)
                done = _worker_counts(metrics)["succeeded"] - before
                cpu = watch.stop()
                ran_dry = (await queue.stats()).depth == 0
            arrivals = [Arrival(job_id, Priority.BULK, Priority.BULK, "", "ceiling", 0.0, 0.0)
                        for job_id in ids]
            outcomes = await _settle(queue, arrivals, clock)
            await _check_empty(queue, "ceiling")
    finally:
        await sim.configure({"defaults": {"rpm": scenario.provider_limit}})
    upstream = sorted(o.upstream_ms for o in outcomes if o.upstream_ms is not None)
    return CeilingResult(
        rate_per_s=done / window_s, window_s=window_s, concurrency=concurrency,
        upstream_p50_ms=upstream[len(upstream) // 2] if upstream else float("nan"),
        ran_dry=ran_dry, cut=sum(o.cut for o in outcomes), cpu=cpu,
    )


__all__ = ["CeilingResult", "CpuUse", "JobOutcome", "Mode", "ModeResult", "process_cpu_s", "run_ceiling",
           "run_mode"]
