"""Turn results into the console table, the markdown table for BENCHMARKS.md, and the verdict
on the targets the queue issue set."""

from __future__ import annotations

import os
import platform
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from rich.console import Console
from rich.table import Table

from bench.common import BATCHED, BATCHED_EACH, ROUND_TRIP, SINGLE, Result
from bench.raw import SYSTEM as RAW

REPO_ROOT = Path(__file__).resolve().parent.parent
TIDEGATE = ("tidegate-sqlite", "tidegate-redis")
PEERS = ("saq", "arq", "rq")
SYSTEM_ORDER = (*TIDEGATE, *PEERS, RAW)
PATH_ORDER = (SINGLE, BATCHED, BATCHED_EACH, ROUND_TRIP)
HEADERS = (
    "system", "path", "jobs", "jobs/s", "rounds' range", "vs fastest peer", "vs raw Redis",
    "p50 ms", "p99 ms",
)

# The targets for the Redis backend.
TARGET_BATCHED_RATE = 20_000.0
TARGET_PEER_FACTOR = 3.0
TARGET_SINGLE_P50_MS = 1.0


@dataclass(frozen=True, slots=True)
class Skipped:
    """A system that was asked for but could not run (e.g. a backend not written yet)."""

    system: str
    reason: str


def machine_facts(redis_version: str, load_before: str, other_cpu: str) -> dict[str, str]:
    """What the figures depend on: cores, CPU, load, Python, Redis and library versions."""
    cpu = "unknown"
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    versions = []
    for package in ("redis", "hiredis", "saq", "arq", "rq"):
        try:
            versions.append(f"{package} {metadata.version(package)}")
        except metadata.PackageNotFoundError:
            versions.append(f"{package} (not installed)")
    return {
        "tidegate": source_revision(),
        "cores (nproc)": str(len(os.sched_getaffinity(0))),
        "CPU": cpu,
        # Other work on the machine shows up in every figure; the 1-minute load before the run
        # says how much there was (during it, the benchmark's own processes count too).
        "load average (1 min) before the run": load_before,
        "CPU used by other processes during the run": other_cpu,
        "Python": platform.python_version(),
        "redis-server": redis_version,
        "libraries": ", ".join(versions),
    }


def source_revision() -> str:
    """The commit measured, and whether src/ had uncommitted changes (figures move with them).
    It is the tree the `tidegate` package is imported from, which is not this benchmark's when
    PYTHONPATH points at another checkout (a paired run against other code)."""
    import tidegate

    tree = Path(tidegate.__file__).resolve().parent.parent.parent

    def git(*args: str) -> str:
        done = subprocess.run(
            ["git", *args], cwd=tree, capture_output=True, text=True, check=False
        )
        return done.stdout.strip()

    commit = git("rev-parse", "--short", "HEAD") or "unknown commit"
    dirty = git("status", "--porcelain", "--", "src")
    return f"{commit}{' + uncommitted changes in src/' if dirty else ''}"


def load_average() -> str:
    """The 1-minute load average, as text."""
    return f"{os.getloadavg()[0]:.2f}"


def ordered(results: Sequence[Result]) -> list[Result]:
    """Rows grouped by path, tidegate first, then peers, then the raw limit."""
    return sorted(results, key=lambda r: (PATH_ORDER.index(r.path), SYSTEM_ORDER.index(r.system)))


def _reference_path(path: str) -> str:
    # Peers settle each job on its own anyway: their batched path is the reference for both.
    return BATCHED if path == BATCHED_EACH else path


def fastest_peer(results: Sequence[Result], path: str) -> Result | None:
    """The peer with the highest rate on this path, if any peer ran."""
    path = _reference_path(path)
    peers = [r for r in results if r.system in PEERS and r.path == path]
    return max(peers, key=lambda r: r.rate, default=None)


def raw_limit(results: Sequence[Result], path: str) -> Result | None:
    """The raw Redis row for this path, if it ran."""
    path = _reference_path(path)
    return next((r for r in results if r.system == RAW and r.path == path), None)


def cells(result: Result, results: Sequence[Result]) -> tuple[str, ...]:
    """One row's text cells, in HEADERS order."""
    peer = fastest_peer(results, result.path)
    raw = raw_limit(results, result.path)
    vs_peer = "—"
    if peer is not None and result.system not in (RAW,) and result.path != ROUND_TRIP:
        vs_peer = f"{result.rate / peer.rate:.2f}x"
    vs_raw = "—"
    # SQLite does not go through Redis: a ratio to Redis round trips would mean nothing.
    if raw is not None and result.system not in (RAW, "tidegate-sqlite"):
        vs_raw = f"{result.rate / raw.rate:.2f}x"
    unit = "round trips" if result.path == ROUND_TRIP else "jobs"
    return (
        result.system,
        result.path,
        f"{result.jobs:,} {unit}" if unit != "jobs" else f"{result.jobs:,}",
        f"{result.rate:,.0f}",
        "—" if result.spread is None else f"{result.spread[0]:,.0f} to {result.spread[1]:,.0f}",
        vs_peer,
        vs_raw,
        "—" if result.p50_ms is None else f"{result.p50_ms:.3f}",
        "—" if result.p99_ms is None else f"{result.p99_ms:.3f}",
    )


def console_table(results: Sequence[Result], skipped: Sequence[Skipped]) -> Table:
    """The rich table printed at the end of a run."""
    table = Table(title="tidegate queue vs peers vs raw Redis (median of repeats)")
    for header in HEADERS:
        table.add_column(header, justify="left" if header in ("system", "path") else "right")
    for result in ordered(results):
        style = "bold" if result.system in TIDEGATE else None
        table.add_row(*cells(result, results), style=style)
    for skip in skipped:
        table.add_row(skip.system, "—", "not run", skip.reason, *[""] * (len(HEADERS) - 4))
    return table


def markdown_table(results: Sequence[Result], skipped: Sequence[Skipped]) -> str:
    """The same table as GitHub markdown, to paste into BENCHMARKS.md."""
    aligns = ["---", "---", *["---:"] * (len(HEADERS) - 2)]
    lines = ["| " + " | ".join(HEADERS) + " |", "|" + "|".join(aligns) + "|"]
    for result in ordered(results):
        row = list(cells(result, results))
        if result.system in TIDEGATE:
            row[0] = f"**{row[0]}**"
        lines.append("| " + " | ".join(row) + " |")
    for skip in skipped:
        lines.append(f"| {skip.system} | — | not run | {skip.reason} |" + " |" * (len(HEADERS) - 4))
    return "\n".join(lines)


def verdicts(results: Sequence[Result]) -> list[str]:
    """The issue's targets for the Redis backend, each met or not, with the figure."""
    by_key = {(r.system, r.path): r for r in results}
    out: list[str] = []
    batched = by_key.get(("tidegate-redis", BATCHED))
    single = by_key.get(("tidegate-redis", SINGLE))
    peer = fastest_peer(results, BATCHED)
    if batched is None:
        out.append(f"Redis batched >= {TARGET_BATCHED_RATE:,.0f} jobs/s: not measured")
    else:
        out.append(_verdict(
            f"Redis batched >= {TARGET_BATCHED_RATE:,.0f} jobs/s",
            batched.rate >= TARGET_BATCHED_RATE, f"{batched.rate:,.0f} jobs/s",
        ))
    if batched is None or peer is None:
        out.append(f"Redis batched >= {TARGET_PEER_FACTOR:.0f}x the fastest peer: not measured")
    else:
        factor = batched.rate / peer.rate
        out.append(_verdict(
            f"Redis batched >= {TARGET_PEER_FACTOR:.0f}x the fastest peer ({peer.system})",
            factor >= TARGET_PEER_FACTOR, f"{factor:.2f}x",
        ))
    if single is None or single.p50_ms is None:
        out.append(f"Redis single enqueue→claim p50 < {TARGET_SINGLE_P50_MS:g} ms: not measured")
    else:
        out.append(_verdict(
            f"Redis single enqueue→claim p50 < {TARGET_SINGLE_P50_MS:g} ms",
            single.p50_ms < TARGET_SINGLE_P50_MS, f"{single.p50_ms:.3f} ms",
        ))
    return out


def _verdict(name: str, met: bool, figure: str) -> str:
    return f"{name}: {'MET' if met else 'NOT MET'} ({figure})"


def print_report(
    console: Console,
    results: Sequence[Result],
    skipped: Sequence[Skipped],
    facts: dict[str, str],
    command: str,
) -> None:
    """Everything a reader needs: table, targets, markdown to paste, machine and command."""
    console.print(console_table(results, skipped))
    for line in verdicts(results):
        console.print(line)
    console.print()
    console.print("[bold]Markdown for BENCHMARKS.md[/bold]")
    console.print(markdown_table(results, skipped), markup=False, highlight=False, soft_wrap=True)
    console.print()
    for name, value in facts.items():
        console.print(f"{name}: {value}", markup=False, highlight=False, soft_wrap=True)
    console.print(f"command: {command}", markup=False, highlight=False, soft_wrap=True)
