"""Streamed answers: the worker relays the provider's chunks as they arrive, per job, to whoever
subscribes (the gateway), in one process or across processes through Redis."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest

from conftest import QueueFactory
from support.dispatch import chat, queue_url_of, running_worker, sim_config, wait_final
from tidegate.coord.relay import ChunkRelay, relay_for
from tidegate.jobs import JobState
from tidegate.queue import Queue
from tidegate.simulator.server import InjectedFault, Simulator
from tidegate.simulator.settings import SimulatorSettings


@pytest.fixture
async def simulator() -> AsyncIterator[tuple[Simulator, str]]:
    sim = Simulator(SimulatorSettings(
        seed=4, defaults={"ttft_ms": 50, "inter_token_ms": 15, "completion_tokens": 20,
                          "completion_tokens_p99": 30}))
    async with sim.running() as base_url:
        yield sim, base_url


@pytest.fixture
async def relay(queue_factory: QueueFactory) -> AsyncIterator[ChunkRelay]:
    # The relay the backend implies: Redis Streams for a Redis queue, memory for SQLite.
    channel = relay_for(queue_url_of(queue_factory))
    yield channel
    await channel.close()


@pytest.fixture
async def queue(queue_factory: QueueFactory) -> Queue:
    return await queue_factory.open(maintenance_interval_s=0.2, retry_base_s=0.05, retry_max_s=0.1)


async def _collect(relay: ChunkRelay, job_id: str) -> list[tuple[float, dict[str, Any]]]:
    return [(time.monotonic(), orjson.loads(chunk))
            async for chunk in relay.subscribe(job_id, timeout_s=10)]


async def test_chunks_reach_the_subscriber_as_they_arrive_and_the_result_holds_the_whole_answer(
    queue: Queue, relay: ChunkRelay, simulator: tuple[Simulator, str]
) -> None:
    _, base_url = simulator
    job_id = await queue.enqueue(chat(model="deepseek-v3.2", stream=True))
    async with running_worker(queue, sim_config(base_url), relay=relay):
        chunks = await _collect(relay, job_id)
        [job] = await wait_final(queue, [job_id])
    assert job.state is JobState.SUCCEEDED, job.errors
    deltas = [c["choices"][0]["delta"].get("content", "") for _, c in chunks if c.get("choices")]
    text = "".join(str(d) for d in deltas)
    assert text and text == job.result["response"]["choices"][0]["message"]["content"]
    # Spread over time, not delivered at once at the end
    assert chunks[-1][0] - chunks[0][0] > 0.1
    assert job.result["ttft_ms"] > 0
    assert job.result["usage"]["completion_tokens"] > 0


async def test_a_failure_before_the_first_chunk_is_retried_into_the_same_stream(
    queue: Queue, relay: ChunkRelay, simulator: tuple[Simulator, str]
) -> None:
    sim, base_url = simulator
    sim.inject("deepseek-v3.2", InjectedFault("unavailable"))
    job_id = await queue.enqueue(chat(model="deepseek-v3.2", stream=True))
    async with running_worker(queue, sim_config(base_url), relay=relay):
        chunks = await _collect(relay, job_id)
        [job] = await wait_final(queue, [job_id])
    assert job.state is JobState.SUCCEEDED and job.attempts == 2
    assert not any("error" in chunk for _, chunk in chunks)


async def test_a_failure_mid_stream_ends_the_stream_with_an_error_and_is_not_retried(
    queue: Queue, relay: ChunkRelay, simulator: tuple[Simulator, str]
) -> None:
    sim, base_url = simulator
    sim.inject("deepseek-v3.2", InjectedFault("reset"))
    job_id = await queue.enqueue(chat(model="deepseek-v3.2", stream=True), max_attempts=3)
    async with running_worker(queue, sim_config(base_url), relay=relay):
        chunks = await asyncio.wait_for(_collect(relay, job_id), 15)
        [job] = await wait_final(queue, [job_id])
    assert "error" in chunks[-1][1]
    assert job.state is JobState.DEAD and job.attempts == 1
    assert "chunks" in (job.last_error or "")
