"""The change-flow benchmark's command line and run: start the servers once, measure each system
in turn (`bench/sync_run.py`), print the report. `bench/sync.py` is the entry point (see its
docstring)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from importlib import metadata
from pathlib import Path

from rich.console import Console

from bench.common import BenchmarkError
from bench.report import load_average, machine_facts
from bench.servers import RedisServer, private_redis
from bench.sync_report import NotRun, Report, as_json, markdown, print_report, system_name
from bench.sync_run import Plan, SystemSpec, Urls, measure
from bench.sync_servers import (
    kafka_broker,
    postgres,
    postgres_version,
    postmaster_pid,
    tansu_version,
)

DEFAULT_SYSTEMS = "memory,redis,kafka"
FULL = {"duration_s": 60.0, "backlog": 100_000}
QUICK = {"duration_s": 10.0, "backlog": 30_000}
LIBRARIES = ("psycopg2-binary", "redis", "hiredis", "aiokafka", "orjson", "prometheus-client")
console = Console(width=240)  # wide enough for the tables when piped to a file
progress_console = Console(stderr=True, width=160)


def _progress(message: str) -> None:
    progress_console.print(f"[dim]{time.strftime('%H:%M:%S')}[/dim] {message}")


def _facts(server_versions: dict[str, str], load_before: str, other: str) -> dict[str, str]:
    """The queue benchmark's machine facts, with this benchmark's servers and libraries."""
    common = machine_facts("", load_before, other)
    versions = []
    for package in LIBRARIES:
        try:
            versions.append(f"{package} {metadata.version(package)}")
        except metadata.PackageNotFoundError:
            versions.append(f"{package} (not installed)")
    return {
        **{key.replace("during the run", "during the measured phases"): value
           for key, value in common.items() if key not in ("redis-server", "libraries")},
        **server_versions,
        "libraries": ", ".join(versions),
    }


@contextlib.contextmanager
def _maybe(needed: bool, manager: contextlib.AbstractContextManager[object]) -> Iterator[object | None]:
    if not needed:
        yield None
        return
    with manager as value:
        yield value


async def run(specs: Sequence[SystemSpec], plan: Plan, folder: Path, kafka_options: str = "") -> Report:
    """Start the servers, measure every system, return the report."""
    report = Report(plan={"rate_per_s": plan.rate_per_s, "duration_s": plan.duration_s,
                          "backlog": plan.backlog, "systems": [s.key for s in specs],
                          "kafka_options": kafka_options})
    load_before = load_average()
    needs_redis = any("redis" in (s.bus, s.cache) for s in specs)
    needs_kafka = any(s.bus == "kafka" for s in specs)
    versions: dict[str, str] = {}
    with postgres() as server, _maybe(needs_redis, private_redis()) as redis_server, \
            contextlib.ExitStack() as stack:
        versions["PostgreSQL"] = f"{postgres_version(server)} (private cluster: wal_level=logical, fsync off)"
        pids = {"postgres": postmaster_pid(server)}
        redis_url = None
        if isinstance(redis_server, RedisServer):
            versions["redis-server"] = redis_server.version
            pids["redis-server"] = redis_server.pid
            redis_url = redis_server.url
        kafka_url, kafka_reason = None, ""
        if needs_kafka:
            try:
                broker = stack.enter_context(kafka_broker())
                kafka_url = broker.bus_url + (f"&{kafka_options}" if kafka_options else "")
                pids["tansu"] = broker.proc.pid
                versions["Kafka broker"] = f"{tansu_version()} (in memory)"
                versions["Kafka bus settings"] = f"{kafka_url.partition('?')[2]} (the rest: defaults)"
            except BenchmarkError as exc:
                kafka_reason = str(exc)
        urls = Urls(redis=redis_url, kafka=kafka_url, pids=pids)
        other_s = wall_s = 0.0
        for spec in specs:
            if spec.bus == "kafka" and kafka_url is None:
                report.not_run.append(NotRun(spec.key, f"no Kafka broker: {kafka_reason}"))
                continue
            _progress(f"[bold]{spec.key}[/bold]: bus {spec.bus}, cache {spec.cache}")
            try:
                result = await measure(spec, plan, server, urls, folder, _progress)
            except BenchmarkError as exc:
                _progress(f"[red]{spec.key} failed[/red]: {exc}")
                report.not_run.append(NotRun(spec.key, str(exc).splitlines()[0]))
                continue
            report.results.append(result)
            _progress(f"{system_name(result)}: p99 {result.steady.get('p99_ms') or 0:.1f} ms, "
                      f"drain {result.drain_rate or 0:,.0f} changes/s, "
                      f"pg_recvlogical {result.raw_rate or 0:,.0f}/s")
            for cpu, seconds in ((result.steady_cpu, result.steady_writer.seconds if result.steady_writer
                                  else 0.0), (result.drain_cpu, result.drain_seconds or 0.0)):
                other_s += cpu.get("other", 0.0)
                wall_s += seconds
    other = (f"{other_s:.1f} core-s in {wall_s:.1f} s ({100 * other_s / wall_s:.0f} % of one core)"
             if wall_s else "—")
    report.facts = _facts(versions, load_before, other)
    return report


def parse_args(argv: Sequence[str] | None, description: str | None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(description=description,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true",
                        help=f"phase 1 for {QUICK['duration_s']:.0f} s, a backlog of {QUICK['backlog']:,}")
    parser.add_argument("--systems", default=DEFAULT_SYSTEMS,
                        help="comma-separated bus[:cache]: memory, redis, kafka; cache memory or redis "
                             f"(default {DEFAULT_SYSTEMS}: memory:memory, redis:redis, kafka:redis)")
    parser.add_argument("--rate", type=float, default=2000.0, help="phase 1 changes per second")
    parser.add_argument("--duration-s", type=float, help=f"phase 1 length (default {FULL['duration_s']:.0f})")
    parser.add_argument("--backlog", type=int, help=f"phase 2 changes (default {FULL['backlog']:,})")
    parser.add_argument("--kafka-options", default="", metavar="QUERY",
                        help="Kafka bus settings as a URL query, e.g. fetch_max_wait_ms=500&partitions=1")
    parser.add_argument("--drain-timeout-s", type=float, default=90.0,
                        help="how long phase 2 waits for the drain before reporting it unfinished")
    parser.add_argument("--profile", type=Path, metavar="DIR",
                        help="run each pipeline process under cProfile, stats in DIR (slows it down)")
    parser.add_argument("--plain-loop", action="store_true",
                        help="run the pipeline on asyncio's own loop with Python's default garbage "
                             "collector (not as `tidegate sync` runs: uvloop, tidegate's collector settings)")
    parser.add_argument("--logs", type=Path, metavar="DIR", help="keep the processes' logs here")
    parser.add_argument("--json", type=Path, help="also write the figures to this JSON file")
    parser.add_argument("--markdown", type=Path, help="also write the report as markdown to this file")
    args = parser.parse_args(argv)
    try:
        args.specs = [SystemSpec.parse(key.strip()) for key in args.systems.split(",") if key.strip()]
    except ValueError as exc:
        parser.error(str(exc))
    defaults = QUICK if args.quick else FULL
    args.duration_s = args.duration_s or defaults["duration_s"]
    args.backlog = args.backlog or int(defaults["backlog"])
    return args


def main(argv: Sequence[str] | None = None, description: str | None = None) -> int:
    """Run the benchmark; 0 when every system was measured."""
    args = parse_args(argv, description)
    plan = Plan(rate_per_s=args.rate, duration_s=args.duration_s, backlog=args.backlog,
                drain_timeout_s=args.drain_timeout_s, profile_dir=args.profile,
                plain_loop=args.plain_loop)
    if args.profile is not None:
        args.profile.mkdir(parents=True, exist_ok=True)
    folder = args.logs or Path(tempfile.mkdtemp(prefix="tidegate-bench-sync-"))
    folder.mkdir(parents=True, exist_ok=True)
    try:
        report = asyncio.run(run(args.specs, plan, folder, args.kafka_options))
    except BenchmarkError as exc:
        console.print(f"[red]benchmark failed:[/red] {exc}\nlogs: {folder}")
        return 1
    print_report(report, console)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(as_json(report), indent=2, default=str))
    if args.markdown is not None:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text(markdown(report))
    if report.not_run:
        console.print(f"logs: {folder}")
        return 1
    if args.logs is None:
        shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
