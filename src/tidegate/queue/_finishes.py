"""Who in this queue instance waits for which job to finish, and what they are told.

`wait()` registers a waiter for its job, then reads the job once (it may be final already) and
sleeps until the backend reports a finish. A report is the final `Job` itself when the backend
has it in hand (the SQLite instance that just completed it, a Redis job-done message that carries
the job), or None: "it may have finished, read it".

A caller that will wait for the jobs it enqueues (a gateway answering a call) may have them
*expected*: a waiter is registered before the job is written, so every finish from then on
reaches it, and the `wait()` that takes it over needs no first read. Expected waiters are kept
in a bounded table: one whose wait never comes (its caller was cancelled in between) is dropped
with the oldest, and a wait that finds none reads the job as usual.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tidegate.jobs import Job, JsonObject

__all__ = ["FinishWaiter", "Finishes"]

EXPECTED_LIMIT = 16_384  # expected waiters kept for waits still to come, oldest dropped first


@dataclass(eq=False, slots=True)
class FinishWaiter:
    """One wait for one job. `payload` is the job's payload when this instance enqueued it (so a
    finish reported as a record and a result can be made into the whole `Job`)."""

    job_id: str
    payload: JsonObject | None = None
    future: asyncio.Future[Job | None] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future())

    def tell(self, job: Job | None) -> None:
        if not self.future.done():
            self.future.set_result(job)


class Finishes:
    """The waiters of one queue instance, by job id."""

    def __init__(self, expected_limit: int = EXPECTED_LIMIT) -> None:
        self._waiters: dict[str, list[FinishWaiter]] = {}
        self._expected: dict[str, FinishWaiter] = {}
        self._expected_limit = expected_limit

    def __bool__(self) -> bool:
        return bool(self._waiters)

    def waits_for(self, job_id: str) -> bool:
        return job_id in self._waiters

    def ids(self) -> list[str]:
        """The jobs someone waits for."""
        return list(self._waiters)

    def watch(self, job_id: str, payload: JsonObject | None = None) -> FinishWaiter:
        """Register a waiter; `forget` it when done."""
        waiter = FinishWaiter(job_id, payload)
        self._waiters.setdefault(job_id, []).append(waiter)
        return waiter

    def forget(self, waiter: FinishWaiter) -> None:
        waiters = self._waiters.get(waiter.job_id)
        if waiters is None:
            return
        if waiter in waiters:
            waiters.remove(waiter)
        if not waiters:
            del self._waiters[waiter.job_id]

    def expect(self, jobs: Iterable[tuple[str, JsonObject]]) -> list[FinishWaiter]:
        """Waiters for jobs about to be written, each with its payload, for waits to come."""
        expected = []
        for job_id, payload in jobs:
            waiter = self.watch(job_id, payload)
            self._expected[job_id] = waiter
            expected.append(waiter)
        while len(self._expected) > self._expected_limit:
            self.forget(self._expected.pop(next(iter(self._expected))))
        return expected

    def unexpect(self, waiters: Iterable[FinishWaiter]) -> None:
        """Drop expected waiters whose wait will not come (their write failed, or it returned
        another job for an idempotency key)."""
        for waiter in waiters:
            if self._expected.get(waiter.job_id) is waiter:
                del self._expected[waiter.job_id]
            self.forget(waiter)

    def take_expected(self, job_id: str) -> FinishWaiter | None:
        """The waiter registered when this instance wrote the job, for the wait that has come."""
        return self._expected.pop(job_id, None)

    def hand(self, job: Job) -> None:
        """The job is final, as given: its waiters get it."""
        for waiter in self._waiters.get(job.id, ()):
            waiter.tell(job)

    def hand_record(self, job_id: str, record: Mapping[str, Any], result: bytes | None) -> None:
        """The job is final, as this record and result: waiters that know its payload get the
        `Job`, the others are told to read it."""
        waiters = self._waiters.get(job_id)
        if not waiters:
            return
        for waiter in waiters:
            if waiter.payload is None:
                waiter.tell(None)
            else:
                waiter.tell(Job.from_record(record, waiter.payload, result))

    def touch(self, job_ids: Iterable[str]) -> None:
        """These jobs may have finished: their waiters read them."""
        for job_id in job_ids:
            for waiter in self._waiters.get(job_id, ()):
                waiter.tell(None)

    def wake_all(self) -> None:
        """Every waiter reads its job (finishes may have gone unreported)."""
        for waiters in self._waiters.values():
            for waiter in waiters:
                waiter.tell(None)
