"""The dispatch benchmark's cost scenario: what the seed's mix costs when every job takes the premium
model, when tidegate routes by priority tier, and when BULK jobs with a long deadline also go to
the provider's own batch API at its discount; and whether the urgent classes wait longer for it.

Each of the three runs sends the same seeded arrivals (the scenario's mix, BULK with a deadline
48 h away) through a fresh queue and one worker to the simulator, with its rate limits lifted so
that cost, not pacing, is what differs; then waits until every job is final. Cost is the sum of
the jobs' own `cost_micros`; latency is the queue's finished_at - created_at.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Literal

from bench.common import BenchmarkError, percentile
from bench.dispatch_scenario import Scenario
from bench.dispatch_sim import SimHandle
from tidegate import Job, JobState, Priority, Queue
from tidegate.testing import (
    ProviderBatchConfig,
    ProviderConfig,
    RoutingConfig,
    TidegateConfig,
    Worker,
    WorkerSettings,
    default_models,
    micros_to_usd,
    open_worker_parts,
)

CostRun = Literal["premium", "tiers", "batches"]
COST_RUNS: tuple[CostRun, ...] = ("premium", "tiers", "batches")
PREMIUM_MODEL = "claude-sonnet-4.5"  # the price table's dearest chat model
BULK_DEADLINE_S = 48 * 3600.0
BATCH_LATENCY_S = 2.0  # how long the simulator takes to end a provider batch
BATCH = ProviderBatchConfig(gather_s=1.0, poll_s=1.0)  # short, so the run ends in seconds
SAVING_GOAL_PCT = 60.0  # of (3) against (1)
SETTLE_S = 60.0  # the longest wait for the last jobs once arrivals end
URGENT = (Priority.CRITICAL, Priority.HIGH)
TITLES: dict[CostRun, str] = {
    "premium": "(1) always premium: every job live on " + PREMIUM_MODEL,
    "tiers": "(2) tidegate, priority tiers, no provider batches",
    "batches": "(3) tidegate, priority tiers + provider batches for BULK",
}


@dataclass(frozen=True, slots=True)
class CostResult:
    """One cost run: what its jobs cost and how long the urgent ones took."""

    run: CostRun
    jobs: int
    succeeded: int
    cost_micros: int
    bulk_cost_micros: int  # of that, the BULK jobs'
    latency_s: dict[Priority, list[float]]  # end-to-end of the succeeded urgent jobs
    batches: int  # provider batches the simulator saw created
    batch_lines: int

    @property
    def per_1000_usd(self) -> Decimal:
        """Cost per 1,000 jobs."""
        return micros_to_usd(self.cost_micros) * 1000 / self.jobs if self.jobs else Decimal(0)


def cost_config(run: CostRun, base_url: str, queue_url: str) -> TidegateConfig:
    """The simulator as the one provider with the shipped price table, its rate limits lifted."""
    batch = BATCH if run == "batches" else None
    models = tuple(model.model_copy(update={"rpm": None, "tpm": None}) for model in default_models())
    provider = ProviderConfig(name="sim", base_url=base_url, models=models, batch=batch)
    routing = RoutingConfig()
    if run == "premium":
        routing = RoutingConfig(tiers={p.name.lower(): (PREMIUM_MODEL,) for p in Priority})
    return TidegateConfig(queue_url=queue_url, providers=(provider,), routing=routing)


def arrivals(scenario: Scenario, jobs: int, rate_per_s: float) -> list[tuple[float, Priority]]:
    """`jobs` arrivals (seconds from the start, class), seeded: every run sends the same ones."""
    rng = random.Random(scenario.seed)
    classes, weights = list(scenario.mix), list(scenario.mix.values())
    at = 0.0
    out = []
    for _ in range(jobs):
        at += rng.expovariate(rate_per_s)
        out.append((at, rng.choices(classes, weights)[0]))
    return out


async def run_cost(scenario: Scenario, run: CostRun, queue_url: str, sim: SimHandle, *, jobs: int,
                   rate_per_s: float) -> CostResult:
    """One run: the arrivals through a fresh queue and a worker, until every job is final."""
    await sim.reset()
    async with Queue.from_url(queue_url) as queue:
        settings = WorkerSettings(worker_id=f"bench-cost-{run}", concurrency=scenario.concurrency,
                                  urgent_reserve=scenario.urgent_reserve, claim_wait_s=0.2)
        config = cost_config(run, sim.base_url, queue_url)
        async with open_worker_parts(config, queue) as parts, Worker(parts, config, settings) as worker:
            task = asyncio.create_task(worker.run())
            try:
                ids = await _send(queue, scenario, arrivals(scenario, jobs, rate_per_s))
                finished = await _final(queue, ids)
            finally:
                worker.request_stop()
                await task
        stats = await sim.stats()
    batches = stats.get("batches", {})
    latency: dict[Priority, list[float]] = {level: [] for level in URGENT}
    cost = bulk_cost = succeeded = 0
    for job in finished:
        if job.state is not JobState.SUCCEEDED:
            continue
        succeeded += 1
        cost += int(job.result["cost_micros"])
        if job.priority is Priority.BULK:
            bulk_cost += int(job.result["cost_micros"])
        if job.priority in latency and job.finished_at is not None:
            latency[job.priority].append((job.finished_at - job.created_at).total_seconds())
    return CostResult(run, len(finished), succeeded, cost, bulk_cost, latency, int(batches.get("created", 0)),
                      int(batches.get("lines", 0)))


async def _send(queue: Queue, scenario: Scenario, planned: Sequence[tuple[float, Priority]]) -> list[str]:
    started = time.monotonic()
    ids = []
    for n, (at_s, level) in enumerate(planned):
        delay_s = started + at_s - time.monotonic()
        if delay_s > 0:
            await asyncio.sleep(delay_s)
        options: dict[str, object] = {"priority": level, "tenant": f"tenant-{n % scenario.tenants:02d}"}
        if level is Priority.BULK:
            options["timeout_s"] = BULK_DEADLINE_S
        ids.append(await queue.enqueue(scenario.chat_payload(n % scenario.users, n), **options))
    return ids


async def _final(queue: Queue, ids: list[str]) -> list[Job]:
    jobs = await asyncio.gather(*(queue.wait(job_id, SETTLE_S) for job_id in ids))
    stuck = [job.id for job in jobs if not job.is_final]
    if stuck:
        raise BenchmarkError(f"cost run: {len(stuck)} jobs not final {SETTLE_S:.0f} s after the load")
    return list(jobs)


async def run_costs(scenario: Scenario, urls: dict[str, str], sim: SimHandle, *, jobs: int,
                    rate_per_s: float) -> list[CostResult]:
    """The three runs in one go, the simulator's rate limits lifted meanwhile."""
    await sim.configure({"defaults": {"rpm": None}, "batch_latency_s": BATCH_LATENCY_S})
    try:
        return [await run_cost(scenario, run, urls[f"cost-{run}"], sim, jobs=jobs, rate_per_s=rate_per_s)
                for run in COST_RUNS]
    finally:
        await sim.configure({"defaults": {"rpm": scenario.provider_limit}})


def cost_report(results: Sequence[CostResult], *, rate_per_s: float) -> str:
    """The three runs side by side, and the saving of each against always-premium."""
    premium = next((r for r in results if r.run == "premium"), None)
    rows = ["| run | jobs (succeeded) | total cost | per 1,000 jobs | saving vs (1) | of which BULK "
            "| CRITICAL p50 / p95 | HIGH p50 / p95 | provider batches (lines) |",
            "|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        saving = "—" if premium is None or r is premium or not premium.cost_micros else (
            f"{100 * (1 - r.cost_micros / premium.cost_micros):.1f} %")
        rows.append(
            f"| {TITLES[r.run]} | {r.jobs} ({r.succeeded}) | ${micros_to_usd(r.cost_micros):.4f} "
            f"| ${r.per_1000_usd:.4f} | {saving} | ${micros_to_usd(r.bulk_cost_micros):.4f} "
            f"| {_quantiles(r.latency_s[Priority.CRITICAL])} "
            f"| {_quantiles(r.latency_s[Priority.HIGH])} | {r.batches} ({r.batch_lines}) |")
    batches = next((r for r in results if r.run == "batches"), None)
    goal = ""
    if premium is not None and batches is not None and premium.cost_micros:
        saved_pct = 100 * (1 - batches.cost_micros / premium.cost_micros)
        goal = (f"\nSaving of (3) vs (1): {saved_pct:.1f} % — goal ≥ {SAVING_GOAL_PCT:.0f} %: "
                f"{'met' if saved_pct >= SAVING_GOAL_PCT else 'NOT met'}.\n")
    return (f"### Cost: always premium vs priority tiers vs provider batches\n\n"
            f"{results[0].jobs if results else 0} jobs per run, {rate_per_s:g}/s, the seed's mix, BULK with "
            f"a deadline 48 h away; simulator without rate limits, its batches ending after "
            f"{BATCH_LATENCY_S:g} s (gather {BATCH.gather_s:g} s, poll {BATCH.poll_s:g} s). Latency is "
            "end-to-end (enqueue → final), ms.\n\n" + "\n".join(rows) + "\n" + goal)


def _quantiles(samples_s: list[float]) -> str:
    if not samples_s:
        return "—"
    return f"{percentile(samples_s, 0.5):.0f} / {percentile(samples_s, 0.95):.0f}"


__all__ = ["COST_RUNS", "CostResult", "CostRun", "cost_config", "cost_report", "run_cost", "run_costs"]
