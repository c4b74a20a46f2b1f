"""The dispatch benchmark's command line and report assembly; `bench/dispatch.py` is the entry
point (see its docstring)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import platform
import sqlite3
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, fields
from importlib import metadata
from pathlib import Path

from bench.common import BenchmarkError, command_line
from bench.dispatch_cost import CostResult, cost_report, run_costs
from bench.dispatch_report import (
    depth_block,
    generator_lag,
    loop_lag,
    markdown_comparison,
    markdown_phase_table,
    phase_table,
    sim_statuses,
    upstream_observed,
    verdicts,
    windows,
)
from bench.dispatch_run import CeilingResult, Mode, ModeResult, run_ceiling, run_mode
from bench.dispatch_scenario import (
    DEFAULT_MIX_TEXT,
    FIFO_LEVEL,
    RATE_WINDOW_S,
    SHARED_MODEL,
    Scenario,
    format_mix,
    parse_mix,
)
from bench.dispatch_sim import SimHandle, SimPlacement, simulated_provider
from bench.machine import CpuMeter
from bench.report import load_average, source_revision
from bench.servers import private_redis

# --quick: the same scenario, shorter (about 40 s in all on 2 cores).
QUICK = {"nominal_s": 6.0, "overload_s": 6.0, "drain_s": 3.0}
QUICK_CEILING = {"ceiling_s": 3.0, "ceiling_warmup_s": 1.0, "ceiling_jobs": 10000}
_LOAD_MODES: tuple[Mode, ...] = ("priority", "fifo")
FULL_CEILING = {"ceiling_s": 8.0, "ceiling_warmup_s": 2.0, "ceiling_jobs": 30000}


@dataclass(frozen=True, slots=True)
class Options:
    """What the command line asks for beyond the scenario."""

    queue: str
    sim: SimPlacement
    modes: tuple[Mode, ...]
    cost: bool  # the cost scenario: always premium vs priority tiers vs provider batches
    cost_jobs: int
    cost_rate_per_s: float
    ceiling: bool
    ceiling_s: float
    ceiling_warmup_s: float
    ceiling_jobs: int
    ceiling_concurrency: int
    output: Path | None


def parser(description: str | None) -> argparse.ArgumentParser:
    """Every flag; scenario flags default to None so --quick can fill what was not given."""
    p = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="short phases (about 40 s in all)")
    p.add_argument("--queue", choices=("sqlite", "redis"), default="sqlite",
                   help="queue backend; redis starts a private redis-server (default: sqlite)")
    p.add_argument("--sim", choices=("subprocess", "inproc"), default="subprocess",
                   help="run the simulated provider in a subprocess or on the benchmark's loop")
    p.add_argument("--modes", default="priority,fifo,cost",
                   help="priority, fifo and/or cost (default all three); cost compares always-premium, "
                        "priority tiers and provider batches for BULK")
    p.add_argument("--cost-jobs", type=int, help="jobs per cost run (default 1200; --quick 400)")
    p.add_argument("--cost-rate", type=float, default=40.0, help="arrivals per second of the cost runs "
                                                                  "(default 40)")
    p.add_argument("--users", type=int, help="virtual users (default 1000)")
    p.add_argument("--tenants", type=int, help="tenants the users belong to (default 10)")
    p.add_argument("--rate-per-min", type=float, help="nominal requests per minute (default 10000)")
    p.add_argument("--overload-factor", type=float, help="overload arrival rate ÷ nominal (default 3)")
    p.add_argument("--nominal-s", type=float, help="nominal phase length (default 40; --quick 6)")
    p.add_argument("--overload-s", type=float, help="overload phase length (default 40; --quick 6)")
    p.add_argument("--drain-s", type=float,
                   help="longest drain of the backlog before the rest is cancelled (default 15; --quick 3)")
    p.add_argument("--mix", help=f"priority mix in weights (default {DEFAULT_MIX_TEXT})")
    p.add_argument("--concurrency", type=int, help="calls in flight per worker (default 64)")
    p.add_argument("--urgent-reserve", type=int,
                   help="slots per worker kept for HIGH and CRITICAL (default: the worker's, 4 of 64)")
    p.add_argument("--workers", type=int, help="workers on the loop, sharing one limiter (default 1)")
    p.add_argument("--capacity-factor", type=float,
                   help="provider limit ÷ nominal rate: the dispatch capacity (default 1.3)")
    p.add_argument("--sim-limit-factor", type=float,
                   help="simulator's own limit ÷ the worker's configured one (default 1.1)")
    p.add_argument("--latency-ms", type=float, help="simulated provider median latency (default 80)")
    p.add_argument("--latency-p99-ms", type=float, help="simulated provider p99 latency (default 400)")
    p.add_argument("--seed", type=int, help="seed of arrivals and simulator (default 7)")
    p.add_argument("--no-ceiling", action="store_true", help="skip the unlimited-throughput run")
    p.add_argument("--ceiling-only", action="store_true",
                   help="only the unlimited-throughput run (no load or cost runs, whatever --modes says)")
    p.add_argument("--ceiling-concurrency", type=int, default=256,
                   help="calls in flight per worker in the ceiling run (default 256)")
    p.add_argument("--output", type=Path, help="also write the markdown report to this file")
    return p


def scenario_from(args: argparse.Namespace) -> Scenario:
    """The scenario: defaults, then --quick's shorter phases, then explicit flags."""
    values: dict[str, object] = dict(QUICK) if args.quick else {}
    for f in fields(Scenario):
        given = getattr(args, f.name, None)
        if given is not None and f.name != "mix":
            values[f.name] = given
    if args.mix is not None:
        values["mix"] = parse_mix(args.mix)
    scenario = Scenario(**values)  # type: ignore[arg-type]
    if scenario.users < 1 or scenario.tenants < 1 or scenario.concurrency < 1 or scenario.workers < 1:
        raise BenchmarkError("users, tenants, concurrency and workers must be >= 1")
    if min(scenario.nominal_s, scenario.overload_s) <= 0 or scenario.drain_s < 0:
        raise BenchmarkError("phase lengths must be > 0 (the drain >= 0)")
    return scenario


def options_from(args: argparse.Namespace) -> Options:
    """Backend, simulator placement, modes and the ceiling run."""
    if args.ceiling_only and args.no_ceiling:
        raise BenchmarkError("--ceiling-only and --no-ceiling exclude each other")
    named = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not named or any(m not in ("priority", "fifo", "cost") for m in named):
        raise BenchmarkError(f"--modes takes priority, fifo and/or cost, not {args.modes!r}")
    if args.ceiling_only:
        named = []
    modes = tuple(mode for mode in _LOAD_MODES if mode in named)
    cost_jobs = args.cost_jobs or (400 if args.quick else 1200)
    if cost_jobs < 1 or args.cost_rate <= 0:
        raise BenchmarkError("--cost-jobs and --cost-rate must be > 0")
    ceiling = QUICK_CEILING if args.quick else FULL_CEILING
    return Options(
        queue=args.queue, sim=args.sim, modes=modes, cost="cost" in named, cost_jobs=cost_jobs,
        cost_rate_per_s=args.cost_rate, ceiling=not args.no_ceiling,
        ceiling_s=ceiling["ceiling_s"], ceiling_warmup_s=ceiling["ceiling_warmup_s"],
        ceiling_jobs=int(ceiling["ceiling_jobs"]), ceiling_concurrency=args.ceiling_concurrency,
        output=args.output,
    )


@dataclass(slots=True)
class Backend:
    """Where each run's fresh queue lives, and the redis-server's pid and version if any."""

    urls: dict[str, str]
    redis_pid: int | None = None
    redis_version: str | None = None


@contextlib.asynccontextmanager
async def backend(kind: str) -> AsyncIterator[Backend]:
    """A fresh queue per run: its own SQLite file, or its own queue name on a private Redis."""
    names = ("priority", "fifo", "ceiling", "cost-premium", "cost-tiers", "cost-batches")
    if kind == "sqlite":
        with tempfile.TemporaryDirectory(prefix="tidegate-bench-dispatch-") as folder:
            yield Backend({name: f"sqlite:///{Path(folder) / name}.db" for name in names})
        return
    token = uuid.uuid4().hex[:6]
    with private_redis() as server:
        urls = {name: f"{server.url}?name=bench-{name}-{token}" for name in names}
        yield Backend(urls, server.pid, server.version)


async def run_all(scenario: Scenario, options: Options) -> tuple[dict[str, ModeResult], CeilingResult | None,
                                                               list[CostResult], dict[str, str]]:
    """Every requested run against one simulator and one backend."""
    async with backend(options.queue) as where, simulated_provider(scenario, options.sim) as sim:
        helpers = _helpers(sim, where)
        meter = CpuMeter(pids=tuple(helpers.values()))
        meter.start()
        runs: dict[str, ModeResult] = {}
        for mode in options.modes:
            print(f"… {mode}: {scenario.load_s:.0f} s of load, up to {scenario.drain_s:.0f} s of drain",
                  file=sys.stderr, flush=True)
            runs[mode] = await run_mode(scenario, mode, where.urls[mode], sim, helpers)
        ceiling = None
        if options.ceiling:
            print(f"… ceiling: {options.ceiling_s:.0f} s unlimited", file=sys.stderr, flush=True)
            ceiling = await run_ceiling(
                scenario, where.urls["ceiling"], sim, helpers, jobs=options.ceiling_jobs,
                warmup_s=options.ceiling_warmup_s, window_s=options.ceiling_s,
                concurrency=options.ceiling_concurrency,
            )
        costs = []
        if options.cost:
            print(f"… cost: 3 runs of {options.cost_jobs} jobs at {options.cost_rate_per_s:g}/s",
                  file=sys.stderr, flush=True)
            costs = await run_costs(scenario, where.urls, sim, jobs=options.cost_jobs,
                                    rate_per_s=options.cost_rate_per_s)
        meter.stop()
        facts = {"redis-server": where.redis_version or "not used",
                 "CPU used by other processes during the run": meter.describe()}
    return runs, ceiling, costs, facts


def _helpers(sim: SimHandle, where: Backend) -> dict[str, int]:
    helpers = {}
    if sim.pid is not None:
        helpers["simulator"] = sim.pid
    if where.redis_pid is not None:
        helpers["redis-server"] = where.redis_pid
    return helpers


def render(scenario: Scenario, options: Options, runs: dict[str, ModeResult], ceiling: CeilingResult | None,
           costs: list[CostResult], facts: dict[str, str], command: str, elapsed_s: float) -> str:
    """The whole markdown report."""
    named = [mode.upper() if mode == "fifo" else mode for mode in runs] + (["cost"] if costs else [])
    what = " vs ".join(named) or "the dispatch ceiling alone"
    out = [f"## Dispatch under load: {what} ({options.queue}, simulator {options.sim})\n",
           f"`{command}` — {elapsed_s:.0f} s\n", _facts_table(scenario, options, facts)]
    if runs:  # the scenario's load; the ceiling's own text says how it runs
        out.append(_setup(scenario, options))
    for mode, run in runs.items():
        fifo_note = f" (everything enqueued at {FIFO_LEVEL.name})" if mode == "fifo" else ""
        out.append(f"### {mode}{fifo_note}\n")
        for phase in windows(scenario, run):
            rows = phase_table(run, phase)
            title = (f"{phase.name}, {phase.rate_per_s:.0f} req/s offered, {phase.duration_s:.0f} s"
                     if phase.rate_per_s else f"drain ({phase.duration_s:.1f} s, "
                     f"{'emptied' if run.drained else 'cut: the rest cancelled'})")
            out.append(f"**{title}**\n\n" + markdown_phase_table(rows, drain=not phase.rate_per_s))
        out.append(_run_facts(scenario, run))
        out.append("Queue depth per level, one character per second (N nominal, O overload, d drain; "
                   f"each row scaled to its max):\n\n{depth_block(scenario, run)}")
    if "priority" in runs and "fifo" in runs:
        for phase in scenario.phases():
            out.append(f"### Priority vs FIFO, {phase.name}\n\n" + markdown_comparison(
                phase_table(runs["priority"], phase), phase_table(runs["fifo"], phase)))
    if ceiling is not None:
        out.append(_ceiling_text(ceiling))
    if costs:
        out.append(cost_report(costs, rate_per_s=options.cost_rate_per_s))
    judged = verdicts(scenario, runs, ceiling)
    if judged:
        out.append("### Verdicts\n\n" + "\n".join(judged) + "\n")
    if runs:
        out.append(_notes(scenario, options))
    return "\n".join(out)


def _facts_table(scenario: Scenario, options: Options, facts: dict[str, str]) -> str:
    cpu = "unknown"
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as info:
        cpu = next((line.split(":", 1)[1].strip() for line in info if line.startswith("model name")), cpu)
    versions = ", ".join(f"{name} {_version(name)}" for name in ("aiohttp", "redis", "hiredis", "orjson"))
    rows = {
        "tidegate": source_revision(),
        "cores (nproc)": str(len(os.sched_getaffinity(0))),
        "CPU": cpu,
        "load average (1 min) before the run": facts.get("load before", "?"),
        **{k: v for k, v in facts.items() if k != "load before"},
        "Python": platform.python_version(),
        "SQLite": sqlite3.sqlite_version,
        "libraries": versions,
    }
    return "| | |\n|---|---|\n" + "".join(f"| {k} | {v} |\n" for k, v in rows.items())


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "(not installed)"


def _setup(scenario: Scenario, options: Options) -> str:
    return (
        f"\nLoad: {scenario.users} virtual users in {scenario.tenants} tenants, each a Poisson process; "
        f"{scenario.rate_per_min:,.0f} req/min ({scenario.nominal_rate_per_s:.0f} req/s) for "
        f"{scenario.nominal_s:.0f} s, then {scenario.overload_factor:g}x "
        f"({scenario.nominal_rate_per_s * scenario.overload_factor:.0f} req/s) "
        f"for {scenario.overload_s:.0f} s; "
        f"mix {format_mix(scenario.mix)}. Capacity: every tier routes to one model ({SHARED_MODEL}) that the "
        f"worker paces to {scenario.worker_limit} req per {RATE_WINDOW_S:g} s "
        f"({scenario.capacity_factor:g}x nominal); the simulator enforces {scenario.provider_limit} per "
        f"{RATE_WINDOW_S:g} s sliding window and answers in {scenario.latency_ms:g} ms median / "
        f"{scenario.latency_p99_ms:g} ms p99 (lognormal). {scenario.workers} worker(s) x "
        f"{scenario.concurrency} calls in flight, {scenario.reserved_slots} of them kept for HIGH and "
        "CRITICAL.\n"
    )


def _run_facts(scenario: Scenario, run: ModeResult) -> str:
    phases = scenario.phases()
    cpu = run.cpu
    helpers = ", ".join(f"{name} {secs:.1f} core-s ({cpu.share(secs)})"
                        for name, secs in cpu.helpers_s.items())
    counts = ", ".join(f"{k} {v:.0f}" for k, v in run.worker_counts.items())
    return (
        f"\n- provider call as the worker timed it, p50 / p99: {upstream_observed(run)} "
        f"(configured {scenario.latency_ms:g} / {scenario.latency_p99_ms:g} ms)\n"
        f"- simulator answers: {sim_statuses(run)}; worker: {counts}\n"
        + "".join(f"- event-loop lag p50 / p99 / max, {p.name}: {loop_lag(run, p)}; enqueue start late "
                  f"p99 / max: {generator_lag(run, p)}\n" for p in phases)
        + f"- CPU over {cpu.wall_s:.0f} s: this process {cpu.own_s:.1f} core-s ({cpu.share(cpu.own_s)} of "
        f"one core){', ' + helpers if helpers else ''}; other processes {cpu.other_s:.1f} core-s\n"
        + (f"- enqueue errors: {len(run.failures)} (first: {run.failures[0]})\n" if run.failures else "")
    )


def _ceiling_text(ceiling: CeilingResult) -> str:
    return (
        "### Dispatch ceiling (no rate limit)\n\n"
        f"{ceiling.rate_per_s:.0f} jobs/s completed over {ceiling.window_s:.0f} s with "
        f"{ceiling.concurrency} calls in flight per worker, prefilled queue"
        f"{' (it ran dry: a lower bound)' if ceiling.ran_dry else ''}; provider call p50 "
        f"{ceiling.upstream_p50_ms:.0f} ms; {ceiling.cut} prefilled jobs cancelled afterwards. "
        f"CPU: this process {ceiling.cpu.share(ceiling.cpu.own_s)} of one core"
        + "".join(f", {n} {ceiling.cpu.share(s)}" for n, s in ceiling.cpu.helpers_s.items()) + ".\n"
    )


def _notes(scenario: Scenario, options: Options) -> str:
    return (
        "\nNotes. *queue wait* is claim - claimable as the worker records it (`queue_wait_ms`); a job the "
        "worker parked (pacing wait over `pace_wait_max_s`) becomes claimable again when it is promoted, so "
        "its earlier waits show in *paced/parked*, not here. *end-to-end* is the queue's "
        "finished_at - created_at. *paced/parked* is end-to-end minus that queue wait minus the provider "
        "call: time a claimed job spent pacing or parked in the worker (with, for parked jobs, their wait "
        "before the first claim). Per-class figures are by arrival "
        "phase; done/s counts completions inside the phase's window whatever their arrival. `≥` marks "
        "figures that requests cut by the benchmark (cancelled when the drain ran out) can only make larger. "
        f"Everything {'but the simulator ' if options.sim == 'subprocess' else ''}runs on one event loop in "
        f"one process on {len(os.sched_getaffinity(0))} cores: the event-loop lag above is in every figure.\n"
    )


def main(description: str | None = None, argv: Sequence[str] | None = None) -> int:
    """Run the benchmark and print its markdown report; 1 on a failed check."""
    args = parser(description).parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    command = command_line("bench.dispatch", sys.argv[1:] if argv is None else argv)
    try:
        scenario, options = scenario_from(args), options_from(args)
        load_before = load_average()
        started = time.monotonic()
        runs, ceiling, costs, facts = asyncio.run(run_all(scenario, options))
        facts["load before"] = load_before
    except BenchmarkError as exc:
        print(f"dispatch benchmark FAILED: {exc}", file=sys.stderr)
        return 1
    report = render(scenario, options, runs, ceiling, costs, facts, command, time.monotonic() - started)
    print(report)
    if options.output is not None:
        options.output.write_text(report)
    return 0
