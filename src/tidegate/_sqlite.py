"""Using the embedded SQLite file the same way everywhere (queue, budget ledger, tenant store).

WAL lets readers and one writer work at once across processes; NORMAL synchronisation survives
any process crash (only an OS crash or power loss can drop the last commits). Switching a new file
to WAL needs a moment of exclusive access that SQLite's busy handler does not wait for, so when
several processes or instances open one new file at the same moment the switch is retried.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import sqlite3
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar
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


@dataclass(slots=True)
class _Call:
    """One call waiting for the connection's thread: `fn`, whether it writes, and where its
    outcome goes (set on the event loop's thread)."""

    fn: Callable[[sqlite3.Connection], Any]
    writes: bool
    future: asyncio.Future[Any]
    value: Any = None
    error: BaseException | None = None


class SqliteThread:
    """One SQLite connection used only on a thread of its own, so the event loop never waits on
    the disk or on another process's write lock. Connects on first use (or `open()`); driver
    errors leave as what `error` makes of them.

    Group commit: calls made while the thread is busy wait for it together, and then run as one
    batch — the reads first, then every write in ONE `BEGIN IMMEDIATE` transaction, each in a
    savepoint of its own so that a write that fails is undone alone. Calls in one batch were all
    made before any of them finished, so none can depend on another's outcome, and any order
    among them is one the callers could have seen. A transaction and a thread hop per batch
    instead of per call is what lets the embedded queue keep up with hundreds of requests a
    second (BENCHMARKS.md). A commit that fails fails every write of its batch."""

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
        self._lock = threading.Lock()
        self._waiting: list[_Call] = []  # calls made since the last batch began
        self._batch_queued = False  # a batch job is queued on the thread and has not begun

    async def open(self) -> None:
        """Connect now, so a file that cannot be opened fails here rather than at first use."""
        await self.run(lambda _: None)

    async def run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """`fn(connection)` on the connection's thread, outside any transaction."""
        return await self._call(fn, writes=False)

    async def write(self, body: Callable[[sqlite3.Connection], T]) -> T:
        """`body(connection)` in a `BEGIN IMMEDIATE` transaction on the connection's thread (shared
        with the other writes of its batch; see the class docstring)."""
        return await self._call(body, writes=True)

    async def _call(self, fn: Callable[[sqlite3.Connection], T], *, writes: bool) -> T:
        loop = asyncio.get_running_loop()
        call = _Call(fn, writes, loop.create_future())
        with self._lock:
            self._waiting.append(call)
            queue_batch, self._batch_queued = not self._batch_queued, True
        if queue_batch:
            self._thread.submit(self._run_batch, loop)
        try:
            value: T = await call.future
        except sqlite3.Error as exc:
            raise self._error(exc) from exc
        return value

    async def close(self) -> None:
        """Close the connection once the calls already made have run, then let the thread go."""

        def disconnect() -> None:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

        await asyncio.get_running_loop().run_in_executor(self._thread, disconnect)
        self._thread.shutdown(wait=False)

    # ------------------------------------------------------------------ on the thread

    def _run_batch(self, loop: asyncio.AbstractEventLoop) -> None:
        with self._lock:
            batch, self._waiting = self._waiting, []
            self._batch_queued = False
        try:
            conn = self._connection()
        except sqlite3.Error as exc:
            for call in batch:
                call.error = exc
        else:
            for call in batch:
                if not call.writes:
                    _run_one(call, functools.partial(call.fn, conn))
            _write_together(conn, [call for call in batch if call.writes])
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
            loop.call_soon_threadsafe(_deliver, batch)

    def _connection(self) -> sqlite3.Connection:
        # Runs on the thread, the only one that ever touches the connection.
        if self._conn is None:
            self._conn = connect(self.path, self._schema)
            if self._row_factory is not None:
                self._conn.row_factory = self._row_factory
        return self._conn


def _run_one(call: _Call, run: Callable[[], Any]) -> None:
    try:
        call.value = run()
    except BaseException as exc:  # handed to the caller, raised in its own task
        call.error = exc


def _write_together(conn: sqlite3.Connection, writes: list[_Call]) -> None:
    """Every write of a batch in one transaction, each in a savepoint that its failure rolls
    back; a lone write in a transaction of its own, as it always was."""
    if len(writes) <= 1:
        for call in writes:
            _run_one(call, functools.partial(immediate, conn, call.fn))
        return
    try:
        conn.execute("BEGIN IMMEDIATE")
        for call in writes:
            conn.execute("SAVEPOINT call")
            _run_one(call, functools.partial(call.fn, conn))
            if call.error is None:
                conn.execute("RELEASE call")
            elif isinstance(call.error, Exception):
                conn.execute("ROLLBACK TO call")
                conn.execute("RELEASE call")
            else:
                raise call.error  # KeyboardInterrupt and the like end the whole batch
        conn.execute("COMMIT")
    except BaseException as exc:
        with contextlib.suppress(sqlite3.Error):
            conn.execute("ROLLBACK")
        for call in writes:  # nothing of the batch was written
            call.value, call.error = None, exc


def _deliver(batch: list[_Call]) -> None:
    """On the event loop: hand each call its outcome (unless its caller stopped waiting)."""
    for call in batch:
        if call.future.done():
            continue
        if call.error is not None:
            call.future.set_exception(call.error)
        else:
            call.future.set_result(call.value)
