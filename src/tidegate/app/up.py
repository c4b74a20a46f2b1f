"""`tidegate up`: the whole system in one process on embedded defaults — the SQLite queue in
`./.tidegate/`, a worker, the gateway with its dashboard, the change flow on the demo shop feeding
the recommender, and the simulated provider when no real provider is configured. It binds
loopback by default, and serves with an admin API key it keeps across restarts.

One recommender serves the gateway's /v1/recommendations and is fed by the change flow (a
`RecsSink` after the entity cache); its state lives where the change flow's cache does (memory
by default, Redis when `sync.cache_url` says so), and item vectors are swapped as the embedding
refresh jobs the change flow enqueues succeed (`RefreshWatcher`).

The port is bound first, before anything is opened or changed: a second `up` on a busy port
stops there with one line naming the port's likely owner (tidegate.app.ports), and the running
one keeps its key. That key belongs to a tenant of its own, `UP_TENANT`: made at the first start,
kept (hashed in the tenant store, in plaintext in a 0600 file beside the queue) and reused at
every later one, replaced only by `tidegate keys rotate-admin` or a key given in
TIDEGATE_ADMIN_KEY (tidegate.app.admin_key). A start revokes no other key.

Everything here is wiring: each part is the same code that runs on its own with
`tidegate worker` and `tidegate gateway`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import socket
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

import uvicorn

from tidegate._shutdown import CLOSE_BOUND_S, bounded, enter_bounded, stop_on_signals
from tidegate.app.admin_key import UP_TENANT, Origin, admin_key_path, ensure_admin_key
from tidegate.app.components import Components
from tidegate.app.gateway import GatewayServer, check_bind, gateway_state
from tidegate.app.ports import bind_port
from tidegate.app.recs import open_recommendations
from tidegate.app.sync import supervise_sync
from tidegate.config import ModelConfig, TidegateConfig
from tidegate.config import UpSettings as UpSettings  # its home before it was a section
from tidegate.dispatch.metrics import DispatchMetrics
from tidegate.dispatch.worker import Worker
from tidegate.gateway.app import create_app
from tidegate.gateway.batches.sweep import sweeping
from tidegate.gateway.core.http_server import UVICORN_OPTIONS
from tidegate.gateway.core.state import GatewayState
from tidegate.simulator.catalogue import with_simulator
from tidegate.simulator.server import Simulator
from tidegate.simulator.settings import ServedModel, SimulatorSettings
from tidegate.sync.metrics import SyncMetrics
from tidegate.tracing import configured

__all__ = ["UP_TENANT", "UpInfo", "UpSettings", "run_up", "with_simulator_limits"]

log = logging.getLogger("tidegate.app.up")


@dataclass(frozen=True, slots=True)
class UpInfo:
    """Where everything listens, and the admin key this run serves with."""

    api_url: str
    dashboard_url: str
    metrics_url: str
    simulator_url: str | None
    # The full admin key; None only when it was given at an earlier start and is not given now.
    admin_key: str | None
    queue_url: str
    change_source: str | None = None  # what the change flow captures (None: not running)
    admin_key_id: str = ""
    # "created" (made by this start: shown once), "kept" (made before) or "given" (TIDEGATE_ADMIN_KEY)
    admin_key_origin: Origin = "created"
    admin_key_file: Path | None = None  # where the admin key (or, when given, its id) is recorded


async def run_up(
    config: TidegateConfig,
    settings: UpSettings,
    *,
    simulator: SimulatorSettings | None = None,
    on_ready: Callable[[UpInfo], None] | None = None,
    stop: asyncio.Event | None = None,
    sock: socket.socket | None = None,
) -> None:
    """Serve until SIGTERM/SIGINT (or, when given, until `stop` is set: the caller then owns the
    signals), then shut down in order within `settings.shutdown_grace_s` (see `_shut_down`).
    `simulator` is how the simulated provider behaves, started when no provider is configured.
    `sock` is the gateway's socket when the caller bound it already (`ports.bind_port`, as the
    command line does before anything else); else `settings.host:port` is bound before anything
    is opened. Either way it is closed on return."""
    forced = asyncio.Event()
    simulator = simulator or SimulatorSettings()
    with contextlib.closing(sock or bind_port(settings.host, settings.port)) as bound:
        if stop is not None:
            await _run(config, settings, simulator, on_ready, stop, forced, bound)
            return
        stop = asyncio.Event()
        with stop_on_signals(stop.set, force=forced.set, grace_s=settings.shutdown_grace_s):
            await _run(config, settings, simulator, on_ready, stop, forced, bound)
    log.info("stopped")


async def _run(
    config: TidegateConfig, settings: UpSettings, simulator_settings: SimulatorSettings,
    on_ready: Callable[[UpInfo], None] | None, stop: asyncio.Event, forced: asyncio.Event,
    sock: socket.socket,
) -> None:
    # Entered in dependency order, so the stack closes each part after the parts that use it:
    # the worker, the refresh watcher, then the Components (recommender, entity cache, callback
    # sender, relay, ledger, limiter, tenants, queue); the simulator last. The port is bound
    # already, so nothing here runs for a start that cannot serve.
    async with contextlib.AsyncExitStack() as stack:
        stack.enter_context(configured(config.tracing))  # exported last, after everything stopped
        simulator_url = None
        if not config.providers:
            simulator = Simulator(simulator_settings)
            simulator_url = await enter_bounded(stack, simulator.running(), "the simulator")
            config = with_simulator_limits(with_simulator(config, simulator_url), simulator.settings)
        # One set of parts for the worker and the gateway: the relay especially, since the worker
        # publishes what the gateway streams.
        parts = await stack.enter_async_context(Components.open(
            config, worker=True, gateway=True, cache=settings.change_flow, recs_url=config.sync.cache_url))
        queue, tenants = parts.queue, parts.tenants
        sync_metrics = SyncMetrics()
        recs = await open_recommendations(stack, config, queue=queue, cache=parts.cache,
                                          recommender=parts.recommender)
        dispatch_metrics = DispatchMetrics()
        worker = await stack.enter_async_context(Worker(
            parts.for_worker(), config, config.worker.model_copy(update={
                "concurrency": settings.concurrency, "shutdown_grace_s": settings.shutdown_grace_s}),
            metrics=dispatch_metrics,
        ))
        state = gateway_state(
            parts, settings=config.gateway.model_copy(update={"host": settings.host, "port": settings.port}),
            recs_monitor=recs.sink.monitor,
            extra_registries=[dispatch_metrics.registry, sync_metrics.registry, recs.sink.monitor.registry],
        )
        await stack.enter_async_context(sweeping(state))
        given = settings.admin_key.get_secret_value() if settings.admin_key is not None else None
        admin = await ensure_admin_key(tenants, admin_key_path(config.queue_url), given)
        await check_bind(state)
        async with _serving(state, settings, sock) as (server, port, serving):
            worker_task = asyncio.create_task(worker.run())
            sync_stop = asyncio.Event()
            sync_task = None
            if parts.cache is not None:
                sync_task = asyncio.create_task(supervise_sync(
                    config, sync_stop, queue=queue, cache=parts.cache, metrics=sync_metrics,
                    sinks=[recs.sink], on_refresh=recs.watcher.enqueued if recs.watcher else None))
            base = f"http://{_url_host(settings.host)}:{port}"
            if on_ready is not None:
                on_ready(UpInfo(
                    api_url=f"{base}/v1", dashboard_url=f"{base}/dashboard", metrics_url=f"{base}/metrics",
                    simulator_url=simulator_url, queue_url=config.queue_url,
                    change_source=config.sync.source_url if sync_task is not None else None,
                    admin_key=admin.api_key, admin_key_id=admin.key_id, admin_key_origin=admin.origin,
                    admin_key_file=admin.path,
                ))
            await _first_of(stop, server.main_loop_done)
            force = asyncio.create_task(_force_when(forced, server, worker))
            try:
                state.begin_drain(settings.shutdown_grace_s)
                await _shut_down(settings.shutdown_grace_s, server, serving, worker, worker_task,
                                 sync_stop, sync_task)
            finally:
                force.cancel()


async def _shut_down(
    grace_s: float, server: GatewayServer, serving: asyncio.Task[None], worker: Worker,
    worker_task: asyncio.Task[None], sync_stop: asyncio.Event, sync_task: asyncio.Task[None] | None,
) -> None:
    """Stop in order, all within `grace_s` (plus the bounded give-back of what is left):
    the gateway stops accepting and lets open calls finish — the worker still serving the jobs
    they wait for; then the worker stops claiming and gets what is left of the grace to finish
    its calls before it releases the rest, their attempts given back; then the change flow."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + grace_s
    server.request_exit()
    # uvicorn itself cuts open connections after the grace (timeout_graceful_shutdown).
    await bounded(asyncio.shield(serving), "the gateway's graceful shutdown", grace_s + CLOSE_BOUND_S)
    sync_stop.set()
    worker.request_stop(grace_s=max(deadline - loop.time(), 0.0))
    await worker_task
    if sync_task is not None:
        await bounded(sync_task, "the change flow's stop")


async def _first_of(*events: asyncio.Event) -> None:
    waits = [asyncio.create_task(event.wait()) for event in events]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in waits:
            wait.cancel()


async def _force_when(forced: asyncio.Event, server: GatewayServer, worker: Worker) -> None:
    """A second signal: cut open connections and release in-flight jobs now."""
    await forced.wait()
    server.force()
    worker.force_stop()


@contextlib.asynccontextmanager
async def _serving(
    state: GatewayState, settings: UpSettings, sock: socket.socket,
) -> AsyncIterator[tuple[GatewayServer, int, asyncio.Task[None]]]:
    """The gateway serving on its socket (bound and listening; closed by the caller): the
    server, its port and the task that serves until `should_exit` (awaited, and its error
    raised, on leaving)."""
    port = int(sock.getsockname()[1])
    # No access log: at the warning level `up` logs at, uvicorn would still build each request's
    # access line (its client address and quoted path) only for the logger to drop it.
    server = GatewayServer(uvicorn.Config(create_app(state), lifespan="off", log_level="warning",
                                          access_log=False,
                                          timeout_graceful_shutdown=math.ceil(settings.shutdown_grace_s),
                                          **UVICORN_OPTIONS))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    ready = asyncio.create_task(server.ready.wait())
    await asyncio.wait([task, ready], return_when=asyncio.FIRST_COMPLETED)
    if task.done():
        ready.cancel()
        await task  # raises what stopped it
    try:
        yield server, port, task
    finally:
        server.request_exit()
        await bounded(task, "the gateway's shutdown", settings.shutdown_grace_s + CLOSE_BOUND_S)


def with_simulator_limits(config: TidegateConfig, simulator: SimulatorSettings) -> TidegateConfig:
    """`config` (its provider the simulator) with each model's rate limits set to those the
    simulator enforces, as a deployment copies its provider's published limits into its config:
    the worker then paces under exactly the limits it will meet."""
    served = simulator.served_models()
    provider = config.providers[0]
    models = tuple(_limited(model, served.get(model.name), simulator.window_s) for model in provider.models)
    return config.model_copy(update={"providers": (provider.model_copy(update={"models": models}),)})


def _limited(model: ModelConfig, served: ServedModel | None, window_s: float) -> ModelConfig:
    if served is None:
        return model
    behaviour = served.behaviour
    return model.model_copy(update={"rpm": behaviour.rpm, "tpm": behaviour.tpm, "rate_window_s": window_s})


def _url_host(host: str) -> str:
    return f"[{host.strip('[]')}]" if ":" in host else host
