"""The budget ledger contract over SQLite, Redis and Redis Cluster (atomic reservations, settle,
release, scopes, UTC days, retention), and the money and token arithmetic of dispatch.costs."""

from __future__ import annotations

import asyncio
import sqlite3
import uuid
from collections.abc import AsyncIterator
from datetime import date, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from support.redis_keys import REDIS_BACKENDS, delete_keys, redis_client, redis_url_of
from tidegate.ai import Usage
from tidegate.config import ModelConfig
from tidegate.contract import RequestBody, decode
from tidegate.coord.budget import (
    GLOBAL,
    KEEP_DAYS,
    BudgetExhausted,
    BudgetLedger,
    RedisBudgetLedger,
    SqliteBudgetLedger,
    budget_ledger_for,
)
from tidegate.costs import (
    DEFAULT_MAX_OUTPUT_TOKENS,
    IMAGE_TOKENS,
    cost_micros,
    estimate_cost_micros,
    estimate_input_tokens,
    estimate_output_tokens,
    micros_to_usd,
    usd_to_micros,
)
from tidegate.errors import DispatchClosed

DAY = date(2025, 3, 14)


class Clock:
    """An injectable `today()` the test moves by hand."""

    def __init__(self) -> None:
        self.day = DAY

    def __call__(self) -> date:
        return self.day


class Ledgers:
    """Opens ledger instances sharing one test's storage, as separate processes would."""

    def __init__(self, backend: str, location: str, name: str) -> None:
        self.backend = backend
        self.location = location  # SQLite file path or Redis URL
        self.name = name
        self.clock = Clock()
        self._opened: list[BudgetLedger] = []

    def open(self) -> BudgetLedger:
        """A new ledger instance on the shared storage, following `self.clock`."""
        ledger: BudgetLedger
        if self.backend == "sqlite":
            ledger = SqliteBudgetLedger(self.location, self.name, today=self.clock)
        else:
            ledger = RedisBudgetLedger(self.location, self.name, today=self.clock)
        self._opened.append(ledger)
        return ledger

    async def aclose(self) -> None:
        """Close every ledger opened here."""
        for ledger in self._opened:
            await ledger.close()


@pytest.fixture(params=["sqlite", *REDIS_BACKENDS])
async def ledgers(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Ledgers]:
    """A Ledgers factory for each backend."""
    name = f"t{uuid.uuid4().hex[:12]}"
    if request.param == "sqlite":
        factory = Ledgers("sqlite", str(tmp_path / "budget.db"), name)
    else:
        factory = Ledgers(request.param, redis_url_of(request, request.param), name)
    yield factory
    await factory.aclose()
    if factory.backend in REDIS_BACKENDS:
        await delete_keys(factory.location, f"*{name}*")


@pytest.fixture
def ledger(ledgers: Ledgers) -> BudgetLedger:
    """One ledger instance."""
    return ledgers.open()


async def _reserve_all(
    ledger: BudgetLedger, tenants: list[str], amount: int, *, tenant_limit: int | None,
    global_limit: int | None,
) -> tuple[int, list[BudgetExhausted]]:
    """Reserve `amount` for each tenant at once; (how many were admitted, the refusals)."""
    results = await asyncio.gather(
        *(ledger.reserve(t, amount, tenant_limit_micros=tenant_limit, global_limit_micros=global_limit)
          for t in tenants),
        return_exceptions=True,
    )
    refused = [r for r in results if isinstance(r, BudgetExhausted)]
    assert len(refused) + sum(1 for r in results if not isinstance(r, BaseException)) == len(results), results
    return len(results) - len(refused), refused


# ---------------------------------------------------------------------- reservations


async def test_concurrent_reservations_never_overspend(ledger: BudgetLedger) -> None:
    # 50 reservations of 700 against 10_000: exactly 14 fit
    admitted, refused = await _reserve_all(ledger, ["acme"] * 50, 700, tenant_limit=10_000, global_limit=None)

    assert admitted == 14
    assert {error.scope for error in refused} == {"tenant"}
    assert (await ledger.spend_today()) == {"acme": 9_800, GLOBAL: 9_800}


async def test_concurrent_reservations_from_two_instances_never_overspend(ledgers: Ledgers) -> None:
    one, two = ledgers.open(), ledgers.open()
    tenants = [f"tenant-{i % 5}" for i in range(25)]
    (first, _), (second, _) = await asyncio.gather(
        _reserve_all(one, tenants, 700, tenant_limit=None, global_limit=10_000),
        _reserve_all(two, tenants, 700, tenant_limit=None, global_limit=10_000),
    )

    assert first + second == 14
    spend = await one.spend_today()
    assert spend[GLOBAL] == 9_800 == sum(v for k, v in spend.items() if k != GLOBAL)


async def test_exhaustion_names_its_scope_and_changes_nothing(ledger: BudgetLedger) -> None:
    await ledger.reserve("acme", 800, tenant_limit_micros=1_000, global_limit_micros=5_000)
    await ledger.reserve("other", 3_000, tenant_limit_micros=None, global_limit_micros=5_000)

    with pytest.raises(BudgetExhausted) as tenant_error:
        await ledger.reserve("acme", 300, tenant_limit_micros=1_000, global_limit_micros=5_000)
    assert (tenant_error.value.scope, tenant_error.value.remaining_micros,
            tenant_error.value.limit_micros) == ("tenant", 200, 1_000)
    assert "acme" in str(tenant_error.value)

    with pytest.raises(BudgetExhausted) as global_error:
        await ledger.reserve("third", 1_500, tenant_limit_micros=None, global_limit_micros=5_000)
    assert (global_error.value.scope, global_error.value.remaining_micros,
            global_error.value.limit_micros) == ("global", 1_200, 5_000)

    assert await ledger.spend_today() == {"acme": 800, "other": 3_000, GLOBAL: 3_800}


async def test_critical_reservations_are_recorded_without_checking(ledger: BudgetLedger) -> None:
    await ledger.reserve("acme", 900, tenant_limit_micros=1_000, global_limit_micros=1_000)
    reservation = await ledger.reserve("acme", 500, tenant_limit_micros=1_000, global_limit_micros=1_000,
                                       enforce=False)

    assert not reservation.enforced
    status = await ledger.status("acme", tenant_limit_micros=1_000, global_limit_micros=1_000)
    assert status.tenant_spent_micros == 1_400
    assert status.remaining_micros == 0 and status.fraction_left == 0.0


async def test_invalid_reservations_are_refused(ledger: BudgetLedger) -> None:
    with pytest.raises(ValueError, match="tenant"):
        await ledger.reserve(GLOBAL, 1, tenant_limit_micros=None, global_limit_micros=None)
    with pytest.raises(ValueError, match="amount_micros"):
        await ledger.reserve("acme", -1, tenant_limit_micros=None, global_limit_micros=None)
    reservation = await ledger.reserve("acme", 1, tenant_limit_micros=None, global_limit_micros=None)
    with pytest.raises(ValueError, match="actual_micros"):
        await ledger.settle(reservation, -5)


# ---------------------------------------------------------------------- settle and release


async def test_settle_replaces_the_estimate_with_the_actual_cost(ledger: BudgetLedger) -> None:
    lower = await ledger.reserve("acme", 1_000, tenant_limit_micros=None, global_limit_micros=None)
    higher = await ledger.reserve("acme", 1_000, tenant_limit_micros=None, global_limit_micros=None)

    await ledger.settle(lower, 400)
    assert (await ledger.spend_today())["acme"] == 1_400
    await ledger.settle(higher, 1_700)
    assert await ledger.spend_today() == {"acme": 2_100, GLOBAL: 2_100}


async def test_settle_is_idempotent(ledgers: Ledgers) -> None:
    ledger = ledgers.open()
    reservation = await ledger.reserve("acme", 1_000, tenant_limit_micros=None, global_limit_micros=None)

    await ledger.settle(reservation, 300)
    await ledger.settle(reservation, 300)
    await ledger.settle(reservation, 5_000)
    await ledgers.open().settle(reservation, 9_000)  # another process settling it again
    await ledger.release(reservation)

    assert await ledger.spend_today() == {"acme": 300, GLOBAL: 300}


async def test_release_gives_the_reservation_back(ledger: BudgetLedger) -> None:
    await ledger.reserve("acme", 600, tenant_limit_micros=1_000, global_limit_micros=None)
    reservation = await ledger.reserve("acme", 400, tenant_limit_micros=1_000, global_limit_micros=None)

    await ledger.release(reservation)
    await ledger.release(reservation)

    assert (await ledger.spend_today())["acme"] == 600
    await ledger.reserve("acme", 400, tenant_limit_micros=1_000, global_limit_micros=None)


async def test_record_adds_a_cost_without_a_reservation(ledgers: Ledgers) -> None:
    ledger = ledgers.open()
    await ledger.reserve("acme", 600, tenant_limit_micros=None, global_limit_micros=None)

    await ledger.record("acme", 250)
    await ledgers.open().record("globex", 100)  # another process
    await ledger.record("acme", 0)

    assert await ledger.spend_today() == {"acme": 850, "globex": 100, GLOBAL: 950}
    status = await ledger.status("acme", tenant_limit_micros=1_000, global_limit_micros=None)
    assert status.remaining_micros == 150
    ledgers.clock.day += timedelta(days=1)
    await ledger.record("acme", 5)
    assert await ledger.spend_today() == {"acme": 5, GLOBAL: 5}
    with pytest.raises(ValueError, match="tenant"):
        await ledger.record(GLOBAL, 1)
    with pytest.raises(ValueError, match="amount_micros"):
        await ledger.record("acme", -1)


# ---------------------------------------------------------------------- days and status


async def test_days_roll_over_at_utc_midnight(ledgers: Ledgers) -> None:
    ledger = ledgers.open()
    # Given a tenant that spent its whole budget on one day
    yesterday = await ledger.reserve("acme", 1_000, tenant_limit_micros=1_000, global_limit_micros=None)
    with pytest.raises(BudgetExhausted):
        await ledger.reserve("acme", 1, tenant_limit_micros=1_000, global_limit_micros=None)

    # When the next UTC day starts
    ledgers.clock.day = DAY + timedelta(days=1)

    # Then its budget is whole again, and a late settlement lands on the reservation's own day
    await ledger.reserve("acme", 700, tenant_limit_micros=1_000, global_limit_micros=None)
    await ledger.settle(yesterday, 250)
    assert await ledger.spend_today() == {"acme": 700, GLOBAL: 700}
    ledgers.clock.day = DAY
    assert await ledger.spend_today() == {"acme": 250, GLOBAL: 250}


async def test_status_reports_the_tighter_budget(ledger: BudgetLedger) -> None:
    await ledger.reserve("acme", 600, tenant_limit_micros=None, global_limit_micros=None)
    await ledger.reserve("other", 2_000, tenant_limit_micros=None, global_limit_micros=None)

    status = await ledger.status("acme", tenant_limit_micros=1_000, global_limit_micros=10_000)

    assert (status.tenant_spent_micros, status.global_spent_micros) == (600, 2_600)
    assert (status.tenant_remaining_micros, status.global_remaining_micros) == (400, 7_400)
    assert status.remaining_micros == 400
    assert status.fraction_left == pytest.approx(0.4)
    assert status.day == DAY
    unlimited = await ledger.status("nobody", tenant_limit_micros=None, global_limit_micros=None)
    assert unlimited.fraction_left is None and unlimited.remaining_micros is None
    assert unlimited.tenant_spent_micros == 0


async def test_a_closed_ledger_refuses_use(ledger: BudgetLedger) -> None:
    await ledger.close()
    await ledger.close()
    with pytest.raises(DispatchClosed):
        await ledger.spend_today()


@pytest.mark.sqlite_only
async def test_sqlite_forgets_days_past_retention(tmp_path: Path) -> None:
    path = tmp_path / "budget.db"
    clock = Clock()
    async with SqliteBudgetLedger(str(path), today=clock) as ledger:
        await ledger.reserve("acme", 100, tenant_limit_micros=None, global_limit_micros=None)
        clock.day = DAY + timedelta(days=KEEP_DAYS + 1)
        await ledger.reserve("acme", 100, tenant_limit_micros=None, global_limit_micros=None)

    with sqlite3.connect(path) as conn:
        days = {row[0] for row in conn.execute("SELECT day FROM budget_spend")}
        pending = {row[0] for row in conn.execute("SELECT day FROM budget_pending")}
    assert days == pending == {clock.day.isoformat()}


@pytest.mark.redis_only
async def test_redis_day_keys_expire(redis_url: str) -> None:
    name = f"t{uuid.uuid4().hex[:12]}"
    async with RedisBudgetLedger(redis_url, name, today=Clock()) as ledger:
        await ledger.reserve("acme", 100, tenant_limit_micros=None, global_limit_micros=None)
    client = redis_client(redis_url)
    try:
        for suffix in ("spend", "pending"):
            ttl = await client.ttl(f"tidegate:{{{name}}}:budget:{DAY.isoformat()}:{suffix}")
            assert 0 < ttl <= KEEP_DAYS * 86_400
    finally:
        await client.aclose()
        await delete_keys(redis_url, f"*{name}*")


async def test_the_factory_follows_the_queue_url(tmp_path: Path) -> None:
    local = budget_ledger_for(f"sqlite:///{tmp_path / 'queue.db'}")
    shared = budget_ledger_for("redis://127.0.0.1:1/0", "jobs")
    named = budget_ledger_for("redis://127.0.0.1:1/0?name=team-a")
    try:
        assert isinstance(local, SqliteBudgetLedger) and local.path == str(tmp_path / "queue.db")
        assert local.name == "default"
        assert isinstance(shared, RedisBudgetLedger) and shared.name == "jobs"
        # Queues sharing one server never share their spend: the ledger takes the queue's name.
        assert isinstance(named, RedisBudgetLedger) and named.name == "team-a"
    finally:
        await local.close()
        await shared.close()
        await named.close()


# ---------------------------------------------------------------------- costs

MODEL = ModelConfig(name="m", input_usd_per_1m=Decimal("2.00"), output_usd_per_1m=Decimal("8.00"))


def typed(kind: str, body: dict[str, Any]) -> RequestBody:
    """The typed request of `body` (its model "auto")."""
    return decode(kind, {"model": "auto", **body})


def test_cost_is_exact_and_rounds_up_to_a_micro() -> None:
    assert cost_micros(MODEL, Usage(1_000_000, 0)) == 2_000_000
    assert cost_micros(MODEL, Usage(1_000, 500)) == 2_000 + 4_000
    cheap = ModelConfig(name="c", input_usd_per_1m=Decimal("0.28"), output_usd_per_1m=Decimal("0.42"))
    assert cost_micros(cheap, Usage(1, 0)) == 1  # 0.28 micros bills as one
    assert cost_micros(cheap, Usage(100, 100)) == 70
    with pytest.raises(ValueError):
        cost_micros(MODEL, Usage(-1, 0))


def test_usd_and_micros_convert_exactly() -> None:
    assert usd_to_micros(Decimal("12.50")) == 12_500_000
    assert usd_to_micros(3) == 3_000_000
    assert usd_to_micros(Decimal("0.0000001")) == 1
    assert micros_to_usd(1_500) == Decimal("0.001500")
    assert micros_to_usd(usd_to_micros(Decimal("7.654321"))) == Decimal("7.654321")
    with pytest.raises(TypeError):
        usd_to_micros(0.1)  # type: ignore[arg-type]


def test_chat_input_estimate() -> None:
    body = {"messages": [
        {"role": "system", "content": "You are terse."},  # 14 chars → 4
        {"role": "user", "name": "ann", "content": [  # name 3 chars → 1 + 1
            {"type": "text", "text": "What is in this picture?"},  # 24 → 6
            {"type": "image_url", "image_url": {"url": "https://example.org/cat.png"}},
        ]},
    ]}
    assert estimate_input_tokens(typed("chat", body)) == (4 + 4) + (4 + 2 + 6 + IMAGE_TOKENS) + 3
    # Non-ASCII text counts a token per character, where length / 4 would undercount CJK
    japanese = {"messages": [{"role": "user", "content": "日本語です"}]}
    assert estimate_input_tokens(typed("chat", japanese)) == 4 + 5 + 3


def test_embeddings_input_estimate() -> None:
    assert estimate_input_tokens(typed("embeddings", {"input": "a" * 10})) == 3
    assert estimate_input_tokens(typed("embeddings", {"input": ["abcd", "abcde"]})) == 1 + 2
    assert estimate_input_tokens(typed("embeddings", {"input": [101, 102, 103]})) == 3
    assert estimate_input_tokens(typed("embeddings", {"input": [[1, 2], [3, 4, 5]]})) == 5


def test_cost_estimate_includes_the_most_output_the_request_allows() -> None:
    body = {"messages": [{"role": "user", "content": "abcd"}], "max_tokens": 100}
    assert estimate_output_tokens(typed("chat", body)) == 100
    assert estimate_output_tokens(typed("chat", {**body, "max_completion_tokens": 50, "n": 2})) == 100
    assert estimate_output_tokens(typed("chat", {"messages": body["messages"]})) == DEFAULT_MAX_OUTPUT_TOKENS
    assert estimate_output_tokens(typed("embeddings", {"input": "x", "max_tokens": 9})) == 0
    assert estimate_cost_micros(MODEL, typed("chat", body)) == cost_micros(MODEL, Usage(4 + 1 + 3, 100))
