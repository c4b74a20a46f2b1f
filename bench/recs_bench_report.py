"""The recommendations benchmark's tables (rich for the console, markdown for BENCHMARKS.md) and
its verdicts on the issue's targets."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console
from rich.table import Table

from bench.recs_bench_fresh import FreshResult
from bench.recs_bench_memory import MemoryRow
from bench.recs_bench_serve import ServeResult

TARGET_FRESH_P99_MS = 100.0
TARGET_SERVE_P99_MS = 20.0


@dataclass(slots=True)
class Report:
    """Everything one run measured."""

    plan: dict[str, Any] = field(default_factory=dict)
    facts: dict[str, str] = field(default_factory=dict)
    fresh: list[FreshResult] = field(default_factory=list)
    serve: list[ServeResult] = field(default_factory=list)
    memory: list[MemoryRow] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)  # parts that could not be measured, and why


def _ms(value: float | None) -> str:
    if value is None:
        return "—"
    return f"{value:,.1f}" if value >= 10 else f"{value:.2f}"


def _mark(value: float | None, target: float) -> str:
    if value is None:
        return "—"
    return "met" if value < target else "missed"


def _state(result: FreshResult) -> str:
    return f"{result.store}, gc.freeze()" if result.gc_frozen else result.store


def fresh_rows(results: Sequence[FreshResult]) -> tuple[list[str], list[list[str]]]:
    """Freshness: the sink side and the prober's, per store."""
    head = ["state", "interactions", "written/s", "commit → updated p50", "p99", "max", "probes",
            "commit → recommend() shows it p50", "p99", "max", f"p99 < {TARGET_FRESH_P99_MS:.0f} ms",
            "CPU µs/interaction", "prober's recommend() time"]
    rows = []
    for r in results:
        sink, probe = r.sink_quantiles(), r.probe_quantiles()
        writer = r.writer
        rows.append([_state(r), f"{sink['count']:,}", f"{writer.rate:,.0f}" if writer else "—",
                     _ms(sink["p50_ms"]), _ms(sink["p99_ms"]), _ms(sink["max_ms"]), f"{probe['count']:,}",
                     _ms(probe["p50_ms"]), _ms(probe["p99_ms"]), _ms(probe["max_ms"]),
                     _mark(probe["p99_ms"], TARGET_FRESH_P99_MS),
                     f"{r.cpu_per_interaction_us:,.0f}" if r.cpu_per_interaction_us else "—",
                     f"{100 * r.probe_share:.0f} %" if r.probe_share is not None else "—"])
    return head, rows


def probe_rows(results: Sequence[FreshResult]) -> tuple[list[str], list[list[str]]]:
    """Freshness by probe kind, the recommend() calls under the write load, and the checks."""
    head = ["state", "probe", "n", "shows it p50", "p99", "max", "sink side p50", "p99", "recommend() p50",
            "p99", "shown before the sink returned", "timed out", "full GCs", "longest GC ms"]
    rows = []
    for r in results:
        calls = _quantiles_ms(r.probes.calls_s)
        for kind in ("purchase", "new user"):
            samples = [s for s in r.probes.samples if s.kind == kind]
            shown, applied = r.probe_quantiles(kind), _quantiles_ms([s.applied_s for s in samples])
            rows.append([_state(r), kind, f"{len(samples):,}", _ms(shown["p50_ms"]), _ms(shown["p99_ms"]),
                         _ms(shown["max_ms"]), _ms(applied[0]), _ms(applied[1]), _ms(calls[0]), _ms(calls[1]),
                         str(r.probes.before_sink.get(kind, 0)), str(r.probes.timeouts.get(kind, 0)),
                         f"{r.gc.get('count', 0):.0f}",
                         _ms(r.gc.get("max_ms"))])
    return head, rows


def _quantiles_ms(samples_s: Sequence[float]) -> tuple[float | None, float | None]:
    from bench.common import percentile

    if not samples_s:
        return None, None
    return percentile(samples_s, 0.5), percentile(samples_s, 0.99)


def serve_rows(results: Sequence[ServeResult]) -> tuple[list[str], list[list[str]]]:
    """Serving latency, in process and over HTTP, per store and kind of user."""
    head = ["state", "path", "users", "queries", "p50 ms", "p99 ms", "max ms", "req/s (one at a time)",
            f"p99 < {TARGET_SERVE_P99_MS:.0f} ms"]
    rows = []
    for r in results:
        for path, figures in (("in process", r.inprocess), ("HTTP gateway", r.http)):
            for kind, label in (("personal", "with a history"), ("cold", "cold start")):
                f = figures.get(kind)
                if not f:
                    continue
                rate = r.http_rate.get(kind) if path == "HTTP gateway" else 1000.0 / f["mean_ms"]
                rows.append([r.store, path, label, f"{int(f['count']):,}", _ms(f["p50_ms"]), _ms(f["p99_ms"]),
                             _ms(f["max_ms"]), f"{rate:,.0f}" if rate else "—",
                             _mark(f["p99_ms"], TARGET_SERVE_P99_MS)])
    return head, rows


def cpu_rows(results: Sequence[FreshResult]) -> tuple[list[str], list[list[str]]]:
    """Where the CPU went while writing and catching up: µs per interaction per process, and
    redis-server's costliest commands (server time per interaction, and per call)."""
    head = ["state", "window s", "process", "writer", "postgres", "redis-server", "other",
            "redis-server's costliest commands: µs/interaction (µs/call)"]
    rows = []
    for r in results:
        used = r.cpu_by_process_us()
        if not used:
            continue
        count = len(r.sink_s)
        commands = ", ".join(f"{name} {usec / count:.1f} ({usec / calls:,.0f})"
                             for name, (calls, usec) in list(r.commands.items())[:6])
        processes = ("process", "writer", "postgres", "redis-server", "other")
        rows.append([_state(r), f"{r.window_s:.1f}", *(f"{used[name]:,.0f}" for name in processes),
                     commands or "—"])
    return head, rows


def memory_rows(rows_in: Sequence[MemoryRow]) -> tuple[list[str], list[list[str]]]:
    """Per-user state, measured and extrapolated."""
    head = ["state", "users", "measured", "interactions", "recent items/user", "purchases/user", "bytes/user",
            "per 1M users"]
    rows = [[r.store, r.population, f"{r.users:,}", f"{r.events:,}", f"{r.recent_per_user:.1f}",
             f"{r.purchases_per_user:.1f}", f"{r.bytes_per_user:,.0f}", f"{r.gb_per_million:.2f} GB"]
            for r in rows_in]
    return head, rows


def verdicts(report: Report) -> list[str]:
    """One line per target and store."""
    lines = []
    for r in report.fresh:
        p99 = r.probe_quantiles()["p99_ms"]
        lines.append(f"freshness ({_state(r)}): commit → recommend() shows it p99 {_ms(p99)} ms at "
                     f"{r.writer.rate if r.writer else 0:,.0f} interactions/s: "
                     f"{_mark(p99, TARGET_FRESH_P99_MS)} (target < {TARGET_FRESH_P99_MS:.0f} ms)")
    for s in report.serve:
        for path, figures in (("in process", s.inprocess), ("HTTP", s.http)):
            p99 = figures.get("personal", {}).get("p99_ms")
            lines.append(f"serving ({s.store}, {path}): n=10 over {s.items:,} items, p99 {_ms(p99)} ms: "
                         f"{_mark(p99, TARGET_SERVE_P99_MS)} (target < {TARGET_SERVE_P99_MS:.0f} ms)")
    return lines


TABLES = (("Freshness at the write rate", "fresh", fresh_rows), ("Freshness by probe", "fresh", probe_rows),
          ("CPU per interaction, µs (writing and catching up)", "fresh", cpu_rows),
          ("Serving, n=10", "serve", serve_rows), ("Per-user state", "memory", memory_rows))


def print_report(report: Report, console: Console) -> None:
    """The tables, the facts and the verdicts on the console."""
    for title, part, rows_of in TABLES:
        results = getattr(report, part)
        if not results:
            continue
        head, rows = rows_of(results)
        table = Table(title=title, title_justify="left")
        for name in head:
            table.add_column(name, justify="left" if name in ("state", "path", "users", "probe", "measured")
                             else "right")
        for row in rows:
            table.add_row(*row)
        console.print(table)
    for fact, value in report.facts.items():
        console.print(f"[dim]{fact}:[/dim] {value}")
    for line in verdicts(report):
        console.print(f"[bold]{line}[/bold]")
    for line in report.failed:
        console.print(f"[red]not measured:[/red] {line}")


def markdown(report: Report) -> str:
    """The tables as markdown, for BENCHMARKS.md."""
    parts = []
    for title, part, rows_of in TABLES:
        results = getattr(report, part)
        if not results:
            continue
        head, rows = rows_of(results)
        left = ("state", "path", "users", "probe", "measured")
        lines = [f"**{title}**", "", "| " + " | ".join(head) + " |",
                 "|" + "|".join("---" if name in left else "---:" for name in head) + "|"]
        lines += ["| " + " | ".join(row) + " |" for row in rows]
        parts.append("\n".join(lines))
    parts.append("\n".join(f"- {fact}: {value}" for fact, value in report.facts.items()))
    parts.append("\n".join(f"- {line}" for line in verdicts(report)))
    return "\n\n".join(parts) + "\n"
