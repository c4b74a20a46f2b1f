"""tidegate's two paths through the public `Queue` API, for either backend.

- single: `enqueue` one job, `claim(limit=1)` it, `complete` it; one job at a time. The time from
  the start of `enqueue` to the return of `claim` is the enqueue→claim latency on an empty queue.
- batched: one producer task calls `enqueue_many` with `batch` jobs at a time while `consumers`
  tasks each `claim(limit=batch)` (blocking, woken by the backend) and record what they got with
  one `complete_many`. The clock stops when the last job is completed.
- batched/each: the same, but each claimed job is completed with its own `complete` call,
  `inflight` at a time per consumer: what a worker does whose jobs finish one by one (as AI
  calls do), and the shape of the peers' workers, which settle every job on its own.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from bench.common import BATCHED, BATCHED_EACH, SINGLE, BenchmarkError, Result, check_count, percentile
from tidegate import Job, Queue

WAIT_TIMEOUT_S = 120.0
CLAIM_WAIT_S = 0.5  # how long an idle consumer blocks in claim before it re-checks for the end


@dataclass(frozen=True, slots=True)
class BatchedShape:
    """How the batched path is driven."""

    batch: int = 500
    consumers: int = 2
    inflight: int = 64  # batched/each: `complete` calls in flight per consumer


async def single(queue: Queue, system: str, jobs: int, warmup: int) -> Result:
    """Sequential enqueue → claim → complete; throughput and enqueue→claim p50/p99."""
    for n in range(-warmup, 0):
        await _one(queue, system, n)
    samples: list[float] = []
    started = time.perf_counter()
    for n in range(jobs):
        samples.append(await _one(queue, system, n))
    seconds = time.perf_counter() - started
    await _check_empty(queue, system, SINGLE)
    return Result(system, SINGLE, jobs, seconds, percentile(samples, 0.5), percentile(samples, 0.99))


async def _one(queue: Queue, system: str, n: int) -> float:
    before = time.perf_counter()
    job_id = await queue.enqueue({"n": n})
    claimed = await queue.claim("bench-single", limit=1)
    latency = time.perf_counter() - before
    if len(claimed) != 1 or claimed[0].id != job_id:
        got = [job.id for job in claimed]
        raise BenchmarkError(f"{system} single: claimed {got} right after enqueueing {job_id}")
    await queue.complete(claimed[0])
    return latency


async def batched(
    queue: Queue, system: str, jobs: int, warmup: int, shape: BatchedShape, *, each: bool = False
) -> Result:
    """Producer with `enqueue_many` and consumers with `claim(limit=batch)`; throughput.

    `each` completes every job with its own call instead of one `complete_many` per claim.
    """
    path = BATCHED_EACH if each else BATCHED
    if warmup:
        await _run_batched(queue, system, path, warmup, shape)
    seconds = await _run_batched(queue, system, path, jobs, shape)
    await _check_empty(queue, system, path)
    return Result(system, path, jobs, seconds)


async def _run_batched(queue: Queue, system: str, path: str, jobs: int, shape: BatchedShape) -> float:
    enqueued: set[str] = set()
    completed: set[str] = set()
    all_done = asyncio.Event()
    finished_at = 0.0
    gate = asyncio.Semaphore(shape.inflight)

    async def complete(job: Job) -> None:
        async with gate:
            await queue.complete(job)

    async def produce() -> None:
        for start in range(0, jobs, shape.batch):
            specs = [{"payload": {"n": n}} for n in range(start, min(start + shape.batch, jobs))]
            enqueued.update(await queue.enqueue_many(specs))

    async def consume(index: int) -> None:
        nonlocal finished_at
        worker = f"bench-consumer-{index}"
        while not all_done.is_set():
            claimed = await queue.claim(worker, limit=shape.batch, timeout_s=CLAIM_WAIT_S)
            if not claimed:
                continue
            if path == BATCHED_EACH:
                await asyncio.gather(*(complete(job) for job in claimed))
            else:
                lost = await queue.complete_many((job, None) for job in claimed)
                if lost:
                    raise BenchmarkError(f"{system} {path}: leases lost on complete: {lost[:3]}")
            for job in claimed:
                if job.id in completed:
                    raise BenchmarkError(f"{system} {path}: job {job.id} was claimed twice")
                completed.add(job.id)
            if len(completed) >= jobs and not all_done.is_set():
                finished_at = time.perf_counter()
                all_done.set()

    started = time.perf_counter()
    producer = asyncio.create_task(produce())
    consumers = [asyncio.create_task(consume(i)) for i in range(shape.consumers)]
    waiter = asyncio.create_task(all_done.wait())
    pending: set[asyncio.Task[object]] = {waiter, producer, *consumers}
    deadline = started + WAIT_TIMEOUT_S
    try:
        while not all_done.is_set():
            remaining = deadline - time.perf_counter()
            done, pending = await asyncio.wait(
                pending, timeout=max(remaining, 0), return_when=asyncio.FIRST_COMPLETED
            )
            if not done:
                raise BenchmarkError(
                    f"{system} {path}: {len(completed)} of {jobs} jobs done in {WAIT_TIMEOUT_S}s"
                )
            for task in done:
                if task is not waiter and (error := task.exception()) is not None:
                    raise error
        await producer
    finally:
        for task in [waiter, producer, *consumers]:
            task.cancel()
        await asyncio.gather(waiter, producer, *consumers, return_exceptions=True)
    check_count(system, path, "jobs enqueued", jobs, len(enqueued))
    check_count(system, path, "jobs completed", jobs, len(completed))
    if completed != enqueued:
        raise BenchmarkError(f"{system} {path}: the completed jobs are not the enqueued ones")
    return finished_at - started


async def _check_empty(queue: Queue, system: str, path: str) -> None:
    stats = await queue.stats()
    check_count(system, path, "jobs left waiting", 0, stats.depth)
    check_count(system, path, "jobs left leased", 0, stats.in_flight)
    check_count(system, path, "jobs delayed (retried)", 0, stats.delayed)
    check_count(system, path, "dead jobs", 0, stats.dead)
