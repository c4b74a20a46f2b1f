"""Opening the embedded SQLite file the same way everywhere (queue, budget ledger, tenant store).

WAL lets readers and one writer work at once across processes; NORMAL synchronisation survives
any process crash (only an OS crash or power loss can drop the last commits). Switching a new file
to WAL needs a moment of exclusive access that SQLite's busy handler does not wait for, so when
several processes or instances open one new file at the same moment the switch is retried.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

BUSY_TIMEOUT_MS = 30_000
_SETUP_ATTEMPTS = 50
_SETUP_PAUSE_S = 0.02


def connect(path: str, schema: str) -> sqlite3.Connection:
    """A connection in autocommit mode (callers issue BEGIN IMMEDIATE) with `schema` applied."""
    if path != ":memory:":
        Path(path).parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False,
                           timeout=BUSY_TIMEOUT_MS / 1000)
    conn.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
    for attempt in range(_SETUP_ATTEMPTS):
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.executescript(schema)
            return conn
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or attempt == _SETUP_ATTEMPTS - 1:
                conn.close()
                raise
            time.sleep(_SETUP_PAUSE_S)
    raise AssertionError("unreachable")


def immediate(conn: sqlite3.Connection, body: Callable[[sqlite3.Connection], T]) -> T:
    """Run `body` in one BEGIN IMMEDIATE transaction: the write lock is taken before the reads a
    change depends on, so two processes never both read the same state and then both write."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        value = body(conn)
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")
    return value
