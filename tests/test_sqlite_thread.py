"""SqliteThread's group commit: calls made together run as one batch, every write of it in one
transaction with a savepoint each, so a failing write is undone alone and the others commit."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

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
