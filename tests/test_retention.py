"""Retention of answered jobs, and disk that follows it: a finished job whose caller waited for
it and has its answer is kept only `answered_ttl_s`, while a job nobody waited for (or one whose
answer may be fetched again) keeps `finished_ttl_s`; and the SQLite file gives the space back
(`auto_vacuum = incremental`, for new files and for files from before). On every queue backend,
through the queue and through the gateway."""

from __future__ import annotations

import asyncio
import logging
import os
import sqlite3
from pathlib import Path
from typing import Any

import orjson
import pytest

from conftest import QueueFactory
from support.dispatch import chat
from support.gateway import CHAT, open_gateway
from tidegate._formats import FORMATS_TABLE, migrating
from tidegate._sqlite import AUTO_VACUUM_INCREMENTAL, RECLAIM_KEEP_FREE_BYTES
from tidegate.jobs import JobState
from tidegate.queue import Queue
from tidegate.queue.sqlite import SQLITE_SCHEMA

BRIEF_S = 0.3  # answered_ttl_s of these tests; finished_ttl_s stays an hour
RETENTION: dict[str, Any] = {"answered_ttl_s": BRIEF_S, "finished_ttl_s": 3600.0}


async def finish(queue: Queue, count: int) -> None:
    """Claim and complete the next `count` jobs."""
    jobs = await queue.claim("w", limit=count)
    assert len(jobs) == count
    for job in jobs:
        await queue.complete(job, {"ok": True})


async def past_brief_retention(queue: Queue) -> None:
    """Once answered jobs are past their retention, one upkeep pass."""
    await asyncio.sleep(BRIEF_S + 0.1)
    await queue.maintain()


async def test_an_answered_job_goes_after_the_short_ttl_and_others_stay(queue_factory: QueueFactory) -> None:
    queue = await queue_factory.open(maintenance_interval_s=None, **RETENTION)
    answered = await queue.enqueue(chat("a"), caller_waits=True)
    keyed = await queue.enqueue(chat("b"), caller_waits=True, idempotency_key="k-1")
    stored = await queue.enqueue(chat("c"), caller_waits=True, keep_answer=True)
    background = await queue.enqueue(chat("d"))
    await finish(queue, 4)

    await past_brief_retention(queue)

    assert await queue.get(answered) is None
    for job_id in (keyed, stored, background):
        job = await queue.get(job_id)
        assert job is not None and job.state is JobState.SUCCEEDED
    assert await queue.enqueue(chat("b"), idempotency_key="k-1") == keyed  # the key still holds


async def test_a_job_says_whether_a_caller_waits_for_it(queue_factory: QueueFactory) -> None:
    queue = await queue_factory.open(maintenance_interval_s=None)
    waited = await queue.enqueue(chat(), caller_waits=True)
    background = await queue.enqueue(chat())

    [first, second] = await queue.claim("w", limit=2)

    assert {first.id: first.caller_waits, second.id: second.caller_waits} == {waited: True, background: False}


@pytest.mark.parametrize("when", ["before it finishes", "after it finished"])
async def test_a_job_whose_caller_gave_up_keeps_the_finished_ttl(queue_factory: QueueFactory,
                                                                 when: str) -> None:
    queue = await queue_factory.open(maintenance_interval_s=None, **RETENTION)
    job_id = await queue.enqueue(chat(), caller_waits=True)
    if when == "before it finishes":
        assert await queue.caller_gave_up(job_id)
    await finish(queue, 1)
    if when == "after it finished":
        assert await queue.caller_gave_up(job_id)

    await past_brief_retention(queue)

    job = await queue.get(job_id)
    assert job is not None and job.state is JobState.SUCCEEDED and not job.caller_waits
    assert not await queue.caller_gave_up(job_id)  # nobody waits for it any more
    assert not await queue.caller_gave_up("no-such-job")


async def test_a_redriven_job_is_one_nobody_waits_for(queue_factory: QueueFactory) -> None:
    queue = await queue_factory.open(maintenance_interval_s=None, **RETENTION)
    job_id = await queue.enqueue(chat(), caller_waits=True)
    [job] = await queue.claim("w")
    assert await queue.fail(job, "refused", retry=False) is JobState.DEAD

    assert await queue.redrive([job_id]) == 1
    await finish(queue, 1)
    await past_brief_retention(queue)

    redriven = await queue.get(job_id)
    assert redriven is not None and redriven.state is JobState.SUCCEEDED and not redriven.caller_waits


async def test_forgetting_an_answered_job_deletes_it(queue_factory: QueueFactory) -> None:
    queue = await queue_factory.open(maintenance_interval_s=None)
    job_id = await queue.enqueue(chat(), caller_waits=True)
    await finish(queue, 1)

    assert await queue.forget(job_id)
    assert await queue.get(job_id) is None
    await queue.maintain()  # nothing left behind to trip over


async def test_the_answered_ttl_never_outlasts_the_finished_ttl(queue_factory: QueueFactory) -> None:
    queue = await queue_factory.open(maintenance_interval_s=None, answered_ttl_s=3600.0,
                                     finished_ttl_s=BRIEF_S)
    job_id = await queue.enqueue(chat(), caller_waits=True)
    await finish(queue, 1)

    await past_brief_retention(queue)

    assert await queue.get(job_id) is None


async def test_through_the_gateway_a_synchronous_call_s_job_goes_and_an_asynchronous_one_stays(
    queue_factory: QueueFactory,
) -> None:
    async with open_gateway(queue_factory, queue_settings=RETENTION) as gw:
        # Given a synchronous call answered, a background job finished, and a stored response
        answered = await gw.http.post("/v1/chat/completions", json=CHAT, headers=gw.auth("acme"))
        accepted = await gw.http.post("/v1/jobs", json={"kind": "chat", "body": CHAT},
                                      headers=gw.auth("acme"))
        [background] = accepted.json()["ids"]
        polled = await gw.http.get(f"/v1/jobs/{background}", params={"wait": 10}, headers=gw.auth("acme"))
        response = await gw.http.post("/v1/responses", json={"model": "auto", "input": "Say hello"},
                                      headers=gw.auth("acme"))
        assert answered.status_code == polled.status_code == response.status_code == 200

        # When the short retention has passed and upkeep ran (every 0.2 s here)
        await asyncio.sleep(BRIEF_S + 0.5)

        # Then the answered call's job is gone; the others stay, and the response can be fetched
        assert await gw.queue.get(answered.headers["X-Tidegate-Job-Id"]) is None
        assert await gw.queue.get(background) is not None
        fetched = await gw.http.get(f"/v1/responses/{response.json()['id']}", headers=gw.auth("acme"))
        assert fetched.status_code == 200 and fetched.json()["status"] == "completed"


async def test_a_call_that_times_out_leaves_its_job_to_be_fetched(queue_factory: QueueFactory) -> None:
    async with open_gateway(queue_factory, worker=False, queue_settings=RETENTION) as gw:
        answer = await gw.http.post("/v1/chat/completions", json=CHAT,
                                    headers={**gw.auth("acme"), "X-Tidegate-Timeout": "0.2"})

        assert answer.status_code == 504
        job = await gw.queue.get(answer.json()["error"]["job_id"])
        assert job is not None and not job.caller_waits  # kept finished_ttl_s, deferred by budgets


# ---------------------------------------------------------------------- SQLite: space given back


def _pragma(path: Path, name: str) -> int:
    with sqlite3.connect(path) as conn:
        return int(conn.execute(f"PRAGMA {name}").fetchone()[0])


async def _open_and_close(path: Path, **settings: Any) -> None:
    async with Queue.from_url(f"sqlite:///{path}", maintenance_interval_s=None, **settings) as queue:
        await queue.stats()


async def test_a_new_sqlite_file_gives_space_back(tmp_path: Path) -> None:
    path = tmp_path / "new.db"

    await _open_and_close(path)

    assert _pragma(path, "auto_vacuum") == AUTO_VACUUM_INCREMENTAL


def _layout_before(schema: str) -> str:
    """The queue's schema as a release before format 2 wrote it: no caller_waits and brief columns,
    no index of answered jobs."""
    kept = [line for line in schema.splitlines() if not line.lstrip().startswith(("caller_waits ", "brief "))]
    text = "\n".join(kept).replace("failure BLOB,", "failure BLOB")
    start = text.index("CREATE INDEX IF NOT EXISTS jobs_answered")
    return text[:start] + text[text.index(";", start) + 1:]


def _file_from_before(path: Path) -> str:
    """A queue file as 0.1.0 left it: its tables, no formats recorded, WAL mode, auto_vacuum
    none, and one job waiting; the job's id."""
    with sqlite3.connect(path, isolation_level=None) as conn:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.executescript(_layout_before(SQLITE_SCHEMA))
        conn.execute("INSERT INTO jobs (id, priority, level, tenant, state, payload, created_ms, ready_ms,"
                     " max_attempts) VALUES ('old-1', 2, 2, 'acme', 'queued', ?, 1, 1, 3)",
                     (orjson.dumps(chat("kept")),))
    assert _pragma(path, "auto_vacuum") == 0
    return "old-1"


def test_a_file_from_before_is_switched_when_opened_with_its_jobs_intact(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    job_id = _file_from_before(path)

    async def read() -> Any:
        async with Queue.from_url(f"sqlite:///{path}", maintenance_interval_s=None) as queue:
            return await queue.get(job_id)

    job = asyncio.run(read())

    assert _pragma(path, "auto_vacuum") == AUTO_VACUUM_INCREMENTAL
    assert job is not None and job.payload == chat("kept") and not job.caller_waits
    with sqlite3.connect(path) as conn:
        version = conn.execute(f"SELECT version FROM {FORMATS_TABLE} WHERE store = 'queue'").fetchone()[0]
    assert version == 2


def test_under_migrate_check_a_file_from_before_is_left_as_it_is(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Given a file in the code's formats whose auto_vacuum was never switched on
    path = tmp_path / "old.db"
    asyncio.run(_open_and_close(path))
    with sqlite3.connect(path, isolation_level=None) as conn:
        conn.execute("PRAGMA auto_vacuum=NONE")
        conn.execute("VACUUM")

    with caplog.at_level(logging.WARNING, logger="tidegate.sqlite"), migrating("check"):
        asyncio.run(_open_and_close(path))

    assert _pragma(path, "auto_vacuum") == 0
    assert "tidegate migrate --apply" in caplog.text


async def test_the_file_shrinks_once_its_jobs_have_gone(tmp_path: Path) -> None:
    # Given a file that held much more than the reclaim slack in jobs, now purged
    path = tmp_path / "shrinks.db"
    async with Queue.from_url(f"sqlite:///{path}", maintenance_interval_s=None, **RETENTION) as queue:
        blob = os.urandom(6_000).hex()  # 12 kB a job: 30 MB in all
        for start in range(0, 2_500, 500):
            await queue.enqueue_many([{"payload": chat(blob, n=n), "caller_waits": True}
                                      for n in range(start, start + 500)])
            await finish(queue, 500)
        full_pages = _pragma(path, "page_count")
        await asyncio.sleep(BRIEF_S + 0.1)

        # When upkeep runs until nothing more is given back
        reports = [await queue.maintain() for _ in range(40)]

    # Then the jobs are gone and the file kept only the slack of free pages
    assert sum(report.purged for report in reports) == 2_500
    assert sum(report.extra.get("reclaimed_pages", 0) for report in reports) > 0
    page_bytes = _pragma(path, "page_size")
    assert _pragma(path, "freelist_count") <= RECLAIM_KEEP_FREE_BYTES // page_bytes
    assert _pragma(path, "page_count") < full_pages / 2
