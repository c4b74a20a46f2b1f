"""A synchronous call that the daily budget cannot serve is answered 429 `budget_exhausted` at
once, in its API's own error shape and with Retry-After until the budgets start afresh, and leaves
nothing in the queue; one that got past the door before the budget ran out is ended by the worker
at once with the same answer. Asynchronous jobs still wait for budget (`on_exhausted = "defer"`).
Real gateway, worker and simulator, on every queue backend."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator
from decimal import Decimal
from typing import Any

import httpx
import pytest

from conftest import QueueFactory
from support.dispatch import running_worker
from support.gateway import CHAT, Gateway, open_gateway, with_legacy_models
from support.redis_keys import redis_client
from support.waiting import eventually
from tidegate.config import BudgetConfig, TidegateConfig, WorkerSettings
from tidegate.costs import usd_to_micros
from tidegate.jobs import JobState

LIMIT_USD = Decimal("1.00")  # acme's daily budget; its whole amount is spent before each call
HELLO = [{"role": "user", "content": "Say hello"}]

# (name, path, body, whether the answer is Anthropic-shaped): every API a caller waits on.
CALLS: list[tuple[str, str, dict[str, Any], bool]] = [
    ("chat", "/v1/chat/completions", CHAT, False),
    ("chat-stream", "/v1/chat/completions", {**CHAT, "stream": True}, False),
    ("completion", "/v1/completions", {"model": "gpt-3.5-turbo-instruct", "prompt": "Say hello"}, False),
    ("embeddings", "/v1/embeddings", {"model": "auto", "input": "red shoes"}, False),
    ("responses", "/v1/responses", {"model": "auto", "input": "Say hello"}, False),
    ("responses-stream", "/v1/responses", {"model": "auto", "input": "Say hello", "stream": True}, False),
    ("responses-compact", "/v1/responses/compact", {"model": "auto", "input": "Say hello"}, False),
    ("messages", "/v1/messages", {"model": "auto", "max_tokens": 64, "messages": HELLO}, True),
    ("messages-stream", "/v1/messages", {"model": "auto", "max_tokens": 64, "messages": HELLO,
                                         "stream": True}, True),
]


def budgeted(config: TidegateConfig) -> TidegateConfig:
    """The gateway's and the worker's config: acme's budget, in the default mode (defer), with
    OpenAI's legacy models served too."""
    budgets = BudgetConfig(tenant_daily_usd={"acme": LIMIT_USD})
    return with_legacy_models(config).model_copy(update={"budgets": budgets})


@pytest.fixture
async def gw(queue_factory: QueueFactory) -> AsyncIterator[Gateway]:
    async with open_gateway(queue_factory, worker=False, configure=budgeted) as gateway:
        yield gateway


async def spend(gw: Gateway, tenant: str, usd: Decimal) -> None:
    """Record spend for the tenant today, as workers do."""
    await gw.state.ledger.record(tenant, usd_to_micros(usd))


async def stored_jobs(factory: QueueFactory) -> int:
    """Every job the queue's storage holds, in any state, counted in the storage itself."""
    if factory.backend == "sqlite":
        with sqlite3.connect(factory.url.removeprefix("sqlite:///")) as conn:
            return int(conn.execute("SELECT COUNT(*) FROM jobs").fetchone()[0])
    redis = redis_client(factory.url)
    try:
        return int(await redis.hlen(f"tidegate:{{{factory.queue_name}}}:jobs"))
    finally:
        await redis.aclose()


async def assert_nothing_queued(gw: Gateway, factory: QueueFactory) -> None:
    stats = await gw.queue.stats()
    assert (stats.depth, stats.in_flight, stats.delayed, stats.dead) == (0, 0, 0, 0)
    assert await stored_jobs(factory) == 0


def assert_budget_refusal(answer: httpx.Response, anthropic: bool) -> dict[str, Any]:
    """A 429 budget_exhausted in the API's own shape, with Retry-After up to the next UTC midnight
    and the SDKs told not to retry; returns the error's inside."""
    assert answer.status_code == 429, answer.text
    document = answer.json()
    if anthropic:
        assert document["type"] == "error"
        error = document["error"]
        assert error["type"] == "rate_limit_error"
    else:
        error = document["error"]
        assert set(error) >= {"message", "type", "param", "code"}
        assert error["type"] == "insufficient_quota"
    assert error["code"] == "budget_exhausted"
    assert "tenant 'acme' daily budget is exhausted" in error["message"]
    assert 0 < int(answer.headers["Retry-After"]) <= 86_400
    assert answer.headers["x-should-retry"] == "false"
    return dict(error)


@pytest.mark.parametrize(("path", "body", "anthropic"), [call[1:] for call in CALLS],
                         ids=[call[0] for call in CALLS])
async def test_an_out_of_budget_call_is_refused_at_once_and_leaves_no_job(
    gw: Gateway, queue_factory: QueueFactory, path: str, body: dict[str, Any], anthropic: bool
) -> None:
    # Given acme's whole daily budget spent, and no worker at all: an answer can only come from
    # the door (without it the call would wait its whole timeout for a job nobody serves)
    await spend(gw, "acme", LIMIT_USD)

    answer = await gw.http.post(path, json=body, headers={**gw.auth("acme"), "X-Tidegate-Timeout": "600"})

    assert_budget_refusal(answer, anthropic)
    await assert_nothing_queued(gw, queue_factory)


async def test_a_call_within_the_budget_and_another_tenant_s_are_served(queue_factory: QueueFactory) -> None:
    async with open_gateway(queue_factory, configure=budgeted) as gw:
        served = await gw.http.post("/v1/chat/completions", json=CHAT, headers=gw.auth("acme"))
        await spend(gw, "acme", LIMIT_USD)
        other = await gw.http.post("/v1/chat/completions", json=CHAT, headers=gw.auth("globex"))
        refused = await gw.http.post("/v1/chat/completions", json=CHAT, headers=gw.auth("acme"))

    assert served.status_code == 200 and other.status_code == 200
    assert_budget_refusal(refused, anthropic=False)


async def test_a_call_above_the_whole_daily_budget_says_so(gw: Gateway, queue_factory: QueueFactory) -> None:
    body = {**CHAT, "model": "gpt-4.1", "max_tokens": 1_000_000}  # an estimate of $8 against $1

    answer = await gw.http.post("/v1/chat/completions", json=body, headers=gw.auth("acme"))

    assert answer.status_code == 429
    error = answer.json()["error"]
    assert error["code"] == "budget_exceeds_limit" and "can never run" in error["message"]
    assert answer.headers["x-should-retry"] == "false" and "Retry-After" not in answer.headers
    await assert_nothing_queued(gw, queue_factory)


async def test_a_repeated_idempotency_key_gets_its_first_answer_even_with_the_budget_spent(
    queue_factory: QueueFactory,
) -> None:
    async with open_gateway(queue_factory, configure=budgeted) as gw:
        headers = {**gw.auth("acme"), "Idempotency-Key": "summary-7"}
        first = await gw.http.post("/v1/chat/completions", json=CHAT, headers=headers)
        await spend(gw, "acme", LIMIT_USD)
        again = await gw.http.post("/v1/chat/completions", json=CHAT, headers=headers)

    assert first.status_code == again.status_code == 200
    assert again.headers["X-Tidegate-Job-Id"] == first.headers["X-Tidegate-Job-Id"]


async def test_a_job_that_passed_the_door_is_ended_by_the_worker_with_the_same_answer(
    gw: Gateway, queue_factory: QueueFactory
) -> None:
    # Given a call that got past the door and waits for its job, no worker serving yet
    call = asyncio.create_task(gw.http.post("/v1/chat/completions", json=CHAT, headers=gw.auth("acme")))
    await eventually(lambda: _depth(gw, 1), "the call's job is queued")
    job = await _only_job(gw)
    assert job is not None and job.caller_waits

    # When the budget runs out before a worker reserves for it (defer mode), and a worker starts
    await spend(gw, "acme", LIMIT_USD)
    worker_queue = await queue_factory.open(maintenance_interval_s=0.2)
    async with running_worker(worker_queue, gw.state.config,
                              WorkerSettings(concurrency=4, lease_s=5.0, claim_wait_s=0.1)):
        answer = await asyncio.wait_for(call, 30)

    # Then the caller is answered 429 and the job has ended (not deferred), saying why
    assert_budget_refusal(answer, anthropic=False)
    ended = await gw.queue.get(job.id)
    assert ended is not None and ended.state is JobState.DEAD
    assert ended.failure is not None and ended.failure["code"] == "budget_exhausted"
    stats = await gw.queue.stats()
    assert (stats.depth, stats.in_flight, stats.delayed) == (0, 0, 0)


async def test_asynchronous_jobs_still_wait_for_budget(gw: Gateway, queue_factory: QueueFactory) -> None:
    await spend(gw, "acme", LIMIT_USD)

    accepted = await gw.http.post("/v1/jobs", headers=gw.auth("acme"), json={"kind": "chat", "body": CHAT})
    assert accepted.status_code == 202
    [job_id] = accepted.json()["ids"]
    worker_queue = await queue_factory.open(maintenance_interval_s=0.2)
    async with running_worker(worker_queue, gw.state.config,
                              WorkerSettings(concurrency=4, lease_s=5.0, claim_wait_s=0.1)):
        await eventually(lambda: _delayed(gw, 1), "the job is deferred")

    job = await gw.queue.get(job_id)
    assert job is not None and job.state is JobState.DELAYED and not job.caller_waits
    assert job.last_error is not None and "budget exhausted" in job.last_error


async def test_a_critical_call_is_never_refused_by_a_budget(queue_factory: QueueFactory) -> None:
    def ops_budget(config: TidegateConfig) -> TidegateConfig:
        return config.model_copy(update={"budgets": BudgetConfig(tenant_daily_usd={"ops": LIMIT_USD})})

    async with open_gateway(queue_factory, configure=ops_budget) as gw:
        await spend(gw, "ops", LIMIT_USD)
        headers = {**gw.auth("ops"), "X-Priority": "critical"}
        answer = await gw.http.post("/v1/chat/completions", json=CHAT, headers=headers)

    assert answer.status_code == 200, answer.text


async def _depth(gw: Gateway, count: int) -> bool:
    return (await gw.queue.stats()).depth == count


async def _delayed(gw: Gateway, count: int) -> bool:
    return (await gw.queue.stats()).delayed == count


async def _only_job(gw: Gateway) -> Any:
    """The one job waiting in the queue, claimed and given straight back to read it."""
    [job] = await gw.queue.claim("reader", limit=1)
    await gw.queue.release(job)
    return await gw.queue.get(job.id)
