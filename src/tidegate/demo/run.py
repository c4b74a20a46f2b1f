"""The demo behind `make demo` and `tidegate demo`: `tidegate up` plus a load generator that goes
through the HTTP API, with a live view and a final summary.

It starts what `tidegate up` starts (`up.run_up`): the simulated provider (per-model latency and
request limits, 1% of calls answered 503), a fresh SQLite queue in `.tidegate/demo.db`, the
tenant store, one worker, and the gateway with its dashboard on loopback. Then, as an
application would, it creates four tenants and their keys through the admin API and sends a mix
of priorities with their keys: OpenAI-style chat calls (some streamed), embeddings, and batches
of async jobs (POST /v1/jobs, long-polled to their end), over the worker's capacity for part of
the run so a backlog forms. When the load ends it waits until every request has its final
outcome. The queue's numbers come from GET /v1/stats with the admin key.

Meanwhile the demo writes to the demo shop's database (`.tidegate/demo-shop.db`, not the
`shop.db` of `tidegate up`; `demo_recs.ShopDriver`: ShopLoad's mix of
interactions, price and stock changes, and the clicks of one demo user, the shop's most active
customer). The change flow carries each write to the recommender; the live view and the summary
show that user's top recommendations changing, and the commit → recommendation-updated latency.

`run_demo` returns what it measured as a `DemoSummary`; `show_demo` adds the live view and the
printed summary. Modules: `demo_load` (the provider's models, tenants, request mix, arrivals),
`demo_http` (the client side), `demo_stats` (outcomes and numbers), `demo_view` (rich rendering).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import signal
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
from rich.console import Console

from tidegate._sqlite import ensure_sqlite_folder
from tidegate.app.up import UpInfo, UpSettings, run_up
from tidegate.demo.embedded import embedded_sync_config
from tidegate.demo.http import DemoClient, DemoError
from tidegate.demo.load import (
    BUDGET_TENANT,
    TENANTS,
    Arrivals,
    DemoSettings,
    Planned,
    Workload,
    budget_for,
    demo_config,
    estimated_capacity_per_s,
    simulator_settings,
)
from tidegate.demo.recs import RecsReading, RecsWatch, ShopDriver, most_active_user
from tidegate.demo.stats import DemoSummary, GatewayReading, Outcome, Snapshot, Tally, by_model, by_priority
from tidegate.demo.view import LiveView, render_ready, render_summary

__all__ = [
    "DEFAULT_FOLDER",
    "DemoInterrupted",
    "DemoSettings",
    "DemoSummary",
    "run_demo",
    "show_demo",
]

DEFAULT_FOLDER = Path(".tidegate")
DEMO_DB = "demo.db"
# The demo shop the change flow watches; kept between runs. Its own file: `tidegate up` follows
# `.tidegate/shop.db`, which the demo's writes must leave as the operator left it.
DEMO_SHOP_DB = "demo-shop.db"
LOAD_TICK_S = 0.05  # the load sends what is due this often
BATCH_EVERY_S = 1.0  # async jobs due are sent as one batch per tenant this often
START_TIMEOUT_S = 60.0
SHUTDOWN_GRACE_S = 1
DRAIN_STALL_S = 120.0  # no outcome for this long is a bug; say so instead of hanging

OnSnapshot = Callable[[Snapshot], None]
OnReady = Callable[[UpInfo], None]


class DemoInterrupted(Exception):
    """Ctrl-C stopped the demo before every request had its outcome."""

    def __init__(self, elapsed_s: float, sent: int, finished: int) -> None:
        super().__init__(f"interrupted after {elapsed_s:.1f} s: {sent:,} requests sent, "
                         f"{finished:,} with their outcome")
        self.elapsed_s = elapsed_s
        self.sent = sent
        self.finished = finished


async def run_demo(
    settings: DemoSettings | None = None,
    *,
    folder: Path = DEFAULT_FOLDER,
    port: int = 0,
    on_ready: OnReady | None = None,
    on_snapshot: OnSnapshot | None = None,
) -> DemoSummary:
    """Run the demo with its database in `folder` (fresh: an earlier demo's file is removed) and
    the gateway on 127.0.0.1:`port` (0: any free port); return what it measured. `on_ready` is
    called once everything listens; `on_snapshot` every `settings.refresh_s` with the live
    numbers."""
    settings = settings or DemoSettings()
    path = folder / DEMO_DB
    _remove_sqlite_files(path)
    url = f"sqlite:///{path}"
    ensure_sqlite_folder(url)
    # A short grace: when the demo stops early its own calls are closed, so none is waited for.
    up_settings = UpSettings(host="127.0.0.1", port=port, concurrency=settings.concurrency,
                             shutdown_grace_s=SHUTDOWN_GRACE_S)
    stop = asyncio.Event()
    ready: asyncio.Future[UpInfo] = asyncio.get_running_loop().create_future()
    config = embedded_sync_config(demo_config(url, f"sqlite:///{folder / DEMO_SHOP_DB}"))
    up = asyncio.create_task(run_up(config, up_settings, simulator=simulator_settings(settings),
                                    on_ready=ready.set_result, stop=stop))
    try:
        info = await _started(up, ready)
        if on_ready is not None:
            on_ready(info)
        if info.admin_key is None:  # never: the demo's store is new at each run, so is its admin key
            raise DemoError("the demo's admin key is unknown")
        run = _Run(info, up, settings, on_snapshot, folder / DEMO_SHOP_DB)
        with _interrupt_on_sigint(run.interrupted):
            async with DemoClient(info.api_url, info.admin_key, run.now) as client:
                return await run.run(client)
    finally:
        stop.set()
        await up


@contextlib.contextmanager
def _interrupt_on_sigint(interrupted: asyncio.Event) -> Iterator[None]:
    """Ctrl-C sets `interrupted` for the block, so the run stops its load and closes its calls
    before `up` shuts down (the gateway then has no open call to wait for). It takes SIGINT
    over from the gateway's server, which installed its own handler when it started."""
    loop = asyncio.get_running_loop()
    try:
        loop.add_signal_handler(signal.SIGINT, interrupted.set)
    except (NotImplementedError, RuntimeError):  # no signals here (not the main thread, Windows)
        yield
        return
    try:
        yield
    finally:
        loop.remove_signal_handler(signal.SIGINT)


async def show_demo(settings: DemoSettings, console: Console, *, live: bool = True,
                    folder: Path = DEFAULT_FOLDER, port: int = 0) -> DemoSummary:
    """Run the demo with the live view on `console` (unless `live` is False or the console is
    no terminal: then a progress line now and then), then print the summary."""
    console.print(
        f"[bold]tidegate demo[/]: tidegate up (simulated provider, SQLite queue in "
        f"{folder / DEMO_DB}, one worker of {settings.concurrency} concurrent calls, the gateway "
        f"and its dashboard), then {settings.load_s:g} s of load through the HTTP API at "
        f"{settings.rate_per_s:g} requests/s on average from {len(TENANTS)} tenants, then the drain. "
        f"Meanwhile {settings.shop_rate_per_s:g} writes/s to the demo shop ({folder / DEMO_SHOP_DB}) "
        "flow through the change flow into the recommender.",
        highlight=False)
    view = LiveView(console, enabled=live and console.is_terminal)

    def ready(info: UpInfo) -> None:
        render_ready(info, console)
        view.start()

    try:
        summary = await run_demo(settings, folder=folder, port=port, on_ready=ready,
                                 on_snapshot=view.update)
    finally:
        view.stop()
    console.print()
    render_summary(summary, console)
    return summary


async def _started(up: asyncio.Task[None], ready: asyncio.Future[UpInfo]) -> UpInfo:
    """UpInfo once `up` listens; what stopped it if it ended first."""
    waiting: set[asyncio.Future[Any]] = {up, ready}
    done, _ = await asyncio.wait(waiting, timeout=START_TIMEOUT_S, return_when=asyncio.FIRST_COMPLETED)
    if ready in done:
        return ready.result()
    if up in done:
        await up  # raises what stopped it
        raise RuntimeError("tidegate up ended before it was ready")
    raise RuntimeError(f"tidegate up was not ready within {START_TIMEOUT_S:.0f} s")


class _Run:
    """The load generator and the watcher of one run, beside `tidegate up`."""

    def __init__(self, info: UpInfo, up: asyncio.Task[None], settings: DemoSettings,
                 on_snapshot: OnSnapshot | None, shop: Path) -> None:
        self.info = info
        self.up = up
        self.settings = settings
        self.on_snapshot = on_snapshot
        self.arrivals = Arrivals(settings.load_s, settings.rate_per_s)
        self.capacity_per_s = estimated_capacity_per_s(settings)
        self.workload = Workload(settings.seed)
        self.tally = Tally()
        self.started = time.monotonic()
        self.load_done = asyncio.Event()
        self.interrupted = asyncio.Event()
        self.load_s = 0.0
        self.elapsed_s = 0.0
        self.peak_backlog = 0
        self._waiting: defaultdict[str, list[Planned]] = defaultdict(list)  # async jobs, per tenant
        user = most_active_user(shop)
        self.shop = ShopDriver(shop, user, rate_per_s=settings.shop_rate_per_s,
                               click_every_s=settings.click_every_s, seed=settings.seed)
        self.recs_watch = RecsWatch(shop, user)
        self.recs: RecsReading | None = None

    def now(self) -> float:
        """Seconds since the run started."""
        return time.monotonic() - self.started

    async def run(self, client: DemoClient) -> DemoSummary:
        await client.create_tenants(TENANTS, budget_for(self.arrivals.planned))
        self.started = time.monotonic()
        try:
            async with asyncio.TaskGroup() as group:
                group.create_task(self._load(client, group))
                group.create_task(self.shop.run(self.arrivals.load_s, self.interrupted))
                group.create_task(self._watch(client))
        except ExceptionGroup as failures:
            # One task failing cancels the others; its error is the one worth showing.
            raise failures.exceptions[0] from failures
        gateway = GatewayReading.parse(await client.stats(), BUDGET_TENANT)
        recs = await self._read_recs(client)
        outcomes = tuple(sorted(self.tally.outcomes, key=lambda o: o.number))
        return DemoSummary(
            dashboard_url=self.info.dashboard_url, queue_url=self.info.queue_url,
            concurrency=self.settings.concurrency, rate_per_s=self.settings.rate_per_s,
            capacity_per_s=self.capacity_per_s, load_s=self.load_s, elapsed_s=self.elapsed_s,
            peak_backlog=self.peak_backlog, sent=dict(self.tally.sent),
            sent_by_mode=dict(self.tally.sent_by_mode), batches=self.tally.batches,
            outcomes=outcomes, by_priority=by_priority(outcomes), by_model=by_model(outcomes),
            gateway=gateway, recs=recs,
        )

    # -- the load

    async def _load(self, client: DemoClient, group: asyncio.TaskGroup) -> None:
        sent = 0
        next_batch_s = BATCH_EVERY_S
        while (t_s := self.now()) < self.arrivals.load_s:
            due = self.arrivals.due(t_s)
            self._send(client, group, self.workload.take(due - sent))
            sent = due
            if t_s >= next_batch_s:
                self._flush(client, group)
                next_batch_s += BATCH_EVERY_S
            await asyncio.sleep(LOAD_TICK_S)
        self._send(client, group, self.workload.take(self.arrivals.planned - sent))
        self._flush(client, group)
        self.load_s = self.now()
        self.load_done.set()

    def _send(self, client: DemoClient, group: asyncio.TaskGroup, planned: list[Planned]) -> None:
        for request in planned:
            if request.mode == "async":
                self._waiting[request.tenant].append(request)
            else:
                self.tally.record_sent(request.priority, request.mode)
                group.create_task(self._call(client, request))

    def _flush(self, client: DemoClient, group: asyncio.TaskGroup) -> None:
        for batch in self._waiting.values():
            if batch:
                for request in batch:
                    self.tally.record_sent(request.priority, request.mode)
                self.tally.batches += 1
                group.create_task(self._batch(client, list(batch)))
                batch.clear()

    async def _call(self, client: DemoClient, request: Planned) -> None:
        self.tally.record(await client.call(request))

    async def _batch(self, client: DemoClient, batch: list[Planned]) -> None:
        accepted = await client.submit(batch)
        for request, entry in zip(batch, accepted, strict=True):
            if isinstance(entry, Outcome):
                self.tally.record(entry)  # the batch was refused
            else:  # its job id
                # One job after another: a level is served in order, so each long-poll mostly
                # finds its job finished or nearly so.
                self.tally.record(await client.poll(request, entry))

    # -- watching

    async def _watch(self, client: DemoClient) -> None:
        last_progress, last_count = time.monotonic(), 0
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.interrupted.wait(), self.settings.refresh_s)
            if self.interrupted.is_set():
                raise DemoInterrupted(self.now(), self.tally.total_sent, len(self.tally.outcomes))
            if self.up.done():
                await self.up  # raises what stopped it
                raise RuntimeError("tidegate up stopped while the demo ran")
            gateway = GatewayReading.parse(await client.stats(), BUDGET_TENANT)
            self.recs = await self._read_recs(client)
            self.peak_backlog = max(self.peak_backlog, sum(gateway.depth.values()) + gateway.delayed)
            finished = self.load_done.is_set() and self.tally.outstanding == 0
            if finished:
                self.elapsed_s = self.now()
            if self.on_snapshot is not None:
                self.on_snapshot(self._snapshot(gateway))
            if finished:
                return
            if len(self.tally.outcomes) != last_count:
                last_progress, last_count = time.monotonic(), len(self.tally.outcomes)
            elif time.monotonic() - last_progress > DRAIN_STALL_S:
                raise RuntimeError(f"demo stalled: no outcome for {DRAIN_STALL_S:.0f} s, "
                                   f"{self.tally.outstanding} requests still unanswered")

    async def _read_recs(self, client: DemoClient) -> RecsReading:
        """The demo user's recommendations and the recommender's freshness, through the API. A
        failed read is shown, not raised: the request flow's numbers still count."""
        user = self.recs_watch.user
        try:
            health = await client.recs_health()
            answer = await client.recommendations(user) if user is not None else None
        except (DemoError, aiohttp.ClientError, TimeoutError) as exc:
            previous = self.recs or RecsReading(user=user)
            return dataclasses.replace(previous, error=str(exc))
        return await self.recs_watch.read(health, answer, self.shop.writes)

    def _snapshot(self, gateway: GatewayReading) -> Snapshot:
        t_s = self.now()
        phase = self.arrivals.phase(t_s)
        return Snapshot.of(self.tally, gateway, elapsed_s=t_s, phase=phase.name,
                           arrival_per_s=phase.rate_per_s, capacity_per_s=self.capacity_per_s,
                           recs=self.recs)


# ---------------------------------------------------------------------- files


def _remove_sqlite_files(path: Path) -> None:
    # Only ever called on the demo's own file: a fresh run, with the journal files too.
    for suffix in ("", "-wal", "-shm", "-journal"):
        path.with_name(path.name + suffix).unlink(missing_ok=True)
