"""What becomes of a job whose reservation a daily budget refused: dead now, or deferred for a
while, and why (`budget_outcome`)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, time, timedelta
from typing import Literal

from tidegate.config import BudgetConfig
from tidegate.costs import micros_to_usd
from tidegate.errors import BudgetExhausted

__all__ = [
    "BUDGET_DEFERRED_TOO_LONG",
    "BUDGET_EXCEEDS_LIMIT",
    "BUDGET_EXHAUSTED",
    "BudgetOutcome",
    "RefusedCall",
    "budget_outcome",
    "seconds_to_next_day",
]

# Why a job ended or waits because of a budget: the `code` of its failure, the reason of its
# deferral, the label of the metrics.
BUDGET_EXCEEDS_LIMIT = "budget_exceeds_limit"  # more than the whole daily limit: can never run
BUDGET_EXHAUSTED = "budget_exhausted"  # no room left today
BUDGET_DEFERRED_TOO_LONG = "budget_deferred_too_long"  # waited `defer_max_s` in all for budget


@dataclass(frozen=True, slots=True)
class BudgetOutcome:
    """What becomes of a job whose reservation a budget refused: it ends dead now, or it is
    deferred for `defer_s`, never silently — `reason` and `message` say why, for the job's
    record, the caller and the metrics."""

    action: Literal["dead", "defer"]
    reason: str  # one of the BUDGET_* codes above
    message: str
    defer_s: float = 0.0


def seconds_to_next_day(now: datetime) -> float:
    """Seconds until the next UTC midnight, when every daily budget starts afresh."""
    now = now.astimezone(UTC)
    midnight = datetime.combine(now.date() + timedelta(days=1), time(), tzinfo=UTC)
    return (midnight - now).total_seconds()


@dataclass(frozen=True, slots=True)
class RefusedCall:
    """The call a budget refused, as far as its end depends on it: a queued job, or a
    synchronous call at the gateway's door (created now, no deadline, its caller waiting)."""

    amount_micros: int  # its estimated cost
    tenant: str
    created_at: datetime
    deadline: datetime | None = None
    caller_waits: bool = False  # a synchronous caller waits for the answer


def budget_outcome(
    refusal: BudgetExhausted, call: RefusedCall, budgets: BudgetConfig, now: datetime
) -> BudgetOutcome:
    """Decide, where the refusal is known, how a refused job ends or waits, by the budgets'
    `on_exhausted` mode:

    - a job estimated above the refusing budget's whole daily limit can never fit: dead with
      `budget_exceeds_limit`, in every mode (waiting would defer it forever);
    - `reject`, or a job whose caller waits for the answer (a synchronous call, in every mode:
      its caller expects an answer now, not a job that runs and spends after it gave up): dead
      with `budget_exhausted`;
    - `defer` (and `step_down` once no cheaper model fits): back to the queue for `defer_s`,
      or until the next UTC midnight when that comes first (budgets reset then), with the reason
      recorded. Bounded: a job that would wait past `defer_max_s` since its creation, or past its
      own deadline, ends dead with the budget's reason instead of waiting on or expiring mutely.
    """
    owner = f"tenant {call.tenant!r}" if refusal.scope == "tenant" else "global"
    amount_micros = call.amount_micros
    if amount_micros > refusal.limit_micros:
        return BudgetOutcome("dead", BUDGET_EXCEEDS_LIMIT, (
            f"the job's estimated cost of {micros_to_usd(amount_micros)} USD is more than the whole "
            f"{owner} daily budget of {micros_to_usd(refusal.limit_micros)} USD: it can never run "
            "(raise the budget, or ask for fewer max_tokens or a cheaper model)"))
    if budgets.on_exhausted == "reject" or call.caller_waits:
        return BudgetOutcome("dead", BUDGET_EXHAUSTED, f"budget exhausted: {refusal}")
    wait_s = min(budgets.defer_s, seconds_to_next_day(now))
    retry_at = now + timedelta(seconds=wait_s)
    if (retry_at - call.created_at).total_seconds() > budgets.defer_max_s:
        return BudgetOutcome("dead", BUDGET_DEFERRED_TOO_LONG, (
            f"budget exhausted: waited for budget longer than the {budgets.defer_max_s:g}s allowed: "
            f"{refusal}"))
    if call.deadline is not None and retry_at >= call.deadline:
        return BudgetOutcome("dead", BUDGET_EXHAUSTED, (
            f"budget exhausted, and the job's deadline passes before budget may free up: {refusal}"))
    return BudgetOutcome("defer", BUDGET_EXHAUSTED, (
        f"deferred until {retry_at.isoformat(timespec='seconds')}: budget exhausted: {refusal}"), wait_s)
