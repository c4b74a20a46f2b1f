"""What becomes of a job whose reservation a daily budget refused: dead now, or deferred for a
while, and why (`budget_outcome`)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, time, timedelta
from typing import Literal

from tidegate.costs import micros_to_usd
from tidegate.errors import BudgetExhausted

__all__ = [
    "BUDGET_DEFERRED_TOO_LONG",
    "BUDGET_EXCEEDS_LIMIT",
    "BUDGET_EXHAUSTED",
    "BudgetOutcome",
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


def budget_outcome(  # noqa: PLR0913 (outstanding, issue 27)
    refusal: BudgetExhausted,
    amount_micros: int,
    *,
    tenant: str,
    mode: str,
    defer_s: float,
    defer_max_s: float,
    created_at: datetime,
    deadline: datetime | None,
    now: datetime,
    caller_waits: bool = False,
) -> BudgetOutcome:
    """Decide, where the refusal is known, how a refused job ends or waits:

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
    owner = f"tenant {tenant!r}" if refusal.scope == "tenant" else "global"
    if amount_micros > refusal.limit_micros:
        return BudgetOutcome("dead", BUDGET_EXCEEDS_LIMIT, (
            f"the job's estimated cost of {micros_to_usd(amount_micros)} USD is more than the whole "
            f"{owner} daily budget of {micros_to_usd(refusal.limit_micros)} USD: it can never run "
            "(raise the budget, or ask for fewer max_tokens or a cheaper model)"))
    if mode == "reject" or caller_waits:
        return BudgetOutcome("dead", BUDGET_EXHAUSTED, f"budget exhausted: {refusal}")
    wait_s = min(defer_s, seconds_to_next_day(now))
    retry_at = now + timedelta(seconds=wait_s)
    if (retry_at - created_at).total_seconds() > defer_max_s:
        return BudgetOutcome("dead", BUDGET_DEFERRED_TOO_LONG, (
            f"budget exhausted: waited for budget longer than the {defer_max_s:g}s allowed: {refusal}"))
    if deadline is not None and retry_at >= deadline:
        return BudgetOutcome("dead", BUDGET_EXHAUSTED, (
            f"budget exhausted, and the job's deadline passes before budget may free up: {refusal}"))
    return BudgetOutcome("defer", BUDGET_EXHAUSTED, (
        f"deferred until {retry_at.isoformat(timespec='seconds')}: budget exhausted: {refusal}"), wait_s)
