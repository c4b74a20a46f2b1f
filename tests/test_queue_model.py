"""A stateful model test: Hypothesis drives random sequences of enqueue, claim, complete, fail,
release, cancel and redrive against each backend and against a plain in-memory model, and checks
after every step that the queue did what the contract promises.

What the contract promises about order, and so what is checked: strict priority between levels,
and FIFO (by enqueue order) among jobs that were never claimed. A job that comes back (retried,
released, redriven) re-enters its own level; where it lands among the others at that level is not
promised, so it is only held to strict priority.

Each example gets fresh storage (a new SQLite file, a new Redis queue name). The queue runs on a
dedicated event loop that the machine's rules drive with `run_until_complete`.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from support.redis_keys import delete_keys_now
from tidegate import Job, JobState, LeaseLost, Priority, Queue

T = TypeVar("T")
Cleanup = Callable[[], None]  # deletes what one example's queue stored

MAX_ATTEMPTS = 2
LEASE_S = 600.0  # never expires within an example: lease recovery is covered by the contract suite

# Model states. "retry" is a failed job waiting for its (immediate) retry: the backend may show it
# as failed or, once promoted, as queued.
QUEUED, RETRY, LEASED = "queued", "retry", "leased"
SUCCEEDED, DEAD, CANCELLED = "succeeded", "dead", "cancelled"
CLAIMABLE = (QUEUED, RETRY)
ACTIVE = (QUEUED, RETRY, LEASED)
BACKEND_STATES = {
    QUEUED: {JobState.QUEUED},
    RETRY: {JobState.FAILED, JobState.QUEUED},
    LEASED: {JobState.LEASED},
    SUCCEEDED: {JobState.SUCCEEDED},
    DEAD: {JobState.DEAD},
    CANCELLED: {JobState.CANCELLED},
}


@dataclass
class ModelJob:
    id: str
    priority: int
    order: int  # position in enqueue order
    state: str = QUEUED
    attempts: int = 0
    fresh: bool = True  # never claimed: FIFO is promised among these
    lease: Job | None = None
    result: Any = None


class QueueModel(RuleBasedStateMachine):
    """Runs one example against a fresh queue; subclasses set `loop` and `open_queue`."""

    loop: ClassVar[asyncio.AbstractEventLoop]
    open_queue: ClassVar[Callable[[], tuple[Queue, Cleanup]]]

    def __init__(self) -> None:
        super().__init__()
        self.queue, self._cleanup = type(self).open_queue()
        self.run(self.queue.open())
        self.jobs: dict[str, ModelJob] = {}
        self.stale: list[Job] = []  # leases taken away by cancel
        self.keys: dict[str, str] = {}  # idempotency key -> id of the job it made
        self.enqueued = 0

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(coro)

    def teardown(self) -> None:
        try:
            self.run(self.queue.close())
        finally:
            self._cleanup()

    def _in(self, *states: str) -> list[ModelJob]:
        return [job for job in self.jobs.values() if job.state in states]

    # ------------------------------------------------------------------ rules

    @rule(
        priority=st.sampled_from(list(Priority)),
        tenant=st.sampled_from(["a", "b"]),
        count=st.integers(min_value=1, max_value=5),
    )
    def enqueue(self, priority: Priority, tenant: str, count: int) -> None:
        specs = [
            {
                "payload": {"n": self.enqueued + i},
                "priority": priority,
                "tenant": tenant,
                "max_attempts": MAX_ATTEMPTS,
            }
            for i in range(count)
        ]
        ids = self.run(self.queue.enqueue_many(specs))
        assert len(ids) == count and len(set(ids)) == count
        for job_id in ids:
            assert job_id not in self.jobs
            self.jobs[job_id] = ModelJob(job_id, int(priority), self.enqueued)
            self.enqueued += 1

    @rule(priority=st.sampled_from(list(Priority)), key=st.sampled_from(["k1", "k2", "k3"]))
    def enqueue_with_idempotency_key(self, priority: Priority, key: str) -> None:
        job_id = self.run(
            self.queue.enqueue(
                {"n": self.enqueued}, priority=priority, idempotency_key=key, max_attempts=MAX_ATTEMPTS
            )
        )
        if key in self.keys:
            # Nothing is purged within an example, so a known key always answers its first job
            assert job_id == self.keys[key]
            return
        assert job_id not in self.jobs
        self.keys[key] = job_id
        self.jobs[job_id] = ModelJob(job_id, int(priority), self.enqueued)
        self.enqueued += 1

    @rule(limit=st.integers(min_value=1, max_value=4))
    def claim(self, limit: int) -> None:
        claimable = self._in(*CLAIMABLE)
        claimed = self.run(self.queue.claim("model-worker", limit=limit, lease_s=LEASE_S))
        ids = [job.id for job in claimed]

        # As many as asked for, while there are that many; each one claimable and claimed once
        assert len(claimed) == min(limit, len(claimable)), (ids, [j.id for j in claimable])
        assert len(set(ids)) == len(ids)
        assert set(ids) <= {job.id for job in claimable}

        # Strict priority: listed highest first, and nothing left behind outranks what came out
        levels = [self.jobs[job_id].priority for job_id in ids]
        assert levels == sorted(levels)
        left = [job for job in claimable if job.id not in set(ids)]
        if claimed and left:
            assert max(levels) <= min(job.priority for job in left)

        # FIFO among never-claimed jobs of a level: those that came out, came out in enqueue
        # order, and no older never-claimed job of their level was passed over
        for level in set(levels):
            fresh_out = [
                self.jobs[i].order for i in ids if self.jobs[i].fresh and self.jobs[i].priority == level
            ]
            assert fresh_out == sorted(fresh_out)
            if fresh_out:
                passed_over = [j.order for j in left if j.fresh and j.priority == level]
                assert not passed_over or min(passed_over) > max(fresh_out)

        for job in claimed:
            model = self.jobs[job.id]
            assert job.state is JobState.LEASED
            assert job.priority == model.priority
            assert job.lease_token is not None
            assert job.attempts == model.attempts + 1
            model.state, model.attempts, model.fresh, model.lease = LEASED, model.attempts + 1, False, job

    @precondition(lambda self: bool(self._in(LEASED)))
    @rule(data=st.data())
    def complete(self, data: st.DataObject) -> None:
        model = data.draw(st.sampled_from(self._in(LEASED)), label="job")
        assert model.lease is not None
        result = {"id": model.id, "attempts": model.attempts, "list": [1, None]}
        self.run(self.queue.complete(model.lease, result))
        model.state, model.lease, model.result = SUCCEEDED, None, result

    @precondition(lambda self: bool(self._in(LEASED)) or bool(self.stale))
    @rule(data=st.data())
    def complete_many(self, data: st.DataObject) -> None:
        leased, stale_leases = self._in(LEASED), self.stale
        chosen = data.draw(
            st.lists(st.sampled_from(leased), unique_by=lambda j: j.id) if leased else st.just([])
        )
        stale = data.draw(
            st.lists(st.sampled_from(stale_leases), max_size=1) if stale_leases else st.just([])
        )
        done: list[tuple[Job, Any]] = []
        for job in chosen:
            assert job.lease is not None
            done.append((job.lease, {"id": job.id}))
        done += [(lease, "stale") for lease in stale]
        lost = self.run(self.queue.complete_many(done))
        assert len(lost) == len(stale)
        for model in chosen:
            model.state, model.lease, model.result = SUCCEEDED, None, {"id": model.id}

    @precondition(lambda self: bool(self._in(LEASED)))
    @rule(data=st.data())
    def heartbeat(self, data: st.DataObject) -> None:
        model = data.draw(st.sampled_from(self._in(LEASED)), label="job")
        assert model.lease is not None
        self.run(self.queue.heartbeat(model.lease, lease_s=LEASE_S))

    @rule()
    def maintain(self) -> None:
        # No lease, delay or deadline runs out within an example: upkeep must change nothing
        report = self.run(self.queue.maintain())
        assert (report.recovered, report.dead, report.expired, report.aged, report.purged) == (0, 0, 0, 0, 0)

    @precondition(lambda self: bool(self._in(LEASED)))
    @rule(data=st.data())
    def fail(self, data: st.DataObject) -> None:
        model = data.draw(st.sampled_from(self._in(LEASED)), label="job")
        assert model.lease is not None
        state = self.run(self.queue.fail(model.lease, f"boom {model.attempts}", retry_in_s=0))
        expected = JobState.DEAD if model.attempts >= MAX_ATTEMPTS else JobState.FAILED
        assert state is expected
        model.state, model.lease = (DEAD if expected is JobState.DEAD else RETRY), None

    @precondition(lambda self: bool(self._in(LEASED)))
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        model = data.draw(st.sampled_from(self._in(LEASED)), label="job")
        assert model.lease is not None
        self.run(self.queue.release(model.lease))
        model.state, model.lease, model.attempts = QUEUED, None, model.attempts - 1

    @precondition(lambda self: bool(self.jobs))
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        model = data.draw(st.sampled_from(sorted(self.jobs.values(), key=lambda j: j.order)), label="job")
        cancelled = self.run(self.queue.cancel(model.id))
        assert cancelled is (model.state in ACTIVE)
        if cancelled:
            if model.lease is not None:
                self.stale.append(model.lease)
            model.state, model.lease = CANCELLED, None

    @precondition(lambda self: bool(self.stale))
    @rule(data=st.data())
    def settle_a_cancelled_lease(self, data: st.DataObject) -> None:
        lease = data.draw(st.sampled_from(self.stale), label="lease")
        with pytest.raises(LeaseLost):
            self.run(self.queue.complete(lease, "too late"))
        with pytest.raises(LeaseLost):
            self.run(self.queue.fail(lease, "too late", retry_in_s=0))

    @rule()
    def redrive_all(self) -> None:
        dead = self._in(DEAD)
        assert self.run(self.queue.redrive(None)) == len(dead)
        for model in dead:
            model.state, model.attempts = QUEUED, 0

    # ------------------------------------------------------------------ invariants

    @invariant()
    def every_job_is_where_the_model_says(self) -> None:
        for model in self.jobs.values():
            job = self.run(self.queue.get(model.id))
            assert job is not None, model
            assert job.state in BACKEND_STATES[model.state], (model, job.state)
            assert int(job.priority) == model.priority
            assert job.attempts == model.attempts, (model, job.attempts)
            if model.state == SUCCEEDED:
                assert job.result == model.result

    @invariant()
    def stats_match_the_model(self) -> None:
        stats = self.run(self.queue.stats())
        assert stats.dead == len(self._in(DEAD))
        # A due retry counts as waiting at its level or as waiting for its time, but never both
        assert stats.depth + stats.delayed == len(self._in(*CLAIMABLE))
        for level in Priority:
            at_level = [job for job in self.jobs.values() if job.priority == level]
            queued = sum(job.state == QUEUED for job in at_level)
            retrying = sum(job.state == RETRY for job in at_level)
            assert queued <= stats.levels[level].depth <= queued + retrying, (level, stats.levels[level])
            assert stats.levels[level].in_flight == sum(job.state == LEASED for job in at_level)

    @invariant()
    def dead_letters_match_the_model(self) -> None:
        listed = self.run(self.queue.dead_letters(limit=1_000))
        assert {job.id for job in listed} == {job.id for job in self._in(DEAD)}


# ---------------------------------------------------------------------- one run per backend


def _nothing_to_delete() -> None:
    """A SQLite queue's cleanup: its file goes with the test's tmp_path."""


@pytest.mark.timeout(240)
@pytest.mark.parametrize("backend", ["sqlite", "redis"])
def test_the_queue_behaves_like_the_model(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    redis_url: str = request.getfixturevalue("redis_server") if backend == "redis" else ""

    def open_queue() -> tuple[Queue, Cleanup]:
        name = f"m{uuid.uuid4().hex[:12]}"
        if backend == "sqlite":
            queue = Queue.from_url(f"sqlite:///{tmp_path / name}.db", maintenance_interval_s=None)
            return queue, _nothing_to_delete
        queue = Queue.from_url(redis_url, name=name, maintenance_interval_s=None)
        return queue, lambda: delete_keys_now(redis_url, f"*{name}*")

    loop = asyncio.new_event_loop()
    machine = type(
        f"QueueModel_{backend}", (QueueModel,), {"loop": loop, "open_queue": staticmethod(open_queue)}
    )
    try:
        run_state_machine_as_test(
            machine,
            settings=settings(
                max_examples=50,
                stateful_step_count=50,
                deadline=None,
                suppress_health_check=[HealthCheck.too_slow],
            ),
        )
    finally:
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()
