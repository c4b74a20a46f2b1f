"""The public queue API. `Queue` validates, converts and logs once; backends implement the
`_hooks`, each of which is one atomic state change (one Lua script, one SQLite transaction)."""

from __future__ import annotations

import abc
import asyncio
import logging
import os
import random
import time
from collections.abc import Awaitable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import orjson
from pydantic import ValidationError

from tidegate._lifecycle import Lifecycle
from tidegate._redis import is_redis_url
from tidegate._shutdown import bounded, cancel_bounded
from tidegate._sqlite import sqlite_path
from tidegate._urls import redact_url, without_query
from tidegate.errors import (
    ConfigError,
    InvalidJob,
    JobNotFound,
    PayloadTooLarge,
    QueueClosed,
)
from tidegate.jobs import (
    Job,
    JobFailure,
    JobSpec,
    JobState,
    JsonObject,
    Priority,
    datetime_to_ms,
    ms_to_datetime,
    now_ms,
)
from tidegate.queue._finishes import Finishes
from tidegate.queue._handoff import Handoffs, WaitingClaim
from tidegate.queue.settings import QueueSettings

__all__ = ["LevelStats", "MaintenanceReport", "NewJob", "Queue", "QueueSettings", "QueueStats"]

log = logging.getLogger("tidegate.queue")

# Longest relative delay, timeout or age accepted (ten years): beyond it a time no longer fits the
# stores' integer milliseconds and calendars, and no job meant it.
MAX_RELATIVE_S = 10 * 365 * 86_400

ALL_LEVELS: tuple[int, ...] = tuple(int(p) for p in Priority)
# A failure record is a status and a message, not a log: its JSON is bounded like an error text.
MAX_FAILURE_BYTES = 16_384
MAX_REASON_CHARS = 2_000  # a release's reason is one line for the job's view


@dataclass(frozen=True, slots=True)
class NewJob:
    """A validated job ready to be written: what backends receive from `enqueue`."""

    id: str
    priority: int
    payload: bytes  # JSON of an object
    tenant: str
    created_ms: int
    not_before_ms: int | None  # in the future → the job starts as delayed
    deadline_ms: int | None
    max_attempts: int
    idempotency_key: str | None
    callback_url: str | None
    caller_waits: bool = False
    # Kept `answered_ttl_s` once finished, not `finished_ttl_s`: its caller waits for the answer,
    # and nothing will ask for it again (no idempotency key, no `keep_answer`).
    brief: bool = False


@dataclass(frozen=True, slots=True)
class LevelStats:
    """One priority level: jobs waiting, how long the oldest has waited, jobs leased."""

    depth: int
    oldest_wait_s: float
    in_flight: int


@dataclass(frozen=True, slots=True)
class QueueStats:
    """A snapshot of the queue."""

    levels: dict[Priority, LevelStats]
    delayed: int  # delayed or failed, waiting for their time
    dead: int  # dead letters (kept dead_ttl_s, or until redriven or purged)
    # Succeeded jobs still kept: finished_ttl_s, or answered_ttl_s for a call whose caller had
    # its answer. A count over the retention window, not since the queue began.
    succeeded: int = 0

    @property
    def depth(self) -> int:
        """Jobs waiting to be claimed, over all levels."""
        return sum(level.depth for level in self.levels.values())

    @property
    def in_flight(self) -> int:
        """Jobs leased by workers, over all levels."""
        return sum(level.in_flight for level in self.levels.values())


@dataclass(slots=True)
class MaintenanceReport:
    """What one `maintain()` pass did; `ran` is False when another process held the upkeep lock."""

    ran: bool = False
    recovered: int = 0  # expired leases put back in the queue
    dead: int = 0  # expired leases that had no attempts left
    expired: int = 0  # waiting jobs past their deadline
    promoted: int = 0  # delayed or failed jobs whose time came
    aged: int = 0  # waiting jobs moved up one level by aging
    purged: int = 0  # finished jobs and dead letters past retention
    extra: dict[str, int] = field(default_factory=dict)


class Queue(Lifecycle):
    """A durable priority queue. Create one with `Queue.from_url(...)` and use it as an async
    context manager (or call `open()` and `close()`); a closed queue cannot reopen. Used before
    open or after close, it raises QueueClosed. While open it runs its upkeep (`maintain()`)
    every `maintenance_interval_s` on a task of its own."""

    unavailable_error = QueueClosed
    what = "this queue"

    # Whether the backend writes jobs offered to a waiting claim of this instance leased to it
    # (`_enqueue_handing`; see queue/_handoff.py).
    hands_off = False

    def __init__(self, settings: QueueSettings | None = None) -> None:
        super().__init__()
        self.settings = settings or QueueSettings()
        self._maintenance: asyncio.Task[None] | None = None
        self._handoffs = Handoffs(self.release)
        self._finishes = Finishes()

    # ------------------------------------------------------------------ construction, lifecycle

    @staticmethod
    def from_url(url: str, settings: QueueSettings | None = None, **options: Any) -> Queue:
        """`sqlite:///path/to/tidegate.db` (embedded), `redis://host:port/db` or
        `redis+cluster://host:port` (any node of a Redis Cluster).

        Settings come from `settings`, then from URL query parameters (`?name=jobs`), then from
        keyword options; later ones win.
        """
        parts = urlsplit(url)
        query = dict(parse_qsl(parts.query))
        merged = {**(settings.model_dump() if settings else {}), **query, **options}
        try:
            resolved = QueueSettings.model_validate(merged)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(part) for part in error['loc'])}: {error['msg']}" for error in exc.errors()
            )
            raise ConfigError(f"invalid queue settings for {redact_url(url)}: {problems}") from None
        base_url = without_query(url)
        if parts.scheme == "sqlite":
            from tidegate.queue.sqlite import SqliteQueue

            if resolved.wait_replicas:
                raise ConfigError(f"wait_replicas is a Redis setting; {redact_url(url)} has no replicas")
            return SqliteQueue(sqlite_path(url), resolved)
        if is_redis_url(url):
            from tidegate.queue.redis import RedisQueue

            return RedisQueue(base_url, resolved)
        raise ConfigError(
            f"unsupported queue URL {redact_url(url)!r}: use sqlite:///path/to/file.db, redis://host:port/db "
            "or redis+cluster://host:port"
        )

    def _opened(self) -> None:
        interval = self.settings.maintenance_interval_s
        if interval is not None:
            self._maintenance = asyncio.create_task(self._maintain_forever(interval))

    async def _closing(self) -> None:
        if self._maintenance is not None:
            await cancel_bounded(self._maintenance, "the queue's upkeep stop")
        # Bounded: a listener or pool stuck on a server that stopped answering must not hold
        # the process that closes the queue.
        await bounded(self._close(), "the queue's close")

    async def _maintain_forever(self, interval_s: float) -> None:
        # The first pass runs at once: a process that restarts often (or lives shorter than an
        # interval) still recovers what a crashed one left behind.
        while True:
            try:
                await self._maintain()
            except asyncio.CancelledError:
                raise
            except Exception:  # upkeep must outlive a passing backend error
                log.exception("queue maintenance failed; retrying in %.1fs", interval_s)
            await asyncio.sleep(interval_s)

    # ------------------------------------------------------------------ producing

    async def enqueue(self, payload: Mapping[str, Any], **options: Any) -> str:
        """Add one job; returns its id (the existing id for a known idempotency key).

        Options are the fields of `JobSpec`: priority, tenant, delay_s, not_before, deadline,
        timeout_s, max_attempts, idempotency_key, callback_url, caller_waits, keep_answer.
        """
        ids = await self.enqueue_many([{"payload": payload, **options}])
        return ids[0]

    async def enqueue_many(self, jobs: Iterable[JobSpec | Mapping[str, Any]], *,
                           will_wait: bool = False) -> list[str]:
        """Add a batch in one round trip and one atomic write: all are added or none.

        `will_wait`: the caller will `wait()` for these jobs next (a call answered when its job
        is done). This instance then watches them from before they are written, so the wait
        needs no first read, and is handed each job as it finishes where the backend can."""
        self._check_open()
        specs = list(jobs)
        if len(specs) > self.settings.max_batch:
            raise InvalidJob(f"batch of {len(specs)} jobs is over the limit of {self.settings.max_batch}")
        now = now_ms()
        prepared = [self._prepare(spec, now, index) for index, spec in enumerate(specs)]
        if not prepared:
            return []
        if not will_wait:
            return await self._write_new(prepared)
        expected = self._finishes.expect(
            (job.id, _payload_of(spec)) for job, spec in zip(prepared, specs, strict=True))
        try:
            ids = await self._write_new(prepared)
        except BaseException:
            self._finishes.unexpect(expected)
            raise
        # A known idempotency key returns the first job's id: the new one was never written.
        self._finishes.unexpect(waiter for waiter, job_id in zip(expected, ids, strict=True)
                                if waiter.job_id != job_id)
        return ids

    async def _write_new(self, prepared: list[NewJob]) -> list[str]:
        if not self.hands_off:
            return await self._enqueue(prepared)
        offers = self._handoffs.offers([(job.id, job.priority) for job in prepared if not job.not_before_ms])
        if not offers:
            ids, _ = await self._enqueue_handing(prepared, offers)
            return ids
        # The claims offered jobs get what was written, even if this caller is cancelled while
        # the write goes on: jobs leased to a claim must reach it (or go back to the queue).
        writing = asyncio.ensure_future(self._enqueue_handing(prepared, offers))
        writing.add_done_callback(lambda done: self._handoffs.deliver(offers, _handed(done)))
        ids, _ = await asyncio.shield(writing)
        return ids

    def _prepare(self, spec: JobSpec | Mapping[str, Any], now: int, index: int) -> NewJob:
        try:
            if not isinstance(spec, JobSpec):
                spec = JobSpec.from_mapping(spec)
            return self._prepare_spec(spec, now)
        except InvalidJob as exc:
            if index == 0:
                raise
            raise type(exc)(f"job {index} of the batch: {exc}") from exc

    def _prepare_spec(self, spec: JobSpec, now: int) -> NewJob:
        # dict first: the ABC check behind Mapping costs more than the rest of this line.
        if not isinstance(spec.payload, dict | Mapping):
            raise InvalidJob(f"payload must be a JSON object, got {type(spec.payload).__name__}")
        try:
            payload = orjson.dumps(spec.payload)
        except TypeError as exc:
            raise InvalidJob(f"payload is not JSON-serialisable: {exc}") from exc
        if len(payload) > self.settings.max_payload_bytes:
            raise PayloadTooLarge(
                f"payload is {len(payload)} bytes, over the limit of {self.settings.max_payload_bytes}"
            )
        priority = Priority.parse(spec.priority)
        tenant = _checked_text("tenant", spec.tenant, required=True)
        not_before = _resolve_time("not_before", spec.not_before, "delay_s", spec.delay_s, now)
        deadline = _resolve_time("deadline", spec.deadline, "timeout_s", spec.timeout_s, now)
        max_attempts = self.settings.default_max_attempts if spec.max_attempts is None else spec.max_attempts
        if isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or max_attempts < 1:
            raise InvalidJob(f"max_attempts must be an integer >= 1, got {max_attempts!r}")
        idempotency_key = _checked_text("idempotency_key", spec.idempotency_key)
        caller_waits = bool(spec.caller_waits)
        return NewJob(
            id=new_job_id(now),
            priority=int(priority),
            payload=payload,
            tenant=tenant or "default",
            created_ms=now,
            not_before_ms=not_before if not_before is not None and not_before > now else None,
            deadline_ms=deadline,
            max_attempts=max_attempts,
            idempotency_key=idempotency_key,
            callback_url=_checked_text("callback_url", spec.callback_url),
            caller_waits=caller_waits,
            # A key promises the same job to a retry for as long as finished jobs are kept.
            brief=caller_waits and not spec.keep_answer and idempotency_key is None,
        )

    # ------------------------------------------------------------------ consuming

    async def claim(
        self,
        worker_id: str,
        *,
        priorities: Iterable[Priority | int | str] | None = None,
        limit: int = 1,
        lease_s: float | None = None,
        timeout_s: float = 0.0,
        wake: asyncio.Event | None = None,
    ) -> list[Job]:
        """Lease up to `limit` jobs, highest priority first, FIFO within a level.

        With `timeout_s` > 0 the call blocks until work arrives or the time is up; it is woken
        by the backend, not by polling. Setting `wake` ends the wait early too, with what one
        more attempt claims (perhaps nothing): the way for a caller to change what it claims
        without cancelling a claim, which could lose jobs leased to it as it was cancelled.
        Each job carries a fresh `lease_token`.
        """
        self._check_open()
        if limit < 1:
            raise ValueError(f"limit must be >= 1, got {limit}")
        levels = _levels(priorities)
        lease_ms = _seconds_to_ms(lease_s if lease_s is not None else self.settings.default_lease_s)
        give_up = time.monotonic() + max(timeout_s, 0.0)
        while True:
            # Taken before the attempt, so work that arrives between an empty claim and the
            # wait still wakes the wait.
            marker = self._work_marker()
            jobs = await self._claim(worker_id, levels, limit, lease_ms, marker)
            remaining = give_up - time.monotonic()
            if jobs or remaining <= 0 or (wake is not None and wake.is_set()):
                return jobs
            for_work = (self._wait_for_work(levels, remaining, marker) if wake is None
                        else self._wait_for_work_or_wake(levels, remaining, marker, wake))
            if not self.hands_off:
                await for_work
                continue
            # While it waits, work enqueued by this instance may be handed to it directly.
            waiting = WaitingClaim(worker_id, levels, limit, lease_ms)
            handed = await self._handoffs.wait(waiting, for_work)
            if handed:
                return handed

    async def heartbeat(self, job: Job, lease_s: float | None = None) -> None:
        """Extend the job's lease; raises LeaseLost when the token is stale."""
        self._check_open()
        token = _token(job)
        lease_ms = _seconds_to_ms(lease_s if lease_s is not None else self.settings.default_lease_s)
        expires_ms = await self._heartbeat(job.id, token, lease_ms)
        job.lease_expires_at = ms_to_datetime(expires_ms)

    async def complete(self, job: Job, result: Any = None) -> None:
        """Record the job's result; it becomes succeeded. Raises LeaseLost on a stale token."""
        self._check_open()
        try:
            encoded = orjson.dumps(result)
        except TypeError as exc:
            raise InvalidJob(f"result is not JSON-serialisable: {exc}") from exc
        await self._complete(job.id, _token(job), encoded)

    async def fail(
        self,
        job: Job,
        error: str,
        retry_in_s: float | None = None,
        *,
        retry: bool = True,
        failure: JobFailure | None = None,
    ) -> JobState:
        """Record a failed attempt. The job is retried later at its own priority (after
        `retry_in_s`, or exponential backoff with full jitter) until it has used `max_attempts`;
        then it is dead with this error. With `retry=False` (an error no retry can fix) it is
        dead at once. `failure`, the structured account of the error, is kept with the job if
        this attempt makes it dead (`Job.failure`); a retried attempt has only its `error` text.
        Returns the job's new state."""
        self._check_open()
        encoded = None if failure is None else _encode_failure(failure)
        if not retry:
            return await self._fail(job.id, _token(job), str(error), None, encoded)
        if retry_in_s is None:
            # The exponent is capped: 2**1024 overflows a float, and 2**30 is past any ceiling.
            backoff_s = self.settings.retry_base_s * 2 ** min(max(job.attempts - 1, 0), 30)
            ceiling = min(self.settings.retry_max_s, backoff_s)
            retry_in_s = random.uniform(0, ceiling)
        return await self._fail(job.id, _token(job), str(error), _seconds_to_ms(max(retry_in_s, 0.0)),
                                encoded)

    async def complete_many(self, done: Iterable[tuple[Job, Any]]) -> list[str]:
        """Record the results of many leased jobs in one round trip. Jobs whose lease is stale
        are left unchanged and reported: returns the reasons, one per stale lease."""
        self._check_open()
        items = []
        for job, result in done:
            try:
                items.append((job.id, _token(job), orjson.dumps(result)))
            except TypeError as exc:
                raise InvalidJob(f"result of job {job.id} is not JSON-serialisable: {exc}") from exc
        return await self._complete_many(items) if items else []

    async def release(self, job: Job, delay_s: float = 0.0, *, reason: str | None = None) -> None:
        """Give a leased job back untouched, the attempt uncounted: queued again at once (e.g. on
        shutdown), or after `delay_s` as a delayed job (e.g. its model is paced or its budget
        spent) so no worker holds it meanwhile. `reason`, when given, becomes the job's
        `last_error`, so a job that waits says why (it is no attempt: `errors` is unchanged)."""
        self._check_open()
        if reason is not None:
            reason = _checked_text("reason", reason[:MAX_REASON_CHARS])
        await self._release(job.id, _token(job), _seconds_to_ms(max(delay_s, 0.0)), reason)

    # ------------------------------------------------------------------ inspecting and managing

    async def get(self, job_id: str) -> Job | None:
        """The job with this id, or None."""
        self._check_open()
        return await self._get(job_id)

    async def idempotent_ids(self, keys: Sequence[str]) -> dict[str, str]:
        """The job id each known idempotency key maps to (unknown keys are left out): what a
        caller checks before enqueueing, to refuse a key reused for another request."""
        self._check_open()
        return await self._idempotent_ids(list(dict.fromkeys(keys))) if keys else {}

    async def cancel(self, job_id: str) -> bool:
        """Cancel a job that has not finished. True if it was cancelled by this call; a leased
        job's worker then gets LeaseLost on complete or fail."""
        self._check_open()
        return await self._cancel(job_id)

    async def forget(self, job_id: str) -> bool:
        """Delete a finished job now, with its payload, result and idempotency key, as retention
        would later. True if it was deleted; False when it is unknown or has not finished (cancel
        it first)."""
        self._check_open()
        return await self._forget(job_id)

    async def caller_gave_up(self, job_id: str) -> bool:
        """The caller that waited for this job stopped waiting before it had the answer (it was
        told to fetch the job later): from now on the job is one nobody waits for, deferred by a
        spent budget like any asynchronous job and kept `finished_ttl_s` once it finishes. True
        if a caller was waiting for it."""
        self._check_open()
        return await self._caller_gave_up(job_id)

    async def wait(self, job_id: str, timeout_s: float) -> Job:
        """Wait until the job is final (or the timeout passes) and return it as it is then.
        The backend wakes the waiter on each finish; nothing polls in a tight loop."""
        self._check_open()
        job = await self._wait_final(job_id, max(timeout_s, 0.0))
        if job is None:
            raise JobNotFound(f"no job with id {job_id!r}")
        return job

    async def stats(self) -> QueueStats:
        """Depth, oldest wait and in-flight per level; delayed and dead counts."""
        self._check_open()
        return await self._stats()

    async def dead_letters(self, limit: int = 100, offset: int = 0) -> list[Job]:
        """Dead jobs, most recent first."""
        self._check_open()
        if limit < 0 or offset < 0:
            raise ValueError("limit and offset must be >= 0")
        return await self._dead_letters(limit, offset)

    async def redrive(self, ids: Sequence[str] | None = None) -> int:
        """Put dead jobs (the given ids, or all with None) back in the queue at their own
        priority with fresh attempts. Returns how many were redriven."""
        self._check_open()
        return await self._redrive(None if ids is None else list(ids))

    async def purge_dead(self, ids: Sequence[str] | None = None, *, older_than_s: float | None = None) -> int:
        """Delete dead letters: the given ids, those older than `older_than_s`, or all."""
        self._check_open()
        if older_than_s is not None and not 0 <= older_than_s <= MAX_RELATIVE_S:
            raise ValueError(f"older_than_s must be from 0 to {MAX_RELATIVE_S}, got {older_than_s!r}")
        older_ms = None if older_than_s is None else _seconds_to_ms(older_than_s)
        return await self._purge_dead(None if ids is None else list(ids), older_ms)

    async def maintain(self) -> MaintenanceReport:
        """One upkeep pass: recover expired leases, expire jobs past their deadline, promote due
        delayed jobs, age waiting jobs, drop what retention says. Only one process runs it at a
        time; the others get a report with `ran=False`."""
        self._check_open()
        return await self._maintain()

    # ------------------------------------------------------------------ backend hooks
    # (and Lifecycle's `_open` and `_close`)

    @abc.abstractmethod
    async def _enqueue(self, jobs: Sequence[NewJob]) -> list[str]: ...

    async def _enqueue_handing(
        self, jobs: Sequence[NewJob], offers: Mapping[str, WaitingClaim],
    ) -> tuple[list[str], list[Job]]:
        """`_enqueue`, writing each job that `offers` names leased to its claim when nothing
        claimable waits at the job's level or above in the levels the claim serves; returns the
        ids and the jobs written leased. Only for a backend with `hands_off`."""
        raise NotImplementedError

    @abc.abstractmethod
    async def _claim(
        self, worker_id: str, levels: tuple[int, ...], limit: int, lease_ms: int, marker: object
    ) -> list[Job]:
        """Lease up to `limit` jobs; `marker` is the attempt's (`_work_marker`), on which a claim
        that finds nothing may note what its wait needs to know."""

    def _work_marker(self) -> object:
        """A mark of the backend's wake-up signal, taken before each claim attempt (and given to
        it)."""
        return None

    @abc.abstractmethod
    async def _wait_for_work(self, levels: tuple[int, ...], timeout_s: float, marker: object) -> None:
        """Return when work may have arrived for these levels since `marker` was taken, or
        after `timeout_s`."""

    async def _wait_for_work_or_wake(self, levels: tuple[int, ...], timeout_s: float, marker: object,
                                     wake: asyncio.Event) -> None:
        """`_wait_for_work`, ended early once `wake` is set. Here by cancelling the wait, which
        suits a wait in this process; a backend whose wait is a command in flight on a server
        ends it from the server's side instead."""
        await _until_set(self._wait_for_work(levels, timeout_s, marker), wake)

    @abc.abstractmethod
    async def _heartbeat(self, job_id: str, token: int, lease_ms: int) -> int:
        """Returns the new lease expiry in epoch ms."""

    @abc.abstractmethod
    async def _complete(self, job_id: str, token: int, result: bytes) -> None: ...

    @abc.abstractmethod
    async def _complete_many(self, items: Sequence[tuple[str, int, bytes]]) -> list[str]: ...

    @abc.abstractmethod
    async def _fail(
        self, job_id: str, token: int, error: str, retry_delay_ms: int | None, failure: bytes | None
    ) -> JobState:
        """`retry_delay_ms` None: dead now, whatever attempts are left. `failure` (JSON of an
        object, or None) is stored only if the job becomes dead."""

    @abc.abstractmethod
    async def _release(self, job_id: str, token: int, delay_ms: int, reason: str | None) -> None:
        """`reason` (None: keep the last error) becomes the job's last error."""

    @abc.abstractmethod
    async def _get(self, job_id: str) -> Job | None: ...

    @abc.abstractmethod
    async def _idempotent_ids(self, keys: list[str]) -> dict[str, str]: ...

    @abc.abstractmethod
    async def _cancel(self, job_id: str) -> bool: ...

    @abc.abstractmethod
    async def _forget(self, job_id: str) -> bool: ...

    @abc.abstractmethod
    async def _caller_gave_up(self, job_id: str) -> bool: ...

    @abc.abstractmethod
    async def _wait_final(self, job_id: str, timeout_s: float) -> Job | None:
        """The job once final or after the timeout; None if there is no such job."""

    @abc.abstractmethod
    async def _stats(self) -> QueueStats: ...

    @abc.abstractmethod
    async def _dead_letters(self, limit: int, offset: int) -> list[Job]: ...

    @abc.abstractmethod
    async def _redrive(self, ids: list[str] | None) -> int: ...

    @abc.abstractmethod
    async def _purge_dead(self, ids: list[str] | None, older_than_ms: int | None) -> int: ...

    @abc.abstractmethod
    async def _maintain(self) -> MaintenanceReport: ...


# ---------------------------------------------------------------------- helpers


def _handed(write: asyncio.Future[tuple[list[str], list[Job]]]) -> list[Job]:
    """The jobs an enqueue wrote leased to waiting claims; none if it failed."""
    if write.cancelled() or write.exception() is not None:
        return []
    return write.result()[1]


def _payload_of(spec: JobSpec | Mapping[str, Any]) -> JsonObject:
    """The payload of a spec `_prepare` accepted, as the Job built from it holds it."""
    payload = spec.payload if isinstance(spec, JobSpec) else spec["payload"]
    return payload if isinstance(payload, dict) else dict(payload)


async def _until_set(waiting: Awaitable[None], event: asyncio.Event) -> None:
    """`waiting`, cut short (cancelled) once `event` is set. Only a wait for work is cut so: it
    holds nothing, and the claim after it finds whatever arrived."""
    work = asyncio.ensure_future(waiting)
    woken = asyncio.ensure_future(event.wait())
    try:
        await asyncio.wait([work, woken], return_when=asyncio.FIRST_COMPLETED)
    finally:
        woken.cancel()
        if not work.done():
            work.cancel()
            await asyncio.wait([work])  # ended before the claim after it runs
    if not work.cancelled():
        work.result()  # a failing wait fails the claim, as it does without `wake`


def _levels(priorities: Iterable[Priority | int | str] | None) -> tuple[int, ...]:
    if priorities is None:
        return ALL_LEVELS
    levels = tuple(sorted({int(Priority.parse(p)) for p in priorities}))
    if not levels:
        raise ValueError("priorities must name at least one level")
    return levels


def _seconds_to_ms(seconds: float) -> int:
    return round(seconds * 1000)


def _token(job: Job) -> int:
    if job.lease_token is None:
        raise InvalidJob(f"job {job.id} carries no lease token: pass the Job returned by claim()")
    return job.lease_token


def _encode_failure(failure: JobFailure) -> bytes:
    if not isinstance(failure, dict):
        raise InvalidJob(f"failure must be a JSON object, got {type(failure).__name__}")
    try:
        encoded = orjson.dumps(failure)
    except TypeError as exc:
        raise InvalidJob(f"failure is not JSON-serialisable: {exc}") from exc
    if len(encoded) > MAX_FAILURE_BYTES:
        raise InvalidJob(f"failure is {len(encoded)} bytes of JSON, over the limit of {MAX_FAILURE_BYTES}")
    return encoded


def new_job_id(now_ms: int) -> str:
    """32 hex digits: the creation time in milliseconds (48 bits), then 80 random bits. Ids made
    one after the other sort together, so a store's index of ids grows at its end (SQLite's
    unique index on `jobs.id` took a random page per insert with fully random ids), and 80 bits
    keep an id as hard to guess as a secret needs."""
    return f"{now_ms & 0xFFFF_FFFF_FFFF:012x}{os.urandom(10).hex()}"


def _checked_text(name: str, value: object, *, required: bool = False) -> str | None:
    if value is None:
        if required:
            raise InvalidJob(f"{name} is required")
        return None
    if not isinstance(value, str):
        raise InvalidJob(f"{name} must be a string, got {type(value).__name__}")
    if required and not value:
        raise InvalidJob(f"{name} must not be empty")
    if len(value) > 2048:
        raise InvalidJob(f"{name} is {len(value)} characters, over the limit of 2048")
    return value or None


def _resolve_time(abs_name: str, absolute: object, rel_name: str, relative: object, now: int) -> int | None:
    if absolute is not None and relative is not None:
        raise InvalidJob(f"give {abs_name} or {rel_name}, not both")
    if absolute is not None:
        if not isinstance(absolute, datetime):
            raise InvalidJob(f"{abs_name} must be a datetime, got {type(absolute).__name__}")
        return datetime_to_ms(absolute)
    if relative is not None:
        if (isinstance(relative, bool) or not isinstance(relative, int | float)
                or not 0 <= relative <= MAX_RELATIVE_S):
            raise InvalidJob(
                f"{rel_name} must be a number of seconds from 0 to {MAX_RELATIVE_S}, got {relative!r}"
            )
        return now + _seconds_to_ms(float(relative))
    return None


