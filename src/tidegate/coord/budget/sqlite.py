"""The budget ledger in a SQLite file, usually the queue's own: every change one `BEGIN IMMEDIATE`
transaction."""

from __future__ import annotations

import sqlite3
from datetime import date, timedelta
from typing import TypeVar

from tidegate._formats import StoreFormat
from tidegate._sqlite import SqliteThread
from tidegate.coord.budget.base import GLOBAL, KEEP_DAYS, BudgetLedger, Refusal, Reservation, Today, utc_today
from tidegate.errors import DispatchUnavailable

__all__ = ["SQLITE_FORMAT", "SQLITE_SCHEMA", "SqliteBudgetLedger"]

T = TypeVar("T")

SQLITE_SCHEMA = """
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
# The tables' format (see tidegate._formats), recorded in the file next to the queue's.
SQLITE_FORMAT = StoreFormat.initial("budget")

_ADD_SPEND = """
INSERT INTO budget_spend (ledger, day, tenant, spent_micros) VALUES (?, ?, ?, ?)
ON CONFLICT (ledger, day, tenant) DO UPDATE SET spent_micros = spent_micros + excluded.spent_micros
"""


class SqliteBudgetLedger(BudgetLedger):
    """A ledger in a SQLite file (WAL), safe across processes on one host: every change is one
    `BEGIN IMMEDIATE` transaction, run by `SqliteThread` so the event loop never waits on
    the disk or on another process's lock. Connects on first use."""

    def __init__(self, path: str, name: str = "default", *, today: Today = utc_today) -> None:
        super().__init__(name, today)
        self.path = path
        self._db = SqliteThread(
            path, SQLITE_SCHEMA,
            error=lambda exc: DispatchUnavailable(f"SQLite budget ledger at {path}: {exc}"),
            on_loop=True, fmt=SQLITE_FORMAT,
        )
        self._purged_before: str | None = None  # the cutoff of the last purge of old days

    async def _open(self) -> None:
        pass  # the connection opens on its thread at the first statement

    async def _close(self) -> None:
        await self._db.close()

    async def _reserve(self, reservation: Reservation, tenant_limit_micros: int | None,
                       global_limit_micros: int | None) -> Refusal | None:
        day, tenant, amount = reservation.day.isoformat(), reservation.tenant, reservation.amount_micros
        cutoff = (reservation.day - timedelta(days=KEEP_DAYS)).isoformat()

        def body(conn: sqlite3.Connection) -> Refusal | None:
            if tenant_limit_micros is not None or global_limit_micros is not None:
                tenant_spent, global_spent = self._spent_on(conn, day, tenant)
                if tenant_limit_micros is not None and tenant_spent + amount > tenant_limit_micros:
                    return "tenant", tenant_spent
                if global_limit_micros is not None and global_spent + amount > global_limit_micros:
                    return "global", global_spent
            conn.executemany(_ADD_SPEND, [(self.name, day, tenant, amount),
                                          (self.name, day, GLOBAL, amount)])
            conn.execute(
                "INSERT INTO budget_pending (id, ledger, day, tenant, amount_micros) VALUES (?, ?, ?, ?, ?)",
                (reservation.id, self.name, day, tenant, amount),
            )
            if self._purged_before != cutoff:
                self._purge(conn, cutoff)
            return None

        return await self._db.write(body)

    async def _settle(self, reservation: Reservation, actual_micros: int) -> None:
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

        await self._db.write(body)

    async def _record(self, tenant: str, day: date, amount_micros: int) -> None:
        def body(conn: sqlite3.Connection) -> None:
            conn.executemany(_ADD_SPEND, [(self.name, day.isoformat(), tenant, amount_micros),
                                          (self.name, day.isoformat(), GLOBAL, amount_micros)])

        await self._db.write(body)

    async def _spent(self, day: date, tenant: str) -> tuple[int, int]:
        return await self._db.run(lambda conn: self._spent_on(conn, day.isoformat(), tenant))

    async def _spend(self, day: date) -> dict[str, int]:
        def body(conn: sqlite3.Connection) -> dict[str, int]:
            rows = conn.execute(
                "SELECT tenant, spent_micros FROM budget_spend WHERE ledger = ? AND day = ?",
                (self.name, day.isoformat()),
            ).fetchall()
            return {str(tenant): int(spent) for tenant, spent in rows}

        return await self._db.run(body)

    # -- plumbing

    def _spent_on(self, conn: sqlite3.Connection, day: str, tenant: str) -> tuple[int, int]:
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
