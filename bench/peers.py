"""The peers on the benchmark's Redis: SAQ, arq and RQ, each on the same two paths as tidegate.

- single: the producer enqueues one job per call, one call at a time (no batching, no
  concurrency on the producer side), while the peer's worker runs.
- batched: the producer enqueues in batches of `batch` with the peer's batch API where it has
  one (RQ `enqueue_many`), else `batch` enqueues in flight at once (SAQ, arq have no batch API).

The clock runs from the first enqueue until the peer has recorded the last job as finished. A
warm-up of a few jobs runs first on the same worker so that script loading, connection set-up
and imports are not timed. Every run is checked: each job ran exactly once and the peer's own
accounting agrees.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from bench.common import SINGLE, BenchmarkError, Result, check_count
from bench.peer_jobs import TALLY

REPO_ROOT = Path(__file__).resolve().parent.parent
WAIT_TIMEOUT_S = 120.0  # a run slower than this is broken, not slow
SETTLE_POLL_S = 0.001  # in-process checks, only once the last job ran
RQ_POLL_S = 0.01  # RQ: a read from another thread; sparse, so it steals little CPU from the run


@dataclass(frozen=True, slots=True)
class PeerSettings:
    """Each peer's fastest reasonable configuration on this machine (see BENCHMARKS.md).

    saq_concurrency: `Worker(concurrency=…)`, jobs processed at once (default 10).
    saq_max_concurrent_ops: `RedisQueue(max_concurrent_ops=…)`, its cap on concurrent enqueues
        and job reads (default 20).
    arq_max_jobs: `Worker(max_jobs=…)`, jobs run at once (default 10).
    arq_poll_delay_s: `Worker(poll_delay=…)`, sleep between polls of the queue (default 0.5 s);
        arq polls rather than blocks, so this bounds its latency.
    arq_enqueue_concurrency: `enqueue_job` calls in flight in the batched path.
    rq_workers: `SimpleWorker` processes (RQ scales by processes, one job at a time each).
    """

    # Chosen by sweeping each knob on this 2-core machine (medians of 3 runs of 3,000 jobs):
    # SAQ peaks at ~50 slots with 100 ops (10/20 → -20%, 100-200 slots → no better); arq needs a
    # short poll delay (the default 0.5 s with max_jobs 10 caps it at ~200 jobs/s) and is flat
    # from 200 jobs on; RQ gains ~1.5x from a second process on two cores.
    saq_concurrency: int = 50
    saq_max_concurrent_ops: int = 100
    arq_max_jobs: int = 200
    arq_poll_delay_s: float = 0.01
    arq_enqueue_concurrency: int = 100
    rq_workers: int = 2


def _chunks(count: int, size: int) -> list[range]:
    return [range(start, min(start + size, count)) for start in range(0, count, size)]


async def _gather_bounded(calls: Sequence[Callable[[], Awaitable[object]]], limit: int) -> list[object]:
    """Run the calls concurrently, at most `limit` at a time (one connection each)."""
    gate = asyncio.Semaphore(limit)

    async def one(call: Callable[[], Awaitable[object]]) -> object:
        async with gate:
            return await call()

    return await asyncio.gather(*(one(call) for call in calls))


async def _settle(what: str, done: Callable[[], bool], timeout_s: float = WAIT_TIMEOUT_S) -> None:
    """Wait until `done()`; used after the last job ran, for the peer to finish its bookkeeping."""
    deadline = time.monotonic() + timeout_s
    while not done():
        if time.monotonic() > deadline:
            raise BenchmarkError(f"timed out waiting for {what}")
        await asyncio.sleep(SETTLE_POLL_S)


async def _settle_async(what: str, done: Callable[[], Awaitable[object]]) -> None:
    """Like `_settle`, for a condition that needs a round trip to check."""
    deadline = time.monotonic() + WAIT_TIMEOUT_S
    while not await done():
        if time.monotonic() > deadline:
            raise BenchmarkError(f"timed out waiting for {what}")
        await asyncio.sleep(SETTLE_POLL_S)


async def _wait_tally(system: str, path: str) -> None:
    assert TALLY.done is not None
    try:
        await asyncio.wait_for(TALLY.done.wait(), WAIT_TIMEOUT_S)
    except TimeoutError:
        raise BenchmarkError(
            f"{system} {path}: only {TALLY.count} of {TALLY.expected} jobs ran in {WAIT_TIMEOUT_S}s"
        ) from None


def _check_tally(system: str, path: str, jobs: int) -> None:
    check_count(system, path, "jobs run", jobs, TALLY.count)
    check_count(system, path, "distinct jobs run", jobs, len(TALLY.seen))


# ---------------------------------------------------------------------------------------- SAQ


async def run_saq(url: str, path: str, jobs: int, batch: int, warmup: int, settings: PeerSettings) -> Result:
    """SAQ: `Queue.enqueue` per job; a `Worker` with `concurrency` slots in this event loop."""
    from saq import Worker
    from saq.queue.redis import RedisQueue

    from bench.peer_jobs import saq_noop

    name = f"bench-{uuid.uuid4().hex[:8]}"
    ops = settings.saq_max_concurrent_ops
    producer = RedisQueue.from_url(url, name=name, max_concurrent_ops=ops)
    worker_queue = RedisQueue.from_url(url, name=name, max_concurrent_ops=ops)
    worker = Worker(worker_queue, functions=[saq_noop], concurrency=settings.saq_concurrency)
    await producer.connect()
    await worker_queue.connect()
    worker_task = asyncio.create_task(worker.start())

    async def produce(numbers: range) -> None:
        if path == SINGLE:
            for n in numbers:
                await producer.enqueue("saq_noop", n=n)
        else:
            for chunk in _chunks(len(numbers), batch):
                await _gather_bounded(
                    [partial(producer.enqueue, "saq_noop", n=numbers[i]) for i in chunk],
                    len(chunk),  # SAQ's own max_concurrent_ops is the cap that matters
                )

    try:
        # The worker sweeps its queue as it starts; a job dequeued while that sweep runs, before
        # it is marked active, is "swept", retried and so runs twice (SAQ is at-least-once).
        # Let the first sweep finish (it leaves its lock key behind) before any job goes in.
        await _settle_async("saq start-up sweep", lambda: producer.redis.exists(f"saq:{name}:sweep"))
        seconds = await _timed_in_loop(
            "saq", path, jobs, warmup, produce, lambda total: worker_queue.complete >= total
        )
        check_count("saq", path, "jobs SAQ recorded complete", warmup + jobs, worker_queue.complete)
        check_count("saq", path, "jobs SAQ recorded failed", 0, worker_queue.failed)
        check_count("saq", path, "jobs left queued", 0, await worker_queue.count("queued"))
        check_count("saq", path, "jobs left active", 0, await worker_queue.count("active"))
    finally:
        await worker.stop()
        await worker_task
        await producer.disconnect()
        await worker_queue.disconnect()
    return Result("saq", path, jobs, seconds)


# ---------------------------------------------------------------------------------------- arq


async def run_arq(url: str, path: str, jobs: int, batch: int, warmup: int, settings: PeerSettings) -> Result:
    """arq: `ArqRedis.enqueue_job` per job (arq has no batch enqueue); a polling `Worker`."""
    from arq import Worker, create_pool
    from arq.connections import RedisSettings

    from bench.peer_jobs import arq_noop

    name = f"bench-{uuid.uuid4().hex[:8]}"
    redis_settings = RedisSettings.from_dsn(url)
    producer = await create_pool(redis_settings, default_queue_name=name)
    worker = Worker(
        functions=[arq_noop],
        queue_name=name,
        redis_settings=redis_settings,
        max_jobs=settings.arq_max_jobs,
        poll_delay=settings.arq_poll_delay_s,
        handle_signals=False,  # the benchmark owns the process; close() stops the worker
    )
    worker_task = asyncio.create_task(worker.async_run())

    async def produce(numbers: range) -> None:
        if path == SINGLE:
            for n in numbers:
                await producer.enqueue_job("arq_noop", n)
        else:
            for chunk in _chunks(len(numbers), batch):
                await _gather_bounded(
                    [partial(producer.enqueue_job, "arq_noop", numbers[i]) for i in chunk],
                    settings.arq_enqueue_concurrency,
                )

    try:
        # jobs_complete counts before the result is written, so also wait for the job tasks
        # (`tasks`: arq's run_job tasks, done ones dropped only at its next poll).
        seconds = await _timed_in_loop(
            "arq", path, jobs, warmup, produce,
            lambda total: worker.jobs_complete >= total and all(t.done() for t in worker.tasks.values()),
        )
        check_count("arq", path, "jobs arq recorded complete", warmup + jobs, worker.jobs_complete)
        check_count("arq", path, "jobs arq recorded failed", 0, worker.jobs_failed)
        check_count("arq", path, "jobs arq retried", 0, worker.jobs_retried)
        check_count("arq", path, "jobs left in the queue", 0, await producer.zcard(name))
    finally:
        await worker.close()
        worker_task.cancel()
        await asyncio.gather(worker_task, return_exceptions=True)
        await producer.aclose()
    return Result("arq", path, jobs, seconds)


async def _timed_in_loop(
    system: str,
    path: str,
    jobs: int,
    warmup: int,
    produce: Callable[[range], Awaitable[None]],
    settled: Callable[[int], bool],
) -> float:
    """Warm up, then time `produce` until every job ran and the peer settled its bookkeeping."""
    TALLY.reset(warmup)
    await produce(range(-warmup, 0))
    await _wait_tally(system, "warm-up")
    await _settle(f"{system} warm-up bookkeeping", lambda: settled(warmup))

    TALLY.reset(jobs)
    started = time.perf_counter()
    await produce(range(jobs))
    await _wait_tally(system, path)
    await _settle(f"{system} {path} bookkeeping", lambda: settled(warmup + jobs))
    seconds = time.perf_counter() - started
    _check_tally(system, path, jobs)
    return seconds


# ----------------------------------------------------------------------------------------- RQ


async def run_rq(url: str, path: str, jobs: int, batch: int, warmup: int, settings: PeerSettings) -> Result:
    """RQ: `enqueue_call` per job or `enqueue_many` per batch; `SimpleWorker` processes.

    RQ's client is synchronous; it runs on a thread so the event loop stays free.
    """
    return await asyncio.to_thread(_run_rq_sync, url, path, jobs, batch, warmup, settings)


def _run_rq_sync(url: str, path: str, jobs: int, batch: int, warmup: int, settings: PeerSettings) -> Result:
    import redis
    from rq import Queue
    from rq.registry import FailedJobRegistry, FinishedJobRegistry

    name = f"bench-{uuid.uuid4().hex[:8]}"
    connection = redis.Redis.from_url(url)
    queue = Queue(name, connection=connection)
    finished = FinishedJobRegistry(queue=queue)
    failed = FailedJobRegistry(queue=queue)
    workers = [_spawn_rq_worker(url, name) for _ in range(settings.rq_workers)]
    function = "bench.peer_jobs.rq_noop"

    def produce(numbers: range) -> None:
        if path == SINGLE:
            for n in numbers:
                queue.enqueue_call(function, args=(n,))
        else:
            for chunk in _chunks(len(numbers), batch):
                queue.enqueue_many([Queue.prepare_data(function, args=(numbers[i],)) for i in chunk])

    def wait_finished(total: int, what: str) -> None:
        # ZCARD without RQ's registry cleanup: a cheap read every few ms, not a scan.
        deadline = time.monotonic() + WAIT_TIMEOUT_S
        while finished.get_job_count(cleanup=False) < total:
            if failed.get_job_count(cleanup=False):
                raise BenchmarkError(f"rq {what}: jobs failed, see FailedJobRegistry of {name}")
            for process in workers:
                if process.poll() is not None:
                    raise BenchmarkError(f"rq {what}: a worker exited with {process.returncode}")
            if time.monotonic() > deadline:
                raise BenchmarkError(f"rq {what}: not all jobs finished in {WAIT_TIMEOUT_S}s")
            time.sleep(RQ_POLL_S)

    try:
        _wait_rq_workers(connection, queue, len(workers))
        produce(range(-warmup, 0))
        wait_finished(warmup, "warm-up")
        started = time.perf_counter()
        produce(range(jobs))
        wait_finished(warmup + jobs, path)
        seconds = time.perf_counter() - started
        reports = [_stop_rq_worker(process) for process in workers]
        finished_count = finished.get_job_count(cleanup=False)
        failed_count = failed.get_job_count(cleanup=False)
    finally:
        for process in workers:
            if process.poll() is None:
                process.kill()
                process.wait()
        connection.close()

    check_count("rq", path, "jobs run", warmup + jobs, sum(r["ran"] for r in reports))
    # Payloads are distinct, so the per-worker distinct counts add up to the total only if no
    # job ran twice (in one worker or in two).
    check_count("rq", path, "distinct jobs run", warmup + jobs, sum(r["distinct"] for r in reports))
    check_count("rq", path, "jobs in RQ's FinishedJobRegistry", warmup + jobs, finished_count)
    check_count("rq", path, "jobs in RQ's FailedJobRegistry", 0, failed_count)
    return Result("rq", path, jobs, seconds)


def _spawn_rq_worker(url: str, queue_name: str) -> subprocess.Popen[str]:
    # The worker imports jobs by dotted path (bench.peer_jobs.rq_noop): the repository root must
    # be importable whatever the caller's PYTHONPATH.
    python_path = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": python_path}
    return subprocess.Popen(
        [sys.executable, "-m", "bench.rq_worker", url, queue_name],
        cwd=REPO_ROOT,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )


def _wait_rq_workers(connection: Any, queue: Any, count: int) -> None:
    """Until every worker registered: jobs enqueued before would wait for a slow start-up."""
    from rq import Worker

    deadline = time.monotonic() + 30
    while Worker.count(connection=connection, queue=queue) < count:
        if time.monotonic() > deadline:
            raise BenchmarkError("rq workers did not register within 30s")
        time.sleep(0.01)


def _stop_rq_worker(process: subprocess.Popen[str]) -> dict[str, int]:
    process.send_signal(signal.SIGTERM)
    out, _ = process.communicate(timeout=30)
    lines = [line for line in out.splitlines() if line.startswith("{")]
    if process.returncode != 0 or not lines:
        raise BenchmarkError(f"rq worker exited with {process.returncode} and no report: {out!r}")
    report: dict[str, int] = json.loads(lines[-1])
    return report

