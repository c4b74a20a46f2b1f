"""Scale-out as an operator runs it: two `tidegate gateway` and two `tidegate worker` processes on
one Redis queue serve one client load spread over both gateways, and nothing is lost: not when a
worker is killed mid-load (its leases run out and the other worker finishes its jobs), not when a
gateway is stopped (the jobs it accepted are in Redis; they finish and the other gateway hands
them out).

Redis only: the embedded SQLite queue is for one host and one process."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from support.cluster import GatewayProcess, TidegateProcess, start_gateway, start_worker, write_config
from support.dispatch import wait_received
from support.redis_keys import delete_keys
from support.waiting import eventually
from tidegate.coord.tenants import Tenant, tenant_store_for
from tidegate.jobs import Job, JobState, Priority
from tidegate.queue import Queue
from tidegate.simulator.server import Simulator
from tidegate.simulator.settings import SimulatorSettings

MODELS = ("deepseek-v3.2", "gemini-2.5-flash")
PRIORITIES = ("critical", "high", "normal", "low", "bulk")
TENANT = Tenant(name="load", max_priority=Priority.CRITICAL, default_priority=Priority.NORMAL)
WORKER_IDS = ("w1", "w2")
CONCURRENCY = 4  # per worker
LONG_POLL_S = 30

pytestmark = pytest.mark.timeout(120)


def _messages(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


@dataclass
class Cluster:
    """The processes, what the test talks to them with, and its own view of the shared queue."""

    gateways: list[GatewayProcess]
    workers: list[TidegateProcess]
    clients: list[httpx.AsyncClient]  # one per gateway, with the tenant's key
    queue: Queue
    sim: Simulator

    def describe(self) -> str:
        """Every process's status and log, for an assertion message."""
        return "\n".join(process.describe() for process in (*self.gateways, *self.workers))

    async def jobs(self, job_ids: list[str]) -> list[Job]:
        """The stored jobs, every one of which must exist."""
        jobs = [await self.queue.get(job_id) for job_id in job_ids]
        missing = [job_id for job_id, job in zip(job_ids, jobs, strict=True) if job is None]
        assert not missing, f"jobs lost: {missing}"
        return [job for job in jobs if job is not None]


async def _stop_all(processes: list[TidegateProcess]) -> None:
    """SIGTERM every process still running; each must then exit cleanly."""
    running = [process for process in processes if process.proc.poll() is None]
    codes = await asyncio.gather(*(process.stop() for process in running))
    unclean = [process.describe() for process, code in zip(running, codes, strict=True) if code != 0]
    assert not unclean, "\n".join(unclean)


@pytest.fixture
async def cluster(redis_server: str, tmp_path: Path) -> AsyncIterator[Cluster]:
    """Two gateways and two workers (ids w1 and w2, two-second leases) on a fresh queue of the
    session's Redis, a tenant with a key, and the simulated provider served from the test's loop.
    Every process is stopped at teardown (SIGTERM, then SIGKILL), before the simulator goes, and
    those still running then must exit with status 0."""
    name = f"t{uuid.uuid4().hex[:12]}"
    queue_url = f"{redis_server}?name={name}"
    # Tokens a few milliseconds apart: streams last long enough to be relayed chunk by chunk.
    sim = Simulator(SimulatorSettings(seed=13, defaults={"latency_ms": 50, "inter_token_ms": 2}))
    async with contextlib.AsyncExitStack() as stack:
        stack.push_async_callback(delete_keys, redis_server, f"*{name}*")
        sim_url = await stack.enter_async_context(sim.running())
        config = write_config(tmp_path / "tidegate.toml", sim_url, MODELS)
        async with tenant_store_for(queue_url, auth_cache_s=0) as store:
            await store.put_tenant(TENANT)
            _, key = await store.create_key(TENANT.name)
        queue = await stack.enter_async_context(Queue.from_url(queue_url, maintenance_interval_s=None))
        worker_options = ("--concurrency", str(CONCURRENCY), "--lease-s", "2", "--grace-s", "5")
        starting = await asyncio.gather(
            *(start_gateway(f"gw{n}", queue_url, config, tmp_path) for n in (1, 2)),
            *(start_worker(worker_id, queue_url, config, tmp_path, *worker_options)
              for worker_id in WORKER_IDS),
            return_exceptions=True,
        )
        started = [process for process in starting if isinstance(process, TidegateProcess)]
        stack.push_async_callback(_stop_all, started)
        for outcome in starting:
            if isinstance(outcome, BaseException):
                raise outcome
        gateways = [process for process in started if isinstance(process, GatewayProcess)]
        workers = [process for process in started if not isinstance(process, GatewayProcess)]
        clients = [
            await stack.enter_async_context(httpx.AsyncClient(
                base_url=gateway.url, timeout=60.0, headers={"Authorization": f"Bearer {key}"}))
            for gateway in gateways
        ]
        yield Cluster(gateways, workers, clients, queue, sim)


# ---------------------------------------------------------------------- the client load


async def sync_chat(http: httpx.AsyncClient, priority: str, model: str) -> str:
    """One chat completion, answered in full; returns the job that served it."""
    answer = await http.post("/v1/chat/completions", headers={"X-Priority": priority},
                             json={"model": model, "messages": _messages(f"sync {priority}")})
    assert answer.status_code == 200, answer.text
    assert answer.json()["choices"][0]["message"]["content"]
    return answer.headers["X-Tidegate-Job-Id"]


async def streamed_chat(http: httpx.AsyncClient, priority: str, model: str) -> str:
    """One chat completion with `stream: true`, read to its [DONE]; returns its job."""
    body = {"model": model, "messages": _messages(f"stream {priority}"), "stream": True}
    async with http.stream("POST", "/v1/chat/completions", headers={"X-Priority": priority},
                           json=body) as answer:
        assert answer.status_code == 200, await answer.aread()
        events = [line.removeprefix("data: ") async for line in answer.aiter_lines()
                  if line.startswith("data: ")]
    assert events and events[-1] == "[DONE]", events
    chunks = [orjson.loads(event) for event in events[:-1]]
    text = "".join(choice["delta"].get("content") or "" for chunk in chunks for choice in chunk["choices"])
    assert text, chunks
    return answer.headers["X-Tidegate-Job-Id"]


async def submit(http: httpx.AsyncClient, count: int, priorities: tuple[str, ...] = PRIORITIES) -> list[str]:
    """POST /v1/jobs with a batch of `count` chat jobs at the given priorities in turn."""
    jobs = [{"kind": "chat", "priority": priorities[n % len(priorities)],
             "body": {"model": MODELS[n % len(MODELS)], "messages": _messages(f"async {n}")}}
            for n in range(count)]
    answer = await http.post("/v1/jobs", json={"jobs": jobs})
    assert answer.status_code == 202, answer.text
    ids: list[str] = answer.json()["ids"]
    assert len(ids) == count
    return ids


async def long_poll(http: httpx.AsyncClient, job_id: str) -> dict[str, Any]:
    """GET /v1/jobs/{id}?wait= until the job is final; returns its view."""
    while True:
        answer = await http.get(f"/v1/jobs/{job_id}", params={"wait": LONG_POLL_S})
        assert answer.status_code == 200, answer.text
        view: dict[str, Any] = answer.json()
        if view["state"] not in ("queued", "leased", "delayed"):
            return view


async def submit_and_poll(submit_to: httpx.AsyncClient, poll_through: httpx.AsyncClient,
                          count: int) -> list[dict[str, Any]]:
    """A batch enqueued through one gateway, each job long-polled through the other."""
    ids = await submit(submit_to, count)
    return list(await asyncio.gather(*(long_poll(poll_through, job_id) for job_id in ids)))


async def enqueued_by(http: httpx.AsyncClient) -> float:
    """How many jobs the gateway says it has enqueued (its /metrics)."""
    text = (await http.get("/metrics")).text
    return sum(sample.value for family in text_string_to_metric_families(text)
               if family.name == "tidegate_gateway_jobs_enqueued"
               for sample in family.samples if sample.name.endswith("_total"))


async def until_enqueued(http: httpx.AsyncClient, count: int, timeout_s: float = 20) -> None:
    """Until the gateway has enqueued `count` jobs in all."""
    await eventually(lambda: enqueued_by(http), f"the gateway has enqueued {count} jobs",
                     until=lambda enqueued: enqueued >= count, timeout_s=timeout_s)


async def until_leased_by(queue: Queue, worker_id: str, job_ids: list[str], timeout_s: float = 20) -> None:
    """Until one of the jobs is leased by that worker."""
    async def jobs() -> list[Job | None]:
        return [await queue.get(job_id) for job_id in job_ids]

    await eventually(jobs, f"{worker_id} leases one of the jobs", timeout_s=timeout_s, until=lambda jobs: any(
        job is not None and job.state is JobState.LEASED and job.worker_id == worker_id for job in jobs))


def assert_drained(jobs: list[Job]) -> None:
    """Every job succeeded, with a result from one of the workers."""
    assert [job.state for job in jobs] == [JobState.SUCCEEDED] * len(jobs), \
        [(job.id, job.state, job.errors) for job in jobs if job.state is not JobState.SUCCEEDED]
    assert all(job.result["worker_id"] in WORKER_IDS for job in jobs)


# ---------------------------------------------------------------------- tests


async def test_two_gateways_and_two_workers_serve_one_load_with_nothing_lost(cluster: Cluster) -> None:
    a, b = cluster.clients
    # When sync and streamed calls at every priority go to both gateways, and each gateway takes
    # an async batch that is long-polled through the other one
    sync_ids, stream_ids, (polled_via_b, polled_via_a) = await asyncio.gather(
        asyncio.gather(*(sync_chat(cluster.clients[n % 2], PRIORITIES[n % 5], MODELS[n % 2])
                         for n in range(24))),
        asyncio.gather(*(streamed_chat(cluster.clients[n % 2], PRIORITIES[n % 5], MODELS[n % 2])
                         for n in range(6))),
        asyncio.gather(submit_and_poll(a, b, 20), submit_and_poll(b, a, 20)),
    )

    # Then every call was answered, each by a job of its own, and every async job succeeded
    views = [*polled_via_b, *polled_via_a]
    assert [view["state"] for view in views] == ["succeeded"] * 40
    assert all(view["result"]["response"]["choices"] for view in views)
    job_ids = [*sync_ids, *stream_ids, *(view["id"] for view in views)]
    assert len(set(job_ids)) == 70

    # ... each job ran exactly once, at the priority it was given, with nothing left behind
    jobs = await cluster.jobs(job_ids)
    assert_drained(jobs)
    assert all(job.attempts == 1 for job in jobs)
    assert sum(stats.received for stats in cluster.sim.stats().values()) == 70
    asked = [PRIORITIES[n % 5] for n in range(24)] + [PRIORITIES[n % 5] for n in range(6)]
    assert [job.priority.name.lower() for job in jobs[:30]] == asked
    assert [job.priority.name.lower() for job in jobs[30:]] == [view["priority"] for view in views]
    stats = await cluster.queue.stats()
    assert (stats.depth, stats.in_flight, stats.delayed, stats.dead) == (0, 0, 0, 0)

    # ... both workers did work, and both gateways took their share of the jobs
    assert {job.result["worker_id"] for job in jobs} == set(WORKER_IDS), cluster.describe()
    assert [await enqueued_by(http) for http in cluster.clients] == [35, 35]
    # ... and no gateway wrote a log line per request (the access log is off by default)
    assert not [gateway.name for gateway in cluster.gateways if "POST /v1/" in gateway.log()]


async def test_a_worker_killed_mid_load_loses_nothing(cluster: Cluster) -> None:
    a, b = cluster.clients
    w1, _ = cluster.workers
    cluster.sim.configure({"defaults": {"latency_ms": 400}})
    # Given a load in progress: an async batch through gateway 1, sync calls through both
    async_ids = await submit(a, 24)
    load = asyncio.gather(
        asyncio.gather(*(sync_chat(cluster.clients[n % 2], PRIORITIES[n % 5], MODELS[n % 2])
                         for n in range(16))),
        asyncio.gather(*(long_poll(b, job_id) for job_id in async_ids)),
    )
    try:
        # When worker w1 is killed while it holds leases
        await until_leased_by(cluster.queue, "w1", async_ids)
        assert await w1.stop(signal.SIGKILL) == -signal.SIGKILL
        sync_ids, views = await load
    finally:
        load.cancel()

    # Then every call is still answered and every job succeeds, w1's through w2 once their
    # leases ran out
    assert [view["state"] for view in views] == ["succeeded"] * 24
    jobs = await cluster.jobs([*sync_ids, *async_ids])
    assert_drained(jobs)
    recovered = [job for job in jobs if any("lease expired" in error for error in job.errors)]
    assert recovered, cluster.describe()
    assert all(job.result["worker_id"] == "w2" and job.attempts == 2 for job in recovered)
    assert all(job.attempts == 1 for job in jobs if job not in recovered)
    stats = await cluster.queue.stats()
    assert (stats.depth, stats.in_flight, stats.delayed, stats.dead) == (0, 0, 0, 0)


async def test_a_stopped_gateway_s_accepted_jobs_finish_and_are_served_by_the_other(
    cluster: Cluster,
) -> None:
    a, b = cluster.clients
    gateway_1 = cluster.gateways[0]
    cluster.sim.configure({"defaults": {"latency_ms": 500}})
    # Given gateway 1 has accepted a low-priority async batch and holds four high-priority calls
    accepted = await submit(a, 40, priorities=("low",))
    calls = asyncio.gather(*(sync_chat(a, "high", MODELS[n % 2]) for n in range(4)))
    try:
        await until_enqueued(a, 44)
        await wait_received(cluster.sim, 1)

        # When it is stopped with SIGTERM
        exit_code = await gateway_1.stop(signal.SIGTERM)
        call_ids = await calls
    finally:
        calls.cancel()

    # Then it answered the calls it held before it exited, and takes no new one
    assert exit_code == 0, gateway_1.describe()
    assert len(set(call_ids)) == 4
    with pytest.raises(httpx.ConnectError):
        await a.get("/readyz")
    # ... the batch outlived it in Redis, and gateway 2 hands every job out once it is done
    pending = [job for job in await cluster.jobs(accepted) if not job.is_final]
    assert pending, "every job finished before the gateway stopped: nothing was shown"
    views = await asyncio.gather(*(long_poll(b, job_id) for job_id in [*accepted, *call_ids]))
    assert [view["state"] for view in views] == ["succeeded"] * 44
    jobs = await cluster.jobs([*accepted, *call_ids])
    assert_drained(jobs)
    assert all(job.attempts == 1 for job in jobs)
