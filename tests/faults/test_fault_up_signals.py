"""`tidegate up` stopped the way Docker, systemd and Kubernetes (SIGTERM) or a terminal (SIGINT)
stop it, with a synchronous call and an asynchronous job in flight on its own simulator: it
drains in order — the gateway lets the open call finish while the worker serves it, then the
worker finishes or releases its jobs — prints "Stopped." and exits 0 within its grace, leaving
nothing leased, with no traceback."""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from support.faults import MARGIN_S, Up, tidegate, up_ready
from support.processes import Process
from support.waiting import eventually
from tidegate.jobs import JobState
from tidegate.queue import Queue

SIGNALS = [signal.SIGTERM, signal.SIGINT]
CHAT: dict[str, Any] = {"model": "auto", "messages": [{"role": "user", "content": "hello"}]}


async def _simulator(up: Up, http: httpx.AsyncClient, latency_ms: int) -> None:
    answer = await http.post(f"{up.sim_url}/_sim/settings", json={"defaults": {"latency_ms": latency_ms}})
    answer.raise_for_status()


async def _received(up: Up, http: httpx.AsyncClient, count: int) -> None:
    async def received() -> int:
        stats = (await http.get(f"{up.sim_url}/_sim/stats")).json()
        return sum(model["received"] for model in stats["models"].values())

    await eventually(received, f"the simulator has received {count} calls", until=lambda n: n >= count)


async def _submit(up: Up, http: httpx.AsyncClient) -> str:
    answer = await http.post(f"{up.api_url}/jobs", json={"kind": "chat", "body": CHAT},
                             headers={"Authorization": f"Bearer {up.admin_key}"})
    assert answer.status_code == 202, answer.text
    [job_id] = answer.json()["ids"]
    return str(job_id)


def _queue(folder: Path) -> Queue:
    """The queue `up` kept in `folder`, opened without upkeep: inspected as it was left."""
    return Queue.from_url(f"sqlite:///{folder}/.tidegate/tidegate.db", maintenance_interval_s=None)


def _assert_clean(up: Process) -> None:
    assert "Stopped." in "".join(up.stdout), up.output
    assert "Traceback" not in up.output, up.output
    assert "was closed" not in up.output, up.output


@pytest.mark.parametrize("sig", SIGNALS, ids=lambda sig: sig.name)
async def test_a_stop_lets_calls_in_flight_finish_and_exits_0(tmp_path: Path, sig: signal.Signals) -> None:
    # Given `tidegate up` on a fresh folder (the change flow seeding its demo shop), a synchronous
    # call and an asynchronous job in flight, each taking 3 s at the provider
    grace_s = 15
    async with tidegate("up", "--port", "0", "--grace-s", str(grace_s), cwd=tmp_path) as process, \
            httpx.AsyncClient(timeout=30) as http:
        up = await up_ready(process)
        await _simulator(up, http, 3_000)
        client = openai.AsyncOpenAI(base_url=up.api_url, api_key=up.admin_key, max_retries=0)
        # ensure_future: the SDK types the call as an awaitable, not a coroutine.
        call = asyncio.ensure_future(client.chat.completions.with_raw_response.create(**CHAT))
        job_id = await _submit(up, http)
        await _received(up, http, 2)

        # When it is stopped
        stopped = time.monotonic()
        process.send(sig)
        status = await process.exited(grace_s + MARGIN_S)
        took_s = time.monotonic() - stopped
        answer = await call
        await client.close()

    # Then the call was answered, the job finished, and up exited 0 having said so
    assert status == 0, process.output
    assert took_s < grace_s + MARGIN_S
    assert answer.http_response.status_code == 200
    assert answer.parse().choices[0].message.content
    _assert_clean(process)
    async with _queue(tmp_path) as queue:
        job = await queue.get(job_id)
        synchronous = await queue.get(answer.headers["X-Tidegate-Job-Id"])
        stats = await queue.stats()
    assert job is not None and job.state is JobState.SUCCEEDED
    assert synchronous is not None and synchronous.state is JobState.SUCCEEDED
    assert stats.in_flight == 0


@pytest.mark.parametrize("sig", SIGNALS, ids=lambda sig: sig.name)
async def test_past_the_grace_jobs_in_flight_are_released_with_their_attempt_given_back(
    tmp_path: Path, sig: signal.Signals
) -> None:
    # Given a synchronous call and an asynchronous job whose calls take 30 s, and a grace of 1 s
    grace_s = 1
    async with tidegate("up", "--port", "0", "--grace-s", str(grace_s), "--no-change-flow",
                        cwd=tmp_path) as process, httpx.AsyncClient(timeout=30) as http:
        up = await up_ready(process)
        await _simulator(up, http, 30_000)
        call = asyncio.create_task(http.post(f"{up.api_url}/chat/completions", json=CHAT,
                                             headers={"Authorization": f"Bearer {up.admin_key}"}))
        job_id = await _submit(up, http)
        await _received(up, http, 2)

        # When it is stopped
        stopped = time.monotonic()
        process.send(sig)
        status = await process.exited(grace_s + MARGIN_S)
        took_s = time.monotonic() - stopped
        answer = await call

    # Then it exits 0 within the grace, the waiting caller was told so in the API's shape, and
    # both jobs wait in the queue, their attempts uncounted
    assert status == 0, process.output
    assert took_s < grace_s + MARGIN_S
    assert answer.status_code == 503 and answer.json()["error"]["code"] == "gateway_shutting_down"
    _assert_clean(process)
    async with _queue(tmp_path) as queue:
        job = await queue.get(job_id)
        synchronous = await queue.get(answer.json()["error"]["job_id"])
        stats = await queue.stats()
    assert job is not None and job.state is JobState.QUEUED and job.attempts == 0
    assert synchronous is not None and synchronous.state is JobState.QUEUED and synchronous.attempts == 0
    assert stats.in_flight == 0
