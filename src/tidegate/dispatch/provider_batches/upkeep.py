"""Upkeep of provider batches, shared by every worker: every `poll_s` (the shortest of the
providers'), a worker looks at the batches the store lists as open, the oldest first, and

- cancels at the provider a batch that still runs and all of whose jobs were cancelled meanwhile
  (`tidegate job cancel`), once across workers (the store's CANCEL claim); a batch that ended in
  the meantime is left as it is (the client reads the provider's refusal as such);
- deletes at the provider the input, output and error files of a batch that ended and that none
  of its jobs needs any more: each is final (succeeded, dead, cancelled, expired) or forgotten,
  will be served live, or waits in another batch. Once across workers (the CLEAN_UP claim, which
  retires the batch from the open ones).

A job still to be collected keeps its batch open, and the look at a batch stops at the first such
job, so a batch that runs costs a read or two per look. The claim is taken before the files are
deleted, and only once every job is final, so a worker killed in between leaves at worst files at
the provider, never an answer lost; a deletion that fails is logged, not tried again.
"""

from __future__ import annotations

import asyncio
import logging

from tidegate.dispatch.provider_batches.clients.openai import BatchClient
from tidegate.dispatch.provider_batches.collection import BatchPart, BatchServices
from tidegate.dispatch.provider_batches.store import CANCEL, CLEAN_UP, ProviderBatchRecord
from tidegate.dispatch.provider_batches.submission import PENDING
from tidegate.errors import TidegateError
from tidegate.jobs import FINAL_STATES, JobState

__all__ = ["BatchUpkeep"]

log = logging.getLogger("tidegate.worker.provider_batches")

OPEN_LOOKED_AT = 100  # open batches looked at per round, the oldest first


class BatchUpkeep(BatchPart):
    """One worker's share of the upkeep of provider batches (see the module's docstring): `start`
    looks every `poll_s` until `close`."""

    def __init__(self, services: BatchServices) -> None:
        super().__init__(services)
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Look at the open batches every `poll_s` from now on (in the running loop)."""
        polls = [provider.batch.poll_s for provider in self._providers.values() if provider.batch is not None]
        if polls and self._task is None:
            self._task = asyncio.create_task(self._every(min(polls)), name="provider batch upkeep")

    async def _every(self, interval_s: float) -> None:
        while True:
            await asyncio.sleep(interval_s)
            try:
                await self.look()
            except TidegateError as exc:
                log.warning("provider batch upkeep: %s", exc)
            except Exception:  # a bug must not end the upkeep: it is tried again next round
                log.exception("provider batch upkeep failed unexpectedly")

    async def look(self) -> None:
        """One round: cancel or clean up each open batch that needs it."""
        for record in await self._store.open_batches(OPEN_LOOKED_AT):
            client = self._clients.get(record.provider)
            if client is None or record.batch_id.startswith(PENDING):
                continue
            try:
                await self._look_at(record, client)
            except TidegateError as exc:  # looked at again next round
                log.warning("provider batch %s/%s: upkeep failed: %s", record.provider, record.batch_id, exc)

    async def _look_at(self, record: ProviderBatchRecord, client: BatchClient) -> None:
        all_cancelled = await self._unneeded(record)
        if all_cancelled is None:
            return
        where = f"provider batch {record.provider}/{record.batch_id}"
        batch = await client.retrieve(record.batch_id)
        if batch.ended:
            if await self._store.claim(record.provider, record.batch_id, CLEAN_UP):
                try:
                    deleted = await client.delete_files(record.batch_id)
                except TidegateError as exc:
                    log.warning("%s: its files stay at the provider, their deletion failed: %s", where, exc)
                    return
                log.info("%s (%s): its %d files deleted at the provider", where, batch.status, deleted)
        elif all_cancelled and await self._store.claim(record.provider, record.batch_id, CANCEL):
            cancelled = await client.cancel(record.batch_id)
            log.info("%s: every job of it was cancelled, so it was cancelled at the provider (%s)", where,
                     cancelled.status)

    async def _unneeded(self, record: ProviderBatchRecord) -> bool | None:
        """None when a job of the batch may still be collected from it; else whether every one
        was cancelled (or forgotten)."""
        all_cancelled = True
        for job_id in record.job_ids:
            job = await self._queue.get(job_id)
            if job is not None and job.state not in FINAL_STATES:
                entry = await self._store.job(job_id)
                if entry is not None and entry.batch_id == record.batch_id and entry.live_reason is None:
                    return None
            all_cancelled = all_cancelled and (job is None or job.state is JobState.CANCELLED)
        return all_cancelled

    async def close(self) -> None:
        """Stop looking."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
