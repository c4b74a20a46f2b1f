"""Redis backend: every state change is one Lua script (lua/*.lua, sharing lua/_common.lua).

All keys of a queue carry its `{hash tag}`, and each script is passed in KEYS exactly the keys
it touches (named on its `-- KEYS:` line, see queue/_lua.py), so the queue works on Redis Cluster
(`redis+cluster://host:port`) and a call packs no more arguments than it needs. Times come from
the Redis server's clock (`TIME` inside the scripts), so workers with drifting clocks still agree
on lease expiry. Blocked claimers wait in BLPOP on per-level token lists that the scripts push
(a claim its caller may wake, also on a list of its own that the wake pushes to); `wait()`
listens on a pub/sub channel of finished job ids (sharded on a cluster, so the messages stay
within the queue's shard).

With `wait_replicas` set, every state change returns only once that many replicas hold it (WAIT
after the script, on its connection): a failover that promotes one of them loses no acknowledged
enqueue, claim or result. Without it, replication is asynchronous and a failover can lose what
the master acknowledged in its last moments.

Across a lost connection (a Redis restart) the pool lends fresh connections, a blocked claimer
waits on and reconnects within its wait, and the job-done listener reconnects with backoff for
as long as the queue is open. Announcements made while it was not subscribed are lost, so each
time it has subscribed again every waiter re-reads its job: a wait never depends on the 5 s
safety poll because of a restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgpack
import orjson

from tidegate._formats import FormatCheck, Migration, RedisStore, StoreFormat
from tidegate._group_commit import GroupCall
from tidegate._redis import (
    BLOCK_MAX_S,
    CLOSE_TIMEOUT_S,
    Outage,
    RedisClient,
    driver_errors,
    honouring_cancellation,
    is_connection_error,
    key_prefix,
    publish_command,
)
from tidegate._shutdown import bounded, cancel_bounded
from tidegate._urls import redact_url
from tidegate.errors import LeaseLost, MissingDependency, QueueFull, QueueUnavailable
from tidegate.jobs import Job, JobState, Priority
from tidegate.queue._lua import LEVELS, queue_script
from tidegate.queue.base import (
    LevelStats,
    MaintenanceReport,
    NewJob,
    Queue,
    QueueStats,
)
from tidegate.queue.settings import QueueSettings

try:
    from redis.exceptions import ResponseError
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise MissingDependency(
        "the Redis queue needs redis-py: pip install 'tidegate[redis]'"
    ) from exc

SAFETY_WAKE_S = 5.0  # longest a blocked claimer waits without re-checking
# How long a wake token (see _wait_for_work_or_wake) outlives a wait that ended without reading it:
# longer than a BLPOP may wait for a pooled connection to be sent at all.
WAKE_TOKEN_TTL_MS = 60_000
UPKEEP_BATCH = 1_000  # jobs one maintenance step touches, so a script never blocks Redis long
REDRIVE_BATCH = 10_000
_SCRIPTS = (
    "enqueue", "claim", "heartbeat", "complete", "fail", "release", "cancel", "forget",
    "redrive", "purge_dead", "maintain", "read", "stats", "gave_up",
)
_READ_ONLY_SCRIPTS = frozenset({"read", "stats"})  # safe to send twice
_DRIVER_ERRORS = driver_errors()

log = logging.getLogger("tidegate.queue")

# The queue's keys' format (see tidegate._formats). Format 1 is 0.1.0's layout, now recorded;
# format 2 adds the `caller_waits` and `brief` fields of a job's record and the `answered` index,
# which nothing written before has (so the step from 1 only records the version), and which a
# 0.1.0 process sharing the queue in a rolling upgrade carries along untouched.
REDIS_FORMAT = StoreFormat("queue", 2, (
    Migration(1, "record the queue's format (0.1.0's layout)"),
    Migration(2, "jobs say whether a caller waits for them; answered ones are kept in their own "
                 "retention index (nothing to convert)"),
))


def redis_store(name: str) -> RedisStore:
    """Where the queue called `name` keeps its format: the field "queue" of the hash
    `tidegate:{name}:formats`, shared with the coordination stores of the same name. A queue that
    ever held a job has its sequence counter."""
    prefix = key_prefix(name)
    return RedisStore(REDIS_FORMAT, prefix + "formats", (prefix + "seq", prefix + "jobs"))


@dataclass(slots=True)
class _EmptyClaim:
    """What a claim that found nothing saw: the server's time and when work may next come due
    (-1: nothing delayed or leased), for the wait that follows it."""

    server_now_ms: int | None = None
    next_due_ms: int = -1


class RedisQueue(Queue):
    """`Queue.from_url("redis://host:6379/0")`; any number of processes may share one queue."""

    def __init__(self, url: str, settings: QueueSettings | None = None) -> None:
        super().__init__(settings)
        self.url = url
        self._prefix = key_prefix(self.settings.name)
        self._signal_keys = [f"{self._prefix}signal:{level}" for level in LEVELS]
        self._done_channel = self._prefix + "done"
        self._script_keys: dict[str, tuple[str, ...]] = {}
        self._client: RedisClient | None = None
        self._redis: Any = None
        self._scripts: dict[str, Any] = {}
        self._replicated = self.settings.wait_replicas > 0
        self._listener: asyncio.Task[None] | None = None
        self._enqueues: GroupCall[NewJob, str] = GroupCall(self._enqueue_group)
        self._completes: GroupCall[tuple[str, int, bytes], str] = GroupCall(self._complete_each)
        self._done_outage = Outage("queue", url)
        self._format = FormatCheck(redis_store(self.settings.name))
        self._wakeup_outage = Outage("queue_wakeup", url)

    # ------------------------------------------------------------------ plumbing

    async def _open(self) -> None:
        publish = publish_command(self.url)
        scripts = {name: queue_script(name, self._prefix, self.settings, self._done_channel, publish=publish)
                   for name in _SCRIPTS}
        self._script_keys = {name: script.keys for name, script in scripts.items()}
        client = RedisClient(
            self.url, what="Redis queue", unavailable=QueueUnavailable, max_connections=64,
            scripts={name: script.source for name, script in scripts.items()},
            wait_replicas=self.settings.wait_replicas, wait_timeout_s=self.settings.wait_timeout_s)
        await client.ping()
        try:
            await self._format.ready(client)  # refuses a newer queue before anything reads it
        except BaseException:
            await client.aclose()
            raise
        self._client, self._redis, self._scripts = client, client.client, client.scripts

    async def _close(self) -> None:
        # Jobs and results already handed over are sent before the connections go (bounded: a
        # server that stopped answering must not hold the close).
        await bounded(asyncio.gather(self._enqueues.drain(), self._completes.drain()),
                      "the queue's last writes", 2 * CLOSE_TIMEOUT_S)
        if self._listener is not None:
            # The listener is cancelled in a read or a backoff sleep; its own clean-up is bounded.
            await cancel_bounded(self._listener, "the job-done listener's stop", 2 * CLOSE_TIMEOUT_S)
        if self._redis is not None:
            await self._redis.aclose()

    async def _call(self, name: str, *args: Any) -> Any:
        """Run one script; stale leases and full levels come back as our own errors."""
        keys, script = self._script_keys[name], self._scripts[name]

        def run() -> Any:
            if self._replicated and name not in _READ_ONLY_SCRIPTS:
                assert self._client is not None
                return self._client.replicated_script(name, list(keys), list(args))
            return script(keys=keys, args=args)

        try:
            try:
                return await honouring_cancellation(run())
            except _DRIVER_ERRORS as exc:
                # A pooled connection can outlive its server (a Redis restart, a failover): a
                # read is sent again once on a fresh connection. State changes are not — their
                # first attempt may have run — and surface as QueueUnavailable for the caller's
                # own retry.
                if name not in _READ_ONLY_SCRIPTS or not is_connection_error(exc):
                    raise
                return await honouring_cancellation(run())
        except ResponseError as exc:
            message = str(exc)
            if message.startswith("LEASE_LOST "):
                raise LeaseLost(message.removeprefix("LEASE_LOST ")) from None
            if message.startswith("QUEUE_FULL "):
                level, depth, limit = (int(part) for part in message.split()[1:4])
                raise QueueFull(
                    f"priority {Priority(level).name.lower()} is full: {depth} waiting, limit {limit}",
                    priority=level,
                    retry_after_s=self.settings.queue_full_retry_after_s,
                ) from None
            raise QueueUnavailable(f"Redis queue script {name} failed: {exc}") from exc
        except _DRIVER_ERRORS as exc:
            raise QueueUnavailable(f"Redis queue at {redact_url(self.url)}: {exc}") from exc

    # ------------------------------------------------------------------ producing and consuming

    async def _enqueue(self, jobs: Sequence[NewJob]) -> list[str]:
        if len(jobs) == 1:
            # One-job enqueues (a gateway's calls) made in the same loop turn, or while the last
            # group was on its way, go out in one script call (see tidegate._group_commit).
            return [await self._enqueues.call(jobs[0])]
        return await self._enqueue_now(jobs)

    async def _enqueue_group(self, jobs: list[NewJob]) -> Sequence[str | BaseException]:
        """One-job enqueues of several callers in one script call. The script adds a batch
        whole or not at all, so a full level must not refuse one caller for another's job: a
        group refused as full is sent again one job at a time, each caller told its own answer."""
        try:
            return await self._enqueue_now(jobs)
        except QueueFull:
            if len(jobs) == 1:
                raise
        outcomes: list[str | BaseException] = []
        for job in jobs:
            try:
                [job_id] = await self._enqueue_now([job])
            except (QueueFull, QueueUnavailable) as exc:
                outcomes.append(exc)
            else:
                outcomes.append(job_id)
        return outcomes

    async def _enqueue_now(self, jobs: Sequence[NewJob]) -> list[str]:
        specs = orjson.dumps([
            [job.id, job.priority, job.tenant, job.created_ms, job.not_before_ms or 0,
             job.deadline_ms or 0, job.max_attempts, job.idempotency_key or "", job.callback_url or "",
             int(job.caller_waits), int(job.brief)]
            for job in jobs
        ])
        ids = await self._call("enqueue", specs, *(job.payload for job in jobs))
        return [raw.decode() for raw in ids]

    def _work_marker(self) -> _EmptyClaim:
        return _EmptyClaim()

    async def _claim(self, worker_id: str, levels: tuple[int, ...], limit: int, lease_ms: int,
                     marker: object) -> list[Job]:
        flat = await self._call("claim", worker_id, lease_ms, limit, *levels)
        if flat and isinstance(flat[0], int):  # nothing claimed: the server's time, the next due
            if isinstance(marker, _EmptyClaim):
                marker.server_now_ms, marker.next_due_ms = int(flat[0]), int(flat[1])
            return []
        return [Job.from_record(msgpack.unpackb(flat[i]), flat[i + 1]) for i in range(0, len(flat), 2)]

    async def _wait_for_work(self, levels: tuple[int, ...], timeout_s: float, marker: object, *,
                             wake_key: str | None = None) -> None:
        # Tokens pushed by the scripts persist in the lists, so nothing arriving between the empty
        # claim and this wait is missed. The marker holds what the empty claim saw of the next due
        # time; without it (a claim that never ran), the stats script tells. `wake_key`, if any,
        # is one more list to wait on (see _wait_for_work_or_wake).
        if isinstance(marker, _EmptyClaim) and marker.server_now_ms is not None:
            server_now, next_due = marker.server_now_ms, marker.next_due_ms
        else:
            snapshot = await self._call("stats")
            server_now, next_due = int(snapshot[0]), int(snapshot[1])
        wait_s = min(timeout_s, SAFETY_WAKE_S, BLOCK_MAX_S)
        if next_due >= 0:
            wait_s = min(wait_s, max(next_due - server_now, 0) / 1000)
        if wait_s <= 0.001:
            return
        keys = [self._signal_keys[level] for level in levels] + ([wake_key] if wake_key else [])
        give_up = time.monotonic() + wait_s
        while (remaining := give_up - time.monotonic()) > 0.001:
            try:
                await honouring_cancellation(self._redis.blpop(keys, timeout=remaining))
            except _DRIVER_ERRORS as exc:
                if not is_connection_error(exc):
                    raise QueueUnavailable(f"Redis queue at {redact_url(self.url)}: {exc}") from exc
                # Lost while waiting (a Redis restart): wait on across it, reconnecting with
                # backoff, so the claim after the wait finds the server back instead of failing.
                # A token a lost reply took is only a hint: the next claim looks anyway.
                self._wakeup_outage.lost(exc)
                await asyncio.sleep(min(self._wakeup_outage.delay_s(), max(remaining, 0)))
                continue
            self._wakeup_outage.restored()
            return

    async def _wait_for_work_or_wake(self, levels: tuple[int, ...], timeout_s: float, marker: object,
                                     wake: asyncio.Event) -> None:
        """The wait for work, woken from the server's side once `wake` is set: it also waits on a
        list of its own, onto which the wake pushes a token, so the BLPOP returns as it would for
        work. A BLPOP is never cancelled to wake it: redis-py loses a cancellation that arrives
        while the command is being sent (Python 3.11's asyncio.wait_for swallows it), and the
        BLPOP then holds the claim to its timeout, up to a second in which a busy worker's slots
        run empty; a cancellation that lands costs the connection besides."""
        wake_key = f"{self._prefix}wake:{uuid.uuid4().hex}"
        waiting = asyncio.ensure_future(self._wait_for_work(levels, timeout_s, marker, wake_key=wake_key))
        woken = asyncio.ensure_future(wake.wait())
        try:
            await asyncio.wait([waiting, woken], return_when=asyncio.FIRST_COMPLETED)
            if not waiting.done():
                try:
                    await self._wake(wake_key)
                except _DRIVER_ERRORS:
                    # Redis is out of reach, so the wait is in its backoff, which a cancel ends.
                    waiting.cancel()
            await asyncio.wait([waiting])
        finally:
            woken.cancel()
            if not waiting.done():  # this claim itself was cancelled
                waiting.cancel()
                await asyncio.wait([waiting])
        if not waiting.cancelled():
            waiting.result()  # a failing wait fails the claim, as it does without `wake`

    async def _wake(self, wake_key: str) -> None:
        """Push the token that ends a wait on `wake_key`. It expires unread when the wait ended
        on its own meanwhile (the key is never used again)."""
        assert self._client is not None
        await self._client.pipelined([("LPUSH", wake_key, b"1"), ("PEXPIRE", wake_key, WAKE_TOKEN_TTL_MS)])

    async def _heartbeat(self, job_id: str, token: int, lease_ms: int) -> int:
        return int(await self._call("heartbeat", job_id, token, lease_ms))

    async def _complete(self, job_id: str, token: int, result: bytes) -> None:
        # Results finished in the same loop turn, or while the last batch was on its way, go
        # out in one script call (see tidegate._group_commit).
        lost = await self._completes.call((job_id, token, result))
        if lost:
            raise LeaseLost(lost)

    async def _complete_many(self, items: Sequence[tuple[str, int, bytes]]) -> list[str]:
        return [lost for lost in await self._complete_each(items) if lost]

    async def _complete_each(self, items: Sequence[tuple[str, int, bytes]]) -> list[str]:
        """Complete the jobs in one script call: per job, '' or why its lease is stale."""
        args: list[Any] = []
        for job_id, token, result in items:
            args += [job_id, token, result]
        outcomes = await self._call("complete", *args)
        return [outcome.decode().removeprefix("LEASE_LOST ") for outcome in outcomes]

    async def _fail(
        self, job_id: str, token: int, error: str, retry_delay_ms: int | None, failure: bytes | None
    ) -> JobState:
        delay = -1 if retry_delay_ms is None else retry_delay_ms
        state = await self._call("fail", job_id, token, error, delay, failure or b"")
        return JobState(state.decode())

    async def _release(self, job_id: str, token: int, delay_ms: int, reason: str | None) -> None:
        await self._call("release", job_id, token, delay_ms, reason or "")

    # ------------------------------------------------------------------ inspect and manage

    async def _read(self, *args: Any) -> list[Job]:
        flat = await self._call("read", *args)
        return [
            Job.from_record(msgpack.unpackb(flat[i]), flat[i + 1], flat[i + 2] or None)
            for i in range(0, len(flat), 3)
        ]

    async def _get(self, job_id: str) -> Job | None:
        jobs = await self._read("ids", job_id)
        return jobs[0] if jobs else None

    async def _idempotent_ids(self, keys: list[str]) -> dict[str, str]:
        try:
            ids = await self._redis.hmget(self._prefix + "idem", keys)  # see lua/_common.lua
        except _DRIVER_ERRORS as exc:
            raise QueueUnavailable(f"Redis queue at {redact_url(self.url)}: {exc}") from exc
        return {key: job_id.decode() if isinstance(job_id, bytes) else job_id
                for key, job_id in zip(keys, ids, strict=True) if job_id is not None}

    async def _cancel(self, job_id: str) -> bool:
        return bool(await self._call("cancel", job_id))

    async def _forget(self, job_id: str) -> bool:
        return bool(await self._call("forget", job_id))

    async def _caller_gave_up(self, job_id: str) -> bool:
        return bool(await self._call("gave_up", job_id))

    async def _wait_final(self, job_id: str, timeout_s: float) -> Job | None:
        self._listen_for_done()
        give_up = time.monotonic() + timeout_s
        # Watched since before this instance wrote it: every finish since reaches the waiter (or,
        # lost with a connection, wakes it when the listener has subscribed again), so there is
        # nothing to read before the first wait.
        waiter = self._finishes.take_expected(job_id)
        read_first = waiter is None
        while True:
            # Registered before the read, so a finish announced in between is not missed: the
            # listener wakes it, or, when the announcement fell into a lost connection, wakes
            # every waiter once it has subscribed again.
            if waiter is None:
                waiter = self._finishes.watch(job_id)
            try:
                if read_first:
                    try:
                        job = await self._get(job_id)
                    except QueueUnavailable as exc:
                        # A re-read lost with the connection (a restart, a failover that takes a
                        # few seconds): the wait goes on, within its timeout, until the listener
                        # has subscribed again and wakes every waiter (or the next safety wake).
                        lost = exc.__cause__ is not None and is_connection_error(exc.__cause__)
                        if not lost or time.monotonic() >= give_up:
                            raise
                    else:
                        if job is None or job.is_final or give_up <= time.monotonic():
                            return job
                read_first = True
                remaining = give_up - time.monotonic()
                with contextlib.suppress(TimeoutError):
                    handed = await asyncio.wait_for(waiter.future, min(max(remaining, 0), SAFETY_WAKE_S))
                    if handed is not None:
                        return handed
            finally:
                self._finishes.forget(waiter)
                waiter = None

    def _listen_for_done(self) -> None:
        """Start the listener once; it lives, reconnecting as needed, until the queue closes."""
        if self._listener is None:
            self._listener = asyncio.create_task(self._relay_done(), name="tidegate-queue-done")

    async def _relay_done(self) -> None:
        """Relay finished jobs from the done channel to the waiters, for as long as the queue is
        open: a lost connection (a Redis restart) is retried with backoff, and each time the
        subscription stands again every waiter re-reads its job, since what was announced while
        the connection was down never arrives."""
        assert self._client is not None
        await self._client.follow(self._done_channel, self._done_outage, running=lambda: self.is_open,
                                  on_message=self._relay_finished, on_subscribed=self._finishes.wake_all)

    def _relay_finished(self, message: bytes) -> None:
        """One job-done message (see announce() in lua/_common.lua) to the waiters of its jobs."""
        if not self._finishes:
            return
        try:
            entries = msgpack.unpackb(message, raw=True)
        except (ValueError, msgpack.UnpackException):
            entries = None
        if not isinstance(entries, list):
            # Not this version's message (a process of another version shares the queue): every
            # waiter reads its job rather than miss a finish.
            self._finishes.wake_all()
            return
        for entry in entries:
            if isinstance(entry, bytes):
                self._finishes.touch((entry.decode(),))
                continue
            job_id, record, result = entry[0].decode(), entry[1], entry[2]
            if self._finishes.waits_for(job_id):
                self._finishes.hand_record(job_id, msgpack.unpackb(record), result)

    async def _stats(self) -> QueueStats:
        snapshot = [int(value) for value in await self._call("stats")]
        now, levels = snapshot[0], {}
        for level in LEVELS:
            depth, oldest_ready_ms, leased = snapshot[4 + level * 3: 7 + level * 3]
            levels[Priority(level)] = LevelStats(
                depth=depth,
                oldest_wait_s=0.0 if oldest_ready_ms < 0 else max(now - oldest_ready_ms, 0) / 1000,
                in_flight=leased,
            )
        return QueueStats(levels=levels, delayed=snapshot[2], dead=snapshot[3], succeeded=snapshot[19])

    async def _dead_letters(self, limit: int, offset: int) -> list[Job]:
        return await self._read("dead", offset, limit)

    async def _redrive(self, ids: list[str] | None) -> int:
        if ids is not None:
            return int(await self._call("redrive", "ids", *ids)) if ids else 0
        total = 0
        while count := int(await self._call("redrive", "all", REDRIVE_BATCH)):
            total += count
        return total

    async def _purge_dead(self, ids: list[str] | None, older_than_ms: int | None) -> int:
        cutoff = ""
        if older_than_ms is not None:
            server_now = int((await self._call("stats"))[0])
            cutoff = str(server_now - older_than_ms)
        if ids is not None:
            return int(await self._call("purge_dead", cutoff, "ids", *ids)) if ids else 0
        total = 0
        while count := int(await self._call("purge_dead", cutoff, "all", REDRIVE_BATCH)):
            total += count
        return total

    async def _maintain(self) -> MaintenanceReport:
        counts = await self._call(
            "maintain",
            int(self.settings.finished_ttl_s * 1000),
            int(self.settings.dead_ttl_s * 1000),
            UPKEEP_BATCH,
            int(self.settings.answered_keep_s * 1000),
        )
        recovered, dead, expired, promoted, aged, purged = (int(c) for c in counts)
        return MaintenanceReport(
            ran=True, recovered=recovered, dead=dead, expired=expired,
            promoted=promoted, aged=aged, purged=purged,
        )

