"""The replay and its metrics: walk the purchases in time order, ask before feeding.

For each test invoice of a *known* customer (one with at least one earlier purchase in the replay)
who is in the evaluated sample, every method is asked, before the invoice is fed, for the
customer's top 10 twice:

- **any item**: nothing excluded; the invoice's items are all relevant (repeat purchases count,
  and in this wholesale-heavy data most lines are repeats);
- **new items**: the customer's earlier purchases excluded from the list; only the invoice's
  items the customer never bought before are relevant (invoices with none are not scored here).

hit@10 is 1 when any relevant item is in the list; NDCG@10 uses binary relevance over the
relevant items, normalised by the ideal list (min(relevant, 10) hits on top). Then every method
is fed the invoice, whether it was evaluated or not, so each learns all purchases.
"""

from __future__ import annotations

import math
import random
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence, Set
from dataclasses import dataclass, field
from datetime import date, datetime

import numpy as np

from bench.recs_quality_data import Invoice, Split
from bench.recs_quality_methods import Method

ANY, NEW = "any item", "new items"
MODES = (ANY, NEW)


def hit_and_ndcg(ranked: Sequence[str], relevant: Set[str], k: int = 10) -> tuple[float, float]:
    """hit@k and NDCG@k of one list against a set of relevant items (binary relevance)."""
    gains = [1.0 / math.log2(rank + 2) for rank, code in enumerate(ranked[:k]) if code in relevant]
    if not gains:
        return 0.0, 0.0
    ideal = sum(1.0 / math.log2(rank + 2) for rank in range(min(len(relevant), k)))
    return 1.0, sum(gains) / ideal


@dataclass(slots=True)
class Scores:
    """Per-invoice metrics of one method in one mode, in evaluation order (so paired)."""

    hits: list[float] = field(default_factory=list)
    ndcgs: list[float] = field(default_factory=list)

    def add(self, hit: float, ndcg: float) -> None:
        self.hits.append(hit)
        self.ndcgs.append(ndcg)


@dataclass(slots=True)
class Outcome:
    """What one replay measured."""

    methods: list[str]
    scores: dict[tuple[str, str], Scores]  # (method, mode) → per-invoice scores
    seconds: dict[str, float]  # method → wall time inside it
    evaluated_invoices: dict[str, int]  # mode → invoices scored
    evaluated_customers: dict[str, int]  # mode → distinct customers scored
    # mode → per scored invoice: did the customer buy earlier the same day (after the nightly fit)?
    same_day: dict[str, list[bool]]
    sampled_customers: int  # known customers of the test period in the sample
    test_customers: int  # distinct customers with a test invoice
    cold_invoices: int  # test invoices of customers with no earlier purchase (not scored)
    replay_seconds: float
    flaws: dict[str, Counter[str]] = field(default_factory=dict)  # method → rule broken → lists


def sample_customers(split: Split | Sequence[Invoice], size: int | None, seed: int) -> set[str]:
    """The test customers whose invoices are scored (those of a split's test period, or of the
    invoices given): all, or `size` of them drawn with `seed`."""
    invoices = split.test if isinstance(split, Split) else split
    customers = sorted({inv.customer for inv in invoices})
    if size is None or size >= len(customers):
        return set(customers)
    return set(random.Random(seed).sample(customers, size))


async def replay(split: Split, methods: Sequence[Method], sample: set[str], *, n: int = 10,
                 progress: Callable[[str], None] = lambda _: None) -> Outcome:
    """Feed the history, then walk the test period: ask every method, score, then feed."""
    window = Window(split.test_start, split.test_end, sample)
    return (await replay_windows(split.history, split.test, [window], methods, n=n, progress=progress))[0]


@dataclass(frozen=True, slots=True)
class Window:
    """A scored stretch of the replay, [start, end), and the customers scored in it."""

    start: datetime
    end: datetime
    sample: set[str]


@dataclass(slots=True)
class _Tally:
    """What is counted while one window is scored."""

    scores: dict[tuple[str, str], Scores]
    customers: dict[str, set[str]]
    follow_ups: dict[str, list[bool]]
    flaws: dict[str, Counter[str]]
    seconds_before: dict[str, float] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    cold: int = 0
    wall_before: float = 0.0
    wall: float = 0.0


async def replay_windows(history: Sequence[Invoice], test: Sequence[Invoice], windows: Sequence[Window],
                         methods: Sequence[Method], *, n: int = 10,
                         progress: Callable[[str], None] = lambda _: None) -> list[Outcome]:
    """Feed the history, then walk `test` in time order: inside a window, ask every method and
    score before feeding; outside, only feed. So each window is scored with all the purchases
    before it learnt, exactly as a replay whose test period is that window alone. The clock of
    the methods is advanced only inside windows (a daily batch refits on the first query of a
    day: outside a window nobody asks). One Outcome per window, in the order given."""
    started = time.perf_counter()
    bought: dict[str, set[str]] = defaultdict(set)
    last_day: dict[str, date] = {}
    for number, invoice in enumerate(history, 1):
        for method in methods:
            await method.feed(invoice)
        bought[invoice.customer].update(invoice.items)
        last_day[invoice.customer] = invoice.local_day
        if number % 2000 == 0:
            progress(f"history {number:,}/{len(history):,} invoices")
    tallies = [_Tally(scores={(m.name, mode): Scores() for m in methods for mode in MODES},
                      customers={mode: set() for mode in MODES}, follow_ups={mode: [] for mode in MODES},
                      flaws={m.name: Counter() for m in methods}) for _ in windows]
    current: int | None = None
    for number, invoice in enumerate(test, 1):
        inside = next((i for i, w in enumerate(windows) if w.start <= invoice.at < w.end), None)
        if inside != current:
            if current is not None:
                _close(tallies[current], methods)
            if inside is not None:
                tallies[inside].seconds_before = {m.name: m.seconds for m in methods}
                tallies[inside].wall_before = time.perf_counter()
            current = inside
        if inside is not None:
            tally, window = tallies[inside], windows[inside]
            for method in methods:
                await method.advance(invoice.at)
            earlier = bought.get(invoice.customer)
            if not earlier:
                tally.cold += 1
            elif invoice.customer in window.sample:
                same_day = last_day.get(invoice.customer) == invoice.local_day
                tally.customers[ANY].add(invoice.customer)
                tally.follow_ups[ANY].append(same_day)
                if any(code not in earlier for code in invoice.items):
                    tally.customers[NEW].add(invoice.customer)
                    tally.follow_ups[NEW].append(same_day)
                for method in methods:
                    await _ask(method, invoice, earlier, tally.scores, tally.flaws, n)
        for method in methods:
            await method.feed(invoice)
        bought[invoice.customer].update(invoice.items)
        last_day[invoice.customer] = invoice.local_day
        if number % 250 == 0:
            progress(f"test {number:,}/{len(test):,} invoices")
    if current is not None:
        _close(tallies[current], methods)
    outcomes = []
    for tally, window in zip(tallies, windows, strict=True):
        inside_window = [inv for inv in test if window.start <= inv.at < window.end]
        customers = {inv.customer for inv in inside_window}
        outcomes.append(Outcome(
            methods=[m.name for m in methods], scores=tally.scores,
            # One window: the whole replay's time, history included (as the table has always said).
            seconds={m.name: m.seconds if len(windows) == 1 else tally.seconds.get(m.name, 0.0)
                     for m in methods},
            evaluated_invoices={mode: len(tally.scores[(methods[0].name, mode)].hits) for mode in MODES},
            evaluated_customers={mode: len(found) for mode, found in tally.customers.items()},
            sampled_customers=len(customers & window.sample), test_customers=len(customers),
            same_day=tally.follow_ups, cold_invoices=tally.cold,
            replay_seconds=tally.wall if len(windows) > 1 else time.perf_counter() - started,
            flaws={name: found for name, found in tally.flaws.items() if found}))
    return outcomes


def _close(tally: _Tally, methods: Sequence[Method]) -> None:
    """A window's stretch of the replay ended: add the time the methods spent in it."""
    for method in methods:
        tally.seconds[method.name] = (tally.seconds.get(method.name, 0.0)
                                      + method.seconds - tally.seconds_before[method.name])
    tally.wall += time.perf_counter() - tally.wall_before


def pooled(outcomes: Sequence[Outcome]) -> Outcome:
    """The outcomes of several windows as one: every scored invoice of every window, each
    weighing the same (so the paired differences pool over all of them)."""
    first = outcomes[0]
    scores = {key: Scores([v for o in outcomes for v in o.scores[key].hits],
                          [v for o in outcomes for v in o.scores[key].ndcgs]) for key in first.scores}
    flaws: dict[str, Counter[str]] = defaultdict(Counter)
    for outcome in outcomes:
        for name, found in outcome.flaws.items():
            flaws[name].update(found)
    return Outcome(
        methods=first.methods, scores=scores,
        seconds={name: sum(o.seconds[name] for o in outcomes) for name in first.methods},
        evaluated_invoices={mode: sum(o.evaluated_invoices[mode] for o in outcomes) for mode in MODES},
        evaluated_customers={mode: sum(o.evaluated_customers[mode] for o in outcomes) for mode in MODES},
        same_day={mode: [v for o in outcomes for v in o.same_day[mode]] for mode in MODES},
        sampled_customers=sum(o.sampled_customers for o in outcomes),
        test_customers=sum(o.test_customers for o in outcomes),
        cold_invoices=sum(o.cold_invoices for o in outcomes),
        replay_seconds=sum(o.replay_seconds for o in outcomes), flaws=dict(flaws))


async def _ask(method: Method, invoice: Invoice, earlier: set[str], scores: dict[tuple[str, str], Scores],
               flaws: dict[str, Counter[str]], n: int) -> None:
    ranked = await method.top(invoice.customer, n, frozenset())
    _check(ranked, frozenset(), n, flaws[method.name])
    scores[(method.name, ANY)].add(*hit_and_ndcg(ranked, set(invoice.items), n))
    new = {code for code in invoice.items if code not in earlier}
    if new:
        ranked = await method.top(invoice.customer, n, earlier)
        _check(ranked, earlier, n, flaws[method.name])
        scores[(method.name, NEW)].add(*hit_and_ndcg(ranked, new, n))


def _check(ranked: Sequence[str], excluded: Set[str], n: int, flaws: Counter[str]) -> None:
    """Count lists that break the rules; they are scored as they are (an excluded item is never
    relevant in the new-items mode), and the report names the count."""
    if len(ranked) < n:
        flaws[f"lists shorter than {n}"] += 1
    if len(set(ranked)) != len(ranked):
        flaws["lists with a repeated item"] += 1
    if any(code in excluded for code in ranked):
        flaws["new-item lists with an already bought item"] += 1


def mean_ci(values: Sequence[float]) -> tuple[float, float]:
    """The mean and the half-width of its normal 95 % confidence interval."""
    if not values:
        return math.nan, math.nan
    array = np.asarray(values)
    half = 1.96 * float(array.std(ddof=1)) / math.sqrt(len(array)) if len(array) > 1 else math.nan
    return float(array.mean()), half


def paired_difference(a: Sequence[float], b: Sequence[float]) -> tuple[float, float]:
    """Mean of a - b over the same invoices, with its 95 % confidence half-width."""
    return mean_ci([x - y for x, y in zip(a, b, strict=True)])
