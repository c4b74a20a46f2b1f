"""Handing new work to a claim that waits in the same queue instance.

When the gateway and a worker share a process (`tidegate up`), a job the gateway enqueues would
otherwise be written as queued, rung for, claimed by the waiting worker in a second transaction
and read back: a round trip through the store for a job whose consumer is right here. Instead,
a claim that found nothing registers here while it waits; an enqueue offers it its ready jobs
(highest priority first, within the levels it serves and up to its limit), and the backend writes
each offered job already leased to that claim — in the enqueue's own transaction, and only if
nothing claimable waits at the job's level or above, so the claim gets exactly what its next
claim would have taken. The job is durable before anyone calls its provider, its lease and
fencing token are the ones a claim would give it, and a crash loses nothing: the lease expires
and the job is recovered like any other.

A claim that gives up while an offer is being written (its timeout, its cancellation) is not
left holding jobs it never saw: they are released back to the queue at once.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from tidegate.jobs import Job

__all__ = ["Handoffs", "WaitingClaim"]

log = logging.getLogger("tidegate.queue")


@dataclass(eq=False, slots=True)
class WaitingClaim:
    """A claim of this instance waiting for work, and where the jobs handed to it go. An enqueue
    that offers it a job writes the job leased to `worker_id` for `lease_ms`, if nothing waits
    ahead of it at `levels`."""

    worker_id: str
    levels: tuple[int, ...]
    limit: int
    lease_ms: int
    handed: asyncio.Future[list[Job]] = field(default_factory=lambda: _future())
    gone: bool = False  # it stopped waiting after an offer was made to it


def _future() -> asyncio.Future[list[Job]]:
    return asyncio.get_running_loop().create_future()


class Handoffs:
    """The claims of one queue instance that wait for work; `release` gives a job back to the
    queue (Queue.release)."""

    def __init__(self, release: Callable[[Job], Awaitable[None]]) -> None:
        self._waiting: list[WaitingClaim] = []
        self._release = release
        self._releasing: set[asyncio.Task[None]] = set()

    def offers(self, jobs: Sequence[tuple[str, int]]) -> dict[str, WaitingClaim]:
        """Offer ready jobs, given as (id, priority) in the order enqueued, to the waiting
        claims: most urgent first, each to the first claim that serves its level and has room.
        A claim offered anything stops waiting here (an enqueue now owes it an answer)."""
        if not self._waiting or not jobs:
            return {}
        room = {id(claim): claim.limit for claim in self._waiting}
        offers: dict[str, WaitingClaim] = {}
        for job_id, priority in sorted(jobs, key=lambda job: job[1]):
            for claim in self._waiting:
                if room[id(claim)] > 0 and priority in claim.levels:
                    room[id(claim)] -= 1
                    offers[job_id] = claim
                    break
        taken = {id(claim) for claim in offers.values()}
        self._waiting = [claim for claim in self._waiting if id(claim) not in taken]
        return offers

    def deliver(self, offers: dict[str, WaitingClaim], handed: Sequence[Job]) -> None:
        """Give each claim that was made offers the jobs written leased to it (perhaps none:
        it then claims again); jobs of a claim that is gone are released."""
        by_claim: dict[int, list[Job]] = {id(claim): [] for claim in offers.values()}
        for job in handed:
            by_claim[id(offers[job.id])].append(job)
        for claim in {id(claim): claim for claim in offers.values()}.values():
            jobs = by_claim[id(claim)]
            if claim.gone or claim.handed.done():
                self._give_back(jobs)
            else:
                claim.handed.set_result(jobs)

    async def wait(self, claim: WaitingClaim, for_work: Awaitable[None]) -> list[Job]:
        """Wait until `for_work` returns (work may have arrived: the caller claims again) or jobs
        are handed to `claim`; the jobs handed, or []."""
        self._waiting.append(claim)
        waiting: asyncio.Future[Any] = asyncio.ensure_future(for_work)
        try:
            handed: asyncio.Future[Any] = claim.handed
            await asyncio.wait([waiting, handed], return_when=asyncio.FIRST_COMPLETED)
            if claim in self._waiting:
                self._waiting.remove(claim)  # no offer was made: nothing is owed
                return claim.handed.result() if claim.handed.done() else []
            # An enqueue is writing jobs leased to this claim: its answer comes at once.
            return await asyncio.shield(claim.handed)
        except BaseException:
            claim.gone = True
            if claim in self._waiting:
                self._waiting.remove(claim)
            elif claim.handed.done() and not claim.handed.cancelled():
                self._give_back(claim.handed.result())  # handed, but never taken
            raise
        finally:
            waiting.cancel()

    def _give_back(self, jobs: Sequence[Job]) -> None:
        for job in jobs:
            task = asyncio.create_task(self._release_one(job))
            self._releasing.add(task)
            task.add_done_callback(self._releasing.discard)

    async def _release_one(self, job: Job) -> None:
        try:
            await self._release(job)
        except Exception as exc:  # its lease then runs out and the job is recovered
            log.warning("job %s was handed to a claim that stopped waiting and could not be released "
                        "(its lease runs out, and it is recovered): %s", job.id, exc)
