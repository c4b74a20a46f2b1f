"""SqliteThread's group commit: calls made together run as one batch, every write of it in one
transaction with a savepoint each, so a failing write is undone alone and the others commit."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from tidegate import _sqlite
from tidegate._sqlite import SqliteThread

SCHEMA = "CREATE TABLE IF NOT EXISTS notes (id INTEGER PRIMARY KEY, text TEXT NOT NULL UNIQUE);"


class Refused(Exception):
    """A write's own refusal, raised after it has written something."""


class Unavailable(Exception):
    """What the driver's errors become."""


@pytest.fixture
async def db(tmp_path: Path) -> AsyncIterator[SqliteThread]:
    thread = SqliteThread(str(tmp_path / "notes.db"), SCHEMA,
                          error=lambda exc: Unavailable(str(exc)))
    await thread.open()
    yield thread
    await thread.close()


def _insert(text: str, *, then_refuse: bool = False) -> Callable[[sqlite3.Connection], int]:
    def body(conn: sqlite3.Connection) -> int:
        cursor = conn.execute("INSERT INTO notes(text) VALUES (?)", (text,))
        if then_refuse:
            raise Refused(text)
        assert cursor.lastrowid is not None
        return cursor.lastrowid

    return body


async def _texts(db: SqliteThread) -> list[str]:
    rows = await db.run(lambda conn: conn.execute("SELECT text FROM notes ORDER BY id").fetchall())
    return [row[0] for row in rows]


async def test_writes_made_together_commit_in_one_transaction(db: SqliteThread) -> None:
    # Given a connection that watches the file's commits
    watcher = sqlite3.connect(db.path)
    before = watcher.execute("PRAGMA data_version").fetchone()[0]
    await db.run(lambda conn: None)  # the thread is idle: the next calls queue together

    # When twenty writes are made at once
    ids = await asyncio.gather(*(db.write(_insert(f"note {n}")) for n in range(20)))

    # Then each has its own outcome, all are stored, and far fewer commits than writes were made
    after = watcher.execute("PRAGMA data_version").fetchone()[0]
    watcher.close()
    assert sorted(ids) == list(range(1, 21))
    assert await _texts(db) == [f"note {n}" for n in range(20)]
    assert 1 <= after - before < 20


async def test_a_write_that_fails_is_undone_alone(db: SqliteThread) -> None:
    outcomes = await asyncio.gather(
        db.write(_insert("kept 1")),
        db.write(_insert("refused", then_refuse=True)),
        db.write(_insert("kept 2")),
        db.write(_insert("kept 1")),  # the UNIQUE constraint: a driver error, translated
        db.write(_insert("kept 3")),
        return_exceptions=True,
    )

    assert isinstance(outcomes[1], Refused)
    assert isinstance(outcomes[3], Unavailable) and "UNIQUE" in str(outcomes[3])
    assert [type(outcome) for i, outcome in enumerate(outcomes) if i not in (1, 3)] == [int, int, int]
    assert await _texts(db) == ["kept 1", "kept 2", "kept 3"]


async def test_reads_of_a_batch_see_a_committed_state(db: SqliteThread) -> None:
    await db.write(_insert("first"))

    read, _ = await asyncio.gather(_texts(db), db.write(_insert("second")))

    # A read made together with a write sees the state before it or after it, never half of it
    assert read in (["first"], ["first", "second"])
    assert await _texts(db) == ["first", "second"]


async def test_a_call_whose_caller_stopped_waiting_still_runs_and_the_others_get_their_outcome(
    db: SqliteThread,
) -> None:
    cancelled = asyncio.ensure_future(db.write(_insert("written anyway")))
    kept = asyncio.ensure_future(db.write(_insert("waited for")))
    await asyncio.sleep(0)
    cancelled.cancel()

    assert await kept == 2
    assert await _texts(db) == ["written anyway", "waited for"]


@pytest.fixture
async def on_loop_db(tmp_path: Path) -> AsyncIterator[SqliteThread]:
    thread = SqliteThread(str(tmp_path / "notes.db"), SCHEMA, on_loop=True,
                          error=lambda exc: Unavailable(str(exc)))
    await thread.open()
    yield thread
    await thread.close()


def _thread_of(conn: sqlite3.Connection) -> int:
    return threading.get_ident()


async def test_short_calls_of_an_on_loop_handle_run_on_the_event_loop(on_loop_db: SqliteThread) -> None:
    loop_thread = threading.get_ident()

    assert await on_loop_db.run(_thread_of) == loop_thread
    assert await on_loop_db.write(_thread_of) == loop_thread
    # A long call says so, and keeps off the loop
    assert await on_loop_db.run(_thread_of, on_thread=True) != loop_thread
    assert await on_loop_db.write(_thread_of, on_thread=True) != loop_thread


async def test_writes_on_the_loop_made_together_still_commit_together(on_loop_db: SqliteThread) -> None:
    watcher = sqlite3.connect(on_loop_db.path)
    before = watcher.execute("PRAGMA data_version").fetchone()[0]

    ids = await asyncio.gather(*(on_loop_db.write(_insert(f"note {n}")) for n in range(20)))

    after = watcher.execute("PRAGMA data_version").fetchone()[0]
    watcher.close()
    assert sorted(ids) == list(range(1, 21))
    assert after - before == 1


async def test_a_write_that_finds_the_lock_taken_waits_on_the_thread_not_on_the_loop(
    on_loop_db: SqliteThread,
) -> None:
    # Given another connection (another process, say) holding the file's write lock
    other = sqlite3.connect(on_loop_db.path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    other.execute("INSERT INTO notes(text) VALUES ('the other one')")

    # When a write is made, the loop goes on turning while it waits
    write = asyncio.ensure_future(on_loop_db.write(_insert("mine")))
    turns = 0
    for _ in range(20):
        await asyncio.sleep(0.005)
        turns += 1
    assert turns == 20 and not write.done()

    # Then it is written, on the thread, once the lock is free
    other.execute("COMMIT")
    other.close()
    assert await asyncio.wait_for(write, 10) == 2
    assert await _texts(on_loop_db) == ["the other one", "mine"]


async def test_checkpoints_run_on_the_thread_never_inside_a_commit_on_the_loop(
    on_loop_db: SqliteThread, monkeypatch: pytest.MonkeyPatch,
) -> None:
    checkpoints: list[int] = []
    checkpoint = _sqlite._SharedFile._checkpoint

    def spied(self: _sqlite._SharedFile) -> None:
        checkpoints.append(threading.get_ident())
        checkpoint(self)

    monkeypatch.setattr(_sqlite, "CHECKPOINT_EVERY_COMMITS", 5)
    monkeypatch.setattr(_sqlite._SharedFile, "_checkpoint", spied)
    autocheckpoint = await on_loop_db.run(
        lambda conn: conn.execute("PRAGMA wal_autocheckpoint").fetchone()[0])

    for n in range(12):
        await on_loop_db.write(_insert(f"note {n}"))
    await on_loop_db.run(lambda conn: None, on_thread=True)  # after the checkpoints queued on the thread

    assert autocheckpoint == 0
    assert len(checkpoints) == 2
    assert threading.get_ident() not in checkpoints
    assert len(await _texts(on_loop_db)) == 12


def _size(path: Path) -> int:
    return path.stat().st_size


async def test_the_wal_stays_bounded_under_writes_that_never_pause(
    on_loop_db: SqliteThread, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A checkpoint beside a writer that never pauses never catches up with it on its own; the
    # WAL must still start again from its beginning instead of growing with every commit.
    monkeypatch.setattr(_sqlite, "CHECKPOINT_EVERY_COMMITS", 20)
    wal = Path(on_loop_db.path + "-wal")
    largest = 0
    for n in range(1_500):
        await on_loop_db.write(_insert(f"{n:04d} " + "x" * 1_000))
        if n % 100 == 99:
            await on_loop_db.run(lambda conn: None, on_thread=True)  # the checkpoints queued so far
            largest = max(largest, _size(wal))

    # With PASSIVE checkpoints alone this WAL reached 14 MB; restarted, about 2.5 MB
    assert largest < 5_000_000
    assert len(await _texts(on_loop_db)) == 1_500
