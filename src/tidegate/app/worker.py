"""Running a worker process: open the queue and the worker, stop gracefully on SIGTERM/SIGINT."""

from __future__ import annotations

import contextlib
import logging
import os

from tidegate._shutdown import close_bounded, enter_bounded, stop_on_signals
from tidegate._urls import redact_url
from tidegate.config import TidegateConfig
from tidegate.coord.budget import budget_ledger_for
from tidegate.coord.relay import relay_for
from tidegate.coord.tenants import tenant_store_for
from tidegate.dispatch.callbacks import CallbackSender
from tidegate.dispatch.metrics import DispatchMetrics
from tidegate.dispatch.worker import Worker, WorkerSettings
from tidegate.errors import ConfigError
from tidegate.queue import Queue

log = logging.getLogger("tidegate.worker")


async def run_worker(
    config: TidegateConfig, settings: WorkerSettings, *, metrics: DispatchMetrics | None = None
) -> None:
    """Serve the queue until SIGTERM or SIGINT, then drain and return."""
    if not config.providers:
        raise ConfigError(
            "no provider is configured: add [[providers]] to tidegate.toml, "
            "or point the worker at a simulator with --simulator-url"
        )
    secret = os.environ.get(config.callbacks.secret_env)
    if not secret:
        log.warning("%s is not set: results will not be sent to callback URLs", config.callbacks.secret_env)
    queue = Queue.from_url(config.queue_url)
    callbacks = CallbackSender(config.callbacks, secret.encode()) if secret else None
    relay = relay_for(config.queue_url)
    tenants = tenant_store_for(config.queue_url)
    # A ledger always, so spend is tracked per tenant and model even where no budget is set.
    ledger = budget_ledger_for(config.queue_url)
    worker = Worker(queue, config, settings, metrics=metrics, callbacks=callbacks, relay=relay,
                    tenants=tenants, ledger=ledger)
    # Signals are handled from here on, so a stop during the start is a graceful one too.
    with stop_on_signals(worker.request_stop, force=worker.force_stop, grace_s=settings.shutdown_grace_s):
        async with contextlib.AsyncExitStack() as stack:
            # Each part closes after the worker that uses it, each close bounded.
            await enter_bounded(stack, queue, "the queue")
            if callbacks is not None:
                await enter_bounded(stack, callbacks, "the callback sender")
            close_bounded(stack, relay.close, "the relay")
            await enter_bounded(stack, tenants, "the tenant store")
            await enter_bounded(stack, ledger, "the budget ledger")
            await stack.enter_async_context(worker)
            log.info("worker %s serving %s", worker.worker_id, redact_url(config.queue_url))
            await worker.run()
    log.info("worker %s stopped", worker.worker_id)
