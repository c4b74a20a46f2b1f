"""The queue demo behind `make demo` and `tidegate demo`.

It enqueues a shuffled, mixed-priority batch from a few tenants in one `enqueue_many` call, drains
it with concurrent workers, fails some attempts on purpose (retries, and a few dead letters), and
adds critical jobs half way through to show that they go straight to the front. It uses only the
public queue API and measures waits itself, so what it prints is what any client would see.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from rich import box
from rich.console import Console
from rich.table import Table

from tidegate.errors import ConfigError
from tidegate.jobs import Job, JobSpec, JobState, Priority
from tidegate.queue import Queue, QueueSettings

__all__ = ["DEFAULT_DEMO_URL", "DemoSummary", "LevelRow", "ServedJob", "ensure_sqlite_folder",
           "render_summary", "run_demo"]

DEFAULT_DEMO_PATH = Path(".tidegate") / "demo.db"
DEFAULT_DEMO_URL = f"sqlite:///{DEFAULT_DEMO_PATH}"
DEFAULT_JOBS = 2_000

# Share of the batch per level, in percent: little urgent work, a long tail of background work.
MIX: dict[Priority, int] = {
    Priority.CRITICAL: 3,
    Priority.HIGH: 12,
    Priority.NORMAL: 25,
    Priority.LOW: 30,
    Priority.BULK: 30,
}
TENANTS = ("acme", "globex", "initech", "umbrella")
WORKERS = 4
CLAIM_LIMIT = 16
WORK_S = 0.001  # the "work" of one job; the demo is about ordering, not about the work
FLAKY_RATE = 0.02  # these fail their first attempt and succeed on the retry
POISON_RATE = 0.003  # these fail every attempt and end in the dead-letter queue
POISON_MAX_ATTEMPTS = 2
RETRY_IN_S = 0.05
DRAIN_TIMEOUT_S = 120.0  # a stalled drain is a bug; say so instead of hanging


@dataclass(frozen=True, slots=True)
class ServedJob:
    """One demo job as the workers saw it."""

    n: int  # the demo's own sequence number, carried in the payload
    priority: Priority
    late: bool  # enqueued half way through the drain rather than in the first batch
    position: int  # index of its first claim in the order jobs were served (0 = first)
    wait_ms: float  # from the enqueue call to its first claim
    attempts: int
    state: JobState  # succeeded or dead


@dataclass(frozen=True, slots=True)
class LevelRow:
    """The summary of one priority level (late critical jobs get a row of their own)."""

    label: str
    priority: Priority
    late: bool
    count: int
    first_position: int
    last_position: int
    wait_p50_ms: float
    wait_p99_ms: float
    retries: int
    dead: int


@dataclass(frozen=True, slots=True)
class DemoSummary:
    """What a demo run measured; `served` is in the order the jobs were first claimed."""

    url: str
    workers: int
    enqueue_ms: float  # the first batch's single enqueue_many call
    elapsed_s: float  # from the first claim to the last job settled
    served: tuple[ServedJob, ...]
    rows: tuple[LevelRow, ...]

    @property
    def jobs(self) -> int:
        """Jobs settled (succeeded or dead), late ones included."""
        return len(self.served)

    @property
    def throughput_per_s(self) -> float:
        """Jobs settled per second of draining."""
        return self.jobs / self.elapsed_s if self.elapsed_s > 0 else 0.0


# ---------------------------------------------------------------------- the run


async def run_demo(
    url: str | None = None,
    *,
    jobs: int = DEFAULT_JOBS,
    workers: int = WORKERS,
    seed: int = 7,
    progress: Callable[[str], None] | None = None,
) -> DemoSummary:
    """Run the demo on `url` (default: a fresh `.tidegate/demo.db`) and return what it measured.

    A queue given by URL must be empty: the demo never deletes data it did not create.
    """
    if jobs < 1 or workers < 1:
        raise ConfigError("the demo needs at least one job and one worker")
    say = progress or (lambda _message: None)
    if url is None:
        url = DEFAULT_DEMO_URL
        _remove_sqlite_files(DEFAULT_DEMO_PATH)
    ensure_sqlite_folder(url)
    # Upkeep every 0.1 s brings failed attempts back quickly, so retries show within the run.
    settings = QueueSettings(maintenance_interval_s=0.1)
    async with Queue.from_url(url, settings) as queue:
        await _require_empty(queue, url)
        return await _Drain(queue, url, jobs, workers, random.Random(seed), say).run()


class _Drain:
    """Producer, workers and bookkeeping of one demo run."""

    def __init__(self, queue: Queue, url: str, jobs: int, workers: int, rng: random.Random,
                 say: Callable[[str], None]) -> None:
        self.queue = queue
        self.url = url
        self.workers = workers
        self.say = say
        self.first = _first_batch(jobs, rng)
        # Enough late critical jobs to see, few enough not to drown the table.
        self.late = [_Spec(n=jobs + i, priority=Priority.CRITICAL, tenant=TENANTS[i % len(TENANTS)],
                           late=True)
                     for i in range(max(3, jobs // 100))]
        self.tracks = {spec.n: _Track(spec) for spec in [*self.first, *self.late]}
        self.claims = 0
        self.settled = 0
        self.claiming = asyncio.Lock()
        self.halfway = asyncio.Event()
        self.done = asyncio.Event()
        self.started_at = 0.0
        self.finished_at = 0.0

    async def run(self) -> DemoSummary:
        enqueue_ms = await self._enqueue(self.first)
        counts = ", ".join(f"{_count(self.first, p)} {p.name.lower()}" for p in Priority)
        self.say(f"Enqueued {len(self.first):,} shuffled jobs from {len(TENANTS)} tenants with "
                 f"enqueue_many in {enqueue_ms:.0f} ms: {counts}")
        self.say(f"Draining with {self.workers} workers, claiming up to {CLAIM_LIMIT} jobs each...")
        self.started_at = time.monotonic()
        try:
            async with asyncio.timeout(DRAIN_TIMEOUT_S), asyncio.TaskGroup() as group:
                group.create_task(self._inject_late())
                for index in range(self.workers):
                    group.create_task(self._work(f"demo-worker-{index}"))
        except TimeoutError:
            raise RuntimeError(f"demo drain stalled: {self.settled} of {len(self.tracks)} jobs "
                               f"settled after {DRAIN_TIMEOUT_S:.0f}s") from None
        except ExceptionGroup as failures:
            # One worker failing cancels the rest; its error is the one worth showing.
            raise failures.exceptions[0] from failures
        elapsed_s = self.finished_at - self.started_at
        served = _served(self.tracks.values())
        return DemoSummary(self.url, self.workers, enqueue_ms, elapsed_s, served, _rows(served))

    async def _enqueue(self, specs: Sequence[_Spec]) -> float:
        """Enqueue in as few calls as max_batch allows; returns the time it took in ms."""
        started = time.monotonic()
        for spec in specs:
            # Set before the call: a worker may claim the job before enqueue_many returns.
            self.tracks[spec.n].enqueued_at = started
        batch = [spec.job_spec() for spec in specs]
        size = self.queue.settings.max_batch
        for start in range(0, len(batch), size):
            await self.queue.enqueue_many(batch[start:start + size])
        return (time.monotonic() - started) * 1000

    async def _inject_late(self) -> None:
        await self.halfway.wait()
        await self._enqueue(self.late)
        self.say(f"Half way: enqueued {len(self.late)} more critical jobs; "
                 "they are served next, ahead of the waiting backlog")

    async def _work(self, worker_id: str) -> None:
        while not self.done.is_set():
            # Claims run one at a time and are numbered under the lock, so a position is the order
            # the queue handed jobs out: answers to overlapping claims can arrive in any order.
            # The work itself, completes and fails stay concurrent.
            async with self.claiming:
                claimed = await self.queue.claim(worker_id, limit=CLAIM_LIMIT, timeout_s=0.1)
                claimed_at = time.monotonic()
                for job in claimed:
                    self._on_claim(job, claimed_at)
            for job in claimed:
                await asyncio.sleep(WORK_S)
                await self._settle(job)

    def _on_claim(self, job: Job, claimed_at: float) -> None:
        n = job.payload.get("n")
        track = self.tracks.get(n) if isinstance(n, int) else None
        if track is None:
            # Someone else's job: completing it would destroy their work.
            raise ConfigError(f"job {job.id} is not one of the demo's; run the demo on its own queue")
        track.attempts += 1
        if track.position is None:
            track.position = self.claims
            track.wait_ms = (claimed_at - track.enqueued_at) * 1000
        self.claims += 1
        if self.claims >= len(self.first) // 2:
            self.halfway.set()

    async def _settle(self, job: Job) -> None:
        track = self.tracks[job.payload["n"]]
        if track.spec.poison or (track.spec.flaky and track.attempts == 1):
            state = await self.queue.fail(job, "simulated upstream 503", retry_in_s=RETRY_IN_S)
            if state is not JobState.DEAD:
                return  # it comes back after RETRY_IN_S, at its own priority
        else:
            await self.queue.complete(job, {"ok": True})
            state = JobState.SUCCEEDED
        track.state = state
        self.settled += 1
        if self.settled == len(self.tracks):
            self.finished_at = time.monotonic()
            self.done.set()


async def _require_empty(queue: Queue, url: str) -> None:
    stats = await queue.stats()
    waiting = stats.depth + stats.in_flight + stats.delayed
    if waiting:
        raise ConfigError(f"the demo needs an empty queue, but {url} holds {waiting} unfinished jobs")


# ---------------------------------------------------------------------- the batch


@dataclass(slots=True)
class _Spec:
    n: int
    priority: Priority
    tenant: str
    late: bool = False
    flaky: bool = False
    poison: bool = False

    def job_spec(self) -> JobSpec:
        payload = {"n": self.n, "task": "embed" if self.priority >= Priority.LOW else "chat"}
        return JobSpec(payload=payload, priority=self.priority, tenant=self.tenant,
                       max_attempts=POISON_MAX_ATTEMPTS if self.poison else None)


@dataclass(slots=True)
class _Track:
    spec: _Spec
    enqueued_at: float = 0.0
    position: int | None = None
    wait_ms: float = 0.0
    attempts: int = 0
    state: JobState | None = None


def _first_batch(jobs: int, rng: random.Random) -> list[_Spec]:
    levels = [p for p, share in MIX.items() for _ in range(share)]
    priorities = [levels[i * len(levels) // jobs] for i in range(jobs)]
    rng.shuffle(priorities)
    specs = [_Spec(n=n, priority=priority, tenant=rng.choice(TENANTS))
             for n, priority in enumerate(priorities)]
    # Fixed counts rather than a coin per job, so every run shows some retries and dead letters.
    unlucky = rng.sample(specs, round(jobs * POISON_RATE) + round(jobs * FLAKY_RATE))
    for index, spec in enumerate(unlucky):
        if index < round(jobs * POISON_RATE):
            spec.poison = True
        else:
            spec.flaky = True
    return specs


def _count(specs: Sequence[_Spec], priority: Priority) -> int:
    return sum(1 for spec in specs if spec.priority is priority)


# ---------------------------------------------------------------------- the summary


def _served(tracks: Iterable[_Track]) -> tuple[ServedJob, ...]:
    served = []
    for track in tracks:
        if track.position is None or track.state is None:
            raise RuntimeError(f"demo job {track.spec.n} was never settled")
        served.append(ServedJob(n=track.spec.n, priority=track.spec.priority, late=track.spec.late,
                                position=track.position, wait_ms=track.wait_ms,
                                attempts=track.attempts, state=track.state))
    return tuple(sorted(served, key=lambda job: job.position))


def _rows(served: Sequence[ServedJob]) -> tuple[LevelRow, ...]:
    rows = []
    for priority in Priority:
        for late in (False, True):
            group = [job for job in served if job.priority is priority and job.late is late]
            if not group:
                continue
            waits = sorted(job.wait_ms for job in group)
            label = priority.name.lower() + (" (late)" if late else "")
            rows.append(LevelRow(
                label=label, priority=priority, late=late, count=len(group),
                first_position=min(job.position for job in group),
                last_position=max(job.position for job in group),
                wait_p50_ms=_percentile(waits, 50), wait_p99_ms=_percentile(waits, 99),
                retries=sum(job.attempts - 1 for job in group),
                dead=sum(1 for job in group if job.state is JobState.DEAD),
            ))
    return tuple(rows)


def _percentile(ordered: Sequence[float], q: float) -> float:
    # Nearest rank: always a value that was measured, and well defined for tiny groups.
    rank = max(math.ceil(q / 100 * len(ordered)), 1)
    return ordered[min(rank, len(ordered)) - 1]


def render_summary(summary: DemoSummary, console: Console) -> None:
    """Print the per-priority table and the throughput line."""
    table = Table(title="Served order and wait by priority", box=box.SIMPLE_HEAD)
    table.add_column("priority")
    table.add_column("jobs", justify="right")
    table.add_column("served #", justify="right")
    table.add_column("wait p50", justify="right")
    table.add_column("wait p99", justify="right")
    table.add_column("retries", justify="right")
    table.add_column("dead", justify="right")
    for row in summary.rows:
        table.add_row(row.label, f"{row.count:,}", f"{row.first_position:,}-{row.last_position:,}",
                      _ms(row.wait_p50_ms), _ms(row.wait_p99_ms), str(row.retries), str(row.dead))
    console.print(table)
    console.print("served # is the position of each job's first claim in the order the workers got "
                  "them; wait is from the enqueue call to that claim. Retries and dead letters come "
                  "from attempts the demo fails on purpose.")
    console.print(f"Drained [bold]{summary.jobs:,}[/] jobs in {summary.elapsed_s:.2f} s with "
                  f"{summary.workers} workers: [bold]{summary.throughput_per_s:,.0f} jobs/s[/]")
    console.print(f"Look inside: tidegate queue stats --queue {summary.url}  "
                  f"(and queue dlq, queue redrive)", highlight=False)


def _ms(value: float) -> str:
    return f"{value:,.0f} ms" if value >= 10 else f"{value:.1f} ms"


# ---------------------------------------------------------------------- files


def _sqlite_file(url: str) -> Path | None:
    parts = urlsplit(url)
    if parts.scheme != "sqlite" or not parts.path:
        return None
    # sqlite:///relative.db → relative.db; sqlite:////abs.db → /abs.db (as Queue.from_url reads it)
    return Path(parts.path[1:] if parts.path.startswith("/") else parts.path)


def ensure_sqlite_folder(url: str) -> None:
    """Create the folder of a `sqlite:///...` URL's file, so a fresh path just works."""
    path = _sqlite_file(url)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)


def _remove_sqlite_files(path: Path) -> None:
    # Only ever called on the demo's own default file: a fresh run, with the journal files too.
    for suffix in ("", "-wal", "-shm", "-journal"):
        path.with_name(path.name + suffix).unlink(missing_ok=True)
