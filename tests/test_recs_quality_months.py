"""The month splitting and the windowed replay of bench/recs_quality (tiny synthetic data)."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Set
from datetime import UTC, date, datetime, timedelta

import pytest
from bench.common import BenchmarkError
from bench.recs_quality_data import Invoice, Month, Split, last_months, months_back
from bench.recs_quality_eval import ANY, Window, pooled, replay, replay_windows

from tidegate.recs import Item


def test_months_back_clips_to_the_end_of_the_month() -> None:
    assert months_back(date(2011, 11, 9), 1) == date(2011, 10, 9)
    assert months_back(date(2011, 1, 9), 1) == date(2010, 12, 9)
    assert months_back(date(2011, 3, 31), 1) == date(2011, 2, 28)
    assert months_back(date(2011, 12, 10), 12) == date(2010, 12, 10)


def test_the_last_months_are_contiguous_and_end_where_the_last_one_ends() -> None:
    months = last_months(date(2011, 11, 9), date(2011, 12, 10), 3)
    assert months == [Month(date(2011, 9, 9), date(2011, 10, 9)), Month(date(2011, 10, 9), date(2011, 11, 9)),
                      Month(date(2011, 11, 9), date(2011, 12, 10))]
    for earlier, later in itertools.pairwise(months):
        assert earlier.end <= later.start
    assert months[0].label == "2011-09-09 … 2011-10-08"


def test_a_skipped_month_is_never_a_test_month() -> None:
    validation = (date(2011, 10, 9), date(2011, 11, 9))
    months = last_months(date(2011, 11, 9), date(2011, 12, 10), 3, skip=[validation])
    assert [m.start for m in months] == [date(2011, 8, 9), date(2011, 9, 9), date(2011, 11, 9)]
    assert all(not (m.start < validation[1] and validation[0] < m.end) for m in months)
    # only the last month comes after the validation month
    assert [m for m in months if m.start >= validation[1]] == [months[-1]]


def test_short_months_keep_their_length_and_months_stop_at_the_data_start() -> None:
    months = last_months(date(2011, 11, 9), date(2011, 11, 23), 2)
    assert months == [Month(date(2011, 10, 9), date(2011, 10, 23)),
                      Month(date(2011, 11, 9), date(2011, 11, 23))]
    assert len(last_months(date(2011, 2, 9), date(2011, 3, 9), 5, first_day=date(2010, 12, 1))) == 3
    with pytest.raises(BenchmarkError):
        last_months(date(2011, 2, 9), date(2011, 3, 9), 0)


class _Echo:
    """Recommends the items of the last invoice it was fed (a method that learns at once)."""

    def __init__(self) -> None:
        self.name = "echo"
        self.seconds = 0.0
        self.last: tuple[str, ...] = ()
        self.days: list[date] = []

    async def start(self, catalogue: dict[str, Item]) -> None:
        return None

    async def feed(self, invoice: Invoice) -> None:
        self.last = invoice.items

    async def advance(self, now: datetime) -> None:
        if not self.days or self.days[-1] != now.date():
            self.days.append(now.date())

    async def top(self, customer: str, n: int, exclude: Set[str]) -> list[str]:
        return [code for code in self.last if code not in exclude][:n]

    async def close(self) -> None:
        return None


def _invoice(number: int, customer: str, day: int, *items: str) -> Invoice:
    at = datetime(2011, 1, 1, 12, tzinfo=UTC) + timedelta(days=day)
    return Invoice(f"{number}", customer, at, items, tuple(1 for _ in items))


def _at(day: int) -> datetime:
    return datetime(2011, 1, 1, tzinfo=UTC) + timedelta(days=day)


def test_each_window_is_scored_as_a_replay_of_that_window_alone() -> None:
    invoices = [_invoice(1, "a", 0, "x"), _invoice(2, "a", 1, "x"), _invoice(3, "b", 2, "y"),
                _invoice(4, "a", 3, "y"), _invoice(5, "b", 4, "y"), _invoice(6, "a", 5, "z")]
    windows = [Window(_at(1), _at(2), {"a", "b"}), Window(_at(4), _at(6), {"a", "b"})]
    echo = _Echo()
    outcomes = asyncio.run(replay_windows(invoices[:1], invoices[1:], windows, [echo]))
    assert [o.evaluated_invoices[ANY] for o in outcomes] == [1, 2]
    assert outcomes[0].scores[("echo", ANY)].hits == [1.0]  # x after x
    assert outcomes[1].scores[("echo", ANY)].hits == [1.0, 0.0]  # y after y, then z after y
    assert echo.days == [_at(1).date(), _at(4).date(), _at(5).date()]  # no clock outside the windows
    # the second window alone, after all the history before it, scores the same
    alone = asyncio.run(replay(Split(tuple(invoices[:4]), tuple(invoices[4:]), _at(0), _at(4), _at(6)),
                               [_Echo()], {"a", "b"}))
    assert alone.scores == outcomes[1].scores
    mean = pooled(outcomes)
    assert mean.scores[("echo", ANY)].hits == [1.0, 1.0, 0.0]
    assert mean.evaluated_invoices[ANY] == 3
