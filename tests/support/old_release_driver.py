"""Writes and reads tidegate's stores through the public API of whichever tidegate it imports: the
upgrade tests run it with the previous release first on PYTHONPATH (tests/support/old_release.py),
so the data they hand to the new release is what the old code itself wrote.

    python old_release_driver.py COMMAND 'JSON ARGUMENTS'

prints one line `RESULT <json>` on stdout (logs go to stderr). Commands:

    probe    where `tidegate` was imported from
    served   tenants and keys (one revoked), jobs answered through the gateway by a worker
             (results, spend; a response among them), a job dead by the worker, BULK jobs
             waiting in a provider batch; the worker then stops gracefully
    held     a Batch API batch (a file uploaded through the gateway, its LOW lines half answered)
             and jobs a worker holds mid-call: prints RESULT, then `holding`, and waits to be killed
    queue    jobs queued at every level, delayed, failed awaiting a retry, dead by hand; spend
    sync     the change flow (SQLite source → bus → entity cache) until the cache holds the table
    read     jobs, spend and keys as this code reads them
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import httpx2
from openai import AsyncOpenAI, DefaultAsyncHttpxClient

import tidegate
from tidegate.app.components import Components
from tidegate.app.gateway import open_gateway_state
from tidegate.config import (
    ProviderBatchConfig,
    ProviderConfig,
    SyncConfig,
    TidegateConfig,
    WorkerSettings,
)
from tidegate.coord.budget import budget_ledger_for
from tidegate.coord.tenants import Tenant, tenant_store_for
from tidegate.dispatch.worker import Worker
from tidegate.gateway.app import create_app
from tidegate.jobs import Job, Priority
from tidegate.queue import Queue

try:  # this release: provider batches, their store included, are one package of the dispatcher
    from tidegate.dispatch.provider_batches.store import provider_batch_store_for
except ImportError:  # the previous release kept their store among the coordination state
    from tidegate.coord.provider_batches import provider_batch_store_for  # type: ignore[import-not-found,no-redef]
# The tests of this release import this module too (its models, tenants and records): the price
# table lives with the simulator now; v0.1.0 kept it in tidegate.config.
try:
    from tidegate.simulator.catalogue import default_models
except ImportError:
    from tidegate.config import default_models

GATEWAY = "http://old-gateway.invalid"  # an in-process ASGI app: never resolved
FAST_MODEL = "deepseek-v3.2"
SLOW_MODEL = "gpt-4.1"  # the tests make the simulator hold its calls while `held` runs
TWO_DAYS_S = 48 * 3600.0
TENANTS = (
    Tenant(name="acme", max_priority=Priority.HIGH, daily_budget_usd=Decimal("25")),
    Tenant(name="globex", max_priority=Priority.NORMAL,
           allowed_models=(FAST_MODEL, "text-embedding-3-small")),
    Tenant(name="ops", max_priority=Priority.CRITICAL, admin=True),
)
WAIT_S = 30.0

Args = dict[str, Any]


def chat(text: str, model: str = FAST_MODEL, **body: Any) -> dict[str, Any]:
    """An AI job payload for a chat completion."""
    return {"kind": "chat", "body": {"model": model, "messages": [{"role": "user", "content": text}], **body}}


def config_of(args: Args, *, provider_batches: bool) -> TidegateConfig:
    """The simulator at `sim_url` as the one provider; with `provider_batches`, BULK jobs with a
    far deadline go to its batch API."""
    batch = (ProviderBatchConfig(gather_s=0.3, poll_s=0.2, kinds=("chat", "embeddings"))
             if provider_batches else None)
    provider = ProviderConfig(name="sim", base_url=args["sim_url"], models=default_models(), batch=batch)
    return TidegateConfig(queue_url=args["queue_url"], providers=(provider,))


def job_record(job: Job | None) -> dict[str, Any] | None:
    """A job as JSON, the fields both releases must read alike."""
    if job is None:
        return None
    return {
        "id": job.id, "priority": int(job.priority), "tenant": job.tenant, "state": str(job.state),
        "attempts": job.attempts, "max_attempts": job.max_attempts, "payload": job.payload,
        "result": job.result, "last_error": job.last_error, "errors": list(job.errors),
        "failure": job.failure, "idempotency_key": job.idempotency_key,
        "not_before_ms": _ms(job.not_before), "deadline_ms": _ms(job.deadline),
        "created_ms": _ms(job.created_at),
    }


def _ms(moment: Any) -> int | None:
    return None if moment is None else int(moment.timestamp() * 1000)


async def until(check: Callable[[], Awaitable[bool]], what: str, timeout_s: float = WAIT_S) -> None:
    """Poll `check` until it holds; fail naming `what` at the timeout."""
    give_up = time.monotonic() + timeout_s
    while not await check():
        if time.monotonic() > give_up:
            raise SystemExit(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


@dataclass
class Running:
    """A worker and a gateway of this release in one process, sharing its parts."""

    parts: Components
    worker: Worker
    http: httpx2.AsyncClient

    def openai(self, key: str) -> AsyncOpenAI:
        """The official SDK pointed at the in-process gateway."""
        return AsyncOpenAI(base_url=f"{GATEWAY}/v1", api_key=key, http_client=self.http, max_retries=0)


@contextlib.asynccontextmanager
async def running(config: TidegateConfig, settings: WorkerSettings) -> AsyncIterator[Running]:
    """Parts opened as `tidegate worker` opens them, a worker serving in the background and a
    gateway answering through an ASGI transport; the worker stops gracefully at the end."""
    async with Components.open(config, batches=True, provider_batches=True) as parts:
        worker = Worker(parts.queue, config, settings, relay=parts.relay, tenants=parts.tenants,
                        ledger=parts.ledger)
        async with worker, open_gateway_state(config, queue=parts.queue, tenants=parts.tenants,
                                              ledger=parts.ledger, relay=parts.relay, recs_url=None) as state:
            task = asyncio.create_task(worker.run())
            # The SDK's own client class (openai speaks httpx2), its transport the app itself.
            transport = httpx2.ASGITransport(app=create_app(state))
            try:
                async with DefaultAsyncHttpxClient(transport=transport, base_url=GATEWAY,
                                                   timeout=WAIT_S) as http:
                    yield Running(parts, worker, http)
            finally:
                worker.request_stop()
                await task


# ---------------------------------------------------------------------- commands


async def probe(args: Args) -> Args:
    """Which tidegate this is."""
    return {"file": tidegate.__file__, "version": getattr(tidegate, "__version__", None)}


async def served(args: Args) -> Args:
    """Tenants, keys, answered and dead jobs, spend and a pending provider batch."""
    config = config_of(args, provider_batches=True)
    settings = WorkerSettings(concurrency=8, lease_s=5.0, claim_wait_s=0.1)
    async with running(config, settings) as old:
        queue, tenants = old.parts.queue, old.parts.tenants
        keys: dict[str, str] = {}
        for made in TENANTS:
            await tenants.put_tenant(made)
            _, keys[made.name] = await tenants.create_key(made.name)
        revoked_info, revoked = await tenants.create_key("acme")
        assert await tenants.revoke_key(revoked_info.key_id)
        # Answered through the gateway, as an application's calls are: results and spend.
        answered: dict[str, Any] = {}
        for tenant, priority in (("acme", "high"), ("globex", "normal")):
            raw = await old.openai(keys[tenant]).chat.completions.with_raw_response.create(
                model=FAST_MODEL, messages=[{"role": "user", "content": f"Hello from {tenant}"}],
                extra_headers={"X-Priority": priority})
            answered[raw.headers["X-Tidegate-Job-Id"]] = raw.parse().model_dump(mode="json")
        raw_embedding = await old.openai(keys["acme"]).embeddings.with_raw_response.create(
            model="text-embedding-3-small", input="an embedding")
        answered[raw_embedding.headers["X-Tidegate-Job-Id"]] = raw_embedding.parse().model_dump(mode="json")
        # A response (the Responses API): its request is kept in the job's payload as its origin.
        raw_response = await old.openai(keys["acme"]).responses.with_raw_response.create(
            model=FAST_MODEL, input="Hello from a response", instructions="Be brief.",
            metadata={"ticket": "t-1"}, extra_body={"temperature": None})
        answered_response = raw_response.parse()
        response = {"job_id": raw_response.headers["X-Tidegate-Job-Id"], "id": answered_response.id,
                    "output_text": answered_response.output_text}
        # Dead by the worker: no route to the model, a failure recorded with it.
        dead_id = await queue.enqueue(chat("no such model", model="no-such-model"), tenant="acme")
        assert (await queue.wait(dead_id, WAIT_S)).state == "dead"
        # BULK jobs with a far deadline: sent to the provider's batch API, waiting there.
        batched = await queue.enqueue_many(
            {"payload": chat(f"Summarise item {n}", max_tokens=40), "priority": "bulk", "tenant": "acme",
             "timeout_s": TWO_DAYS_S} for n in range(3))

        async def waiting() -> bool:
            jobs = [await queue.get(job_id) for job_id in batched]
            return all(job is not None and (job.last_error or "").startswith("waiting in provider batch")
                       for job in jobs)

        await until(waiting, "the BULK jobs to wait in a provider batch")
    return {"keys": keys, "revoked_key": revoked, "answered": answered, "response": response, "dead": dead_id,
            "provider_batch_jobs": batched,
            **await read({**args, "ids": [*answered, response["job_id"], dead_id, *batched]})}


async def held(args: Args) -> Args:
    """A batch half answered, and jobs held by a worker that is about to be killed."""
    config = config_of(args, provider_batches=False)
    # Levels 0-3 only: the BULK jobs waiting in their provider batch stay the new release's.
    settings = WorkerSettings(concurrency=8, lease_s=8.0, claim_wait_s=0.1, priorities=(0, 1, 2, 3),
                              worker_id="old-worker-killed")
    async with running(config, settings) as old:
        client = old.openai(args["key"])
        lines = [{"custom_id": f"line-{n}", "method": "POST", "url": "/v1/chat/completions",
                  "body": chat(f"Batch line {n}", FAST_MODEL if n < 2 else SLOW_MODEL)["body"]}
                 for n in range(4)]
        upload = await client.files.create(
            file=("requests.jsonl", "\n".join(json.dumps(line) for line in lines).encode()), purpose="batch")
        batch = await client.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions",
                                            completion_window="24h", extra_body={"priority": "low"})
        leased = await old.parts.queue.enqueue_many(
            {"payload": chat(f"Held {n}", SLOW_MODEL), "tenant": "acme"} for n in range(2))

        async def half_done() -> bool:
            counts = (await client.batches.retrieve(batch.id)).request_counts
            stats = await old.parts.queue.stats()
            return counts is not None and counts.completed == 2 and stats.in_flight == 4

        await until(half_done, "two batch lines answered and four calls in flight")
        seen = (await client.batches.retrieve(batch.id)).model_dump(mode="json")
        records = {"jobs": {job_id: job_record(await old.parts.queue.get(job_id)) for job_id in leased}}
        # Inside the block: leaving it would stop the worker gracefully. It is killed here instead.
        print("RESULT " + json.dumps({"batch": seen, "input_file": upload.id, "leased": leased, **records}),
              flush=True)
        print("holding", flush=True)
        await asyncio.sleep(3600)
    raise SystemExit("held for an hour without being killed")


async def queue_states(args: Args) -> Args:
    """Jobs in every waiting state, written by hand through the queue API, and recorded spend."""
    async with Queue.from_url(args["queue_url"], maintenance_interval_s=None) as queue:
        # Claimed at CRITICAL before anything else waits there, so each claim takes its own job.
        retrying = await queue.enqueue(chat("Retry me"), priority="critical", tenant="acme")
        [job] = await queue.claim("old-worker-failing", priorities=[0], timeout_s=5)
        assert job.id == retrying, (job.id, retrying)
        assert await queue.fail(job, "upstream 503 (simulated)", retry_in_s=args["retry_in_s"]) == "failed"
        dead = await queue.enqueue(chat("Redrive me"), priority="critical", tenant="acme", max_attempts=1)
        [job] = await queue.claim("old-worker-failing", priorities=[0], timeout_s=5)
        assert job.id == dead, (job.id, dead)
        assert await queue.fail(job, "upstream 500 (simulated)") == "dead"
        queued = [await queue.enqueue(chat(f"Queued at {level}"), priority=level, tenant="acme",
                                      idempotency_key=f"queued-{level}") for level in range(5)]
        delayed = await queue.enqueue(chat("Later"), priority="high", tenant="acme", delay_s=args["delay_s"])
        stats = await queue.stats()
    ledger = budget_ledger_for(args["queue_url"])
    async with ledger:
        await ledger.record("globex", 123_456)
    return {"retrying": retrying, "dead_by_hand": dead, "queued": queued, "delayed": delayed,
            "stats": {"depth": stats.depth, "delayed": stats.delayed, "dead": stats.dead},
            **await read({**args, "ids": [retrying, dead, *queued, delayed]})}


async def sync(args: Args) -> Args:
    """The change flow until the cache holds every row of the source's one table."""
    from tidegate.app.sync import open_sync
    from tidegate.sync.cache import open_cache

    sync_config = SyncConfig(source_url=args["source_url"], bus_url=args["bus_url"],
                             cache_url=args["cache_url"], prefix=args["prefix"], tables=(args["table"],))
    config = TidegateConfig(queue_url=args["queue_url"], sync=sync_config)
    async with open_cache(sync_config) as cache, open_sync(config, cache=cache) as pipeline:
        stop = asyncio.Event()
        task = asyncio.create_task(pipeline.run(stop))

        async def caught_up() -> bool:
            if task.done():
                task.result()
            return bool(await cache.count(args["table"]) == args["rows"])

        try:
            await until(caught_up, f"the cache to hold {args['rows']} rows")
        finally:
            stop.set()
            await task
        entries = {entry.entity_id: {"data": entry.data, "version": list(entry.version),
                                     "revision": entry.revision}
                   async for entry in cache.scan(args["table"])}
    return {"entries": entries}


async def read(args: Args) -> Args:
    """Jobs (`ids`), today's spend and whether each key of `keys` authenticates, as this code
    reads them."""
    url = args["queue_url"]
    async with Queue.from_url(url, maintenance_interval_s=None) as queue:
        jobs = {job_id: job_record(await queue.get(job_id)) for job_id in args.get("ids", [])}
    ledger = budget_ledger_for(url)
    async with ledger:
        spend = await ledger.spend_today()
    tenants = tenant_store_for(url, auth_cache_s=0)
    async with tenants:
        keys = {name: (tenant.name if (tenant := await tenants.authenticate(key)) else None)
                for name, key in args.get("keys", {}).items()}
    result: Args = {"jobs": jobs, "spend": spend, "authenticated": keys}
    batched = [job_id for job_id in args.get("ids", []) if jobs[job_id] is not None]
    if batched:
        store = provider_batch_store_for(url)
        try:
            entries = await store.jobs(batched)
            result["provider_batches"] = {job_id: {"provider": entry.provider, "batch_id": entry.batch_id}
                                          for job_id, entry in entries.items()}
        finally:
            await store.close()
    return result


COMMANDS: dict[str, Callable[[Args], Coroutine[Any, Any, Args]]] = {
    "probe": probe, "served": served, "held": held, "queue": queue_states, "sync": sync, "read": read}


def main(argv: list[str]) -> None:
    """Run one command and print its RESULT line."""
    command, args = argv[1], json.loads(argv[2]) if len(argv) > 2 else {}
    result: Args = asyncio.run(COMMANDS[command](args))
    print("RESULT " + json.dumps(result, default=str), flush=True)


if __name__ == "__main__":
    main(sys.argv)
