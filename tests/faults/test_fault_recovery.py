"""Recovery after kill -9 needs no long-lived process: workers that each live less than a second
once serving, killed with SIGKILL while they hold the job, hand it on — the next worker's claim
recovers the expired lease itself (upkeep is set to run once an hour), within a second of the
lease having expired and a worker being up, on SQLite and Redis."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from conftest import QueueFactory
from support.dispatch import chat, queue_url_of
from support.faults import provider_config, tidegate
from support.processes import Process
from tidegate.jobs import JobState
from tidegate.queue import Queue
from tidegate.simulator.server import Simulator
from tidegate.simulator.settings import SimulatorSettings

LEASE_S = 1.0
LIFETIME_S = 0.9  # how long each worker runs once it serves, before kill -9
WORKERS = 6  # started one a second
RECOVERIES = 2  # hand-overs the test needs to have seen (startups bunch up on a busy machine)
SLACK_S = 1.0  # recovery once the lease has expired and a worker is up


@dataclass
class Holder:
    """A worker seen holding the job: since when, and the last lease expiry it renewed to."""

    worker_id: str
    since: float  # epoch seconds
    lease_expires: float


async def _watch(queue: Queue, job_id: str, holders: list[Holder], stop: asyncio.Event) -> None:
    while not stop.is_set():
        job = await queue.get(job_id)
        assert job is not None and job.state in (JobState.QUEUED, JobState.LEASED), job
        if job.state is JobState.LEASED and job.worker_id and job.lease_expires_at:
            expires = job.lease_expires_at.timestamp()
            if not holders or holders[-1].worker_id != job.worker_id:
                holders.append(Holder(job.worker_id, time.time(), expires))
            else:
                holders[-1].lease_expires = expires
        await asyncio.sleep(0.02)


async def _live_briefly(process: Process, worker_id: str, serving: dict[str, float]) -> None:
    """Once the worker serves, let it run LIFETIME_S, then kill -9 it."""
    with contextlib.suppress(AssertionError):  # one that never came up is simply not counted
        await process.printed("serving", timeout_s=60)
        serving[worker_id] = time.time()
        await asyncio.sleep(LIFETIME_S)
    process.send(signal.SIGKILL)
    await process.exited(10)


async def test_a_kill_9_loop_of_short_lived_workers_recovers_every_lease(
    queue_factory: QueueFactory, tmp_path: Path
) -> None:
    sim = Simulator(SimulatorSettings(seed=3, defaults={"latency_ms": 30_000}))
    async with sim.running() as base_url, contextlib.AsyncExitStack() as workers:
        queue = await queue_factory.open(maintenance_interval_s=None)
        job_id = await queue.enqueue(chat(model="deepseek-v3.2"), max_attempts=100)
        url = queue_url_of(queue_factory)
        url += ("&" if "?" in url else "?") + "maintenance_interval_s=3600"
        config = provider_config(tmp_path, base_url)
        holders: list[Holder] = []
        serving: dict[str, float] = {}
        stop = asyncio.Event()
        watcher = asyncio.create_task(_watch(queue, job_id, holders, stop))
        lives = []
        try:
            # A worker starts every second, each killed LIFETIME_S after it begins serving: the
            # job is always held by a worker about to die, and taken on by one that just started.
            for n in range(WORKERS):
                worker_id = f"w{n}"
                process = await workers.enter_async_context(tidegate(
                    "worker", "--queue", url, "--config", str(config), "--concurrency", "1",
                    "--lease-s", str(LEASE_S), "--worker-id", worker_id))
                lives.append(asyncio.create_task(_live_briefly(process, worker_id, serving)))
                await asyncio.sleep(1.0)
            await asyncio.gather(*lives)
        finally:
            stop.set()
            await watcher

    hand_overs = list(itertools.pairwise(holders))
    assert len(hand_overs) >= RECOVERIES, (holders, serving)
    for before, after in hand_overs:
        # Nobody could take the job before its lease expired or before the next worker was up;
        # from the later of the two, the next worker's claim recovered it within SLACK_S.
        could_from = max(before.lease_expires, serving[after.worker_id])
        assert after.since - could_from <= SLACK_S, (before, after, serving)
        assert after.since >= before.lease_expires - 0.05  # never before the lease ran out
    job = await queue.get(job_id)
    assert job is not None and "lease expired" in (job.errors or [""])[-1]
