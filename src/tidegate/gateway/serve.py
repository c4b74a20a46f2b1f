"""Running a gateway process: open its state, refuse an unsafe bind, serve with uvicorn until
SIGTERM or SIGINT."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Iterator, Sequence

import uvicorn
from prometheus_client import CollectorRegistry

from tidegate.config import TidegateConfig
from tidegate.errors import ConfigError
from tidegate.gateway.app import create_app
from tidegate.gateway.http_server import UVICORN_OPTIONS
from tidegate.gateway.settings import GatewaySettings, is_loopback_host
from tidegate.gateway.state import GatewayState
from tidegate.queue.base import redact_url

__all__ = ["check_bind", "serve_gateway"]

log = logging.getLogger("tidegate.gateway")

_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class _Server(uvicorn.Server):
    """uvicorn that returns after its graceful shutdown on SIGTERM or SIGINT.

    uvicorn's own handling re-raises the signal once it has shut down, which ends the process
    right there: the gateway's state is never closed and the exit status says "killed" instead
    of 0, as `tidegate worker` gives after its drain."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        loop = asyncio.get_running_loop()
        for sig in _STOP_SIGNALS:
            # handle_exit: the first signal starts the graceful shutdown, a second SIGINT forces it.
            loop.add_signal_handler(sig, self.handle_exit, sig, None)
        try:
            yield
        finally:
            for sig in _STOP_SIGNALS:
                loop.remove_signal_handler(sig)


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
) -> None:
    """Serve the gateway on `settings.host:port` until SIGTERM or SIGINT."""
    async with GatewayState.open(config, settings=settings, extra_registries=extra_registries) as state:
        await check_bind(state)
        app = create_app(state)
        # The state is opened and closed here, around the server: no ASGI lifespan is needed.
        server = _Server(uvicorn.Config(app, host=settings.host, port=settings.port,
                                        lifespan="off", log_level="info", **UVICORN_OPTIONS))
        log.info("gateway serving %s on %s:%d", redact_url(config.queue_url), settings.host, settings.port)
        await server.serve()
