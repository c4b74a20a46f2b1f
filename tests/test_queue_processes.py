"""The queue shared by separate OS processes: exactly-once claims, a worker killed while holding
a lease, a blocked claim woken by another process, and (Redis) a server restart."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import QueueFactory
from support.claims import ClaimWaits
from support.waiting import eventually, eventually_sync
from tidegate import JobState, LeaseLost, Priority, Queue, QueueUnavailable
from tidegate._redis import SOCKET_TIMEOUT_S

ROOT = Path(__file__).resolve().parent.parent


def _spawn(factory: QueueFactory, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.support.queue_process", factory.url, factory.queue_name, *args],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


async def _finish(proc: subprocess.Popen[str], timeout_s: float = 60) -> str:
    out, err = await asyncio.to_thread(proc.communicate, timeout=timeout_s)
    assert proc.returncode == 0, err
    return out


async def test_four_processes_claim_every_job_exactly_once(
    queue_factory: QueueFactory, tmp_path: Path
) -> None:
    queue = await queue_factory.open(maintenance_interval_s=None)
    outputs = [tmp_path / f"claimed-{i}.txt" for i in range(4)]
    procs = [_spawn(queue_factory, "drain", str(out)) for out in outputs]
    for proc in procs:  # every worker is waiting in a blocking claim before work arrives
        assert (await asyncio.to_thread(proc.stdout.readline)).strip() == "ready"  # type: ignore[union-attr]
    ids = []
    for start in range(0, 2_000, 500):
        ids += await queue.enqueue_many({"payload": {"n": n}} for n in range(start, start + 500))
    for proc in procs:
        await _finish(proc)

    claimed = [line for out in outputs for line in out.read_text().split()]
    assert len(claimed) == len(ids)
    assert set(claimed) == set(ids)
    assert sum(1 for out in outputs if out.read_text()) >= 2, "work should spread over processes"
    for job_id in ids[:50]:
        job = await queue.get(job_id)
        assert job is not None and job.state is JobState.SUCCEEDED and job.attempts == 1


async def test_a_killed_worker_s_job_is_recovered_at_its_priority(queue_factory: QueueFactory) -> None:
    # Given a worker process holding the only job's lease
    queue = await queue_factory.open(maintenance_interval_s=0.2)
    job_id = await queue.enqueue({"task": "summarise"}, priority="high")
    proc = _spawn(queue_factory, "hold")
    line = await asyncio.to_thread(proc.stdout.readline)  # type: ignore[union-attr]
    held_id, held_token = line.split()
    assert held_id == job_id

    # When the process dies without a word
    proc.send_signal(signal.SIGKILL)
    proc.communicate()  # reaps it and closes its pipes

    # Then background upkeep returns the job to the queue at its own priority
    jobs = await queue.claim("survivor", priorities=[Priority.HIGH], timeout_s=15)
    assert [job.id for job in jobs] == [job_id]
    assert jobs[0].priority is Priority.HIGH
    assert jobs[0].attempts == 2
    assert jobs[0].lease_token != int(held_token)
    assert "lease expired" in (jobs[0].last_error or "")
    # and the dead worker's lease can no longer complete it
    stale = await queue.get(job_id)
    assert stale is not None
    stale.lease_token = int(held_token)
    with pytest.raises(LeaseLost):
        await queue.complete(stale, "from the grave")
    await queue.complete(jobs[0], "done")
    final = await queue.get(job_id)
    assert final is not None and final.result == "done"


async def test_a_blocked_claim_is_woken_by_another_process(
    queue_factory: QueueFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The claim's whole wait is one blocking read: the periodic re-check a lost signal falls back
    # on is pushed past it (on Redis one BLPOP of CLAIM_S, inside the client's socket timeout),
    # so the claim returns the job only if the other process's enqueue woke it.
    import tidegate.queue.redis
    import tidegate.queue.sqlite

    claim_s = 9.0
    assert claim_s < SOCKET_TIMEOUT_S
    monkeypatch.setattr(tidegate.queue.redis, "BLOCK_MAX_S", claim_s)
    for backend in (tidegate.queue.redis, tidegate.queue.sqlite):
        monkeypatch.setattr(backend, "SAFETY_WAKE_S", 3600.0)
    enqueuer = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tests.support.queue_process", queue_factory.url, queue_factory.queue_name,
        "enqueue-on-go", "normal",
        cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
    )
    assert enqueuer.stdout is not None and enqueuer.stdin is not None
    try:
        assert await enqueuer.stdout.readline() == b"ready\n"
        queue = await queue_factory.open(maintenance_interval_s=None)
        waits = ClaimWaits(queue)
        claim = asyncio.create_task(queue.claim("waiter", timeout_s=claim_s))
        await eventually(lambda: waits.count, "the claim waits for work")
        enqueuer.stdin.write(b"go\n")
        await enqueuer.stdin.drain()
        jobs = await claim
        job_id = (await enqueuer.stdout.readline()).decode().strip()
        assert [job.id for job in jobs] == [job_id]
        assert waits.count == 1  # one wait, ended by the enqueue: no empty re-check in between
    finally:
        with contextlib.suppress(ProcessLookupError):
            enqueuer.kill()
        await enqueuer.wait()


@pytest.fixture
def restartable_redis(tmp_path: Path) -> tuple[Path, int]:
    from conftest import _free_port

    return tmp_path, _free_port()


def _start_redis(workdir: Path, port: int) -> subprocess.Popen[bytes]:
    import redis

    proc = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--dir", str(workdir),
         "--appendonly", "yes", "--appendfsync", "always", "--save", ""],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    def answers() -> bool:
        with contextlib.suppress(redis.exceptions.RedisError), \
                redis.Redis(port=port, socket_connect_timeout=0.2) as client:
            return bool(client.ping())
        return False

    try:
        eventually_sync(answers, "redis-server answers", timeout_s=10, every_s=0.05)
    except AssertionError:
        proc.kill()
        raise
    return proc


@pytest.mark.redis_only
async def test_jobs_and_leases_survive_a_redis_restart(
    queue_factory: QueueFactory, restartable_redis: tuple[Path, int]
) -> None:
    workdir, port = restartable_redis
    server = _start_redis(workdir, port)
    queue = Queue.from_url(f"redis://127.0.0.1:{port}/0", maintenance_interval_s=None)
    try:
        await queue.open()
        await queue.enqueue_many({"payload": {"n": n}, "priority": n % 5} for n in range(100))
        leased = await queue.claim("w", limit=10, lease_s=60)

        # When the server is killed, calls fail with the queue's own error, not a driver error
        os.kill(server.pid, signal.SIGKILL)
        server.wait()
        with pytest.raises(QueueUnavailable):
            await queue.stats()

        # and after it restarts from its append-only file, nothing is lost
        server = _start_redis(workdir, port)
        stats = await queue.stats()
        assert stats.depth == 90
        assert stats.in_flight == 10
        await queue.complete(leased[0], "after restart")
        rest = await queue.claim("w", limit=100)
        assert len(rest) == 90
        assert [job.priority for job in rest] == sorted(job.priority for job in rest)
    finally:
        await queue.close()
        server.kill()
        server.wait()
