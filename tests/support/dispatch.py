"""Shared pieces of the dispatch tests: a simulator on loopback, configs pointing at it, and a
worker running in the background of a test."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from support.redis_keys import REDIS_BACKENDS
from support.waiting import eventually
from tidegate.app.components import Given, open_worker_parts
from tidegate.config import BudgetConfig, ProviderConfig, RoutingConfig, TidegateConfig
from tidegate.dispatch.callbacks import CallbackSender
from tidegate.dispatch.metrics import DispatchMetrics
from tidegate.dispatch.worker import Worker, WorkerSettings
from tidegate.jobs import Job
from tidegate.queue import Queue
from tidegate.simulator.catalogue import default_models

PROVIDER = "sim"


def sim_config(
    base_url: str,
    *,
    queue_url: str = "sqlite:///unused.db",
    budgets: BudgetConfig | None = None,
    api_key_env: str | None = None,
    model_overrides: dict[str, dict[str, Any]] | None = None,
) -> TidegateConfig:
    """A config whose one provider is the simulator at `base_url`, serving the price table."""
    overrides = model_overrides or {}
    models = tuple(model.model_copy(update=overrides.get(model.name, {})) for model in default_models())
    provider = ProviderConfig(name=PROVIDER, base_url=base_url, api_key_env=api_key_env, models=models)
    return TidegateConfig(
        queue_url=queue_url,
        providers=(provider,),
        routing=RoutingConfig(),
        budgets=budgets or BudgetConfig(),
    )


def chat(text: str = "Say hello", **body: Any) -> dict[str, Any]:
    """An AI job payload for a chat completion."""
    return {"kind": "chat", "body": {"messages": [{"role": "user", "content": text}], **body}}


@contextlib.asynccontextmanager
async def running_worker(
    queue: Queue,
    config: TidegateConfig,
    settings: WorkerSettings | None = None,
    *,
    metrics: DispatchMetrics | None = None,
    **given: Any,
) -> AsyncIterator[Worker]:
    """A worker serving `queue` in the background until the block ends (then stopped gracefully),
    on parts opened as a worker process opens them (`open_worker_parts`); `given` names the parts
    the test shares with it (relay, tenants, ledger, callbacks, pacing: see `Given`)."""
    settings = settings or WorkerSettings(concurrency=8, lease_s=5.0, claim_wait_s=0.2)
    async with (open_worker_parts(config, queue, Given(**given)) as parts,
                Worker(parts, config, settings, metrics=metrics or DispatchMetrics()) as worker):
        task = asyncio.create_task(worker.run())
        try:
            yield worker
        finally:
            worker.request_stop()
            await task


def queue_url_of(factory: Any) -> str:
    """The URL a separate component (ledger, limiter, worker process) uses for the test's queue."""
    if factory.backend in REDIS_BACKENDS:
        return f"{factory.url}?name={factory.queue_name}"
    return str(factory.url)


async def wait_received(sim: Any, count: int, timeout_s: float = 20.0) -> None:
    """Until the simulator has received `count` requests in all."""
    await eventually(lambda: sum(stats.received for stats in sim.stats().values()),
                     f"the simulator has received {count} requests", until=lambda received: received >= count,
                     timeout_s=timeout_s)


async def wait_final(queue: Queue, job_ids: list[str], timeout_s: float = 20.0) -> list[Job]:
    """Every job once final (or as it is at the timeout)."""
    return list(await asyncio.gather(*(queue.wait(job_id, timeout_s) for job_id in job_ids)))


__all__ = ["PROVIDER", "CallbackSender", "chat", "queue_url_of", "running_worker", "sim_config",
           "wait_final", "wait_received"]
