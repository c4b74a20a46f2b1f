"""The provider-batch store's contract: per batch submitted to a provider's own batch API, its
provider, id, model, endpoint, jobs and submission time; per job, the batch it waits in (or why
it is served live instead) and the budget it holds until it is collected.

The record is what makes a provider batch survive a worker: a job is released to the queue while
its batch runs, and whichever worker claims it next finds it here and collects it rather than
submitting it again. A batch and its jobs are written in one atomic step (one SQLite transaction,
one Redis MULTI), so a job is never recorded without its batch. Records expire after KEEP_S (a
batch ends within its 24 h window), so nothing grows without bound.

A batch is open until its upkeep is done: `open_batches` lists them, and `claim` lets one worker
only take a step of it (`CANCEL` it at the provider, `CLEAN_UP` its files there, which retires it
from the open ones), so that each step is done once across workers.

Every batch recorded within KEEP_S, open or not, is listed by `recent`, the newest first, a page at
a time, for the admin API to show; `jobs` reads the entries of many jobs in one step.

`ProviderBatchStore` checks the lifecycle and converts records once around the `_hooks` that
`sqlite.SqliteProviderBatchStore` and `redis.RedisProviderBatchStore` implement;
`provider_batch_store_for(queue_url)` picks one by the queue's URL.

- SQLite (`sqlite:///path`): the queue's file, tables `provider_batches`, `provider_batch_jobs`
  and `provider_batch_claims`, rows under the store's name.
- Redis (`redis://…?name=X`): one string per batch (`tidegate:{X}:pbatch:<provider>/<id>`), per
  job (`tidegate:{X}:pbatch_job:<job id>`) and per claim, JSON, with a TTL and the queue's hash
  tag; the open batches in one sorted set by time recorded, and every batch in another.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from datetime import datetime
from typing import Any

import orjson

from tidegate._urls import without_query
from tidegate.coord._store import OpensOnFirstUse, backend_of, queue_name_of, sqlite_path_of
from tidegate.errors import DispatchClosed

__all__ = ["CANCEL", "CLEAN_UP", "KEEP_S", "BatchedJob", "ProviderBatchRecord", "ProviderBatchStore",
           "provider_batch_store_for"]

KEEP_S = 7 * 86_400  # a batch ends within its 24 h window; a week leaves room for late collection
CANCEL = "cancel"  # the step of cancelling a batch at the provider
CLEAN_UP = "clean_up"  # the step of deleting a batch's files at the provider: it retires the batch


@dataclass(frozen=True, slots=True)
class ProviderBatchRecord:
    """One batch submitted to a provider: its jobs are its lines, by job id (the custom_id)."""

    provider: str
    batch_id: str
    model: str
    endpoint: str
    job_ids: tuple[str, ...]
    submitted_at: datetime

    def to_json(self) -> bytes:
        """The record as stored."""
        return orjson.dumps({**asdict(self), "submitted_at": self.submitted_at.isoformat()})

    @classmethod
    def from_json(cls, raw: str | bytes) -> ProviderBatchRecord:
        """A stored record."""
        data = orjson.loads(raw)
        return cls(data["provider"], data["batch_id"], data["model"], data["endpoint"],
                   tuple(data["job_ids"]), datetime.fromisoformat(data["submitted_at"]))


@dataclass(frozen=True, slots=True)
class BatchedJob:
    """A job's place in a provider batch. `hold` is the budget it holds until collected, in the
    worker's own form (opaque here); `live_reason`, once set, says why the job is served by a live
    call instead (its line failed, its batch could not be submitted or ended without it)."""

    job_id: str
    provider: str
    batch_id: str
    hold: dict[str, Any] | None = None
    live_reason: str | None = None

    def served_live(self, reason: str) -> BatchedJob:
        """This entry, the job to be served live for `reason`, its hold given back."""
        return replace(self, hold=None, live_reason=reason)

    def to_json(self) -> bytes:
        """The entry as stored."""
        return orjson.dumps(asdict(self))

    @classmethod
    def from_json(cls, raw: str | bytes) -> BatchedJob:
        """A stored entry."""
        data = orjson.loads(raw)
        return cls(data["job_id"], data["provider"], data["batch_id"], data.get("hold"),
                   data.get("live_reason"))


class ProviderBatchStore(OpensOnFirstUse):
    """Provider batches and their jobs, kept in the queue's backend. Opens on first use; a closed
    store raises DispatchClosed."""

    unavailable_error = DispatchClosed
    what = "this provider-batch store"

    def __init__(self, name: str) -> None:
        super().__init__()
        self.name = name

    async def record(self, batch: ProviderBatchRecord, jobs: Sequence[BatchedJob]) -> None:
        """Store a submitted batch and the entries of its jobs, in one atomic step."""
        await self._ready()
        await self._record(batch.provider, batch.batch_id, batch.to_json(),
                           [(job.job_id, job.to_json()) for job in jobs])

    async def put_jobs(self, jobs: Sequence[BatchedJob]) -> None:
        """Store (or replace) job entries: a job to be served live, say."""
        if jobs:
            await self._ready()
            await self._put_jobs([(job.job_id, job.to_json()) for job in jobs])

    async def job(self, job_id: str) -> BatchedJob | None:
        """The job's entry, or None when it never went to a provider batch."""
        await self._ready()
        raw = await self._get_job(job_id)
        return None if raw is None else BatchedJob.from_json(raw)

    async def batch(self, provider: str, batch_id: str) -> ProviderBatchRecord | None:
        """The batch, or None."""
        await self._ready()
        raw = await self._get_batch(provider, batch_id)
        return None if raw is None else ProviderBatchRecord.from_json(raw)

    async def open_batches(self, most: int) -> list[ProviderBatchRecord]:
        """The batches recorded within KEEP_S whose CLEAN_UP nobody claimed yet, the oldest
        first, at most `most`."""
        await self._ready()
        return [ProviderBatchRecord.from_json(raw) for raw in await self._open_batches(most)]

    async def recent(self, limit: int, *, after: tuple[str, str] | None = None
                     ) -> tuple[list[ProviderBatchRecord], bool]:
        """Up to `limit` batches recorded within KEEP_S, the newest first, after the batch `after`
        (provider, batch id; none when there is no such batch), and whether more follow."""
        await self._ready()
        raws = await self._recent(after, limit + 1)
        return [ProviderBatchRecord.from_json(raw) for raw in raws[:limit]], len(raws) > limit

    async def jobs(self, job_ids: Sequence[str]) -> dict[str, BatchedJob]:
        """The entries of those of `job_ids` that have one, by job id, read in one step."""
        if not job_ids:
            return {}
        await self._ready()
        raws = await self._get_jobs(list(job_ids))
        return {job_id: BatchedJob.from_json(raw) for job_id, raw in zip(job_ids, raws, strict=True)
                if raw is not None}

    async def claim(self, provider: str, batch_id: str, step: str) -> bool:
        """Take `step` of the batch's upkeep (CANCEL, CLEAN_UP): True for the first caller only.
        Claiming CLEAN_UP retires the batch from `open_batches`."""
        await self._ready()
        return await self._claim(provider, batch_id, step)

    # -- storage hooks, implemented by each backend (the store open)

    @abc.abstractmethod
    async def _record(self, provider: str, batch_id: str, batch: bytes,
                      jobs: list[tuple[str, bytes]]) -> None: ...

    @abc.abstractmethod
    async def _put_jobs(self, jobs: list[tuple[str, bytes]]) -> None: ...

    @abc.abstractmethod
    async def _get_job(self, job_id: str) -> str | bytes | None: ...

    @abc.abstractmethod
    async def _get_jobs(self, job_ids: list[str]) -> Sequence[str | bytes | None]:
        """The entry of each of `job_ids` (None: none), in their order."""

    @abc.abstractmethod
    async def _get_batch(self, provider: str, batch_id: str) -> str | bytes | None: ...

    @abc.abstractmethod
    async def _open_batches(self, most: int) -> Sequence[str | bytes]: ...

    @abc.abstractmethod
    async def _recent(self, after: tuple[str, str] | None, count: int) -> Sequence[str | bytes]:
        """Up to `count` batch records, the most recently recorded first, after `after` when
        given (none when it is unknown)."""

    @abc.abstractmethod
    async def _claim(self, provider: str, batch_id: str, step: str) -> bool: ...


def provider_batch_store_for(queue_url: str) -> ProviderBatchStore:
    """The provider-batch store of a queue: the same SQLite file (its own tables) or the same
    Redis server (keys under the queue's `?name=`, "default" when not given)."""
    name = queue_name_of(queue_url)
    if backend_of(queue_url) == "redis":
        from tidegate.dispatch.provider_batches.store.redis import RedisProviderBatchStore

        return RedisProviderBatchStore(without_query(queue_url), name)
    from tidegate.dispatch.provider_batches.store.sqlite import SqliteProviderBatchStore

    return SqliteProviderBatchStore(sqlite_path_of(queue_url), name)
