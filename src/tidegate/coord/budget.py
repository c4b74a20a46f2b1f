"""Daily budgets, reserved atomically before a call and settled to its real cost afterwards.

A reservation checks the tenant's and the global spent-or-reserved total of the current UTC day
against their limits and adds the amount to both in one atomic step (a Lua script on Redis, a
`BEGIN IMMEDIATE` transaction on SQLite), so any number of workers in any number of processes
never admit more than a limit together. `settle` swaps the reserved amount for the actual cost
on the reservation's own day, once: the ledger keeps the reservation as pending until it is
settled, and a second settle finds nothing pending and changes nothing. A reservation that is
never settled (its worker died) stays counted, which errs on the side of spending less.

Days are UTC dates taken from `today()` (injectable for tests); a day's records expire after
KEEP_DAYS, so nothing grows without bound. Money is integer micro-dollars.
"""

from __future__ import annotations

import sqlite3
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from types import TracebackType
from typing import Literal, Protocol, Self, TypeVar
from urllib.parse import parse_qsl, urlsplit

from tidegate._sqlite import SqliteThread
from tidegate.coord._store import RedisStore, backend_of, without_query
from tidegate.costs import micros_to_usd
from tidegate.errors import BudgetExhausted, BudgetScope, DispatchClosed, DispatchUnavailable
from tidegate.queue.base import _sqlite_path

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
    "Reservation",
    "SqliteBudgetLedger",
    "budget_ledger_for",
    "budget_outcome",
    "seconds_to_next_day",
    "utc_today",
]

GLOBAL = "*"  # the global total's entry in spend_today(); no tenant may use this name
KEEP_DAYS = 3  # today, yesterday for reports, and a day of slack for late settlements
_KEEP_S = KEEP_DAYS * 86_400

T = TypeVar("T")
Today = Callable[[], date]


def utc_today() -> date:
    """The current UTC date: budgets reset at midnight UTC."""
    return datetime.now(UTC).date()


@dataclass(frozen=True, slots=True)
class Reservation:
    """Budget held for one call until it is settled or released. It carries its day, so a call
    that straddles midnight is settled against the day it was reserved on."""

    id: str
    tenant: str
    amount_micros: int
    day: date
    enforced: bool = True  # False: recorded without checking the limits (critical jobs)


@dataclass(frozen=True, slots=True)
class BudgetStatus:
    """A tenant's and the global budget today. Spent includes what is reserved and unsettled;
    a limit of None is unlimited."""

    tenant: str
    day: date
    tenant_spent_micros: int
    global_spent_micros: int
    tenant_limit_micros: int | None
    global_limit_micros: int | None

    @property
    def tenant_remaining_micros(self) -> int | None:
        """What the tenant may still reserve today (None: unlimited)."""
        return _remaining(self.tenant_limit_micros, self.tenant_spent_micros)

    @property
    def global_remaining_micros(self) -> int | None:
        """What anyone may still reserve today (None: unlimited)."""
        return _remaining(self.global_limit_micros, self.global_spent_micros)

    @property
    def remaining_micros(self) -> int | None:
        """The tighter of the two remainders (None: both unlimited)."""
        left = [r for r in (self.tenant_remaining_micros, self.global_remaining_micros) if r is not None]
        return min(left) if left else None

    @property
    def fraction_left(self) -> float | None:
        """The share left of the tighter budget, 0.0-1.0 (None: both unlimited); what the router
        compares with `routing.low_budget_fraction`."""
        fractions = [
            (remaining / limit if limit > 0 else 0.0)
            for limit, remaining in ((self.tenant_limit_micros, self.tenant_remaining_micros),
                                     (self.global_limit_micros, self.global_remaining_micros))
            if limit is not None and remaining is not None
        ]
        return min(fractions) if fractions else None


class BudgetLedger(Protocol):
    """Daily spend per tenant and in total, shared by every worker on the same store."""

    async def reserve(
        self,
        tenant: str,
        amount_micros: int,
        *,
        tenant_limit_micros: int | None,
        global_limit_micros: int | None,
        enforce: bool = True,
    ) -> Reservation:
        """Atomically check both limits (None = unlimited) and add the amount to both totals, or
        raise BudgetExhausted naming the scope and change nothing. `enforce=False` records
        without checking (critical jobs)."""
        ...

    async def settle(self, reservation: Reservation, actual_micros: int) -> None:
        """Replace the reserved amount with the actual cost, on the reservation's day. A second
        settle (or release) of the same reservation changes nothing."""
        ...

    async def release(self, reservation: Reservation) -> None:
        """The call never happened: settle to 0."""
        ...

    async def status(
        self, tenant: str, *, tenant_limit_micros: int | None, global_limit_micros: int | None
    ) -> BudgetStatus:
        """The tenant's and the global budget today."""
        ...

    async def spend_today(self) -> dict[str, int]:
        """Spent-or-reserved micros today per tenant, with the global total under GLOBAL."""
        ...

    async def close(self) -> None:
        """Release connections. Idempotent; a closed ledger cannot be used again."""
        ...

    async def __aenter__(self) -> Self: ...

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None: ...


# ---------------------------------------------------------------------- outcomes of a refusal

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


def budget_outcome(
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
) -> BudgetOutcome:
    """Decide, where the refusal is known, how a refused job ends or waits:

    - a job estimated above the refusing budget's whole daily limit can never fit: dead with
      `budget_exceeds_limit`, in every mode (waiting would defer it forever);
    - `reject`: dead with `budget_exhausted`;
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
    if mode == "reject":
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


def budget_ledger_for(queue_url: str, name: str | None = None, *, today: Today = utc_today) -> BudgetLedger:
    """The ledger that fits a queue: the same Redis server (keys under `name`), or the same
    SQLite file (its own tables, rows under `name`). `name` defaults to the queue's `?name=`
    ("default" without one), so queues sharing a server never share their spend."""
    if name is None:
        name = dict(parse_qsl(urlsplit(queue_url).query)).get("name", "default")
    if backend_of(queue_url) == "redis":
        return RedisBudgetLedger(without_query(queue_url), name, today=today)
    parts = urlsplit(queue_url)
    return SqliteBudgetLedger(_sqlite_path(parts.netloc, parts.path), name, today=today)


# ---------------------------------------------------------------------- shared rules


def _remaining(limit: int | None, spent: int) -> int | None:
    return None if limit is None else max(limit - spent, 0)


def _check_reserve(tenant: str, amount_micros: int) -> None:
    if not tenant or tenant == GLOBAL:
        raise ValueError(f"invalid tenant name {tenant!r}: it must be non-empty and not {GLOBAL!r}")
    if amount_micros < 0:
        raise ValueError(f"amount_micros must be >= 0, got {amount_micros}")


def _exhausted(scope: BudgetScope, tenant: str, amount: int, spent: int, limit: int) -> BudgetExhausted:
    remaining = max(limit - spent, 0)
    owner = f"tenant {tenant!r}" if scope == "tenant" else "the global"
    return BudgetExhausted(
        f"{owner} daily budget is exhausted: {micros_to_usd(amount)} USD needed, "
        f"{micros_to_usd(remaining)} of {micros_to_usd(limit)} USD left today (UTC)",
        scope=scope,
        remaining_micros=remaining,
        limit_micros=limit,
    )


def _new_id() -> str:
    return uuid.uuid4().hex


# ---------------------------------------------------------------------- SQLite

_SCHEMA = """
CREATE TABLE IF NOT EXISTS budget_spend (
    ledger TEXT NOT NULL,                 -- the ledger's name, so several can share a file
    day TEXT NOT NULL,                    -- UTC date, YYYY-MM-DD
    tenant TEXT NOT NULL,                 -- '*' holds the global total
    spent_micros INTEGER NOT NULL,        -- spent or reserved and not yet settled
    PRIMARY KEY (ledger, day, tenant)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS budget_pending (  -- reservations not yet settled
    id TEXT PRIMARY KEY,
    ledger TEXT NOT NULL,
    day TEXT NOT NULL,
    tenant TEXT NOT NULL,
    amount_micros INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS budget_pending_day ON budget_pending(ledger, day);
"""

_ADD_SPEND = """
INSERT INTO budget_spend (ledger, day, tenant, spent_micros) VALUES (?, ?, ?, ?)
ON CONFLICT (ledger, day, tenant) DO UPDATE SET spent_micros = spent_micros + excluded.spent_micros
"""


class SqliteBudgetLedger:
    """A ledger in a SQLite file (WAL), safe across processes on one host: every change is one
    `BEGIN IMMEDIATE` transaction, run on a thread of its own so the event loop never waits on
    the disk or on another process's lock. Connects lazily."""

    def __init__(self, path: str, name: str = "default", *, today: Today = utc_today) -> None:
        self.path = path
        self.name = name
        self._today = today
        self._db = SqliteThread(
            path, _SCHEMA, name="budget",
            error=lambda exc: DispatchUnavailable(f"SQLite budget ledger at {path}: {exc}"),
        )
        self._closed = False
        self._purged_before: str | None = None  # the cutoff of the last purge of old days

    async def reserve(
        self,
        tenant: str,
        amount_micros: int,
        *,
        tenant_limit_micros: int | None,
        global_limit_micros: int | None,
        enforce: bool = True,
    ) -> Reservation:
        """See BudgetLedger.reserve."""
        _check_reserve(tenant, amount_micros)
        reservation = Reservation(_new_id(), tenant, amount_micros, self._today(), enforce)
        day = reservation.day.isoformat()
        cutoff = (reservation.day - timedelta(days=KEEP_DAYS)).isoformat()

        def body(conn: sqlite3.Connection) -> BudgetExhausted | None:
            if enforce:
                tenant_spent, global_spent = self._spent(conn, day, tenant)
                if tenant_limit_micros is not None and tenant_spent + amount_micros > tenant_limit_micros:
                    return _exhausted("tenant", tenant, amount_micros, tenant_spent, tenant_limit_micros)
                if global_limit_micros is not None and global_spent + amount_micros > global_limit_micros:
                    return _exhausted("global", tenant, amount_micros, global_spent, global_limit_micros)
            conn.executemany(_ADD_SPEND, [(self.name, day, tenant, amount_micros),
                                          (self.name, day, GLOBAL, amount_micros)])
            conn.execute(
                "INSERT INTO budget_pending (id, ledger, day, tenant, amount_micros) VALUES (?, ?, ?, ?, ?)",
                (reservation.id, self.name, day, tenant, amount_micros),
            )
            if self._purged_before != cutoff:
                self._purge(conn, cutoff)
            return None

        refused = await self._write(body)
        if refused is not None:
            raise refused
        return reservation

    async def settle(self, reservation: Reservation, actual_micros: int) -> None:
        """See BudgetLedger.settle."""
        if actual_micros < 0:
            raise ValueError(f"actual_micros must be >= 0, got {actual_micros}")
        day = reservation.day.isoformat()

        def body(conn: sqlite3.Connection) -> None:
            row = conn.execute(
                "DELETE FROM budget_pending WHERE id = ? AND ledger = ? RETURNING amount_micros",
                (reservation.id, self.name),
            ).fetchone()
            if row is None:
                return  # settled before, or expired with its day
            delta = actual_micros - int(row[0])
            if delta:
                conn.executemany(_ADD_SPEND, [(self.name, day, reservation.tenant, delta),
                                              (self.name, day, GLOBAL, delta)])

        await self._write(body)

    async def release(self, reservation: Reservation) -> None:
        """See BudgetLedger.release."""
        await self.settle(reservation, 0)

    async def status(
        self, tenant: str, *, tenant_limit_micros: int | None, global_limit_micros: int | None
    ) -> BudgetStatus:
        """See BudgetLedger.status."""
        today = self._today()
        tenant_spent, global_spent = await self._run(
            lambda conn: self._spent(conn, today.isoformat(), tenant)
        )
        return BudgetStatus(
            tenant, today, tenant_spent, global_spent, tenant_limit_micros, global_limit_micros
        )

    async def spend_today(self) -> dict[str, int]:
        """See BudgetLedger.spend_today."""
        day = self._today().isoformat()

        def body(conn: sqlite3.Connection) -> dict[str, int]:
            rows = conn.execute(
                "SELECT tenant, spent_micros FROM budget_spend WHERE ledger = ? AND day = ?",
                (self.name, day),
            ).fetchall()
            return {str(tenant): int(spent) for tenant, spent in rows}

        return await self._run(body)

    async def close(self) -> None:
        """Close the connection and its thread. Idempotent."""
        if self._closed:
            return
        self._closed = True
        await self._db.close()

    async def __aenter__(self) -> Self:
        if self._closed:
            raise DispatchClosed("this budget ledger was closed; create a new one")
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    # -- plumbing

    def _spent(self, conn: sqlite3.Connection, day: str, tenant: str) -> tuple[int, int]:
        rows = dict(conn.execute(
            "SELECT tenant, spent_micros FROM budget_spend WHERE ledger = ? AND day = ? AND tenant IN (?, ?)",
            (self.name, day, tenant, GLOBAL),
        ).fetchall())
        return int(rows.get(tenant, 0)), int(rows.get(GLOBAL, 0))

    def _purge(self, conn: sqlite3.Connection, cutoff: str) -> None:
        # Once per day and instance is enough: only days before the cutoff go.
        conn.execute("DELETE FROM budget_spend WHERE ledger = ? AND day < ?", (self.name, cutoff))
        conn.execute("DELETE FROM budget_pending WHERE ledger = ? AND day < ?", (self.name, cutoff))
        self._purged_before = cutoff

    async def _run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        if self._closed:
            raise DispatchClosed("this budget ledger was closed; create a new one")
        return await self._db.run(fn)

    async def _write(self, body: Callable[[sqlite3.Connection], T]) -> T:
        if self._closed:
            raise DispatchClosed("this budget ledger was closed; create a new one")
        return await self._db.write(body)


# ---------------------------------------------------------------------- Redis


class RedisBudgetLedger:
    """A ledger in Redis: per day, `tidegate:{name}:budget:<day>:spend` (tenant → micros, '*' →
    the global total) and `...:pending` (unsettled reservations), hash-tagged by name and
    expiring KEEP_DAYS after their last write. One Lua script per change. Connects lazily."""

    def __init__(self, url: str, name: str = "default", *, today: Today = utc_today) -> None:
        self.name = name
        self._today = today
        self._prefix = f"tidegate:{{{name}}}:budget:"
        self._store = RedisStore(url, ("budget_reserve", "budget_settle"), what="budget ledger")

    def _keys(self, day: date) -> list[str]:
        base = f"{self._prefix}{day.isoformat()}:"
        return [base + "spend", base + "pending"]

    async def reserve(
        self,
        tenant: str,
        amount_micros: int,
        *,
        tenant_limit_micros: int | None,
        global_limit_micros: int | None,
        enforce: bool = True,
    ) -> Reservation:
        """See BudgetLedger.reserve."""
        _check_reserve(tenant, amount_micros)
        reservation = Reservation(_new_id(), tenant, amount_micros, self._today(), enforce)
        args = [
            tenant,
            amount_micros,
            "" if tenant_limit_micros is None else tenant_limit_micros,
            "" if global_limit_micros is None else global_limit_micros,
            "1" if enforce else "0",
            reservation.id,
            _KEEP_S,
        ]
        refused = await self._store.script("budget_reserve", self._keys(reservation.day), args)
        if refused:
            scope: BudgetScope = "tenant" if refused[0] == b"tenant" else "global"
            limit = tenant_limit_micros if scope == "tenant" else global_limit_micros
            assert limit is not None
            raise _exhausted(scope, tenant, amount_micros, int(refused[1]), limit)
        return reservation

    async def settle(self, reservation: Reservation, actual_micros: int) -> None:
        """See BudgetLedger.settle."""
        if actual_micros < 0:
            raise ValueError(f"actual_micros must be >= 0, got {actual_micros}")
        args = [reservation.tenant, reservation.id, actual_micros, _KEEP_S]
        # Idempotent (the script removes the pending entry), so a lost connection is retried.
        await self._store.script("budget_settle", self._keys(reservation.day), args, retry=True)

    async def release(self, reservation: Reservation) -> None:
        """See BudgetLedger.release."""
        await self.settle(reservation, 0)

    async def status(
        self, tenant: str, *, tenant_limit_micros: int | None, global_limit_micros: int | None
    ) -> BudgetStatus:
        """See BudgetLedger.status."""
        today = self._today()
        tenant_spent, global_spent = await self._store.command(
            "HMGET", self._keys(today)[0], tenant, GLOBAL, retry=True)
        return BudgetStatus(
            tenant, today, int(tenant_spent or 0), int(global_spent or 0),
            tenant_limit_micros, global_limit_micros,
        )

    async def spend_today(self) -> dict[str, int]:
        """See BudgetLedger.spend_today."""
        flat = await self._store.command("HGETALL", self._keys(self._today())[0], retry=True)
        items = flat.items() if isinstance(flat, dict) else zip(flat[::2], flat[1::2], strict=True)
        return {key.decode(): int(value) for key, value in items}

    async def close(self) -> None:
        """Release the Redis connections. Idempotent."""
        await self._store.close()

    async def __aenter__(self) -> Self:
        self._store.check_open()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()
