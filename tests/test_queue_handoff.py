"""Work handed to a claim waiting in the same queue instance (queue/_handoff.py): written leased in
the enqueue's own transaction, exactly what the claim's next attempt would have taken, and never
lost when the claim stops waiting."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from support.waiting import eventually
from tidegate.jobs import Job, JobState, Priority
from tidegate.queue import Queue
from tidegate.queue._handoff import WaitingClaim
from tidegate.queue.base import NewJob

pytestmark = pytest.mark.sqlite_only  # the backend that hands off (`Queue.hands_off`)


@pytest.fixture
async def queue(tmp_path: Path) -> AsyncIterator[Queue]:
    async with Queue.from_url(f"sqlite:///{tmp_path / 'queue.db'}", maintenance_interval_s=None) as opened:
        assert opened.hands_off
        yield opened


async def _waiting_claim(queue: Queue, *, limit: int = 10,
                         priorities: list[Priority] | None = None) -> asyncio.Task[list[Job]]:
    """A claim of worker w1 blocked waiting for work (nothing is claimable yet)."""
    task = asyncio.create_task(queue.claim("w1", timeout_s=5.0, limit=limit, priorities=priorities))
    await eventually(lambda: queue._handoffs._waiting, "the claim waits", every_s=0.005)
    return task


async def test_a_waiting_claim_is_handed_the_job_leased_as_a_claim_would_lease_it(queue: Queue) -> None:
    claim = await _waiting_claim(queue)

    job_id = await queue.enqueue({"n": 1}, priority="high", tenant="acme")

    [job] = await asyncio.wait_for(claim, 1.0)
    assert (job.id, job.state, job.attempts, job.lease_token, job.worker_id) == (
        job_id, JobState.LEASED, 1, 1, "w1")
    stored = await queue.get(job_id)
    assert stored is not None and stored.state is JobState.LEASED and stored.lease_token == 1
    assert (await queue.stats()).depth == 0  # it was never queued
    await queue.complete(job, {"ok": True})  # its lease works like any other
    done = await queue.get(job_id)
    assert done is not None and done.state is JobState.SUCCEEDED


async def test_the_most_urgent_job_of_an_enqueue_is_handed_first(queue: Queue) -> None:
    claim = await _waiting_claim(queue, limit=1)

    low, critical = await queue.enqueue_many([{"payload": {"n": 1}, "priority": "low"},
                                              {"payload": {"n": 2}, "priority": "critical"}])

    [job] = await asyncio.wait_for(claim, 1.0)
    assert job.id == critical
    waiting = await queue.get(low)
    assert waiting is not None and waiting.state is JobState.QUEUED


async def test_a_job_is_not_handed_to_a_claim_that_does_not_serve_its_level(queue: Queue) -> None:
    claim = await _waiting_claim(queue, priorities=[Priority.CRITICAL])

    bulk = await queue.enqueue({"n": 1}, priority="bulk")

    stored = await queue.get(bulk)
    assert stored is not None and stored.state is JobState.QUEUED
    assert not claim.done()
    claim.cancel()


async def test_an_offer_is_refused_when_work_a_claim_would_take_first_waits(queue: Queue) -> None:
    # A job queued at the offered job's level or above (by another process, say) comes first.
    ahead = await queue.enqueue({"n": 0}, priority="high")
    offered = NewJob(id="offered", priority=int(Priority.NORMAL), payload=b"{}", tenant="acme",
                     created_ms=0, not_before_ms=None, deadline_ms=None, max_attempts=3,
                     idempotency_key=None, callback_url=None)
    claim = WaitingClaim("w1", (0, 1, 2, 3, 4), 1, 30_000)

    ids, handed = await queue._enqueue_handing([offered], {"offered": claim})

    assert ids == ["offered"] and handed == []
    for job_id in (ahead, "offered"):
        stored = await queue.get(job_id)
        assert stored is not None and stored.state is JobState.QUEUED


async def test_jobs_handed_to_a_claim_that_stopped_waiting_go_back_to_the_queue(queue: Queue) -> None:
    claim = await _waiting_claim(queue)
    [waiting] = queue._handoffs._waiting
    offers = queue._handoffs.offers([("gone", int(Priority.NORMAL))])  # an enqueue takes it ...
    assert offers["gone"] is waiting
    claim.cancel()  # ... and the claim is cancelled while the enqueue writes
    with pytest.raises(asyncio.CancelledError):
        await claim
    job = NewJob(id="gone", priority=int(Priority.NORMAL), payload=b"{}", tenant="acme", created_ms=0,
                 not_before_ms=None, deadline_ms=None, max_attempts=3, idempotency_key=None,
                 callback_url=None)

    _, handed = await queue._enqueue_handing([job], offers)
    queue._handoffs.deliver(offers, handed)

    assert [job.id for job in handed] == ["gone"]
    stored = await eventually(lambda: queue.get("gone"), "the job is queued again", every_s=0.005,
                              until=lambda job: job is not None and job.state is JobState.QUEUED)
    # Released, its attempt not counted
    assert stored is not None and stored.state is JobState.QUEUED and stored.attempts == 0
    [again] = await queue.claim("w2")
    assert again.id == "gone"


async def test_an_enqueue_cancelled_while_it_writes_still_hands_its_job_over(queue: Queue) -> None:
    claim = await _waiting_claim(queue)
    enqueue = asyncio.create_task(queue.enqueue({"n": 1}, priority="normal"))
    await asyncio.sleep(0)  # the enqueue has offered its job and is writing it

    enqueue.cancel()
    with pytest.raises(asyncio.CancelledError):
        await enqueue

    # The write went on and its job reached the claim it was leased to
    [job] = await asyncio.wait_for(claim, 1.0)
    assert (job.state, job.worker_id, job.payload) == (JobState.LEASED, "w1", {"n": 1})
