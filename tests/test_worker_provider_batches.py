"""Provider batches: BULK jobs with a long deadline go through the simulator's own batch API at its
discount (OpenAI's Batch API, or Anthropic's Message Batches for an Anthropic provider),
everything else is served live, and nothing is lost or submitted twice when a worker is killed, a
batch fails, or a budget runs short; on both queue backends."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from conftest import QueueFactory
from support.dispatch import chat, queue_url_of, running_worker, wait_final
from support.provider_batches import TWO_DAYS_S, batch_config, bulk_jobs, waiting_in_a_batch
from support.waiting import eventually
from tidegate.ai import Usage
from tidegate.config import BudgetConfig, ProviderBatchConfig, ProviderConfig
from tidegate.contract import decode
from tidegate.coord.budget import budget_ledger_for
from tidegate.costs import cost_micros, estimate_cost_micros, micros_to_usd, usd_to_micros
from tidegate.dispatch.metrics import DispatchMetrics
from tidegate.dispatch.provider_batches.clients import batch_client
from tidegate.dispatch.provider_batches.clients.openai import BatchLineRequest
from tidegate.dispatch.provider_batches.store import BatchedJob, ProviderBatchRecord, provider_batch_store_for
from tidegate.dispatch.provider_batches.submission import ENDPOINTS, PENDING, SUBMISSION
from tidegate.dispatch.tiers import batch_priced
from tidegate.dispatch.worker import WorkerSettings
from tidegate.errors import UpstreamError
from tidegate.jobs import Job, JobState, Priority
from tidegate.providers.client import UpstreamClient
from tidegate.queue import Queue
from tidegate.simulator.server import Simulator
from tidegate.simulator.settings import SimulatorSettings

ROOT = Path(__file__).resolve().parent.parent
BULK_MODEL = "deepseek-v3.2"  # where the default tiers route BULK chat jobs
APIS = ("openai", "anthropic")


@pytest.fixture
async def queue(queue_factory: QueueFactory) -> Queue:
    return await queue_factory.open(maintenance_interval_s=0.2, retry_base_s=0.05, retry_max_s=0.2)


@pytest.fixture
async def simulator(request: pytest.FixtureRequest) -> AsyncIterator[tuple[Simulator, str]]:
    options: dict[str, Any] = getattr(request, "param", {})
    sim = Simulator(SimulatorSettings(seed=11, batch_latency_s=0.3, **options))
    async with sim.running() as base_url:
        yield sim, base_url


def batches_seen(sim: Simulator) -> dict[str, Any]:
    """What the simulator's batch API received."""
    seen: dict[str, Any] = sim.stats_dict()["batches"]
    return seen


def live_calls(sim: Simulator) -> int:
    return sum(stats.received for stats in sim.stats().values())


def in_a_batch(job: Job) -> bool:
    return str(job.result["route"]).startswith("provider batch ")


async def files_of_batch(queue_url: str, provider: ProviderConfig, job_id: str) -> list[str]:
    """The input, output and error files at the provider of the batch the job was submitted in."""
    store = provider_batch_store_for(queue_url)
    async with store:
        entry = await store.job(job_id)
    assert entry is not None, f"job {job_id} is in no provider batch"
    async with UpstreamClient(provider) as upstream:
        batch = (await upstream.send("GET", f"/batches/{entry.batch_id}")).body
    return [batch[name] for name in ("input_file_id", "output_file_id", "error_file_id") if batch.get(name)]


async def files_left(provider: ProviderConfig, file_ids: list[str]) -> list[str]:
    """Those of `file_ids` still at the provider."""
    left = []
    async with UpstreamClient(provider) as upstream:
        for file_id in file_ids:
            try:
                await upstream.send("GET", f"/files/{file_id}")
            except UpstreamError as exc:
                if exc.status != 404:
                    raise
                continue
            left.append(file_id)
    return left


async def until_deleted(provider: ProviderConfig, file_ids: list[str]) -> None:
    """Return once none of `file_ids` is left at the provider."""
    await eventually(lambda: files_left(provider, file_ids), "no file is left at the provider",
                     until=lambda left: not left, every_s=0.04)


async def test_bulk_jobs_with_a_long_deadline_go_through_one_provider_batch_at_its_discount(
    queue: Queue, queue_factory: QueueFactory, simulator: tuple[Simulator, str]
) -> None:
    sim, base_url = simulator
    config = batch_config(base_url, queue_url_of(queue_factory))
    ids = await bulk_jobs(queue, 6)
    metrics = DispatchMetrics()
    async with running_worker(queue, config, metrics=metrics):
        jobs = await wait_final(queue, ids)
    assert [job.state for job in jobs] == [JobState.SUCCEEDED] * 6, [job.last_error for job in jobs]
    # One provider batch of six lines, and no live call for them
    seen = batches_seen(sim)
    assert (seen["created"], seen["lines"]) == (1, 6)
    assert live_calls(sim) == 0
    provider = config.providers[0]
    [model] = [model for model in provider.models if model.name == BULK_MODEL]
    for job in jobs:
        result = job.result
        assert in_a_batch(job) and result["model"] == BULK_MODEL
        assert result["response"]["choices"][0]["message"]["content"]
        usage = result["usage"]
        tokens = usage["prompt_tokens"], usage["completion_tokens"]
        # Charged exactly the batch price: half of what a live call with that usage costs
        spent = cost_micros(batch_priced(model, provider), Usage(*tokens))
        assert result["cost_micros"] == spent and Decimal(result["cost_usd"]) == micros_to_usd(spent)
        live = (tokens[0] * model.input_usd_per_1m + tokens[1] * model.output_usd_per_1m)
        assert spent - 1 < live / 2 <= spent
    sample = metrics.registry.get_sample_value
    assert sample("tidegate_provider_batches_total", {"provider": "sim"}) == 1
    assert sample("tidegate_provider_batch_jobs_total", {"provider": "sim", "outcome": "submitted"}) == 6
    assert sample("tidegate_provider_batch_jobs_total", {"provider": "sim", "outcome": "collected"}) == 6


async def test_an_anthropic_provider_serves_bulk_jobs_through_message_batches_as_chat_completions(
    queue: Queue, queue_factory: QueueFactory, simulator: tuple[Simulator, str]
) -> None:
    sim, base_url = simulator
    config = batch_config(base_url, queue_url_of(queue_factory), api="anthropic")
    ids = await bulk_jobs(queue, 4)
    async with running_worker(queue, config):
        jobs = await wait_final(queue, ids)
    assert [job.state for job in jobs] == [JobState.SUCCEEDED] * 4, [job.last_error for job in jobs]
    # One Message Batch of four requests (no file uploaded: not OpenAI's Batch API), no live call
    seen = batches_seen(sim)
    assert (seen["files"], seen["created"], seen["lines"], seen["ended"]) == (0, 1, 4, {"completed": 1})
    assert live_calls(sim) == 0
    provider = config.providers[0]
    [model] = [model for model in provider.models if model.name == BULK_MODEL]
    for job in jobs:
        result = job.result
        assert in_a_batch(job) and result["model"] == BULK_MODEL
        # The Message answered as the chat.completion a live call gives, usage included
        response = result["response"]
        assert response["object"] == "chat.completion" and response["id"].startswith("chatcmpl-")
        assert response["choices"][0]["message"]["content"] and response["choices"][0]["finish_reason"]
        usage = result["usage"]
        assert usage == {key: response["usage"][key] for key in usage}
        tokens = usage["prompt_tokens"], usage["completion_tokens"]
        assert tokens[0] > 0 and tokens[1] > 0
        # Charged the batch price: half of a live call's
        spent = cost_micros(batch_priced(model, provider), Usage(*tokens))
        assert result["cost_micros"] == spent and Decimal(result["cost_usd"]) == micros_to_usd(spent)
        live = (tokens[0] * model.input_usd_per_1m + tokens[1] * model.output_usd_per_1m)
        assert spent - 1 < live / 2 <= spent


async def test_urgent_jobs_and_bulk_jobs_without_a_long_deadline_are_served_live(
    queue: Queue, queue_factory: QueueFactory, simulator: tuple[Simulator, str]
) -> None:
    sim, base_url = simulator
    ids = [
        await queue.enqueue(chat(), priority="critical", timeout_s=TWO_DAYS_S),
        await queue.enqueue(chat(), priority="high", timeout_s=TWO_DAYS_S),
        await queue.enqueue(chat(), priority="bulk"),  # no deadline
        await queue.enqueue(chat(), priority="bulk", timeout_s=3600),  # a deadline within the day
        await queue.enqueue(chat(stream=True), priority="bulk", timeout_s=TWO_DAYS_S),  # streams
    ]
    async with running_worker(queue, batch_config(base_url, queue_url_of(queue_factory))):
        jobs = await wait_final(queue, ids)
    assert [job.state for job in jobs] == [JobState.SUCCEEDED] * 5, [job.last_error for job in jobs]
    assert not any(in_a_batch(job) for job in jobs)
    assert batches_seen(sim)["created"] == 0
    assert live_calls(sim) == 5


async def test_a_bulk_job_only_its_origins_api_can_carry_is_served_live_natively(
    queue: Queue, queue_factory: QueueFactory, simulator: tuple[Simulator, str]
) -> None:
    sim, base_url = simulator
    # A Messages request with top_k: its chat body is only a summary, so no batch line may carry it
    native = {"model": BULK_MODEL, "max_tokens": 40, "top_k": 5,
              "messages": [{"role": "user", "content": "Say hello"}]}
    payload = {**chat(max_tokens=40), "origin": {"api": "anthropic", "body": native, "native_only": True}}
    job_id = await queue.enqueue(payload, priority="bulk", timeout_s=TWO_DAYS_S)
    async with running_worker(queue, batch_config(base_url, queue_url_of(queue_factory), api="anthropic")):
        [job] = await wait_final(queue, [job_id])

    assert job.state is JobState.SUCCEEDED, job.last_error
    assert not in_a_batch(job) and job.result["response"]["type"] == "message"
    assert batches_seen(sim)["created"] == 0
    assert [body.get("top_k") for body in sim.received("/v1/messages")] == [5]


@pytest.mark.parametrize("simulator", [{"batch_fault": "failed"}, {"batch_fault": "expired"}],
                         indirect=True, ids=["failed", "expired"])
async def test_a_batch_that_fails_or_expires_leaves_every_job_to_a_live_call(
    queue: Queue, queue_factory: QueueFactory, simulator: tuple[Simulator, str]
) -> None:
    sim, base_url = simulator
    ids = await bulk_jobs(queue, 4)
    metrics = DispatchMetrics()
    async with running_worker(queue, batch_config(base_url, queue_url_of(queue_factory)), metrics=metrics):
        jobs = await wait_final(queue, ids)
    # Every job still ended, answered by a live call once its batch ended without it
    assert [job.state for job in jobs] == [JobState.SUCCEEDED] * 4, [job.last_error for job in jobs]
    assert not any(in_a_batch(job) for job in jobs)
    assert batches_seen(sim)["created"] == 1
    assert live_calls(sim) == 4
    assert metrics.registry.get_sample_value(
        "tidegate_provider_batch_jobs_total", {"provider": "sim", "outcome": "served_live"}) == 4
    # and the store says why
    store = provider_batch_store_for(queue_url_of(queue_factory))
    try:
        entries = [await store.job(job_id) for job_id in ids]
    finally:
        await store.close()
    fault = sim.settings.batch_fault
    assert all(entry is not None and entry.live_reason and f"({fault})" in entry.live_reason
               for entry in entries), entries


async def test_a_budget_that_allows_part_of_the_jobs_is_never_overspent(
    queue: Queue, queue_factory: QueueFactory, simulator: tuple[Simulator, str]
) -> None:
    _, base_url = simulator
    probe = batch_config(base_url, queue_url_of(queue_factory))
    provider = probe.providers[0]
    [model] = [model for model in provider.models if model.name == BULK_MODEL]
    body = chat("Summarise item 0", max_tokens=40)["body"]
    # Room for three and a half batch-priced estimates: three jobs go, the rest cannot
    typed = decode("chat", {"model": BULK_MODEL, **body})
    per_job = estimate_cost_micros(batch_priced(model, provider), typed)
    limit_micros = per_job * 7 // 2
    budgets = BudgetConfig(tenant_daily_usd={"acme": micros_to_usd(limit_micros)}, on_exhausted="reject")
    config = batch_config(base_url, queue_url_of(queue_factory), budgets=budgets)
    ids = await queue.enqueue_many(
        {"payload": chat("Summarise item 0", max_tokens=40), "priority": "bulk", "tenant": "acme",
         "timeout_s": TWO_DAYS_S} for _ in range(6))
    async with running_worker(queue, config):
        jobs = await wait_final(queue, ids)
    states = [job.state for job in jobs]
    assert states.count(JobState.SUCCEEDED) == 3 and states.count(JobState.DEAD) == 3, states
    assert all(in_a_batch(job) for job in jobs if job.state is JobState.SUCCEEDED)
    assert all(job.failure and job.failure["code"] == "budget_exhausted" for job in jobs
               if job.state is JobState.DEAD)
    ledger = budget_ledger_for(queue_url_of(queue_factory))
    try:
        spent = (await ledger.spend_today()).get("acme", 0)
    finally:
        await ledger.close()
    assert 0 < spent <= limit_micros
    assert spent == sum(job.result["cost_micros"] for job in jobs if job.state is JobState.SUCCEEDED)
    assert usd_to_micros(budgets.tenant_daily_usd["acme"]) == limit_micros


def _config_file(tmp_path: Path, base_url: str, api: str = "openai") -> Path:
    path = tmp_path / "tidegate.toml"
    path.write_text(f"""
[[providers]]
name = "sim"
base_url = "{base_url}"
api = "{api}"

[providers.batch]
gather_s = 0.3
poll_s = 0.3
kinds = ["chat"]

[[providers.models]]
name = "{BULK_MODEL}"
input_usd_per_1m = "0.28"
output_usd_per_1m = "0.42"
""")
    return path


def _worker_process(queue_url: str, config: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "tidegate", "worker", "--queue", queue_url, "--config", str(config),
         "--concurrency", "8", "--lease-s", "1"],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _kill(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=30)


@pytest.mark.parametrize("api", APIS)
async def test_a_worker_killed_after_submitting_leaves_its_jobs_to_another_that_collects_them(
    queue: Queue, queue_factory: QueueFactory, tmp_path: Path, api: str
) -> None:
    # A batch that runs long enough for its worker to die before it ends
    sim = Simulator(SimulatorSettings(seed=13, batch_latency_s=2.0))
    async with sim.running() as base_url:
        url = queue_url_of(queue_factory)
        ids = await bulk_jobs(queue, 4)
        # Given a worker process that submitted the jobs as one provider batch
        proc = _worker_process(url, _config_file(tmp_path, base_url, api))
        store = provider_batch_store_for(url)
        try:
            async def entries() -> list[Any]:
                return [await store.job(job_id) for job_id in ids]

            await eventually(entries, "the worker records the provider batch", until=lambda entries: all(
                entry is not None and not entry.batch_id.startswith(PENDING) for entry in entries))
        finally:
            await store.close()
            # When it is killed before the batch ended
            _kill(proc)
        assert batches_seen(sim)["created"] == 1
        # Then another worker finds the jobs in the store and collects them from that batch
        config = batch_config(base_url, url, api=api)
        async with running_worker(queue, config, WorkerSettings(claim_wait_s=0.2, lease_s=5.0)):
            jobs = await wait_final(queue, ids, timeout_s=40)
    assert [job.state for job in jobs] == [JobState.SUCCEEDED] * 4, [job.last_error for job in jobs]
    assert all(in_a_batch(job) for job in jobs)
    seen = batches_seen(sim)
    assert (seen["created"], seen["lines"]) == (1, 4)
    assert live_calls(sim) == 0


@pytest.mark.parametrize("api", APIS)
@pytest.mark.parametrize("created", [True, False], ids=["created", "never-created"])
async def test_jobs_left_pending_by_a_worker_killed_mid_submission_are_neither_lost_nor_submitted_twice(
    queue: Queue, queue_factory: QueueFactory, simulator: tuple[Simulator, str], created: bool, api: str
) -> None:
    sim, base_url = simulator
    url = queue_url_of(queue_factory)
    config = batch_config(base_url, url, api=api)
    provider = config.providers[0]
    ids = await bulk_jobs(queue, 3)
    # Given jobs recorded as pending under a submission token, as a worker killed between sending
    # their batch and recording it leaves them, and (or not) the batch it created at the provider
    token = "t-1"
    pending = PENDING + token
    store = provider_batch_store_for(url)
    async with store:
        await store.record(
            ProviderBatchRecord("sim", pending, BULK_MODEL, ENDPOINTS["chat"], tuple(ids), datetime.now(UTC)),
            [BatchedJob(job_id, "sim", pending) for job_id in ids])
    if created:
        jobs = [await queue.get(job_id) for job_id in ids]
        lines = [BatchLineRequest(job.id, ENDPOINTS["chat"],
                                  decode("chat", {**job.payload["body"], "model": BULK_MODEL}))
                 for job in jobs if job is not None]
        async with UpstreamClient(provider) as upstream:
            client = batch_client(upstream)
            batch = await client.submit(lines, endpoint=ENDPOINTS["chat"], metadata={SUBMISSION: token})
            # ended by the time it is looked for (an Anthropic batch can be recognised only then)
            batch = await eventually(lambda: client.retrieve(batch.id), "the batch ends",
                                     until=lambda batch: batch.ended, every_s=0.05)
    # When a worker claims them
    async with running_worker(queue, config):
        finished = await wait_final(queue, ids)
    # Then each is answered from one provider batch: the one found again, or one made anew
    assert [job.state for job in finished] == [JobState.SUCCEEDED] * 3, [job.last_error for job in finished]
    assert all(in_a_batch(job) for job in finished)
    seen = batches_seen(sim)
    assert (seen["created"], seen["lines"]) == (1, 3)
    assert live_calls(sim) == 0


async def test_a_job_cancelled_while_its_batch_runs_ends_cancelled_and_the_others_are_collected(
    queue: Queue, queue_factory: QueueFactory
) -> None:
    sim = Simulator(SimulatorSettings(seed=17, batch_latency_s=1.5))
    async with sim.running() as base_url:
        ids = await bulk_jobs(queue, 3)
        async with running_worker(queue, batch_config(base_url, queue_url_of(queue_factory))):
            # Given the jobs waiting in their provider batch
            await waiting_in_a_batch(queue, ids)
            # When one is cancelled
            assert await queue.cancel(ids[0])
            jobs = await wait_final(queue, ids)
        seen = batches_seen(sim)
    # Then it stays cancelled, and the others are answered from the batch
    assert [job.state for job in jobs] == [JobState.CANCELLED, JobState.SUCCEEDED, JobState.SUCCEEDED]
    assert all(in_a_batch(job) for job in jobs[1:])
    assert (seen["created"], seen["lines"]) == (1, 3)


async def test_a_job_in_a_provider_batch_is_collected_though_routing_would_now_refuse_it(
    queue: Queue, queue_factory: QueueFactory
) -> None:
    sim = Simulator(SimulatorSettings(seed=19, batch_latency_s=1.0))
    async with sim.running() as base_url:
        config = batch_config(base_url, queue_url_of(queue_factory))
        ids = await bulk_jobs(queue, 3)
        # Given jobs submitted in a provider batch by a worker that stopped while the batch runs
        async with running_worker(queue, config):
            await waiting_in_a_batch(queue, ids)
        # When the config changes so that routing refuses them: their model left the BULK tier
        tiers = {**config.routing.tiers, "bulk": ("retired-model",)}
        changed = config.model_copy(update={"routing": config.routing.model_copy(update={"tiers": tiers})})
        async with running_worker(queue, changed):
            jobs = await wait_final(queue, ids)
        seen = batches_seen(sim)
    # Then they are collected from their batch, answered by the model they were submitted to
    assert [job.state for job in jobs] == [JobState.SUCCEEDED] * 3, [job.last_error for job in jobs]
    assert all(in_a_batch(job) and job.result["model"] == BULK_MODEL for job in jobs)
    assert (seen["created"], seen["lines"]) == (1, 3)


async def test_the_files_of_a_batch_whose_jobs_were_all_collected_are_deleted_at_the_provider(
    queue: Queue, queue_factory: QueueFactory, simulator: tuple[Simulator, str]
) -> None:
    url = queue_url_of(queue_factory)
    config = batch_config(simulator[1], url)
    ids = await bulk_jobs(queue, 3)
    async with running_worker(queue, config):
        # Given every job of a batch collected
        jobs = await wait_final(queue, ids)
        assert all(job.state is JobState.SUCCEEDED and in_a_batch(job) for job in jobs)
        files = await files_of_batch(url, config.providers[0], ids[0])
        assert len(files) == 2  # its input and its output
        # Then its files are deleted at the provider, the answers kept
        await until_deleted(config.providers[0], files)
    assert [(await queue.get(job_id)) for job_id in ids] == jobs


async def test_a_batch_all_of_whose_jobs_were_cancelled_is_cancelled_at_the_provider_then_cleaned_up(
    queue: Queue, queue_factory: QueueFactory
) -> None:
    sim = Simulator(SimulatorSettings(seed=23, batch_latency_s=120.0))
    async with sim.running() as base_url:
        url = queue_url_of(queue_factory)
        config = batch_config(base_url, url)
        provider = config.providers[0]
        ids = await bulk_jobs(queue, 3)
        # Two workers, either of which may see it
        async with running_worker(queue, config), running_worker(queue, config):
            # Given the jobs waiting in a batch that would run for minutes
            await waiting_in_a_batch(queue, ids)
            files = await files_of_batch(url, provider, ids[0])
            # When every one is cancelled
            for job_id in ids:
                assert await queue.cancel(job_id)
            # Then the batch is cancelled at the provider, and its files deleted once it ended
            ended = await eventually(lambda: batches_seen(sim)["ended"], "the batch ends at the provider")
            assert ended == {"cancelled": 1}
            await until_deleted(provider, files)
        seen = batches_seen(sim)
    jobs = [await queue.get(job_id) for job_id in ids]
    assert all(job is not None and job.state is JobState.CANCELLED for job in jobs), jobs
    assert (seen["created"], seen["lines"]) == (1, 0)


async def test_a_worker_stopped_while_it_gathers_gives_the_jobs_back_unsubmitted(
    queue: Queue, queue_factory: QueueFactory, simulator: tuple[Simulator, str]
) -> None:
    sim, base_url = simulator
    url = queue_url_of(queue_factory)
    slow = batch_config(base_url, url)
    providers = tuple(p.model_copy(update={"batch": ProviderBatchConfig(gather_s=60.0, poll_s=0.2)})
                      for p in slow.providers)
    ids = await bulk_jobs(queue, 3)
    # Given a worker gathering the jobs for a batch it would submit only in a minute
    async with running_worker(queue, slow.model_copy(update={"providers": providers})):
        await eventually(queue.stats, "the worker holds the three jobs",
                         until=lambda stats: stats.in_flight == 3)
    # When it stops, they are back in the queue, their attempts given back, nothing submitted
    jobs = [await queue.get(job_id) for job_id in ids]
    assert all(job is not None and job.state is JobState.QUEUED and job.attempts == 0 for job in jobs), jobs
    assert batches_seen(sim)["created"] == 0
    # and the next worker sends them as one batch
    async with running_worker(queue, batch_config(base_url, url)):
        finished = await wait_final(queue, ids)
    assert all(in_a_batch(job) for job in finished)
    assert batches_seen(sim)["created"] == 1


async def test_bulk_embeddings_go_through_a_batch_of_their_own_endpoint(
    queue: Queue, queue_factory: QueueFactory, simulator: tuple[Simulator, str]
) -> None:
    sim, base_url = simulator
    config = batch_config(base_url, queue_url_of(queue_factory))
    ids = await queue.enqueue_many(
        {"payload": {"kind": "embeddings", "body": {"input": f"product {n}"}}, "priority": "bulk",
         "timeout_s": TWO_DAYS_S} for n in range(3))
    async with running_worker(queue, config):
        jobs = await wait_final(queue, ids)
    assert [job.state for job in jobs] == [JobState.SUCCEEDED] * 3, [job.last_error for job in jobs]
    seen = batches_seen(sim)
    assert (seen["created"], seen["lines"]) == (1, 3) and live_calls(sim) == 0
    provider = config.providers[0]
    [model] = [model for model in provider.models if model.name == config.routing.embedding_model]
    for job in jobs:
        assert in_a_batch(job) and job.result["response"]["data"][0]["embedding"]
        tokens = job.result["usage"]["prompt_tokens"]
        assert job.result["cost_micros"] == cost_micros(batch_priced(model, provider), Usage(tokens, 0))


def test_a_batch_section_of_an_anthropic_provider_is_for_chat_and_priorities_are_named_as_levels() -> None:
    batch = ProviderBatchConfig(priorities=("BULK", "3"))
    assert batch.priorities == ("bulk", "low")
    assert batch.admits(Priority.LOW) and not batch.admits(Priority.HIGH)
    with pytest.raises(ValidationError, match="no embeddings"):
        ProviderConfig(name="claude", base_url="https://api.anthropic.com/v1", api="anthropic", batch=batch)
    chat_only = batch.model_copy(update={"kinds": ("chat",)})
    assert ProviderConfig(name="claude", base_url="https://api.anthropic.com/v1", api="anthropic",
                          batch=chat_only).batch == chat_only
    with pytest.raises(ValidationError):
        ProviderBatchConfig(priorities=("urgent",))
    with pytest.raises(ValidationError, match="always served live"):
        ProviderBatchConfig(priorities=("bulk", "high"))
