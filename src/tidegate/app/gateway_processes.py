"""`tidegate gateway --processes N`: N gateway processes on one port, one per core.

A gateway process runs one event loop, so it uses one core at most. Here the command's own
process becomes a supervisor: it starts N gateway processes (spawned, so none inherits another's
loop or threads), each binding the port with SO_REUSEPORT, and the kernel spreads the incoming
connections among them. Nothing is shared between them but the queue and the coordination state,
as between gateways on different machines.

The supervisor passes SIGTERM and SIGINT on to every gateway (a second signal forces them, as it
does one gateway) and waits for them to drain, within the grace and the hard-stop margin; past
that it kills what is left. A gateway that ends on its own (a crash, a port it could not bind)
stops the others: the supervisor exits with status 1 for whatever restarts it, rather than serve
on with fewer processes than it was asked for.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import signal
import time
from collections.abc import Sequence
from multiprocessing.connection import wait
from multiprocessing.process import BaseProcess
from types import FrameType

from tidegate._shutdown import HARD_STOP_MARGIN_S, STOP_SIGNALS
from tidegate.config import GatewaySettings, TidegateConfig
from tidegate.errors import ConfigError

__all__ = ["serve_gateways"]

log = logging.getLogger("tidegate.app.gateway")

POLL_S = 0.5  # how often the supervisor looks at its gateways besides their exits


def serve_gateways(config: TidegateConfig, settings: GatewaySettings, *, processes: int, grace_s: float,
                   log_level: int = logging.INFO) -> int:
    """Run `processes` gateways on `settings.port` until SIGTERM or SIGINT (see the module
    docstring); returns the exit status: 0 when every gateway stopped cleanly after a signal."""
    if processes < 1:
        raise ConfigError(f"--processes must be at least 1, got {processes}")
    if settings.port == 0:
        raise ConfigError("several gateway processes share one port: give it with --port (not 0)")
    spawn = multiprocessing.get_context("spawn")
    gateways = [spawn.Process(target=_serve_one, args=(config, settings, grace_s, log_level),
                              name=f"tidegate-gateway-{number}") for number in range(1, processes + 1)]
    signals: list[int] = []

    def forward(signum: int, _frame: FrameType | None) -> None:
        signals.append(signum)
        _signal_all(gateways, signum)

    previous = {sig: signal.signal(sig, forward) for sig in STOP_SIGNALS}
    try:
        for gateway in gateways:
            gateway.start()
        log.info("%d gateway processes serving %s:%d", processes, settings.host, settings.port)
        crashed = _supervise(gateways, signals, grace_s)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    clean = not crashed and all(gateway.exitcode == 0 for gateway in gateways)
    return 0 if clean else 1


def _supervise(gateways: Sequence[BaseProcess], signals: list[int], grace_s: float) -> bool:
    """Wait for every gateway to end; True if one ended before any signal asked it to."""
    crashed = False
    deadline: float | None = None
    while any(gateway.is_alive() for gateway in gateways):
        wait([gateway.sentinel for gateway in gateways if gateway.is_alive()], timeout=POLL_S)
        if not signals and not crashed and any(gateway.exitcode is not None for gateway in gateways):
            ended = [gateway for gateway in gateways if gateway.exitcode is not None]
            log.error("gateway process %s ended with status %s: stopping the others",
                      ended[0].name, ended[0].exitcode)
            crashed = True
            _signal_all(gateways, signal.SIGTERM)
        if (signals or crashed) and deadline is None:
            deadline = time.monotonic() + grace_s + HARD_STOP_MARGIN_S
        if deadline is not None and time.monotonic() > deadline:
            log.error("gateway processes still running %.0fs after the stop: killing them",
                      grace_s + HARD_STOP_MARGIN_S)
            _signal_all(gateways, signal.SIGKILL)
            deadline = float("inf")
    return crashed


def _signal_all(gateways: Sequence[BaseProcess], signum: int) -> None:
    for gateway in gateways:
        if gateway.pid is not None and gateway.exitcode is None:
            with contextlib.suppress(ProcessLookupError):  # it has just ended
                os.kill(gateway.pid, signum)


def _serve_one(config: TidegateConfig, settings: GatewaySettings, grace_s: float, log_level: int) -> None:
    """One gateway process: the port shared with its siblings."""
    from tidegate._eventloop import run
    from tidegate.app.gateway import serve_gateway

    # Out of the terminal's process group: a Ctrl-C reaches the supervisor alone, which passes it
    # on once (reaching a gateway twice, it would skip the grace).
    os.setpgrp()
    logging.basicConfig(level=log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    run(serve_gateway(config, settings, grace_s=grace_s, reuse_port=True))
