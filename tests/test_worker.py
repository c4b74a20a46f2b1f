"""The worker against the real simulated provider over loopback, on both queue backends."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import replace
from decimal import Decimal

import orjson
import pytest
from aiohttp import web

from conftest import QueueFactory
from support.claims import ClaimWaits
from support.dispatch import chat, queue_url_of, running_worker, sim_config, wait_final, wait_received
from support.waiting import eventually
from tidegate.app.components import open_worker_parts
from tidegate.callback_urls import SIGNATURE_HEADER, verify
from tidegate.config import BudgetConfig, CallbackConfig
from tidegate.coord.budget import budget_ledger_for
from tidegate.coord.tenants import Tenant, tenant_store_for
from tidegate.costs import usd_to_micros
from tidegate.dispatch.callbacks import CallbackSender
from tidegate.dispatch.metrics import DispatchMetrics
from tidegate.dispatch.worker import Worker, WorkerSettings
from tidegate.jobs import JobState, Priority
from tidegate.queue import Queue
from tidegate.simulator.server import InjectedFault, Simulator
from tidegate.simulator.settings import SimulatorSettings


@pytest.fixture
async def simulator() -> AsyncIterator[tuple[Simulator, str]]:
    sim = Simulator(SimulatorSettings(seed=3, window_s=1.0))
    async with sim.running() as base_url:
        yield sim, base_url


@pytest.fixture
async def queue(queue_factory: QueueFactory) -> Queue:
    # Fast retries and upkeep, so retry and recovery paths finish within a test.
    return await queue_factory.open(maintenance_interval_s=0.2, retry_base_s=0.05, retry_max_s=0.2)


async def test_a_chat_job_records_model_usage_cost_and_timings(
    queue: Queue, simulator: tuple[Simulator, str]
) -> None:
    _, base_url = simulator
    job_id = await queue.enqueue(chat(), priority="critical", tenant="acme")
    async with running_worker(queue, sim_config(base_url)):
        [job] = await wait_final(queue, [job_id])
    assert job.state is JobState.SUCCEEDED, job.last_error
    result = job.result
    assert result["model"] == "claude-sonnet-4.5"  # critical → the premium tier's first model
    assert result["response"]["choices"][0]["message"]["content"]
    usage = result["usage"]
    assert usage["prompt_tokens"] > 0 and usage["completion_tokens"] > 0
    expected = (Decimal(usage["prompt_tokens"]) * Decimal("3.00")
                + Decimal(usage["completion_tokens"]) * Decimal("15.00")) / 1_000_000
    assert Decimal(result["cost_usd"]) >= expected
    assert Decimal(result["cost_usd"]) - expected < Decimal("0.000001")
    assert result["queue_wait_ms"] >= 0 and result["upstream_latency_ms"] > 0
    assert result["attempts"] == 1


@pytest.mark.parametrize("retry_after_format", ["seconds", "http-date"])
async def test_a_429_pauses_the_model_and_the_job_waits_out_retry_after_in_the_queue(
    queue: Queue, simulator: tuple[Simulator, str], retry_after_format: str
) -> None:
    # Given a provider that takes one request per second for this model
    sim, base_url = simulator
    sim.configure({"retry_after_format": retry_after_format,
                   "models": {"gpt-4.1": {"rpm": 1}}})
    ids = [await queue.enqueue(chat(model="gpt-4.1")) for _ in range(2)]
    # When a worker that does not know that limit sends both
    metrics = DispatchMetrics()
    async with running_worker(queue, sim_config(base_url), metrics=metrics):
        jobs = await wait_final(queue, ids)
    assert metrics.registry.get_sample_value("tidegate_upstream_429_total", {"model": "gpt-4.1"}) == 1
    assert (metrics.registry.get_sample_value(
        "tidegate_limiter_paused_until_seconds", {"model": "gpt-4.1"}) or 0) > 0
    # Then the 429 sent one job back to wait, and the pause kept everyone off the model meanwhile
    assert all(job.state is JobState.SUCCEEDED for job in jobs), [job.errors for job in jobs]
    retried = [job for job in jobs if job.attempts == 2]
    assert len(retried) == 1
    assert "429" in retried[0].errors[0] or "rate" in retried[0].errors[0].lower()
    stats = sim.stats()["gpt-4.1"]
    assert stats.by_status[429] == 1
    accepted = sorted(stats.accepted_at_s)
    assert accepted[1] - accepted[0] >= 0.9  # the retry waited for the provider's window


@pytest.mark.parametrize(("status", "answered"), [(400, 400), (401, 502), (403, 502), (404, 404), (422, 422)])
async def test_client_errors_dead_letter_at_once_with_the_provider_s_status_and_message(
    queue: Queue, simulator: tuple[Simulator, str], status: int, answered: int
) -> None:
    sim, base_url = simulator
    sim.inject("gemini-2.5-flash", InjectedFault("status", status=status, message=f"nope {status}"))
    job_id = await queue.enqueue(chat(model="gemini-2.5-flash"), max_attempts=5)
    async with running_worker(queue, sim_config(base_url)):
        [job] = await wait_final(queue, [job_id])
    assert job.state is JobState.DEAD
    assert job.attempts == 1
    assert f"nope {status}" in (job.last_error or "")
    assert sim.stats()["gemini-2.5-flash"].received == 1
    # The failure keeps the provider's status, except one refusing tidegate's own key or account
    failure = job.failure
    assert failure is not None
    assert (failure["status"], failure.get("upstream_status"), failure.get("model")) == (
        answered, status, "gemini-2.5-flash")
    assert f"nope {status}" in failure["message"]
    if answered == status:
        assert failure["type"] == "invalid_request_error"
    else:
        assert (failure["type"], failure["code"]) == ("upstream_error", "upstream_auth_error")


async def test_a_provider_refusal_keeps_its_openai_type_code_and_param(
    queue: Queue, simulator: tuple[Simulator, str]
) -> None:
    _, base_url = simulator
    # The simulator refuses an unknown model the way OpenAI does: 404 model_not_found on `model`
    config = sim_config(base_url, model_overrides={"gpt-4.1": {"name": "gpt-4.1-preview"}})
    job_id = await queue.enqueue(chat(model="gpt-4.1-preview"))
    async with running_worker(queue, config):
        [job] = await wait_final(queue, [job_id])

    assert job.state is JobState.DEAD
    failure = job.failure
    assert failure is not None
    assert failure["status"] == failure.get("upstream_status") == 404
    assert (failure["type"], failure["code"], failure.get("param")) == (
        "invalid_request_error", "model_not_found", "model")
    assert "gpt-4.1-preview" in failure["message"]
    assert "answered HTTP" not in failure["message"]  # the provider's words, not tidegate's wrapping


async def test_routing_and_budget_refusals_record_their_status(
    queue_factory: QueueFactory, queue: Queue, simulator: tuple[Simulator, str]
) -> None:
    _, base_url = simulator
    config = sim_config(base_url, queue_url=queue_url_of(queue_factory),
                        budgets=BudgetConfig(tenant_daily_usd={"broke": Decimal("0")}, on_exhausted="reject"))
    unknown = await queue.enqueue(chat(model="gpt-9"))
    forbidden = await queue.enqueue({**chat(model="gpt-4.1"), "allowed_models": ["deepseek-v3.2"]})
    wrong_kind = await queue.enqueue(chat(model="text-embedding-3-small"))
    broke = await queue.enqueue(chat(model="gpt-4.1"), tenant="broke")
    invalid = await queue.enqueue({"kind": "chat", "body": {"messages": "hi"}})
    async with running_worker(queue, config):
        jobs = await wait_final(queue, [unknown, forbidden, wrong_kind, broke, invalid])

    assert [job.state for job in jobs] == [JobState.DEAD] * 5
    failures = [job.failure for job in jobs]
    assert all(failure is not None for failure in failures)
    assert [(f["status"], f["code"]) for f in failures if f is not None] == [
        (404, "model_not_found"), (403, "model_not_allowed"), (400, "wrong_model_kind"),
        (429, "budget_exceeds_limit"), (400, "invalid_request")]
    assert [job.last_error for job in jobs] == [f["message"] for f in failures if f is not None]


async def test_server_errors_retry_with_backoff_then_dead_letter_with_the_history(
    queue: Queue, simulator: tuple[Simulator, str]
) -> None:
    sim, base_url = simulator
    sim.configure({"models": {"gpt-4.1": {"error_rate": 1.0}}})
    job_id = await queue.enqueue(chat(model="gpt-4.1"), max_attempts=3)
    async with running_worker(queue, sim_config(base_url)):
        [job] = await wait_final(queue, [job_id])
    assert job.state is JobState.DEAD
    assert job.attempts == 3
    assert len(job.errors) == 3
    assert all(error.startswith("gpt-4.1:") and "500" in error for error in job.errors)
    assert job.last_error == job.errors[-1]
    failure = job.failure
    assert failure is not None
    assert (failure["status"], failure["code"]) == (502, "upstream_error")
    assert failure.get("upstream_status") == 500
    assert failure["message"] == f"the job failed after 3 attempt(s): {job.last_error}"


async def test_a_model_that_keeps_failing_falls_back_to_the_next_of_the_tier(
    queue: Queue, simulator: tuple[Simulator, str]
) -> None:
    sim, base_url = simulator
    sim.configure({"models": {"claude-sonnet-4.5": {"unavailable_rate": 1.0}}})
    job_id = await queue.enqueue(chat(), priority="critical", max_attempts=5)
    async with running_worker(queue, sim_config(base_url)):
        [job] = await wait_final(queue, [job_id])
    assert job.state is JobState.SUCCEEDED, job.errors
    assert job.result["model"] == "gpt-4.1"
    assert [error.split(":")[0] for error in job.errors] == ["claude-sonnet-4.5"] * 2


async def test_concurrent_reservations_never_overspend_a_tenant_budget(
    queue_factory: QueueFactory, queue: Queue, simulator: tuple[Simulator, str]
) -> None:
    # Given a tenant with $0.01 a day and 50 jobs each reserving about $0.0025 up front
    _, base_url = simulator
    limit_usd = Decimal("0.01")
    budgets = BudgetConfig(tenant_daily_usd={"acme": limit_usd}, on_exhausted="reject")
    config = sim_config(base_url, queue_url=queue_url_of(queue_factory), budgets=budgets)
    ids = await queue.enqueue_many(
        {"payload": chat(model="gemini-2.5-flash", max_tokens=1000), "tenant": "acme"} for _ in range(50)
    )
    # When 50 run at once
    async with running_worker(queue, config, WorkerSettings(concurrency=50, lease_s=5, claim_wait_s=0.2)):
        jobs = await wait_final(queue, ids)
    # Then what was spent never passed the budget, and the rest were refused with the reason
    succeeded = [job for job in jobs if job.state is JobState.SUCCEEDED]
    refused = [job for job in jobs if job.state is JobState.DEAD]
    assert len(succeeded) + len(refused) == 50
    assert succeeded and refused
    assert all("budget exhausted" in (job.last_error or "") for job in refused)
    assert sum(job.result["cost_micros"] for job in succeeded) <= usd_to_micros(limit_usd)
    async with budget_ledger_for(config.queue_url) as ledger:
        spent = await ledger.spend_today()
    assert spent["acme"] <= usd_to_micros(limit_usd)


async def test_a_low_budget_steps_down_and_an_exhausted_one_defers_all_but_critical(
    queue_factory: QueueFactory, queue: Queue, simulator: tuple[Simulator, str]
) -> None:
    _, base_url = simulator
    budgets = BudgetConfig(tenant_daily_usd={"acme": Decimal("1.00")}, on_exhausted="defer", defer_s=60)
    queue_url = queue_url_of(queue_factory)
    config = sim_config(base_url, queue_url=queue_url, budgets=budgets)
    async with budget_ledger_for(queue_url) as ledger:
        # Given 85% of the day's budget spent
        await ledger.reserve("acme", usd_to_micros(Decimal("0.85")), tenant_limit_micros=None,
                             global_limit_micros=None, enforce=False)
        low = await queue.enqueue(chat(), priority="high", tenant="acme")
        async with running_worker(queue, config):
            [stepped] = await wait_final(queue, [low])
        # Then a high job goes to the cheapest model instead of its tier's premium one
        assert stepped.state is JobState.SUCCEEDED, stepped.errors
        assert stepped.result["model"] == "deepseek-v3.2"
        assert "budget" in stepped.result["route"]

        # Given the whole budget spent
        await ledger.reserve("acme", usd_to_micros(Decimal("0.50")), tenant_limit_micros=None,
                             global_limit_micros=None, enforce=False)
        normal = await queue.enqueue(chat(), priority="normal", tenant="acme")
        critical = await queue.enqueue(chat(), priority="critical", tenant="acme")
        async with running_worker(queue, config):
            [served] = await wait_final(queue, [critical])
            deferred = await eventually(lambda: queue.get(normal), "the normal job is deferred",
                                        until=lambda job: job is not None and job.state is JobState.DELAYED)
        # Then the critical job is still served and the normal one waits, its attempt uncounted
        assert served.state is JobState.SUCCEEDED
        assert deferred is not None and deferred.attempts == 0


async def test_graceful_shutdown_finishes_in_flight_calls_and_claims_nothing_more(
    queue: Queue, simulator: tuple[Simulator, str]
) -> None:
    sim, base_url = simulator
    sim.configure({"defaults": {"latency_ms": 400}})
    ids = await queue.enqueue_many({"payload": chat(model="deepseek-v3.2")} for _ in range(10))
    settings = WorkerSettings(concurrency=4, lease_s=5, claim_wait_s=0.2, shutdown_grace_s=5)
    async with running_worker(queue, sim_config(base_url), settings) as worker:
        await wait_received(sim, 4)
        worker.request_stop()
    states = [job.state for job in await asyncio.gather(*(queue.get(i) for i in ids))]  # type: ignore[union-attr]
    assert states.count(JobState.SUCCEEDED) == 4
    assert states.count(JobState.QUEUED) == 6


async def test_shutdown_past_the_grace_period_releases_in_flight_jobs_uncounted(
    queue: Queue, simulator: tuple[Simulator, str]
) -> None:
    sim, base_url = simulator
    sim.configure({"defaults": {"latency_ms": 5000}})
    ids = await queue.enqueue_many({"payload": chat(model="deepseek-v3.2")} for _ in range(3))
    settings = WorkerSettings(concurrency=3, lease_s=5, claim_wait_s=0.2, shutdown_grace_s=0.1)
    async with running_worker(queue, sim_config(base_url), settings) as worker:
        await wait_received(sim, 3)
        worker.request_stop()
    for job_id in ids:
        job = await queue.get(job_id)
        assert job is not None and job.state is JobState.QUEUED and job.attempts == 0


async def test_the_api_key_never_appears_in_errors_or_logs(
    queue: Queue, simulator: tuple[Simulator, str], caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sim, base_url = simulator
    secret = "sk-test-DO-NOT-LEAK-8f3a1c"
    monkeypatch.setenv("TIDEGATE_TEST_PROVIDER_KEY", secret)
    sim.configure({"require_api_key": "sk-the-right-one"})
    caplog.set_level(logging.DEBUG)
    job_id = await queue.enqueue(chat(), priority=Priority.NORMAL)
    async with running_worker(queue, sim_config(base_url, api_key_env="TIDEGATE_TEST_PROVIDER_KEY")):
        [job] = await wait_final(queue, [job_id])
    assert job.state is JobState.DEAD  # 401 is not retried
    assert "401" in (job.last_error or "")
    assert secret not in repr(job)
    assert secret not in caplog.text


async def test_metrics_count_outcomes_tokens_cost_and_waits(
    queue: Queue, simulator: tuple[Simulator, str]
) -> None:
    _, base_url = simulator
    metrics = DispatchMetrics()
    ids = await queue.enqueue_many(
        {"payload": chat(model="deepseek-v3.2"), "priority": "low"} for _ in range(3)
    )
    async with running_worker(queue, sim_config(base_url), metrics=metrics):
        jobs = await wait_final(queue, ids)
    sample = metrics.registry.get_sample_value
    assert sample("tidegate_jobs_total",
                  {"outcome": "succeeded", "priority": "low", "model": "deepseek-v3.2"}) == 3
    input_tokens = sum(job.result["usage"]["prompt_tokens"] for job in jobs)
    assert sample("tidegate_tokens_total", {"model": "deepseek-v3.2", "direction": "input"}) == input_tokens
    assert sample("tidegate_queue_wait_seconds_count", {"priority": "low"}) == 3
    spent = sum(Decimal(job.result["cost_usd"]) for job in jobs)
    cost = sample("tidegate_cost_usd_total", {"model": "deepseek-v3.2", "tenant": "default"})
    assert cost == pytest.approx(float(spent))


async def test_a_finished_job_is_posted_to_its_callback_signed(
    queue: Queue, simulator: tuple[Simulator, str]
) -> None:
    _, base_url = simulator
    received: list[tuple[bytes, str]] = []
    arrived = asyncio.Event()

    async def hook(request: web.Request) -> web.Response:
        received.append((await request.read(), request.headers[SIGNATURE_HEADER]))
        arrived.set()
        return web.Response(status=204)

    app = web.Application()
    app.router.add_post("/hook", hook)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}/hook"
    secret = b"whsec-worker-test"
    try:
        job_id = await queue.enqueue(chat(model="deepseek-v3.2"), callback_url=url)
        # Loopback targets are refused by default; this receiver is allowed explicitly.
        async with (
            CallbackSender(CallbackConfig(allow_private=True), secret) as callbacks,
            running_worker(queue, sim_config(base_url), callbacks=callbacks),
        ):
            [job] = await wait_final(queue, [job_id])
            await asyncio.wait_for(arrived.wait(), 10)
    finally:
        await runner.cleanup()
    [(body, signature)] = received
    assert verify(secret, body, signature)
    document = orjson.loads(body)
    assert document["id"] == job_id and document["state"] == "succeeded"
    assert document["result"]["model"] == job.result["model"] == "deepseek-v3.2"


async def test_a_tier_whose_every_model_is_cooling_down_still_serves_its_jobs(
    queue: Queue, simulator: tuple[Simulator, str]
) -> None:
    # Given the bulk tier's only model failing twice in a row (it then cools down)
    sim, base_url = simulator
    sim.inject("deepseek-v3.2", InjectedFault("unavailable", times=2))
    ids = [await queue.enqueue(chat(), priority="bulk", max_attempts=4) for _ in range(3)]
    async with running_worker(queue, sim_config(base_url), WorkerSettings(concurrency=1, claim_wait_s=0.2)):
        jobs = await wait_final(queue, ids)
    # Then its jobs are retried on it rather than dead-lettered for want of a model
    assert [job.state for job in jobs] == [JobState.SUCCEEDED] * 3, [job.errors for job in jobs]
    assert all(job.result["model"] == "deepseek-v3.2" for job in jobs)


async def test_a_tenant_s_own_daily_budget_from_the_tenant_store_is_enforced(
    queue_factory: QueueFactory, queue: Queue, simulator: tuple[Simulator, str]
) -> None:
    _, base_url = simulator
    url = queue_url_of(queue_factory)
    config = sim_config(base_url, queue_url=url, budgets=BudgetConfig(on_exhausted="reject"))
    async with tenant_store_for(url) as tenants, budget_ledger_for(url) as ledger:
        await tenants.put_tenant(Tenant(name="frugal", daily_budget_usd=Decimal("0")))
        broke = await queue.enqueue(chat(), tenant="frugal")
        other = await queue.enqueue(chat(), tenant="someone-else")
        async with running_worker(queue, config, tenants=tenants, ledger=ledger):
            jobs = await wait_final(queue, [broke, other])
        spent = await ledger.spend_today()
    # A budget of 0 fits no job at all: it ends at once, saying so
    assert jobs[0].state is JobState.DEAD
    assert "whole tenant 'frugal' daily budget of 0.0" in (jobs[0].last_error or "")
    assert jobs[0].failure is not None and jobs[0].failure["code"] == "budget_exceeds_limit"
    assert jobs[1].state is JobState.SUCCEEDED
    assert spent["someone-else"] == jobs[1].result["cost_micros"]  # spend is tracked without a budget


async def test_slots_kept_for_urgent_levels_start_a_critical_job_while_a_normal_one_waits(
    queue: Queue, simulator: tuple[Simulator, str]
) -> None:
    # Given a worker of 3 slots and 1 more kept for HIGH and CRITICAL, its 3 busy with long bulk calls
    sim, base_url = simulator
    sim.configure({"defaults": {"latency_ms": 1500}})
    bulk = await queue.enqueue_many(
        {"payload": chat(model="deepseek-v3.2"), "priority": "bulk"} for _ in range(3))
    settings = WorkerSettings(concurrency=3, urgent_reserve=1, lease_s=5, claim_wait_s=0.2)
    async with running_worker(queue, sim_config(base_url), settings) as worker:
        await wait_received(sim, 3)
        # When a NORMAL job arrives, it stays queued although a slot is free
        normal = await queue.enqueue(chat(model="deepseek-v3.2"), priority="normal")
        await asyncio.sleep(0.5)  # a window for a wrong claim: what is asserted is that none comes
        assert (await queue.get(normal)).state is JobState.QUEUED  # type: ignore[union-attr]
        # Then a CRITICAL job arriving after it takes that slot and is called at once, while
        # every bulk call still runs: it waited for no slot to free
        critical = await queue.enqueue(chat(model="claude-sonnet-4.5"), priority="critical")
        await wait_received(sim, 4)
        assert sim.stats()["claude-sonnet-4.5"].received == 1
        assert worker.in_flight == 4
        stored = [await queue.get(job_id) for job_id in [*bulk, normal]]
        assert [job.state for job in stored if job is not None] == [JobState.LEASED] * 3 + [JobState.QUEUED]
        jobs = await wait_final(queue, [*bulk, normal, critical])
    assert [job.state for job in jobs] == [JobState.SUCCEEDED] * 5
    # and the NORMAL job ran once a bulk call had ended
    assert jobs[3].result["queue_wait_ms"] > jobs[4].result["queue_wait_ms"]


async def test_lower_levels_leave_the_reserve_free_and_a_freed_slot_wakes_the_worker_for_them(
    queue: Queue, simulator: tuple[Simulator, str]
) -> None:
    # Given NORMAL work only, a worker of 2 slots and 1 more kept for urgent levels, and a claim
    # timeout far longer than the test: while the worker waits for urgent work on its reserve,
    # only a freed slot can make it claim lower work again
    sim, base_url = simulator
    sim.configure({"defaults": {"latency_ms": 150}})
    ids = await queue.enqueue_many({"payload": chat(model="deepseek-v3.2")} for _ in range(8))
    settings = WorkerSettings(concurrency=2, urgent_reserve=1, lease_s=5, claim_wait_s=60)
    most_in_flight = 0
    async with running_worker(queue, sim_config(base_url), settings) as worker:
        finals = asyncio.ensure_future(wait_final(queue, ids, timeout_s=15))
        while not finals.done():
            most_in_flight = max(most_in_flight, worker.in_flight)
            await asyncio.sleep(0.005)
        jobs = await finals
    # Then every job is served, two at a time: the reserved slot is never lent to them
    assert [job.state for job in jobs] == [JobState.SUCCEEDED] * 8
    assert most_in_flight == 2


async def test_a_stop_ends_a_claim_waiting_for_work_at_once(
    queue: Queue, simulator: tuple[Simulator, str]
) -> None:
    # Given an idle worker whose claims wait up to a minute for work
    _, base_url = simulator
    settings = WorkerSettings(concurrency=2, lease_s=5, claim_wait_s=60)
    waits = ClaimWaits(queue)
    config = sim_config(base_url)
    async with open_worker_parts(config, queue) as parts, \
            Worker(parts, config, settings, metrics=DispatchMetrics()) as worker:
        run = asyncio.create_task(worker.run())
        await eventually(lambda: waits.count, "its claim waits for work")
        # When it is asked to stop
        worker.request_stop()
        # Then run() returns without waiting out the claim (10 s: far below its 60 s wait)
        await asyncio.wait_for(run, 10)


async def test_a_worker_refuses_parts_that_miss_what_its_config_needs(queue: Queue) -> None:
    # Given a config with a provider and a daily budget, and parts with neither a pool nor a ledger
    config = sim_config("http://127.0.0.1:9/v1", budgets=BudgetConfig(global_daily_usd=Decimal("1")))
    async with open_worker_parts(config, queue) as parts:
        # When a worker is made on parts without the provider's pool, or without a ledger
        # Then it refuses at once, naming what is missing, rather than fail every job later
        with pytest.raises(ValueError, match="no upstream client for provider"):
            Worker(replace(parts, upstreams={}), config)
        with pytest.raises(ValueError, match="budget ledger"):
            Worker(replace(parts, ledger=None), config)
        assert Worker(parts, config).queue is queue
