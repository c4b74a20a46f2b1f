"""Collecting provider batches: a job found in the `ProviderBatchStore` is released again for
`poll_s` while its batch runs; once the batch ended, the job completes with its line's answer,
charged at the batch price, and the reservation recorded with it settles (once: whichever worker
collects the job settles it, and a second settle changes nothing). A line that failed, or a batch
that failed, expired or is no longer known, leaves the job to a live call, the reason recorded in
the store and the log.

Polls and results are cached per batch in the process for a short while, so the jobs of one batch
cost one poll and one download between them.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from tidegate.ai import AIResult, Timings, Usage
from tidegate.config import ModelConfig, ProviderConfig
from tidegate.costs import cost_micros, micros_to_usd
from tidegate.dispatch.metrics import DispatchMetrics
from tidegate.dispatch.provider_batches.clients.openai import BatchClient, BatchLineResult, ProviderBatch
from tidegate.dispatch.provider_batches.store import BatchedJob, ProviderBatchRecord, ProviderBatchStore
from tidegate.dispatch.spending import Spending, hold_from_json
from tidegate.dispatch.tiers import batch_priced
from tidegate.errors import LeaseLost, TidegateError
from tidegate.jobs import Job
from tidegate.queue import Queue

__all__ = ["BatchCollection", "BatchPart", "BatchServices", "Succeeded"]

log = logging.getLogger("tidegate.worker.provider_batches")

POLL_CACHE_MAX_S = 5.0  # a batch's status is reused this long at most (half of poll_s when shorter)
RESULTS_CACHED = 32  # ended batches whose results are kept in the process, the latest ones

Succeeded = Callable[[Job, dict[str, Any]], None]
"""Told of every job completed from a batch, with its result (the worker sends its callback)."""


@dataclass(frozen=True, slots=True)
class BatchServices:
    """What gathering, submitting and collecting provider batches share: the providers that have
    a batch section, their batch clients, and the worker's queue, store, spending and metrics."""

    providers: Mapping[str, ProviderConfig]
    clients: Mapping[str, BatchClient]
    queue: Queue
    store: ProviderBatchStore
    spending: Spending
    metrics: DispatchMetrics
    worker_id: str


class BatchPart:
    """A part of one worker's provider batches: holds the services they share."""

    def __init__(self, services: BatchServices) -> None:
        self._providers = services.providers
        self._clients = services.clients
        self._queue = services.queue
        self._store = services.store
        self._spending = services.spending
        self._metrics = services.metrics
        self._worker_id = services.worker_id


class BatchCollection(BatchPart):
    """One worker's collecting of provider batches (see the module's docstring)."""

    def __init__(self, services: BatchServices, succeeded: Succeeded) -> None:
        super().__init__(services)
        self._succeeded = succeeded
        self._polls: dict[tuple[str, str], tuple[float, asyncio.Future[ProviderBatch]]] = {}
        self._results: OrderedDict[tuple[str, str], asyncio.Future[dict[str, BatchLineResult]]]
        self._results = OrderedDict()

    async def collect(self, job: Job, entry: BatchedJob, queue_wait_ms: float) -> bool:
        """Release the job while its batch runs, complete it once the batch ended; False when it
        is to be served live."""
        provider = self._providers.get(entry.provider)
        record = await self._store.batch(entry.provider, entry.batch_id)
        if provider is None or provider.batch is None or record is None or provider.name not in self._clients:
            where = f"provider batch {entry.provider}/{entry.batch_id}"
            await self.serve_live(entry, f"{where} is no longer known")
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
            await self.serve_live(entry, f"provider batch {provider.name}/{entry.batch_id}: {exc}")
            return False
        if not batch.ended:
            await self._queue.release(job, delay_s=poll_s, reason=(
                f"waiting in provider batch {provider.name}/{batch.id} ({batch.status}, "
                f"{batch.completed + batch.failed} of {batch.total} lines done)"))
            return True
        line = results.get(job.id)
        if line is None or line.status_code != 200:
            await self.serve_live(entry, _line_failure(provider.name, batch, line))
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

    async def serve_live(self, entry: BatchedJob, reason: str) -> None:
        """The job is to be served by a live call from now on: say why, give its hold back."""
        log.warning("job %s: %s; served live", entry.job_id, reason)
        await self._store.put_jobs([entry.served_live(reason)])
        await self._spending.release(hold_from_json(entry.hold))
        self._metrics.provider_batch_jobs.labels(entry.provider, "served_live").inc()

    async def _complete(self, job: Job, entry: BatchedJob, record: ProviderBatchRecord,
                        provider: ProviderConfig, line: BatchLineResult, queue_wait_ms: float) -> None:
        model = _model(provider, record.model)
        usage = Usage.from_json(line.body.get("usage"))
        spent = cost_micros(batch_priced(model, provider), usage)
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

    async def close(self) -> None:
        """Cancel the polls and downloads under way."""
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
