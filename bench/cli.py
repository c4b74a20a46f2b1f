"""The queue benchmark's command line and its plan: which systems, which paths, how big, how
often. `python -m bench.queues` (bench/queues.py) is the entry point; see its docstring."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import tempfile
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import redis.asyncio as aioredis
from rich.console import Console

from bench import raw, tidegate_runs
from bench.common import (
    BATCHED,
    BATCHED_EACH,
    ROUND_TRIP,
    SINGLE,
    BenchmarkError,
    Result,
    command_line,
    median_result,
)
from bench.machine import CpuMeter
from bench.peers import PeerSettings, run_arq, run_rq, run_saq
from bench.report import (
    PEERS,
    TIDEGATE,
    Skipped,
    load_average,
    machine_facts,
    print_report,
)
from bench.servers import private_redis

SYSTEMS = (*TIDEGATE, *PEERS, "raw")
PATHS = (SINGLE, BATCHED, BATCHED_EACH)
REPEAT_BUDGET_S = 30.0  # most wall time spent on runs that are then done again
MIN_METERED_S = 0.25  # CPU times come in 10 ms ticks: shorter runs cannot be judged
console = Console(width=160)  # wide enough for the table when piped to a file
progress = Console(stderr=True, width=160)


@dataclass(frozen=True, slots=True)
class Plan:
    """Sizes of one benchmark run."""

    jobs: int  # batched path: tidegate, raw
    single_jobs: int  # single path: tidegate, raw (sequential, so fewer)
    peer_jobs: int  # both paths of each peer (they are slower; enough for a steady state)
    batch: int
    warmup: int
    rounds: int
    max_other_pct: float  # a run during which other processes used more is repeated
    repeats: int  # at most this many times
    shape: tidegate_runs.BatchedShape
    peers: PeerSettings


def parse_args(argv: list[str], description: str | None = None) -> argparse.Namespace:
    """The command line; `description` is the entry script's docstring, shown by --help."""
    defaults = PeerSettings()
    parser = argparse.ArgumentParser(
        prog="python -m bench.queues",
        description=description,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--jobs", type=int, default=30_000, help="jobs in each of tidegate's batched paths")
    parser.add_argument("--single-jobs", type=int, default=2_000, help="jobs in tidegate's single path")
    parser.add_argument("--peer-jobs", type=int, default=3_000, help="jobs in each path of each peer")
    parser.add_argument("--batch", type=int, default=500, help="jobs per enqueue batch and per claim")
    parser.add_argument("--warmup", type=int, default=200, help="untimed jobs before each run")
    parser.add_argument("--rounds", type=int, default=3, help="repeats of every run; the median is shown")
    parser.add_argument("--only", default=",".join(SYSTEMS),
                        help=f"comma-separated subset of: {', '.join(SYSTEMS)}")
    parser.add_argument("--paths", default=",".join(PATHS), help=f"comma-separated: {', '.join(PATHS)}")
    parser.add_argument("--max-other-cpu", type=float, default=20.0,
                        help="repeat a run while other processes used more than this %% of one "
                             "core during it (-1: never)")
    parser.add_argument("--repeats", type=int, default=1, help="most repeats of one disturbed run")
    parser.add_argument("--quick", action="store_true", help="small sizes and one round: a smoke run")
    parser.add_argument("--consumers", type=int, default=2, help="tidegate batched: consumer tasks")
    parser.add_argument("--inflight", type=int, default=64,
                        help="tidegate batched: completes in flight per consumer")
    parser.add_argument("--saq-concurrency", type=int, default=defaults.saq_concurrency)
    parser.add_argument("--saq-max-ops", type=int, default=defaults.saq_max_concurrent_ops)
    parser.add_argument("--arq-max-jobs", type=int, default=defaults.arq_max_jobs)
    parser.add_argument("--arq-poll-delay", type=float, default=defaults.arq_poll_delay_s)
    parser.add_argument("--arq-enqueue-concurrency", type=int, default=defaults.arq_enqueue_concurrency)
    parser.add_argument("--rq-workers", type=int, default=defaults.rq_workers)
    parser.add_argument("--json", type=Path, help="also write the results here as JSON")
    args = parser.parse_args(argv)
    unknown = set(_split(args.only)) - set(SYSTEMS)
    if unknown:
        parser.error(f"--only: unknown system(s) {', '.join(sorted(unknown))}; known: {', '.join(SYSTEMS)}")
    if set(_split(args.paths)) - set(PATHS):
        parser.error(f"--paths: use some of {', '.join(PATHS)}")
    return args


def _split(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def make_plan(args: argparse.Namespace) -> Plan:
    """Sizes from the command line, shrunk by --quick."""
    jobs, single_jobs, peer_jobs, rounds, warmup = (
        args.jobs, args.single_jobs, args.peer_jobs, args.rounds, args.warmup
    )
    if args.quick:
        jobs, single_jobs, peer_jobs, rounds, warmup = (
            min(jobs, 2_000), min(single_jobs, 300), min(peer_jobs, 500), 1, min(warmup, 50)
        )
    return Plan(
        jobs=jobs,
        single_jobs=single_jobs,
        peer_jobs=peer_jobs,
        batch=args.batch,
        warmup=warmup,
        rounds=rounds,
        max_other_pct=args.max_other_cpu,
        repeats=args.repeats,
        shape=tidegate_runs.BatchedShape(batch=args.batch, consumers=args.consumers, inflight=args.inflight),
        peers=PeerSettings(
            saq_concurrency=args.saq_concurrency,
            saq_max_concurrent_ops=args.saq_max_ops,
            arq_max_jobs=args.arq_max_jobs,
            arq_poll_delay_s=args.arq_poll_delay,
            arq_enqueue_concurrency=args.arq_enqueue_concurrency,
            rq_workers=args.rq_workers,
        ),
    )


Run = Callable[[], Awaitable[Result]]


def runs_for(system: str, path: str, url: str, plan: Plan) -> Run:
    """The coroutine factory that measures `system` on `path` once."""
    if system == "raw":
        if path == ROUND_TRIP:
            return lambda: raw.raw_round_trips(url, plan.single_jobs * 2)
        if path == SINGLE:
            return lambda: raw.raw_single(url, plan.single_jobs)
        return lambda: raw.raw_batched(url, plan.jobs, plan.batch)
    if system in TIDEGATE:
        return lambda: run_tidegate(system, path, url, plan)
    peer = {"saq": run_saq, "arq": run_arq, "rq": run_rq}[system]
    return lambda: peer(url, path, plan.peer_jobs, plan.batch, plan.warmup, plan.peers)


async def run_tidegate(system: str, path: str, url: str, plan: Plan) -> Result:
    """One run of a tidegate backend on a fresh queue (a new SQLite file, a new Redis name)."""
    from tidegate import Queue

    with tempfile.TemporaryDirectory(prefix="tidegate-bench-") as folder:
        if system == "tidegate-sqlite":
            queue = Queue.from_url(f"sqlite:///{folder}/bench.db", maintenance_interval_s=None)
        else:
            queue = Queue.from_url(url, name=f"bench-{uuid.uuid4().hex[:8]}", maintenance_interval_s=None)
        async with queue:
            if path == SINGLE:
                return await tidegate_runs.single(queue, system, plan.single_jobs, plan.warmup)
            return await tidegate_runs.batched(
                queue, system, plan.jobs, plan.warmup, plan.shape, each=path == BATCHED_EACH
            )


def missing_backend(system: str) -> str | None:
    """Why a tidegate backend cannot run here, or None when it can."""
    module = {"tidegate-sqlite": "tidegate.queue.sqlite", "tidegate-redis": "tidegate.queue.redis"}[system]
    try:
        __import__(module)
    except ImportError as exc:
        return f"{module} not importable: {exc}"
    return None


async def run_all(
    url: str, systems: list[str], paths: list[str], plan: Plan, server_pid: int, notes: Notes
) -> tuple[list[Result], list[Skipped]]:
    """Every selected system on every selected path, `plan.rounds` times; medians."""
    skipped = [Skipped(s, reason) for s in systems if s in TIDEGATE and (reason := missing_backend(s))]
    runnable = [s for s in systems if s not in {skip.system for skip in skipped}]
    jobs: list[tuple[str, str]] = []
    for system in runnable:
        if system == "raw":
            # One raw batched row serves as the limit for both batched paths.
            wanted = [ROUND_TRIP, *(p for p in paths if p != BATCHED_EACH)]
            if BATCHED_EACH in paths and BATCHED not in paths:
                wanted.append(BATCHED)
        elif system in TIDEGATE:
            wanted = list(paths)
        else:
            # Peers have no batched/each variant: their batched path settles each job anyway.
            wanted = [p for p in paths if p != BATCHED_EACH]
            if BATCHED_EACH in paths and BATCHED not in paths:
                wanted.append(BATCHED)
        jobs.extend((system, path) for path in wanted)
    session = Session(url, plan, server_pid, aioredis.Redis.from_url(url), notes)
    measured: dict[tuple[str, str], list[Result]] = {key: [] for key in jobs}
    try:
        for round_no in range(1, plan.rounds + 1):
            for system, path in jobs:
                measured[(system, path)].append(await session.run(system, path, round_no))
    finally:
        await session.flusher.aclose()
    return [median_result(results) for results in measured.values()], skipped


@dataclass(slots=True)
class Notes:
    """What happened along the way that a reader of the figures should know."""

    repeated: int = 0  # runs done again because other processes were busy
    kept_disturbed: int = 0  # runs kept although other processes were busy (out of repeats)
    repeat_s: float = 0.0  # wall time spent on runs that were then done again


@dataclass(slots=True)
class Session:
    """Runs one measurement at a time against the private server, watching the machine."""

    url: str
    plan: Plan
    server_pid: int
    flusher: aioredis.Redis
    notes: Notes

    async def run(self, system: str, path: str, round_no: int) -> Result:
        """One run, repeated (up to `plan.repeats`) while other processes took more than
        `plan.max_other_pct` of a core: on a shared machine a figure should describe the system
        measured, not whoever else was busy. Repeats stop once they have cost REPEAT_BUDGET_S
        in all, so that a machine busy throughout still gives a bounded run (and says so)."""
        plan, notes = self.plan, self.notes
        attempt = 0
        while True:
            # A clean server for each run: leftovers of one system must not slow the next.
            await self.flusher.flushall()
            meter = CpuMeter(pids=[self.server_pid])
            meter.start()
            result = await runs_for(system, path, self.url, plan)()
            meter.stop()
            # Below MIN_METERED_S the clock-tick counts are too coarse to call a run disturbed.
            disturbed = (
                plan.max_other_pct >= 0
                and meter.wall_s >= MIN_METERED_S
                and meter.share_pct > plan.max_other_pct
            )
            again = disturbed and attempt < plan.repeats and notes.repeat_s < REPEAT_BUDGET_S
            self._print(round_no, result, meter, disturbed, again)
            if not again:
                notes.kept_disturbed += disturbed
                return result
            notes.repeated += 1
            notes.repeat_s += meter.wall_s
            attempt += 1

    def _print(self, round_no: int, result: Result, meter: CpuMeter, disturbed: bool, again: bool) -> None:
        latency = ""
        if result.p50_ms is not None and result.p99_ms is not None:
            latency = f", p50 {result.p50_ms:.3f} ms, p99 {result.p99_ms:.3f} ms"
        verdict = ""
        if disturbed:
            verdict = " - disturbed, run again" if again else " - disturbed, kept"
        progress.print(
            f"round {round_no}/{self.plan.rounds} {result.system:<16} {result.path:<12} "
            f"{result.rate:>10,.0f}/s  ({result.jobs:,} in {result.seconds:.2f}s{latency}; "
            f"other processes: {meter.describe()}){verdict}",
            highlight=False,
        )



def main(argv: list[str] | None = None, description: str | None = None) -> int:
    """Start a private Redis, run the plan, print the report."""
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv, description)
    # SAQ warns on every stop that its idle dequeue slots had to be cancelled: expected here.
    logging.getLogger("saq").setLevel(logging.ERROR)
    plan = make_plan(args)
    systems = [s for s in SYSTEMS if s in _split(args.only)]
    paths = [p for p in PATHS if p in _split(args.paths)]
    load_before = load_average()
    try:
        with private_redis() as server:
            progress.print(f"redis-server {server.version} on {server.url}; plan: {plan}", highlight=False)
            meter = CpuMeter(pids=[server.pid])
            meter.start()
            notes = Notes()
            results, skipped = asyncio.run(run_all(server.url, systems, paths, plan, server.pid, notes))
            meter.stop()
            facts = machine_facts(server.version, load_before, meter.describe())
            facts["runs repeated for other processes' load"] = (
                f"{notes.repeated} (threshold {plan.max_other_pct:g} % of one core, up to "
                f"{plan.repeats} repeats, {REPEAT_BUDGET_S:.0f} s in all); "
                f"kept although disturbed: {notes.kept_disturbed}"
            )
    except BenchmarkError as exc:
        progress.print(f"[bold red]benchmark failed:[/bold red] {exc}")
        return 1
    print_report(console, results, skipped, facts, command_line("bench.queues", argv))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        payload = {
            "command": command_line("bench.queues", argv),
            "machine": facts,
            "plan": asdict(plan),
            "results": [{**asdict(r), "rate": r.rate} for r in results],
            "skipped": [asdict(s) for s in skipped],
        }
        args.json.write_text(json.dumps(payload, indent=2))
    return 0
