"""Worker processes: two of them share one rate limit through Redis, and a killed one's jobs are
recovered and finished by another."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from conftest import QueueFactory
from support.dispatch import chat, queue_url_of, running_worker, sim_config, wait_final, wait_received
from support.waiting import eventually
from tidegate.dispatch.worker import WorkerSettings
from tidegate.jobs import JobState
from tidegate.simulator.server import Simulator
from tidegate.simulator.settings import SimulatorSettings

ROOT = Path(__file__).resolve().parent.parent
RPM = 10  # per one-second window, here and at the simulator


def _config_file(tmp_path: Path, base_url: str) -> Path:
    path = tmp_path / "tidegate.toml"
    path.write_text(f"""
[[providers]]
name = "sim"
base_url = "{base_url}"

[[providers.models]]
name = "gemini-2.5-flash"
input_usd_per_1m = "0.30"
output_usd_per_1m = "2.50"
rpm = {RPM}
rate_window_s = 1.0

[[providers.models]]
name = "deepseek-v3.2"
input_usd_per_1m = "0.28"
output_usd_per_1m = "0.42"
""")
    return path


def _worker_process(queue_url: str, config: Path, *extra: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "tidegate", "worker", "--queue", queue_url, "--config", str(config),
         "--concurrency", "8", *extra],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )


def _stop(proc: subprocess.Popen[bytes], sig: signal.Signals = signal.SIGTERM) -> bytes:
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=30)
    return err


@pytest.fixture
async def limited_simulator() -> AsyncIterator[tuple[Simulator, str]]:
    sim = Simulator(SimulatorSettings(seed=5, window_s=1.0, models={"gemini-2.5-flash": {"rpm": RPM}}))
    async with sim.running() as base_url:
        yield sim, base_url


@pytest.mark.redis_only
async def test_two_worker_processes_share_the_rpm_and_never_hit_a_429(
    queue_factory: QueueFactory, limited_simulator: tuple[Simulator, str], tmp_path: Path
) -> None:
    sim, base_url = limited_simulator
    queue = await queue_factory.open(maintenance_interval_s=0.5)
    config = _config_file(tmp_path, base_url)
    ids = await queue.enqueue_many({"payload": chat(model="gemini-2.5-flash")} for _ in range(30))
    workers = [_worker_process(queue_url_of(queue_factory), config) for _ in range(2)]
    try:
        jobs = await wait_final(queue, ids, timeout_s=60)
    finally:
        errors = [_stop(proc) for proc in workers]
    assert all(job.state is JobState.SUCCEEDED for job in jobs), errors
    stats = sim.stats()["gemini-2.5-flash"]
    assert stats.by_status[429] == 0
    assert stats.max_in_window(1.0) <= RPM
    assert len({job.result["worker_id"] for job in jobs}) == 2  # both processes took part
    assert all(proc.returncode == 0 for proc in workers), errors


async def test_a_killed_worker_s_jobs_are_recovered_and_finished(
    queue_factory: QueueFactory, tmp_path: Path
) -> None:
    sim = Simulator(SimulatorSettings(seed=9, defaults={"latency_ms": 3000}))
    async with sim.running() as base_url:
        queue = await queue_factory.open(maintenance_interval_s=0.2)
        ids = await queue.enqueue_many({"payload": chat(model="deepseek-v3.2")} for _ in range(4))
        # Given a worker process in the middle of four slow calls
        proc = _worker_process(queue_url_of(queue_factory), _config_file(tmp_path, base_url),
                               "--lease-s", "1")
        await wait_received(sim, 4, timeout_s=20)
        # When it is killed
        _stop(proc, signal.SIGKILL)
        sim.configure({"defaults": {"latency_ms": 0}})
        # Then another worker gets the jobs once their leases run out, and finishes them
        async with running_worker(queue, sim_config(base_url), WorkerSettings(claim_wait_s=0.2)):
            jobs = await wait_final(queue, ids, timeout_s=30)
    assert [job.state for job in jobs] == [JobState.SUCCEEDED] * 4
    assert all(job.attempts == 2 and "lease expired" in job.errors[0] for job in jobs)


async def test_sigterm_drains_a_worker_process_without_losing_a_job(
    queue_factory: QueueFactory, tmp_path: Path
) -> None:
    sim = Simulator(SimulatorSettings(seed=11, defaults={"latency_ms": 500}))
    async with sim.running() as base_url:
        queue = await queue_factory.open(maintenance_interval_s=None)
        ids = await queue.enqueue_many({"payload": chat(model="deepseek-v3.2")} for _ in range(20))
        proc = _worker_process(queue_url_of(queue_factory), _config_file(tmp_path, base_url),
                               "--grace-s", "10")
        await wait_received(sim, 8, timeout_s=20)
        err = await asyncio.to_thread(_stop, proc)
        assert proc.returncode == 0, err
        jobs = [await queue.get(job_id) for job_id in ids]
    states = [job.state for job in jobs if job is not None]
    assert len(states) == 20
    assert JobState.LEASED not in states
    assert set(states) <= {JobState.SUCCEEDED, JobState.QUEUED}
    assert states.count(JobState.SUCCEEDED) >= 8


@pytest.mark.redis_only
async def test_a_worker_rides_out_a_redis_restart(
    queue_factory: QueueFactory, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    import os

    from conftest import _free_port
    from test_queue_processes import _start_redis
    from tidegate.queue import Queue

    port = _free_port()
    server = _start_redis(tmp_path, port)
    sim = Simulator(SimulatorSettings(seed=2))
    queue = Queue.from_url(f"redis://127.0.0.1:{port}/0", maintenance_interval_s=0.5)
    try:
        async with (
            sim.running() as base_url,
            queue,
            running_worker(queue, sim_config(base_url), WorkerSettings(claim_wait_s=0.2)),
        ):
            [first] = await wait_final(queue, [await queue.enqueue(chat(model="deepseek-v3.2"))])
            # When Redis dies under the running worker and comes back
            os.kill(server.pid, signal.SIGKILL)
            server.wait()
            await eventually(lambda: "claim failed" in caplog.text, "the worker meets the outage")
            server = _start_redis(tmp_path, port)
            # Then the worker carries on with new work
            [second] = await wait_final(queue, [await queue.enqueue(chat(model="deepseek-v3.2"))])
        assert first.state is JobState.SUCCEEDED and second.state is JobState.SUCCEEDED
    finally:
        server.kill()
        server.wait()
