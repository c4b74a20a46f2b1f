"""Embedded backend: one SQLite file in WAL mode, safe for several processes on one host.

Every state change is one `BEGIN IMMEDIATE` transaction, run on a dedicated thread so the event
loop never blocks on disk or on another process's write lock. Waiting claims and `wait()` are
woken through a `Doorbell` after commits, not by polling.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import sqlite3
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import orjson

from tidegate._formats import Migration, StoreFormat
from tidegate._sqlite import SqliteThread, reclaim_free_pages
from tidegate.errors import LeaseLost, QueueFull, QueueUnavailable
from tidegate.jobs import Job, JobState, Priority, now_ms
from tidegate.queue._handoff import WaitingClaim
from tidegate.queue._signals import DONE, WORK, Doorbell, Signal
from tidegate.queue.base import LevelStats, MaintenanceReport, NewJob, Queue, QueueStats
from tidegate.queue.settings import QueueSettings

T = TypeVar("T")

SAFETY_WAKE_S = 5.0  # longest a waiter sleeps without re-checking, should a ring be lost
MAX_ERRORS_KEPT = 20  # attempt history per job
UPKEEP_BATCH = 5_000  # rows one maintenance step touches, so a pass never holds the lock long
RECOVER_PER_CLAIM = 100  # expired leases one claim recovers; maintenance takes a larger backlog
_ACTIVE = ("queued", "delayed", "failed", "leased")

SQLITE_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,   -- server-assigned FIFO order, never reused
    id TEXT NOT NULL UNIQUE,
    priority INTEGER NOT NULL,               -- the job's own level
    level INTEGER NOT NULL,                  -- the level it waits at (aging may lift it)
    rr_round INTEGER NOT NULL DEFAULT 0,     -- tenant round-robin turn (0 when off)
    tenant TEXT NOT NULL,
    state TEXT NOT NULL,
    payload BLOB NOT NULL,
    result BLOB,
    created_ms INTEGER NOT NULL,
    ready_ms INTEGER,
    not_before_ms INTEGER,
    deadline_ms INTEGER,
    finished_ms INTEGER,
    attempts INTEGER NOT NULL DEFAULT 0,
    max_attempts INTEGER NOT NULL,
    lease_token INTEGER NOT NULL DEFAULT 0,
    worker_id TEXT,
    lease_expires_ms INTEGER,
    idempotency_key TEXT UNIQUE,
    callback_url TEXT,
    last_error TEXT,
    errors TEXT,
    failure BLOB,                            -- a dead job's structured failure (JSON), if given
    caller_waits INTEGER NOT NULL DEFAULT 0, -- 1: a caller waits for the answer (format 2)
    brief INTEGER NOT NULL DEFAULT 0         -- 1: kept answered_ttl_s once finished (format 2)
);
CREATE INDEX IF NOT EXISTS jobs_ready ON jobs(level, rr_round, seq) WHERE state = 'queued';
CREATE INDEX IF NOT EXISTS jobs_due ON jobs(not_before_ms) WHERE state IN ('delayed', 'failed');
CREATE INDEX IF NOT EXISTS jobs_leases ON jobs(lease_expires_ms) WHERE state = 'leased';
CREATE INDEX IF NOT EXISTS jobs_deadlines ON jobs(deadline_ms)
    WHERE deadline_ms IS NOT NULL AND state IN ('queued', 'delayed', 'failed');
CREATE INDEX IF NOT EXISTS jobs_finished ON jobs(finished_ms)
    WHERE state IN ('succeeded', 'cancelled', 'expired');
CREATE INDEX IF NOT EXISTS jobs_dead ON jobs(finished_ms) WHERE state = 'dead';
CREATE INDEX IF NOT EXISTS jobs_answered ON jobs(finished_ms)
    WHERE brief = 1 AND state IN ('succeeded', 'cancelled', 'expired');
CREATE TABLE IF NOT EXISTS tenant_turns (
    level INTEGER NOT NULL,
    tenant TEXT NOT NULL,
    last_round INTEGER NOT NULL,
    PRIMARY KEY (level, tenant)
);
CREATE TABLE IF NOT EXISTS level_turns (
    level INTEGER PRIMARY KEY,
    current_round INTEGER NOT NULL
);
"""

_JOB_COLUMNS = (
    "id, priority, tenant, state, payload, result, created_ms, ready_ms, not_before_ms, "
    "deadline_ms, finished_ms, attempts, max_attempts, lease_token, worker_id, lease_expires_ms, "
    "idempotency_key, callback_url, last_error, errors, failure, level, rr_round, seq, caller_waits"
)
# Columns added before versions were recorded, with their definitions: a file made before gets
# them with its migration to format 1 (CREATE TABLE IF NOT EXISTS leaves an existing table as it is).
_ADDED_COLUMNS = (("failure", "BLOB"),)


def _add_missing_columns(conn: sqlite3.Connection) -> None:
    present = {row[1] for row in conn.execute("PRAGMA table_info(jobs)")}
    for name, kind in _ADDED_COLUMNS:
        if name not in present:
            conn.execute(f"ALTER TABLE jobs ADD COLUMN {name} {kind}")


def _add_answer_columns(conn: sqlite3.Connection) -> None:
    """Format 2: whether a caller waits for a job, and whether it is kept only briefly once
    answered. Both default to 0, which is what every job written before was (and what 0.1.0's
    INSERTs, which name their columns, still write during a rolling upgrade)."""
    present = {row[1] for row in conn.execute("PRAGMA table_info(jobs)")}
    for name in ("caller_waits", "brief"):
        if name not in present:
            conn.execute(f"ALTER TABLE jobs ADD COLUMN {name} INTEGER NOT NULL DEFAULT 0")


# The queue's tables' format (see tidegate._formats). Format 1 is 0.1.0's layout, now recorded.
SQLITE_FORMAT = StoreFormat("queue", 2, (
    Migration(1, "record the queue's format (0.1.0's layout; a file older than 0.1.0 gets the "
                 "jobs' failure column)", _add_missing_columns),
    Migration(2, "jobs say whether a caller waits for them and whether they are kept only "
                 "answered_ttl_s once answered (two columns, 0 for every job so far)", _add_answer_columns),
))


class SqliteQueue(Queue):
    """The embedded default: `Queue.from_url("sqlite:///path/tidegate.db")`."""

    def __init__(self, path: str, settings: QueueSettings | None = None) -> None:
        super().__init__(settings)
        self.path = path
        self._db = SqliteThread(
            path, SQLITE_SCHEMA, row_factory=sqlite3.Row,
            error=lambda exc: QueueUnavailable(f"SQLite queue at {path}: {exc}"), on_loop=True,
            fmt=SQLITE_FORMAT,
        )
        self._bell = Doorbell(path)
        self._watcher: asyncio.Task[None] | None = None
        self._quiet: dict[tuple[int, ...], _Quiet] = {}  # levels → what their last empty claim saw

    # ------------------------------------------------------------------ plumbing

    async def _run(self, fn: Callable[[sqlite3.Connection], T], *, on_thread: bool = False) -> T:
        return await self._db.run(fn, on_thread=on_thread)

    async def _write(self, body: Callable[[sqlite3.Connection], T], *, on_thread: bool = False) -> T:
        return await self._db.write(body, on_thread=on_thread)

    async def _open(self) -> None:
        await self._db.open()  # checks the queue's format, and migrates it

    async def _close(self) -> None:
        if self._watcher is not None:
            self._watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watcher
        self._bell.close()
        await self._db.close()

    # ------------------------------------------------------------------ tenant round-robin

    def _give_turns(self, conn: sqlite3.Connection, rows: Iterable[tuple[str, int, str]]) -> None:
        """Give each (id, level, tenant) that just became queued its round-robin turn: one past
        the tenant's last turn at that level, and never behind the level's current turn."""
        if not self.settings.tenant_round_robin:
            return
        for job_id, level, tenant in rows:
            current = conn.execute(
                "SELECT current_round FROM level_turns WHERE level = ?", (level,)
            ).fetchone()
            last = conn.execute(
                "SELECT last_round FROM tenant_turns WHERE level = ? AND tenant = ?", (level, tenant)
            ).fetchone()
            turn = max(current[0] if current else 0, (last[0] + 1) if last else 0)
            conn.execute(
                "INSERT INTO tenant_turns(level, tenant, last_round) VALUES (?, ?, ?) "
                "ON CONFLICT(level, tenant) DO UPDATE SET last_round = excluded.last_round",
                (level, tenant, turn),
            )
            conn.execute("UPDATE jobs SET rr_round = ? WHERE id = ?", (turn, job_id))

    @staticmethod
    def _advance_turns(conn: sqlite3.Connection, claimed: Sequence[sqlite3.Row]) -> None:
        """After a claim: the level's current turn moves to the newest turn served, so a tenant
        that arrives later queues behind the turn being served; a tenant whose newest turn was
        served has nothing left waiting there, and its entry is dropped."""
        for level in {row["level"] for row in claimed}:
            turn = max(row["rr_round"] for row in claimed if row["level"] == level)
            conn.execute(
                "INSERT INTO level_turns(level, current_round) VALUES (?, ?) ON CONFLICT(level)"
                " DO UPDATE SET current_round = MAX(current_round, excluded.current_round)",
                (level, turn),
            )
        conn.executemany(
            "DELETE FROM tenant_turns WHERE level = ? AND tenant = ? AND last_round = ?",
            [(row["level"], row["tenant"], row["rr_round"]) for row in claimed],
        )

    # ------------------------------------------------------------------ enqueue

    hands_off = True

    async def _enqueue(self, jobs: Sequence[NewJob]) -> list[str]:
        ids, _ = await self._enqueue_handing(jobs, {})
        return ids

    async def _enqueue_handing(
        self, jobs: Sequence[NewJob], offers: Mapping[str, WaitingClaim],
    ) -> tuple[list[str], list[Job]]:
        def body(conn: sqlite3.Connection) -> tuple[list[str], list[Job], bool]:
            ids, new = self._dedupe(conn, jobs)
            self._admit(conn, new)
            now = now_ms()
            handed = [job for job in (self._hand(conn, job, offers.get(job.id), now) for job in new)
                      if job is not None]
            if handed:
                kept = {job.id for job in handed}
                new = [job for job in new if job.id not in kept]
            conn.executemany(
                "INSERT INTO jobs(id, priority, level, tenant, state, payload, created_ms, ready_ms,"
                " not_before_ms, deadline_ms, max_attempts, idempotency_key, callback_url,"
                " caller_waits, brief) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [
                    (
                        job.id, job.priority, job.priority, job.tenant,
                        "delayed" if job.not_before_ms else "queued", job.payload, job.created_ms,
                        None if job.not_before_ms else now, job.not_before_ms, job.deadline_ms,
                        job.max_attempts, job.idempotency_key, job.callback_url,
                        int(job.caller_waits), int(job.brief),
                    )
                    for job in new
                ],
            )
            self._give_turns(conn, ((j.id, j.priority, j.tenant) for j in new if not j.not_before_ms))
            return ids, handed, any(not job.not_before_ms for job in new)

        ids, handed, ready = await self._write(body)
        if ready:
            self._bell.ring(WORK)
        if any(job.not_before_ms for job in jobs):
            self._quiet.clear()  # a delayed job brings its due time forward, without a ring
        return ids, handed

    @staticmethod
    def _hand(conn: sqlite3.Connection, job: NewJob, offer: WaitingClaim | None, now: int) -> Job | None:
        """Write `job` leased to the claim `offer` names, as a claim would lease it, if nothing a
        claim of those levels would take first waits (queued, due, or its lease run out); None
        (and nothing written) otherwise."""
        if offer is None or (job.deadline_ms is not None and job.deadline_ms <= now):
            return None
        marks = ",".join("?" * len(offer.levels))
        ahead = conn.execute(
            f"SELECT 1 FROM jobs WHERE level IN ({marks}) AND level <= ? AND (state = 'queued'"
            " OR (state IN ('delayed', 'failed') AND not_before_ms <= ?)"
            " OR (state = 'leased' AND lease_expires_ms <= ?)) LIMIT 1",
            (*offer.levels, job.priority, now, now),
        ).fetchone()
        if ahead is not None:
            return None
        row = conn.execute(
            "INSERT INTO jobs(id, priority, level, tenant, state, payload, created_ms, ready_ms,"
            " deadline_ms, max_attempts, idempotency_key, callback_url, attempts, lease_token,"
            " worker_id, lease_expires_ms, caller_waits, brief)"
            " VALUES (?, ?, ?, ?, 'leased', ?, ?, ?, ?, ?, ?, ?, 1, 1, ?, ?, ?, ?)"
            f" RETURNING {_JOB_COLUMNS}",
            (job.id, job.priority, job.priority, job.tenant, job.payload, job.created_ms, now,
             job.deadline_ms, job.max_attempts, job.idempotency_key, job.callback_url,
             offer.worker_id, now + offer.lease_ms, int(job.caller_waits), int(job.brief)),
        ).fetchone()
        return _job(row)

    @staticmethod
    def _dedupe(conn: sqlite3.Connection, jobs: Sequence[NewJob]) -> tuple[list[str], list[NewJob]]:
        """Resolve idempotency keys: a known key (stored, or earlier in the batch) maps to its
        first job's id; returns the id for every job and the jobs to insert."""
        known = _known_keys(conn, [job.idempotency_key for job in jobs if job.idempotency_key is not None])
        ids: list[str] = []
        new: list[NewJob] = []
        for job in jobs:
            key = job.idempotency_key
            if key is not None and key in known:
                ids.append(known[key])
                continue
            if key is not None:
                known[key] = job.id
            ids.append(job.id)
            new.append(job)
        return ids, new

    def _admit(self, conn: sqlite3.Connection, jobs: Sequence[NewJob]) -> None:
        """Admission control: refuse the whole batch if any level would pass its max depth."""
        limits = self.settings.max_depth
        if not limits:
            return
        adding: dict[int, int] = {}
        for job in jobs:
            if job.priority in limits:
                adding[job.priority] = adding.get(job.priority, 0) + 1
        for level, count in sorted(adding.items()):
            depth = conn.execute(
                "SELECT COUNT(*) FROM jobs WHERE state = 'queued' AND level = ?", (level,)
            ).fetchone()[0]
            if depth + count > limits[level]:
                raise QueueFull(
                    f"priority {Priority(level).name.lower()} is full: {depth} waiting, "
                    f"limit {limits[level]}",
                    priority=level,
                    retry_after_s=self.settings.queue_full_retry_after_s,
                )

    # ------------------------------------------------------------------ claim

    def _work_marker(self) -> object:
        return self._bell.work.marker()

    async def _claim(self, worker_id: str, levels: tuple[int, ...], limit: int, lease_ms: int,
                     marker: object) -> list[Job]:
        if self._still_quiet(levels) is not None:
            return []  # nothing can have become claimable since the last claim found nothing
        assert isinstance(marker, asyncio.Event)  # the work signal's, taken just before this claim
        jobs = await self._claim_now(worker_id, levels, limit, lease_ms)
        if jobs:
            self._quiet.pop(levels, None)
        else:
            self._quiet[levels] = _Quiet(marker, until_ms=now_ms() + int(SAFETY_WAKE_S * 1000))
        return jobs

    def _still_quiet(self, levels: tuple[int, ...]) -> _Quiet | None:
        """What the last empty claim of these levels saw, while it still holds."""
        quiet = self._quiet.get(levels)
        return quiet if quiet is not None and quiet.holds(now_ms()) else None

    async def _claim_now(
        self, worker_id: str, levels: tuple[int, ...], limit: int, lease_ms: int,
    ) -> list[Job]:
        marks = ",".join("?" * len(levels))

        def body(conn: sqlite3.Connection) -> tuple[list[Job], MaintenanceReport]:
            now = now_ms()
            # Expired leases first, in this same transaction: recovery must not wait for a
            # maintenance pass, nor for a process that lives long enough to run one.
            report = MaintenanceReport(ran=True)
            self._recover_leases(conn, now, report, RECOVER_PER_CLAIM)
            self._promote_due(conn, now)
            report.expired = self._expire_overdue(conn, now)
            rows = conn.execute(
                f"UPDATE jobs SET state = 'leased', attempts = attempts + 1,"
                f" lease_token = lease_token + 1, worker_id = ?, lease_expires_ms = ?"
                f" WHERE seq IN (SELECT seq FROM jobs WHERE state = 'queued' AND level IN ({marks})"
                f" ORDER BY level, rr_round, seq LIMIT ?)"
                f" RETURNING {_JOB_COLUMNS}",
                (worker_id, now + lease_ms, *levels, limit),
            ).fetchall()
            rows.sort(key=lambda row: (row["level"], row["rr_round"], row["seq"]))
            if rows and self.settings.tenant_round_robin:
                self._advance_turns(conn, rows)
            return [_job(row) for row in rows], report

        jobs, report = await self._write(body)
        if report.expired or report.dead:
            self._bell.ring(DONE)
        if report.recovered > len(jobs):
            self._bell.ring(WORK)  # recovered more than this claim took: others may serve it
        return jobs

    def _promote_due(self, conn: sqlite3.Connection, now: int) -> int:
        rows = conn.execute(
            "UPDATE jobs SET state = 'queued', ready_ms = ?, level = priority"
            " WHERE state IN ('delayed', 'failed') AND not_before_ms <= ?"
            " RETURNING id, level, tenant",
            (now, now),
        ).fetchall()
        self._give_turns(conn, ((r[0], r[1], r[2]) for r in rows))
        return len(rows)

    @staticmethod
    def _expire_overdue(conn: sqlite3.Connection, now: int) -> int:
        return conn.execute(
            "UPDATE jobs SET state = 'expired', finished_ms = ?, last_error = 'deadline passed'"
            " WHERE deadline_ms <= ? AND deadline_ms IS NOT NULL"
            " AND state IN ('queued', 'delayed', 'failed')",
            (now, now),
        ).rowcount

    async def _wait_for_work(self, levels: tuple[int, ...], timeout_s: float, marker: object) -> None:
        self._bell.listen()

        def next_due(conn: sqlite3.Connection) -> int | None:
            # When work may appear without a ring: a delayed job comes due, or a lease expires
            # (the next claim recovers it).
            row = conn.execute(
                "SELECT MIN(due) FROM ("
                " SELECT MIN(not_before_ms) AS due FROM jobs WHERE state IN ('delayed', 'failed')"
                " UNION ALL SELECT MIN(lease_expires_ms) FROM jobs WHERE state = 'leased')"
            ).fetchone()
            return None if row[0] is None else int(row[0])

        quiet = self._still_quiet(levels)
        if quiet is not None:
            if not quiet.due_known:
                quiet.due(await self._run(next_due))
            due_ms = quiet.due_ms
        else:
            due_ms = await self._run(next_due)
        sleep_s = min(timeout_s, SAFETY_WAKE_S)
        if due_ms is not None:
            sleep_s = min(sleep_s, max((due_ms - now_ms()) / 1000, 0.0))
        await Signal.wait(marker, sleep_s)

    # ------------------------------------------------------------------ leased job changes

    @staticmethod
    def _leased(conn: sqlite3.Connection, job_id: str, token: int, columns: str) -> sqlite3.Row:
        row = conn.execute(
            f"SELECT {columns} FROM jobs WHERE id = ? AND state = 'leased' AND lease_token = ?",
            (job_id, token),
        ).fetchone()
        if row is None:
            raise _lease_lost(conn, job_id, token)
        assert isinstance(row, sqlite3.Row)
        return row

    async def _heartbeat(self, job_id: str, token: int, lease_ms: int) -> int:
        def body(conn: sqlite3.Connection) -> int:
            expires = now_ms() + lease_ms
            changed = conn.execute(
                "UPDATE jobs SET lease_expires_ms = ? WHERE id = ? AND state = 'leased' AND lease_token = ?",
                (expires, job_id, token),
            ).rowcount
            if not changed:
                raise _lease_lost(conn, job_id, token)
            return expires

        return await self._write(body)

    async def _complete(self, job_id: str, token: int, result: bytes) -> None:
        lost = await self._complete_many([(job_id, token, result)])
        if lost:
            raise LeaseLost(lost[0])

    async def _complete_many(self, items: Sequence[tuple[str, int, bytes]]) -> list[str]:
        def body(conn: sqlite3.Connection) -> tuple[list[Job], list[str]]:
            now, done, lost = now_ms(), [], []
            for job_id, token, result in items:
                row = conn.execute(
                    "UPDATE jobs SET state = 'succeeded', result = ?, finished_ms = ?,"
                    " worker_id = NULL, lease_expires_ms = NULL"
                    f" WHERE id = ? AND state = 'leased' AND lease_token = ? RETURNING {_JOB_COLUMNS}",
                    (result, now, job_id, token),
                ).fetchone()
                if row is None:
                    lost.append(str(_lease_lost(conn, job_id, token)))
                else:
                    done.append(_job(row))
            return done, lost

        done, lost = await self._write(body)
        self._finished(done)
        return lost

    async def _fail(
        self, job_id: str, token: int, error: str, retry_delay_ms: int | None, failure: bytes | None
    ) -> JobState:
        def body(conn: sqlite3.Connection) -> JobState:
            row = self._leased(conn, job_id, token, "attempts, max_attempts, errors")
            now = now_ms()
            errors = _append_error(row["errors"], error)
            if retry_delay_ms is None or row["attempts"] >= row["max_attempts"]:
                conn.execute(
                    "UPDATE jobs SET state = 'dead', finished_ms = ?, last_error = ?, errors = ?,"
                    " failure = ?, worker_id = NULL, lease_expires_ms = NULL WHERE id = ?",
                    (now, error, errors, failure, job_id),
                )
                return JobState.DEAD
            conn.execute(
                "UPDATE jobs SET state = 'failed', not_before_ms = ?, last_error = ?, errors = ?,"
                " worker_id = NULL, lease_expires_ms = NULL, level = priority WHERE id = ?",
                (now + retry_delay_ms, error, errors, job_id),
            )
            return JobState.FAILED

        state = await self._write(body)
        self._bell.ring(DONE if state is JobState.DEAD else WORK)
        return state

    async def _release(self, job_id: str, token: int, delay_ms: int, reason: str | None) -> None:
        def body(conn: sqlite3.Connection) -> None:
            row = self._leased(conn, job_id, token, "priority, tenant")
            now = now_ms()
            if delay_ms > 0:
                conn.execute(
                    "UPDATE jobs SET state = 'delayed', attempts = attempts - 1, level = priority,"
                    " not_before_ms = ?, worker_id = NULL, lease_expires_ms = NULL,"
                    " last_error = COALESCE(?, last_error) WHERE id = ?",
                    (now + delay_ms, reason, job_id),
                )
                return
            conn.execute(
                "UPDATE jobs SET state = 'queued', attempts = attempts - 1, level = priority,"
                " ready_ms = ?, worker_id = NULL, lease_expires_ms = NULL,"
                " last_error = COALESCE(?, last_error) WHERE id = ?",
                (now, reason, job_id),
            )
            self._give_turns(conn, [(job_id, row["priority"], row["tenant"])])

        await self._write(body)
        self._bell.ring(WORK)

    # ------------------------------------------------------------------ inspect and manage

    async def _get(self, job_id: str) -> Job | None:
        def body(conn: sqlite3.Connection) -> Job | None:
            row = conn.execute(f"SELECT {_JOB_COLUMNS} FROM jobs WHERE id = ?", (job_id,)).fetchone()
            return None if row is None else _job(row)

        return await self._run(body)

    async def _idempotent_ids(self, keys: list[str]) -> dict[str, str]:
        return await self._run(lambda conn: _known_keys(conn, keys))

    async def _cancel(self, job_id: str) -> bool:
        marks = ",".join("?" * len(_ACTIVE))

        def body(conn: sqlite3.Connection) -> bool:
            return bool(conn.execute(
                f"UPDATE jobs SET state = 'cancelled', finished_ms = ?, worker_id = NULL,"
                f" lease_expires_ms = NULL WHERE id = ? AND state IN ({marks})",
                (now_ms(), job_id, *_ACTIVE),
            ).rowcount)

        cancelled = await self._write(body)
        if cancelled:
            self._bell.ring(DONE)
        return cancelled

    async def _forget(self, job_id: str) -> bool:
        marks = ",".join("?" * len(_ACTIVE))

        def body(conn: sqlite3.Connection) -> bool:
            return bool(conn.execute(f"DELETE FROM jobs WHERE id = ? AND state NOT IN ({marks})",
                                     (job_id, *_ACTIVE)).rowcount)

        return await self._write(body)

    async def _caller_gave_up(self, job_id: str) -> bool:
        def body(conn: sqlite3.Connection) -> bool:
            return bool(conn.execute(
                "UPDATE jobs SET caller_waits = 0, brief = 0 WHERE id = ? AND caller_waits = 1",
                (job_id,)).rowcount)

        return await self._write(body)

    def _finished(self, jobs: Sequence[Job]) -> None:
        """Jobs this instance just brought to a final state: their waiters here get them as they
        are (no read-back), and every other instance is rung."""
        if not jobs:
            return
        for job in jobs:
            self._finishes.hand(job)
        self._bell.ring(DONE, here=False)

    async def _wait_final(self, job_id: str, timeout_s: float) -> Job | None:
        self._bell.listen()
        # Watched since before this instance wrote it (the watcher's first look covers a finish
        # rung before the bell listened): nothing to read before waiting.
        waiter = self._finishes.take_expected(job_id)
        read_first = waiter is None
        if waiter is None:
            waiter = self._finishes.watch(job_id)
        if self._watcher is None or self._watcher.done():
            self._watcher = asyncio.create_task(self._watch_finishes())
        try:
            if read_first:
                job = await self._get(job_id)
                if job is None or job.is_final:
                    return job
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout_s):
                    handed = await asyncio.shield(waiter.future)
                    if handed is not None:
                        return handed
            return await self._get(job_id)
        finally:
            self._finishes.forget(waiter)

    async def _watch_finishes(self) -> None:
        """One watcher per queue instance: on each finish signal it asks, in one query, which
        watched jobs are final — so a thousand waiters cost one read per finish, not a thousand."""
        while self._finishes:
            marker = self._bell.done.marker()
            self._finishes.touch(await self._run(functools.partial(_final_ids, ids=self._finishes.ids())))
            await Signal.wait(marker, SAFETY_WAKE_S)

    async def _stats(self) -> QueueStats:
        def body(conn: sqlite3.Connection) -> QueueStats:
            now = now_ms()
            waiting = {
                row[0]: (row[1], row[2])
                for row in conn.execute(
                    "SELECT level, COUNT(*), MIN(ready_ms) FROM jobs WHERE state = 'queued' GROUP BY level"
                )
            }
            # In flight counts by the job's own priority: aging only changes where a job waits.
            leased = dict(conn.execute(
                "SELECT priority, COUNT(*) FROM jobs WHERE state = 'leased' GROUP BY priority"
            ).fetchall())
            delayed = conn.execute(
                "SELECT COUNT(*) FROM jobs WHERE state IN ('delayed', 'failed')"
            ).fetchone()[0]
            dead = conn.execute("SELECT COUNT(*) FROM jobs WHERE state = 'dead'").fetchone()[0]
            succeeded = conn.execute("SELECT COUNT(*) FROM jobs WHERE state = 'succeeded'").fetchone()[0]
            levels = {}
            for priority in Priority:
                depth, oldest = waiting.get(int(priority), (0, None))
                levels[priority] = LevelStats(
                    depth=depth,
                    oldest_wait_s=0.0 if oldest is None else max(now - oldest, 0) / 1000,
                    in_flight=leased.get(int(priority), 0),
                )
            return QueueStats(levels=levels, delayed=delayed, dead=dead, succeeded=succeeded)

        return await self._run(body, on_thread=True)  # counts over the whole table

    async def _dead_letters(self, limit: int, offset: int) -> list[Job]:
        def body(conn: sqlite3.Connection) -> list[Job]:
            rows = conn.execute(
                f"SELECT {_JOB_COLUMNS} FROM jobs WHERE state = 'dead'"
                " ORDER BY finished_ms DESC, seq DESC LIMIT ? OFFSET ?",
                (limit, offset),
            ).fetchall()
            return [_job(row) for row in rows]

        return await self._run(body, on_thread=True)

    async def _redrive(self, ids: list[str] | None) -> int:
        def body(conn: sqlite3.Connection) -> int:
            now = now_ms()
            sql = (
                "UPDATE jobs SET state = 'queued', attempts = 0, level = priority, ready_ms = ?,"
                " finished_ms = NULL, not_before_ms = NULL, failure = NULL,"
                # Its caller, if one waited, was answered with the failure long ago.
                " caller_waits = 0, brief = 0 WHERE state = 'dead'"
            )
            rows: list[sqlite3.Row] = []
            if ids is None:
                rows = conn.execute(sql + " RETURNING id, level, tenant", (now,)).fetchall()
            else:
                for start in range(0, len(ids), 500):
                    chunk = ids[start:start + 500]
                    marks = ",".join("?" * len(chunk))
                    rows += conn.execute(
                        sql + f" AND id IN ({marks}) RETURNING id, level, tenant", (now, *chunk)
                    ).fetchall()
            self._give_turns(conn, ((r[0], r[1], r[2]) for r in rows))
            return len(rows)

        count = await self._write(body, on_thread=True)  # any number of rows
        if count:
            self._bell.ring(WORK)
        return count

    async def _purge_dead(self, ids: list[str] | None, older_than_ms: int | None) -> int:
        def body(conn: sqlite3.Connection) -> int:
            sql = "DELETE FROM jobs WHERE state = 'dead'"
            params: list[Any] = []
            if older_than_ms is not None:
                sql += " AND finished_ms <= ?"
                params.append(now_ms() - older_than_ms)
            if ids is None:
                return conn.execute(sql, params).rowcount
            removed = 0
            for start in range(0, len(ids), 500):
                chunk = ids[start:start + 500]
                marks = ",".join("?" * len(chunk))
                removed += conn.execute(sql + f" AND id IN ({marks})", [*params, *chunk]).rowcount
            return removed

        return await self._write(body, on_thread=True)

    # ------------------------------------------------------------------ upkeep

    async def _maintain(self) -> MaintenanceReport:
        # The write lock of one IMMEDIATE transaction is what keeps upkeep to one process at a time.
        report = await self._write(self._upkeep, on_thread=True)
        # Apart from the upkeep's transaction (it runs in one of its own), and after it: what
        # retention just freed is given back to the file system beyond a slack for new jobs.
        reclaimed = await self._run(reclaim_free_pages, on_thread=True)
        if reclaimed:
            report.extra["reclaimed_pages"] = reclaimed
        if report.recovered or report.promoted or report.aged:
            self._bell.ring(WORK)
        if report.dead or report.expired:
            self._bell.ring(DONE)
        return report

    def _upkeep(self, conn: sqlite3.Connection) -> MaintenanceReport:
        now = now_ms()
        report = MaintenanceReport(ran=True)
        self._recover_leases(conn, now, report)
        report.promoted = self._promote_due(conn, now)
        report.expired = self._expire_overdue(conn, now)
        report.aged = self._age(conn, now)
        report.purged = self._apply_retention(conn, now)
        return report

    def _recover_leases(
        self, conn: sqlite3.Connection, now: int, report: MaintenanceReport, limit: int = UPKEEP_BATCH
    ) -> None:
        """Up to `limit` expired leases back to their line at the job's own priority (or dead
        without attempts left). The lease token stays: the next claim raises it, so the old
        holder's complete or fail is refused."""
        rows = conn.execute(
            "SELECT id, priority, tenant, attempts, max_attempts, worker_id, errors FROM jobs"
            " WHERE state = 'leased' AND lease_expires_ms <= ? ORDER BY lease_expires_ms LIMIT ?",
            (now, limit),
        ).fetchall()
        requeued = []
        for row in rows:
            error = f"lease expired: worker {row['worker_id']} stopped renewing it"
            errors = _append_error(row["errors"], error)
            if row["attempts"] >= row["max_attempts"]:
                conn.execute(
                    "UPDATE jobs SET state = 'dead', finished_ms = ?, last_error = ?, errors = ?,"
                    " worker_id = NULL, lease_expires_ms = NULL WHERE id = ?",
                    (now, error, errors, row["id"]),
                )
                report.dead += 1
            else:
                conn.execute(
                    "UPDATE jobs SET state = 'queued', level = priority, ready_ms = ?, last_error = ?,"
                    " errors = ?, worker_id = NULL, lease_expires_ms = NULL WHERE id = ?",
                    (now, error, errors, row["id"]),
                )
                requeued.append((row["id"], row["priority"], row["tenant"]))
        self._give_turns(conn, requeued)
        report.recovered += len(requeued)

    def _age(self, conn: sqlite3.Connection, now: int) -> int:
        interval_s = self.settings.aging_interval_s
        if interval_s is None:
            return 0
        interval_ms = max(int(interval_s * 1000), 1)
        # The level a job deserves follows from how long it has waited, so aging is idempotent
        # and never lifts a job above CRITICAL.
        return conn.execute(
            "UPDATE jobs SET level = MAX(0, priority - (? - ready_ms) / ?)"
            " WHERE state = 'queued' AND level > 0 AND ready_ms <= ?"
            " AND level > MAX(0, priority - (? - ready_ms) / ?)",
            (now, interval_ms, now - interval_ms, now, interval_ms),
        ).rowcount

    def _apply_retention(self, conn: sqlite3.Connection, now: int) -> int:
        finished_before = now - int(self.settings.finished_ttl_s * 1000)
        answered_before = now - int(self.settings.answered_keep_s * 1000)
        dead_before = now - int(self.settings.dead_ttl_s * 1000)
        purged = conn.execute(
            "DELETE FROM jobs WHERE seq IN (SELECT seq FROM jobs WHERE brief = 1 AND state IN"
            " ('succeeded', 'cancelled', 'expired') AND finished_ms <= ? LIMIT ?)",
            (answered_before, UPKEEP_BATCH),
        ).rowcount
        purged += conn.execute(
            "DELETE FROM jobs WHERE seq IN (SELECT seq FROM jobs WHERE state IN"
            " ('succeeded', 'cancelled', 'expired') AND finished_ms <= ? LIMIT ?)",
            (finished_before, UPKEEP_BATCH),
        ).rowcount
        purged += conn.execute(
            "DELETE FROM jobs WHERE seq IN (SELECT seq FROM jobs WHERE state = 'dead'"
            " AND finished_ms <= ? LIMIT ?)",
            (dead_before, UPKEEP_BATCH),
        ).rowcount
        # A tenant whose last turn is behind its level's current turn gains nothing from its row,
        # and on a level with nobody waiting no row matters (cancelled or expired newest jobs).
        conn.execute(
            "DELETE FROM tenant_turns WHERE last_round < COALESCE((SELECT current_round FROM"
            " level_turns WHERE level_turns.level = tenant_turns.level), 0)"
            " OR NOT EXISTS (SELECT 1 FROM jobs WHERE state = 'queued'"
            " AND jobs.level = tenant_turns.level)"
        )
        return purged


# ---------------------------------------------------------------------- row helpers


def _known_keys(conn: sqlite3.Connection, keys: Sequence[str]) -> dict[str, str]:
    """idempotency key → id of the job that holds it, for the keys stored (500 bound parameters
    a query, well under SQLite's limit)."""
    known: dict[str, str] = {}
    for start in range(0, len(keys), 500):
        chunk = keys[start:start + 500]
        marks = ",".join("?" * len(chunk))
        known.update(conn.execute(
            f"SELECT idempotency_key, id FROM jobs WHERE idempotency_key IN ({marks})", chunk))
    return known

@dataclass(slots=True)
class _Quiet:
    """What a claim that found nothing saw: the work signal's marker taken before it, and when
    work may appear without a ring (a delayed job comes due, a lease runs out; at the latest a
    safety interval later, should a ring from another process be lost). Until the marker is set or
    that time comes, another claim of the same levels would find nothing either, and neither the
    claim nor the read of the next due time needs the database: with work handed to waiting
    claims (queue/_handoff.py) this is the common case of a worker in `tidegate up`."""

    marker: asyncio.Event
    until_ms: int
    due_known: bool = False
    due_ms: int | None = None

    def holds(self, now: int) -> bool:
        """Whether nothing can have become claimable yet."""
        return not self.marker.is_set() and now < self.until_ms

    def due(self, due_ms: int | None) -> None:
        """The next due time, as read: it shortens how long this holds."""
        self.due_known, self.due_ms = True, due_ms
        if due_ms is not None:
            self.until_ms = min(self.until_ms, due_ms)


def _job(row: sqlite3.Row) -> Job:
    record = dict(row)
    record["errors"] = orjson.loads(row["errors"]) if row["errors"] else []
    return Job.from_record(record, row["payload"], row["result"])


def _final_ids(conn: sqlite3.Connection, ids: list[str]) -> list[str]:
    """Which of these jobs are in a final state."""
    done: list[str] = []
    for start in range(0, len(ids), 500):
        chunk = ids[start:start + 500]
        marks = ",".join("?" * len(chunk))
        done += [row[0] for row in conn.execute(
            f"SELECT id FROM jobs WHERE id IN ({marks}) AND state IN"
            " ('succeeded', 'dead', 'cancelled', 'expired')", chunk)]
    return done


def _append_error(errors_json: str | None, error: str) -> str:
    errors: list[str] = orjson.loads(errors_json) if errors_json else []
    errors.append(error)
    return orjson.dumps(errors[-MAX_ERRORS_KEPT:]).decode()


def _lease_lost(conn: sqlite3.Connection, job_id: str, token: int) -> LeaseLost:
    row = conn.execute("SELECT state, lease_token FROM jobs WHERE id = ?", (job_id,)).fetchone()
    if row is None:
        return LeaseLost(f"job {job_id} no longer exists")
    return LeaseLost(
        f"lease {token} on job {job_id} is stale: the job is {row['state']} "
        f"with lease {row['lease_token']}"
    )
