"""`tidegate up`: the whole system in one process on embedded defaults — the SQLite queue in
`./.tidegate/`, a worker, the gateway with its dashboard, the change flow on the demo shop feeding
the recommender, and the simulated provider when no real provider is configured. It binds
loopback by default and creates an admin API key at start.

One recommender serves the gateway's /v1/recommendations and is fed by the change flow (a
`RecsSink` after the entity cache); its state lives where the change flow's cache does (memory
by default, Redis when `sync.cache_url` says so), and item vectors are swapped as the embedding
refresh jobs the change flow enqueues succeed (`RefreshWatcher`).

That key belongs to a tenant of its own, `UP_TENANT`: each start revokes the keys of that tenant
(the ones earlier starts printed) before creating the new one, so a key printed by an old run
stops working, while admin keys created with `tidegate keys create` for any other tenant stay.

Everything here is wiring: each part is the same code that runs on its own with
`tidegate worker` and `tidegate gateway`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import uvicorn

from tidegate.config import ModelConfig, TidegateConfig
from tidegate.dispatch.budget import budget_ledger_for
from tidegate.dispatch.callbacks import CallbackSender
from tidegate.dispatch.metrics import DispatchMetrics
from tidegate.dispatch.relay import relay_for
from tidegate.dispatch.worker import Worker, WorkerSettings
from tidegate.gateway.app import create_app
from tidegate.gateway.http_server import UVICORN_OPTIONS
from tidegate.gateway.serve import check_bind
from tidegate.gateway.settings import GatewaySettings
from tidegate.gateway.state import GatewayState
from tidegate.gateway.tenant_store import tenant_store_for
from tidegate.gateway.tenants import Tenant, TenantStore
from tidegate.jobs import Priority
from tidegate.providers.sim_settings import ServedModel, SimulatorSettings
from tidegate.providers.simulator import Simulator
from tidegate.queue import Queue
from tidegate.recs.wiring import open_recommendations
from tidegate.sync.embedded import embedded_sync_config
from tidegate.sync.metrics import SyncMetrics
from tidegate.sync.run import open_cache, supervise_sync

log = logging.getLogger("tidegate.up")

# The tenant whose key `up` prints: its keys are `up`'s own, revoked at the next start.
UP_TENANT = "tidegate-up"


@dataclass(frozen=True, slots=True)
class UpSettings:
    """What `tidegate up` starts."""

    host: str = "127.0.0.1"
    port: int = 8080
    concurrency: int = 32  # the in-process worker's calls in flight
    simulator: SimulatorSettings | None = None  # used when no provider is configured
    # On stop, how long calls still open may finish (the worker serving them meanwhile) before
    # the gateway cuts them; their jobs stay queued.
    shutdown_grace_s: int = 10
    # The change flow (the demo shop by default, see tidegate.sync.embedded) beside the request
    # flow; `shop_data` seeds a new demo shop from a copy of the UCI Online Retail data.
    change_flow: bool = True
    shop_data: str | None = None


@dataclass(frozen=True, slots=True)
class UpInfo:
    """Where everything listens, and the admin key created for this run."""

    api_url: str
    dashboard_url: str
    metrics_url: str
    simulator_url: str | None
    admin_key: str
    queue_url: str
    change_source: str | None = None  # what the change flow captures (None: not running)


async def run_up(
    config: TidegateConfig,
    settings: UpSettings,
    *,
    on_ready: Callable[[UpInfo], None] | None = None,
    stop: asyncio.Event | None = None,
) -> None:
    """Serve until SIGINT/SIGTERM (or `stop` is set), then drain the worker and shut down."""
    async with contextlib.AsyncExitStack() as stack:
        simulator_url = None
        if not config.providers:
            simulator = Simulator(settings.simulator or SimulatorSettings())
            simulator_url = await stack.enter_async_context(simulator.running())
            config = with_simulator_limits(config.with_simulator(simulator_url), simulator.settings)
        url = config.queue_url
        queue = await stack.enter_async_context(Queue.from_url(url))
        tenants = await stack.enter_async_context(tenant_store_for(url))
        ledger = await stack.enter_async_context(budget_ledger_for(url))
        relay = relay_for(url)  # shared: the worker publishes what the gateway streams
        stack.push_async_callback(relay.close)
        callbacks = None
        if secret := os.environ.get(config.callbacks.secret_env):
            callbacks = await stack.enter_async_context(CallbackSender(config.callbacks, secret.encode()))
        sync_metrics = SyncMetrics()
        sync_cache = None
        if settings.change_flow:
            config = embedded_sync_config(config, shop_data=settings.shop_data)
            sync_cache = await stack.enter_async_context(open_cache(config.sync))
        recs = await open_recommendations(stack, config, queue=queue, cache=sync_cache)
        dispatch_metrics = DispatchMetrics()
        worker = await stack.enter_async_context(Worker(
            queue, config, WorkerSettings(concurrency=settings.concurrency),
            metrics=dispatch_metrics, ledger=ledger, relay=relay, tenants=tenants, callbacks=callbacks,
        ))
        state = await stack.enter_async_context(GatewayState.open(
            config, settings=GatewaySettings(host=settings.host, port=settings.port), queue=queue,
            tenants=tenants, ledger=ledger, relay=relay, recommender=recs.sink.recommender,
            recs_monitor=recs.sink.monitor,
            extra_registries=[dispatch_metrics.registry, sync_metrics.registry, recs.sink.monitor.registry],
        ))
        admin_key = await _create_admin_key(tenants)
        await check_bind(state)
        async with _serving(state, settings) as (server, port, serving):
            worker_task = asyncio.create_task(worker.run())
            sync_stop = asyncio.Event()
            sync_task = None
            if sync_cache is not None:
                sync_task = asyncio.create_task(supervise_sync(
                    config, sync_stop, queue=queue, cache=sync_cache, metrics=sync_metrics,
                    sinks=[recs.sink], on_refresh=recs.watcher.enqueued if recs.watcher else None))
            base = f"http://{_url_host(settings.host)}:{port}"
            if on_ready is not None:
                on_ready(UpInfo(
                    api_url=f"{base}/v1", dashboard_url=f"{base}/dashboard", metrics_url=f"{base}/metrics",
                    simulator_url=simulator_url, admin_key=admin_key, queue_url=url,
                    change_source=config.sync.source_url if sync_task is not None else None,
                ))
            stopper = asyncio.create_task(stop.wait()) if stop is not None else None
            served = asyncio.create_task(server.main_loop_done.wait())
            await asyncio.wait([t for t in (stopper, served) if t is not None],
                               return_when=asyncio.FIRST_COMPLETED)
            # The gateway stops first, so calls still waiting for a result can get it from the
            # worker within the grace time; then the worker drains.
            server.should_exit = True
            await asyncio.wait([serving])
            sync_stop.set()
            worker.request_stop()
            await worker_task
            if sync_task is not None:
                await sync_task
            for task in (stopper, served):
                if task is not None:
                    task.cancel()


class _Server(uvicorn.Server):
    """uvicorn, telling when it has started and when its main loop has ended (Ctrl-C or
    should_exit)."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.ready = asyncio.Event()
        self.main_loop_done = asyncio.Event()

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        self.ready.set()

    async def main_loop(self) -> None:
        try:
            await super().main_loop()
        finally:
            self.main_loop_done.set()


@contextlib.asynccontextmanager
async def _serving(
    state: GatewayState, settings: UpSettings,
) -> AsyncIterator[tuple[_Server, int, asyncio.Task[None]]]:
    """The gateway serving on its socket: the server, its port and the task that serves until
    `should_exit` (awaited, and its error raised, on leaving)."""
    sock = socket.socket(socket.AF_INET6 if ":" in settings.host else socket.AF_INET,
                         socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((settings.host.strip("[]"), settings.port))
    port = int(sock.getsockname()[1])
    server = _Server(uvicorn.Config(create_app(state), lifespan="off", log_level="warning",
                                    timeout_graceful_shutdown=settings.shutdown_grace_s, **UVICORN_OPTIONS))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    ready = asyncio.create_task(server.ready.wait())
    await asyncio.wait([task, ready], return_when=asyncio.FIRST_COMPLETED)
    if task.done():
        ready.cancel()
        await task  # raises what stopped it
    try:
        yield server, port, task
    finally:
        server.should_exit = True
        await task
        sock.close()


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


async def _create_admin_key(tenants: TenantStore) -> str:
    """A fresh admin key of UP_TENANT, after revoking the keys earlier starts created."""
    if await tenants.get_tenant(UP_TENANT) is None:
        await tenants.put_tenant(Tenant(
            name=UP_TENANT, admin=True, max_priority=Priority.CRITICAL, default_priority=Priority.NORMAL,
        ))
    for earlier in await tenants.list_keys(UP_TENANT):
        if earlier.revoked_at is None:
            await tenants.revoke_key(earlier.key_id)
    _, key = await tenants.create_key(UP_TENANT)
    return key


def _url_host(host: str) -> str:
    return f"[{host.strip('[]')}]" if ":" in host else host
