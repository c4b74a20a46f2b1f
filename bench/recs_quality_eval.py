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
from datetime import date

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


def sample_customers(split: Split, size: int | None, seed: int) -> set[str]:
    """The test customers whose invoices are scored: all, or `size` of them drawn with `seed`."""
    customers = sorted({inv.customer for inv in split.test})
    if size is None or size >= len(customers):
        return set(customers)
    return set(random.Random(seed).sample(customers, size))


async def replay(split: Split, methods: Sequence[Method], sample: set[str], *, n: int = 10,
                 progress: Callable[[str], None] = lambda _: None) -> Outcome:
    """Feed the history, then walk the test period: ask every method, score, then feed."""
    started = time.perf_counter()
    bought: dict[str, set[str]] = defaultdict(set)
    last_day: dict[str, date] = {}
    for number, invoice in enumerate(split.history, 1):
        for method in methods:
            await method.feed(invoice)
        bought[invoice.customer].update(invoice.items)
        last_day[invoice.customer] = invoice.local_day
        if number % 2000 == 0:
            progress(f"history {number:,}/{len(split.history):,} invoices")
    scores = {(m.name, mode): Scores() for m in methods for mode in MODES}
    scored_customers: dict[str, set[str]] = {mode: set() for mode in MODES}
    follow_ups: dict[str, list[bool]] = {mode: [] for mode in MODES}
    flaws: dict[str, Counter[str]] = {m.name: Counter() for m in methods}
    cold = 0
    for number, invoice in enumerate(split.test, 1):
        for method in methods:
            await method.advance(invoice.at)
        earlier = bought.get(invoice.customer)
        if not earlier:
            cold += 1
        elif invoice.customer in sample:
            same_day = last_day.get(invoice.customer) == invoice.local_day
            scored_customers[ANY].add(invoice.customer)
            follow_ups[ANY].append(same_day)
            if any(code not in earlier for code in invoice.items):
                scored_customers[NEW].add(invoice.customer)
                follow_ups[NEW].append(same_day)
            for method in methods:
                await _ask(method, invoice, earlier, scores, flaws, n)
        for method in methods:
            await method.feed(invoice)
        bought[invoice.customer].update(invoice.items)
        last_day[invoice.customer] = invoice.local_day
        if number % 250 == 0:
            progress(f"test {number:,}/{len(split.test):,} invoices")
    known = {inv.customer for inv in split.test} & sample
    return Outcome(
        methods=[m.name for m in methods], scores=scores, seconds={m.name: m.seconds for m in methods},
        evaluated_invoices={mode: len(scores[(methods[0].name, mode)].hits) for mode in MODES},
        evaluated_customers={mode: len(found) for mode, found in scored_customers.items()},
        sampled_customers=len(known), test_customers=len({inv.customer for inv in split.test}),
        same_day=follow_ups, cold_invoices=cold, replay_seconds=time.perf_counter() - started,
        flaws={name: found for name, found in flaws.items() if found})


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
