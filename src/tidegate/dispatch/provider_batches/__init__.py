"""Provider batches: jobs that can wait (BULK with a deadline a day or more away, by default) go
to the provider's own batch API at its discount instead of a live call.

A worker hands every job a provider batch might hold to `ProviderBatches.collect` before it
routes it, which looks it up in the store:

- a job found there is collected (`collection`) with the provider and model it was
  submitted to, not routed again: a config changed since (its model gone from the tiers, its
  tenant's models narrowed) does not fail a job whose answer may be paid for already. It is
  released while its batch runs, completed with its line's answer once the batch ended. A line
  that failed, or a batch that failed, expired or cannot be submitted, leaves the job to a live
  call, the reason recorded in the store and the log: nothing is lost and nothing ends mutely.
- a job in no batch yet is routed, then gathered (`ProviderBatches.gather`) if eligible (see
  `ProviderBatchConfig`) and submitted with the others routed to the same provider, model and
  endpoint (`submission`); a refusal of its budget at the batch price leaves it to the live
  path, which meets the budget the normal way.

The reservation made at submission lives on the ledger until collection (pending, counted
against the day's budget, as any call in flight is), and its identity lives in the store with the
job, so whichever worker collects the job settles it, once.

A worker killed after a submission loses nothing: the jobs' leases run out, another worker claims
them, finds them in the store and collects. The jobs are recorded before their batch is sent, as
pending under a token the batch carries in its metadata, so one killed between the submission and
its record leaves jobs whose claimant asks the provider for that batch (`find`) and collects it if
it was created, or gathers them anew if not (`_resume` here). A second submission is left only
where the provider does not list the batch among its latest (`ProviderBatchClient.find`'s depth).

Every worker also takes its share of the upkeep (`upkeep`), from the moment it is made: a
batch all of whose jobs were cancelled is cancelled at the provider, and an ended batch none of
whose jobs needs it any more has its files deleted there.

The whole feature is this package: `ProviderBatches` here (what the worker calls), `submission`,
`collection` and `upkeep`, the store that says which job waits in which batch (`store`: SQLite
or Redis, the queue's backend) and the provider's side (`clients`: OpenAI's Files + Batch and
Anthropic's Message Batches, `batch_client` picking one by the provider's `api`). Only the admin
route that lists the batches is elsewhere, with the gateway's admin surface (it is HTTP, a layer
above).
"""

from __future__ import annotations

from dataclasses import replace
from enum import Enum

from tidegate.ai import AIRequest
from tidegate.dispatch.provider_batches.collection import BatchCollection, BatchServices, Succeeded
from tidegate.dispatch.provider_batches.store import BatchedJob
from tidegate.dispatch.provider_batches.submission import PENDING, SUBMISSION, BatchSubmission
from tidegate.dispatch.provider_batches.upkeep import BatchUpkeep
from tidegate.dispatch.router import RouteDecision
from tidegate.dispatch.spending import hold_from_json
from tidegate.errors import TidegateError
from tidegate.jobs import Job

__all__ = ["Found", "ProviderBatches"]


class Found(Enum):
    """What `ProviderBatches.collect` found of a job."""

    SERVED = "served"  # completed from its batch, or released to the queue while the batch runs
    LIVE = "live"  # to be served by a live call
    NOTHING = "nothing"  # in no batch: `gather` it once routed


def _found(served: bool) -> Found:
    return Found.SERVED if served else Found.LIVE


class ProviderBatches:
    """One worker's side of provider batches (see the module's docstring). `close()` gives back
    what is still gathered; submissions under way are given a bound to finish."""

    def __init__(self, services: BatchServices, *, lease_s: float, succeeded: Succeeded) -> None:
        """`services.providers` holds the providers with a `batch` section, `services.clients`
        their batch clients; jobs are leased for `lease_s` while they are submitted."""
        self._providers = services.providers
        self._clients = services.clients
        self._queue = services.queue
        self._store = services.store
        self._spending = services.spending
        self._submission = BatchSubmission(services, lease_s)
        self._collection = BatchCollection(services, succeeded)
        self._upkeep = BatchUpkeep(services)
        self._upkeep.start()

    def _may_hold(self, job: Job, request: AIRequest) -> bool:
        """Whether any provider's batch could hold this job: only those are looked up (a job
        without a deadline never goes to one)."""
        if request.stream or job.deadline is None:
            return False
        return any(p.batch is not None and p.batch.admits(job.priority) and request.kind in p.batch.kinds
                   for p in self._providers.values())

    async def collect(self, job: Job, request: AIRequest, queue_wait_ms: float) -> Found:
        """Look a job a provider batch might hold up in the store, before it is routed: a job in
        a batch is collected with the provider and model it was submitted to, whatever routing
        would choose now (its answer may be paid for already). `Found.SERVED` when it was
        (completed, or released while its batch runs); `Found.LIVE` leaves it to the live path;
        `Found.NOTHING` when it is in no batch, to be `gather`ed once routed."""
        if not self._may_hold(job, request):
            return Found.LIVE
        entry = await self._store.job(job.id)
        if entry is None:
            return Found.NOTHING
        if entry.live_reason is not None:
            return Found.LIVE
        if entry.batch_id.startswith(PENDING):
            return await self._resume(job, entry, queue_wait_ms)
        return _found(await self._collection.collect(job, entry, queue_wait_ms))

    async def gather(self, job: Job, request: AIRequest, route: RouteDecision) -> bool:
        """Take a routed job that `collect` found in no batch into the next batch of its route;
        False leaves it to the live path (it is not eligible, or its budget refuses the batch
        price)."""
        return await self._submission.gather(job, request, route)

    async def _resume(self, job: Job, entry: BatchedJob, queue_wait_ms: float) -> Found:
        """A job whose worker died while it submitted the job's batch: the batch is asked of the
        provider by its metadata; found, it is recorded and collected, else the job is to be
        gathered anew."""
        client = self._clients.get(entry.provider)
        provider = self._providers.get(entry.provider)
        pending = await self._store.batch(entry.provider, entry.batch_id)
        if client is None or provider is None or provider.batch is None or pending is None:
            reason = f"its provider batch to {entry.provider} is no longer known"
            await self._collection.serve_live(entry, reason)
            return Found.LIVE
        try:
            batch = await client.find({SUBMISSION: entry.batch_id.removeprefix(PENDING)})
        except TidegateError as exc:
            await self._queue.release(job, delay_s=provider.batch.poll_s, reason=(
                f"looking for its provider batch at {provider.name} failed ({exc}); trying again"))
            return Found.SERVED
        if batch is None:  # never created: gathered again, with a hold of its own anew
            await self._spending.release(hold_from_json(entry.hold))
            await self._store.put_jobs([entry.served_live("its provider batch was never created")])
            return Found.NOTHING
        found = BatchedJob(job.id, entry.provider, batch.id, entry.hold)
        await self._store.record(replace(pending, batch_id=batch.id), [found])
        return _found(await self._collection.collect(job, found, queue_wait_ms))

    async def close(self) -> None:
        """Stop the upkeep, give back every job still gathered, let submissions under way finish
        within a bound, and cancel the polls under way."""
        await self._upkeep.close()
        await self._submission.close()
        await self._collection.close()
