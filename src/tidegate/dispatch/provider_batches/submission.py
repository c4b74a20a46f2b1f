"""Gathering and submitting provider batches: the jobs routed to one provider, model and endpoint
are held (their leases renewed here, their cost reserved at the batch price) for `gather_s` or
until `max_lines` are gathered, then sent as one batch to the provider's batch API and recorded in
the `ProviderBatchStore`, every job released to the queue for `poll_s`, its reason naming the batch.

The jobs are recorded before their batch is sent, as pending under a token the batch carries in its
metadata (`SUBMISSION`), so a worker killed between the submission and its record leaves jobs that
the next claimant finds again at the provider (see the package's `ProviderBatches`). A batch the provider did
not take leaves its jobs to a live call, the reason recorded.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Coroutine
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import msgspec

from tidegate._shutdown import CLOSE_BOUND_S
from tidegate.ai import AIRequest
from tidegate.config import ProviderConfig
from tidegate.contract import RequestBody, unstreamed
from tidegate.costs import estimate_cost_micros
from tidegate.dispatch.provider_batches.clients.openai import BatchLineRequest
from tidegate.dispatch.provider_batches.collection import BatchPart, BatchServices
from tidegate.dispatch.provider_batches.store import BatchedJob, ProviderBatchRecord
from tidegate.dispatch.router import RouteDecision
from tidegate.dispatch.spending import Hold, hold_to_json
from tidegate.dispatch.tiers import batch_priced
from tidegate.errors import BudgetExhausted, LeaseLost, TidegateError
from tidegate.jobs import Job

__all__ = ["ENDPOINTS", "PENDING", "SUBMISSION", "BatchSubmission"]

log = logging.getLogger("tidegate.worker.provider_batches")

ENDPOINTS = {"chat": "/v1/chat/completions", "embeddings": "/v1/embeddings"}
SUBMISSION = "tidegate_submission"  # the metadata naming a submission, to find its batch again
PENDING = "pending-"  # the batch id a job is recorded with while its batch is being submitted
SUBMIT_BOUND_S = CLOSE_BOUND_S  # how long closing waits for a submission under way (then it is pending)


@dataclass(slots=True)
class _Held:
    """A job gathered for a batch: its body as the line sends it and the budget it holds."""

    job: Job
    body: RequestBody
    hold: Hold | None


@dataclass(slots=True)
class _Gathering:
    """The jobs gathered for one provider, model and endpoint, and the timer that submits them."""

    provider: ProviderConfig
    model: str
    endpoint: str
    held: list[_Held] = field(default_factory=list)
    timer: asyncio.Task[None] | None = None


class BatchSubmission(BatchPart):
    """One worker's gathering and submitting of provider batches (see the module's docstring).
    `close()` gives back what is still gathered; submissions under way are given a bound to
    finish."""

    def __init__(self, services: BatchServices, lease_s: float) -> None:
        super().__init__(services)
        self._lease_s = lease_s
        self._gathering: dict[tuple[str, str, str], _Gathering] = {}
        self._held: dict[str, _Held] = {}  # every job this object holds the lease of, by id
        self._tasks: set[asyncio.Task[None]] = set()
        self._renewals: asyncio.Task[None] | None = None

    def eligible(self, job: Job, request: AIRequest, provider: ProviderConfig) -> bool:
        """Whether a job routed to `provider` goes to its batch API now (see ProviderBatchConfig).
        A job that only its origin's own API can carry (`native_only`: a built-in tool, `top_k`,
        …) never does: a batch line is its chat body, which would answer another question."""
        policy = provider.batch
        if policy is None or provider.name not in self._clients or request.stream or job.deadline is None:
            return False
        if request.origin is not None and request.origin.native_only:
            return False
        if not policy.admits(job.priority) or request.kind not in policy.kinds:
            return False
        return (job.deadline - datetime.now(UTC)).total_seconds() >= policy.min_deadline_s

    async def gather(self, job: Job, request: AIRequest, route: RouteDecision) -> bool:
        """Take an eligible, routed job into the next batch of its provider, model and endpoint;
        False when it is not eligible or its budget refuses the batch price (the live path then
        serves it, or meets the refusal the normal way)."""
        provider = route.provider
        if not self.eligible(job, request, provider):
            return False
        assert provider.batch is not None
        model = route.model.name
        body = msgspec.structs.replace(unstreamed(request.body), model=model)
        hold: Hold | None = None
        if self._spending.ledger is not None:
            amount = estimate_cost_micros(batch_priced(route.model, provider), request.body)
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
