"""Figures and markdown of the dispatch benchmark: per-class tables per phase, priority vs FIFO,
queue depth over time, and the verdicts against the targets and the seed's figures.

Latency figures cover every request of a phase, including those the benchmark cut (cancelled when
the drain ran out of time). A cut request's time is only a lower bound of what it would have
waited, so a figure that such a bound can move is printed as `≥ x`: it is not the true value, only
a value the true one is at least. Percentiles are nearest-rank, never interpolated.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from bench.dispatch_load import DepthSample
from bench.dispatch_run import CeilingResult, JobOutcome, ModeResult
from bench.dispatch_scenario import PRIORITIES, Phase, Scenario
from tidegate import JobState, Priority

SPARKS = "▁▂▃▄▅▆▇█"
CRITICAL_WAIT_TARGET_MS = 50.0
SEED_RATE_PER_S = 847.0
SEED_P0_AVG_MS = 42.0
SEED_P0_P99_MS = 180.0
ERROR_STATES = frozenset({JobState.DEAD, JobState.EXPIRED, JobState.CANCELLED})


@dataclass(frozen=True, slots=True)
class Figure:
    """A latency in ms; `lower_bound` when cut requests may hide a larger true value."""

    ms: float | None
    lower_bound: bool = False

    def __str__(self) -> str:
        if self.ms is None:
            return "-"
        return ("≥ " if self.lower_bound else "") + format_ms(self.ms)


def format_ms(ms: float) -> str:
    """`4.2 ms`, `87 ms`, `12.3 s`: three significant figures at most."""
    if ms >= 10_000:
        return f"{ms / 1000:.1f} s"
    if ms >= 1000:
        return f"{ms / 1000:.2f} s"
    return f"{ms:.1f} ms" if ms < 10 else f"{ms:.0f} ms"


def quantile(samples: Iterable[tuple[float, bool]], fraction: float) -> Figure:
    """Nearest-rank quantile of (ms, censored) samples. Censored samples are lower bounds: the
    rank's value is exact only if every censored sample sorts above it."""
    ordered = sorted(samples)
    if not ordered:
        return Figure(None)
    rank = max(1, min(len(ordered), math.ceil(fraction * len(ordered))))
    value = ordered[rank - 1][0]
    return Figure(value, any(censored for _, censored in ordered[:rank]))


def mean(samples: Sequence[tuple[float, bool]]) -> Figure:
    """Average of (ms, censored) samples; a lower bound if any is censored."""
    if not samples:
        return Figure(None)
    return Figure(statistics.fmean(ms for ms, _ in samples), any(c for _, c in samples))


@dataclass(frozen=True, slots=True)
class ClassStats:
    """One priority class (or all) in one phase of one run."""

    label: str
    sent: int
    sent_per_s: float
    done_per_s: float  # succeeded requests that finished inside the phase's window, per second
    wait_avg: Figure
    wait_p99: Figure
    e2e_avg: Figure
    e2e_p99: Figure
    own_avg_ms: float | None  # end-to-end minus the provider call: tidegate's share
    # End-to-end minus the last queue wait minus the provider call: pacing and parking in the worker,
    # plus, for a job that was parked, its waits before the last claim (queue_wait_ms restarts when
    # a parked job becomes claimable again).
    worker_avg_ms: float | None
    errors: int  # dead, expired or cancelled by someone else than the benchmark's cut
    cut: int

    @property
    def error_pct(self) -> str:
        """Errors as a share of requests sent."""
        return f"{100 * self.errors / self.sent:.2f} %" if self.sent else "-"


def windows(scenario: Scenario, result: ModeResult) -> list[Phase]:
    """The load phases plus the drain, for throughput by finish time."""
    phases = list(scenario.phases())
    phases.append(Phase("drain", scenario.load_s, max(result.drain_end_s, scenario.load_s + 1e-3), 0.0))
    return phases


def class_stats(label: str, outcomes: Sequence[JobOutcome], finished_in: Sequence[JobOutcome],
                phase: Phase) -> ClassStats:
    """Figures of requests that arrived in `phase` (`outcomes`) and of those that finished
    inside its window (`finished_in`, for throughput)."""
    waits: list[tuple[float, bool]] = []
    e2e: list[tuple[float, bool]] = []
    own: list[float] = []
    held: list[float] = []
    for o in outcomes:
        e2e.append((o.end_to_end_ms, o.cut))
        if o.cut:
            waits.append((o.end_to_end_ms, True))  # never served: it waited at least this long
        elif o.queue_wait_ms is not None:
            waits.append((o.queue_wait_ms, False))
        if o.upstream_ms is not None:
            own.append(o.end_to_end_ms - o.upstream_ms)
            held.append(o.end_to_end_ms - o.upstream_ms - (o.queue_wait_ms or 0.0))
    done = sum(1 for o in finished_in if o.state is JobState.SUCCEEDED
               and phase.start_s <= o.finished_s < phase.end_s)
    return ClassStats(
        label=label,
        sent=len(outcomes),
        sent_per_s=len(outcomes) / phase.duration_s if phase.rate_per_s else 0.0,
        done_per_s=done / phase.duration_s,
        wait_avg=mean(waits), wait_p99=quantile(waits, 0.99),
        e2e_avg=mean(e2e), e2e_p99=quantile(e2e, 0.99),
        own_avg_ms=statistics.fmean(own) if own else None,
        worker_avg_ms=statistics.fmean(held) if held else None,
        errors=sum(1 for o in outcomes if o.state in ERROR_STATES and not o.cut),
        cut=sum(1 for o in outcomes if o.cut),
    )


def phase_table(result: ModeResult, phase: Phase) -> list[ClassStats]:
    """One row per class present, then the total."""
    arrived = [o for o in result.outcomes if o.arrival.phase == phase.name]
    rows = []
    for priority in PRIORITIES:
        mine = [o for o in result.outcomes if o.arrival.priority is priority]
        if mine:
            rows.append(class_stats(priority.name, [o for o in arrived if o.arrival.priority is priority],
                                    mine, phase))
    rows.append(class_stats("all", arrived, result.outcomes, phase))
    return rows


def markdown_phase_table(rows: Sequence[ClassStats], *, drain: bool = False) -> str:
    """The per-class table of one phase of one run."""
    if drain:
        head = "| class | done/s |\n|---|---:|\n"
        return head + "".join(f"| {r.label} | {r.done_per_s:.1f} |\n" for r in rows)
    head = ("| class | sent/s | done/s | queue wait avg | queue wait p99 | paced/parked avg | end-to-end avg "
            "| end-to-end p99 | errors | cut |\n"
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
    lines = [
        f"| {r.label} | {r.sent_per_s:.1f} | {r.done_per_s:.1f} | {r.wait_avg} | {r.wait_p99} "
        f"| {Figure(r.worker_avg_ms)} | {r.e2e_avg} | {r.e2e_p99} | {r.error_pct} | {r.cut} |\n"
        for r in rows
    ]
    return head + "".join(lines)


def markdown_comparison(priority: Sequence[ClassStats], fifo: Sequence[ClassStats]) -> str:
    """Priority vs FIFO side by side for one phase."""
    head = ("| class | done/s priority | done/s FIFO | queue wait p99 priority | queue wait p99 FIFO "
            "| end-to-end p99 priority | end-to-end p99 FIFO |\n|---|---:|---:|---:|---:|---:|---:|\n")
    by_label = {r.label: r for r in fifo}
    lines = []
    for p in priority:
        f = by_label.get(p.label)
        if f is None:
            continue
        lines.append(f"| {p.label} | {p.done_per_s:.1f} | {f.done_per_s:.1f} | {p.wait_p99} | {f.wait_p99} "
                     f"| {p.e2e_p99} | {f.e2e_p99} |\n")
    return head + "".join(lines)


def sparkline(values: Sequence[int]) -> str:
    """One block character per value, scaled to the row's own maximum."""
    top = max(values, default=0)
    if top <= 0:
        return SPARKS[0] * len(values)
    return "".join(SPARKS[min(len(SPARKS) - 1, math.ceil(v / top * (len(SPARKS) - 1)))] for v in values)


def depth_block(scenario: Scenario, result: ModeResult) -> str:
    """Queue depth per level over time: a sparkline per row (one character per second, each row
    scaled to its own maximum) and a table every few seconds."""
    samples = [s for s in result.samples if s.at_s >= 0]
    if not samples:
        return "(no samples)\n"
    rows: list[tuple[str, list[int]]] = [
        (p.name, [s.depth[p] for s in samples]) for p in PRIORITIES
    ]
    rows.append(("delayed", [s.delayed for s in samples]))
    rows.append(("leased", [s.in_flight for s in samples]))
    marks = _phase_ruler(scenario, samples)
    width = max(len(name) for name, _ in rows)
    lines = [f"{'':{width}}  {marks}"]
    lines += [f"{name:{width}}  {sparkline(values)}  max {max(values)}" for name, values in rows]
    step = max(1, math.ceil(len(samples) / 16))
    table = ["| t (s) | " + " | ".join(name for name, _ in rows) + " |",
             "|---:|" + "---:|" * len(rows)]
    for index in range(0, len(samples), step):
        sample = samples[index]
        table.append(f"| {sample.at_s:.0f} | " + " | ".join(str(values[index]) for _, values in rows) + " |")
    return "```\n" + "\n".join(lines) + "\n```\n\n" + "\n".join(table) + "\n"


def _phase_ruler(scenario: Scenario, samples: Sequence[DepthSample]) -> str:
    """`N` under the nominal phase, `O` under overload, `d` under the drain."""
    out = []
    for s in samples:
        out.append("N" if s.at_s < scenario.nominal_s else "O" if s.at_s < scenario.load_s else "d")
    return "".join(out)


def loop_lag(result: ModeResult, phase: Phase) -> str:
    """Event-loop lag in a phase: p50 / p99 / max."""
    lags = sorted(lag * 1000 for at, lag in result.lags if phase.start_s <= at < phase.end_s)
    if not lags:
        return "-"
    p99 = lags[max(0, math.ceil(0.99 * len(lags)) - 1)]
    return f"{format_ms(lags[len(lags) // 2])} / {format_ms(p99)} / {format_ms(lags[-1])}"


def generator_lag(result: ModeResult, phase: Phase) -> str:
    """How late the load generator started enqueues in a phase: p99 / max."""
    lags = sorted(o.arrival.lag_s * 1000 for o in result.outcomes if o.arrival.phase == phase.name)
    if not lags:
        return "-"
    return f"{format_ms(lags[max(0, math.ceil(0.99 * len(lags)) - 1)])} / {format_ms(lags[-1])}"


def upstream_observed(result: ModeResult) -> str:
    """The provider call as the worker timed it: p50 / p99 over succeeded requests."""
    values = sorted(o.upstream_ms for o in result.outcomes if o.upstream_ms is not None)
    if not values:
        return "-"
    p99 = values[max(0, math.ceil(0.99 * len(values)) - 1)]
    return f"{format_ms(values[len(values) // 2])} / {format_ms(p99)}"


def sim_statuses(result: ModeResult) -> str:
    """Answers the simulated provider gave, by HTTP status."""
    counts: dict[str, int] = {}
    for model in result.sim_stats.get("models", {}).values():
        for status, count in (model.get("by_status") or {}).items():
            counts[str(status)] = counts.get(str(status), 0) + int(count)
    return ", ".join(f"{status}: {count}" for status, count in sorted(counts.items())) or "none"


def end_of_overload(scenario: Scenario, result: ModeResult) -> DepthSample | None:
    """The last depth sample taken during the overload phase."""
    inside = [s for s in result.samples if scenario.nominal_s <= s.at_s < scenario.load_s]
    return inside[-1] if inside else None


def max_depth(scenario: Scenario, result: ModeResult, priority: Priority, phase: str) -> int:
    """The largest depth of one level seen in a phase."""
    start, end = (0.0, scenario.nominal_s) if phase == "nominal" else (scenario.nominal_s, scenario.load_s)
    return max((s.depth[priority] for s in result.samples if start <= s.at_s < end), default=0)


def verdicts(scenario: Scenario, runs: dict[str, ModeResult], ceiling: CeilingResult | None) -> list[str]:
    """The targets of the issue and the seed's figures, each met / not met / context only."""
    out: list[str] = []
    prio, fifo = runs.get("priority"), runs.get("fifo")
    if prio is not None:
        out += _critical_wait(scenario, prio) + _backlog(scenario, prio) + _seed_latency(scenario, prio)
    out += [_final_states(scenario, run) for run in runs.values()]
    if ceiling is not None:
        out.append(_seed_rate(scenario, ceiling))
    if prio is not None and fifo is not None:
        out += _against_fifo(scenario, prio, fifo)
    return out


def _by_label(scenario: Scenario, run: ModeResult, phase: str) -> dict[str, ClassStats]:
    chosen = next(p for p in scenario.phases() if p.name == phase)
    return {row.label: row for row in phase_table(run, chosen)}


def _critical_wait(scenario: Scenario, prio: ModeResult) -> list[str]:
    critical = _by_label(scenario, prio, "overload").get("CRITICAL")
    if critical is None:
        return []
    p99 = critical.wait_p99
    met = p99.ms is not None and not p99.lower_bound and p99.ms < CRITICAL_WAIT_TARGET_MS
    return [_verdict(
        f"CRITICAL p99 queue wait under {scenario.overload_factor:g}x overload < "
        f"{CRITICAL_WAIT_TARGET_MS:.0f} ms", met,
        f"{p99} (avg {critical.wait_avg}). Its end-to-end p99 is {critical.e2e_p99}: claimed CRITICAL "
        f"requests spent {Figure(critical.worker_avg_ms)} on average pacing or parked in the worker, and the "
        f"provider call alone has a p99 of {format_ms(_upstream_p99(prio))}",
    )]


def _backlog(scenario: Scenario, prio: ModeResult) -> list[str]:
    end = end_of_overload(scenario, prio)
    total = sum(end.depth.values()) if end is not None else 0
    bulk = _by_label(scenario, prio, "overload").get("BULK")
    if end is None or total == 0 or bulk is None:
        return []
    shares = ", ".join(f"{p.name} {100 * end.depth[p] / total:.0f} %" for p in PRIORITIES if end.depth[p])
    high_max = max(max_depth(scenario, prio, p, "overload") for p in (Priority.CRITICAL, Priority.HIGH))
    top = end.depth[Priority.CRITICAL] + end.depth[Priority.HIGH]
    met = top <= 0.01 * total and bulk.done_per_s < 0.5 * bulk.sent_per_s
    return [_verdict(
        "BULK (with the other low classes) absorbs the backlog", met,
        f"waiting at the end of overload: {total} ({shares}); CRITICAL+HIGH depth never above {high_max} "
        f"during overload; BULK got {bulk.done_per_s:.1f} done/s of {bulk.sent_per_s:.1f} sent",
    )]


def _seed_latency(scenario: Scenario, prio: ModeResult) -> list[str]:
    c = _by_label(scenario, prio, "nominal").get("CRITICAL")
    if c is None:
        return []
    return [_verdict(
        f"seed: P0 avg {SEED_P0_AVG_MS:.0f} ms / p99 {SEED_P0_P99_MS:.0f} ms", None,
        f"CRITICAL end-to-end at nominal load {c.e2e_avg} avg / {c.e2e_p99} p99, of which tidegate's share "
        f"(end-to-end minus the provider call) is {Figure(c.own_avg_ms)} avg. Not comparable as such: the "
        f"seed's P0 latency includes a mocked upstream of unknown latency; ours answers in "
        f"{scenario.latency_ms:g} ms median / {scenario.latency_p99_ms:g} ms p99 by configuration, so the "
        "provider call alone is above the seed's P0 average",
    )]


def _final_states(scenario: Scenario, run: ModeResult) -> str:
    cut = sum(o.cut for o in run.outcomes)
    errors = sum(1 for o in run.outcomes if o.state in ERROR_STATES and not o.cut)
    return _verdict(
        f"{run.mode}: no request without a final state", not run.failures,
        f"{len(run.outcomes)} enqueued, every one final after the run: {cut} cut by the benchmark "
        f"(cancelled after {scenario.drain_s:g} s of drain), {errors} dead/expired; "
        f"{len(run.failures)} enqueue errors; the queue was empty at the end",
    )


def _seed_rate(scenario: Scenario, ceiling: CeilingResult) -> str:
    dry = " (the prefilled queue ran dry: a lower bound)" if ceiling.ran_dry else ""
    return _verdict(
        f"seed: {SEED_RATE_PER_S:.0f} req/s sustained", ceiling.rate_per_s >= SEED_RATE_PER_S,
        f"the dispatch ceiling here is {ceiling.rate_per_s:.0f} req/s{dry} with no rate limit and "
        f"{ceiling.concurrency} calls in flight (provider p50 {format_ms(ceiling.upstream_p50_ms)}). The "
        f"seed's own load, 10,000/min, is {scenario.nominal_rate_per_s:.0f} req/s: its 847 req/s cannot be "
        "the throughput of that load, so it is set against the ceiling; the scenario's throughput is capped "
        f"by the configured provider limit ({scenario.capacity_per_s:.0f} req/s) by design",
    )


def _against_fifo(scenario: Scenario, prio: ModeResult, fifo: ModeResult) -> list[str]:
    po, fo = _by_label(scenario, prio, "overload"), _by_label(scenario, fifo, "overload")
    if "CRITICAL" not in po or "CRITICAL" not in fo:
        return []
    return [_verdict(
        "priority vs FIFO under overload", None,
        f"CRITICAL queue wait p99 {po['CRITICAL'].wait_p99} with priorities vs {fo['CRITICAL'].wait_p99} "
        f"FIFO; end-to-end p99 {po['CRITICAL'].e2e_p99} vs {fo['CRITICAL'].e2e_p99}; CRITICAL done/s "
        f"{po['CRITICAL'].done_per_s:.1f} vs {fo['CRITICAL'].done_per_s:.1f} "
        f"(sent {po['CRITICAL'].sent_per_s:.1f})",
    )]


def _upstream_p99(result: ModeResult) -> float:
    values = sorted(o.upstream_ms for o in result.outcomes if o.upstream_ms is not None)
    return values[max(0, math.ceil(0.99 * len(values)) - 1)] if values else float("nan")


def _verdict(name: str, met: bool | None, figure: str) -> str:
    mark = "context" if met is None else "MET" if met else "NOT MET"
    return f"- **{name}** — {mark}: {figure}"
