"""Swapping an item's vector when its embedding arrives.

The change flow's refresh rule turns a product whose name or description changed into an
embedding job on the request flow's queue, at LOW priority (tidegate.sync.refresh). Until it
succeeds the recommender uses the item's hashed text vector; `RefreshWatcher` waits on each such
job (`Queue.wait`, woken by the backend on each finish, never polling) and, when it succeeds,
upserts the item — as its row is now in the entity cache — with the embedding from the job's
result (the provider's response, `data[0].embedding`).

An older job whose product has changed its text since (a newer refresh job exists) is ignored,
as is the result for a product deleted meanwhile: a late embedding never overwrites a newer one
or brings a product back.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import math
import struct
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Self

from tidegate.ai import result_of
from tidegate.errors import TidegateError
from tidegate.jobs import Job, JobState
from tidegate.queue import Queue
from tidegate.recs.sink import RecsSink
from tidegate.sync.changes import Change, Version
from tidegate.sync.values import Row

__all__ = ["RefreshWatcher", "embedding_of"]

log = logging.getLogger("tidegate.recs")

RowLoader = Callable[[str], Awaitable[Row | None]]
"""The current row of a product (None: deleted or unknown), e.g. from the entity cache."""


def embedding_of(job: Job) -> tuple[float, ...] | None:
    """The first embedding of a succeeded embeddings job's result (the worker keeps the
    provider's response body under `response`), as floats; None when it holds none. Base64
    embeddings (encoding_format=base64) are little-endian float32, as OpenAI sends them."""
    result = result_of(job)
    response = None if result is None else result.response
    data = None if response is None else response.get("data")
    first = data[0] if isinstance(data, list) and data else None
    raw = first.get("embedding") if isinstance(first, dict) else None
    if isinstance(raw, str):
        try:
            packed = base64.b64decode(raw, validate=True)
        except ValueError:
            return None
        if not packed or len(packed) % 4:
            return None
        raw = list(struct.unpack(f"<{len(packed) // 4}f", packed))
    if not isinstance(raw, list) or not raw:
        return None
    if not all(isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x) for x in raw):
        return None
    return tuple(float(x) for x in raw)


class RefreshWatcher:
    """Waits on embedding refresh jobs of products and swaps the item vectors they bring. An
    async context manager: leaving it stops every wait (the jobs themselves are untouched).
    Pass `enqueued` to the change flow as its refresh listener."""

    def __init__(self, queue: Queue, sink: RecsSink, load_row: RowLoader, *, wait_s: float = 30.0,
                 give_up_s: float = 6 * 3600.0, concurrent_waits: int = 256,
                 max_pending: int = 100_000) -> None:
        self.queue = queue
        self.sink = sink  # swaps go through it, in order with the change flow's product writes
        self.load_row = load_row
        self.mapping = sink.mapping
        self.monitor = sink.monitor
        self.wait_s = wait_s
        self.give_up_s = give_up_s  # a LOW job may wait long behind interactive traffic, not forever
        self.max_pending = max_pending
        self.swapped = 0  # vectors swapped since start
        self._slots = asyncio.Semaphore(concurrent_waits)
        # product id → (version, job id) of its newest refresh: only that job's result is used.
        self._latest: dict[str, tuple[Version, str]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False

    @property
    def pending(self) -> int:
        """Refresh jobs being waited on."""
        return len(self._tasks)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self._closed = True
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def enqueued(self, pairs: Sequence[tuple[Change, str]]) -> None:
        """The refresh listener: start waiting on each new job of a product."""
        for change, job_id in pairs:
            if self._closed or change.entity_type != self.mapping.products:
                continue
            latest = self._latest.get(change.entity_id)
            if latest is not None and (latest[1] == job_id or latest[0] > change.version):
                continue  # the same job again (a replay), or an older change than one already watched
            if len(self._tasks) >= self.max_pending:
                self._dropped("overflow", change.entity_id, job_id)
                continue
            self._latest[change.entity_id] = (change.version, job_id)
            task = asyncio.create_task(self._watch(change.entity_id, change.version, job_id),
                                       name=f"refresh-watch-{job_id}")
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _watch(self, item_id: str, version: Version, job_id: str) -> None:
        try:
            job = await self._final(job_id)
            if job is None:
                self._dropped("timeout", item_id, job_id)
            elif job.state is not JobState.SUCCEEDED:
                self._dropped(job.state.value, item_id, job_id)
            elif self._latest.get(item_id) != (version, job_id):
                self._dropped("superseded", item_id, job_id)
            else:
                await self._swap(item_id, job)
        except TidegateError as exc:  # the queue's or the recommender's store is down
            log.warning("refresh job %s of %s %s: vector not swapped: %s", job_id, self.mapping.products,
                        item_id, exc)
            self._dropped("error", item_id, job_id)
        finally:
            if self._latest.get(item_id) == (version, job_id):
                del self._latest[item_id]

    async def _final(self, job_id: str) -> Job | None:
        """The job once final; None if it is not within `give_up_s` (or has vanished)."""
        give_up = time.monotonic() + self.give_up_s
        async with self._slots:
            while True:
                remaining = give_up - time.monotonic()
                if remaining <= 0:
                    return None
                try:
                    job = await self.queue.wait(job_id, min(self.wait_s, remaining))
                except TidegateError:
                    with contextlib.suppress(TidegateError):
                        if await self.queue.get(job_id) is None:
                            return None  # purged by retention: nothing to wait for
                    raise
                if job.is_final:
                    return job

    async def _swap(self, item_id: str, job: Job) -> None:
        vector = embedding_of(job)
        if vector is None:
            self._dropped("no_embedding", item_id, job.id)
            return
        outcome = await self.sink.swap_vector(item_id, vector, lambda: self.load_row(item_id))
        if outcome != "swapped":
            self._dropped(outcome, item_id, job.id)
            return
        self.swapped += 1
        self.monitor.vector_swaps.inc()
        log.debug("%s %s: vector swapped for the embedding of job %s", self.mapping.products, item_id, job.id)

    def _dropped(self, reason: str, item_id: str, job_id: str) -> None:
        self.monitor.refresh_dropped.labels(reason).inc()
        if reason not in ("superseded", "deleted"):
            log.info("refresh job %s of %s %s: vector not swapped (%s)", job_id, self.mapping.products,
                     item_id, reason)
