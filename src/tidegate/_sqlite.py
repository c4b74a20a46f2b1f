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
import os
import sqlite3
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, TypeVar
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
    try:
        _retried_while_locked(lambda: (conn.execute("PRAGMA journal_mode=WAL"),
                                       conn.execute("PRAGMA synchronous=NORMAL"),
                                       conn.executescript(schema)))
    except sqlite3.Error:
        conn.close()
        raise
    return conn


def apply_schema(conn: sqlite3.Connection, schema: str) -> None:
    """Run `schema` (CREATE … IF NOT EXISTS statements) on a connection made by `connect`."""
    _retried_while_locked(lambda: conn.executescript(schema))


def _retried_while_locked(setup: Callable[[], object]) -> None:
    for attempt in range(_SETUP_ATTEMPTS):
        try:
            setup()
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or attempt == _SETUP_ATTEMPTS - 1:
                raise
            time.sleep(_SETUP_PAUSE_S)


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
    """One call waiting for the connection's thread: `fn`, whether it writes, the handle it came
    through (its schema and row factory) and where its outcome goes (set on its event loop)."""

    fn: Callable[[sqlite3.Connection], Any]
    writes: bool
    handle: SqliteThread
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[Any]
    value: Any = None
    error: BaseException | None = None


class SqliteThread:
    """A component's way to one SQLite file: its calls run on a thread that owns the connection,
    so the event loop never waits on the disk or on another process's write lock. Connects on
    first use (or `open()`), with the component's `schema` applied; driver errors leave as what
    `error` makes of them.

    Every SqliteThread of one file in a process shares that thread and connection (the queue,
    the budget ledger and the tenant store of `tidegate up` all live in the queue's file), so
    their writes commit together instead of taking the file's write lock in turn.

    Group commit: calls made while the thread is busy wait for it together, and then run as one
    batch — the reads first, then every write in ONE `BEGIN IMMEDIATE` transaction, each in a
    savepoint of its own so that a write that fails is undone alone. Calls in one batch were all
    made before any of them finished, so none can depend on another's outcome, and any order
    among them is one the callers could have seen. A transaction and a thread hop per batch
    instead of per call is what lets the embedded queue keep up with hundreds of requests a
    second (BENCHMARKS.md). A commit that fails fails every write of its batch."""

    def __init__(
        self, path: str, schema: str, *, error: Callable[[sqlite3.Error], Exception],
        row_factory: type[sqlite3.Row] | None = None,
    ) -> None:
        self.path = path
        self.schema = schema
        self.row_factory = row_factory
        self._error = error
        self._file: _SharedFile | None = None

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
        if self._file is None:
            self._file = _SharedFile.join(self.path)
        loop = asyncio.get_running_loop()
        call = _Call(fn, writes, self, loop, loop.create_future())
        self._file.submit(call)
        try:
            value: T = await call.future
        except sqlite3.Error as exc:
            raise self._error(exc) from exc
        return value

    async def close(self) -> None:
        """Leave the shared connection once the calls already made have run; the last handle of a
        file closes it and lets its thread go."""
        shared, self._file = self._file, None
        if shared is not None:
            await shared.leave()


class _SharedFile:
    """The thread and connection of one SQLite file in this process, and the calls waiting for
    them. Joined by each SqliteThread at its first call and left at its close."""

    _open: ClassVar[dict[str, _SharedFile]] = {}
    _registry_lock: ClassVar = threading.Lock()

    def __init__(self, path: str, key: str) -> None:
        self.path = path
        self._key = key  # its place in _open: the absolute path
        self._users = 0
        self._conn: sqlite3.Connection | None = None
        self._applied: set[str] = set()  # the schemas run on this connection
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tidegate-sqlite")
        self._lock = threading.Lock()
        self._waiting: list[_Call] = []  # calls made since the last batch began
        self._batch_queued = False  # a batch job is queued on the thread and has not begun

    @classmethod
    def join(cls, path: str) -> _SharedFile:
        # ":memory:" is a database of its own on each connection: never shared.
        key = path if path == ":memory:" else os.path.abspath(path)
        with cls._registry_lock:
            shared = cls._open.get(key) if key != ":memory:" else None
            if shared is None:
                shared = cls(path, key)
                if key != ":memory:":
                    cls._open[key] = shared
            shared._users += 1
            return shared

    def submit(self, call: _Call) -> None:
        with self._lock:
            self._waiting.append(call)
            queue_batch, self._batch_queued = not self._batch_queued, True
        if queue_batch:
            self._thread.submit(self._run_batch)

    async def leave(self) -> None:
        with self._registry_lock:
            self._users -= 1
            last = self._users == 0
            if last and self._open.get(self._key) is self:
                del self._open[self._key]
        if not last:
            return

        def disconnect() -> None:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

        await asyncio.get_running_loop().run_in_executor(self._thread, disconnect)
        self._thread.shutdown(wait=False)

    # ------------------------------------------------------------------ on the thread

    def _run_batch(self) -> None:
        with self._lock:
            batch, self._waiting = self._waiting, []
            self._batch_queued = False
        writes: list[_Call] = []
        for call in batch:
            try:
                conn = self._connection(call.handle)
            except sqlite3.Error as exc:
                call.error = exc
                continue
            if call.writes:
                writes.append(call)
            else:
                _run_one(call, functools.partial(call.fn, conn))
        if writes:
            assert self._conn is not None
            _write_together(self._conn, writes)
        for loop in {call.loop for call in batch}:
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
                loop.call_soon_threadsafe(_deliver, [call for call in batch if call.loop is loop])

    def _connection(self, handle: SqliteThread) -> sqlite3.Connection:
        # Runs on the thread, the only one that ever touches the connection.
        if self._conn is None:
            self._conn = connect(self.path, handle.schema)
            self._applied.add(handle.schema)
        elif handle.schema not in self._applied:
            apply_schema(self._conn, handle.schema)
            self._applied.add(handle.schema)
        self._conn.row_factory = handle.row_factory
        return self._conn


def _run_one(call: _Call, run: Callable[[], Any]) -> None:
    try:
        call.value = run()
    except BaseException as exc:  # handed to the caller, raised in its own task
        call.error = exc


def _write_together(conn: sqlite3.Connection, writes: list[_Call]) -> None:
    """Every write of a batch in one transaction, each in a savepoint that its failure rolls
    back; a lone write in a transaction of its own, as it always was."""
    if len(writes) == 1:
        [call] = writes
        conn.row_factory = call.handle.row_factory
        _run_one(call, functools.partial(immediate, conn, call.fn))
        return
    try:
        conn.execute("BEGIN IMMEDIATE")
        for call in writes:
            conn.row_factory = call.handle.row_factory
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
    """On a call's event loop: hand each call its outcome (unless its caller stopped waiting)."""
    for call in batch:
        if call.future.done():
            continue
        if call.error is not None:
            call.future.set_exception(call.error)
        else:
            call.future.set_result(call.value)
