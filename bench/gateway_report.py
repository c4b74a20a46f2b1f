"""The gateway benchmark's results, and how they are shown: console tables (the figures, then the
same figures as ratios to calling the simulator directly and to each tidegate layout), the same
tables as markdown for BENCHMARKS.md, and the verdicts on the issue's targets."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from bench.gateway_load import LoadRun

# The hot path's targets (ratios to the same run's direct rate and peers, since this machine's
# absolute speed drifts by 2x between runs).
TARGET_RATE_PER_S = 200.0  # the offered rate the latency targets are judged at
TARGET_ADDED_P50_MS = 1.0
TARGET_ADDED_P99_MS = 5.0
TARGET_CPU_US = {"up": 500.0, "redis": 700.0}  # system CPU per request, closed loop
TARGET_SHARE_OF_DIRECT = 0.30  # sustained rate / direct-to-simulator rate
TARGET_SUSTAINED_PER_S = 2_000.0  # on a quiet run
TARGET_VS_LITELLM = 10.0  # sustained rate / LiteLLM proxy's best
TIDEGATE_KEYS = ("up", "redis")
Rows = list[tuple[list[str], bool]]  # a table's rows: the cells, and whether it is tidegate's (bold)


@dataclass(frozen=True, slots=True)
class SystemInfo:
    """A measured system as the report names it (never its key or URL)."""

    key: str
    name: str
    layout: str

    @property
    def is_tidegate(self) -> bool:
        """tidegate's own rows are set in bold."""
        return self.key in TIDEGATE_KEYS


@dataclass(frozen=True, slots=True)
class RatePair:
    """One offered rate, sent straight to the simulator and then through a system."""

    system: SystemInfo
    rate_per_s: float
    duration_s: float
    direct: LoadRun
    through: LoadRun
    cpu_s: dict[str, float]  # per process tree while `through` ran
    upstream_calls: int  # what the simulator received from the system during `through`
    other_pct: float  # other processes' CPU while `through` ran, % of one core

    @property
    def kept_up(self) -> bool:
        """Every request answered, and the last one within half a second (or 5 % of the run)
        after the schedule ended: the system was not building a backlog."""
        tail_s = self.through.seconds - self.duration_s
        return not self.through.errors and tail_s <= max(0.5, 0.05 * self.duration_s)

    def added_ms(self, fraction: float) -> float | None:
        """Through minus direct at one percentile, in milliseconds."""
        through, direct = self.through.p(fraction), self.direct.p(fraction)
        return None if through is None or direct is None else through - direct

    def system_cpu_us_per_request(self) -> float | None:
        """CPU the system's own processes used per answered request (simulator excluded)."""
        own = sum(seconds for name, seconds in self.cpu_s.items() if name != "simulator")
        return own / self.through.ok * 1e6 if self.through.ok else None


@dataclass(frozen=True, slots=True)
class Sustained:
    """A closed-loop run: `clients` requests always in flight, answers counted over a window."""

    system: SystemInfo
    clients: int
    run: LoadRun
    cpu_s: dict[str, float]
    upstream_calls: int
    other_pct: float  # other processes' CPU over the window, % of one core

    def cores(self, name: str) -> float:
        """Cores a process tree used on average over the window."""
        return self.cpu_s.get(name, 0.0) / self.run.seconds if self.run.seconds else 0.0

    def system_cpu_us_per_request(self) -> float | None:
        """CPU the system's own processes used per answered request (simulator excluded)."""
        own = sum(seconds for name, seconds in self.cpu_s.items() if name != "simulator")
        return own / self.run.ok * 1e6 if self.run.ok else None

    def cpu_text(self) -> str:
        """`4,568 (gateway 2,000, worker 1,900, redis-server 668)` µs per answered request."""
        total = self.system_cpu_us_per_request()
        parts = {name: seconds for name, seconds in self.cpu_s.items() if name != "simulator"}
        if self.system.key == "direct" or total is None:
            return "—"
        if len(parts) < 2:
            return _us(total)
        each = ", ".join(f"{name} {seconds / self.run.ok * 1e6:,.0f}" for name, seconds in parts.items())
        return f"{_us(total)} ({each})"


@dataclass(frozen=True, slots=True)
class NotRun:
    """A measurement that was planned but could not be made, and why."""

    system: SystemInfo
    what: str
    reason: str


@dataclass(slots=True)
class Report:
    """Everything one benchmark run produced."""

    pairs: list[RatePair] = field(default_factory=list)
    sustained: list[Sustained] = field(default_factory=list)
    not_run: list[NotRun] = field(default_factory=list)
    facts: dict[str, str] = field(default_factory=dict)


def _ms(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}"


def _added(value: float | None) -> str:
    return "—" if value is None else f"{value:+.2f}"


def _us(value: float | None) -> str:
    return "—" if value is None else f"{value:,.0f}"


LATENCY_HEADERS = ("system", "offered req/s", "answered req/s", "direct p50 ms", "direct p99 ms",
                   "through p50 ms", "through p99 ms", "added p50 ms", "added p99 ms", "errors",
                   "system CPU µs/req", "others' CPU")
SUSTAINED_HEADERS = ("system", "layout", "clients", "req/s", "p50 ms", "p99 ms", "errors",
                     "system CPU µs/req (by process)", "cores: system / simulator / load generator",
                     "others' CPU")


def latency_cells(pair: RatePair) -> list[str]:
    """One row of the added-latency table."""
    answered = pair.through.rate
    note = "" if pair.kept_up else " (overloaded)"
    return [
        pair.system.name, f"{pair.rate_per_s:,.0f}", f"{answered:,.0f}{note}",
        _ms(pair.direct.p(0.5)), _ms(pair.direct.p(0.99)),
        _ms(pair.through.p(0.5)), _ms(pair.through.p(0.99)),
        _added(pair.added_ms(0.5)), _added(pair.added_ms(0.99)),
        pair.through.error_text(), _us(pair.system_cpu_us_per_request()), f"{pair.other_pct:.0f} %",
    ]


def sustained_cells(row: Sustained) -> list[str]:
    """One row of the sustained-rate table."""
    system = sum(row.cores(name) for name in row.cpu_s if name != "simulator")
    generator = row.run.cpu_s / row.run.seconds if row.run.seconds else 0.0
    cores = f"{system:.2f} / {row.cores('simulator'):.2f} / {generator:.2f}"
    if row.system.key == "direct":
        cores = f"— / {row.cores('simulator'):.2f} / {generator:.2f}"
    return [
        row.system.name, row.system.layout, str(row.clients), f"{row.run.rate:,.0f}",
        _ms(row.run.p(0.5)), _ms(row.run.p(0.99)), row.run.error_text(), row.cpu_text(), cores,
        f"{row.other_pct:.0f} %",
    ]


def _table(title: str, headers: Sequence[str], rows: Rows) -> Table:
    table = Table(title=title)
    for header in headers:
        table.add_column(header, justify="left" if header in ("system", "layout") else "right")
    for cells, bold in rows:
        table.add_row(*(escape(cell) for cell in cells), style="bold" if bold else None)
    return table


def _markdown(headers: Sequence[str], rows: Rows) -> str:
    aligns = ["---" if header in ("system", "layout") else "---:" for header in headers]
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join(aligns) + "|"]
    for cells, bold in rows:
        shown = [f"**{cells[0]}**" if bold else cells[0], *cells[1:]]
        lines.append("| " + " | ".join(shown) + " |")
    return "\n".join(lines)


def _latency_rows(report: Report) -> Rows:
    rows = [(latency_cells(pair), pair.system.is_tidegate) for pair in report.pairs]
    for skip in report.not_run:
        if skip.what != "sustained":
            # The reason goes in the errors column, the one column of text.
            cells = [skip.system.name, skip.what, "not run", *["—"] * (len(LATENCY_HEADERS) - 3)]
            cells[LATENCY_HEADERS.index("errors")] = skip.reason
            rows.append((cells, skip.system.is_tidegate))
    return rows


def _sustained_rows(report: Report) -> Rows:
    rows = [(sustained_cells(row), row.system.is_tidegate) for row in report.sustained]
    for skip in report.not_run:
        if skip.what in ("sustained", "all"):
            cells = [skip.system.name, skip.system.layout, "—", "not run",
                     *["—"] * (len(SUSTAINED_HEADERS) - 4)]
            cells[SUSTAINED_HEADERS.index("errors")] = skip.reason
            rows.append((cells, skip.system.is_tidegate))
    return rows


def _ratio(value: float | None, reference: float | None) -> str:
    """`0.42x`; `—` without both figures or with a reference at or below 0 (an added latency
    can be)."""
    if value is None or reference is None or reference <= 0:
        return "—"
    ratio = value / reference
    return f"{ratio:.2f}x" if abs(ratio) < 10 else f"{ratio:,.1f}x"


def sustained_ratios(report: Report) -> tuple[list[str], Rows]:
    """Each system's sustained rate as a multiple of the simulator's alone and of each tidegate
    layout's, and its CPU per request as a multiple of each tidegate layout's."""
    direct = next((row for row in report.sustained if row.system.key == "direct"), None)
    tidegate = [row for row in report.sustained if row.system.is_tidegate]
    headers = ["system", "req/s", "req/s ÷ direct", *(f"req/s ÷ {ref.system.name}" for ref in tidegate),
               "system CPU µs/req", *(f"CPU ÷ {ref.system.name}" for ref in tidegate)]
    rows: Rows = []
    for row in report.sustained:
        if row.system.key == "direct":
            continue
        cpu = row.system_cpu_us_per_request()
        direct_rate = direct.run.rate if direct else None
        rows.append(([
            row.system.name, f"{row.run.rate:,.0f}", _ratio(row.run.rate, direct_rate),
            *(_ratio(row.run.rate, ref.run.rate) for ref in tidegate),
            _us(cpu), *(_ratio(cpu, ref.system_cpu_us_per_request()) for ref in tidegate),
        ], row.system.is_tidegate))
    return headers, rows


def latency_ratios(report: Report) -> tuple[list[str], Rows]:
    """At each offered rate: the latency through each system as a multiple of the direct one
    (same rate, same run), and its added latency as a multiple of each tidegate layout's at that
    rate. A reference that could not keep up with the rate gives no ratio."""
    layouts = list(dict.fromkeys(pair.system.name for pair in report.pairs if pair.system.is_tidegate))
    reference = {(pair.system.name, pair.rate_per_s): pair for pair in report.pairs
                 if pair.system.is_tidegate and pair.kept_up}
    headers = ["system", "offered req/s", "added p50 ms", "added p99 ms", "p50 ÷ direct", "p99 ÷ direct"]
    for name in layouts:
        headers += [f"added p50 ÷ {name}", f"added p99 ÷ {name}"]
    rows: Rows = []
    for pair in report.pairs:
        cells = [pair.system.name, f"{pair.rate_per_s:,.0f}{'' if pair.kept_up else ' (overloaded)'}",
                 _added(pair.added_ms(0.5)), _added(pair.added_ms(0.99)),
                 _ratio(pair.through.p(0.5), pair.direct.p(0.5)),
                 _ratio(pair.through.p(0.99), pair.direct.p(0.99))]
        for name in layouts:
            ref = reference.get((name, pair.rate_per_s))
            for fraction in (0.5, 0.99):
                cells.append(_ratio(pair.added_ms(fraction), ref.added_ms(fraction) if ref else None))
        rows.append((cells, pair.system.is_tidegate))
    return headers, rows


def verdicts(report: Report) -> list[str]:
    """The issue's targets, each met or not for each tidegate layout, with the figure."""
    lines: list[str] = []
    for pair in report.pairs:
        if not pair.system.is_tidegate or pair.rate_per_s != TARGET_RATE_PER_S:
            continue
        p50, p99 = pair.added_ms(0.5), pair.added_ms(0.99)
        if p50 is None or p99 is None:
            continue
        lines.append(_verdict(f"{pair.system.name}: added p50 < {TARGET_ADDED_P50_MS:g} ms at "
                              f"{TARGET_RATE_PER_S:.0f} req/s", p50 < TARGET_ADDED_P50_MS, f"{p50:+.2f} ms"))
        lines.append(_verdict(f"{pair.system.name}: added p99 < {TARGET_ADDED_P99_MS:g} ms at "
                              f"{TARGET_RATE_PER_S:.0f} req/s", p99 < TARGET_ADDED_P99_MS, f"{p99:+.2f} ms"))
    if not any(p.system.is_tidegate and p.rate_per_s == TARGET_RATE_PER_S for p in report.pairs):
        lines.append(f"tidegate's added latency at {TARGET_RATE_PER_S:.0f} req/s: not measured "
                     "(needs --rates with 200 and a tidegate system)")
    lines += _sustained_verdicts(report)
    return lines


def _sustained_verdicts(report: Report) -> list[str]:
    """CPU per request per layout, and the best layout's rate against direct, the absolute
    target and the peers of the same run."""
    tidegate = [row for row in report.sustained if row.system.is_tidegate]
    if not tidegate:
        return ["sustained rate and CPU per request: not measured (needs a tidegate system)"]
    lines = []
    for row in tidegate:
        cpu, target = row.system_cpu_us_per_request(), TARGET_CPU_US.get(row.system.key)
        if cpu is not None and target is not None:
            lines.append(_verdict(f"{row.system.name}: system CPU <= {target:,.0f} us per request",
                                  cpu <= target, f"{cpu:,.0f} us"))
    best = max(tidegate, key=lambda row: row.run.rate)
    rate = best.run.rate
    lines.append(_verdict(
        f"sustained >= {TARGET_SUSTAINED_PER_S:,.0f} req/s (best layout: {best.system.name})",
        rate >= TARGET_SUSTAINED_PER_S, f"{rate:,.0f} req/s"))
    def peer(key: str) -> float | None:  # its best row (LiteLLM runs with 1 and 2 workers)
        return max((row.run.rate for row in report.sustained if row.system.key == key), default=None)

    direct = peer("direct")
    if direct:
        lines.append(_verdict(
            f"sustained >= {TARGET_SHARE_OF_DIRECT:.0%} of direct (best layout)",
            rate >= TARGET_SHARE_OF_DIRECT * direct, f"{rate / direct:.2f}x of {direct:,.0f}"))
    litellm = peer("litellm")
    if litellm:
        lines.append(_verdict(f"sustained >= {TARGET_VS_LITELLM:g}x LiteLLM's proxy (its best row)",
                              rate >= TARGET_VS_LITELLM * litellm, f"{rate / litellm:.1f}x"))
    portkey = peer("portkey")
    if portkey:
        lines.append(_verdict("sustained ahead of Portkey's gateway", rate > portkey,
                              f"{rate / portkey:.2f}x of {portkey:,.0f}"))
    return lines


def _verdict(name: str, met: bool, figure: str) -> str:
    return f"{name}: {'MET' if met else 'NOT MET'} ({figure})"


def print_report(console: Console, report: Report, command: str) -> None:
    """Tables, verdicts, markdown to paste, machine and command."""
    latency, sustained = _latency_rows(report), _sustained_rows(report)
    console.print(_table("Added latency: open loop, direct vs through each system", LATENCY_HEADERS, latency))
    console.print(_table("Sustained rate: closed loop, end to end", SUSTAINED_HEADERS, sustained))
    ratio_tables = [
        ("Side by side: sustained rate and CPU per request, as ratios", *sustained_ratios(report)),
        ("Side by side: latency, as ratios", *latency_ratios(report)),
    ]
    for title, headers, rows in ratio_tables:
        console.print(_table(title, headers, rows))
    for line in verdicts(report):
        console.print(line, markup=False, highlight=False, soft_wrap=True)
    console.print()
    console.print("[bold]Markdown for BENCHMARKS.md[/bold]")
    blocks = [_markdown(LATENCY_HEADERS, latency), _markdown(SUSTAINED_HEADERS, sustained),
              *(_markdown(headers, rows) for _, headers, rows in ratio_tables)]
    for block in blocks:
        console.print(block, markup=False, highlight=False, soft_wrap=True)
        console.print()
    for name, value in report.facts.items():
        console.print(f"| {name} | {value} |", markup=False, highlight=False, soft_wrap=True)
    console.print(f"command: {command}", markup=False, highlight=False, soft_wrap=True)


def as_json(report: Report) -> dict[str, Any]:
    """Figures only (no key, no URL), for `--json`."""
    def run(load: LoadRun) -> dict[str, Any]:
        return {"sent": load.sent, "answered": load.ok, "seconds": load.seconds, "rate": load.rate,
                "p50_ms": load.p(0.5), "p99_ms": load.p(0.99), "late_p99_ms": load.late_p99_ms(),
                "errors": dict(load.errors), "client_cpu_s": load.cpu_s}

    return {
        "facts": report.facts,
        "latency": [{"system": p.system.name, "key": p.system.key, "rate_per_s": p.rate_per_s,
                     "direct": run(p.direct), "through": run(p.through), "cpu_s": p.cpu_s,
                     "upstream_calls": p.upstream_calls, "kept_up": p.kept_up,
                     "other_cpu_pct": p.other_pct} for p in report.pairs],
        "sustained": [{"system": s.system.name, "key": s.system.key, "layout": s.system.layout,
                       "clients": s.clients, "run": run(s.run), "cpu_s": s.cpu_s,
                       "upstream_calls": s.upstream_calls, "other_cpu_pct": s.other_pct}
                      for s in report.sustained],
        "not_run": [{"system": n.system.name, "what": n.what, "reason": n.reason} for n in report.not_run],
    }
