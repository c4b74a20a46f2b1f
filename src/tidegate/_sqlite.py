"""Using the embedded SQLite file the same way everywhere (queue, budget ledger, tenant store).

WAL lets readers and one writer work at once across processes; NORMAL synchronisation survives
any process crash (only an OS crash or power loss can drop the last commits). Switching a new file
to WAL needs a moment of exclusive access that SQLite's busy handler does not wait for, so when
several processes or instances open one new file at the same moment the switch is retried.

A file tidegate owns gives space back: it is in `auto_vacuum = INCREMENTAL` mode (set before a
new file's first table; an older file is switched with one VACUUM when it is opened, under
`[storage] migrate = "auto"`), and the queue's upkeep returns free pages beyond a slack to the file
system (`reclaim_free_pages`), so the file shrinks after what it held expires instead of staying
at its largest size. The WAL is truncated to `JOURNAL_SIZE_LIMIT_BYTES` after a checkpoint resets
it, for the same reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
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

from tidegate._formats import MigrateMode, StoreFormat, migrate_mode, open_sqlite_store
from tidegate.errors import ConfigError, StoreFormatError

T = TypeVar("T")

BUSY_TIMEOUT_MS = 30_000
_SETUP_ATTEMPTS = 50
_SETUP_PAUSE_S = 0.02
# Commits between two checkpoints of a file whose connection runs calls on the event loop: SQLite's
# own (every 1,000 WAL pages, in the committing call) would copy pages into the database and sync
# it on the loop; ~5 pages a commit keeps the WAL near the size SQLite's default lets it reach.
CHECKPOINT_EVERY_COMMITS = 200
CHECKPOINT_WAIT_MS = 200  # how long a checkpoint waits for other connections' transactions
_SQLITE_BUSY = 5
_SQLITE_LOCKED = 6
AUTO_VACUUM_INCREMENTAL = 2  # what PRAGMA auto_vacuum reads in INCREMENTAL mode
# Free pages kept for the next writes rather than given back: under steady load, what retention
# frees is reused by new jobs at once, and giving it back would only move pages to and fro.
RECLAIM_KEEP_FREE_BYTES = 8 * 1024 * 1024
# The most given back by one call: an incremental vacuum holds the write lock while it moves
# pages (about 20 ms per MiB on a laptop SSD), so it goes in steps between other writes.
RECLAIM_STEP_BYTES = 2 * 1024 * 1024
# A WAL restarted from its beginning (after a checkpoint) is truncated to this: it keeps the size
# of its largest burst otherwise, which only grows over a long run (a checkpoint that readers
# held up lets the next commits append); about what ~200 commits under steady load write.
JOURNAL_SIZE_LIMIT_BYTES = 8 * 1024 * 1024

log = logging.getLogger("tidegate.sqlite")


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


def connect(path: str, schema: str, fmt: StoreFormat | None = None, *,
            migrate: MigrateMode = "auto", owns_file: bool = True) -> sqlite3.Connection:
    """A connection in autocommit mode (callers issue BEGIN IMMEDIATE) with `schema` applied:
    for a store that declares its format `fmt`, in the one transaction that checks and migrates
    it (`tidegate._formats.open_sqlite_store`)."""
    if path != ":memory:":
        Path(path).parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False,
                           timeout=BUSY_TIMEOUT_MS / 1000)
    conn.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
    ours = owns_file and path != ":memory:"
    try:
        if ours:
            # Only a new file takes it here (before its first page is written, which the switch
            # to WAL does); an older one is switched below, once its format is known to be ours.
            conn.execute("PRAGMA auto_vacuum=INCREMENTAL")
        _retried_while_locked(lambda: (conn.execute("PRAGMA journal_mode=WAL"),
                                       conn.execute("PRAGMA synchronous=NORMAL")))
        conn.execute(f"PRAGMA journal_size_limit={JOURNAL_SIZE_LIMIT_BYTES}")
        apply_schema(conn, schema, fmt, migrate=migrate, owns_file=owns_file)
        if ours:
            reclaiming(conn, migrate=migrate)
    except BaseException:
        conn.close()
        raise
    return conn


def reclaiming(conn: sqlite3.Connection, *, migrate: MigrateMode = "auto") -> float | None:
    """Switch a file made before tidegate set `auto_vacuum = INCREMENTAL` to it: one VACUUM,
    which rewrites the file (about half a second per 100 MB on a laptop SSD; readers go on, writers
    wait), then a checkpoint that truncates the WAL the rewrite filled. Only under
    `migrate = "auto"`; under "check" the file is left as it is, with a warning, for `tidegate
    migrate --apply`. A VACUUM that cannot get the file (another process keeps writing past the
    busy timeout) is left for the next open. Returns the seconds it took, or None when nothing
    was done. Outside any transaction."""
    if conn.execute("PRAGMA auto_vacuum").fetchone()[0] == AUTO_VACUUM_INCREMENTAL:
        return None
    where = conn_path(conn)
    if migrate != "auto":
        log.warning("the SQLite file %s does not give freed space back (auto_vacuum is not "
                    "incremental): run `tidegate migrate --apply` to switch it (one VACUUM)", where)
        return None
    started = time.monotonic()
    try:
        conn.execute("PRAGMA auto_vacuum=INCREMENTAL")
        conn.execute("VACUUM")
    except sqlite3.OperationalError as exc:
        log.warning("the SQLite file %s was not switched to auto_vacuum=incremental (%s); the next "
                    "open tries again", where, exc)
        return None
    with contextlib.suppress(sqlite3.Error):  # the next checkpoint truncates it otherwise
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    took_s = time.monotonic() - started
    log.info("the SQLite file %s now gives freed space back (auto_vacuum=incremental; VACUUM took "
             "%.2fs)", where, took_s)
    return took_s


def reclaim_free_pages(conn: sqlite3.Connection) -> int:
    """Give the file's free pages beyond RECLAIM_KEEP_FREE_BYTES back to the file system, at most
    RECLAIM_STEP_BYTES at once (an incremental vacuum in a transaction of its own: call it outside
    any other). Returns the pages given back; 0 for a file not in incremental mode, or when
    another process holds the write lock past the busy timeout (the next call tries again)."""
    if conn.in_transaction:  # executescript would commit it
        raise RuntimeError("reclaim_free_pages runs outside any transaction")
    if conn.execute("PRAGMA auto_vacuum").fetchone()[0] != AUTO_VACUUM_INCREMENTAL:
        return 0
    page_bytes = int(conn.execute("PRAGMA page_size").fetchone()[0])
    excess = int(conn.execute("PRAGMA freelist_count").fetchone()[0]) - RECLAIM_KEEP_FREE_BYTES // page_bytes
    if excess <= 0:
        return 0
    pages = min(excess, max(RECLAIM_STEP_BYTES // page_bytes, 1))
    try:
        # executescript steps the pragma to its end; execute() would step it once, freeing one page.
        conn.executescript(f"PRAGMA incremental_vacuum({pages})")
    except sqlite3.OperationalError as exc:
        if not _is_busy(exc):
            raise
        return 0
    return pages


def apply_schema(conn: sqlite3.Connection, schema: str, fmt: StoreFormat | None = None, *,
                 migrate: MigrateMode = "auto", owns_file: bool = True) -> None:
    """Run `schema` (CREATE … IF NOT EXISTS statements) on a connection made by `connect`; for a
    store with a format `fmt`, with its check and migrations, in one transaction."""
    if fmt is None:
        _retried_while_locked(lambda: conn.executescript(schema))
        return
    where = conn_path(conn)
    _retried_while_locked(lambda: open_sqlite_store(conn, fmt, schema, where=where, mode=migrate,
                                                    owns_file=owns_file))


def conn_path(conn: sqlite3.Connection) -> str:
    """The file a connection is on, as error messages name it (":memory:" for none)."""
    row = conn.execute("PRAGMA database_list").fetchone()
    return str(row[2]) if row is not None and row[2] else ":memory:"


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


def _is_busy(exc: BaseException | None) -> bool:
    """Whether `exc` is SQLite saying another connection holds the lock it needed."""
    code = getattr(exc, "sqlite_errorcode", None)
    return isinstance(exc, sqlite3.OperationalError) and code is not None and code & 0xFF in (
        _SQLITE_BUSY, _SQLITE_LOCKED)


@dataclass(slots=True)
class _Call:
    """One call waiting for the connection: `fn`, whether it writes, whether it may run on the
    event loop (`quick`), the handle it came through (its schema and row factory) and where its
    outcome goes (set on its event loop)."""

    fn: Callable[[sqlite3.Connection], Any]
    writes: bool
    quick: bool
    handle: SqliteThread
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[Any]
    value: Any = None
    error: BaseException | None = None


class SqliteThread:
    """A component's way to one SQLite file: its calls run on a thread that owns the connection
    (or on the event loop, see "On the loop" below), so the event loop never waits on another
    process's write lock. Connects on
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
    second (BENCHMARKS.md). A commit that fails fails every write of its batch.

    On the loop: a handle made with `on_loop=True` lets its short calls (those not made with
    `on_thread=True`) run on the event loop itself, as one batch at the end of the loop's turn,
    while the connection is free and the file's lock is not held by another connection. A
    thread hop there and back costs more than the work of the queue's calls (a tenth of
    `tidegate up`'s CPU per request, and 0.2-0.3 ms of each request's latency: BENCHMARKS.md);
    SQLite's C code waits on nothing but the file's lock, which such a batch never waits for: a
    call that finds the lock taken goes to the thread and waits there. Checkpoints, which sync
    the database file, then run on the thread too (every CHECKPOINT_EVERY_COMMITS commits, from
    a connection of their own), never inside a commit made on the loop."""

    def __init__(
        self, path: str, schema: str, *, error: Callable[[sqlite3.Error], Exception],
        row_factory: type[sqlite3.Row] | None = None, on_loop: bool = False,
        fmt: StoreFormat | None = None, owns_file: bool = True,
    ) -> None:
        self.path = path
        self.schema = schema
        # The store's format: checked and migrated with its schema, at the first call. The mode
        # is the one of the context it is built in (see tidegate._formats.migrating).
        self.fmt = fmt
        self.migrate = migrate_mode()
        self.owns_file = owns_file
        self.row_factory = row_factory
        self.on_loop = on_loop
        self._error = error
        self._file: _SharedFile | None = None

    async def open(self) -> None:
        """Connect now, so a file that cannot be opened fails here rather than at first use."""
        await self.run(lambda _: None)

    async def run(self, fn: Callable[[sqlite3.Connection], T], *, on_thread: bool = False) -> T:
        """`fn(connection)` outside any transaction; a read that may take long (a scan, a count)
        says `on_thread=True`."""
        return await self._call(fn, writes=False, on_thread=on_thread)

    async def write(self, body: Callable[[sqlite3.Connection], T], *, on_thread: bool = False) -> T:
        """`body(connection)` in a `BEGIN IMMEDIATE` transaction (shared with the other writes of
        its batch; see the class docstring); a write of many rows says `on_thread=True`."""
        return await self._call(body, writes=True, on_thread=on_thread)

    async def _call(self, fn: Callable[[sqlite3.Connection], T], *, writes: bool, on_thread: bool) -> T:
        if self._file is None:
            self._file = _SharedFile.join(self.path)
        loop = asyncio.get_running_loop()
        call = _Call(fn, writes, self.on_loop and not on_thread, self, loop, loop.create_future())
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
        self._batch_queued = False  # a batch is queued (on the thread or a loop) and has not begun
        self._using = threading.Lock()  # held while a batch uses the connection
        self._busy_ms = BUSY_TIMEOUT_MS  # the connection's busy timeout now
        self._commits = 0  # since the last checkpoint
        self._checkpointer: sqlite3.Connection | None = None  # on the thread only

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
        if not queue_batch:
            return
        if call.quick and self._conn is not None:
            call.loop.call_soon(self._run_on_loop)
        else:
            self._thread.submit(self._run_batch)

    def _to_thread(self, calls: list[_Call]) -> None:
        """Give `calls` (taken from the waiting ones, not run) to the thread, first in line."""
        with self._lock:
            self._waiting[:0] = calls
            queue_batch, self._batch_queued = not self._batch_queued, True
        if queue_batch:
            self._thread.submit(self._run_batch)

    def _take_batch(self) -> list[_Call]:
        with self._lock:
            batch, self._waiting = self._waiting, []
            self._batch_queued = False
        return batch

    async def leave(self) -> None:
        with self._registry_lock:
            self._users -= 1
            last = self._users == 0
            if last and self._open.get(self._key) is self:
                del self._open[self._key]
        if not last:
            return

        def disconnect() -> None:
            with self._using:
                ran = self._run_waiting()  # made before the last handle left, and not run yet
                for conn in (self._conn, self._checkpointer):
                    if conn is not None:
                        conn.close()
                self._conn = self._checkpointer = None
            _deliver_everywhere(ran)

        await asyncio.get_running_loop().run_in_executor(self._thread, disconnect)
        self._thread.shutdown(wait=False)

    # ------------------------------------------------------------------ on the thread

    def _run_batch(self) -> None:
        with self._using:
            ran = self._run_waiting()
        # Handed over once the connection is free, so that the callers' next calls find it so.
        _deliver_everywhere(ran)
        if self._commits >= CHECKPOINT_EVERY_COMMITS:
            self._checkpoint()

    def _run_waiting(self) -> list[_Call]:
        # With `_using` held, on the thread: the calls made so far, each waiting for the lock as
        # long as it takes. Returns them, their outcomes set, for the caller to deliver.
        batch = self._take_batch()
        if not batch:
            return batch
        self._set_busy_timeout(BUSY_TIMEOUT_MS)
        writes: list[_Call] = []
        for call in batch:
            try:
                conn = self._connection(call.handle)
            except (sqlite3.Error, StoreFormatError) as exc:  # the caller's, not the thread's
                call.error = exc
                continue
            if call.writes:
                writes.append(call)
            else:
                _run_one(call, functools.partial(call.fn, conn))
        if writes:
            assert self._conn is not None
            _write_together(self._conn, writes)
            self._commits += 1
        return batch

    def _checkpoint(self) -> None:
        # On the thread, from a connection of its own and without `_using`. PASSIVE copies the
        # WAL's pages into the database file and syncs it while the connection goes on committing
        # to the WAL, blocking nobody. It never catches up with a writer that does not pause, and
        # a WAL starts again from its beginning only once it has been copied whole: RESTART then
        # copies the few pages committed meanwhile, holding writers off for that moment only (a
        # write on the loop that meets it goes to the thread, behind it), so the WAL stays the
        # size of CHECKPOINT_EVERY_COMMITS commits.
        self._commits = 0
        with contextlib.suppress(sqlite3.Error):  # the next one copies what this one could not
            if self._checkpointer is None:
                self._checkpointer = sqlite3.connect(self.path, isolation_level=None,
                                                     check_same_thread=False)
                self._checkpointer.execute(f"PRAGMA busy_timeout={CHECKPOINT_WAIT_MS}")
                self._checkpointer.execute(f"PRAGMA journal_size_limit={JOURNAL_SIZE_LIMIT_BYTES}")
            self._checkpointer.execute("PRAGMA wal_checkpoint(PASSIVE)")
            self._checkpointer.execute("PRAGMA wal_checkpoint(RESTART)")

    # ------------------------------------------------------------------ on the event loop

    def _run_on_loop(self) -> None:
        """The quick calls made during this turn of the loop, run here while nothing else uses the
        connection and nobody holds the file's write lock; whatever cannot goes to the thread."""
        if not self._using.acquire(blocking=False):
            self._to_thread(self._take_batch())  # a batch runs on the thread: queue behind it
            return
        try:
            batch = self._take_batch()
            if not batch:
                return
            conn = self._conn
            if conn is None or not all(call.quick and call.handle.schema in self._applied
                                       for call in batch):
                self._to_thread(batch)
                return
            self._set_busy_timeout(0)
            later: list[_Call] = []
            writes: list[_Call] = []
            for call in batch:
                if call.writes:
                    writes.append(call)
                    continue
                conn.row_factory = call.handle.row_factory
                _run_one(call, functools.partial(call.fn, conn))
                if _is_busy(call.error):  # a read that would have to wait: the thread waits
                    call.error = None
                    later.append(call)
            if writes:
                if _write_together(conn, writes, wait_for_lock=False):
                    self._commits += 1
                else:
                    later.extend(writes)
        finally:
            self._using.release()
        if later:
            self._to_thread(later)
        if self._commits >= CHECKPOINT_EVERY_COMMITS:
            self._commits = 0
            self._thread.submit(self._checkpoint)
        retried = {id(call) for call in later}
        _deliver_everywhere([call for call in batch if id(call) not in retried])

    def _set_busy_timeout(self, ms: int) -> None:
        if self._conn is not None and self._busy_ms != ms:
            self._conn.execute(f"PRAGMA busy_timeout={ms}")
            self._busy_ms = ms

    def _connection(self, handle: SqliteThread) -> sqlite3.Connection:
        # On the thread: connecting and applying a schema may wait for other connections.
        if self._conn is None:
            self._conn = connect(self.path, handle.schema, handle.fmt, migrate=handle.migrate,
                                 owns_file=handle.owns_file)
            # Checkpoints are this file's own (see _checkpoint), whichever way its calls run.
            self._conn.execute("PRAGMA wal_autocheckpoint=0")
            self._busy_ms = BUSY_TIMEOUT_MS
            self._applied.add(handle.schema)
        elif handle.schema not in self._applied:
            # A store refused (newer, or pending under "check") is not marked applied: every
            # call of it is refused in turn, and the other stores of the file go on working.
            apply_schema(self._conn, handle.schema, handle.fmt, migrate=handle.migrate,
                         owns_file=handle.owns_file)
            self._applied.add(handle.schema)
        self._conn.row_factory = handle.row_factory
        return self._conn


def _run_one(call: _Call, run: Callable[[], Any]) -> None:
    try:
        call.value = run()
    except BaseException as exc:  # handed to the caller, raised in its own task
        call.error = exc


def _write_together(conn: sqlite3.Connection, writes: list[_Call], *, wait_for_lock: bool = True) -> bool:
    """Every write of a batch in one transaction, each in a savepoint that its failure rolls
    back; a lone write in a transaction of its own. False, with nothing run, when another
    connection holds the write lock and `wait_for_lock` is false."""
    try:
        conn.execute("BEGIN IMMEDIATE")
    except sqlite3.Error as exc:
        if not wait_for_lock and _is_busy(exc):
            return False
        for call in writes:
            call.error = exc
        return True
    if len(writes) == 1:
        [call] = writes
        conn.row_factory = call.handle.row_factory
        _run_one(call, functools.partial(call.fn, conn))
        if call.error is None:
            try:
                conn.execute("COMMIT")
                return True
            except sqlite3.Error as exc:
                call.value, call.error = None, exc
        with contextlib.suppress(sqlite3.Error):  # an error may have ended the transaction already
            conn.execute("ROLLBACK")
        return True
    try:
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
    return True


def _deliver_everywhere(batch: list[_Call]) -> None:
    """Hand each call its outcome on its own event loop (now, when that is the running one)."""
    try:
        running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    for loop in {call.loop for call in batch}:
        calls = [call for call in batch if call.loop is loop]
        if loop is running:
            _deliver(calls)
            continue
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
            loop.call_soon_threadsafe(_deliver, calls)


def _deliver(batch: list[_Call]) -> None:
    """On a call's event loop: hand each call its outcome (unless its caller stopped waiting)."""
    for call in batch:
        if call.future.done():
            continue
        if call.error is not None:
            call.future.set_exception(call.error)
        else:
            call.future.set_result(call.value)
