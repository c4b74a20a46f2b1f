"""Offline quality of tidegate's recommendations on the real UCI Online Retail purchases.

    .venv/bin/python -m bench.recs_quality              # the full run: about 7 minutes on 2 cores
    .venv/bin/python -m bench.recs_quality --quick      # shorter history and test, 300 customers: ~75 s
    .venv/bin/python -m bench.recs_quality --markdown   # also print the tables as markdown
    .venv/bin/python -m bench.recs_quality --months 3   # the last 3 test months, each with its rows,
                                                        # the pooled mean and the findings: ~5 minutes
    .venv/bin/python -m bench.recs_quality --quick --months 2   # two-week months, 300 customers: ~50 s

The purchases replay in time order through every method at once: tidegate's incremental
Recommender (fed interaction by interaction, as the change flow feeds it), global popularity,
decayed popularity, the customer's own repeat purchases, and an "overnight batch" from the
`implicit` package refit once per day on the history so far. For every test invoice of a known
customer each method is asked for that customer's top 10 just *before* the invoice is fed; hit
rate@10 and NDCG@10 are reported for the next purchase of any item and of new items only (see
bench/recs_quality_eval.py for the protocol and bench/recs_quality_data.py for the cleaning).

Data: Chen, D. (2015). Online Retail [Dataset]. UCI Machine Learning Repository,
https://doi.org/10.24432/C5BW33, CC BY 4.0; the copy is expected at ../shared/data/ (--data).
"""

from __future__ import annotations

import os

# implicit runs its own threads; a multi-threaded BLAS underneath would oversubscribe the cores
# (implicit warns about it). Set before numpy is imported.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

import argparse
import asyncio
import importlib.util
import platform
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import date
from importlib import metadata
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from bench.common import BenchmarkError, command_line
from bench.recs_quality_data import Month, Split, last_months, load, local_midnight, months_back, split
from bench.recs_quality_eval import (
    MODES,
    Outcome,
    Window,
    mean_ci,
    paired_difference,
    pooled,
    replay,
    replay_windows,
    sample_customers,
)
from bench.recs_quality_methods import (
    BATCH_SPECS,
    DailyBatch,
    DecayedPopularity,
    Method,
    Popularity,
    Repeat,
    TidegateBuyAgain,
    TidegateMethod,
)
from tidegate.testing import RecsSettings

DEFAULT_DATA = Path(__file__).resolve().parent.parent.parent / "shared" / "data" / "online_retail.csv.gz"
TIDEGATE = "tidegate"


@dataclass(frozen=True, slots=True)
class EngineVariant:
    """One tidegate configuration in the table: RecsSettings changes, and optionally the
    buy-again prototype's (weight, half-life in days) on top of the engine (not in the engine)."""

    label: str
    settings: dict[str, Any]
    buy_again: tuple[float, float] | None = None


# The engine as it was before its buy-again signal: one 24 h half-life for everything.
_BEFORE: dict[str, Any] = {
    "co_occurrence_decay_hours": 24.0, "trending_decay_hours": 24.0, "weight_repeat": 0.0,
}
_DAYS = 24.0

# The engine's defaults first (the reference row), then the engine before the buy-again signal
# and the prototype that measured it from outside, then the alternatives scored on the
# validation month (2011-10-09 … 2011-11-08) to choose the defaults; see BENCHMARKS.md.
ENGINE_VARIANTS: dict[str, EngineVariant] = {
    "default": EngineVariant("tidegate (defaults)", {}),
    "before": EngineVariant("tidegate before buy-again (one 24 h half-life, no repeat signal)", _BEFORE),
    "prototype": EngineVariant(
        "buy-again prototype (not the engine: the earlier engine at 7 d, re-ranked from outside)",
        {"decay_hours": 7 * _DAYS, "co_occurrence_decay_hours": 7 * _DAYS,
         "trending_decay_hours": 7 * _DAYS, "weight_repeat": 0.0},
        buy_again=(2.0, 90.0)),
    "decay-7d": EngineVariant("tidegate (profile half-life 7 d)", {"decay_hours": 7 * _DAYS}),
    "decay-7d-wide": EngineVariant("tidegate (profile 7 d, 50 recent items, 100 neighbours)",
                                   {"decay_hours": 7 * _DAYS, "recent_items": 50, "max_neighbours": 100}),
    # validation alternatives of the new settings
    "repeat-w1": EngineVariant("tidegate (repeat weight 1)", {"weight_repeat": 1.0}),
    "repeat-w4": EngineVariant("tidegate (repeat weight 4)", {"weight_repeat": 4.0}),
    "repeat-30d": EngineVariant("tidegate (repeat half-life 30 d)", {"repeat_decay_hours": 30 * _DAYS}),
    "repeat-365d": EngineVariant("tidegate (repeat half-life 365 d)", {"repeat_decay_hours": 365 * _DAYS}),
    "shared-24h": EngineVariant("tidegate (co-occurrence, trending 24 h)",
                                {"co_occurrence_decay_hours": 24.0, "trending_decay_hours": 24.0}),
    "shared-30d": EngineVariant("tidegate (co-occurrence, trending 30 d)",
                                {"co_occurrence_decay_hours": 30 * _DAYS,
                                 "trending_decay_hours": 30 * _DAYS}),
}
DEFAULT_ENGINE = ("default", "before", "prototype")
# Where tidegate's defaults, the alternatives above and the batch models' parameters were chosen
# (test 2011-10-09 … 2011-11-08, all history before it): never a test month of --months.
VALIDATION_MONTH = Month(date(2011, 10, 9), date(2011, 11, 9))
DATA_START = date(2010, 12, 1)
QUICK_ENGINE = ("default", "before")


@dataclass(frozen=True, slots=True)
class Plan:
    """What one run evaluates."""

    data: Path
    history_start: date
    test_start: date
    test_end: date
    customers: int | None
    seed: int
    batch: tuple[str, ...]
    engine: tuple[str, ...]
    decayed_half_life_days: float
    months: tuple[Month, ...] | None = None  # --months: the test months, oldest first


def parse_args(argv: list[str] | None = None) -> tuple[Plan, bool]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA,
                        help="online_retail.csv.gz (default: ../shared/data/ next to the repository)")
    parser.add_argument("--quick", action="store_true",
                        help="history from 2011-08-01, two test weeks, 300 sampled customers")
    parser.add_argument("--history-start", type=date.fromisoformat, default=None,
                        help="first day of history (default 2010-12-01, the first day of the data)")
    parser.add_argument("--test-start", type=date.fromisoformat, default=None,
                        help="first test day (default 2011-11-09: the last month is the test)")
    parser.add_argument("--test-end", type=date.fromisoformat, default=None,
                        help="day after the last test day (default 2011-12-10, after the data's end)")
    parser.add_argument("--customers", type=int, default=None,
                        help="score only this many test customers, drawn with --seed (default: all)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--batch", default="knn-bm25,als",
                        help=f"daily batch models, comma-separated, from {', '.join(BATCH_SPECS)}")
    parser.add_argument("--engine", default=None,
                        help=f"tidegate configurations, comma-separated, from {', '.join(ENGINE_VARIANTS)} "
                             f"(default: {', '.join(DEFAULT_ENGINE)}; with --quick "
                             f"{', '.join(QUICK_ENGINE)}); 'none' for the baselines only")
    parser.add_argument("--decayed-half-life-days", type=float, default=7.0)
    parser.add_argument("--months", type=int, default=None,
                        help="evaluate on the last N test months, each with all history before it: the "
                             "last is --test-start … --test-end, each earlier one starts a calendar month "
                             f"before the next; the validation month ({VALIDATION_MONTH.label}) is "
                             "skipped (default: the last month only, as one table; with --quick the "
                             "months are two weeks long)")
    parser.add_argument("--markdown", action="store_true", help="also print the tables as markdown")
    args = parser.parse_args(argv)
    quick = args.quick
    test_start = args.test_start or date(2011, 11, 9)
    test_end = args.test_end or (date(2011, 11, 23) if quick else date(2011, 12, 10))
    months: tuple[Month, ...] | None = None
    if args.months is not None:
        if args.months <= 0:
            parser.error("--months must be positive")
        validation = [(VALIDATION_MONTH.start, VALIDATION_MONTH.end)]
        months = tuple(last_months(test_start, test_end, args.months, skip=validation,
                                   first_day=args.history_start or DATA_START))
        if len(months) < args.months:
            parser.error(f"--months {args.months}: only {len(months)} test months fit after the history")
    quick_start = date(2011, 8, 1)
    if months is not None:
        quick_start = min(quick_start, months_back(months[0].start, 2))
    plan = Plan(
        data=args.data,
        history_start=args.history_start or (quick_start if quick else DATA_START),
        test_start=test_start,
        test_end=test_end,
        months=months,
        customers=args.customers if args.customers is not None else (300 if quick else None),
        seed=args.seed,
        batch=_names(args.batch, BATCH_SPECS, "--batch"),
        engine=_engine_names(args.engine, quick),
        decayed_half_life_days=args.decayed_half_life_days,
    )
    if plan.customers is not None and plan.customers <= 0:
        parser.error("--customers must be positive")
    return plan, args.markdown


def _engine_names(text: str | None, quick: bool) -> tuple[str, ...]:
    if text is None:
        return QUICK_ENGINE if quick else DEFAULT_ENGINE
    return () if text.strip() == "none" else _names(text, ENGINE_VARIANTS, "--engine")


def _names(text: str, known: Mapping[str, object], option: str) -> tuple[str, ...]:
    names = tuple(name.strip() for name in text.split(",") if name.strip())
    unknown = [name for name in names if name not in known]
    if unknown:
        raise SystemExit(f"{option}: unknown {', '.join(unknown)}; known: {', '.join(known)}")
    return names


def build_methods(plan: Plan) -> list[Method]:
    """The methods of one run; the tidegate rows first (the first is the reference)."""
    methods: list[Method] = []
    if plan.engine and importlib.util.find_spec("tidegate.recs.engine") is None:
        raise BenchmarkError("tidegate.recs.engine is missing: run with --engine none for the baselines only")
    for name in plan.engine:
        variant = ENGINE_VARIANTS[name]
        settings = RecsSettings.model_validate(variant.settings)
        if variant.buy_again is None:
            methods.append(TidegateMethod(variant.label, settings))
        else:
            weight, half_life_days = variant.buy_again
            methods.append(TidegateBuyAgain(variant.label, settings, weight=weight,
                                            half_life_days=half_life_days))
    methods.append(Popularity())
    methods.append(DecayedPopularity(plan.decayed_half_life_days))
    methods.append(Repeat())
    methods.extend(DailyBatch(BATCH_SPECS[name], seed=plan.seed) for name in plan.batch)
    return methods


async def run(plan: Plan, console: Console) -> tuple[Split, Outcome, list[Method], float]:
    started = time.perf_counter()
    dataset = load(plan.data)
    dropped = ", ".join(f"{reason} {count:,}" for reason, count in dataset.dropped.most_common())
    console.print(f"[dim]read {dataset.rows_read:,} rows, kept {dataset.rows_kept:,} "
                  f"({len(dataset.invoices):,} invoices, {len(dataset.catalogue):,} products) "
                  f"in {time.perf_counter() - started:.1f} s; dropped: {dropped}[/]")
    the_split = split(dataset, history_start=local_midnight(plan.history_start),
                      test_start=local_midnight(plan.test_start), test_end=local_midnight(plan.test_end))
    sample = sample_customers(the_split, plan.customers, plan.seed)
    methods = build_methods(plan)
    for method in methods:
        await method.start(dataset.catalogue)
    try:
        outcome = await replay(the_split, methods, sample,
                               progress=lambda text: console.print(f"[dim]{text}[/]"))
    finally:
        for method in methods:
            await method.close()
    return the_split, outcome, methods, time.perf_counter() - started


@dataclass(frozen=True, slots=True)
class MonthsResult:
    """What a --months run measured: one Outcome per test month (oldest first)."""

    months: tuple[Month, ...]
    outcomes: list[Outcome]
    history_invoices: int
    month_invoices: list[int]


async def run_months(plan: Plan, console: Console) -> tuple[MonthsResult, list[Method], float]:
    """One replay from the history start to the end of the last test month: each month is scored
    with everything before it learnt (the stretches between, such as the validation month, are
    fed and not scored), which is the replay of that month alone after all the history before it."""
    if not plan.months:
        raise BenchmarkError("no test months")
    started = time.perf_counter()
    dataset = load(plan.data)
    console.print(f"[dim]read {dataset.rows_read:,} rows, kept {dataset.rows_kept:,} "
                  f"({len(dataset.invoices):,} invoices) in {time.perf_counter() - started:.1f} s[/]")
    history_start = local_midnight(plan.history_start)
    first, last = local_midnight(plan.months[0].start), local_midnight(plan.months[-1].end)
    history = [inv for inv in dataset.invoices if history_start <= inv.at < first]
    test = [inv for inv in dataset.invoices if first <= inv.at < last]
    windows, counts = [], []
    for month in plan.months:
        start, end = local_midnight(month.start), local_midnight(month.end)
        inside = [inv for inv in test if start <= inv.at < end]
        if not inside or not history:
            raise BenchmarkError(f"the test month {month.label} has {len(inside)} invoices and "
                                 f"{len(history)} of history before the first month")
        counts.append(len(inside))
        windows.append(Window(start, end, sample_customers(inside, plan.customers, plan.seed)))
    methods = build_methods(plan)
    for method in methods:
        await method.start(dataset.catalogue)
    try:
        outcomes = await replay_windows(history, test, windows, methods,
                                        progress=lambda text: console.print(f"[dim]{text}[/]"))
    finally:
        for method in methods:
            await method.close()
    return (MonthsResult(plan.months, outcomes, len(history), counts), methods,
            time.perf_counter() - started)


# ---------------------------------------------------------------------------- report


def _pct(value: float, half: float | None = None) -> str:
    if half is None:
        return f"{value * 100:.1f}"
    return f"{value * 100:.1f} ± {half * 100:.1f}"


def result_rows(outcome: Outcome, *, same_day_only: bool = False) -> list[list[str]]:
    """Method, hit@10 and NDCG@10 (any item, new items, in %, ± 95 % CI), CPU time; with
    `same_day_only`, over the invoices of customers who bought earlier the same day (no time)."""
    rows = []
    for name in outcome.methods:
        cells = [name]
        for mode in MODES:
            scores, keep = outcome.scores[(name, mode)], outcome.same_day[mode]
            hits, ndcgs = scores.hits, scores.ndcgs
            if same_day_only:
                hits = [value for value, kept in zip(hits, keep, strict=True) if kept]
                ndcgs = [value for value, kept in zip(ndcgs, keep, strict=True) if kept]
            cells += [_pct(*mean_ci(hits)), _pct(*mean_ci(ndcgs))]
        if not same_day_only:
            cells.append(f"{outcome.seconds[name]:.1f}")
        rows.append(cells)
    return rows


def difference_rows(outcome: Outcome, baselines: Sequence[str]) -> list[list[str]]:
    """Each tidegate row minus each baseline named, paired per invoice, in points."""
    rows = []
    for ours in (name for name in outcome.methods if name.startswith(TIDEGATE)):
        for theirs in baselines:
            cells = [f"{ours} vs {theirs}"]
            for mode in MODES:
                a, b = outcome.scores[(ours, mode)], outcome.scores[(theirs, mode)]
                for mine, other in ((a.hits, b.hits), (a.ndcgs, b.ndcgs)):
                    mean, half = paired_difference(mine, other)
                    cells.append(f"{mean * 100:+.1f} ± {half * 100:.1f}")
            rows.append(cells)
    return rows


HEADERS = ["method", "any: hit@10 %", "any: NDCG@10 %", "new: hit@10 %", "new: NDCG@10 %", "CPU s"]
DIFF_HEADERS = ["tidegate minus baseline (points, paired)", "any: hit@10", "any: NDCG@10", "new: hit@10",
                "new: NDCG@10"]


def describe(plan: Plan, the_split: Split, outcome: Outcome, methods: list[Method], total_s: float) -> str:
    sample = "all" if plan.customers is None else f"{outcome.sampled_customers:,} sampled (seed {plan.seed})"
    lines = [
        f"history from {plan.history_start} to before {plan.test_start} "
        f"({len(the_split.history):,} invoices), "
        f"test from {plan.test_start} to before {plan.test_end} ({len(the_split.test):,} invoices, "
        f"{outcome.test_customers:,} customers; {outcome.cold_invoices:,} invoices of first-time customers "
        "not scored)",
        f"scored customers: {sample}; any item: {outcome.evaluated_invoices[MODES[0]]:,} invoices of "
        f"{outcome.evaluated_customers[MODES[0]]:,} customers; new items: "
        f"{outcome.evaluated_invoices[MODES[1]]:,} invoices of {outcome.evaluated_customers[MODES[1]]:,} "
        "customers",
    ]
    for name, flaws in outcome.flaws.items():
        lines.append(f"{name}: " + ", ".join(f"{count:,} {rule}" for rule, count in flaws.items()))
    return "\n".join([*lines, *_run_lines(methods, total_s)])


def _run_lines(methods: list[Method], total_s: float) -> list[str]:
    """The batch models' fitting and the run's time and versions."""
    lines = [f"{method.name}: {method.fits} fits, {method.fit_seconds:.1f} s fitting"
             for method in methods if isinstance(method, DailyBatch)]
    lines.append(f"whole run {total_s:.0f} s; Python {platform.python_version()}, implicit "
                 f"{_version('implicit')}, numpy {_version('numpy')}, scipy {_version('scipy')}, "
                 f"{os.cpu_count()} cores")
    return lines


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "?"


def same_day_title(outcome: Outcome) -> str:
    any_n, new_n = (sum(outcome.same_day[mode]) for mode in MODES)
    return (f"Same-day follow-ups: the customer bought earlier that day, after the nightly fit "
            f"({any_n:,} invoices any item, {new_n:,} new items)")


def print_table(console: Console, title: str, headers: list[str], rows: list[list[str]]) -> None:
    table = Table(title=title, title_justify="left")
    for number, header in enumerate(headers):
        table.add_column(header, justify="left" if number == 0 else "right")
    for row in rows:
        table.add_row(*row)
    console.print(table)


def markdown(headers: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


# ---------------------------------------------------------------------------- per month

MEAN = "mean (pooled)"
METRICS = [f"{mode.split()[0]}: {metric}" for mode in MODES for metric in ("hit@10", "NDCG@10")]
SUBSETS = ("all scored invoices", "same-day follow-ups")


def _scores_of(outcome: Outcome, name: str, mode: str, same_day_only: bool) -> list[list[float]]:
    """hits and NDCGs of one method in one mode, optionally of the same-day follow-ups only."""
    scores, keep = outcome.scores[(name, mode)], outcome.same_day[mode]
    lists = [scores.hits, scores.ndcgs]
    if same_day_only:
        lists = [[v for v, kept in zip(values, keep, strict=True) if kept] for values in lists]
    return lists


def month_rows(result: MonthsResult, mean: Outcome, *, same_day_only: bool = False) -> list[list[str]]:
    """Per method: a row per month, then the mean over the months (pooled over their invoices)."""
    labelled = [*zip((m.label for m in result.months), result.outcomes, strict=True), (MEAN, mean)]
    rows = []
    for name in mean.methods:
        for label, outcome in labelled:
            cells = [name, label]
            for mode in MODES:
                cells += [_pct(*mean_ci(values)) for values in _scores_of(outcome, name, mode, same_day_only)]
            if not same_day_only:
                cells.append(f"{outcome.seconds[name]:.1f}")
            rows.append(cells)
    return rows


def month_differences(outcome: Outcome, ours: str, theirs: str,
                      same_day_only: bool) -> list[tuple[float, float]]:
    """ours minus theirs per metric (METRICS order), paired per invoice: (mean, 95 % half-width)."""
    found = []
    for mode in MODES:
        mine, other = (_scores_of(outcome, n, mode, same_day_only) for n in (ours, theirs))
        found += [paired_difference(a, b) for a, b in zip(mine, other, strict=True)]
    return found


def _diff(mean: float, half: float) -> str:
    return f"{mean * 100:+.1f} ± {half * 100:.1f}"


def month_difference_rows(result: MonthsResult, mean: Outcome, baselines: Sequence[str],
                          *, same_day_only: bool = False) -> list[list[str]]:
    labelled = [*zip((m.label for m in result.months), result.outcomes, strict=True), (MEAN, mean)]
    rows = []
    for ours in (name for name in mean.methods if name.startswith(TIDEGATE)):
        for theirs in baselines:
            for label, outcome in labelled:
                rows.append([f"{ours} vs {theirs}", label,
                             *(_diff(*d) for d in month_differences(outcome, ours, theirs, same_day_only))])
    return rows


@dataclass(frozen=True, slots=True)
class Finding:
    """One comparison on one metric across the months: in how many tidegate is ahead."""

    ours: str
    theirs: str
    subset: str
    metric: str
    ahead: int  # months with a positive mean difference
    significant: int  # months whose 95 % interval lies above zero
    behind: int  # months with a negative mean difference
    behind_significant: int  # months whose 95 % interval lies below zero
    months: int
    pooled: tuple[float, float]

    @property
    def every_month(self) -> bool:
        return self.ahead == self.months

    def text(self) -> str:
        tied = self.months - self.ahead - self.behind
        return (f"{self.ours} vs {self.theirs}, {self.metric} ({self.subset}): ahead in {self.ahead} of "
                f"{self.months} months ({self.significant} with the 95 % interval above zero), behind in "
                f"{self.behind} ({self.behind_significant} below zero)"
                + (f", tied in {tied}" if tied else "") + f"; pooled {_diff(*self.pooled)} points")


def findings(result: MonthsResult, mean: Outcome, baselines: Sequence[str]) -> list[Finding]:
    """Every tidegate row against every baseline, on every metric, over all scored invoices and
    over the same-day follow-ups, counted month by month."""
    found = []
    for ours in (name for name in mean.methods if name.startswith(TIDEGATE)):
        for theirs in baselines:
            for subset, same_day_only in zip(SUBSETS, (False, True), strict=True):
                per_month = [month_differences(o, ours, theirs, same_day_only) for o in result.outcomes]
                overall = month_differences(mean, ours, theirs, same_day_only)
                for index, metric in enumerate(METRICS):
                    diffs = [month[index] for month in per_month]
                    found.append(Finding(
                        ours, theirs, subset, metric,
                        ahead=sum(1 for m, _ in diffs if m > 0),
                        significant=sum(1 for m, h in diffs if m - h > 0),
                        behind=sum(1 for m, _ in diffs if m < 0),
                        behind_significant=sum(1 for m, h in diffs if m + h < 0),
                        months=len(diffs), pooled=overall[index]))
    return found


def describe_months(plan: Plan, result: MonthsResult, methods: list[Method], total_s: float) -> str:
    sample = "all" if plan.customers is None else f"{plan.customers:,} sampled per month (seed {plan.seed})"
    before = [m for m in result.months if m.end <= VALIDATION_MONTH.start]
    after = [m for m in result.months if m.start >= VALIDATION_MONTH.end]
    lines = [
        f"history from {plan.history_start} to before the first test month ({result.history_invoices:,} "
        "invoices); each month is scored with all purchases before it learnt (one replay; what lies "
        "between the months is fed, not scored)",
        f"settings: tidegate's defaults and the batch models' parameters were chosen on the validation "
        f"month {VALIDATION_MONTH.label} (all history before it), which is no test month here; it "
        f"precedes {len(after)} of the {len(result.months)} test months"
        + (f" ({', '.join(m.label for m in after)})" if after else "")
        + (f"; for {', '.join(m.label for m in before)} the choice came from a later month of the "
           "same data (not from the month scored)" if before else ""),
        f"mean: pooled over the scored invoices of all months (each invoice weighs the same), normal "
        f"95 % interval; the paired differences pooled the same way; scored customers: {sample}",
    ]
    for month, outcome, invoices in zip(result.months, result.outcomes, result.month_invoices, strict=True):
        scored, follow_ups = outcome.evaluated_invoices, outcome.same_day
        lines.append(
            f"{month.label}: {invoices:,} invoices of {outcome.test_customers:,} customers "
            f"({outcome.cold_invoices:,} of first-time customers not scored); scored: any item "
            f"{scored[MODES[0]]:,} invoices, new items {scored[MODES[1]]:,}; same-day follow-ups "
            f"{sum(follow_ups[MODES[0]]):,} and {sum(follow_ups[MODES[1]]):,}")
        for name, flaws in outcome.flaws.items():
            lines.append(f"  {name}: " + ", ".join(f"{count:,} {rule}" for rule, count in flaws.items()))
    return "\n".join([*lines, *_run_lines(methods, total_s)])


MONTH_HEADERS = [HEADERS[0], "month", *HEADERS[1:]]
MONTH_DIFF_HEADERS = [DIFF_HEADERS[0], "month", *DIFF_HEADERS[1:]]


def main_months(plan: Plan, console: Console, as_markdown: bool) -> int:
    try:
        result, methods, total_s = asyncio.run(run_months(plan, console))
    except BenchmarkError as exc:
        console.print(f"[red]recs quality: {exc}[/]")
        return 1
    mean = pooled(result.outcomes)
    baselines = [m.name for m in methods if isinstance(m, DailyBatch) or type(m) is Popularity]
    batch = [m.name for m in methods if isinstance(m, DailyBatch)]
    tables = [
        ("Next-purchase quality @10 per month, % (± 95 % CI)", MONTH_HEADERS, month_rows(result, mean)),
        ("Same-day follow-ups per month (the customer bought earlier that day, after the nightly fit)",
         MONTH_HEADERS[:-1], month_rows(result, mean, same_day_only=True)),
        ("Differences per month", MONTH_DIFF_HEADERS, month_difference_rows(result, mean, baselines)),
        ("Same-day follow-ups: differences per month", MONTH_DIFF_HEADERS,
         month_difference_rows(result, mean, batch, same_day_only=True)),
    ]
    for title, headers, rows in tables:
        if rows:
            print_table(console, title, headers, rows)
    console.print(describe_months(plan, result, methods, total_s))
    found = findings(result, mean, baselines)
    every = [f for f in found if f.every_month]
    lines = [f"Findings that hold in every month (tidegate ahead in each of the {len(result.months)} "
             f"months; {len(every)} of {len(found)} comparisons):"]
    lines += [f"- {f.text()}" for f in every]
    lines.append("Findings that do not hold in every month:")
    lines += [f"- {f.text()}" for f in found if not f.every_month]
    console.print("\n".join(lines), markup=False)
    if as_markdown:
        for title, headers, rows in tables:
            print(f"\n{title}\n\n{markdown(headers, rows)}")
        print("\n" + "\n".join(lines))
        print("\n```\n" + command_line("bench.recs_quality", sys.argv[1:]) + "\n```")
    return 0


def main(argv: list[str] | None = None) -> int:
    plan, as_markdown = parse_args(argv)
    console = Console(width=None if sys.stdout.isatty() else 160)
    if plan.months is not None:
        return main_months(plan, console, as_markdown)
    try:
        the_split, outcome, methods, total_s = asyncio.run(run(plan, console))
    except BenchmarkError as exc:
        console.print(f"[red]recs quality: {exc}[/]")
        return 1
    baselines = [m.name for m in methods if isinstance(m, DailyBatch) or type(m) is Popularity]
    tables = [("Next-purchase quality @10, % (± 95 % CI)", HEADERS, result_rows(outcome)),
              (same_day_title(outcome), HEADERS[:-1], result_rows(outcome, same_day_only=True)),
              ("Differences", DIFF_HEADERS, difference_rows(outcome, baselines))]
    for title, headers, rows in tables:
        if rows:
            print_table(console, title, headers, rows)
    console.print(describe(plan, the_split, outcome, methods, total_s))
    if as_markdown:
        for title, headers, rows in tables:
            print(f"\n{title}\n\n{markdown(headers, rows)}")
        print("\n```\n" + command_line("bench.recs_quality", sys.argv[1:]) + "\n```")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
