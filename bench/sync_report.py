"""The change-flow benchmark's report: the same tables on the console (rich) and as markdown for
BENCHMARKS.md, the verdicts on the issue's targets, and the figures as JSON."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console
from rich.table import Table

from bench.sync_run import SystemResult
from bench.sync_writer import WriterResult

# The targets and the anchors it quotes (commit → Kafka, as their vendors measured it).
TARGET_RATE_PER_S = 2_000.0
TARGET_P99_MS = 50.0
TARGET_MEMORY_RATE_PER_S = 20_000.0
ANCHORS = (("Sequin", 55.0, 253.0), ("Debezium", 258.0, 499.0))
SERVER_TREES = ("postgres", "redis-server", "tansu")

BUS_NAMES = {"memory": "memory://", "redis": "Redis Streams", "kafka": "Kafka (Tansu)"}
CACHE_NAMES = {"memory": "memory://", "redis": "Redis"}


@dataclass(frozen=True, slots=True)
class NotRun:
    """A system that was asked for but could not be measured, and why."""

    key: str
    reason: str


@dataclass(slots=True)
class Report:
    """Everything one run produced."""

    results: list[SystemResult] = field(default_factory=list)
    not_run: list[NotRun] = field(default_factory=list)
    facts: dict[str, str] = field(default_factory=dict)
    plan: dict[str, Any] = field(default_factory=dict)


def system_name(result: SystemResult) -> str:
    """`Redis Streams → Redis cache`."""
    return f"{BUS_NAMES[result.spec.bus]} → {CACHE_NAMES[result.spec.cache]} cache"


def _num(value: float | None, digits: int = 0) -> str:
    return "—" if value is None else f"{value:,.{digits}f}"


def _ms(value: float | None) -> str:
    if value is None:
        return "—"
    return f"{value:,.1f}" if value < 100 else f"{value:,.0f}"


def _cores(cpu: dict[str, float], name: str, seconds: float | None) -> str:
    return f"{100 * cpu.get(name, 0.0) / seconds:.0f} %" if seconds else "—"


def _us_per_change(cpu: dict[str, float], names: Sequence[str], changes: int) -> str:
    used = sum(cpu.get(name, 0.0) for name in names)
    return f"{used / changes * 1e6:,.0f}" if changes and used else "—"


FRESHNESS_HEADERS = (
    "bus → cache", "written", "writer /s", "applied", "p50 ms", "p99 ms", "p99.9 ms", "max ms",
    "mean ms", "to bus p50 / p99 ms", "caught up after", "pipeline CPU", "WAL sender CPU",
    "sleeper late p99 / max",
)


def freshness_rows(results: Sequence[SystemResult]) -> list[tuple[str, ...]]:
    """Phase 1: commit → cache at the fixed rate."""
    rows: list[tuple[str, ...]] = []
    for result in results:
        writer, steady = result.steady_writer, result.steady
        if writer is None:
            continue
        seconds = writer.seconds
        rows.append((
            system_name(result), f"{writer.changes:,}", _num(writer.rate), f"{steady.get('count', 0):,}",
            _ms(steady.get("p50_ms")), _ms(steady.get("p99_ms")), _ms(steady.get("p999_ms")),
            _ms(steady.get("max_ms")), _ms(steady.get("mean_ms")),
            f"{_ms(steady.get('bus_p50_ms'))} / {_ms(steady.get('bus_p99_ms'))}",
            "never" if result.caught_up_s is None else f"{result.caught_up_s * 1000:,.0f} ms",
            _cores(result.steady_cpu, "pipeline", seconds), _cores(result.steady_cpu, "walsender", seconds),
            f"{_ms(result.steady_stall.get('p99_ms'))} / {_ms(result.steady_stall.get('max_ms'))} ms",
        ))
    return rows


THROUGHPUT_HEADERS = (
    "bus → cache", "backlog", "written at /s", "drained at /s", "best 1 s", "pg_recvlogical /s",
    "drain vs raw", "pipeline µs/change", "servers µs/change", "cache = database",
)


def throughput_rows(results: Sequence[SystemResult]) -> list[tuple[str, ...]]:
    """Phase 2: the drain of a backlog, next to pg_recvlogical on the same backlog."""
    rows: list[tuple[str, ...]] = []
    for result in results:
        writer = result.backlog_writer
        if writer is None:
            continue
        drain, raw = result.drain_rate, result.raw_rate
        finished = result.drain_seconds is not None
        rows.append((
            system_name(result), f"{result.drained:,}", _num(writer.rate),
            _num(drain) if finished else f"≤ {_num(drain)} (unfinished)",
            _num(result.drain.get("peak_per_s")),
            _num(raw), f"{drain / raw:.2f}x" if drain and raw else "—",
            _us_per_change(result.drain_cpu, ("pipeline",), result.drained),
            _us_per_change(result.drain_cpu, SERVER_TREES, result.drained), _check(result.verified),
        ))
    return rows


def _check(verified: dict[str, Any]) -> str:
    if not verified:
        return "—"
    if verified.get("differ") == 0 and verified.get("extra") == 0:
        return "yes"
    return f"NO: {verified.get('differ')} differ, {verified.get('extra')} extra"


def verdicts(results: Sequence[SystemResult], rate_per_s: float) -> list[str]:
    """The issue's targets, one line each."""
    lines = []
    at_target = rate_per_s >= TARGET_RATE_PER_S
    for result in results:
        p99 = result.steady.get("p99_ms")
        if p99 is None:
            continue
        met = p99 < TARGET_P99_MS and result.caught_up_s is not None
        qualifier = "" if at_target else f" (measured at {rate_per_s:,.0f}/s, below the target's rate)"
        lines.append(f"p99 commit → cache < {TARGET_P99_MS:.0f} ms at {TARGET_RATE_PER_S:,.0f} changes/s, "
                     f"{system_name(result)}: {'MET' if met and at_target else 'NOT MET'} — "
                     f"{_ms(p99)} ms (p50 {_ms(result.steady.get('p50_ms'))} ms){qualifier}")
    for result in results:
        if result.spec.bus != "memory" or result.drain_rate is None:
            continue
        rate = result.drain_rate if result.drain_seconds is not None else None
        met = rate is not None and rate >= TARGET_MEMORY_RATE_PER_S
        lines.append(f"sustained ≥ {TARGET_MEMORY_RATE_PER_S:,.0f} changes/s through the memory bus, "
                     f"{system_name(result)}: {'MET' if met else 'NOT MET'} — {_num(result.drain_rate)} "
                     f"changes/s (pg_recvlogical on the same backlog: {_num(result.raw_rate)}/s)")
    kafka = [r for r in results if r.spec.bus == "kafka" and r.steady.get("p99_ms") is not None]
    anchors = "; ".join(f"{name} {avg:.0f} ms avg / {p99:.0f} ms p99" for name, avg, p99 in ANCHORS)
    if kafka:
        ours = kafka[0].steady
        lines.append(f"anchors (commit → Kafka): {anchors}; here commit → Kafka (publish acknowledged) "
                     f"{_ms(ours.get('bus_mean_ms'))} ms avg / {_ms(ours.get('bus_p99_ms'))} ms p99, "
                     f"commit → Kafka → cache {_ms(ours.get('mean_ms'))} ms avg / "
                     f"{_ms(ours.get('p99_ms'))} ms p99")
    else:
        lines.append(f"anchors (commit → Kafka): {anchors}; the Kafka bus was not measured")
    return lines


def cpu_lines(results: Sequence[SystemResult]) -> list[str]:
    """Where the CPU went in each phase, per process, as a share of one core."""
    lines = []
    for result in results:
        parts = []
        for phase, cpu, seconds in (
            ("phase 1", result.steady_cpu, result.steady_writer.seconds if result.steady_writer else None),
            ("drain", result.drain_cpu, result.drain_seconds),
            ("pg_recvlogical", result.raw_cpu, result.raw_seconds),
        ):
            if not cpu or not seconds:
                continue
            shown = {("pg_recvlogical" if phase == "pg_recvlogical" and name == "bench" else name): used
                     for name, used in cpu.items() if used >= 0.005 and not (phase != "pg_recvlogical"
                                                                            and name == "bench")}
            parts.append(f"{phase}: " + ", ".join(f"{name} {100 * used / seconds:.0f} %"
                                                  for name, used in shown.items()))
        if parts:
            lines.append(f"{system_name(result)} — " + "; ".join(parts))
    return lines


def bus_lines(results: Sequence[SystemResult]) -> list[str]:
    """How the consumer's bus calls went in phase 1: fetch calls that returned changes, and acks."""
    lines = []
    for result in results:
        steady = result.steady
        if not steady.get("fetches"):
            continue
        fetch = f"p50 {_ms(steady.get('fetch_p50_ms'))} / p99 {_ms(steady.get('fetch_p99_ms'))} ms"
        ack = f"p50 {_ms(steady.get('ack_p50_ms'))} / p99 {_ms(steady.get('ack_p99_ms'))} ms"
        lines.append(f"{system_name(result)} — phase 1 bus calls: {steady.get('publishes', 0):,} publishes; "
                     f"{steady['fetches']:,} fetches with changes "
                     f"({_num(steady.get('per_fetch'))} per fetch) took {fetch}, "
                     f"{steady.get('empty_fetches', 0):,} came back empty; acks {ack}")
    return lines


def gc_lines(results: Sequence[SystemResult]) -> list[str]:
    """The pipeline's cyclic garbage collector in each phase: its collections and their time per
    generation, and how many objects it followed at the phase's end."""
    lines = []
    for result in results:
        parts = [f"{phase}: {'/'.join(f'{n:,}' for n in window['gc_runs'])} collections of gen 0/1/2 "
                 f"in {'/'.join(f'{seconds:.2f}' for seconds in window['gc_s'])} s, "
                 f"{window['gc_tracked']:,} objects tracked at the end"
                 for phase, window in (("phase 1", result.steady), ("drain", result.drain))
                 if window and "gc_s" in window]
        if parts:
            lines.append(f"{system_name(result)} — the pipeline's garbage collections, " + "; ".join(parts))
    return lines


def writer_line(results: Sequence[SystemResult]) -> str:
    """How closely the writer kept its schedule in phase 1."""
    parts = []
    for result in results:
        writer: WriterResult | None = result.steady_writer
        if writer is not None and writer.late_p99_ms is not None:
            parts.append(f"{result.spec.key}: {writer.transactions:,} transactions, started late p99 "
                         f"{_ms(writer.late_p99_ms)} ms / max {_ms(writer.late_max_ms)} ms")
    return "writer schedule (open loop) — " + "; ".join(parts) if parts else ""


def _table(title: str, headers: Sequence[str], rows: Sequence[Sequence[str]]) -> Table:
    table = Table(title=title, title_justify="left")
    for index, header in enumerate(headers):
        table.add_column(header, justify="left" if index == 0 else "right")
    for row in rows:
        table.add_row(*row)
    return table


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A GitHub markdown table, numbers right-aligned."""
    lines = ["| " + " | ".join(headers) + " |",
             "|" + "|".join("---" if i == 0 else "---:" for i in range(len(headers))) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def print_report(report: Report, console: Console) -> None:
    """The tables, verdicts and notes on the console."""
    facts = Table(show_header=False, title="machine and versions", title_justify="left")
    for key, value in report.facts.items():
        facts.add_row(key, value)
    console.print(facts)
    rate = report.plan.get("rate_per_s", TARGET_RATE_PER_S)
    console.print(_table(f"Freshness: commit → cache at {rate:,.0f} changes/s for "
                         f"{report.plan.get('duration_s', 0):.0f} s", FRESHNESS_HEADERS,
                         freshness_rows(report.results)))
    console.print(_table("Throughput: draining a backlog, next to pg_recvlogical on the same backlog",
                         THROUGHPUT_HEADERS, throughput_rows(report.results)))
    for line in (writer_line(report.results), *cpu_lines(report.results), *bus_lines(report.results),
                 *gc_lines(report.results)):
        if line:
            console.print(f"- {line}")
    for item in report.not_run:
        console.print(f"- [red]{item.key} not run[/red]: {item.reason}")
    console.print("[bold]Verdicts[/bold]")
    for line in verdicts(report.results, rate):
        console.print(f"- {line}")


def markdown(report: Report) -> str:
    """The same report as markdown, for BENCHMARKS.md."""
    rate = report.plan.get("rate_per_s", TARGET_RATE_PER_S)
    seconds = report.plan.get("duration_s", 0)
    parts = ["| | |", "|---|---|", *(f"| {key} | {value} |" for key, value in report.facts.items()), "",
             f"**Freshness: commit → cache at {rate:,.0f} changes/s for {seconds:.0f} s**",
             "", markdown_table(FRESHNESS_HEADERS, freshness_rows(report.results)), "",
             "**Throughput: draining a backlog, next to pg_recvlogical on the same backlog**", "",
             markdown_table(THROUGHPUT_HEADERS, throughput_rows(report.results)), ""]
    parts += [f"- {line}" for line in (writer_line(report.results), *cpu_lines(report.results),
                                       *bus_lines(report.results), *gc_lines(report.results)) if line]
    parts += [f"- {item.key} not run: {item.reason}" for item in report.not_run]
    parts += ["", "Verdicts:", "", *(f"- {line}" for line in verdicts(report.results, rate))]
    return "\n".join(parts) + "\n"


def as_json(report: Report) -> dict[str, Any]:
    """The figures, for --json."""
    return {
        "facts": report.facts, "plan": report.plan,
        "not_run": [dataclasses.asdict(item) for item in report.not_run],
        "results": [{**dataclasses.asdict(result), "key": result.spec.key, "drain_rate": result.drain_rate,
                     "raw_rate": result.raw_rate, "profile": str(result.profile) if result.profile else None}
                    for result in report.results],
    }
