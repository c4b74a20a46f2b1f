"""Jobs enqueued by a caller that waits for them next (`enqueue_many(..., will_wait=True)`): the
wait is told of the finish without reading the job first, and gets the job as `get` shows it,
whichever instance finished it and whenever."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest

from conftest import QueueFactory
from support.waiting import eventually
from tidegate.errors import QueueFull
from tidegate.jobs import Job, JobState, Priority
from tidegate.queue import Queue
from tidegate.queue._finishes import Finishes
from tidegate.queue.redis import RedisQueue


def _count_reads(queue: Queue) -> list[str]:
    """Record the job reads (`_get`) this instance makes from now on."""
    reads: list[str] = []
    read = queue._get

    async def counted(job_id: str) -> Job | None:
        reads.append(job_id)
        return await read(job_id)

    queue._get = counted  # type: ignore[method-assign]
    return reads


def _fields(job: Job) -> dict[str, Any]:
    return dataclasses.asdict(job)


async def _finish_soon(queue: Queue, result: dict[str, Any]) -> Job:
    [job] = await queue.claim("w1", timeout_s=5.0)
    await queue.complete(job, result)
    return job


async def _waiting(queue: Queue, job_id: str) -> asyncio.Task[Job]:
    """A wait for a job enqueued with `will_wait`, once under way: it has taken over the waiter
    the enqueue registered, so a finish from now on is one it waits for."""
    task = asyncio.create_task(queue.wait(job_id, 5.0))
    await eventually(lambda: job_id not in queue._finishes._expected, "the wait takes over its waiter")
    assert not task.done()
    return task


async def _listening(queue: Queue) -> None:
    """A first wait, so a Redis queue's job-done listener has subscribed (waits registered before
    that read their job: what was announced before it went unheard)."""
    [job_id] = await queue.enqueue_many([{"payload": {"warm": True}}], will_wait=True)
    await _finish_soon(queue, {})
    await queue.wait(job_id, 5.0)


async def test_a_waited_job_finished_by_this_instance_needs_no_read(queue: Queue) -> None:
    await _listening(queue)
    reads = _count_reads(queue)
    [job_id] = await queue.enqueue_many([{"payload": {"n": 1}, "tenant": "acme"}], will_wait=True)
    finishing = asyncio.create_task(_finish_soon(queue, {"answer": 42}))

    job = await queue.wait(job_id, 5.0)

    await finishing
    assert reads == []
    assert job.state is JobState.SUCCEEDED and job.result == {"answer": 42}
    stored = await queue.get(job_id)
    assert stored is not None and _fields(job) == _fields(stored)


async def test_a_job_finished_by_another_instance_reaches_its_wait(queue_factory: QueueFactory) -> None:
    gateway, worker = [await queue_factory.open(maintenance_interval_s=None) for _ in range(2)]
    await _listening(gateway)
    reads = _count_reads(gateway)
    [job_id] = await gateway.enqueue_many([{"payload": {"n": 2}}], will_wait=True)
    waiting = await _waiting(gateway, job_id)

    await _finish_soon(worker, {"answer": 7})

    job = await asyncio.wait_for(waiting, 5.0)
    if queue_factory.backend != "sqlite":  # the job-done message carries it
        assert reads == []
    stored = await gateway.get(job_id)
    assert stored is not None and _fields(job) == _fields(stored)
    assert job.result == {"answer": 7}


async def test_a_job_finished_before_its_wait_began_is_returned_final(queue_factory: QueueFactory) -> None:
    gateway, worker = [await queue_factory.open(maintenance_interval_s=None) for _ in range(2)]
    [job_id] = await gateway.enqueue_many([{"payload": {"n": 3}}], will_wait=True)
    await _finish_soon(worker, {"answer": 3})  # announced (and unheard) before anyone waits

    job = await gateway.wait(job_id, 5.0)

    assert job.state is JobState.SUCCEEDED and job.result == {"answer": 3}


async def test_a_job_that_fails_for_good_is_read_by_its_wait(queue: Queue) -> None:
    [job_id] = await queue.enqueue_many([{"payload": {"n": 4}, "max_attempts": 1}], will_wait=True)
    [job] = await queue.claim("w1", timeout_s=5.0)
    await queue.fail(job, "provider said no", retry=False)

    waited = await queue.wait(job_id, 5.0)

    assert waited.state is JobState.DEAD and waited.last_error == "provider said no"


async def test_a_large_result_is_read_rather_than_announced(queue_factory: QueueFactory) -> None:
    gateway, worker = [await queue_factory.open(maintenance_interval_s=None) for _ in range(2)]
    big = {"text": "x" * 40_000}  # over what a job-done message carries
    [job_id] = await gateway.enqueue_many([{"payload": {"n": 5}}], will_wait=True)
    waiting = await _waiting(gateway, job_id)

    await _finish_soon(worker, big)

    job = await asyncio.wait_for(waiting, 5.0)
    assert job.state is JobState.SUCCEEDED and job.result == big


async def test_a_repeated_idempotency_key_waits_for_the_first_job(queue: Queue) -> None:
    first = await queue.enqueue({"n": 6}, idempotency_key="k1")
    [again] = await queue.enqueue_many([{"payload": {"n": 6}, "idempotency_key": "k1"}], will_wait=True)
    assert again == first
    await _finish_soon(queue, {"answer": 6})

    job = await queue.wait(again, 5.0)

    assert job.id == first and job.result == {"answer": 6}
    assert not queue._finishes  # the new job's waiter went with the write that never happened


async def test_a_refused_enqueue_leaves_no_waiter(queue_factory: QueueFactory) -> None:
    queue = await queue_factory.open(maintenance_interval_s=None, max_depth={int(Priority.NORMAL): 1})
    await queue.enqueue({"n": 1})
    with pytest.raises(QueueFull):
        await queue.enqueue_many([{"payload": {"n": 2}}], will_wait=True)
    assert not queue._finishes


async def test_expected_waits_are_bounded_and_a_dropped_one_still_waits_by_reading(queue: Queue) -> None:
    queue._finishes = Finishes(expected_limit=2)
    ids = await queue.enqueue_many([{"payload": {"n": n}} for n in range(3)], will_wait=True)
    assert len(queue._finishes.ids()) == 2  # the oldest was dropped
    for _ in ids:
        await _finish_soon(queue, {"ok": True})

    jobs = [await queue.wait(job_id, 5.0) for job_id in ids]

    assert [job.state for job in jobs] == [JobState.SUCCEEDED] * 3
    assert not queue._finishes




@pytest.mark.redis_only
async def test_a_job_done_message_it_cannot_read_wakes_every_waiter_to_read(queue: Queue) -> None:
    # A process of another version announcing finishes its own way (ids comma-separated) must
    # not leave a wait hanging until its safety re-read: every waiter is told to read its job.
    assert isinstance(queue, RedisQueue)
    waiters = [queue._finishes.watch(job_id) for job_id in ("a" * 32, "b" * 32)]

    queue._relay_finished(f"{'c' * 32},{'d' * 32}".encode())

    assert [waiter.future.done() and waiter.future.result() for waiter in waiters] == [None, None]
