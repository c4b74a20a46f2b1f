"""Running a gateway process: open its state (`open_gateway_state`, on `Components`), refuse an
unsafe bind, serve with uvicorn until SIGTERM or SIGINT."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import socket
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import TYPE_CHECKING, Final

import uvicorn
from prometheus_client import CollectorRegistry

from tidegate._redis import is_redis_url
from tidegate._shutdown import enter_bounded, stop_on_signals
from tidegate._urls import redact_url
from tidegate.app.components import NOTHING_GIVEN, Components, Given
from tidegate.app.ports import bind_port
from tidegate.config import TidegateConfig
from tidegate.errors import ConfigError
from tidegate.gateway.app import create_app
from tidegate.gateway.batches.sweep import sweeping
from tidegate.gateway.core.http_server import UVICORN_OPTIONS
from tidegate.gateway.core.metrics import GatewayMetrics
from tidegate.gateway.core.settings import GatewaySettings, is_loopback_host
from tidegate.gateway.core.state import GatewayState
from tidegate.tracing import configured

if TYPE_CHECKING:
    from tidegate.recs.monitor import RecsMonitor

__all__ = ["FROM_CONFIG", "GRACE_S", "GatewayServer", "check_bind", "gateway_state", "open_gateway_state",
           "reusable_socket", "serve_gateway"]

log = logging.getLogger("tidegate.gateway")

GRACE_S = 30.0  # how long open requests may finish on SIGTERM before their connections are cut


class _FromConfig:
    def __repr__(self) -> str:
        return "FROM_CONFIG"


FROM_CONFIG: Final = _FromConfig()
"""`recs_url` not given: the change flow's cache when it is shared (Redis), else no recommender."""


def gateway_state(
    parts: Components,
    *,
    settings: GatewaySettings | None = None,
    metrics: GatewayMetrics | None = None,
    extra_registries: Sequence[CollectorRegistry] = (),
    recs_monitor: RecsMonitor | None = None,
) -> GatewayState:
    """The state a gateway serves from, around opened parts (a rate limiter and a batch store
    among them)."""
    if parts.limiter is None or parts.batches is None:
        raise ValueError("a gateway needs its rate limiter and batch store: open the parts with gateway=True")
    return GatewayState(config=parts.config, settings=settings or parts.config.gateway, queue=parts.queue,
                        tenants=parts.tenants, limiter=parts.limiter, ledger=parts.ledger, relay=parts.relay,
                        batches=parts.batches, provider_batches=parts.provider_batches,
                        metrics=metrics or GatewayMetrics(),
                        extra_registries=tuple(extra_registries),
                        recommender=parts.recommender, recs_monitor=recs_monitor)


@contextlib.asynccontextmanager
async def open_gateway_state(
    config: TidegateConfig,
    *,
    settings: GatewaySettings | None = None,
    given: Given = NOTHING_GIVEN,
    extra_registries: Sequence[CollectorRegistry] = (),
    recs_url: str | _FromConfig | None = FROM_CONFIG,
    recs_monitor: RecsMonitor | None = None,
) -> AsyncIterator[GatewayState]:
    """A gateway's state: the parts `given`, the others opened from `config.queue_url` (see
    `Components.open`) and closed on exit; its batch sweep (tidegate.gateway.batches.sweep) runs
    meanwhile.

    A relay must be shared with the workers: on SQLite (in-process MemoryRelay) give the
    workers' relay, or streamed chunks never reach this gateway.

    The recommender, when not given, is opened on the store at `recs_url` (None: none). By
    default that is the change flow's cache (`sync.cache_url`, with its prefix) when it is on
    Redis, where the change flow's sink and every gateway share it; a memory cache lives in
    another process's memory, so a gateway on its own serves no recommendations."""
    recs = _recs_url(config, recs_url)
    async with Components.open(config, gateway=True, recs_url=recs, given=given) as parts:
        state = gateway_state(parts, settings=settings, extra_registries=extra_registries,
                              recs_monitor=recs_monitor)
        async with sweeping(state):
            yield state


def _recs_url(config: TidegateConfig, given: str | _FromConfig | None) -> str | None:
    if not isinstance(given, _FromConfig):
        return given
    cache_url = config.sync.cache_url
    return cache_url if is_redis_url(cache_url) else None


class GatewayServer(uvicorn.Server):
    """uvicorn that leaves SIGTERM and SIGINT to the process (`tidegate._shutdown`), and tells
    when it has started and when its main loop has ended.

    uvicorn's own handling re-raises the signal once it has shut down, which ends the process
    right there: nothing after the server (a worker's drain, the state's close) would run and
    the exit status would say "killed" instead of 0. The process's handler sets `should_exit`
    (first signal) or `force_exit` (second) instead."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.ready = asyncio.Event()
        self.main_loop_done = asyncio.Event()

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield

    def request_exit(self) -> None:
        """Stop accepting, let open requests finish within the graceful-shutdown timeout."""
        self.should_exit = True

    def force(self) -> None:
        """Close open connections now."""
        self.should_exit = self.force_exit = True

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        if sockets and self.started:
            # uvicorn names the address it serves only on a socket it bound itself; these are
            # bound before (tidegate.app.ports), and operators' scripts and tests read the line.
            host, port = sockets[0].getsockname()[:2]
            logging.getLogger("uvicorn.error").info(
                "Uvicorn running on http://%s:%d (Press CTRL+C to quit)",
                f"[{host}]" if ":" in host else host, port)
        self.ready.set()

    async def main_loop(self) -> None:
        try:
            await super().main_loop()
        finally:
            self.main_loop_done.set()


def reusable_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to `host:port` that other processes may bind too (SO_REUSEPORT); a
    ConfigError when it cannot be bound (see tidegate.app.ports.bind_port)."""
    return bind_port(host, port, reuse_port=True)


async def check_bind(state: GatewayState) -> None:
    """Refuse to listen beyond loopback while no API key exists: anyone who can reach the port
    could otherwise spend the providers' budget. (On such a bind a key is always required, so
    without one the gateway could serve nobody anyway.)"""
    host = state.settings.host
    if is_loopback_host(host):
        return
    keys = [key for key in await state.tenants.list_keys() if key.revoked_at is None]
    if not keys:
        raise ConfigError(
            f"refusing to listen on {host!r} without any API key: create a tenant and a key first "
            "(`tidegate tenants put NAME` then `tidegate keys create NAME`), or bind 127.0.0.1"
        )


async def serve_gateway(
    config: TidegateConfig,
    settings: GatewaySettings,
    *,
    extra_registries: Sequence[CollectorRegistry] = (),
    grace_s: float = GRACE_S,
    reuse_port: bool = False,
) -> None:
    """Serve the gateway on `settings.host:port` until SIGTERM or SIGINT; then stop accepting,
    give open requests up to `grace_s` to finish, close the state and return. With `reuse_port`
    the port may be shared with other gateway processes, the kernel spreading connections among
    them (SO_REUSEPORT; see tidegate.app.gateway_processes). The port is bound first: a busy
    one is a ConfigError naming its likely owner before anything is opened."""
    async with contextlib.AsyncExitStack() as stack:
        sock = bind_port(settings.host, settings.port, reuse_port=reuse_port)
        stack.callback(sock.close)
        state = await enter_bounded(
            stack, open_gateway_state(config, settings=settings, extra_registries=extra_registries),
            "the gateway's state")
        await check_bind(state)
        stack.enter_context(configured(config.tracing))  # before the app: it adds its server spans
        app = create_app(state)
        # The state is opened and closed here, around the server: no ASGI lifespan is needed.
        server = GatewayServer(uvicorn.Config(app, host=settings.host, port=settings.port, lifespan="off",
                                              log_level="info", access_log=settings.access_log,
                                              timeout_graceful_shutdown=math.ceil(grace_s),
                                              **UVICORN_OPTIONS))
        log.info("gateway serving %s on %s:%d", redact_url(config.queue_url), settings.host,
                 sock.getsockname()[1])
        def stop() -> None:
            state.begin_drain(grace_s)
            server.request_exit()

        with stop_on_signals(stop, force=server.force, grace_s=grace_s):
            await server.serve(sockets=[sock])
        log.info("gateway stopped")
