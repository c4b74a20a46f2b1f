"""The queue contract, part 3: delayed jobs, deadlines, waiting for results, stats, admission
control, aging, tenant round-robin and retention. Runs on every backend through the
`queue_factory` fixture; background upkeep is off unless a test turns it on."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import time
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

import pytest

from support.redis_keys import redis_client
from support.waiting import eventually
from tidegate import InvalidJob, Job, JobNotFound, JobState, Priority, Queue, QueueFull

# ---------------------------------------------------------------------- helpers


async def stored(q: Queue, job_id: str) -> Job:
    job = await q.get(job_id)
    assert job is not None, f"job {job_id} is gone"
    return job


async def claim_all(q: Queue, *, limit: int = 100, **options: Any) -> list[Job]:
    claimed: list[Job] = []
    while jobs := await q.claim("drain", limit=limit, **options):
        claimed.extend(jobs)
    return claimed


async def storage_entries(queue_factory: Any) -> int:
    """How many entries the test's queue keeps in storage, whatever they are: rows of every
    SQLite table, or members, fields and items of every Redis key of the queue."""
    if queue_factory.backend == "sqlite":
        with contextlib.closing(sqlite3.connect(urlsplit(queue_factory.url).path[1:])) as conn:
            tables = [row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
            return sum(conn.execute(f'SELECT COUNT(*) FROM "{table}"').fetchone()[0] for table in tables)
    client = redis_client(queue_factory.url)
    try:
        sizes = {"hash": client.hlen, "zset": client.zcard, "list": client.llen, "set": client.scard}
        total = 0
        async for key in client.scan_iter(match=f"*{queue_factory.queue_name}*"):
            kind = await client.type(key)
            size = sizes.get(kind.decode() if isinstance(kind, bytes) else kind)
            total += await size(key) if size is not None else 1
        return total
    finally:
        await client.aclose()


async def waits_under_way(queue: Queue, *job_ids: str) -> None:
    """Until a wait of this queue instance is registered for each job: from then on, a finish is
    one they wait for (a wait registers before it first reads its job)."""
    await eventually(lambda: all(queue._finishes.waits_for(job_id) for job_id in job_ids),
                     "the waits are under way")


async def maintain_for(q: Queue, seconds: float, every_s: float = 0.05) -> None:
    """Run upkeep passes for a while, as the background task would."""
    give_up = time.monotonic() + seconds
    while time.monotonic() < give_up:
        await q.maintain()
        await asyncio.sleep(every_s)
    await q.maintain()


# ---------------------------------------------------------------------- delayed jobs


@pytest.mark.parametrize("how", ["delay_s", "not_before"])
async def test_a_delayed_job_is_not_claimable_before_its_time(queue: Queue, how: str) -> None:
    # Given a job delayed by half a second
    enqueued_at = time.monotonic()
    if how == "delay_s":
        job_id = await queue.enqueue({"n": 1}, delay_s=0.5)
    else:
        job_id = await queue.enqueue({"n": 1}, not_before=datetime.now(UTC) + timedelta(seconds=0.5))

    # Then it is delayed, not waiting at its level, and no claim gets it yet
    job = await stored(queue, job_id)
    assert job.state is JobState.DELAYED
    assert job.not_before is not None and job.not_before > datetime.now(UTC)
    stats = await queue.stats()
    assert (stats.delayed, stats.depth) == (1, 0)
    assert await queue.claim("w") == []

    # When a blocking claim waits, it wakes for the job once it is due, with no upkeep running
    jobs = await queue.claim("w", timeout_s=5)
    assert [j.id for j in jobs] == [job_id]
    waited = time.monotonic() - enqueued_at
    assert 0.45 <= waited < 4


async def test_a_due_delayed_job_is_claimable_without_upkeep(queue: Queue) -> None:
    job_id = await queue.enqueue({"n": 1}, delay_s=0.2)
    await asyncio.sleep(0.35)
    assert [job.id for job in await queue.claim("w")] == [job_id]


async def test_a_not_before_in_the_past_is_claimable_at_once(queue: Queue) -> None:
    job_id = await queue.enqueue({"n": 1}, not_before=datetime.now(UTC) - timedelta(minutes=1))
    assert (await stored(queue, job_id)).state is JobState.QUEUED
    assert [job.id for job in await queue.claim("w")] == [job_id]


async def test_a_delayed_job_keeps_its_priority_when_due(queue: Queue) -> None:
    delayed_high = await queue.enqueue({"n": 1}, priority=Priority.HIGH, delay_s=0.2)
    normal = await queue.enqueue({"n": 2}, priority=Priority.NORMAL)
    await asyncio.sleep(0.35)
    assert [job.id for job in await queue.claim("w", limit=2)] == [delayed_high, normal]


async def test_due_jobs_are_claimed_by_priority_however_many_came_due(queue: Queue) -> None:
    # Given many BULK jobs and then one CRITICAL job, all delayed, which come due together
    await queue.enqueue_many(
        [{"payload": {"n": n}, "priority": "bulk", "delay_s": 0.3} for n in range(1_500)]
    )
    critical = await queue.enqueue({"n": -1}, priority=Priority.CRITICAL, delay_s=0.35)
    await asyncio.sleep(0.5)

    # Then the first claim gets the CRITICAL job
    [job] = await queue.claim("w")
    assert job.id == critical


async def test_upkeep_promotes_due_delayed_jobs(queue: Queue) -> None:
    job_id = await queue.enqueue({"n": 1}, delay_s=0.2)
    await asyncio.sleep(0.35)
    report = await queue.maintain()
    assert report.promoted == 1
    assert (await stored(queue, job_id)).state is JobState.QUEUED
    stats = await queue.stats()
    assert (stats.delayed, stats.depth) == (0, 1)


# ---------------------------------------------------------------------- deadlines


@pytest.mark.parametrize("how", ["timeout_s", "deadline"])
async def test_a_job_past_its_deadline_is_never_handed_out(queue: Queue, how: str) -> None:
    if how == "timeout_s":
        late = await queue.enqueue({"n": 1}, timeout_s=0.2)
    else:
        late = await queue.enqueue({"n": 1}, deadline=datetime.now(UTC) + timedelta(seconds=0.2))
    await asyncio.sleep(0.35)
    fresh = await queue.enqueue({"n": 2}, priority=Priority.BULK)

    claimed = await queue.claim("w", limit=5)

    assert [job.id for job in claimed] == [fresh]
    job = await stored(queue, late)
    assert job.state is JobState.EXPIRED
    assert job.is_final


async def test_a_delayed_job_whose_deadline_passes_first_is_never_handed_out(queue: Queue) -> None:
    job_id = await queue.enqueue({"n": 1}, delay_s=0.3, timeout_s=0.1)
    assert await queue.claim("w", timeout_s=0.6) == []
    assert (await stored(queue, job_id)).state is JobState.EXPIRED


async def test_upkeep_expires_jobs_past_their_deadline(queue: Queue) -> None:
    job_id = await queue.enqueue({"n": 1}, timeout_s=0.2)
    await asyncio.sleep(0.35)

    report = await queue.maintain()

    assert report.expired == 1
    assert (await stored(queue, job_id)).state is JobState.EXPIRED
    assert (await queue.stats()).depth == 0


async def test_a_job_before_its_deadline_is_claimed_normally(queue: Queue) -> None:
    job_id = await queue.enqueue({"n": 1}, timeout_s=30)
    [job] = await queue.claim("w")
    assert job.id == job_id
    assert job.deadline is not None and job.deadline > datetime.now(UTC)
    await queue.complete(job, "in time")
    assert (await stored(queue, job_id)).state is JobState.SUCCEEDED


# ---------------------------------------------------------------------- waiting for results


async def test_wait_returns_the_final_job_once_another_process_completes_it(queue_factory: Any) -> None:
    client = await queue_factory.open(maintenance_interval_s=None)
    worker = await queue_factory.open(maintenance_interval_s=None)
    job_id = await client.enqueue({"prompt": "hi"})
    started = time.monotonic()
    waiter = asyncio.create_task(client.wait(job_id, timeout_s=5))
    await waits_under_way(client, job_id)
    assert not waiter.done()

    [job] = await worker.claim("w")
    await worker.complete(job, {"text": "hello"})
    done = await waiter

    assert done.id == job_id
    assert done.state is JobState.SUCCEEDED
    assert done.result == {"text": "hello"}
    assert time.monotonic() - started < 4  # woken by the finish, not by the timeout


@pytest.mark.parametrize("ending", ["cancel", "dead"])
async def test_wait_wakes_for_every_final_state(queue_factory: Any, ending: str) -> None:
    client = await queue_factory.open(maintenance_interval_s=None)
    other = await queue_factory.open(maintenance_interval_s=None)
    job_id = await client.enqueue({}, max_attempts=1)
    started = time.monotonic()
    waiter = asyncio.create_task(client.wait(job_id, timeout_s=5))
    await waits_under_way(client, job_id)

    if ending == "cancel":
        assert await other.cancel(job_id)
    else:
        [job] = await other.claim("w")
        assert await other.fail(job, "boom", retry_in_s=0) is JobState.DEAD
    done = await waiter

    assert done.state is (JobState.CANCELLED if ending == "cancel" else JobState.DEAD)
    assert time.monotonic() - started < 4


async def test_wait_does_not_return_for_a_retry(queue: Queue) -> None:
    job_id = await queue.enqueue({}, max_attempts=3)
    waiter = asyncio.create_task(queue.wait(job_id, timeout_s=0.6))
    await waits_under_way(queue, job_id)
    [job] = await queue.claim("w")
    await queue.fail(job, "transient", retry_in_s=10)
    result = await waiter
    assert result.state is JobState.FAILED


async def test_wait_returns_at_once_for_a_final_job(queue: Queue) -> None:
    job_id = await queue.enqueue({})
    assert await queue.cancel(job_id)
    started = time.monotonic()
    job = await queue.wait(job_id, timeout_s=5)
    assert job.state is JobState.CANCELLED
    assert time.monotonic() - started < 4


async def test_wait_returns_the_unfinished_job_after_the_timeout(queue: Queue) -> None:
    job_id = await queue.enqueue({})
    started = time.monotonic()
    job = await queue.wait(job_id, timeout_s=0.3)
    assert job.id == job_id
    assert job.state is JobState.QUEUED
    assert time.monotonic() - started >= 0.25


async def test_wait_for_an_unknown_job_raises_job_not_found(queue: Queue) -> None:
    with pytest.raises(JobNotFound):
        await queue.wait("no-such-job", timeout_s=0.1)


@pytest.mark.parametrize(
    "result",
    [
        {"text": "hi", "usage": {"tokens": 12, "cost": 0.25}, "tags": ["a", None, 3], "none": None},
        [1, "two", None, {"three": [3.5]}],
        None,
        "plain text",
        0,
        True,
    ],
    ids=["object", "list", "none", "string", "zero", "true"],
)
async def test_a_completed_result_round_trips(queue: Queue, result: Any) -> None:
    job_id = await queue.enqueue({})
    [job] = await queue.claim("w")
    await queue.complete(job, result)
    done = await stored(queue, job_id)
    assert done.state is JobState.SUCCEEDED
    assert done.result == result
    assert type(done.result) is type(result)
    assert done.finished_at is not None


# ---------------------------------------------------------------------- stats


async def test_stats_count_waiting_leased_delayed_and_dead_jobs_per_level(queue: Queue) -> None:
    await queue.enqueue_many([{"payload": {"n": n}, "priority": Priority.HIGH} for n in range(2)])
    await queue.enqueue_many([{"payload": {"n": n}, "priority": Priority.BULK} for n in range(3)])
    await queue.enqueue({"n": 9}, priority=Priority.NORMAL, delay_s=60)
    dead_id = await queue.enqueue({"n": 10}, priority=Priority.LOW, max_attempts=1)
    [dead] = await queue.claim("w", priorities=[Priority.LOW])
    assert dead.id == dead_id
    await queue.fail(dead, "boom", retry_in_s=0)
    [leased] = await queue.claim("w", priorities=[Priority.HIGH])
    await asyncio.sleep(0.1)  # time passing is the point: the waiting HIGH job's oldest wait grows

    stats = await queue.stats()

    assert set(stats.levels) == set(Priority)
    assert stats.levels[Priority.HIGH].depth == 1
    assert stats.levels[Priority.HIGH].in_flight == 1
    assert stats.levels[Priority.BULK].depth == 3
    assert stats.levels[Priority.BULK].in_flight == 0
    for level in (Priority.CRITICAL, Priority.NORMAL, Priority.LOW):
        assert (stats.levels[level].depth, stats.levels[level].in_flight) == (0, 0)
    assert stats.levels[Priority.HIGH].oldest_wait_s > 0.05
    assert stats.levels[Priority.BULK].oldest_wait_s > 0.05
    assert (stats.depth, stats.in_flight, stats.delayed, stats.dead) == (4, 1, 1, 1)

    await queue.complete(leased)
    after = await queue.stats()
    assert (after.depth, after.in_flight) == (4, 0)


async def test_oldest_wait_grows_with_the_oldest_waiting_job(queue: Queue) -> None:
    await queue.enqueue({"n": 1}, priority=Priority.LOW)
    await asyncio.sleep(0.2)
    await queue.enqueue({"n": 2}, priority=Priority.LOW)
    first = (await queue.stats()).levels[Priority.LOW].oldest_wait_s
    await asyncio.sleep(0.2)
    second = (await queue.stats()).levels[Priority.LOW].oldest_wait_s
    assert first >= 0.15
    assert second >= first + 0.15


async def test_oldest_wait_counts_the_longest_waiting_job_not_the_head_of_the_line(queue: Queue) -> None:
    # Given two jobs at one level; the first is claimed and, much later, released: it goes back
    # ahead of the second but its wait starts again
    first, second = await queue.enqueue_many([{"payload": {"n": n}} for n in range(2)])
    [job] = await queue.claim("w")
    assert job.id == first
    await asyncio.sleep(0.4)
    await queue.release(job)

    # Then the level's oldest wait is the second job's, which has waited all along
    oldest = (await queue.stats()).levels[Priority.NORMAL].oldest_wait_s
    assert oldest >= 0.35
    assert [j.id for j in await queue.claim("w", limit=2)] == [first, second]


# ---------------------------------------------------------------------- admission control


async def test_a_full_level_refuses_new_work_with_a_retry_hint(queue_factory: Any) -> None:
    q = await queue_factory.open(maintenance_interval_s=None, max_depth={4: 5})
    bulk_ids = [await q.enqueue({"n": n}, priority=Priority.BULK) for n in range(5)]

    with pytest.raises(QueueFull) as raised:
        await q.enqueue({"n": 5}, priority=Priority.BULK)

    assert raised.value.priority == 4
    assert raised.value.retry_after_s > 0
    assert (await q.stats()).levels[Priority.BULK].depth == 5

    # Other levels are unaffected
    normal_id = await q.enqueue({"n": 6}, priority=Priority.NORMAL)
    assert (await stored(q, normal_id)).state is JobState.QUEUED

    # Taking a job off the full level makes room again
    [job] = await q.claim("w", priorities=[Priority.BULK])
    assert job.id == bulk_ids[0]
    await q.enqueue({"n": 7}, priority=Priority.BULK)
    assert (await q.stats()).levels[Priority.BULK].depth == 5


async def test_a_batch_that_would_overfill_a_level_writes_nothing(queue_factory: Any) -> None:
    q = await queue_factory.open(maintenance_interval_s=None, max_depth={4: 5})
    await q.enqueue_many([{"payload": {"n": n}, "priority": "bulk"} for n in range(3)])

    with pytest.raises(QueueFull):
        await q.enqueue_many(
            [{"payload": {"n": 10}, "priority": "normal"}]
            + [{"payload": {"n": n}, "priority": "bulk"} for n in range(11, 14)]
        )

    stats = await q.stats()
    assert stats.levels[Priority.BULK].depth == 3
    assert stats.levels[Priority.NORMAL].depth == 0
    await q.enqueue_many([{"payload": {"n": n}, "priority": "bulk"} for n in range(2)])
    assert (await q.stats()).levels[Priority.BULK].depth == 5


async def test_concurrent_enqueues_at_a_nearly_full_level_are_refused_each_for_its_own_job(
    queue_factory: Any,
) -> None:
    # Callers enqueueing one job each at once (a backend may send them together) are admitted in
    # order while the level has room; only the jobs past it are refused.
    q = await queue_factory.open(maintenance_interval_s=None, max_depth={4: 3})
    await q.enqueue({"n": 0}, priority=Priority.BULK)

    outcomes = await asyncio.gather(*(q.enqueue({"n": n}, priority=Priority.BULK) for n in range(1, 5)),
                                    return_exceptions=True)

    admitted = [outcome for outcome in outcomes if isinstance(outcome, str)]
    assert len(admitted) == 2 and all(isinstance(outcome, QueueFull) for outcome in outcomes[2:])
    assert [job.payload["n"] for job in await q.claim("w", limit=10)] == [0, 1, 2]


async def test_a_known_idempotency_key_is_answered_even_when_its_level_is_full(queue_factory: Any) -> None:
    q = await queue_factory.open(maintenance_interval_s=None, max_depth={2: 2})
    first = await q.enqueue({"n": 0}, idempotency_key="k")
    await q.enqueue({"n": 1})
    assert await q.enqueue({"n": 0}, idempotency_key="k") == first
    with pytest.raises(QueueFull):
        await q.enqueue({"n": 2}, idempotency_key="other")
    assert (await q.stats()).levels[Priority.NORMAL].depth == 2


# ---------------------------------------------------------------------- aging


async def test_aging_promotes_a_long_waiting_job_past_newer_work(queue_factory: Any) -> None:
    q = await queue_factory.open(maintenance_interval_s=None, aging_interval_s=0.2)
    first, second = await q.enqueue_many([{"payload": {"n": n}, "priority": "bulk"} for n in range(2)])

    # After more than one interval, a worker that never takes BULK gets the oldest BULK job
    await maintain_for(q, 0.3)
    [job] = await q.claim("w", priorities=[0, 1, 2, 3])
    assert job.id == first

    # After several intervals the other goes ahead of NORMAL work enqueued now
    await maintain_for(q, 0.5)
    normal_ids = await q.enqueue_many([{"payload": {"n": n}, "priority": "normal"} for n in range(3)])
    claimed = await q.claim("w", limit=4)
    assert [j.id for j in claimed] == [second, *normal_ids]


async def test_aging_never_lifts_a_job_above_critical(queue_factory: Any) -> None:
    q = await queue_factory.open(maintenance_interval_s=None, aging_interval_s=0.2)
    bulk_id = await q.enqueue({"n": 0}, priority=Priority.BULK)

    # Long enough for seven promotions, where four reach CRITICAL: the job is still
    # waiting, and a CRITICAL-only worker gets it
    await maintain_for(q, 1.4)

    assert (await q.stats()).depth == 1
    [job] = await q.claim("w", priorities=[Priority.CRITICAL])
    assert job.id == bulk_id


async def test_an_aged_job_keeps_its_own_priority_when_it_comes_back(queue_factory: Any) -> None:
    q = await queue_factory.open(maintenance_interval_s=None, aging_interval_s=0.2)
    bulk_id = await q.enqueue({"n": 0}, priority=Priority.BULK)
    await maintain_for(q, 0.5)

    # Claimed from an aged level, it is still a BULK job
    [job] = await q.claim("w", priorities=[0, 1, 2], lease_s=0.2)
    assert job.id == bulk_id
    assert job.priority is Priority.BULK

    # When its lease expires it is recovered at BULK, its wait starting over
    await asyncio.sleep(0.3)
    assert (await q.maintain()).recovered == 1
    recovered = await stored(q, bulk_id)
    assert (recovered.state, recovered.priority) == (JobState.QUEUED, Priority.BULK)
    assert await q.claim("w", priorities=[0, 1, 2, 3]) == []
    assert (await q.stats()).levels[Priority.BULK].depth == 1


async def test_without_aging_a_waiting_job_stays_behind(queue: Queue) -> None:
    assert queue.settings.aging_interval_s is None
    bulk_id = await queue.enqueue({"n": 0}, priority=Priority.BULK)
    await maintain_for(queue, 0.5)
    normal_id = await queue.enqueue({"n": 1}, priority=Priority.NORMAL)

    claimed = await queue.claim("w", priorities=[0, 1, 2, 3], limit=5)

    assert [job.id for job in claimed] == [normal_id]
    assert (await stored(queue, bulk_id)).state is JobState.QUEUED
    assert (await queue.stats()).levels[Priority.BULK].depth == 1


# ---------------------------------------------------------------------- tenant round-robin


async def _tenant_order(q: Queue) -> list[tuple[str, int]]:
    await q.enqueue_many([{"payload": {"n": n}, "tenant": "A"} for n in range(10)])
    await q.enqueue_many([{"payload": {"n": n}, "tenant": "B"} for n in range(3)])
    order = []
    while jobs := await q.claim("w"):
        order.append((jobs[0].tenant, jobs[0].payload["n"]))
    return order


async def test_tenant_round_robin_serves_tenants_in_turn_within_a_level(queue_factory: Any) -> None:
    q = await queue_factory.open(maintenance_interval_s=None, tenant_round_robin=True)
    order = await _tenant_order(q)
    assert [tenant for tenant, _ in order] == list("ABABAB") + ["A"] * 7
    for tenant in "AB":
        assert [n for t, n in order if t == tenant] == sorted(n for t, n in order if t == tenant)


async def test_a_tenant_arriving_late_takes_turns_without_jumping_the_line(queue_factory: Any) -> None:
    q = await queue_factory.open(maintenance_interval_s=None, tenant_round_robin=True)
    await q.enqueue_many([{"payload": {"n": n}, "tenant": "A"} for n in range(10)])
    served = [job.payload["n"] for job in await q.claim("w", limit=4)]
    assert served == [0, 1, 2, 3]

    # When tenant B arrives while A has been served four times
    await q.enqueue_many([{"payload": {"n": n}, "tenant": "B"} for n in range(3)])

    # Then A and B alternate: B neither waits for A's backlog nor gets a burst of its own
    order = "".join(job.tenant for job in await claim_all(q, limit=1))
    assert order.count("B") == 3 and order.count("A") == 6
    assert "BB" not in order
    assert order.endswith("AAA")


async def test_tenant_round_robin_keeps_strict_priority_between_levels(queue_factory: Any) -> None:
    q = await queue_factory.open(maintenance_interval_s=None, tenant_round_robin=True)
    a_low = await q.enqueue({"n": 0}, tenant="A", priority=Priority.LOW)
    a_high = await q.enqueue({"n": 1}, tenant="A", priority=Priority.HIGH)
    b_high = await q.enqueue({"n": 2}, tenant="B", priority=Priority.HIGH)
    a_high_2 = await q.enqueue({"n": 3}, tenant="A", priority=Priority.HIGH)
    claimed = [job.id for job in await claim_all(q, limit=1)]
    assert claimed == [a_high, b_high, a_high_2, a_low]


async def test_without_round_robin_tenants_are_served_fifo(queue: Queue) -> None:
    assert queue.settings.tenant_round_robin is False
    order = await _tenant_order(queue)
    assert order == [("A", n) for n in range(10)] + [("B", n) for n in range(3)]


# ---------------------------------------------------------------------- retention


async def test_finished_jobs_and_dead_letters_expire_by_retention(queue_factory: Any) -> None:
    q = await queue_factory.open(maintenance_interval_s=None, finished_ttl_s=0.5, dead_ttl_s=0.5)

    # Given one job of each final state
    expired = await q.enqueue({"n": 0}, timeout_s=0.1)
    await asyncio.sleep(0.2)
    await q.maintain()
    succeeded = await q.enqueue({"n": 1}, idempotency_key="once")
    [job] = await q.claim("w")
    await q.complete(job, {"big": "result"})
    dead = await q.enqueue({"n": 2}, max_attempts=1, idempotency_key="dead-key")
    [job] = await q.claim("w")
    await q.fail(job, "boom", retry_in_s=0)
    cancelled = await q.enqueue({"n": 3})
    await q.cancel(cancelled)
    live = await q.enqueue({"n": 4}, priority=Priority.BULK)
    states = {job_id: (await stored(q, job_id)).state for job_id in (expired, succeeded, dead, cancelled)}
    assert states == {
        expired: JobState.EXPIRED,
        succeeded: JobState.SUCCEEDED,
        dead: JobState.DEAD,
        cancelled: JobState.CANCELLED,
    }

    # When their retention passes and upkeep runs
    await asyncio.sleep(0.7)
    report = await q.maintain()

    # Then they are gone, and so are their idempotency keys; live work is untouched
    assert report.purged >= 4
    for job_id in (expired, succeeded, dead, cancelled):
        assert await q.get(job_id) is None
    assert await q.dead_letters() == []
    assert (await q.stats()).dead == 0
    assert (await stored(q, live)).state is JobState.QUEUED
    assert await q.enqueue({"n": 5}, idempotency_key="once") != succeeded
    assert await q.enqueue({"n": 6}, idempotency_key="dead-key") != dead


async def test_retention_keeps_finished_jobs_until_their_time(queue_factory: Any) -> None:
    q = await queue_factory.open(maintenance_interval_s=None, finished_ttl_s=30, dead_ttl_s=30)
    job_id = await q.enqueue({"n": 1}, idempotency_key="k")
    [job] = await q.claim("w")
    await q.complete(job, "kept")
    await q.maintain()
    assert (await stored(q, job_id)).result == "kept"
    assert await q.enqueue({"n": 1}, idempotency_key="k") == job_id


@pytest.mark.timeout(60)
async def test_storage_stays_bounded_under_steady_traffic(queue_factory: Any) -> None:
    q = await queue_factory.open(maintenance_interval_s=None, finished_ttl_s=0.2)
    rounds: list[list[str]] = []
    for round_no in range(3):
        ids = await q.enqueue_many([{"payload": {"round": round_no, "n": n}} for n in range(500)])
        rounds.append(ids)
        for job in await claim_all(q, limit=100):
            await q.complete(job, {"n": job.payload["n"]})
        await asyncio.sleep(0.3)
        await q.maintain()
        for earlier in rounds:
            assert [job_id for job_id in earlier if await q.get(job_id) is not None] == []


@pytest.mark.parametrize("round_robin", [False, True], ids=["fifo", "round-robin"])
async def test_storage_stays_flat_when_every_job_has_a_new_tenant(
    queue_factory: Any, round_robin: bool
) -> None:
    # Given a queue whose tenants are, say, end users: each job comes from a tenant not seen before
    q = await queue_factory.open(
        maintenance_interval_s=None, finished_ttl_s=0.2, tenant_round_robin=round_robin
    )
    footprints = []
    for round_no in range(3):
        await q.enqueue_many([{"payload": {"n": n}, "tenant": f"user-{round_no}-{n}"} for n in range(300)])
        for job in await claim_all(q, limit=100):
            await q.complete(job)
        await asyncio.sleep(0.3)
        await q.maintain()
        footprints.append(await storage_entries(queue_factory))

    # Then once their jobs are past retention, nothing of those tenants is kept
    assert footprints[2] <= footprints[0] + 5, footprints


async def test_many_waiters_each_get_their_own_job_once_it_is_final(queue: Queue) -> None:
    ids = await queue.enqueue_many({"payload": {"n": n}} for n in range(300))
    waiters = [asyncio.create_task(queue.wait(job_id, 30)) for job_id in ids]
    await waits_under_way(queue, *ids)
    jobs = await queue.claim("w", limit=300)
    half = len(jobs) // 2
    assert not await queue.complete_many((job, job.payload["n"]) for job in jobs[:half])
    for job in jobs[half:]:
        await queue.cancel(job.id)
    finished = await asyncio.gather(*waiters)
    assert [job.id for job in finished] == ids
    assert all(job.is_final for job in finished)
    assert sum(job.state is JobState.SUCCEEDED for job in finished) == half
    assert all(job.result == job.payload["n"] for job in finished if job.state is JobState.SUCCEEDED)


@pytest.mark.parametrize("field", ["timeout_s", "delay_s"])
@pytest.mark.parametrize("seconds", [float("inf"), float("nan"), 1e12, -1])
async def test_relative_times_beyond_ten_years_are_refused_and_nothing_is_written(
    queue: Queue, field: str, seconds: float
) -> None:
    with pytest.raises(InvalidJob):
        await queue.enqueue({"n": 1}, **{field: seconds})
    assert (await queue.stats()).depth == 0 and (await queue.stats()).delayed == 0


async def test_purging_dead_letters_older_than_an_absurd_age_is_refused(queue: Queue) -> None:
    with pytest.raises(ValueError):
        await queue.purge_dead(older_than_s=5.5e307)
