"""The queue contract, part 2: leases and fencing, heartbeats, lease recovery, retries, the
dead-letter queue (list, redrive, purge), release and cancel. Runs on every backend through
the `queue_factory` fixture; the `queue` fixture has background upkeep off, so these tests call
`maintain()` themselves."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from support.waiting import eventually
from tidegate import InvalidJob, Job, JobState, LeaseLost, Priority, Queue
from tidegate.jobs import JobFailure

# ---------------------------------------------------------------------- helpers


async def claim_one(q: Queue, job_id: str, **options: Any) -> Job:
    """Claim and return the job with this id; the test's queue holds nothing else claimable."""
    jobs = await q.claim("w", **options)
    assert [job.id for job in jobs] == [job_id]
    return jobs[0]


async def stored(q: Queue, job_id: str) -> Job:
    job = await q.get(job_id)
    assert job is not None, f"job {job_id} is gone"
    return job


async def make_dead(q: Queue, error: str = "boom", **options: Any) -> str:
    """A job that used its only attempt and failed: a dead letter."""
    job_id = await q.enqueue({"dead": True}, max_attempts=1, **options)
    job = await claim_one(q, job_id, priorities=[options.get("priority", Priority.NORMAL)])
    assert await q.fail(job, error, retry_in_s=0) is JobState.DEAD
    return job_id


def settle_attempts(q: Queue, job: Job) -> list[Callable[[], Awaitable[object]]]:
    """Every way a worker can act on its lease."""
    return [
        lambda: q.complete(job, {"from": "stale"}),
        lambda: q.fail(job, "stale failure", retry_in_s=0),
        lambda: q.heartbeat(job, lease_s=30),
        lambda: q.release(job),
    ]


async def assert_stale_lease_is_refused(q: Queue, job: Job) -> None:
    """Every call with `job`'s stale token raises LeaseLost and leaves the stored job as it was."""
    before = await stored(q, job.id)
    for attempt in settle_attempts(q, job):
        with pytest.raises(LeaseLost):
            await attempt()
        after = await stored(q, job.id)
        fields = ("state", "result", "attempts", "lease_token", "lease_expires_at", "last_error")
        assert [getattr(after, f) for f in fields] == [getattr(before, f) for f in fields]


# ---------------------------------------------------------------------- leases and fencing


async def test_an_expired_lease_is_recovered_at_the_jobs_own_priority(queue: Queue) -> None:
    # Given a HIGH job claimed with a short lease, and newer NORMAL work behind it
    job_id = await queue.enqueue({"n": 1}, priority=Priority.HIGH)
    first = await claim_one(queue, job_id, lease_s=0.3)
    normal_id = await queue.enqueue({"n": 2}, priority=Priority.NORMAL)

    # When the lease runs out and upkeep runs
    await asyncio.sleep(0.5)
    report = await queue.maintain()

    # Then the job waits again at HIGH with the attempt counted, ahead of the NORMAL job
    assert report.ran
    assert report.recovered == 1
    job = await stored(queue, job_id)
    assert job.state is JobState.QUEUED
    assert job.priority is Priority.HIGH
    assert job.attempts == 1
    stats = await queue.stats()
    assert stats.levels[Priority.HIGH].depth == 1
    assert stats.levels[Priority.HIGH].in_flight == 0
    second = (await queue.claim("w2"))[0]
    assert second.id == job_id
    assert second.lease_token != first.lease_token
    assert (await queue.claim("w2"))[0].id == normal_id


async def test_a_stale_lease_token_is_refused_and_changes_nothing(queue: Queue) -> None:
    job_id = await queue.enqueue({"n": 1}, max_attempts=5)
    old = await claim_one(queue, job_id, lease_s=0.3)
    await asyncio.sleep(0.5)
    assert (await queue.maintain()).recovered == 1

    # While the job waits again, the old holder can do nothing with it
    await assert_stale_lease_is_refused(queue, old)
    assert (await stored(queue, job_id)).state is JobState.QUEUED

    # Once re-claimed, the old holder still can do nothing; the new holder completes it
    new = await claim_one(queue, job_id, lease_s=30)
    assert new.lease_token != old.lease_token
    await assert_stale_lease_is_refused(queue, old)
    await queue.complete(new, {"winner": "new"})
    done = await stored(queue, job_id)
    assert done.state is JobState.SUCCEEDED
    assert done.result == {"winner": "new"}

    # And after it finished, the old holder can neither overwrite nor fail it
    await assert_stale_lease_is_refused(queue, old)
    with pytest.raises(LeaseLost):
        await queue.complete(new, {"winner": "twice"})
    assert (await stored(queue, job_id)).result == {"winner": "new"}


async def test_a_lease_recovered_by_another_process_fences_the_first(queue_factory: Any) -> None:
    worker_process = await queue_factory.open(maintenance_interval_s=None)
    upkeep_process = await queue_factory.open(maintenance_interval_s=None)
    job_id = await worker_process.enqueue({"n": 1})
    old = await claim_one(worker_process, job_id, lease_s=0.3)
    await asyncio.sleep(0.5)
    assert (await upkeep_process.maintain()).recovered == 1
    new = await claim_one(upkeep_process, job_id)

    with pytest.raises(LeaseLost):
        await worker_process.complete(old, "late")
    await upkeep_process.complete(new, "on time")
    assert (await stored(worker_process, job_id)).result == "on time"


@pytest.mark.timeout(60)
async def test_results_are_recorded_once_per_job_while_leases_expire_under_load(queue_factory: Any) -> None:
    # Given 300 jobs, six workers on three instances with upkeep every 0.1 s, and leases of
    # 0.2 s that every twentieth attempt outlives
    instances = [await queue_factory.open(maintenance_interval_s=0.1) for _ in range(3)]
    ids = await instances[0].enqueue_many([{"payload": {"n": n}, "max_attempts": 50} for n in range(300)])
    accepted: list[str] = []
    refused = 0
    attempts = 0

    async def work(worker: int) -> None:
        nonlocal refused, attempts
        q = instances[worker % 3]
        while True:
            jobs = await q.claim(f"w{worker}", limit=5, lease_s=0.2, timeout_s=1.0)
            if not jobs:
                return
            for job in jobs:
                attempts += 1
                if attempts % 20 == 0:
                    await asyncio.sleep(0.45)  # a stalled worker: its lease runs out
                try:
                    await q.complete(job, {"by": worker, "token": job.lease_token})
                except LeaseLost:
                    refused += 1
                else:
                    accepted.append(job.id)

    # When they drain the queue
    await asyncio.gather(*(work(w) for w in range(6)))

    # Then every job succeeded, and exactly one completion of each was accepted
    assert sorted(accepted) == sorted(ids)
    assert refused > 0, "the test should have made some leases go stale"
    for job_id in ids:
        job = await stored(instances[1], job_id)
        assert job.state is JobState.SUCCEEDED


async def test_heartbeat_extends_the_lease_so_upkeep_leaves_it(queue: Queue) -> None:
    job_id = await queue.enqueue({"n": 1})
    job = await claim_one(queue, job_id, lease_s=0.4)
    first_expiry = job.lease_expires_at
    assert first_expiry is not None

    # When the worker heartbeats for longer than its original lease
    for _ in range(8):
        await asyncio.sleep(0.1)
        await queue.heartbeat(job, lease_s=0.4)
        assert (await queue.maintain()).recovered == 0

    # Then the lease moved forward, the job stayed with the worker and completes normally
    assert job.lease_expires_at is not None and job.lease_expires_at > first_expiry
    current = await stored(queue, job_id)
    assert current.state is JobState.LEASED
    assert current.lease_token == job.lease_token
    await queue.complete(job, "ok")
    assert (await stored(queue, job_id)).state is JobState.SUCCEEDED


async def test_an_unrenewed_lease_is_not_recovered_before_it_expires(queue: Queue) -> None:
    job_id = await queue.enqueue({"n": 1})
    job = await claim_one(queue, job_id, lease_s=30)
    assert (await queue.maintain()).recovered == 0
    assert (await stored(queue, job_id)).state is JobState.LEASED
    assert await queue.claim("w2") == []
    await queue.complete(job)


async def test_background_upkeep_recovers_an_expired_lease(queue_factory: Any) -> None:
    q = await queue_factory.open(maintenance_interval_s=0.2)
    job_id = await q.enqueue({"n": 1}, priority=Priority.LOW)
    await claim_one(q, job_id, lease_s=0.3)

    async def waiting_again() -> bool:
        return (await stored(q, job_id)).state is JobState.QUEUED

    await eventually(waiting_again, "upkeep queued the job again")
    job = await stored(q, job_id)
    assert job.priority is Priority.LOW
    assert job.attempts == 1


async def test_a_claim_recovers_expired_leases_itself_at_the_jobs_own_priority(queue: Queue) -> None:
    # Given a HIGH job whose worker died holding it, and newer NORMAL work; no upkeep runs
    job_id = await queue.enqueue({"n": 1}, priority=Priority.HIGH)
    first = await claim_one(queue, job_id, lease_s=0.2)
    normal_id = await queue.enqueue({"n": 2}, priority=Priority.NORMAL)
    await asyncio.sleep(0.4)

    # When any worker claims
    [second] = await queue.claim("w2")

    # Then the claim recovered the lease and served the job first, at HIGH, fenced
    assert second.id == job_id
    assert second.priority is Priority.HIGH
    assert second.attempts == 2
    assert second.lease_token != first.lease_token
    assert "lease expired" in (second.errors or [""])[0]
    await assert_stale_lease_is_refused(queue, first)
    assert (await queue.claim("w2"))[0].id == normal_id
    assert (await queue.maintain()).recovered == 0  # nothing was left for upkeep


# Redis only: a claim there runs its scans as soon as anything indexed comes due. SQLite's claim
# skips the database after an empty one until work is rung in, or for up to SAFETY_WAKE_S.
@pytest.mark.redis_only
async def test_a_claim_recovers_a_lease_that_a_heartbeat_shortened(queue: Queue) -> None:
    # Given a job leased for a long time, then renewed for a short time, after claims that
    # found nothing to recover; no upkeep runs
    job_id = await queue.enqueue({"n": 1})
    first = await claim_one(queue, job_id, lease_s=30)
    assert await queue.claim("w2") == []
    await queue.heartbeat(first, lease_s=0.2)
    await asyncio.sleep(0.4)

    # When another worker claims, the shortened lease has expired: the claim recovers it
    second = await claim_one(queue, job_id)
    assert second.attempts == 2
    await assert_stale_lease_is_refused(queue, first)


@pytest.mark.redis_only
async def test_a_claim_between_others_promotes_a_retry_as_soon_as_it_is_due(queue: Queue) -> None:
    # Given a long lease held by one worker, and a job failed with a short retry delay after
    # claims that found nothing due
    held_id = await queue.enqueue({"n": 1})
    await claim_one(queue, held_id, lease_s=30)
    job_id = await queue.enqueue({"n": 2}, priority=Priority.LOW)
    job = await claim_one(queue, job_id)
    assert await queue.claim("w2") == []
    await queue.fail(job, "try again", retry_in_s=0.2)
    assert await queue.claim("w2") == []
    await asyncio.sleep(0.4)

    # When a worker claims, the retry is served without any upkeep pass
    again = await claim_one(queue, job_id)
    assert again.attempts == 2


async def test_a_claim_ends_an_expired_lease_without_attempts_left_dead(queue: Queue) -> None:
    job_id = await queue.enqueue({"n": 1}, max_attempts=1)
    await claim_one(queue, job_id, lease_s=0.2)
    await asyncio.sleep(0.4)

    assert await queue.claim("w2") == []

    job = await stored(queue, job_id)
    assert job.state is JobState.DEAD
    assert job.last_error is not None and "lease expired" in job.last_error


async def test_a_claim_recovers_only_leases_that_expired(queue: Queue) -> None:
    live_id = await queue.enqueue({"n": 1})
    live = await claim_one(queue, live_id, lease_s=30)
    assert await queue.claim("w2") == []
    assert (await stored(queue, live_id)).state is JobState.LEASED
    await queue.complete(live)


async def test_background_upkeep_runs_its_first_pass_at_start(queue_factory: Any) -> None:
    # Given a lease left expired by a process that is gone
    crashed = await queue_factory.open(maintenance_interval_s=None)
    job_id = await crashed.enqueue({"n": 1})
    await claim_one(crashed, job_id, lease_s=0.2)
    await asyncio.sleep(0.4)

    # When a process with a long upkeep interval starts, and claims nothing
    q = await queue_factory.open(maintenance_interval_s=3600)

    async def waiting_again() -> bool:
        return (await stored(q, job_id)).state is JobState.QUEUED

    # Then its first pass has recovered the lease already, not an hour later
    await eventually(waiting_again, "the first upkeep pass queued the job again", timeout_s=2)


async def test_a_lease_expiring_on_the_last_attempt_makes_the_job_dead(queue: Queue) -> None:
    job_id = await queue.enqueue({"n": 1}, max_attempts=1)
    await claim_one(queue, job_id, lease_s=0.2)
    await asyncio.sleep(0.4)

    report = await queue.maintain()

    assert report.dead == 1
    assert report.recovered == 0
    job = await stored(queue, job_id)
    assert job.state is JobState.DEAD
    assert job.last_error
    assert [dead.id for dead in await queue.dead_letters()] == [job_id]
    assert await queue.claim("w") == []
    assert (await queue.stats()).dead == 1


async def test_upkeep_runs_in_one_process_at_a_time_without_double_recovery(queue_factory: Any) -> None:
    instances = [await queue_factory.open(maintenance_interval_s=None) for _ in range(3)]
    ids = await instances[0].enqueue_many([{"payload": {"n": n}} for n in range(5)])
    await instances[0].claim("w", limit=5, lease_s=0.2)
    await asyncio.sleep(0.4)

    reports = await asyncio.gather(*(q.maintain() for q in instances))

    assert sum(report.recovered for report in reports) == 5
    assert all(report.recovered == 0 for report in reports if not report.ran)
    for job_id in ids:
        job = await stored(instances[1], job_id)
        assert (job.state, job.attempts) == (JobState.QUEUED, 1)


# ---------------------------------------------------------------------- attempts, retries, DLQ


async def test_failed_attempts_retry_at_their_own_priority_then_go_dead(queue: Queue) -> None:
    job_id = await queue.enqueue({"n": 1}, priority=Priority.LOW, max_attempts=3)

    for attempt, error in enumerate(["boom 1", "boom 2"], start=1):
        job = await claim_one(queue, job_id)
        assert await queue.fail(job, error, retry_in_s=0) is JobState.FAILED
        current = await stored(queue, job_id)
        assert current.state in (JobState.FAILED, JobState.QUEUED)
        assert current.attempts == attempt
        assert current.last_error == error
        assert current.priority is Priority.LOW
        # Claimable again at LOW: a LOW-only worker gets it ahead of newer BULK work
        bulk_id = await queue.enqueue({"bulk": attempt}, priority=Priority.BULK)
        retried = await queue.claim("w", limit=1)
        assert [j.id for j in retried] == [job_id]
        await queue.release(retried[0])
        assert (await queue.cancel(bulk_id)) is True

    job = await claim_one(queue, job_id)
    assert await queue.fail(job, "boom 3", retry_in_s=0) is JobState.DEAD

    dead = await stored(queue, job_id)
    assert dead.state is JobState.DEAD
    assert dead.last_error == "boom 3"
    assert dead.attempts == 3
    assert dead.errors == ["boom 1", "boom 2", "boom 3"]
    assert dead.finished_at is not None
    assert await queue.claim("w") == []
    letters = await queue.dead_letters()
    assert [letter.id for letter in letters] == [job_id]
    assert letters[0].last_error == "boom 3"
    assert letters[0].priority is Priority.LOW
    assert (await queue.stats()).dead == 1


async def test_a_retry_delay_holds_the_job_back_until_it_is_due(queue: Queue) -> None:
    job_id = await queue.enqueue({"n": 1}, max_attempts=3)
    job = await claim_one(queue, job_id)
    failed_at = time.monotonic()
    assert await queue.fail(job, "try later", retry_in_s=0.5) is JobState.FAILED

    # Not claimable before its time; it counts as waiting for its time, not as queue depth
    waiting = await stored(queue, job_id)
    assert waiting.state is JobState.FAILED
    assert await queue.claim("w") == []
    stats = await queue.stats()
    assert (stats.delayed, stats.depth, stats.in_flight) == (1, 0, 0)

    # A blocking claim wakes for it once it is due, with no upkeep running
    jobs = await queue.claim("w", timeout_s=5)
    assert [j.id for j in jobs] == [job_id]
    assert time.monotonic() - failed_at >= 0.45
    assert time.monotonic() - failed_at < 4
    assert jobs[0].lease_token != job.lease_token


async def test_fail_without_a_delay_uses_backoff_and_keeps_the_job(queue_factory: Any) -> None:
    q = await queue_factory.open(maintenance_interval_s=None, retry_base_s=0.1, retry_max_s=0.2)
    job_id = await q.enqueue({"n": 1}, max_attempts=2)
    job = await claim_one(q, job_id)
    assert await q.fail(job, "transient") is JobState.FAILED
    retried = await q.claim("w", timeout_s=5)
    assert [j.id for j in retried] == [job_id]


async def test_a_dead_job_keeps_the_structured_failure_it_died_with(queue: Queue) -> None:
    refused: JobFailure = {"status": 404, "type": "invalid_request_error", "code": "model_not_found",
                           "message": "The model 'gpt-9' does not exist.", "param": "model"}
    job_id = await queue.enqueue({"n": 1}, max_attempts=3)

    # A retried attempt keeps its error text only: the failure speaks for a dead job
    job = await claim_one(queue, job_id)
    assert await queue.fail(job, "try again", retry_in_s=0, failure=refused) is JobState.FAILED
    assert (await stored(queue, job_id)).failure is None

    # The attempt that kills the job stores its failure, seen by get() and in the dead letters
    job = await claim_one(queue, job_id)
    assert await queue.fail(job, "answered HTTP 404", retry=False, failure=refused) is JobState.DEAD
    dead = await stored(queue, job_id)
    assert dead.failure == refused
    assert dead.last_error == "answered HTTP 404"
    [letter] = await queue.dead_letters()
    assert letter.failure == refused
    assert (await queue.wait(job_id, 0)).failure == refused


async def test_a_job_that_dies_from_used_attempts_keeps_its_failure_and_redrive_clears_it(
    queue: Queue,
) -> None:
    exhausted: JobFailure = {"status": 502, "type": "upstream_error", "code": "upstream_error",
                             "message": "the job failed after 1 attempt(s)", "upstream_status": 500}
    job_id = await queue.enqueue({"n": 1}, max_attempts=1)
    job = await claim_one(queue, job_id)
    assert await queue.fail(job, "HTTP 500", retry_in_s=0, failure=exhausted) is JobState.DEAD
    assert (await stored(queue, job_id)).failure == exhausted

    assert await queue.redrive([job_id]) == 1
    assert (await stored(queue, job_id)).failure is None
    # Dying again without one leaves none from the first death
    job = await claim_one(queue, job_id)
    assert await queue.fail(job, "HTTP 500 again", retry=False) is JobState.DEAD
    assert (await stored(queue, job_id)).failure is None


@pytest.mark.sqlite_only
async def test_a_sqlite_file_made_before_failures_were_stored_gains_the_column(queue_factory: Any) -> None:
    # Given a file whose jobs table has no failure column, holding a job, and (as every file made
    # before 0.2.0) no format recorded: its migration to format 1 adds the column
    old = await queue_factory.open(maintenance_interval_s=None)
    job_id = await old.enqueue({"n": 1})
    await old.close()
    path = queue_factory.url.removeprefix("sqlite:///")
    with contextlib.closing(sqlite3.connect(path)) as conn:
        conn.execute("ALTER TABLE jobs DROP COLUMN failure")
        conn.execute("DROP TABLE tidegate_store_formats")
        conn.execute("PRAGMA user_version = 0")

    # When a queue opens it, then the job is read and can die with a failure
    q = await queue_factory.open(maintenance_interval_s=None)
    job = await claim_one(q, job_id)
    assert job.failure is None
    failure: JobFailure = {"status": 400, "type": "invalid_request_error", "code": "bad", "message": "no"}
    assert await q.fail(job, "no", retry=False, failure=failure) is JobState.DEAD
    assert (await stored(q, job_id)).failure == failure


async def test_a_failure_that_is_not_a_json_object_is_refused_and_changes_nothing(queue: Queue) -> None:
    job_id = await queue.enqueue({"n": 1})
    job = await claim_one(queue, job_id)
    not_an_object: Any = ["not", "an", "object"]
    not_json: Any = {"status": 500, "when": object()}
    too_long: JobFailure = {"status": 500, "type": "api_error", "code": "x", "message": "x" * 20_000}

    for failure, problem in ((not_an_object, "must be a JSON object"), (not_json, "not JSON-serialisable"),
                             (too_long, "over the limit")):
        with pytest.raises(InvalidJob, match=problem):
            await queue.fail(job, "boom", retry=False, failure=failure)

    current = await stored(queue, job_id)
    assert (current.state, current.failure) == (JobState.LEASED, None)


async def test_redrive_puts_chosen_dead_letters_back_at_their_own_priority(queue: Queue) -> None:
    high = await make_dead(queue, priority=Priority.HIGH)
    bulk = await make_dead(queue, priority=Priority.BULK)

    assert await queue.redrive([bulk]) == 1

    redriven = await stored(queue, bulk)
    assert redriven.state is JobState.QUEUED
    assert redriven.attempts == 0
    assert redriven.priority is Priority.BULK
    assert [letter.id for letter in await queue.dead_letters()] == [high]
    assert (await queue.stats()).dead == 1
    assert (await queue.stats()).levels[Priority.BULK].depth == 1
    claimed = await claim_one(queue, bulk, priorities=[Priority.BULK])
    await queue.complete(claimed, "second time lucky")
    assert (await stored(queue, bulk)).state is JobState.SUCCEEDED
    assert await queue.redrive([bulk]) == 0  # not dead any more


async def test_redrive_all_puts_every_dead_letter_back(queue: Queue) -> None:
    ids = [await make_dead(queue, priority=level) for level in (Priority.LOW, Priority.CRITICAL)]

    assert await queue.redrive(None) == 2

    assert await queue.dead_letters() == []
    for job_id, level in zip(ids, (Priority.LOW, Priority.CRITICAL), strict=True):
        job = await stored(queue, job_id)
        assert (job.state, job.attempts, job.priority) == (JobState.QUEUED, 0, level)
    claimed = await queue.claim("w", limit=10)
    assert [job.id for job in claimed] == [ids[1], ids[0]]
    assert await queue.redrive(None) == 0


async def test_dead_letters_list_most_recent_first_with_paging(queue: Queue) -> None:
    ids = []
    for n in range(3):
        ids.append(await make_dead(queue, error=f"boom {n}"))
        await asyncio.sleep(0.01)
    letters = await queue.dead_letters()
    assert [letter.id for letter in letters] == ids[::-1]
    assert [letter.last_error for letter in letters] == ["boom 2", "boom 1", "boom 0"]
    assert [letter.id for letter in await queue.dead_letters(limit=1)] == [ids[2]]
    assert [letter.id for letter in await queue.dead_letters(limit=2, offset=1)] == [ids[1], ids[0]]
    assert await queue.dead_letters(limit=5, offset=3) == []


async def test_purge_dead_by_id_by_age_and_all(queue: Queue) -> None:
    old = await make_dead(queue)
    await asyncio.sleep(0.4)
    recent = await make_dead(queue)

    # By age: only the letter older than 0.2 s goes
    assert await queue.purge_dead(older_than_s=0.2) == 1
    assert await queue.get(old) is None
    assert [letter.id for letter in await queue.dead_letters()] == [recent]

    # By id
    other = await make_dead(queue)
    assert await queue.purge_dead([recent]) == 1
    assert await queue.get(recent) is None
    assert [letter.id for letter in await queue.dead_letters()] == [other]

    # All
    more = await make_dead(queue)
    assert await queue.purge_dead() == 2
    assert await queue.dead_letters() == []
    assert await queue.get(other) is None
    assert await queue.get(more) is None
    assert (await queue.stats()).dead == 0


async def test_purge_dead_leaves_live_jobs_alone(queue: Queue) -> None:
    live = await queue.enqueue({"n": 1}, priority=Priority.BULK)
    dead = await make_dead(queue)
    assert await queue.purge_dead([live, dead]) == 1
    assert (await stored(queue, live)).state is JobState.QUEUED
    assert await queue.get(dead) is None


async def test_purging_a_dead_letter_frees_its_idempotency_key(queue: Queue) -> None:
    job_id = await make_dead(queue, idempotency_key="order-1")
    assert await queue.enqueue({"again": True}, idempotency_key="order-1") == job_id
    assert await queue.purge_dead([job_id]) == 1
    new_id = await queue.enqueue({"again": True}, idempotency_key="order-1")
    assert new_id != job_id
    assert (await stored(queue, new_id)).state is JobState.QUEUED


# ---------------------------------------------------------------------- complete_many


async def test_complete_many_records_every_result(queue: Queue) -> None:
    ids = await queue.enqueue_many([{"payload": {"n": n}} for n in range(5)])
    jobs = await queue.claim("w", limit=5)

    assert await queue.complete_many((job, {"n": job.payload["n"], "list": [None]}) for job in jobs) == []

    for n, job_id in enumerate(ids):
        done = await stored(queue, job_id)
        assert (done.state, done.result) == (JobState.SUCCEEDED, {"n": n, "list": [None]})
    assert (await queue.stats()).in_flight == 0
    assert await queue.complete_many([]) == []


async def test_complete_many_leaves_stale_leases_unchanged_and_reports_them(queue: Queue) -> None:
    ids = await queue.enqueue_many([{"payload": {"n": n}} for n in range(3)])
    jobs = await queue.claim("w", limit=3)
    assert await queue.cancel(ids[1])

    lost = await queue.complete_many((job, "done") for job in jobs)

    assert len(lost) == 1 and ids[1] in lost[0]
    assert (await stored(queue, ids[0])).state is JobState.SUCCEEDED
    assert (await stored(queue, ids[2])).state is JobState.SUCCEEDED
    cancelled = await stored(queue, ids[1])
    assert (cancelled.state, cancelled.result) == (JobState.CANCELLED, None)


async def test_complete_many_with_a_result_that_is_not_json_writes_nothing(queue: Queue) -> None:
    ids = await queue.enqueue_many([{"payload": {"n": n}} for n in range(2)])
    first, second = await queue.claim("w", limit=2)
    with pytest.raises(InvalidJob):
        await queue.complete_many([(first, "fine"), (second, {"x": object()})])
    for job_id in ids:
        assert (await stored(queue, job_id)).state is JobState.LEASED


# ---------------------------------------------------------------------- release


async def test_release_puts_the_job_back_without_counting_the_attempt(queue: Queue) -> None:
    job_id = await queue.enqueue({"n": 1}, priority=Priority.HIGH, max_attempts=1)
    before = await stored(queue, job_id)
    job = await claim_one(queue, job_id)

    await queue.release(job)

    released = await stored(queue, job_id)
    assert released.state is JobState.QUEUED
    assert released.attempts == before.attempts
    assert released.priority is Priority.HIGH
    assert (await queue.stats()).levels[Priority.HIGH].in_flight == 0
    with pytest.raises(LeaseLost):
        await queue.complete(job, "stale")

    # The single attempt is still available: failing the re-claimed job makes it dead only now
    again = await claim_one(queue, job_id)
    assert again.attempts == job.attempts
    assert again.lease_token != job.lease_token
    assert await queue.fail(again, "boom", retry_in_s=0) is JobState.DEAD


# ---------------------------------------------------------------------- cancel


async def test_cancel_a_waiting_job(queue: Queue) -> None:
    job_id = await queue.enqueue({"n": 1})

    assert await queue.cancel(job_id) is True

    job = await stored(queue, job_id)
    assert job.state is JobState.CANCELLED
    assert job.is_final
    assert await queue.claim("w") == []
    assert (await queue.stats()).depth == 0
    assert await queue.cancel(job_id) is False


async def test_cancel_a_delayed_job(queue: Queue) -> None:
    job_id = await queue.enqueue({"n": 1}, delay_s=0.2)
    assert await queue.cancel(job_id) is True
    assert await queue.claim("w", timeout_s=0.5) == []
    assert (await stored(queue, job_id)).state is JobState.CANCELLED
    assert (await queue.stats()).delayed == 0


async def test_cancel_a_leased_job_fences_its_worker(queue: Queue) -> None:
    job_id = await queue.enqueue({"n": 1})
    job = await claim_one(queue, job_id)

    assert await queue.cancel(job_id) is True

    for attempt in settle_attempts(queue, job):
        with pytest.raises(LeaseLost):
            await attempt()
    cancelled = await stored(queue, job_id)
    assert cancelled.state is JobState.CANCELLED
    assert cancelled.result is None
    assert (await queue.stats()).in_flight == 0
    assert await queue.claim("w") == []


async def test_cancel_of_a_finished_job_returns_false_and_changes_nothing(queue: Queue) -> None:
    job_id = await queue.enqueue({"n": 1})
    job = await claim_one(queue, job_id)
    await queue.complete(job, {"answer": 42})

    assert await queue.cancel(job_id) is False

    done = await stored(queue, job_id)
    assert (done.state, done.result) == (JobState.SUCCEEDED, {"answer": 42})
    dead = await make_dead(queue)
    assert await queue.cancel(dead) is False
    assert (await stored(queue, dead)).state is JobState.DEAD


async def test_cancel_of_an_unknown_job_returns_false(queue: Queue) -> None:
    assert await queue.cancel("no-such-job") is False


# ---------------------------------------------------------------------- forget


async def test_forget_deletes_a_finished_job_and_frees_its_idempotency_key(queue: Queue) -> None:
    job_id = await queue.enqueue({"n": 1}, idempotency_key="k-1")
    job = await claim_one(queue, job_id)
    await queue.complete(job, {"answer": 42})

    assert await queue.forget(job_id) is True

    assert await queue.get(job_id) is None
    assert await queue.idempotent_ids(["k-1"]) == {}
    assert await queue.enqueue({"n": 2}, idempotency_key="k-1") != job_id
    assert await queue.forget(job_id) is False


async def test_forget_deletes_cancelled_and_dead_jobs(queue: Queue) -> None:
    cancelled = await queue.enqueue({"n": 1})
    await queue.cancel(cancelled)
    dead = await make_dead(queue)

    assert await queue.forget(cancelled) is True
    assert await queue.forget(dead) is True

    assert await queue.get(cancelled) is None and await queue.get(dead) is None
    assert (await queue.stats()).dead == 0


async def test_forget_leaves_a_job_that_has_not_finished(queue: Queue) -> None:
    leased = await claim_one(queue, await queue.enqueue({"n": 1}))
    waiting = await queue.enqueue({"n": 2})

    assert await queue.forget(waiting) is False
    assert await queue.forget(leased.id) is False
    assert await queue.forget("no-such-job") is False

    assert (await stored(queue, waiting)).state is JobState.QUEUED
    await queue.complete(leased, {"ok": True})
    assert (await stored(queue, leased.id)).state is JobState.SUCCEEDED


async def test_release_with_a_delay_parks_the_job_without_counting_the_attempt(queue: Queue) -> None:
    job_id = await queue.enqueue({"n": 1}, priority="low")
    [job] = await queue.claim("w")
    await queue.release(job, delay_s=0.4)

    parked = await queue.get(job_id)
    assert parked is not None and parked.state is JobState.DELAYED and parked.attempts == 0
    assert await queue.claim("w") == []
    [again] = await queue.claim("w", timeout_s=5)
    assert again.id == job_id and again.priority is Priority.LOW and again.attempts == 1
    with pytest.raises(LeaseLost):
        await queue.release(job, delay_s=1)


async def test_release_with_a_reason_records_why_the_job_waits(queue: Queue) -> None:
    job_id = await queue.enqueue({"n": 1})
    [job] = await queue.claim("w")
    await queue.release(job, delay_s=0.3, reason="deferred until 12:00: budget exhausted")

    parked = await queue.get(job_id)
    assert parked is not None and parked.state is JobState.DELAYED and parked.attempts == 0
    assert parked.last_error == "deferred until 12:00: budget exhausted"
    assert parked.errors == []  # a deferral is no attempt
    assert parked.not_before is not None

    # A later release without a reason (a shutdown) keeps the last one
    [again] = await queue.claim("w", timeout_s=5)
    await queue.release(again)
    waiting = await queue.get(job_id)
    assert waiting is not None and waiting.state is JobState.QUEUED and waiting.attempts == 0
    assert waiting.last_error == "deferred until 12:00: budget exhausted"


async def test_fail_without_retry_is_dead_at_once_with_attempts_left(queue: Queue) -> None:
    job_id = await queue.enqueue({"n": 1}, max_attempts=5)
    [job] = await queue.claim("w")
    assert await queue.fail(job, "400 bad request: messages is required", retry=False) is JobState.DEAD

    dead = await queue.get(job_id)
    assert dead is not None and dead.state is JobState.DEAD and dead.attempts == 1
    assert dead.last_error == "400 bad request: messages is required"
    assert [letter.id for letter in await queue.dead_letters()] == [job_id]
