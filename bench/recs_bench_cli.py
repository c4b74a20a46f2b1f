"""The recommendations benchmark's command line and run: start the servers, measure freshness,
serving and memory in turn, print the report. `bench/recs.py` is the entry point (see its
docstring)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

from rich.console import Console

from bench.common import BenchmarkError
from bench.recs_bench_data import Shop
from bench.recs_bench_fresh import FreshPlan
from bench.recs_bench_fresh import measure as measure_fresh
from bench.recs_bench_memory import measure as measure_memory
from bench.recs_bench_report import Report, markdown, print_report
from bench.recs_bench_serve import ServePlan
from bench.recs_bench_serve import measure as measure_serve
from bench.report import load_average, source_revision
from bench.servers import private_redis
from bench.sync_servers import postgres, postgres_version, postmaster_pid
from tidegate.testing import server_gc

PARTS = ("fresh", "serve", "memory")
STORES = ("memory", "redis")
GC_MODES = ("default", "freeze")
FULL: dict[str, Any] = {"duration_s": 30.0, "fresh_products": 10_000, "fresh_history": 50_000,
                        "queries": 1000, "history": 100_000, "memory_users": 50_000, "full_users": 10_000}
QUICK: dict[str, Any] = {"duration_s": 8.0, "fresh_products": 5_000, "fresh_history": 10_000,
                         "queries": 300, "history": 30_000, "memory_users": 10_000, "full_users": 2_000}
LIBRARIES = ("numpy", "psycopg2-binary", "redis", "hiredis", "aiohttp", "uvicorn", "fastapi", "orjson")
console = Console(width=220)  # wide enough for the tables when piped to a file
progress_console = Console(stderr=True, width=160)


def _progress(message: str) -> None:
    progress_console.print(f"[dim]{time.strftime('%H:%M:%S')}[/dim] {message}")


def _facts(versions: dict[str, str], load_before: str, other: str) -> dict[str, str]:
    cpu = "unknown"
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as info:
        cpu = next((line.split(":", 1)[1].strip() for line in info if line.startswith("model name")), cpu)
    libraries = []
    for package in LIBRARIES:
        try:
            libraries.append(f"{package} {metadata.version(package)}")
        except metadata.PackageNotFoundError:
            libraries.append(f"{package} (not installed)")
    return {
        "tidegate": source_revision(),
        "cores (nproc)": str(len(os.sched_getaffinity(0))),
        "CPU": cpu,
        "load average (1 min) before the run": load_before,
        "CPU used by other processes during the freshness runs": other,
        "Python": platform.python_version(),
        **versions,
        "libraries": ", ".join(libraries),
    }


async def run(args: argparse.Namespace, folder: Path) -> Report:
    """Start the servers, measure each part asked for, return the report."""
    report = Report(plan={key: value for key, value in vars(args).items()
                          if key not in ("json", "markdown", "logs")})
    load_before = load_average()
    versions: dict[str, str] = {}
    other_s = wall_s = 0.0
    with private_redis() as redis, contextlib.ExitStack() as stack:
        versions["redis-server"] = redis.version
        if "fresh" in args.parts:
            server = stack.enter_context(postgres())
            versions["PostgreSQL"] = (f"{postgres_version(server)} "
                                      "(private cluster: wal_level=logical, fsync off)")
            pids = {"postgres": postmaster_pid(server), "redis-server": redis.pid}
            for store, freeze in ((s, f) for s in args.stores for f in args.gc):
                plan = FreshPlan(products=args.fresh_products, users=args.users, history=args.fresh_history,
                                 rate_per_s=args.rate, duration_s=args.duration_s,
                                 probe_rate_per_s=args.probe_rate, probe_users=args.probe_users,
                                 poll_s=args.poll_s, gc_freeze=freeze)
                try:
                    result = await measure_fresh(store, plan, server, redis.url, pids, folder, _progress)
                except BenchmarkError as exc:
                    report.failed.append(f"freshness, {store}: {str(exc).splitlines()[0]}")
                    _progress(f"[red]freshness, {store} failed[/red]: {exc}")
                    continue
                report.fresh.append(result)
                other_s += result.cpu.get("other", 0.0)
                wall_s += result.writer.seconds if result.writer else 0.0
                shown, updated = result.probe_quantiles()["p99_ms"], result.sink_quantiles()["p99_ms"]
                _progress(f"freshness, {store}: shows it p99 {shown or 0:.1f} ms, "
                          f"updated p99 {updated or 0:.1f} ms")
        if "serve" in args.parts:
            plan_s = ServePlan(products=args.products, users=args.users, history=args.history,
                               queries=args.queries)
            for store in args.stores:
                url = "memory://" if store == "memory" else redis.url
                try:
                    prefix = f"benchserve{time.time_ns()}"
                    report.serve.append(await measure_serve(store, url, prefix, plan_s, folder, _progress))
                except BenchmarkError as exc:
                    report.failed.append(f"serving, {store}: {str(exc).splitlines()[0]}")
                    _progress(f"[red]serving, {store} failed[/red]: {exc}")
        if "memory" in args.parts:
            shop = Shop(args.fresh_products, args.users)
            report.memory = await measure_memory(shop, args.memory_users, args.full_users, redis.url,
                                                 args.stores, _progress)
    other = (f"{other_s:.1f} core-s in {wall_s:.1f} s ({100 * other_s / wall_s:.0f} % of one core)"
             if wall_s else "—")
    report.facts = _facts(versions, load_before, other)
    return report


def parse_args(argv: Sequence[str] | None, description: str | None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(description=description,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true",
                        help="a smoke run: shorter, fewer users and queries")
    parser.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated: {', '.join(PARTS)}")
    parser.add_argument("--stores", default=",".join(STORES), help="the recommender's state: memory, redis")
    parser.add_argument("--rate", type=float, default=1000.0, help="interactions per second written")
    parser.add_argument("--gc", default="default,freeze",
                        help="freshness runs with Python's collector as it is (default), and/or with "
                             "gc.freeze() once the snapshot is loaded (freeze); default: both")
    parser.add_argument("--duration-s", type=float,
                        help=f"freshness run length (default {FULL['duration_s']:.0f})")
    parser.add_argument("--probe-rate", type=float, default=10.0, help="freshness probes per second")
    parser.add_argument("--probe-users", type=int, default=100, help="probe users who buy")
    parser.add_argument("--poll-s", type=float, default=0.05,
                        help="the prober's first wait before it asks recommend() unprompted")
    parser.add_argument("--fresh-products", type=int,
                        help="catalogue of the freshness runs (default 10,000)")
    parser.add_argument("--fresh-history", type=int,
                        help="interactions in the database before the change flow (default 50,000)")
    parser.add_argument("--products", type=int, default=50_000, help="catalogue of the serving runs")
    parser.add_argument("--users", type=int, default=20_000, help="the shop's users")
    parser.add_argument("--history", type=int, help="interactions recorded before serving (default 100,000)")
    parser.add_argument("--queries", type=int, help="serving queries of each kind (default 1,000)")
    parser.add_argument("--memory-users", type=int, help="typical users measured (default 50,000)")
    parser.add_argument("--full-users", type=int,
                        help="users with a full recent list measured (default 10,000)")
    parser.add_argument("--logs", type=Path, metavar="DIR", help="keep the processes' logs here")
    parser.add_argument("--json", type=Path, help="also write the figures to this JSON file")
    parser.add_argument("--markdown", type=Path, help="also write the tables as markdown to this file")
    args = parser.parse_args(argv)
    args.parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    args.stores = [s.strip() for s in args.stores.split(",") if s.strip()]
    gc_modes = [g.strip() for g in args.gc.split(",") if g.strip()]
    for given, known, what in ((args.parts, PARTS, "part"), (args.stores, STORES, "store"),
                               (gc_modes, GC_MODES, "gc mode")):
        for name in given:
            if name not in known:
                parser.error(f"unknown {what} {name!r}: {', '.join(known)}")
    args.gc = [mode == "freeze" for mode in gc_modes]
    defaults = QUICK if args.quick else FULL
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    return args


def main(argv: Sequence[str] | None = None, description: str | None = None) -> int:
    """Run the benchmark; 0 when every part asked for was measured."""
    args = parse_args(argv, description)
    folder = args.logs or Path(tempfile.mkdtemp(prefix="tidegate-bench-recs-"))
    folder.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    try:
        # The collector as a tidegate process sets it (`tidegate up`, `tidegate sync`).
        with server_gc():
            report = asyncio.run(run(args, folder))
    except BenchmarkError as exc:
        console.print(f"[red]benchmark failed:[/red] {exc}\nlogs: {folder}")
        return 1
    report.facts["run time"] = f"{time.monotonic() - started:.0f} s"
    print_report(report, console)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(dataclasses.asdict(report), indent=2, default=str))
    if args.markdown is not None:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text(markdown(report))
    if report.failed:
        console.print(f"logs: {folder}")
        return 1
    if args.logs is None:
        shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
