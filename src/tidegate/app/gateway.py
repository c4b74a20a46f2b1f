"""Running a gateway process: open its state, refuse an unsafe bind, serve with uvicorn until
SIGTERM or SIGINT."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import socket
from collections.abc import Iterator, Sequence

import uvicorn
from prometheus_client import CollectorRegistry

from tidegate._shutdown import enter_bounded, stop_on_signals
from tidegate._urls import redact_url
from tidegate.config import TidegateConfig
from tidegate.errors import ConfigError
from tidegate.gateway.app import create_app
from tidegate.gateway.http_server import UVICORN_OPTIONS
from tidegate.gateway.settings import GatewaySettings, is_loopback_host
from tidegate.gateway.state import GatewayState

__all__ = ["GRACE_S", "GatewayServer", "check_bind", "serve_gateway"]

log = logging.getLogger("tidegate.gateway")

GRACE_S = 30.0  # how long open requests may finish on SIGTERM before their connections are cut


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
        self.ready.set()

    async def main_loop(self) -> None:
        try:
            await super().main_loop()
        finally:
            self.main_loop_done.set()


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
) -> None:
    """Serve the gateway on `settings.host:port` until SIGTERM or SIGINT; then stop accepting,
    give open requests up to `grace_s` to finish, close the state and return."""
    async with contextlib.AsyncExitStack() as stack:
        state = await enter_bounded(
            stack, GatewayState.open(config, settings=settings, extra_registries=extra_registries),
            "the gateway's state")
        await check_bind(state)
        app = create_app(state)
        # The state is opened and closed here, around the server: no ASGI lifespan is needed.
        server = GatewayServer(uvicorn.Config(app, host=settings.host, port=settings.port, lifespan="off",
                                              log_level="info", timeout_graceful_shutdown=math.ceil(grace_s),
                                              **UVICORN_OPTIONS))
        log.info("gateway serving %s on %s:%d", redact_url(config.queue_url), settings.host, settings.port)
        def stop() -> None:
            state.begin_drain(grace_s)
            server.request_exit()

        with stop_on_signals(stop, force=server.force, grace_s=grace_s):
            await server.serve()
        log.info("gateway stopped")
