"""Using the embedded SQLite file the same way everywhere (queue, budget ledger, tenant store).

WAL lets readers and one writer work at once across processes; NORMAL synchronisation survives
any process crash (only an OS crash or power loss can drop the last commits). Switching a new file
to WAL needs a moment of exclusive access that SQLite's busy handler does not wait for, so when
several processes or instances open one new file at the same moment the switch is retried.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar
from urllib.parse import urlsplit

from tidegate.errors import ConfigError

T = TypeVar("T")

BUSY_TIMEOUT_MS = 30_000
_SETUP_ATTEMPTS = 50
_SETUP_PAUSE_S = 0.02


def sqlite_path(url: str) -> str:
    """The file of a `sqlite:///…` URL, the one way every SQLite part reads it:
    sqlite:///relative.db → "relative.db", sqlite:////abs/path.db → "/abs/path.db"; the query
    is not part of it, and a URL with a host is refused."""
    parts = urlsplit(url)
    if parts.netloc:
        raise ConfigError(f"sqlite URL has a host {parts.netloc!r}: use sqlite:///path/to/file.db")
    return parts.path[1:] if parts.path.startswith("/") else parts.path


def sqlite_file(url: str) -> Path | None:
    """The file a `sqlite:///...` URL names (None for any other URL, or one without a path)."""
    parts = urlsplit(url)
    if parts.scheme != "sqlite" or not parts.path:
        return None
    return Path(sqlite_path(url))


def ensure_sqlite_folder(url: str) -> None:
    """Create the folder of a `sqlite:///...` URL's file, so a fresh path just works."""
    path = sqlite_file(url)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)


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


class SqliteThread:
    """One SQLite connection used only on a thread of its own, so the event loop never waits on
    the disk or on another process's write lock. Connects on first use (or `open()`); driver
    errors leave as what `error` makes of them."""

    def __init__(
        self, path: str, schema: str, *, name: str, error: Callable[[sqlite3.Error], Exception],
        row_factory: type[sqlite3.Row] | None = None,
    ) -> None:
        self.path = path
        self._schema = schema
        self._error = error
        self._row_factory = row_factory
        self._conn: sqlite3.Connection | None = None
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"tidegate-{name}")

    async def open(self) -> None:
        """Connect now, so a file that cannot be opened fails here rather than at first use."""
        await self.run(lambda _: None)

    async def run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """`fn(connection)` on the connection's thread."""
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._thread, lambda: fn(self._connection()))
        except sqlite3.Error as exc:
            raise self._error(exc) from exc

    async def write(self, body: Callable[[sqlite3.Connection], T]) -> T:
        """`body(connection)` in one BEGIN IMMEDIATE transaction on the connection's thread."""
        return await self.run(lambda conn: immediate(conn, body))

    async def close(self) -> None:
        """Close the connection, then let the thread go."""

        def disconnect() -> None:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

        await asyncio.get_running_loop().run_in_executor(self._thread, disconnect)
        self._thread.shutdown(wait=False)

    def _connection(self) -> sqlite3.Connection:
        # Runs on the thread, the only one that ever touches the connection.
        if self._conn is None:
            self._conn = connect(self.path, self._schema)
            if self._row_factory is not None:
                self._conn.row_factory = self._row_factory
        return self._conn
