"""Shared pieces of the gateway tests: a real gateway served by uvicorn on a free loopback port,
with the simulated provider, an optional worker on the same queue, and a set of tenants with
their keys."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
import uvicorn
from openai import AsyncOpenAI

from conftest import QueueFactory, factory_for
from support.dispatch import queue_url_of, running_worker, sim_config
from support.waiting import eventually
from tidegate.app.components import Given
from tidegate.app.gateway import open_gateway_state
from tidegate.config import TidegateConfig
from tidegate.coord.relay import ChunkRelay, relay_for
from tidegate.coord.tenants import Tenant, TenantStore
from tidegate.dispatch.metrics import DispatchMetrics
from tidegate.dispatch.worker import WorkerSettings
from tidegate.gateway.app import create_app
from tidegate.gateway.core.http_server import UVICORN_OPTIONS
from tidegate.gateway.core.settings import GatewaySettings
from tidegate.gateway.core.state import GatewayState
from tidegate.jobs import Priority
from tidegate.queue import Queue
from tidegate.simulator.catalogue import legacy_models
from tidegate.simulator.server import Simulator
from tidegate.simulator.settings import SimulatorSettings

TENANTS = (
    Tenant(name="acme", max_priority=Priority.HIGH, default_priority=Priority.NORMAL),
    Tenant(name="globex", max_priority=Priority.HIGH, default_priority=Priority.NORMAL),
    Tenant(name="bulkco", max_priority=Priority.BULK, default_priority=Priority.BULK),
    Tenant(name="slow", rpm=1),
    Tenant(name="narrow", allowed_models=("deepseek-v3.2",)),
    Tenant(name="ops", max_priority=Priority.CRITICAL, admin=True),
)
CHAT = {"model": "auto", "messages": [{"role": "user", "content": "Say hello"}]}


class _Server(uvicorn.Server):
    """uvicorn without its signal handlers: Ctrl-C must still stop pytest, not the test's server."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


@dataclass
class Gateway:
    """A running gateway and what a test talks to it with."""

    state: GatewayState
    url: str  # http://127.0.0.1:PORT
    http: httpx.AsyncClient
    sim: Simulator
    keys: dict[str, str] = field(default_factory=dict)
    worker_metrics: DispatchMetrics | None = None

    @property
    def queue(self) -> Queue:
        """The gateway's queue."""
        return self.state.queue

    def auth(self, tenant: str) -> dict[str, str]:
        """The Authorization header of the tenant's key."""
        return {"Authorization": f"Bearer {self.keys[tenant]}"}

    def openai(self, tenant: str | None = None, *, api_key: str | None = None) -> AsyncOpenAI:
        """The official SDK, unchanged, pointed at the gateway; no retries, so a test sees each
        answer as it is."""
        key = api_key if api_key is not None else self.keys[tenant] if tenant else "unused"
        return AsyncOpenAI(base_url=f"{self.url}/v1", api_key=key, max_retries=0)

    async def depth(self) -> int:
        """Jobs waiting in the queue, over all levels."""
        return (await self.queue.stats()).depth


async def add_tenants(store: TenantStore, tenants: tuple[Tenant, ...] = TENANTS) -> dict[str, str]:
    """Create the tenants with one key each; returns name → key."""
    keys = {}
    for tenant in tenants:
        await store.put_tenant(tenant)
        _, keys[tenant.name] = await store.create_key(tenant.name)
    return keys


@contextlib.asynccontextmanager
async def serving(state: GatewayState) -> AsyncIterator[str]:
    """The gateway app for `state`, served by uvicorn on a free loopback port; yields its URL."""
    # IPPROTO_TCP explicitly: asyncio sets TCP_NODELAY only on sockets that say so, and without it
    # every answer waits out the client's delayed ACK (40 ms).
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = _Server(uvicorn.Config(create_app(state), lifespan="off", log_level="warning",
                                    **UVICORN_OPTIONS))
    task = asyncio.create_task(server.serve(sockets=[sock]))

    def started() -> bool:
        if task.done():
            task.result()  # the server failed to start: raise its error
        return server.started

    try:
        await eventually(started, "uvicorn serves the gateway", every_s=0.005)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task
        sock.close()


@contextlib.asynccontextmanager
async def open_gateway(
    factory: QueueFactory,
    *,
    worker: bool = True,
    worker_streams: bool = True,
    tenants: bool = True,
    settings: GatewaySettings | None = None,
    queue_settings: dict[str, Any] | None = None,
    config_update: dict[str, Any] | None = None,
    provider_update: dict[str, Any] | None = None,
    configure: Callable[[TidegateConfig], TidegateConfig] | None = None,
) -> AsyncIterator[Gateway]:
    """A gateway on the factory's queue, with the simulator and (unless `worker=False`) a worker
    that shares the queue, as separate processes would: its own Queue object, and its own relay
    on Redis (the in-process relay is shared on SQLite, where both run in one process). With
    `worker_streams=False` the worker has no relay, as a worker in another process on SQLite.
    `provider_update` changes the simulator's provider config (its `api`, say); `configure` changes
    the config made for the simulator (its providers, say) last."""
    url = queue_url_of(factory)
    # Fast retries and upkeep, so dead letters and retries happen within a test.
    fast = {"maintenance_interval_s": 0.2, "retry_base_s": 0.02, "retry_max_s": 0.05}
    queue = await factory.open(**{**fast, **(queue_settings or {})})
    sim = Simulator(SimulatorSettings(seed=3, window_s=1.0))
    async with contextlib.AsyncExitStack() as stack:
        base_url = await stack.enter_async_context(sim.running())
        config: TidegateConfig = sim_config(base_url, queue_url=url)
        if provider_update:
            config = config.model_copy(update={"providers": tuple(
                provider.model_copy(update=provider_update) for provider in config.providers)})
        if config_update:
            config = config.model_copy(update=config_update)
        if configure is not None:
            config = configure(config)
        relay = relay_for(url)
        stack.push_async_callback(relay.close)
        metrics = DispatchMetrics()
        # A recommender of its own in memory, so the recommendations API serves too.
        state = await stack.enter_async_context(open_gateway_state(
            config, settings=settings, given=Given(queue=queue, relay=relay),
            extra_registries=[metrics.registry], recs_url="memory://"))
        keys = await add_tenants(state.tenants) if tenants else {}
        if worker:
            worker_relay: ChunkRelay | None = None
            if worker_streams:
                worker_relay = relay if factory.backend == "sqlite" else relay_for(url)
                if worker_relay is not relay:
                    stack.push_async_callback(worker_relay.close)
            worker_queue = await factory.open(**fast)
            await stack.enter_async_context(running_worker(
                worker_queue, config, WorkerSettings(concurrency=8, lease_s=5.0, claim_wait_s=0.1),
                relay=worker_relay, metrics=metrics))
        gateway_url = await stack.enter_async_context(serving(state))
        http = await stack.enter_async_context(httpx.AsyncClient(base_url=gateway_url, timeout=20.0))
        yield Gateway(state, gateway_url, http, sim, keys, metrics if worker else None)


@contextlib.asynccontextmanager
async def module_gateway(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
                         **options: Any) -> AsyncIterator[Gateway]:
    """`open_gateway(**options)` for a module-scoped fixture parametrized over the backends
    (`request.param`), on a queue of its own (conftest.factory_for)."""
    async with (factory_for(request, tmp_path_factory.mktemp("gateway")) as factory,
                open_gateway(factory, **options) as gateway):
        yield gateway


def with_legacy_models(config: TidegateConfig) -> TidegateConfig:
    """`config` with OpenAI's legacy completion and moderation models on each of its providers,
    so the gateway offers /v1/completions and /v1/moderations (`open_gateway(configure=...)`)."""
    return config.model_copy(update={"providers": tuple(
        provider.model_copy(update={"models": (*provider.models, *legacy_models())})
        for provider in config.providers)})


def three_providers(config: TidegateConfig, responses_model: str = "gpt-4.1",
                    messages_model: str = "claude-sonnet-4.5") -> TidegateConfig:
    """The simulator as three providers (`open_gateway(configure=...)`): `sim-responses` serves
    `responses_model` and speaks the Responses API natively, `sim-messages` serves
    `messages_model` over Anthropic's Messages API, and `sim` every other model over chat only."""
    [sim] = config.providers
    models = {model.name: model for model in sim.models}
    responses = sim.model_copy(update={"name": "sim-responses", "native_apis": ("responses",),
                                       "models": (models[responses_model],)})
    messages = sim.model_copy(update={"name": "sim-messages", "api": "anthropic",
                                      "models": (models[messages_model],)})
    chat = sim.model_copy(update={"models": tuple(model for name, model in models.items()
                                                  if name not in (responses_model, messages_model))})
    return config.model_copy(update={"providers": (responses, messages, chat)})
