"""Daily budgets per tenant and in total, shared by every worker (`BudgetLedger`: in the queue's
SQLite file or on its Redis server, picked by `budget_ledger_for(queue_url)`), and what becomes
of a job a budget refuses (`budget_outcome`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tidegate.coord._store import imported_when_named
from tidegate.coord.budget.base import (
    GLOBAL,
    KEEP_DAYS,
    BudgetLedger,
    BudgetStatus,
    Reservation,
    budget_ledger_for,
    utc_today,
)
from tidegate.coord.budget.outcomes import (
    BUDGET_DEFERRED_TOO_LONG,
    BUDGET_EXCEEDS_LIMIT,
    BUDGET_EXHAUSTED,
    BudgetOutcome,
    RefusedCall,
    budget_outcome,
    seconds_to_next_day,
)
from tidegate.coord.budget.sqlite import SqliteBudgetLedger
from tidegate.errors import BudgetExhausted

if TYPE_CHECKING:
    from tidegate.coord.budget.redis import RedisBudgetLedger

__all__ = [
    "BUDGET_DEFERRED_TOO_LONG",
    "BUDGET_EXCEEDS_LIMIT",
    "BUDGET_EXHAUSTED",
    "GLOBAL",
    "KEEP_DAYS",
    "BudgetExhausted",
    "BudgetLedger",
    "BudgetOutcome",
    "BudgetStatus",
    "RedisBudgetLedger",
    "RefusedCall",
    "Reservation",
    "SqliteBudgetLedger",
    "budget_ledger_for",
    "budget_outcome",
    "seconds_to_next_day",
    "utc_today",
]

__getattr__ = imported_when_named(__name__, {"RedisBudgetLedger": "tidegate.coord.budget.redis"})
