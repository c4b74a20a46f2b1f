"""`tidegate worker` stopped by SIGTERM or SIGINT with calls in flight, on SQLite and Redis:
it exits 0 within its grace (plus a margin), and every job it held has either finished or
gone back to the queue with its attempt given back — nothing is left leased."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from conftest import QueueFactory
from support.dispatch import chat, queue_url_of, wait_received
from support.faults import MARGIN_S, provider_config, tidegate
from tidegate.jobs import JobState
from tidegate.simulator.server import Simulator
from tidegate.simulator.settings import SimulatorSettings

SIGNALS = [signal.SIGTERM, signal.SIGINT]


@pytest.mark.parametrize("sig", SIGNALS, ids=lambda sig: sig.name)
async def test_calls_longer_than_the_grace_are_released_with_their_attempt_given_back(
    queue_factory: QueueFactory, tmp_path: Path, sig: signal.Signals
) -> None:
    # Given a worker with 100 calls of 30 s in flight and a grace of 2 s
    grace_s = 2.0
    sim = Simulator(SimulatorSettings(seed=1, defaults={"latency_ms": 30_000}))
    async with sim.running() as base_url:
        queue = await queue_factory.open(maintenance_interval_s=None)
        ids = await queue.enqueue_many({"payload": chat(model="deepseek-v3.2")} for _ in range(100))
        async with tidegate("worker", "--queue", queue_url_of(queue_factory),
                            "--config", str(provider_config(tmp_path, base_url)),
                            "--concurrency", "100", "--grace-s", str(grace_s)) as worker:
            await wait_received(sim, 100, timeout_s=30)

            # When it is told to stop
            stopped = time.monotonic()
            worker.send(sig)
            status = await worker.exited(grace_s + MARGIN_S)

        # Then it exits 0 within the grace, every job back in the queue, its attempt uncounted
        assert status == 0, worker.output
        assert time.monotonic() - stopped < grace_s + MARGIN_S
        jobs = [await queue.get(job_id) for job_id in ids]
    assert all(job is not None for job in jobs)
    assert {job.state for job in jobs if job is not None} == {JobState.QUEUED}
    assert all(job.attempts == 0 for job in jobs if job is not None)
    assert (await queue.stats()).in_flight == 0
    assert "Traceback" not in worker.output


@pytest.mark.parametrize("sig", SIGNALS, ids=lambda sig: sig.name)
async def test_calls_within_the_grace_finish_before_the_worker_exits(
    queue_factory: QueueFactory, tmp_path: Path, sig: signal.Signals
) -> None:
    # Given 8 calls of 1.5 s in flight and a grace of 10 s, and more work waiting
    sim = Simulator(SimulatorSettings(seed=2, defaults={"latency_ms": 1_500}))
    async with sim.running() as base_url:
        queue = await queue_factory.open(maintenance_interval_s=None)
        ids = await queue.enqueue_many({"payload": chat(model="deepseek-v3.2")} for _ in range(20))
        async with tidegate("worker", "--queue", queue_url_of(queue_factory),
                            "--config", str(provider_config(tmp_path, base_url)),
                            "--concurrency", "8", "--grace-s", "10") as worker:
            await wait_received(sim, 8, timeout_s=30)
            worker.send(sig)
            status = await worker.exited(10 + MARGIN_S)
        assert status == 0, worker.output
        jobs = [await queue.get(job_id) for job_id in ids]

    # Then the 8 it held succeeded, it claimed nothing more, and the rest wait untouched
    states = [job.state for job in jobs if job is not None]
    assert states.count(JobState.SUCCEEDED) == 8
    assert states.count(JobState.QUEUED) == 12
    assert all(job.attempts == 0 for job in jobs if job is not None and job.state is JobState.QUEUED)
    assert (await queue.stats()).in_flight == 0


async def test_a_second_signal_releases_calls_in_flight_at_once(
    queue_factory: QueueFactory, tmp_path: Path
) -> None:
    # Given 10 calls of 30 s in flight and a grace of 60 s
    sim = Simulator(SimulatorSettings(seed=3, defaults={"latency_ms": 30_000}))
    async with sim.running() as base_url:
        queue = await queue_factory.open(maintenance_interval_s=None)
        ids = await queue.enqueue_many({"payload": chat(model="deepseek-v3.2")} for _ in range(10))
        async with tidegate("worker", "--queue", queue_url_of(queue_factory),
                            "--config", str(provider_config(tmp_path, base_url)),
                            "--concurrency", "10", "--grace-s", "60") as worker:
            await wait_received(sim, 10, timeout_s=30)
            # When SIGTERM comes, and then SIGINT (an impatient operator)
            worker.send(signal.SIGTERM)
            await worker.printed("stopping gracefully")
            worker.send(signal.SIGINT)
            status = await worker.exited(MARGIN_S)
        jobs = [await queue.get(job_id) for job_id in ids]
    # Then it does not wait out the grace: the jobs are back in the queue, attempts uncounted
    assert status == 0, worker.output
    assert all(job is not None and job.state is JobState.QUEUED and job.attempts == 0 for job in jobs)
    assert "stopping at once" in worker.output
