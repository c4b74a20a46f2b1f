"""Running a worker process: open its parts (`Components`) and the worker, stop gracefully on
SIGTERM/SIGINT."""

from __future__ import annotations

import contextlib
import logging
import os

from tidegate._shutdown import stop_on_signals
from tidegate._urls import redact_url
from tidegate.app.components import Components
from tidegate.config import TidegateConfig
from tidegate.dispatch.metrics import DispatchMetrics
from tidegate.dispatch.worker import Worker, WorkerSettings
from tidegate.errors import ConfigError
from tidegate.tracing import configured

log = logging.getLogger("tidegate.worker")


class _Stops:
    """The stop signals of a process whose worker does not exist yet: a stop that arrives while
    the parts are being opened is kept and handed to the worker once it does, so a stop during
    the start is a graceful one too."""

    def __init__(self) -> None:
        self.worker: Worker | None = None
        self._requested = self._forced = False

    def request_stop(self) -> None:
        """The first signal: a graceful stop."""
        self._requested = True
        if self.worker is not None:
            self.worker.request_stop()

    def force_stop(self) -> None:
        """A later signal: release in-flight jobs now."""
        self._forced = True
        if self.worker is not None:
            self.worker.force_stop()

    def attach(self, worker: Worker) -> None:
        """From now on stops go to `worker`, starting with any that came before."""
        self.worker = worker
        if self._forced:
            worker.force_stop()
        elif self._requested:
            worker.request_stop()


async def run_worker(
    config: TidegateConfig, settings: WorkerSettings, *, metrics: DispatchMetrics | None = None
) -> None:
    """Serve the queue until SIGTERM or SIGINT, then drain and return."""
    if not config.providers:
        raise ConfigError(
            "no provider is configured: add [[providers]] to tidegate.toml, "
            "or point the worker at a simulator with --simulator-url"
        )
    if not os.environ.get(config.callbacks.secret_env):
        log.warning("%s is not set: results will not be sent to callback URLs", config.callbacks.secret_env)
    stops = _Stops()
    # Signals are handled from here on, so a stop during the start is a graceful one too.
    with stop_on_signals(stops.request_stop, force=stops.force_stop, grace_s=settings.shutdown_grace_s):
        async with contextlib.AsyncExitStack() as stack:
            stack.enter_context(configured(config.tracing))  # exported last, after the worker stopped
            # Each part closes after the worker that uses it, each close bounded.
            # A ledger always, so spend is tracked per tenant and model even where no budget is set.
            parts = await stack.enter_async_context(Components.open(config, worker=True))
            worker = Worker(parts.for_worker(), config, settings, metrics=metrics)
            stops.attach(worker)
            await stack.enter_async_context(worker)
            log.info("worker %s serving %s", worker.worker_id, redact_url(config.queue_url))
            await worker.run()
    log.info("worker %s stopped", worker.worker_id)
