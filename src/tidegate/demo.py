"""The dispatch demo behind `make demo` and `tidegate demo`: everything in one process, nothing
to start.

It serves a simulated OpenAI-compatible provider on a free loopback port (per-model latency,
requests-per-minute limits, 1 % of calls answered 503), opens an embedded SQLite queue in
`.tidegate/demo.db` (fresh each run), and runs one worker against both. A load generator sends a
mix of priorities from four tenants, over capacity for part of the run so a backlog forms; then
the demo waits for every job to finish. The numbers come back from the queue: each job's result
(model, cost, attempts, upstream latency, written by the worker), the queue's stats, and the
worker's metrics. `run_demo` returns them as a `DemoSummary`; `show_demo` adds the live view and
the printed summary.

Modules: `demo_load` (the provider's models, tenants, job mix, arrivals), `demo_stats` (reading
numbers back), `demo_view` (rich rendering).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from urllib.parse import urlsplit

from rich.console import Console

from tidegate.demo_load import (
    BUDGET_TENANT,
    TENANTS,
    Arrivals,
    DemoSettings,
    Workload,
    budget_for,
    demo_config,
    estimated_capacity_per_s,
    simulator_settings,
)
from tidegate.demo_stats import (
    BudgetState,
    DemoSummary,
    GroupRow,
    Harvester,
    JobRecord,
    MetricsReader,
    Outcomes,
    Snapshot,
    group_rows,
    live_rows,
)
from tidegate.demo_view import LiveView, render_summary
from tidegate.dispatch.budget import BudgetLedger, budget_ledger_for
from tidegate.dispatch.costs import micros_to_usd, usd_to_micros
from tidegate.dispatch.metrics import DispatchMetrics
from tidegate.dispatch.worker import Worker, WorkerSettings
from tidegate.errors import ConfigError
from tidegate.jobs import JobSpec, Priority
from tidegate.providers.simulator import Simulator
from tidegate.queue import Queue, QueueStats
from tidegate.queue.base import redact_url

__all__ = [
    "DEFAULT_DEMO_URL",
    "DemoSettings",
    "DemoSummary",
    "GroupRow",
    "JobRecord",
    "Snapshot",
    "ensure_sqlite_folder",
    "render_summary",
    "run_demo",
    "show_demo",
]

DEFAULT_DEMO_PATH = Path(".tidegate") / "demo.db"
DEFAULT_DEMO_URL = f"sqlite:///{DEFAULT_DEMO_PATH}"
LOAD_TICK_S = 0.05  # timed load enqueues what is due this often, in one enqueue_many
DRAIN_STALL_S = 120.0  # no job finishing for this long is a bug; say so instead of hanging

OnSnapshot = Callable[[Snapshot], None]


async def run_demo(
    url: str | None = None,
    settings: DemoSettings | None = None,
    *,
    on_snapshot: OnSnapshot | None = None,
) -> DemoSummary:
    """Run the demo on `url` (default: a fresh `.tidegate/demo.db`) and return what it measured.
    `on_snapshot` is called every `settings.refresh_s` with the live numbers.

    A queue given by URL must be empty: the demo never deletes data it did not create.
    """
    settings = settings or DemoSettings()
    _check(settings)
    if url is None:
        url = DEFAULT_DEMO_URL
        _remove_sqlite_files(DEFAULT_DEMO_PATH)
    ensure_sqlite_folder(url)
    arrivals = Arrivals(settings.seconds, estimated_capacity_per_s(settings))
    budget_usd = budget_for(settings.jobs if settings.jobs is not None else arrivals.planned)
    async with contextlib.AsyncExitStack() as stack:
        queue = await stack.enter_async_context(Queue.from_url(url))
        await _require_empty(queue, url)
        base_url = await stack.enter_async_context(Simulator(simulator_settings(settings)).running())
        # A ledger of its own: a demo run on a given URL starts with the whole budget even when
        # an earlier run spent today's under the default name.
        ledger = await stack.enter_async_context(
            budget_ledger_for(url, f"demo-{uuid.uuid4().hex[:12]}"))
        metrics = DispatchMetrics()
        worker_settings = WorkerSettings(worker_id="demo-worker", concurrency=settings.concurrency,
                                         claim_wait_s=0.2, shutdown_grace_s=5.0)
        worker = await stack.enter_async_context(
            Worker(queue, demo_config(url, base_url, budget_usd), worker_settings,
                   ledger=ledger, metrics=metrics))
        run = _Run(_Parts(url, queue, worker, ledger, metrics), settings, arrivals, budget_usd,
                   on_snapshot)
        return await run.run()


async def show_demo(url: str | None, settings: DemoSettings, console: Console, *,
                    live: bool = True) -> DemoSummary:
    """Run the demo with the live view on `console` (unless `live` is False), then print the
    summary. Returns what `run_demo` returns."""
    load = (f"{settings.seconds:g} s of load" if settings.timed
            else f"a batch of {settings.jobs:,} jobs")
    where = redact_url(url or DEFAULT_DEMO_URL)
    console.print(f"[bold]tidegate demo[/]: a simulated provider on loopback, a queue at {where}, "
                  f"one worker of {settings.concurrency} concurrent calls; {load} from "
                  f"{len(TENANTS)} tenants, then the drain.", highlight=False)
    # Redrawing needs a terminal; piped output gets the summary only.
    view = LiveView(console, enabled=live and console.is_terminal)
    with view.showing():
        summary = await run_demo(url, settings, on_snapshot=view.update)
    console.print()
    render_summary(summary, console)
    return summary


def _check(settings: DemoSettings) -> None:
    if settings.jobs is not None and settings.jobs < 1:
        raise ConfigError("the demo needs at least one job")
    if settings.seconds <= 0 or settings.concurrency < 1 or settings.refresh_s <= 0:
        raise ConfigError("the demo needs seconds > 0, concurrency >= 1 and refresh_s > 0")
    if not 0 <= settings.error_rate <= 1 or settings.latency_scale <= 0:
        raise ConfigError("the demo needs 0 <= error_rate <= 1 and latency_scale > 0")


@dataclass(frozen=True, slots=True)
class _Parts:
    """What a run works with, opened by `run_demo`."""

    url: str
    queue: Queue
    worker: Worker
    ledger: BudgetLedger
    metrics: DispatchMetrics


class _Run:
    """The load generator and the watcher of one run, beside the worker."""

    def __init__(self, parts: _Parts, settings: DemoSettings, arrivals: Arrivals, budget_usd: Decimal,
                 on_snapshot: OnSnapshot | None) -> None:
        self.parts = parts
        self.settings = settings
        self.arrivals = arrivals
        self.budget_usd = budget_usd
        self.on_snapshot = on_snapshot
        self.workload = Workload(settings.seed)
        self.started = time.monotonic()
        self.harvester = Harvester(parts.queue, datetime.now(UTC))
        self.reader = MetricsReader(parts.metrics)
        self.load_done = asyncio.Event()
        self.load_s = 0.0
        self.elapsed_s = 0.0
        self.peak_backlog = 0

    async def run(self) -> DemoSummary:
        try:
            async with asyncio.TaskGroup() as group:
                group.create_task(self.parts.worker.run())
                group.create_task(self._load())
                group.create_task(self._watch())
        except ExceptionGroup as failures:
            # One task failing cancels the others; its error is the one worth showing.
            raise failures.exceptions[0] from failures
        records = tuple(sorted(self.harvester.records, key=lambda r: r.finished_s))
        by_priority, by_model = group_rows(records)
        return DemoSummary(
            url=self.parts.url, timed=self.settings.timed, concurrency=self.settings.concurrency,
            capacity_per_s=self.arrivals.capacity_per_s, load_s=self.load_s,
            elapsed_s=self.elapsed_s, peak_backlog=self.peak_backlog,
            paced=self.reader.paced(), throttled=self.reader.throttled(), records=records,
            by_priority=by_priority, by_model=by_model, budget=await self._budget(),
        )

    def _now(self) -> float:
        return time.monotonic() - self.started

    # -- the load

    async def _load(self) -> None:
        if self.settings.jobs is not None:
            await self._enqueue(self.workload.take(self.settings.jobs))
        else:
            sent = 0
            while (t_s := self._now()) < self.arrivals.seconds:
                due = self.arrivals.due(t_s)
                await self._enqueue(self.workload.take(due - sent))
                sent = due
                await asyncio.sleep(LOAD_TICK_S)
            await self._enqueue(self.workload.take(self.arrivals.planned - sent))
        self.load_s = self._now()
        self.load_done.set()

    async def _enqueue(self, specs: list[JobSpec]) -> None:
        size = self.parts.queue.settings.max_batch
        for start in range(0, len(specs), size):
            batch = specs[start:start + size]
            ids = await self.parts.queue.enqueue_many(batch)
            self.harvester.track(ids, [Priority.parse(spec.priority) for spec in batch])

    # -- reading numbers back

    async def _watch(self) -> None:
        last_progress = time.monotonic()
        while True:
            await asyncio.sleep(self.settings.refresh_s)
            outcomes = self.reader.outcomes()
            if await self.harvester.sweep(outcomes.done()):
                last_progress = time.monotonic()
            stats = await self.parts.queue.stats()
            self.peak_backlog = max(self.peak_backlog, stats.depth + stats.delayed)
            finished = self.load_done.is_set() and self.harvester.outstanding == 0
            if finished:
                self.elapsed_s = self._now()
            if self.on_snapshot is not None:
                self.on_snapshot(await self._snapshot(stats, outcomes))
            if finished:
                break
            if time.monotonic() - last_progress > DRAIN_STALL_S:
                raise RuntimeError(f"demo stalled: no job finished for {DRAIN_STALL_S:.0f} s, "
                                   f"{self.harvester.outstanding} still unfinished")
        self.parts.worker.request_stop()

    async def _snapshot(self, stats: QueueStats, outcomes: Outcomes) -> Snapshot:
        t_s = self._now()
        if self.settings.timed:
            phase = self.arrivals.phase(t_s)
            name, rate = phase.name, phase.rate_per_s
        else:
            name, rate = ("batch" if self.harvester.outstanding else "drain"), 0.0
        rates = self.reader.rates(outcomes.done())
        return Snapshot(
            elapsed_s=t_s, phase=name, arrival_per_s=rate, served_per_s=sum(rates.values()),
            rows=live_rows(self.harvester, stats, outcomes, rates),
            backlog=stats.depth, delayed=stats.delayed,
            spend_by_model=self.reader.spend_by_model(),
            answered_by_model=self.reader.answered_by_model(), paced=self.reader.paced(),
            throttled=self.reader.throttled(), budget=await self._budget(),
        )

    async def _budget(self) -> BudgetState:
        limit = usd_to_micros(self.budget_usd)
        status = await self.parts.ledger.status(BUDGET_TENANT, tenant_limit_micros=limit,
                                                global_limit_micros=None)
        mine = [r for r in self.harvester.records if r.tenant == BUDGET_TENANT]
        return BudgetState(
            tenant=BUDGET_TENANT, limit_usd=self.budget_usd,
            spent_usd=micros_to_usd(status.tenant_spent_micros),
            stepped_down=sum(1 for r in mine if r.stepped_down),
            refused=sum(1 for r in mine if r.dead_cause == "budget"),
        )


async def _require_empty(queue: Queue, url: str) -> None:
    stats = await queue.stats()
    waiting = stats.depth + stats.in_flight + stats.delayed
    if waiting:
        raise ConfigError(f"the demo needs an empty queue, but {url} holds {waiting} unfinished jobs")


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
