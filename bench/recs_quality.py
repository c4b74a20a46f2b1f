"""Offline quality of tidegate's recommendations on the real UCI Online Retail purchases.

    .venv/bin/python bench/recs_quality.py              # the full run: about 7 minutes on 2 cores
    .venv/bin/python bench/recs_quality.py --quick      # shorter history and test, 300 customers: ~75 s
    .venv/bin/python bench/recs_quality.py --markdown   # also print the tables as markdown

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
import sys
from pathlib import Path

# Run as a script, Python puts bench/ first on sys.path, where bench/queue.py would shadow the
# standard library's `queue` (asyncio imports it). Put the repository root there instead.
_BENCH_DIR = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _BENCH_DIR]
sys.path.insert(0, str(_BENCH_DIR.parent))
# implicit runs its own threads; a multi-threaded BLAS underneath would oversubscribe the cores
# (implicit warns about it). Set before numpy is imported.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

import argparse  # noqa: E402
import asyncio  # noqa: E402
import importlib.util  # noqa: E402
import platform  # noqa: E402
import shlex  # noqa: E402
import time  # noqa: E402
from collections.abc import Mapping, Sequence  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from datetime import date  # noqa: E402
from importlib import metadata  # noqa: E402
from typing import Any  # noqa: E402

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from bench.common import BenchmarkError  # noqa: E402
from bench.recs_quality_data import Split, load, local_midnight, split  # noqa: E402
from bench.recs_quality_eval import MODES, Outcome, mean_ci, paired_difference, replay, sample_customers  # noqa: E402
from bench.recs_quality_methods import (  # noqa: E402
    BATCH_SPECS,
    DailyBatch,
    DecayedPopularity,
    Method,
    Popularity,
    Repeat,
    TidegateBuyAgain,
    TidegateMethod,
)
from tidegate.recs import RecsSettings  # noqa: E402

DEFAULT_DATA = _BENCH_DIR.parent.parent / "shared" / "data" / "online_retail.csv.gz"
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
    parser.add_argument("--markdown", action="store_true", help="also print the tables as markdown")
    args = parser.parse_args(argv)
    quick = args.quick
    plan = Plan(
        data=args.data,
        history_start=args.history_start or (date(2011, 8, 1) if quick else date(2010, 12, 1)),
        test_start=args.test_start or date(2011, 11, 9),
        test_end=args.test_end or (date(2011, 11, 23) if quick else date(2011, 12, 10)),
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
    for method in methods:
        if isinstance(method, DailyBatch):
            lines.append(f"{method.name}: {method.fits} fits, {method.fit_seconds:.1f} s fitting")
    lines.append(f"whole run {total_s:.0f} s; Python {platform.python_version()}, implicit "
                 f"{_version('implicit')}, numpy {_version('numpy')}, scipy {_version('scipy')}, "
                 f"{os.cpu_count()} cores")
    return "\n".join(lines)


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


def main(argv: list[str] | None = None) -> int:
    plan, as_markdown = parse_args(argv)
    console = Console(width=None if sys.stdout.isatty() else 160)
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
        print("\n```\n" + shlex.join([Path(sys.executable).name, *sys.argv]) + "\n```")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
