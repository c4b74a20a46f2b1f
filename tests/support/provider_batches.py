"""Shared pieces of the provider-batch tests: a config whose provider sends BULK jobs with a long
deadline to its own batch API, such jobs, and a gateway whose in-process worker does so."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import httpx

from conftest import QueueFactory
from support.dispatch import chat, queue_url_of, running_worker, sim_config
from support.gateway import Gateway, add_tenants, serving
from support.waiting import eventually
from tidegate.app.components import Given
from tidegate.app.gateway import open_gateway_state
from tidegate.config import BudgetConfig, ProviderBatchConfig, TidegateConfig
from tidegate.dispatch.worker import WorkerSettings
from tidegate.jobs import Job
from tidegate.queue import Queue
from tidegate.simulator.server import Simulator
from tidegate.simulator.settings import SimulatorSettings

__all__ = ["TWO_DAYS_S", "batch_config", "bulk_jobs", "gateway_sending_batches", "waiting_in_a_batch"]

TWO_DAYS_S = 48 * 3600.0


def batch_config(base_url: str, queue_url: str, *, budgets: BudgetConfig | None = None,
                 api: str = "openai") -> TidegateConfig:
    """The simulator as the one provider (called through its `api`), its batch API used with
    short gather and poll times; `queue_url` is where the workers keep the provider batches (and
    the budget ledger)."""
    config = sim_config(base_url, queue_url=queue_url, budgets=budgets)
    kinds = ("chat",) if api == "anthropic" else ("chat", "embeddings")
    batch = ProviderBatchConfig(gather_s=0.3, poll_s=0.2, kinds=kinds)
    providers = tuple(provider.model_copy(update={"batch": batch, "api": api})
                      for provider in config.providers)
    return config.model_copy(update={"providers": providers})


async def bulk_jobs(queue: Queue, count: int, **options: Any) -> list[str]:
    """`count` BULK chat jobs with a deadline two days away: what goes to a provider batch."""
    return await queue.enqueue_many(
        {"payload": chat(f"Summarise item {n}", max_tokens=40), "priority": "bulk",
         "timeout_s": TWO_DAYS_S, **options} for n in range(count))


async def waiting_in_a_batch(queue: Queue, ids: list[str]) -> None:
    """Return once every job of `ids` was released to wait in its provider batch."""
    async def jobs() -> list[Job | None]:
        return [await queue.get(job_id) for job_id in ids]

    await eventually(jobs, "every job waits in a provider batch", until=lambda jobs: all(
        job is not None and (job.last_error or "").startswith("waiting in provider batch") for job in jobs))


@contextlib.asynccontextmanager
async def gateway_sending_batches(factory: QueueFactory, *, batch_latency_s: float = 1.0, worker: bool = True,
                                  tenants: bool = True) -> AsyncIterator[Gateway]:
    """A gateway on the factory's queue whose provider (the simulator, its batches ending after
    `batch_latency_s`) has a `batch` section, with a worker in the process (unless `worker=False`)."""
    fast = {"maintenance_interval_s": 0.2, "retry_base_s": 0.02, "retry_max_s": 0.05}
    sim = Simulator(SimulatorSettings(seed=11, batch_latency_s=batch_latency_s))
    async with contextlib.AsyncExitStack() as stack:
        base_url = await stack.enter_async_context(sim.running())
        config = batch_config(base_url, queue_url_of(factory))
        state = await stack.enter_async_context(open_gateway_state(
            config, given=Given(queue=await factory.open(**fast))))
        keys = await add_tenants(state.tenants) if tenants else {}
        if worker:
            await stack.enter_async_context(running_worker(
                await factory.open(**fast), config,
                WorkerSettings(concurrency=8, lease_s=5.0, claim_wait_s=0.1)))
        url = await stack.enter_async_context(serving(state))
        http = await stack.enter_async_context(httpx.AsyncClient(base_url=url, timeout=20.0))
        yield Gateway(state, url, http, sim, keys)
