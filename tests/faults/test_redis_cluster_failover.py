"""A Redis Cluster failover under a running queue: the master that serves the queue's slot is
killed (SIGKILL: nothing flushed, nothing handed over) while producers enqueue, and its replica
is promoted by the cluster itself (automatic failover after the node timeout).

The queue runs with `wait_replicas=1`: each state change returns only once the replica holds it.
So no job whose enqueue was acknowledged is lost: every one of them is found after the failover,
claimed once and completed once, and a caller waiting on one across the failover hears of its
end. While the promoted master has no replica of its own, writes are refused rather than
acknowledged without one; the killed node, started again, rejoins as its replica and the queue
takes writes again."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest

from support.redis_cluster import RedisCluster, running_cluster
from support.waiting import eventually
from tidegate import Job, JobState, LeaseLost, Queue, QueueUnavailable
from tidegate._redis import key_prefix

pytestmark = pytest.mark.timeout(180)

NAME = "failover"
NODE_TIMEOUT_MS = 1_000  # a master silent this long is failed over
PRODUCERS = 4
BACKLOG = 1_000  # jobs acknowledged before the master dies: a backlog a failover could lose, not a few
RECOVERY_S = 30.0  # the longest the queue may take to serve again once the cluster has
PROMPT_S = 2.0  # a waiter hears of its job's end within this, not the 5 s safety poll
T = TypeVar("T")


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[RedisCluster]:
    """Three masters with a replica each, failing over after one silent second."""
    with running_cluster(tmp_path, replicas=1, node_timeout_ms=NODE_TIMEOUT_MS) as started:
        yield started


class _NotYet(Exception):
    """The queue refused while the cluster recovers: the call is made again."""


async def _until_served(call: Callable[[], Awaitable[T]], *, refused_for: str = "") -> T:
    """`call()` again until the queue serves it: what a caller does across a failover (the
    first calls meet the dead node or the cluster still electing). A refusal whose message
    holds `refused_for` is raised at once: it is the answer the caller waits for."""
    async def answer() -> T:
        try:
            return await call()
        except QueueUnavailable as exc:
            if refused_for and refused_for in str(exc):
                raise
            raise _NotYet(str(exc)) from exc

    return await eventually(answer, "the queue serves the call", until=lambda _: True, timeout_s=RECOVERY_S,
                            every_s=0.1, ignoring=(_NotYet,))


async def test_no_acknowledged_job_is_lost_when_the_queues_master_fails_over(cluster: RedisCluster) -> None:
    queue = Queue.from_url(f"{cluster.url}?name={NAME}&wait_replicas=1&wait_timeout_s=1",
                           maintenance_interval_s=None)
    async with queue:
        # Given producers enqueueing one job and batches of five, and keeping what was acknowledged
        acknowledged: list[str] = []
        refusals: list[str] = []  # what each refused call was told
        stop = asyncio.Event()

        async def produce(producer: int) -> None:
            n = 0
            while not stop.is_set():
                n += 1
                try:
                    if n % 2:
                        acknowledged.append(await queue.enqueue({"producer": producer, "n": n}))
                    else:
                        acknowledged.extend(await queue.enqueue_many(
                            [{"payload": {"producer": producer, "n": n, "i": i}} for i in range(5)]))
                except QueueUnavailable as exc:
                    refusals.append(str(exc))  # not acknowledged: it may or may not have been written
                # Paced, so that the jobs to check stay a few thousand: a rate, not a wait for a state
                await asyncio.sleep(0.005)

        producers = [asyncio.create_task(produce(p)) for p in range(PRODUCERS)]
        await eventually(lambda: len(acknowledged), f"the producers have {BACKLOG} jobs acknowledged",
                         until=lambda count: count >= BACKLOG,
                         describe=lambda count: f"{count} acknowledged, {len(refusals)} refused")
        # And a caller waiting for the first job to end
        watched = acknowledged[0]
        waiter = asyncio.create_task(queue.wait(watched, timeout_s=120))

        # When the master that serves the queue's slot is killed while they enqueue
        slot_key = key_prefix(NAME) + "jobs"
        dead = cluster.kill_master_of(slot_key)
        # And its replica takes over
        master = await asyncio.to_thread(cluster.await_promotion, slot_key, dead)
        # And the producers meet the promoted master: it acknowledges a write or refuses it for
        # want of a replica (the dead master can do neither)
        acked, told = len(acknowledged), len(refusals)
        await eventually(
            lambda: len(acknowledged) > acked or any("replicas" in why for why in refusals[told:]),
            "a producer's write reaches the promoted master", timeout_s=RECOVERY_S,
            describe=lambda _: f"refused since the promotion: {refusals[told:][-3:]}")
        stop.set()
        await asyncio.gather(*producers)

        # Then, while the promoted master has no replica, a write is refused, not acknowledged
        with pytest.raises(QueueUnavailable, match="0 of 1 replicas"):
            await _until_served(lambda: queue.enqueue({"late": True}), refused_for="replicas")
        # And once the killed node is back as its replica, the queue takes writes again
        await asyncio.to_thread(cluster.restart, dead)
        await asyncio.to_thread(cluster.await_replica, dead, master)

        # And every acknowledged job is still there, with its payload
        lost: list[str] = []
        for job_id in acknowledged:
            job = await _until_served(lambda job_id=job_id: queue.get(job_id))  # type: ignore[misc]
            if job is None or "producer" not in job.payload:
                lost.append(job_id)
        assert not lost, f"{len(lost)} of {len(acknowledged)} acknowledged jobs lost, {len(refusals)} refused"

        # And each is claimed exactly once (unacknowledged ones that were written may come too)
        claimed: list[Job] = []
        while batch := await _until_served(lambda: queue.claim("after", limit=100)):
            claimed += batch
        ids = [job.id for job in claimed]
        assert len(ids) == len(set(ids)), "a job was claimed twice"
        assert set(acknowledged) <= set(ids)

        # And the caller waiting across the failover hears of its job's end promptly
        first = next(job for job in claimed if job.id == watched)
        await queue.complete(first, {"done": first.id})
        done = await asyncio.wait_for(waiter, PROMPT_S)
        assert done.id == watched and done.state is JobState.SUCCEEDED

        # And every job is completed exactly once
        for job in claimed:
            if job is not first:
                await queue.complete(job, {"done": job.id})
        with pytest.raises(LeaseLost):
            await queue.complete(first, {"done": "again"})
        assert await queue.claim("after", limit=10) == []
        for job_id in acknowledged:
            job = await queue.get(job_id)
            assert job is not None and job.state is JobState.SUCCEEDED and job.result == {"done": job_id}
