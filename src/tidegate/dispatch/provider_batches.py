"""Provider batches: jobs that can wait (BULK with a deadline a day or more away, by default) go
to the provider's own batch API at its discount instead of a live call.

A worker hands every routed job a provider batch might hold to `place`, which looks it up in the
store first:

- a job in no batch yet is gathered if eligible (see `ProviderBatchConfig`): its cost is
  reserved at the batch price (a refusal leaves the job to the live path, which meets the budget
  the normal way), and it waits with the others routed to the same provider, model and endpoint,
  its lease renewed here, for `gather_s` or until `max_lines` are gathered. Then one provider
  batch is submitted (custom_id = job id), recorded in the `ProviderBatchStore`, and every job is
  released to the queue for `poll_s`, its attempt uncounted and its reason naming the batch.
- a job found in the store is collected: while its batch runs, the job is released again for
  `poll_s`; once the batch ended, the job completes with its line's answer, charged at the batch
  price, and its reservation settles. A line that failed, or a batch that failed, expired or
  cannot be submitted, leaves the job to a live call, the reason recorded in the store and the
  log: nothing is lost and nothing ends mutely.

The reservation made at submission lives on the ledger until collection (pending, counted
against the day's budget, as any call in flight is), and its identity lives in the store with the
job, so whichever worker collects the job settles it, once: a second settle of one reservation
changes nothing. Polls and results are cached per batch in the process for a short while, so the
jobs of one batch cost one poll and one download between them.

A worker killed after a submission loses nothing: the jobs' leases run out, another worker claims
them, finds them in the store and collects. The jobs are recorded before their batch is sent, as
pending under a token the batch carries in its metadata, so one killed between the submission and
its record leaves jobs whose claimant asks the provider for that batch (`find`) and collects it if
it was created, or gathers them anew if not. A second submission is left only where the provider
does not list the batch among its latest (`ProviderBatchClient.find`'s depth).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from tidegate._shutdown import CLOSE_BOUND_S
from tidegate.ai import AIRequest, AIResult, Timings, Usage
from tidegate.config import ModelConfig, ProviderConfig
from tidegate.coord.provider_batches import BatchedJob, ProviderBatchRecord, ProviderBatchStore
from tidegate.costs import cost_micros, estimate_cost_micros, micros_to_usd
from tidegate.dispatch.metrics import DispatchMetrics
from tidegate.dispatch.router import RouteDecision
from tidegate.dispatch.spending import Hold, Spending, hold_from_json, hold_to_json
from tidegate.dispatch.tiers import batch_priced
from tidegate.errors import BudgetExhausted, LeaseLost, TidegateError
from tidegate.jobs import Job
from tidegate.providers.batch_api import BatchClient, BatchLineRequest, BatchLineResult, ProviderBatch
from tidegate.queue import Queue

__all__ = ["ENDPOINTS", "ProviderBatches"]

log = logging.getLogger("tidegate.worker.provider_batches")

ENDPOINTS = {"chat": "/v1/chat/completions", "embeddings": "/v1/embeddings"}
_STREAM_FIELDS = ("stream", "stream_options")
SUBMISSION = "tidegate_submission"  # the metadata naming a submission, to find its batch again
PENDING = "pending-"  # the batch id a job is recorded with while its batch is being submitted
POLL_CACHE_MAX_S = 5.0  # a batch's status is reused this long at most (half of poll_s when shorter)
RESULTS_CACHED = 32  # ended batches whose results are kept in the process, the latest ones
SUBMIT_BOUND_S = CLOSE_BOUND_S  # how long closing waits for a submission under way (then it is pending)

Succeeded = Callable[[Job, dict[str, Any]], None]
"""Told of every job completed from a batch, with its result (the worker sends its callback)."""


@dataclass(slots=True)
class _Held:
    """A job gathered for a batch: its body as the line sends it and the budget it holds."""

    job: Job
    body: dict[str, Any]
    hold: Hold | None


@dataclass(slots=True)
class _Gathering:
    """The jobs gathered for one provider, model and endpoint, and the timer that submits them."""

    provider: ProviderConfig
    model: str
    endpoint: str
    held: list[_Held] = field(default_factory=list)
    timer: asyncio.Task[None] | None = None


class ProviderBatches:
    """One worker's side of provider batches (see the module's docstring). `close()` gives back
    what is still gathered; submissions under way are given a bound to finish."""

    def __init__(
        self,
        providers: Mapping[str, ProviderConfig],
        clients: Mapping[str, BatchClient],
        *,
        queue: Queue,
        store: ProviderBatchStore,
        spending: Spending,
        metrics: DispatchMetrics,
        worker_id: str,
        lease_s: float,
        succeeded: Succeeded,
    ) -> None:
        self._providers = {name: p for name, p in providers.items() if p.batch is not None}
        self._clients = clients
        self._queue = queue
        self._store = store
        self._spending = spending
        self._metrics = metrics
        self._worker_id = worker_id
        self._lease_s = lease_s
        self._succeeded = succeeded
        self._gathering: dict[tuple[str, str, str], _Gathering] = {}
        self._held: dict[str, _Held] = {}  # every job this object holds the lease of, by id
        self._tasks: set[asyncio.Task[None]] = set()
        self._renewals: asyncio.Task[None] | None = None
        self._polls: dict[tuple[str, str], tuple[float, asyncio.Future[ProviderBatch]]] = {}
        self._results: OrderedDict[tuple[str, str], asyncio.Future[dict[str, BatchLineResult]]]
        self._results = OrderedDict()

    # ------------------------------------------------------------------ which jobs

    def _may_hold(self, job: Job, request: AIRequest) -> bool:
        """Whether any provider's batch could hold this job: only those are looked up (a job
        without a deadline never goes to one)."""
        if request.stream or job.deadline is None:
            return False
        return any(p.batch is not None and p.batch.admits(job.priority) and request.kind in p.batch.kinds
                   for p in self._providers.values())

    def eligible(self, job: Job, request: AIRequest, provider: ProviderConfig) -> bool:
        """Whether a job routed to `provider` goes to its batch API now (see ProviderBatchConfig)."""
        policy = provider.batch
        if policy is None or provider.name not in self._clients or request.stream or job.deadline is None:
            return False
        if not policy.admits(job.priority) or request.kind not in policy.kinds:
            return False
        return (job.deadline - datetime.now(UTC)).total_seconds() >= policy.min_deadline_s

    # ------------------------------------------------------------------ gathering and submitting

    async def gather(self, job: Job, request: AIRequest, route: RouteDecision) -> bool:
        """Take an eligible, routed job into the next batch of its provider, model and endpoint;
        False when it is not eligible or its budget refuses the batch price (the live path then
        serves it, or meets the refusal the normal way)."""
        provider = route.provider
        if not self.eligible(job, request, provider):
            return False
        assert provider.batch is not None
        model = route.model.name
        body = {key: value for key, value in request.body.items() if key not in _STREAM_FIELDS}
        body["model"] = model
        hold: Hold | None = None
        if self._spending.ledger is not None:
            amount = estimate_cost_micros(batch_priced(route.model, provider), request.kind, request.body)
            try:
                hold = await self._spending.reserve(job, amount, await self._spending.limits(job.tenant))
            except BudgetExhausted:
                return False
        key = (provider.name, model, ENDPOINTS[request.kind])
        gathering = self._gathering.get(key)
        if gathering is None:
            gathering = self._gathering[key] = _Gathering(provider, model, key[2])
            gathering.timer = self._spawn(self._submit_after(key, provider.batch.gather_s), f"gather {key}")
        held = _Held(job, body, hold)
        gathering.held.append(held)
        self._held[job.id] = held
        if self._renewals is None:
            self._renewals = asyncio.create_task(self._renew_leases(), name="provider batch leases")
        if len(gathering.held) >= provider.batch.max_lines:
            self._submit_now(key)
        return True

    def _spawn(self, step: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        task = asyncio.create_task(step, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _submit_after(self, key: tuple[str, str, str], delay_s: float) -> None:
        await asyncio.sleep(delay_s)
        self._submit_now(key)

    def _submit_now(self, key: tuple[str, str, str]) -> None:
        gathering = self._gathering.pop(key, None)
        if gathering is None:
            return
        if gathering.timer is not None and gathering.timer is not asyncio.current_task():
            gathering.timer.cancel()
        if gathering.held:
            self._spawn(self._submitted(gathering), f"submit {key}")

    async def _submitted(self, gathering: _Gathering) -> None:
        """Submit the gathered jobs as one batch, record it, release the jobs until it is polled."""
        try:
            await self._submit(gathering)
        except Exception:  # a bug must not strand the jobs: their leases run out and they come back
            log.exception("provider batch of %d jobs for %s: submission failed unexpectedly",
                          len(gathering.held), gathering.provider.name)
        finally:
            for held in gathering.held:
                self._held.pop(held.job.id, None)

    async def _submit(self, gathering: _Gathering) -> None:
        provider, held = gathering.provider, gathering.held
        assert provider.batch is not None
        client = self._clients[provider.name]
        token = uuid.uuid4().hex
        pending = PENDING + token
        job_ids = tuple(item.job.id for item in held)
        # Recorded before anything is sent: a worker killed between the submission and its
        # record leaves its jobs pointing here, and whoever claims them next asks the provider
        # for the batch by its metadata rather than submit it again.
        try:
            await self._store.record(
                ProviderBatchRecord(provider.name, pending, gathering.model, gathering.endpoint, job_ids,
                                    datetime.now(UTC)),
                [BatchedJob(item.job.id, provider.name, pending, hold_to_json(item.hold)) for item in held])
        except TidegateError as exc:
            await self._give_back(held, f"provider batch to {provider.name} not submitted: {exc}")
            return
        lines = [BatchLineRequest(item.job.id, gathering.endpoint, item.body) for item in held]
        try:
            batch = await client.submit(lines, endpoint=gathering.endpoint,
                                        completion_window=provider.batch.completion_window,
                                        metadata={SUBMISSION: token, "tidegate_worker": self._worker_id})
        except Exception as exc:  # whatever it is, these jobs are served live rather than stranded
            # A creation cut short may have reached the provider: look for it before giving up.
            found = None
            with contextlib.suppress(TidegateError):
                found = await client.find({SUBMISSION: token})
            if found is None:
                await self._not_submitted(provider.name, held, exc)
                return
            batch = found
        record = ProviderBatchRecord(provider.name, batch.id, gathering.model, gathering.endpoint, job_ids,
                                     datetime.now(UTC))
        entries = [BatchedJob(item.job.id, provider.name, batch.id, hold_to_json(item.hold)) for item in held]
        with contextlib.suppress(TidegateError):  # unrecorded, it is found again by its metadata
            await self._store.record(record, entries)
        self._metrics.provider_batches.labels(provider.name).inc()
        self._metrics.provider_batch_jobs.labels(provider.name, "submitted").inc(len(held))
        log.info("provider batch %s/%s submitted: %d jobs", provider.name, batch.id, len(held))
        reason = f"waiting in provider batch {provider.name}/{batch.id}"
        for item in held:
            with contextlib.suppress(LeaseLost):  # cancelled meanwhile: it stays cancelled
                await self._queue.release(item.job, delay_s=provider.batch.poll_s, reason=reason)

    async def _not_submitted(self, provider: str, held: list[_Held], exc: Exception) -> None:
        """The provider took no batch: its jobs are served live, the reason recorded."""
        cause = str(exc) or type(exc).__name__
        reason = f"provider batch submission to {provider} failed ({cause}); served live"
        log.warning("%d jobs: %s", len(held), reason, exc_info=not isinstance(exc, TidegateError))
        await self._store.put_jobs([BatchedJob(item.job.id, provider, "", None, reason) for item in held])
        self._metrics.provider_batch_jobs.labels(provider, "served_live").inc(len(held))
        await self._give_back(held, reason)

    async def _give_back(self, held: list[_Held], reason: str) -> None:
        """Jobs that did not go into a batch: their holds released, back to the queue at once."""
        for item in held:
            await self._spending.release(item.hold)
            with contextlib.suppress(LeaseLost):
                await self._queue.release(item.job, reason=reason)

    async def _renew_leases(self) -> None:
        """Renew the lease of every gathered job; one lost (cancelled) leaves its batch."""
        interval_s = self._lease_s / 3
        while True:
            await asyncio.sleep(interval_s)
            for job_id, held in list(self._held.items()):
                try:
                    await self._queue.heartbeat(held.job, self._lease_s)
                except LeaseLost as exc:
                    log.info("job %s: lease lost while gathered for a provider batch (%s)", job_id, exc)
                    self._drop(held)
                except TidegateError as exc:
                    log.warning("job %s: lease renewal failed: %s", job_id, exc)

    def _drop(self, held: _Held) -> None:
        for gathering in self._gathering.values():
            if held in gathering.held:
                gathering.held.remove(held)
                self._held.pop(held.job.id, None)
                self._spawn(self._spending.release(held.hold), f"release the hold of {held.job.id}")
                return

    # ------------------------------------------------------------------ collecting

    async def place(self, job: Job, request: AIRequest, route: RouteDecision, queue_wait_ms: float) -> bool:
        """Serve a routed job by a provider batch if it is in one or may join one: True when it
        was (completed, released while its batch runs, or gathered); False leaves it to the live
        path (it is not eligible, its budget refuses the batch price, or it is to be served live)."""
        if not self._may_hold(job, request):
            return False
        entry = await self._store.job(job.id)
        if entry is None:
            return await self.gather(job, request, route)
        if entry.live_reason is not None:
            return False
        if entry.batch_id.startswith(PENDING):
            return await self._resume(job, request, route, entry, queue_wait_ms)
        return await self._collect(job, entry, queue_wait_ms)

    async def _resume(self, job: Job, request: AIRequest, route: RouteDecision, entry: BatchedJob,
                      queue_wait_ms: float) -> bool:
        """A job whose worker died while it submitted the job's batch: the batch is asked of the
        provider by its metadata; found, it is recorded and collected, else the job is gathered
        anew."""
        client = self._clients.get(entry.provider)
        provider = self._providers.get(entry.provider)
        pending = await self._store.batch(entry.provider, entry.batch_id)
        if client is None or provider is None or provider.batch is None or pending is None:
            await self._serve_live(entry, f"its provider batch to {entry.provider} is no longer known")
            return False
        try:
            batch = await client.find({SUBMISSION: entry.batch_id.removeprefix(PENDING)})
        except TidegateError as exc:
            await self._queue.release(job, delay_s=provider.batch.poll_s, reason=(
                f"looking for its provider batch at {provider.name} failed ({exc}); trying again"))
            return True
        if batch is None:  # never created: gathered again, with a hold of its own anew
            await self._spending.release(hold_from_json(entry.hold))
            await self._store.put_jobs([entry.served_live("its provider batch was never created")])
            return await self.gather(job, request, route)
        found = BatchedJob(job.id, entry.provider, batch.id, entry.hold)
        await self._store.record(replace(pending, batch_id=batch.id), [found])
        return await self._collect(job, found, queue_wait_ms)

    async def _collect(self, job: Job, entry: BatchedJob, queue_wait_ms: float) -> bool:
        """Release the job while its batch runs, complete it once the batch ended; False when it
        is to be served live."""
        provider = self._providers.get(entry.provider)
        record = await self._store.batch(entry.provider, entry.batch_id)
        if provider is None or provider.batch is None or record is None or provider.name not in self._clients:
            where = f"provider batch {entry.provider}/{entry.batch_id}"
            await self._serve_live(entry, f"{where} is no longer known")
            return False
        poll_s = provider.batch.poll_s
        try:
            batch = await self._poll(provider.name, entry.batch_id, poll_s)
            if batch.ended:
                results = await self._results_of(provider.name, batch, record.job_ids)
        except TidegateError as exc:
            if getattr(exc, "retryable", True):
                await self._queue.release(job, delay_s=poll_s, reason=(
                    f"provider batch {provider.name}/{entry.batch_id} could not be polled ({exc}); "
                    "trying again"))
                return True
            await self._serve_live(entry, f"provider batch {provider.name}/{entry.batch_id}: {exc}")
            return False
        if not batch.ended:
            await self._queue.release(job, delay_s=poll_s, reason=(
                f"waiting in provider batch {provider.name}/{batch.id} ({batch.status}, "
                f"{batch.completed + batch.failed} of {batch.total} lines done)"))
            return True
        line = results.get(job.id)
        if line is None or line.status_code != 200:
            await self._serve_live(entry, _line_failure(provider.name, batch, line))
            return False
        await self._complete(job, entry, record, provider, line, queue_wait_ms)
        return True

    async def _poll(self, provider: str, batch_id: str, poll_s: float) -> ProviderBatch:
        """The batch's status, asked of the provider at most once per `min(poll_s / 2, 5 s)`."""
        now = time.monotonic()
        key = (provider, batch_id)
        cached = self._polls.get(key)
        if cached is None or now - cached[0] > min(poll_s / 2, POLL_CACHE_MAX_S) or (
                cached[1].done() and cached[1].exception() is not None):
            for stale in [k for k, (at, _) in self._polls.items() if now - at > POLL_CACHE_MAX_S]:
                del self._polls[stale]
            cached = (now, asyncio.ensure_future(self._clients[provider].retrieve(batch_id)))
            self._polls[key] = cached
        return await asyncio.shield(cached[1])

    async def _results_of(self, provider: str, batch: ProviderBatch,
                          job_ids: tuple[str, ...]) -> dict[str, BatchLineResult]:
        """The lines of an ended batch, downloaded once for all its jobs."""
        key = (provider, batch.id)
        future = self._results.get(key)
        if future is None or (future.done() and future.exception() is not None):
            future = asyncio.ensure_future(self._clients[provider].results(batch, job_ids))
            self._results[key] = future
            while len(self._results) > RESULTS_CACHED:
                self._results.popitem(last=False)
        return await asyncio.shield(future)

    async def _serve_live(self, entry: BatchedJob, reason: str) -> None:
        """The job is to be served by a live call from now on: say why, give its hold back."""
        log.warning("job %s: %s; served live", entry.job_id, reason)
        await self._store.put_jobs([entry.served_live(reason)])
        await self._spending.release(hold_from_json(entry.hold))
        self._metrics.provider_batch_jobs.labels(entry.provider, "served_live").inc()

    async def _complete(self, job: Job, entry: BatchedJob, record: ProviderBatchRecord,
                        provider: ProviderConfig, line: BatchLineResult, queue_wait_ms: float) -> None:
        model = _model(provider, record.model)
        usage = Usage.from_json(line.body.get("usage"))
        spent = cost_micros(batch_priced(model, provider), usage.input_tokens, usage.output_tokens)
        waited_ms = (datetime.now(UTC) - record.submitted_at).total_seconds() * 1000
        result = AIResult(
            line.body, model=record.model, provider=provider.name,
            route=f"provider batch {provider.name}/{record.batch_id}", usage=usage, cost_micros=spent,
            cost_usd=str(micros_to_usd(spent)), timings=Timings(queue_wait_ms, waited_ms),
            attempts=job.attempts, worker_id=self._worker_id,
        ).to_json()
        metrics, priority = self._metrics, job.priority.name.lower()
        metrics.tokens.labels(record.model, "input").inc(usage.input_tokens)
        metrics.tokens.labels(record.model, "output").inc(usage.output_tokens)
        metrics.cost_usd.labels(record.model, job.tenant).inc(float(micros_to_usd(spent)))
        # As a live call's: the spend and the result together, neither waiting for the other.
        settled, completed = await asyncio.gather(
            self._spending.settle(hold_from_json(entry.hold), spent), self._queue.complete(job, result),
            return_exceptions=True)
        if isinstance(settled, Exception):
            log.error("job %s: its spend of %s USD could not be recorded: %s", job.id, micros_to_usd(spent),
                      settled)
        if isinstance(completed, LeaseLost):
            log.warning("job %s: result discarded, lease lost: %s", job.id, completed)
            metrics.jobs.labels("lease_lost", priority, record.model).inc()
            return
        if isinstance(completed, BaseException):
            raise completed
        metrics.jobs.labels("succeeded", priority, record.model).inc()
        metrics.provider_batch_jobs.labels(provider.name, "collected").inc()
        self._succeeded(job, result)

    # ------------------------------------------------------------------ closing

    async def close(self) -> None:
        """Give back every job still gathered (hold released, job queued again at once), and let
        submissions under way finish within a bound."""
        for gathering in list(self._gathering.values()):
            if gathering.timer is not None:
                gathering.timer.cancel()
        gathered = [held for gathering in self._gathering.values() for held in gathering.held]
        self._gathering.clear()
        for held in gathered:
            self._held.pop(held.job.id, None)
        with contextlib.suppress(TidegateError):
            await self._give_back(gathered, "the worker stopped before its provider batch was submitted")
        pending = [task for task in self._tasks if not task.done()]
        if pending:
            await asyncio.wait(pending, timeout=SUBMIT_BOUND_S)
        for task in [*self._tasks, *([self._renewals] if self._renewals else [])]:
            task.cancel()
        for _, polled in self._polls.values():
            polled.cancel()
        for future in self._results.values():
            future.cancel()
        await asyncio.sleep(0)


def _model(provider: ProviderConfig, name: str) -> ModelConfig:
    """The provider's model of this name (priced at zero if the config no longer has it)."""
    for model in provider.models:
        if model.name == name:
            return model
    log.warning("model %s is no longer configured for %s: its batch answers are not charged", name,
                provider.name)
    return ModelConfig(name=name, input_usd_per_1m=Decimal(0), output_usd_per_1m=Decimal(0))


def _line_failure(provider: str, batch: ProviderBatch, line: BatchLineResult | None) -> str:
    """Why a job's line gave no answer, for its record and the log."""
    where = f"provider batch {provider}/{batch.id} ({batch.status})"
    if line is None:
        return f"{where} returned no line for it"
    error = line.body.get("error")
    message = error.get("message") or error.get("code") if isinstance(error, dict) else None
    return f"{where}: its line failed ({line.status_code}: {message or 'no message'})"
