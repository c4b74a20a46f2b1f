"""What becomes of a job a daily budget refuses, in each mode (`budgets.on_exhausted`): it ends
dead or waits, and either way its record says why and for how long — never deferred forever,
never without a reason. Real worker, real simulator, both queue backends."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest

from conftest import QueueFactory
from support.dispatch import chat, queue_url_of, running_worker, sim_config, wait_final
from support.waiting import eventually
from tidegate.config import BudgetConfig, RoutingConfig
from tidegate.coord.budget import RefusedCall, budget_ledger_for, budget_outcome, seconds_to_next_day
from tidegate.costs import usd_to_micros
from tidegate.dispatch.metrics import DispatchMetrics
from tidegate.errors import BudgetExhausted
from tidegate.gateway.core.outcomes import failure_of
from tidegate.gateway.core.views import job_view
from tidegate.jobs import Job, JobState, Priority
from tidegate.queue import Queue
from tidegate.simulator.server import Simulator
from tidegate.simulator.settings import SimulatorSettings

BIG: dict[str, Any] = {"max_tokens": 100_000}  # gpt-4.1 at $8/M output: an estimate of about $0.80


@pytest.fixture
async def base_url() -> AsyncIterator[str]:
    async with Simulator(SimulatorSettings(seed=4)).running() as url:
        yield url


@pytest.fixture
async def queue(queue_factory: QueueFactory) -> Queue:
    return await queue_factory.open(maintenance_interval_s=0.2)


async def _spend(queue_url: str, tenant: str, usd: str) -> None:
    async with budget_ledger_for(queue_url) as ledger:
        await ledger.reserve(tenant, usd_to_micros(Decimal(usd)), tenant_limit_micros=None,
                             global_limit_micros=None, enforce=False)


@pytest.mark.parametrize("mode", ["defer", "reject", "step_down"])
async def test_a_job_above_the_whole_daily_budget_ends_dead_in_every_mode(
    queue_factory: QueueFactory, queue: Queue, base_url: str, mode: str
) -> None:
    budgets = BudgetConfig(tenant_daily_usd={"acme": Decimal("0.10")}, on_exhausted=mode)
    config = sim_config(base_url, queue_url=queue_url_of(queue_factory), budgets=budgets)
    job_id = await queue.enqueue(chat(model="gpt-4.1", **BIG), tenant="acme")
    metrics = DispatchMetrics()
    async with running_worker(queue, config, metrics=metrics):
        [job] = await wait_final(queue, [job_id], timeout_s=10)

    assert job.state is JobState.DEAD
    assert job.failure is not None
    assert (job.failure["status"], job.failure["code"]) == (429, "budget_exceeds_limit")
    assert "whole tenant 'acme' daily budget of 0.1" in job.failure["message"]
    assert job.last_error == job.failure["message"]
    assert metrics.budget_refusals.labels("dead", "budget_exceeds_limit")._value.get() == 1


async def test_a_tenant_with_a_zero_budget_gets_its_jobs_ended_with_the_reason(
    queue_factory: QueueFactory, queue: Queue, base_url: str
) -> None:
    budgets = BudgetConfig(tenant_daily_usd={"broke": Decimal("0")})  # default mode: defer
    config = sim_config(base_url, queue_url=queue_url_of(queue_factory), budgets=budgets)
    job_id = await queue.enqueue(chat(), tenant="broke")
    async with running_worker(queue, config):
        [job] = await wait_final(queue, [job_id], timeout_s=10)
    assert job.state is JobState.DEAD
    assert job.failure is not None and job.failure["code"] == "budget_exceeds_limit"


async def test_a_deferred_job_records_why_and_until_when(
    queue_factory: QueueFactory, queue: Queue, base_url: str
) -> None:
    # Given a tenant whose budget is spent for today, in the default mode
    queue_url = queue_url_of(queue_factory)
    budgets = BudgetConfig(tenant_daily_usd={"acme": Decimal("1.00")}, defer_s=60)
    config = sim_config(base_url, queue_url=queue_url, budgets=budgets)
    await _spend(queue_url, "acme", "1.00")
    job_id = await queue.enqueue(chat(model="deepseek-v3.2"), tenant="acme")
    metrics = DispatchMetrics()

    # When a worker meets it
    async with running_worker(queue, config, metrics=metrics):
        async def deferred() -> bool:
            job = await queue.get(job_id)
            return job is not None and job.state is JobState.DELAYED
        await eventually(deferred, "the job is deferred")

    # Then it waits, its attempt uncounted, saying why and until when, and the metrics count it
    job = await queue.get(job_id)
    assert job is not None and job.attempts == 0 and job.not_before is not None
    assert job.last_error is not None
    assert job.last_error.startswith("deferred until ")
    assert "tenant 'acme' daily budget is exhausted" in job.last_error
    expected = min(60.0, seconds_to_next_day(datetime.now(UTC)))
    assert abs((job.not_before - datetime.now(UTC)).total_seconds() - expected) < 10
    view = job_view(job)
    assert view.retry_at == job.not_before
    assert view.last_error == job.last_error
    assert metrics.deferred.labels("budget_exhausted")._value.get() >= 1
    assert metrics.budget_refusals.labels("deferred", "budget_exhausted")._value.get() >= 1


async def test_a_job_deferred_past_its_bound_ends_dead(
    queue_factory: QueueFactory, queue: Queue, base_url: str
) -> None:
    queue_url = queue_url_of(queue_factory)
    budgets = BudgetConfig(tenant_daily_usd={"acme": Decimal("1.00")}, defer_s=60, defer_max_s=30)
    config = sim_config(base_url, queue_url=queue_url, budgets=budgets)
    await _spend(queue_url, "acme", "1.00")
    job_id = await queue.enqueue(chat(model="deepseek-v3.2"), tenant="acme")
    async with running_worker(queue, config):
        [job] = await wait_final(queue, [job_id], timeout_s=10)
    assert job.state is JobState.DEAD
    assert job.failure is not None and job.failure["code"] == "budget_deferred_too_long"


async def test_step_down_serves_an_auto_job_on_the_cheapest_model_that_fits(
    queue_factory: QueueFactory, queue: Queue, base_url: str
) -> None:
    # Given $0.05 left of the day (the router's own low-budget rule off, so the reservation is
    # what refuses) and a high-tier job too big for its tier's model, not for the cheapest one
    queue_url = queue_url_of(queue_factory)
    budgets = BudgetConfig(tenant_daily_usd={"acme": Decimal("1.00")}, on_exhausted="step_down")
    config = sim_config(base_url, queue_url=queue_url, budgets=budgets)
    config = config.model_copy(update={"routing": RoutingConfig(low_budget_fraction=0)})
    await _spend(queue_url, "acme", "0.95")
    job_id = await queue.enqueue(chat(max_tokens=20_000), tenant="acme", priority="high")
    metrics = DispatchMetrics()
    async with running_worker(queue, config, metrics=metrics):
        [job] = await wait_final(queue, [job_id], timeout_s=10)
    assert job.state is JobState.SUCCEEDED, job.errors
    assert job.result["model"] == "deepseek-v3.2"
    assert metrics.budget_refusals.labels("stepped_down", "budget_exhausted")._value.get() == 1


def test_a_deferral_never_outlives_the_job_s_deadline() -> None:
    now = datetime.now(UTC)
    refusal = BudgetExhausted("tenant 'acme' daily budget is exhausted", scope="tenant",
                              remaining_micros=0, limit_micros=1_000_000)
    budgets = BudgetConfig(on_exhausted="defer", defer_s=300, defer_max_s=90_000)
    outcome = budget_outcome(refusal, RefusedCall(1_000, "acme", now, deadline=now + timedelta(seconds=60)),
                             budgets, now)
    assert (outcome.action, outcome.reason) == ("dead", "budget_exhausted")
    assert "deadline" in outcome.message
    later = budget_outcome(refusal, RefusedCall(1_000, "acme", now), budgets, now)
    assert later.action == "defer" and 0 < later.defer_s <= 300


def _job(state: JobState, **fields: object) -> Job:
    return Job(id="j1", priority=Priority.NORMAL, payload={"kind": "chat"}, tenant="acme", state=state,
               created_at=datetime.now(UTC), attempts=0, max_attempts=3, **fields)  # type: ignore[arg-type]


def test_a_synchronous_caller_of_a_deferred_job_is_told_why_and_when_to_come_back() -> None:
    until = datetime.now(UTC) + timedelta(seconds=120)
    job = _job(JobState.DELAYED, not_before=until,
               last_error="deferred until …: budget exhausted: tenant 'acme' daily budget is exhausted")
    error = failure_of(job, 30)
    assert error.status == 504 and error.code == "timeout"
    assert "budget exhausted" in error.message and until.isoformat(timespec="seconds") in error.message
    assert 115 <= int(error.headers["Retry-After"]) <= 120


def test_a_job_a_budget_ended_tells_the_sdks_not_to_retry_it() -> None:
    exceeds = _job(JobState.DEAD, failure={"status": 429, "type": "insufficient_quota",
                                           "code": "budget_exceeds_limit", "message": "whole budget"})
    spent = _job(JobState.DEAD, failure={"status": 429, "type": "insufficient_quota",
                                         "code": "budget_exhausted", "message": "budget exhausted"})
    assert failure_of(exceeds, 30).headers == {"x-should-retry": "false"}
    headers = failure_of(spent, 30).headers
    assert headers["x-should-retry"] == "false"
    assert 0 < int(headers["Retry-After"]) <= 86_400  # until the next UTC midnight
