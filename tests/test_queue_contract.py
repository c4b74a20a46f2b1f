"""The queue contract, part 1: priorities, ordering, exactly-once claims, blocking claims,
idempotency, validation and lifecycle. Every backend test runs on SQLite and Redis through the
`queue_factory` fixture; several `open()` calls model several processes sharing one queue.

Parts 2 and 3 (`test_queue_contract_leases.py`, `test_queue_contract_scheduling.py`) cover
leases, retries, the dead-letter queue, scheduling, admission control, fairness and retention.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from datetime import datetime, timedelta
from typing import Any

import pytest

from support.claims import ClaimWaits
from support.redis_keys import redis_client
from support.waiting import eventually
from tidegate import (
    ConfigError,
    InvalidJob,
    InvalidPriority,
    Job,
    JobSpec,
    JobState,
    LeaseLost,
    PayloadTooLarge,
    Priority,
    Queue,
    QueueClosed,
    QueueUnavailable,
)

# ---------------------------------------------------------------------- helpers


async def claim_all(q: Queue, *, limit: int = 100, **options: Any) -> list[Job]:
    """Claim until the queue hands out nothing more; the jobs in the order they came out."""
    claimed: list[Job] = []
    while jobs := await q.claim("drain", limit=limit, **options):
        claimed.extend(jobs)
    return claimed


async def assert_nothing_written(q: Queue) -> None:
    stats = await q.stats()
    assert stats.depth == 0
    assert stats.delayed == 0
    assert stats.in_flight == 0
    assert await q.claim("probe", limit=10) == []


# ---------------------------------------------------------------------- Priority.parse


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (Priority.LOW, Priority.LOW),
        (0, Priority.CRITICAL),
        (4, Priority.BULK),
        ("critical", Priority.CRITICAL),
        ("HIGH", Priority.HIGH),
        ("Normal", Priority.NORMAL),
        ("lOw", Priority.LOW),
        ("bulk", Priority.BULK),
        ("0", Priority.CRITICAL),
        ("3", Priority.LOW),
        (" 2 ", Priority.NORMAL),
    ],
)
def test_priority_parse_accepts_names_levels_and_digit_strings(value: object, expected: Priority) -> None:
    assert Priority.parse(value) is expected


@pytest.mark.parametrize(
    "value", [5, -1, "5", "-1", "urgent", "", 1.5, 2.0, True, False, None, [1], object()]
)
def test_priority_parse_rejects_anything_else(value: object) -> None:
    with pytest.raises(InvalidPriority):
        Priority.parse(value)


def test_invalid_priority_is_an_invalid_job_and_a_value_error() -> None:
    with pytest.raises(InvalidJob):
        Priority.parse("urgent")
    with pytest.raises(ValueError):
        Priority.parse(7)


# ---------------------------------------------------------------------- enqueue and get


async def test_enqueue_returns_an_id_and_get_shows_the_stored_job(queue: Queue) -> None:
    payload = {"prompt": "hello", "nested": {"list": [1, 2.5, None, "x"], "flag": True}}
    job_id = await queue.enqueue(payload, priority="high", tenant="acme")
    assert isinstance(job_id, str) and job_id

    job = await queue.get(job_id)
    assert job is not None
    assert job.id == job_id
    assert job.payload == payload
    assert job.priority is Priority.HIGH
    assert job.tenant == "acme"
    assert job.state is JobState.QUEUED
    assert job.attempts == 0
    assert job.max_attempts == queue.settings.default_max_attempts
    assert job.created_at.tzinfo is not None
    assert job.worker_id is None
    assert job.lease_expires_at is None


async def test_get_of_an_unknown_id_is_none(queue: Queue) -> None:
    assert await queue.get("no-such-job") is None


async def test_enqueue_many_accepts_specs_and_mappings(queue: Queue) -> None:
    ids = await queue.enqueue_many(
        [JobSpec(payload={"n": 0}, priority=Priority.LOW), {"payload": {"n": 1}, "priority": 1}]
    )
    assert len(ids) == 2 and len(set(ids)) == 2
    first, second = await queue.get(ids[0]), await queue.get(ids[1])
    assert first is not None and first.priority is Priority.LOW and first.payload == {"n": 0}
    assert second is not None and second.priority is Priority.HIGH and second.payload == {"n": 1}
    assert await queue.enqueue_many([]) == []


# ---------------------------------------------------------------------- ordering


async def test_strict_priority_across_levels_and_fifo_within_a_level(queue: Queue) -> None:
    # Given jobs enqueued one by one in a shuffled priority order
    rng = random.Random(7)
    levels = [rng.choice(list(Priority)) for _ in range(40)]
    ids = [await queue.enqueue({"n": n}, priority=level) for n, level in enumerate(levels)]

    # When a worker claims them one at a time
    claimed = [(await queue.claim("w"))[0] for _ in ids]

    # Then they come out by priority, and in enqueue order within a level
    expected = [ids[n] for n in sorted(range(len(ids)), key=lambda n: (levels[n], n))]
    assert [job.id for job in claimed] == expected
    assert await queue.claim("w") == []


async def test_a_batch_claim_lists_jobs_highest_priority_first_then_fifo(queue: Queue) -> None:
    specs = [{"payload": {"n": n}, "priority": (n * 3) % 5} for n in range(25)]
    ids = await queue.enqueue_many(specs)
    claimed = await queue.claim("w", limit=10)
    expected = [ids[n] for n in sorted(range(25), key=lambda n: ((n * 3) % 5, n))]
    assert [job.id for job in claimed] == expected[:10]
    assert [job.id for job in await claim_all(queue, limit=7)] == expected[10:]


async def test_fifo_within_a_batch(queue: Queue) -> None:
    ids = await queue.enqueue_many([{"payload": {"n": n}} for n in range(30)])
    assert [job.id for job in await claim_all(queue, limit=4)] == ids


async def test_concurrent_enqueuers_keep_their_own_fifo_and_priority_holds_overall(
    queue_factory: Any,
) -> None:
    # Given four producers on two queue instances ("processes"), each enqueueing 60 jobs at
    # random levels concurrently, two one by one and two in small batches
    instances = [await queue_factory.open(maintenance_interval_s=None) for _ in range(2)]

    async def produce(producer: int) -> None:
        q = instances[producer % 2]
        rng = random.Random(producer)
        specs = [{"payload": {"producer": producer, "n": n}, "priority": rng.randrange(5)} for n in range(60)]
        if producer < 2:
            for spec in specs:
                await q.enqueue(**spec)
        else:
            for start in range(0, len(specs), 5):
                await q.enqueue_many(specs[start : start + 5])
                await asyncio.sleep(0)

    await asyncio.gather(*(produce(p) for p in range(4)))

    # When one worker drains the queue in batches of 7
    claimed = await claim_all(instances[1], limit=7)

    # Then every job came out once, levels never go back up, and each producer's jobs on a
    # level come out in the order that producer enqueued them
    assert len(claimed) == 240 and len({job.id for job in claimed}) == 240
    priorities = [int(job.priority) for job in claimed]
    assert priorities == sorted(priorities)
    seen: dict[tuple[int, int], list[int]] = {}
    for job in claimed:
        seen.setdefault((job.payload["producer"], int(job.priority)), []).append(job.payload["n"])
    for sequence in seen.values():
        assert sequence == sorted(sequence)


async def test_stats_count_the_succeeded_jobs_kept_and_the_dead_letters(queue: Queue) -> None:
    # Given three jobs that succeed, one that dies and one cancelled (finished, not succeeded)
    await queue.enqueue_many([{"payload": {"n": n}} for n in range(5)])
    claimed = await claim_all(queue)
    for job in claimed[:3]:
        await queue.complete(job, {"n": job.payload["n"]})
    assert await queue.fail(claimed[3], "refused", retry=False) is JobState.DEAD
    await queue.release(claimed[4])
    await queue.cancel(claimed[4].id)

    stats = await queue.stats()

    assert (stats.succeeded, stats.dead, stats.depth, stats.in_flight) == (3, 1, 0, 0)
    # A succeeded job forgotten is no longer counted
    await queue.forget(claimed[0].id)
    assert (await queue.stats()).succeeded == 2


async def test_claim_by_priority_range_never_hands_out_other_levels(queue: Queue) -> None:
    ids_by_level = {
        level: await queue.enqueue_many([{"payload": {"n": n}, "priority": level} for n in range(6)])
        for level in Priority
    }

    claimed = await claim_all(queue, limit=4, priorities=[0, "high"])

    assert {int(job.priority) for job in claimed} == {0, 1}
    assert [job.id for job in claimed] == ids_by_level[Priority.CRITICAL] + ids_by_level[Priority.HIGH]
    stats = await queue.stats()
    for level in (Priority.NORMAL, Priority.LOW, Priority.BULK):
        assert stats.levels[level].depth == 6
    assert [job.id for job in await claim_all(queue, priorities=[Priority.BULK])] == ids_by_level[
        Priority.BULK
    ]


async def test_claim_rejects_a_bad_limit_or_priority_filter(queue: Queue) -> None:
    with pytest.raises(ValueError):
        await queue.claim("w", limit=0)
    with pytest.raises(InvalidPriority):
        await queue.claim("w", priorities=["urgent"])
    with pytest.raises(ValueError):
        await queue.claim("w", priorities=[])


# ---------------------------------------------------------------------- exactly-once claims


@pytest.mark.timeout(120)
async def test_every_job_is_claimed_exactly_once_by_concurrent_workers(queue_factory: Any) -> None:
    # Given 10,000 jobs over all levels and two queue instances ("processes")
    total = 10_000
    instances = [await queue_factory.open(maintenance_interval_s=None) for _ in range(2)]
    enqueued: list[str] = []
    for start in range(0, total, 1_000):
        enqueued += await instances[0].enqueue_many(
            [{"payload": {"n": n}, "priority": n % 5} for n in range(start, start + 1_000)]
        )
    assert len(set(enqueued)) == total

    # When eight workers claim in batches of 50 and complete each job
    claims: list[str] = []

    async def work(worker: int) -> None:
        q = instances[worker % 2]
        while jobs := await q.claim(f"worker-{worker}", limit=50):
            for job in jobs:
                claims.append(job.id)
                await q.complete(job, {"by": worker})

    await asyncio.gather(*(work(w) for w in range(8)))

    # Then each job was handed out exactly once and none is left
    counts = Counter(claims)
    assert [job_id for job_id, n in counts.items() if n > 1] == []
    assert set(counts) == set(enqueued)
    stats = await instances[1].stats()
    assert (stats.depth, stats.in_flight) == (0, 0)
    for job_id in enqueued[:: total // 20]:
        job = await instances[1].get(job_id)
        assert job is not None and job.state is JobState.SUCCEEDED


async def test_each_claim_carries_a_fresh_lease(queue: Queue) -> None:
    await queue.enqueue_many([{"payload": {"n": n}} for n in range(3)])
    jobs = await queue.claim("w-1", limit=3, lease_s=10)
    assert len(jobs) == 3
    assert all(job.state is JobState.LEASED for job in jobs)
    assert all(job.lease_token is not None for job in jobs)
    assert all(job.worker_id == "w-1" for job in jobs)
    for job in jobs:
        assert job.lease_expires_at is not None
        remaining = (job.lease_expires_at - datetime.now(job.lease_expires_at.tzinfo)).total_seconds()
        assert 5 < remaining <= 10.5
        stored = await queue.get(job.id)
        assert stored is not None and stored.state is JobState.LEASED


# ---------------------------------------------------------------------- blocking claims


async def test_blocking_claim_wakes_when_a_job_is_enqueued(queue: Queue) -> None:
    waits = ClaimWaits(queue)
    started = time.monotonic()
    claimer = asyncio.create_task(queue.claim("w", timeout_s=5))
    await eventually(lambda: waits.count, "the claim waits for work")
    assert not claimer.done()

    job_id = await queue.enqueue({"n": 1})
    jobs = await claimer

    assert [job.id for job in jobs] == [job_id]
    assert time.monotonic() - started < 4  # woken by the enqueue, not by the timeout


async def test_blocking_claim_wakes_for_a_job_enqueued_by_another_process(queue_factory: Any) -> None:
    consumer = await queue_factory.open(maintenance_interval_s=None)
    producer = await queue_factory.open(maintenance_interval_s=None)
    waits = ClaimWaits(consumer)
    started = time.monotonic()
    claimer = asyncio.create_task(consumer.claim("w", timeout_s=5))
    await eventually(lambda: waits.count, "the claim waits for work")

    job_id = await producer.enqueue({"n": 1})
    jobs = await claimer

    assert [job.id for job in jobs] == [job_id]
    assert time.monotonic() - started < 4


async def test_blocking_claim_on_an_empty_queue_returns_nothing_after_the_timeout(queue: Queue) -> None:
    started = time.monotonic()
    assert await queue.claim("w", timeout_s=0.5) == []
    assert time.monotonic() - started >= 0.45


async def test_blocking_claim_ignores_work_on_levels_it_does_not_serve(queue: Queue) -> None:
    waits = ClaimWaits(queue)
    started = time.monotonic()
    claimer = asyncio.create_task(queue.claim("w", priorities=[Priority.CRITICAL], timeout_s=0.6))
    await eventually(lambda: waits.count, "the claim waits for work")
    bulk_id = await queue.enqueue({"n": 1}, priority=Priority.BULK)

    assert await claimer == []
    assert time.monotonic() - started >= 0.55
    bulk = await queue.get(bulk_id)
    assert bulk is not None and bulk.state is JobState.QUEUED


async def test_a_blocking_claim_returns_when_its_wake_event_is_set_and_leaves_later_work_queued(
    queue: Queue,
) -> None:
    # Given a claim of the critical level blocked on an empty queue, with a long timeout
    wake, waits = asyncio.Event(), ClaimWaits(queue)
    started = time.monotonic()
    claimer = asyncio.create_task(queue.claim("w", priorities=[Priority.CRITICAL], timeout_s=30, wake=wake))
    await eventually(lambda: waits.count, "the claim waits for work")
    assert not claimer.done()

    # When its caller sets the wake event, it returns empty-handed, well before its timeout
    wake.set()
    assert await claimer == []
    assert time.monotonic() - started < 20

    # Then work enqueued afterwards is neither lost nor leased: the next claim takes it
    job_id = await queue.enqueue({"n": 1}, priority=Priority.CRITICAL)
    stored = await queue.get(job_id)
    assert stored is not None and stored.state is JobState.QUEUED
    assert [job.id for job in await queue.claim("w", priorities=[Priority.CRITICAL])] == [job_id]


async def test_a_claim_woken_while_work_arrives_holds_every_job_leased_to_it(queue: Queue) -> None:
    # A wake and an enqueue at once: whatever the claim took comes back to its caller; the
    # rest stays queued. No job is left leased to a claim that did not return it.
    waits = ClaimWaits(queue)
    for _ in range(20):
        wake, waits.count = asyncio.Event(), 0
        claimer = asyncio.create_task(queue.claim("w", limit=5, timeout_s=30, wake=wake))
        await eventually(lambda: waits.count, "the claim waits for work")
        enqueued = asyncio.create_task(queue.enqueue_many([{"payload": {"n": n}} for n in range(3)]))
        wake.set()
        taken, ids = await claimer, await enqueued
        jobs = [await queue.get(job_id) for job_id in ids]
        leased = {job.id for job in jobs if job is not None and job.state is JobState.LEASED}
        assert leased == {job.id for job in taken}
        queued = [job for job in jobs if job is not None and job.state is JobState.QUEUED]
        assert len(leased) + len(queued) == 3
        for job in taken:
            await queue.complete(job)
        for job in await queue.claim("w", limit=5):
            await queue.complete(job)


@pytest.mark.redis_only
async def test_a_claim_woken_at_any_moment_of_its_wait_drops_no_connection(queue_factory: Any) -> None:
    # A wake ends a Redis claim's BLPOP from the server's side, never by cancelling the command:
    # a command cancelled in flight costs its connection, and a cancellation that arrives while
    # it is being sent is lost (the claim then waits out its BLPOP while a worker's slots empty).
    q: Queue = await queue_factory.open(maintenance_interval_s=None)
    observer = redis_client(queue_factory.url)

    async def woken_claim(loop_turns: int) -> list[Job]:
        wake = asyncio.Event()
        claimer = asyncio.create_task(q.claim("w", priorities=[Priority.CRITICAL], timeout_s=30, wake=wake))
        for _ in range(loop_turns):
            await asyncio.sleep(0)
        wake.set()
        return await claimer

    try:
        # Given a queue that has claimed and been woken before
        assert await woken_claim(50) == []
        closed_before = await connections_closed(observer)

        # When claims are woken at every moment from their start to a BLPOP under way
        for loop_turns in range(50):
            assert await woken_claim(loop_turns) == []

        # Then each returned and kept its connections: the server saw none of them close
        assert await connections_closed(observer) == closed_before
    finally:
        await observer.aclose()


async def connections_closed(client: Any) -> int:
    """Connections the Redis server (every node of a cluster) has accepted and seen close."""
    info = await client.info()
    per_node = info.values() if "total_connections_received" not in info else [info]
    return sum(int(node["total_connections_received"]) - int(node["connected_clients"]) for node in per_node)


async def test_one_batch_wakes_as_many_blocked_claimers_as_it_has_jobs(queue_factory: Any) -> None:
    consumers = [await queue_factory.open(maintenance_interval_s=None) for _ in range(2)]
    producer = await queue_factory.open(maintenance_interval_s=None)
    waits = ClaimWaits(*consumers)
    started = time.monotonic()
    claimers = [asyncio.create_task(consumers[n % 2].claim(f"w{n}", timeout_s=5)) for n in range(4)]
    await eventually(lambda: waits.count >= 4, "the four claims wait for work")

    ids = await producer.enqueue_many([{"payload": {"n": n}} for n in range(4)])
    results = await asyncio.gather(*claimers)

    assert sorted(job.id for jobs in results for job in jobs) == sorted(ids)
    assert all(len(jobs) == 1 for jobs in results)
    assert time.monotonic() - started < 4


async def test_a_blocking_claim_recovers_a_lease_that_expires_while_it_waits(queue_factory: Any) -> None:
    # Given a job leased by a worker that then crashed, and another process with no upkeep
    consumer = await queue_factory.open(maintenance_interval_s=None)
    crashed = await queue_factory.open(maintenance_interval_s=None)
    job_id = await crashed.enqueue({"n": 1})
    [lost] = await crashed.claim("crashed-worker", lease_s=0.6)
    started = time.monotonic()
    # When the other process blocks in a claim while the lease is still live
    waits = ClaimWaits(consumer)
    claimer = asyncio.create_task(consumer.claim("w", timeout_s=5))
    await eventually(lambda: waits.count, "the claim waits for work")
    assert not claimer.done()
    jobs = await claimer

    # Then it wakes when the lease expires and takes the job itself, under a new token
    assert [job.id for job in jobs] == [job_id]
    assert jobs[0].lease_token != lost.lease_token
    assert "lease expired" in (jobs[0].errors or [""])[0]
    assert time.monotonic() - started < 4  # well before the 5 s safety wake


async def test_blocking_claim_wakes_when_another_process_releases_or_redrives(queue_factory: Any) -> None:
    consumer = await queue_factory.open(maintenance_interval_s=None)
    other = await queue_factory.open(maintenance_interval_s=None)
    released_id, dead_id = await other.enqueue_many(
        [{"payload": {"n": 1}}, {"payload": {"n": 2}, "max_attempts": 1}]
    )
    first, second = await other.claim("w", limit=2)
    await other.fail(second, "boom", retry_in_s=0)

    waits = ClaimWaits(consumer)
    for wake_up, expected in ((lambda: other.release(first), released_id), (other.redrive, dead_id)):
        started, waits.count = time.monotonic(), 0
        claimer = asyncio.create_task(consumer.claim("w", timeout_s=5))
        await eventually(lambda: waits.count, "the claim waits for work")
        assert not claimer.done()
        await wake_up()
        assert [job.id for job in await claimer] == [expected]
        assert time.monotonic() - started < 4


# ---------------------------------------------------------------------- idempotency


async def test_the_same_idempotency_key_returns_the_first_job(queue_factory: Any) -> None:
    first_process = await queue_factory.open(maintenance_interval_s=None)
    second_process = await queue_factory.open(maintenance_interval_s=None)

    first = await first_process.enqueue({"n": 1}, idempotency_key="order-42")
    again = await first_process.enqueue({"n": 2}, idempotency_key="order-42", priority="high")
    elsewhere = await second_process.enqueue({"n": 3}, idempotency_key="order-42")

    assert first == again == elsewhere
    job = await first_process.get(first)
    assert job is not None and job.payload == {"n": 1} and job.idempotency_key == "order-42"
    assert (await first_process.stats()).depth == 1
    other = await second_process.enqueue({"n": 4}, idempotency_key="order-43")
    assert other != first
    assert (await first_process.stats()).depth == 2


async def test_known_idempotency_keys_map_to_their_jobs(queue_factory: Any) -> None:
    first_process = await queue_factory.open(maintenance_interval_s=None)
    second_process = await queue_factory.open(maintenance_interval_s=None)
    a, b = await first_process.enqueue_many([{"payload": {"n": 1}, "idempotency_key": "key-a"},
                                             {"payload": {"n": 2}, "idempotency_key": "key-b"}])

    # Another instance sees both; an unknown key is left out, a repeated one asked once
    known = await second_process.idempotent_ids(["key-a", "key-b", "key-c", "key-a"])

    assert known == {"key-a": a, "key-b": b}
    assert await second_process.idempotent_ids([]) == {}


async def test_concurrent_enqueues_with_one_idempotency_key_make_one_job(queue_factory: Any) -> None:
    instances = [await queue_factory.open(maintenance_interval_s=None) for _ in range(3)]
    ids = await asyncio.gather(
        *(instances[n % 3].enqueue({"n": n}, idempotency_key="race") for n in range(12))
    )
    assert len(set(ids)) == 1
    assert (await instances[0].stats()).depth == 1


async def test_an_idempotency_key_repeated_inside_one_batch_makes_one_job(queue: Queue) -> None:
    ids = await queue.enqueue_many(
        [
            {"payload": {"n": 0}, "idempotency_key": "k"},
            {"payload": {"n": 1}},
            {"payload": {"n": 2}, "idempotency_key": "k"},
        ]
    )
    assert len(ids) == 3
    assert ids[0] == ids[2]
    assert ids[1] != ids[0]
    assert (await queue.stats()).depth == 2
    assert await queue.enqueue({"n": 3}, idempotency_key="k") == ids[0]


async def test_an_idempotency_key_still_dedupes_after_the_job_finished(queue: Queue) -> None:
    job_id = await queue.enqueue({"n": 1}, idempotency_key="once")
    [job] = await queue.claim("w")
    await queue.complete(job, "done")
    assert await queue.enqueue({"n": 1}, idempotency_key="once") == job_id
    assert await queue.claim("w") == []


# ---------------------------------------------------------------------- validation


def _naive_future() -> datetime:
    return datetime.now() + timedelta(seconds=60)  # naive on purpose


INVALID_JOBS: list[tuple[str, dict[str, Any], str | None]] = [
    ("payload-string", {"payload": "text"}, None),
    ("payload-list", {"payload": [1, 2]}, None),
    ("payload-none", {"payload": None}, None),
    ("payload-object", {"payload": {"x": object()}}, None),
    ("payload-set", {"payload": {"x": {1, 2}}}, None),
    ("payload-int-key", {"payload": {1: "a"}}, None),
    ("priority-name", {"payload": {}, "priority": "urgent"}, None),
    ("priority-level", {"payload": {}, "priority": 5}, None),
    ("max-attempts-zero", {"payload": {}, "max_attempts": 0}, "max_attempts"),
    ("max-attempts-negative", {"payload": {}, "max_attempts": -1}, "max_attempts"),
    ("max-attempts-float", {"payload": {}, "max_attempts": 1.5}, "max_attempts"),
    ("max-attempts-bool", {"payload": {}, "max_attempts": True}, "max_attempts"),
    ("max-attempts-string", {"payload": {}, "max_attempts": "3"}, "max_attempts"),
    ("not-before-naive", {"payload": {}, "not_before": _naive_future()}, None),
    ("deadline-naive", {"payload": {}, "deadline": _naive_future()}, None),
    ("not-before-not-a-datetime", {"payload": {}, "not_before": "tomorrow"}, "not_before"),
    ("delay-negative", {"payload": {}, "delay_s": -1}, "delay_s"),
    ("delay-and-not-before", {"payload": {}, "delay_s": 1, "not_before": datetime.now().astimezone()}, None),
    ("timeout-negative", {"payload": {}, "timeout_s": -0.5}, "timeout_s"),
    ("tenant-empty", {"payload": {}, "tenant": ""}, "tenant"),
    ("tenant-not-text", {"payload": {}, "tenant": 5}, "tenant"),
    ("idempotency-key-not-text", {"payload": {}, "idempotency_key": 5}, "idempotency_key"),
    ("unknown-field", {"payload": {}, "colour": "red"}, "colour"),
    ("missing-payload", {"priority": 1}, "payload"),
]


@pytest.mark.parametrize(
    ("spec", "named"), [(spec, named) for _, spec, named in INVALID_JOBS], ids=[i for i, _, _ in INVALID_JOBS]
)
async def test_an_invalid_job_is_refused_and_nothing_is_written(
    queue: Queue, spec: dict[str, Any], named: str | None
) -> None:
    with pytest.raises(InvalidJob) as raised:
        await queue.enqueue_many([spec])
    if named is not None:
        assert named in str(raised.value)
    await assert_nothing_written(queue)


async def test_enqueue_refuses_a_payload_that_is_not_an_object(queue: Queue) -> None:
    with pytest.raises(InvalidJob):
        await queue.enqueue("text")  # type: ignore[arg-type]
    with pytest.raises(InvalidJob):
        await queue.enqueue({"x": {1, 2}})
    with pytest.raises(InvalidJob, match="colour"):
        await queue.enqueue({}, colour="red")
    await assert_nothing_written(queue)


async def test_one_bad_job_in_a_batch_writes_none_of_the_batch(queue: Queue) -> None:
    batch: list[dict[str, Any]] = [
        {"payload": {"n": 0}, "idempotency_key": "first"},
        {"payload": {"n": 1}},
        {"payload": {"n": 2}, "max_attempts": 0},
        {"payload": {"n": 3}, "priority": "bulk"},
    ]
    with pytest.raises(InvalidJob, match="max_attempts"):
        await queue.enqueue_many(batch)
    await assert_nothing_written(queue)
    # The idempotency key of the refused batch was not recorded either.
    job_id = await queue.enqueue({"n": 9}, idempotency_key="first")
    job = await queue.get(job_id)
    assert job is not None and job.payload == {"n": 9}


async def test_a_payload_over_the_size_limit_is_refused(queue_factory: Any) -> None:
    q = await queue_factory.open(maintenance_interval_s=None, max_payload_bytes=100)
    with pytest.raises(PayloadTooLarge):
        await q.enqueue({"text": "a" * 200})
    with pytest.raises(PayloadTooLarge):
        await q.enqueue_many([{"payload": {"n": 0}}, {"payload": {"text": "a" * 200}}, {"payload": {"n": 2}}])
    await assert_nothing_written(q)
    await q.enqueue({"text": "a" * 50})
    assert (await q.stats()).depth == 1


async def test_a_batch_over_max_batch_is_refused(queue_factory: Any) -> None:
    q = await queue_factory.open(maintenance_interval_s=None, max_batch=5)
    with pytest.raises(InvalidJob):
        await q.enqueue_many([{"payload": {"n": n}} for n in range(6)])
    await assert_nothing_written(q)


async def test_complete_refuses_a_result_that_is_not_json(queue: Queue) -> None:
    job_id = await queue.enqueue({})
    [job] = await queue.claim("w")
    with pytest.raises(InvalidJob):
        await queue.complete(job, {"x": object()})
    stored = await queue.get(job_id)
    assert stored is not None and stored.state is JobState.LEASED
    await queue.complete(job, {"ok": True})


async def test_a_job_that_was_never_claimed_cannot_be_settled(queue: Queue) -> None:
    job_id = await queue.enqueue({})
    unclaimed = await queue.get(job_id)
    assert unclaimed is not None
    with pytest.raises((InvalidJob, LeaseLost)):
        await queue.complete(unclaimed)
    stored = await queue.get(job_id)
    assert stored is not None and stored.state is JobState.QUEUED


@pytest.mark.redis_only
async def test_every_redis_key_of_a_queue_carries_its_hash_tag(queue_factory: Any) -> None:
    # One hash tag per queue keeps every script's keys in one Redis Cluster slot.
    client = redis_client(queue_factory.url)
    try:
        before = {key async for key in client.scan_iter(count=1_000)}
        q = await queue_factory.open(
            maintenance_interval_s=None, aging_interval_s=0.1, tenant_round_robin=True, finished_ttl_s=60
        )
        await q.enqueue_many(
            [
                {"payload": {"n": 0}, "idempotency_key": "k", "tenant": "A", "timeout_s": 60},
                {"payload": {"n": 1}, "priority": "bulk", "tenant": "B"},
                {"payload": {"n": 2}, "delay_s": 60},
                {"payload": {"n": 3}, "max_attempts": 1},
            ]
        )
        first, second = await q.claim("w", limit=2, priorities=[2])
        await q.complete(first, "done")
        assert await q.fail(second, "boom", retry_in_s=0) is JobState.DEAD
        await q.claim("w", timeout_s=0.05, priorities=[0])
        await q.wait(first.id, timeout_s=0)
        await asyncio.sleep(0.15)  # the aging interval passes: the pass below ages the jobs (and writes)
        await q.maintain()
        await q.stats()
        created = {key async for key in client.scan_iter(count=1_000)} - before
    finally:
        await client.aclose()

    tag = f"{{{queue_factory.queue_name}}}".encode()
    assert created, "the queue should have written keys"
    assert [key for key in created if tag not in key] == []


@pytest.mark.redis_only
async def test_a_write_no_replica_confirms_in_time_is_refused(queue_factory: Any) -> None:
    # The session's servers have no replicas: with wait_replicas=1 no write is acknowledged.
    q = await queue_factory.open(maintenance_interval_s=None, wait_replicas=1, wait_timeout_s=0.05)
    with pytest.raises(QueueUnavailable, match="0 of 1 replicas confirmed it"):
        await q.enqueue({"n": 1})
    # The master made the write all the same (the refusal says so), and reads are not held up
    assert (await q.stats()).levels[Priority.NORMAL].depth == 1


# ---------------------------------------------------------------------- lifecycle


async def test_a_queue_used_before_open_raises_queue_closed(tmp_path: Any) -> None:
    # No I/O happens before open(), so neither URL needs a live server.
    for url in (f"sqlite:///{tmp_path / 'unopened.db'}", "redis://127.0.0.1:1/0"):
        q = Queue.from_url(url)
        with pytest.raises(QueueClosed):
            await q.enqueue({})
        with pytest.raises(QueueClosed):
            await q.claim("w")
        with pytest.raises(QueueClosed):
            await q.stats()


async def test_a_closed_queue_refuses_work_and_cannot_reopen(queue_factory: Any) -> None:
    q = await queue_factory.open(maintenance_interval_s=None)
    job_id = await q.enqueue({})
    await q.close()
    await q.close()  # idempotent

    with pytest.raises(QueueClosed):
        await q.enqueue({})
    with pytest.raises(QueueClosed):
        await q.get(job_id)
    with pytest.raises(QueueClosed):
        await q.claim("w")
    with pytest.raises(QueueClosed):
        await q.open()

    # The job survives the close: storage is durable.
    other = await queue_factory.open(maintenance_interval_s=None)
    stored = await other.get(job_id)
    assert stored is not None and stored.state is JobState.QUEUED


async def test_a_queue_is_an_async_context_manager(queue_factory: Any) -> None:
    q = await queue_factory.open(maintenance_interval_s=None)
    async with q as entered:
        assert entered is q
        await q.enqueue({})
    with pytest.raises(QueueClosed):
        await q.enqueue({})


@pytest.mark.parametrize("url", ["postgres://localhost/db", "memory://", "amqp://x", "nonsense"])
def test_from_url_with_an_unknown_scheme_is_a_config_error(url: str) -> None:
    with pytest.raises(ConfigError):
        Queue.from_url(url)


def test_from_url_with_invalid_settings_is_a_config_error(tmp_path: Any) -> None:
    with pytest.raises(ConfigError):
        Queue.from_url(f"sqlite:///{tmp_path / 'q.db'}?max_batch=0")
    with pytest.raises(ConfigError, match="wait_replicas is a Redis setting"):
        Queue.from_url(f"sqlite:///{tmp_path / 'q.db'}?wait_replicas=1")
    with pytest.raises(ConfigError):
        Queue.from_url(f"sqlite:///{tmp_path / 'q.db'}", no_such_setting=1)


def test_from_url_merges_settings_query_and_options(tmp_path: Any) -> None:
    q = Queue.from_url(f"sqlite:///{tmp_path / 'q.db'}?name=jobs&max_batch=50", max_batch=60)
    assert q.settings.name == "jobs"
    assert q.settings.max_batch == 60
