"""The rolling upgrade on Redis: processes of the previous release (0.1.0, run from git history,
see tests/support/old_release.py) and of this one share one queue. An old worker answers a new
gateway, then works beside a new worker until it is stopped; a new worker answers an old gateway.
Every request is answered, every job ends once, and both releases read every job alike."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
import subprocess
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from openai import AsyncOpenAI

from support.dispatch import running_worker, sim_config, wait_received
from support.gateway import add_tenants, serving
from support.old_release import OldRelease, OldReleaseUnavailable, extract, stop
from support.old_release_driver import FAST_MODEL, TENANTS, job_record
from support.redis_keys import delete_keys
from support.waiting import eventually
from tidegate.app.components import Components
from tidegate.app.gateway import open_gateway_state
from tidegate.config import TidegateConfig, WorkerSettings
from tidegate.coord.budget import budget_ledger_for
from tidegate.jobs import JobState
from tidegate.queue import Queue
from tidegate.simulator.catalogue import default_models
from tidegate.simulator.server import Simulator
from tidegate.simulator.settings import SimulatorSettings

pytestmark = pytest.mark.redis_only

WAIT_S = 60.0  # liveness bound; never a speed assertion
OLD_WORKER = "old-worker"
NEW_WORKER = "new-worker"


@pytest.fixture(scope="module")
def old_release(tmp_path_factory: pytest.TempPathFactory) -> OldRelease:
    """The previous release's code, extracted from git history once for the module."""
    try:
        return extract(tmp_path_factory.mktemp("old-release"))
    except OldReleaseUnavailable as exc:
        pytest.fail(str(exc), pytrace=False)


@pytest.fixture
async def queue_url(redis_server: str) -> AsyncIterator[str]:
    """A queue of its own on the session's redis-server, its keys deleted afterwards."""
    name = f"roll{uuid.uuid4().hex[:10]}"
    try:
        yield f"{redis_server}?name={name}"
    finally:
        await delete_keys(redis_server, f"*{name}*")


@pytest.fixture
async def sim() -> AsyncIterator[tuple[Simulator, str]]:
    """The simulated provider with a little latency, so calls overlap; and its base URL."""
    simulator = Simulator(SimulatorSettings(seed=13, defaults={"latency_ms": 150}))
    async with simulator.running() as base_url:
        yield simulator, base_url


def config_file(folder: Path, base_url: str) -> Path:
    """The tidegate.toml both releases read: the simulator serving the shipped price table."""
    lines = ["[[providers]]", 'name = "sim"', f'base_url = "{base_url}"']
    for model in default_models():
        lines += ["", "[[providers.models]]", f'name = "{model.name}"', f'kind = "{model.kind}"',
                  f'input_usd_per_1m = "{model.input_usd_per_1m}"',
                  f'output_usd_per_1m = "{model.output_usd_per_1m}"',
                  f"context_tokens = {model.context_tokens}"]
    path = folder / "tidegate.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


@contextlib.asynccontextmanager
async def new_gateway(config: TidegateConfig) -> AsyncIterator[tuple[str, dict[str, str]]]:
    """A gateway of this release on the queue (no worker in it), with the tenants and their keys
    made by this release; yields its URL and the keys."""
    async with open_gateway_state(config, recs_url=None) as state:
        keys = await add_tenants(state.tenants, TENANTS)
        async with serving(state) as url:
            yield url, keys


@contextlib.asynccontextmanager
async def new_worker(config: TidegateConfig) -> AsyncIterator[None]:
    """A worker of this release serving the queue, on parts of its own (spend recorded)."""
    settings = WorkerSettings(concurrency=4, lease_s=5.0, claim_wait_s=0.1, worker_id=NEW_WORKER)
    async with Components.open(config) as parts, running_worker(
        parts.queue, config, settings, relay=parts.relay, tenants=parts.tenants, ledger=parts.ledger,
    ):
        yield


def sdk(url: str, key: str) -> AsyncOpenAI:
    """The official SDK on a gateway, without retries."""
    return AsyncOpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=WAIT_S)


async def ask(client: AsyncOpenAI, text: str, *, stream: bool = False) -> tuple[str, str]:
    """A chat completion through the gateway: the job that served it and the answer's text."""
    messages: Any = [{"role": "user", "content": text}]
    if not stream:
        raw = await client.chat.completions.with_raw_response.create(model=FAST_MODEL, messages=messages)
        return raw.headers["X-Tidegate-Job-Id"], raw.parse().choices[0].message.content or ""
    async with client.chat.completions.with_streaming_response.create(
            model=FAST_MODEL, messages=messages, stream=True) as response:
        job_id = response.headers["X-Tidegate-Job-Id"]
        text = "".join([chunk.choices[0].delta.content or "" async for chunk in await response.parse()
                        if chunk.choices])
    return job_id, text


async def embed(client: AsyncOpenAI) -> str:
    """An embedding through the gateway; the job that served it."""
    raw = await client.embeddings.with_raw_response.create(model="text-embedding-3-small", input="a vector")
    assert len(raw.parse().data[0].embedding) > 0
    return raw.headers["X-Tidegate-Job-Id"]


async def read_alike(old: OldRelease, url: str, answers: dict[str, str]) -> dict[str, Any]:
    """Every job (and today's spend) as both releases read it, checked equal; each answer is the
    one its job keeps. Returns the jobs as read."""
    async with Queue.from_url(url, maintenance_interval_s=None) as queue:
        jobs = {job_id: await queue.get(job_id) for job_id in answers}
    by_new = {job_id: job_record(job) for job_id, job in jobs.items()}
    seen_by_old = await asyncio.to_thread(old.run, "read", {"queue_url": url, "ids": list(answers)})
    assert seen_by_old["jobs"] == by_new
    ledger = budget_ledger_for(url)
    async with ledger:
        assert seen_by_old["spend"] == await ledger.spend_today()
    for job_id, text in answers.items():
        job = jobs[job_id]
        assert job is not None and job.state is JobState.SUCCEEDED, job
        if text:  # a chat's text; an embedding's is checked where it is answered
            assert job.result["response"]["choices"][0]["message"]["content"] == text
    return by_new


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


async def test_an_old_worker_serves_a_new_gateway_then_hands_over_to_a_new_worker(
    old_release: OldRelease, queue_url: str, sim: tuple[Simulator, str], tmp_path: Path
) -> None:
    simulator, base_url = sim
    config = sim_config(base_url, queue_url=queue_url)
    # Given an old worker process and a new gateway on one Redis queue
    toml = str(config_file(tmp_path, base_url))
    worker = old_release.cli("worker", "--queue", queue_url, "--config", toml, "--concurrency", "4",
                             "--lease-s", "5", "--grace-s", "20", "--worker-id", OLD_WORKER)
    try:
        async with new_gateway(config) as (url, keys), sdk(url, keys["acme"]) as client:
            # When requests come through the new gateway: plain, streamed and embeddings
            answers = dict(await asyncio.gather(*(ask(client, f"Question {n}", stream=n >= 4)
                                                  for n in range(6))))
            answers[await embed(client)] = ""
            # Then the old worker answers each, as the job it kept says
            first = await read_alike(old_release, queue_url, answers)
            assert {record["result"]["worker_id"] for record in first.values()} == {OLD_WORKER}
            assert all(answers[job_id] for job_id in answers if first[job_id]["payload"]["kind"] == "chat")

            # Given a new worker beside the old one, and requests in flight on both
            async with new_worker(config):
                received = sum(stats.received for stats in simulator.stats().values())
                flight = [asyncio.create_task(ask(client, f"Rolling {n}", stream=n % 5 == 0))
                          for n in range(40)]
                await wait_received(simulator, received + 12, timeout_s=WAIT_S)
                # When the old worker is stopped (SIGTERM) meanwhile
                err = await asyncio.to_thread(stop, worker, signal.SIGTERM)
                assert worker.returncode == 0, err
                # Then every request is answered, by one worker or the other, nothing lost
                rolling = dict(await asyncio.gather(*flight))
            second = await read_alike(old_release, queue_url, rolling)
            served_by = {record["result"]["worker_id"] for record in second.values()}
            assert served_by == {OLD_WORKER, NEW_WORKER}
            assert all(record["attempts"] == 1 or record["errors"] for record in second.values())
    finally:
        stop(worker, signal.SIGKILL)


async def test_a_new_worker_serves_an_old_gateway(
    old_release: OldRelease, queue_url: str, sim: tuple[Simulator, str], tmp_path: Path
) -> None:
    _, base_url = sim
    config = sim_config(base_url, queue_url=queue_url)
    # Given tenants and keys made by this release, an old gateway and a new worker on one queue
    async with Components.open(config) as parts:
        keys = await add_tenants(parts.tenants, TENANTS)
    port = _free_port()
    toml = str(config_file(tmp_path, base_url))
    gateway = old_release.cli("gateway", "--queue", queue_url, "--config", toml, "--port", str(port),
                              "--grace-s", "5")
    url = f"http://127.0.0.1:{port}"
    try:
        await _until_listening(gateway, url)
        async with new_worker(config), sdk(url, keys["globex"]) as client:
            # When requests come through the old gateway: plain, streamed, embeddings, async jobs
            answers = dict(await asyncio.gather(*(ask(client, f"Question {n}", stream=n >= 4)
                                                  for n in range(6))))
            answers[await embed(client)] = ""
            async with httpx.AsyncClient(base_url=url, timeout=WAIT_S,
                                         headers={"Authorization": f"Bearer {keys['globex']}"}) as http:
                body = {"model": FAST_MODEL, "messages": [{"role": "user", "content": "An async job"}]}
                accepted = await http.post("/v1/jobs", json={"kind": "chat", "body": body})
                assert accepted.status_code == 202, accepted.text
                [job_id] = accepted.json()["ids"]
                view = (await http.get(f"/v1/jobs/{job_id}", params={"wait": 30})).json()
                assert view["state"] == "succeeded", view
            answers[job_id] = view["result"]["response"]["choices"][0]["message"]["content"]
            # Then the new worker answers each, and both releases read every job alike
            records = await read_alike(old_release, queue_url, answers)
        assert {record["result"]["worker_id"] for record in records.values()} == {NEW_WORKER}
    finally:
        err = stop(gateway, signal.SIGTERM)
    assert gateway.returncode == 0, err


async def _until_listening(proc: subprocess.Popen[bytes], url: str) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=1.0) as http:

        async def listening() -> bool:
            if proc.poll() is not None:
                raise AssertionError(f"the old gateway exited with {proc.returncode}: {stop(proc)[-4000:]}")
            with contextlib.suppress(httpx.TransportError):
                return (await http.get("/healthz")).status_code == 200
            return False

        await eventually(listening, f"the old gateway listens on {url}", timeout_s=WAIT_S, every_s=0.1)
