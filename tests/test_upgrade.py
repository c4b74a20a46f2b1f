"""The upgrade: data written by the previous release (0.1.0, its own code run from git history,
see tests/support/old_release.py) is opened by this release, on SQLite and on Redis, and every job
is served to its end, every key still works, spend is the same, the Batch API batch in progress
completes, the provider batch pending is collected, and nothing is lost. The change flow resumes
from the position the old release's sync left."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import sqlite3
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai
import pytest
from openai import AsyncOpenAI

from support.gateway import serving
from support.old_release import OldRelease, OldReleaseUnavailable, extract, result_of, stop
from support.old_release_driver import FAST_MODEL, SLOW_MODEL, job_record
from support.provider_batches import batch_config
from support.redis_keys import delete_keys
from support.waiting import eventually
from tidegate.app.components import Components, Given
from tidegate.app.gateway import open_gateway_state
from tidegate.config import TidegateConfig, WorkerSettings
from tidegate.dispatch.provider_batches.store import provider_batch_store_for
from tidegate.dispatch.worker import Worker
from tidegate.jobs import JobState, Priority
from tidegate.queue import Queue
from tidegate.simulator.server import Simulator
from tidegate.simulator.settings import SimulatorSettings

WAIT_S = 60.0  # liveness bound for the new release to serve everything; never a speed assertion
RETRY_IN_S = 4.0  # the failed job's retry and the delayed job's not-before, from when they are written
FAST: dict[str, Any] = {"maintenance_interval_s": 0.2, "retry_base_s": 0.02, "retry_max_s": 0.05}


@pytest.fixture(scope="module")
def old_release(tmp_path_factory: pytest.TempPathFactory) -> OldRelease:
    """The previous release's code, extracted from git history once for the module."""
    try:
        return extract(tmp_path_factory.mktemp("old-release"))
    except OldReleaseUnavailable as exc:
        pytest.fail(str(exc), pytrace=False)


@pytest.fixture(params=["sqlite", "redis"])
async def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[str]:
    """Where both releases keep everything: a SQLite file, or a queue name of its own on the
    session's redis-server (its keys deleted afterwards)."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'tidegate.db'}"
        return
    name = f"upg{uuid.uuid4().hex[:10]}"
    server: str = request.getfixturevalue("redis_server")
    try:
        yield f"{server}?name={name}"
    finally:
        await delete_keys(server, f"*{name}*")


@dataclass
class OldData:
    """What the previous release wrote, as it read it back."""

    served: dict[str, Any]
    held: dict[str, Any]
    queued: dict[str, Any]
    last: dict[str, dict[str, Any]]  # every job, as the old release read it last

    @property
    def keys(self) -> dict[str, str]:
        """Tenant name → the API key the old release made for it."""
        keys: dict[str, str] = self.served["keys"]
        return keys

    def records(self) -> dict[str, dict[str, Any]]:
        """Every job the old release wrote, as it last read it."""
        return {**self.served["jobs"], **self.held["jobs"], **self.queued["jobs"]}


async def write_old_data(old: OldRelease, sim: Simulator, url: str, sim_url: str) -> OldData:
    """Run the old release against `url`: served jobs, a held and killed worker, waiting jobs."""
    args = {"queue_url": url, "sim_url": sim_url}
    served = await asyncio.to_thread(old.run, "served", args)
    # The slow model's calls hang while the worker holding them is killed.
    sim.configure({"models": {SLOW_MODEL: {"latency_ms": 120_000}}})
    proc = old.start("held", {**args, "key": served["keys"]["acme"]})
    try:
        lines = await asyncio.to_thread(_lines_until, proc, "holding")
    finally:
        err = stop(proc, signal.SIGKILL)
    assert lines[-1:] == ["holding"], f"the old `held` driver ended early:\n{''.join(lines)}\n{err[-6000:]}"
    held = result_of("\n".join(lines), "held")
    sim.configure({"models": {SLOW_MODEL: {"latency_ms": 0}}})
    waits = {"retry_in_s": RETRY_IN_S, "delay_s": RETRY_IN_S}
    queued = await asyncio.to_thread(old.run, "queue", {**args, **waits})
    data = OldData(served, held, queued, {})
    # The old release's own upkeep moved some jobs on meanwhile (provider-batch jobs whose wait
    # ended are queued again): its last reading of every job is the one to compare with.
    data.last = (await asyncio.to_thread(old.run, "read", {**args, "ids": list(data.records())}))["jobs"]
    return data


def _lines_until(proc: Any, last: str) -> list[str]:
    lines: list[str] = []
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append(line.rstrip("\n"))
        if lines[-1] == last:
            break
    return lines


@contextlib.asynccontextmanager
async def new_release(config: TidegateConfig) -> AsyncIterator[tuple[str, Worker]]:
    """This release on the store: a worker and a gateway (uvicorn on loopback), each on parts of
    its own as separate processes would be; yields the gateway's URL and the worker."""
    async with contextlib.AsyncExitStack() as stack:
        parts = await stack.enter_async_context(Components.open(
            config, worker=True, given=Given(
                queue=await stack.enter_async_context(Queue.from_url(config.queue_url, **FAST)))))
        worker = await stack.enter_async_context(Worker(
            parts.for_worker(), config, WorkerSettings(concurrency=8, lease_s=5.0, claim_wait_s=0.1)))
        task = asyncio.create_task(worker.run())
        stack.push_async_callback(lambda: task)
        stack.callback(worker.request_stop)
        gateway_queue = await stack.enter_async_context(Queue.from_url(config.queue_url, **FAST))
        state = await stack.enter_async_context(open_gateway_state(
            config, given=Given(queue=gateway_queue, relay=parts.relay), recs_url=None))
        yield await stack.enter_async_context(serving(state)), worker


def sdk(url: str, key: str) -> AsyncOpenAI:
    """The official SDK on the new gateway, without retries."""
    return AsyncOpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0)


async def test_the_new_release_serves_everything_the_old_one_wrote(
    old_release: OldRelease, store_url: str
) -> None:
    sim = Simulator(SimulatorSettings(seed=7, batch_latency_s=2.0))
    async with sim.running() as sim_url:
        # Given a store the previous release wrote: jobs in every state, tenants and keys,
        # spend, a Batch API batch in progress and a provider batch pending
        old = await write_old_data(old_release, sim, store_url, sim_url)
        records = old.records()
        config = batch_config(sim_url, store_url)

        # Then this release reads every job, the spend and the keys as the old one left them
        async with Queue.from_url(store_url, maintenance_interval_s=None) as queue:
            now = {job_id: job_record(await queue.get(job_id)) for job_id in records}
            assert now == old.last
            stats = await queue.stats()
            assert {"depth": stats.depth, "delayed": stats.delayed, "dead": stats.dead} == old.queued["stats"]
            again = await queue.enqueue({"other": "payload"}, idempotency_key="queued-2")
            assert again == old.queued["queued"][2]
        _expect_states(old)
        store = provider_batch_store_for(store_url)
        try:
            entries = await store.jobs(old.served["provider_batch_jobs"])
        finally:
            await store.close()
        assert {job_id: {"provider": entry.provider, "batch_id": entry.batch_id}
                for job_id, entry in entries.items()} == old.served["provider_batches"]

        ledger_spend = await _spend(store_url)
        assert ledger_spend == old.queued["spend"]

        async with new_release(config) as (url, worker):
            # When it runs a worker and a gateway on that store
            # Then every key authenticates through the gateway and the revoked one does not
            for tenant, key in old.keys.items():
                async with sdk(url, key) as client:
                    answer = await client.chat.completions.create(
                        model=FAST_MODEL, messages=[{"role": "user", "content": f"Hello again, {tenant}"}])
                assert answer.choices[0].message.content, tenant
            async with sdk(url, old.served["revoked_key"]) as client:
                with pytest.raises(openai.AuthenticationError):
                    await client.models.list()

            # And the dead letters are listed, and the one written by hand is redriven
            async with Queue.from_url(store_url, maintenance_interval_s=None) as queue:
                dead = {job.id for job in await queue.dead_letters()}
                assert dead == {old.served["dead"], old.queued["dead_by_hand"]}
                assert await queue.redrive([old.queued["dead_by_hand"]]) == 1

                # And every other job is served to its end, nothing lost
                finals = {job.id: job for job in await asyncio.gather(
                    *(queue.wait(job_id, WAIT_S) for job_id in records))}
            states = {job_id: job.state for job_id, job in finals.items()}
            expected = dict.fromkeys(records, JobState.SUCCEEDED) | {old.served["dead"]: JobState.DEAD}
            assert states == expected
            _expect_results(old, finals, worker.worker_id)

            # And the response it answered is retrieved as it was, its request read back from the
            # job's origin, and is continued
            async with sdk(url, old.keys["acme"]) as client:
                response = await client.responses.retrieve(old.served["response"]["id"])
                follow = await client.responses.create(model=FAST_MODEL, input="Once more",
                                                       previous_response_id=response.id)
            assert response.output_text == old.served["response"]["output_text"]
            assert (response.instructions, response.metadata, response.temperature) == (
                "Be brief.", {"ticket": "t-1"}, 1.0)
            assert follow.status == "completed" and follow.previous_response_id == response.id

            # And the batch in progress completes, its output file holding every line
            async with sdk(url, old.keys["acme"]) as client:
                batch = await _until_ended(client, old.held["batch"]["id"])
                assert batch.status == "completed" and batch.request_counts is not None
                assert (batch.request_counts.completed, batch.request_counts.failed) == (4, 0)
                assert batch.output_file_id is not None
                text = (await client.files.content(batch.output_file_id)).text
            output = [json.loads(line) for line in text.splitlines()]
            assert sorted(line["custom_id"] for line in output) == [f"line-{n}" for n in range(4)]
            assert all(line["response"]["status_code"] == 200 for line in output)

            # And the spend the old release recorded is still counted, with the new spend on top
            after = await _spend(store_url)
            assert all(after[tenant] > spent for tenant, spent in ledger_spend.items())


def _expect_states(old: OldData) -> None:
    """The states the old release left its jobs in, as it read them."""
    records = old.records()

    def state(job_id: str) -> str:
        return str(records[job_id]["state"])

    assert {state(job_id) for job_id in old.served["answered"]} == {"succeeded"}
    assert state(old.served["response"]["job_id"]) == "succeeded"
    assert state(old.served["dead"]) == "dead"
    assert {state(job_id) for job_id in old.served["provider_batch_jobs"]} == {"delayed"}
    # The old release's upkeep queues them again once their wait for the batch is over.
    last = {old.last[job_id]["state"] for job_id in old.served["provider_batch_jobs"]}
    assert last <= {"delayed", "queued"}
    assert {state(job_id) for job_id in old.held["leased"]} == {"leased"}
    assert state(old.queued["retrying"]) == "failed"
    assert state(old.queued["dead_by_hand"]) == "dead"
    assert [state(job_id) for job_id in old.queued["queued"]] == ["queued"] * 5
    assert [records[job_id]["priority"] for job_id in old.queued["queued"]] == [int(p) for p in Priority]
    assert state(old.queued["delayed"]) == "delayed"


def _expect_results(old: OldData, finals: dict[str, Any], new_worker: str) -> None:
    """Each job ended as its history says: answers kept, leases recovered, retries made,
    provider batches collected."""
    for job_id, answer in old.served["answered"].items():
        assert finals[job_id].result == old.records()[job_id]["result"]
        response = finals[job_id].result["response"]
        if "choices" in answer:  # what the old gateway answered is what the job keeps
            assert response["choices"][0]["message"] == {
                key: value for key, value in answer["choices"][0]["message"].items() if value is not None}
        else:
            assert len(response["data"]) == len(answer["data"]) == 1
    assert finals[old.served["dead"]].failure == old.records()[old.served["dead"]]["failure"]
    for job_id in old.held["leased"]:
        job = finals[job_id]
        assert job.attempts == 2 and "lease expired" in job.errors[0], (job.attempts, job.errors)
        assert job.result["worker_id"] == new_worker
    retried = finals[old.queued["retrying"]]
    assert retried.errors[0] == "upstream 503 (simulated)" and retried.result["worker_id"] == new_worker
    for job_id, entry in old.served["provider_batches"].items():
        assert finals[job_id].result["route"] == f"provider batch {entry['provider']}/{entry['batch_id']}"


async def _spend(url: str) -> dict[str, int]:
    from tidegate.coord.budget import budget_ledger_for

    ledger = budget_ledger_for(url)
    async with ledger:
        return await ledger.spend_today()


async def _until_ended(client: AsyncOpenAI, batch_id: str) -> Any:
    ended = ("completed", "failed", "expired", "cancelled")
    return await eventually(lambda: client.batches.retrieve(batch_id), f"batch {batch_id} ends",
                            until=lambda batch: batch.status in ended, timeout_s=WAIT_S, every_s=0.1)


# ---------------------------------------------------------------------- the change flow

PRODUCTS = 12


def _execute(path: Path, *statements: str) -> None:
    conn = sqlite3.connect(path, isolation_level=None, timeout=30)
    try:
        conn.execute("BEGIN IMMEDIATE")
        for statement in statements:
            conn.execute(statement)
        conn.execute("COMMIT")
    finally:
        conn.close()


@pytest.fixture
def shop(tmp_path: Path) -> Iterator[Path]:
    """A source database with one table of products."""
    path = tmp_path / "shop.db"
    _execute(path, "CREATE TABLE products (id INTEGER PRIMARY KEY, name TEXT NOT NULL, price REAL)",
             *(f"INSERT INTO products VALUES ({n}, 'product {n}', {n}.5)" for n in range(PRODUCTS)))
    yield path


async def test_the_change_flow_resumes_from_the_position_the_old_release_left(
    old_release: OldRelease, shop: Path, redis_server: str, tmp_path: Path
) -> None:
    from tidegate.app.sync import open_sync
    from tidegate.config import SyncConfig
    from tidegate.sync.cache import open_cache

    prefix = f"upg{uuid.uuid4().hex[:10]}"
    args = {"queue_url": f"sqlite:///{tmp_path / 'queue.db'}", "source_url": f"sqlite:///{shop}",
            "bus_url": redis_server, "cache_url": redis_server, "prefix": prefix, "table": "products",
            "rows": PRODUCTS}
    try:
        # Given the old release's change flow (its triggers on the source, its checkpoint in the
        # Redis cache, its consumer group on the Redis Streams bus) caught up and stopped
        before = (await asyncio.to_thread(old_release.run, "sync", args))["entries"]
        assert len(before) == PRODUCTS
        # And changes committed while no sync runs
        _execute(shop, "UPDATE products SET price = 99.0 WHERE id = 1",
                 "DELETE FROM products WHERE id = 2",
                 f"INSERT INTO products VALUES ({PRODUCTS}, 'product new', 1.0)")
        _execute(shop, "UPDATE products SET name = 'renamed' WHERE id = 3")

        # When this release's change flow starts on the same source, bus and cache
        sync = SyncConfig(source_url=args["source_url"], bus_url=redis_server, cache_url=redis_server,
                          prefix=prefix, tables=("products",))
        config = TidegateConfig(queue_url=str(args["queue_url"]), sync=sync)
        async with open_cache(sync) as cache, open_sync(config, cache=cache) as pipeline:
            stop_event = asyncio.Event()
            task = asyncio.create_task(pipeline.run(stop_event))
            try:
                async def renamed() -> bool:
                    assert not task.done(), task
                    entry = await cache.get("products", "3")
                    return entry is not None and entry.data is not None and entry.data["name"] == "renamed"

                await eventually(renamed, "the rename reaches the cache", timeout_s=WAIT_S)
            finally:
                stop_event.set()
                await task
            after = {entry.entity_id: entry async for entry in cache.scan("products")}
            tombstone = await cache.get("products", "2")

        # Then the changes made meanwhile are applied, the deleted row is a tombstone
        data = {key: entry.data or {} for key, entry in after.items()}
        assert data["1"]["price"] == 99.0 and data["3"]["name"] == "renamed"
        assert data[str(PRODUCTS)]["name"] == "product new"
        assert "2" not in after and tombstone is not None and tombstone.deleted
        # And nothing the old release had applied is replayed: the rows untouched since keep the
        # version and revision the old release wrote (no new snapshot was taken)
        untouched = [key for key in before if key not in {"1", "2", "3"}]
        kept = {key: (list(after[key].version), after[key].revision, after[key].data) for key in untouched}
        assert kept == {key: (before[key]["version"], before[key]["revision"], before[key]["data"])
                        for key in untouched}
        changed = [after["1"].version, tombstone.version, after["3"].version]
        assert all(version > max(tuple(before[key]["version"]) for key in before) for version in changed)
    finally:
        await delete_keys(redis_server, f"*{prefix}*")


