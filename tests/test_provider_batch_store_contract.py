"""The provider-batch store's contract, one suite on every backend of the queue (the same SQLite
file, Redis, Redis Cluster): a batch and its jobs are seen by another worker's store, a job's entry
can be replaced (to be served live), each step of a batch's upkeep goes to one worker, a closed
store refuses use; and the SQLite store forgets
records older than KEEP_S, as Redis lets them expire."""

from __future__ import annotations

import contextlib
import sqlite3
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from conftest import QueueFactory
from support.dispatch import queue_url_of
from tidegate.dispatch.provider_batches.store import (
    CANCEL,
    CLEAN_UP,
    KEEP_S,
    BatchedJob,
    ProviderBatchRecord,
    ProviderBatchStore,
    SqliteProviderBatchStore,
    provider_batch_store_for,
)
from tidegate.errors import DispatchClosed

HOLD = {"id": "r-1", "tenant": "acme", "amount_micros": 120, "day": "2026-12-03", "enforced": True}


@pytest.fixture
async def stores(queue_factory: QueueFactory) -> AsyncIterator[tuple[ProviderBatchStore, ProviderBatchStore]]:
    """Two stores of the test's queue, as two workers would hold."""
    url = queue_url_of(queue_factory)
    first, second = provider_batch_store_for(url), provider_batch_store_for(url)
    async with first, second:
        yield first, second


async def test_a_recorded_batch_and_its_jobs_are_seen_by_another_worker(
    stores: tuple[ProviderBatchStore, ProviderBatchStore]
) -> None:
    first, second = stores
    submitted_at = datetime(2026, 12, 3, 20, 0, tzinfo=UTC)
    batch = ProviderBatchRecord("sim", "batch_1", "deepseek-v3.2", "/v1/chat/completions", ("j-1", "j-2"),
                                submitted_at)
    jobs = [BatchedJob("j-1", "sim", "batch_1", HOLD), BatchedJob("j-2", "sim", "batch_1")]
    await first.record(batch, jobs)
    assert await second.batch("sim", "batch_1") == batch
    assert await second.job("j-1") == BatchedJob("j-1", "sim", "batch_1", HOLD)
    assert await second.job("j-2") == BatchedJob("j-2", "sim", "batch_1")
    assert await second.job("j-3") is None
    assert await second.batch("other", "batch_1") is None


async def test_a_job_to_be_served_live_keeps_its_batch_and_gives_its_hold_back(
    stores: tuple[ProviderBatchStore, ProviderBatchStore]
) -> None:
    first, second = stores
    batch = ProviderBatchRecord("sim", "batch_2", "deepseek-v3.2", "/v1/embeddings", ("j-4",),
                                datetime.now(UTC))
    await first.record(batch, [BatchedJob("j-4", "sim", "batch_2", HOLD)])
    live = (await second.job("j-4") or pytest.fail("not recorded")).served_live("its line failed")
    await second.put_jobs([live])
    assert await first.job("j-4") == BatchedJob("j-4", "sim", "batch_2", None, "its line failed")


async def test_a_closed_store_refuses_use(queue_factory: QueueFactory) -> None:
    store = provider_batch_store_for(queue_url_of(queue_factory))
    await store.job("j-1")
    await store.close()
    with pytest.raises(DispatchClosed):
        await store.job("j-1")


async def test_the_sqlite_store_forgets_records_older_than_a_week_as_new_batches_are_recorded(
    tmp_path: Path
) -> None:
    path = str(tmp_path / "queue.db")
    old = ProviderBatchRecord("sim", "batch_old", "deepseek-v3.2", "/v1/embeddings", ("j-5",),
                              datetime.now(UTC) - timedelta(days=8))
    async with SqliteProviderBatchStore(path) as store:
        await store.record(old, [BatchedJob("j-5", "sim", "batch_old", HOLD)])
    # Given a batch and its job written more than KEEP_S ago (as Redis would have let them expire)
    written_ms = int((time.time() - KEEP_S - 60) * 1000)
    with contextlib.closing(sqlite3.connect(path)) as conn, conn:
        tables = [row[0] for row in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name LIKE 'provider_batch%'")]
        for table in tables:
            conn.execute(f"UPDATE {table} SET written_ms = ?", (written_ms,))
    # When another batch is recorded
    new = replace(old, batch_id="batch_new", job_ids=("j-6",), submitted_at=datetime.now(UTC))
    async with SqliteProviderBatchStore(path) as store:
        await store.record(new, [BatchedJob("j-6", "sim", "batch_new")])
        # Then the old records are gone, and the new ones kept
        assert await store.batch("sim", "batch_old") is None and await store.job("j-5") is None
        assert await store.batch("sim", "batch_new") == new
        assert await store.job("j-6") == BatchedJob("j-6", "sim", "batch_new")
    with contextlib.closing(sqlite3.connect(path)) as conn:
        left = {table: conn.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0]
                for table in tables}
    assert left == {"provider_batches": 1, "provider_batch_jobs": 1} | {
        table: 0 for table in tables if table not in ("provider_batches", "provider_batch_jobs")}


async def test_each_step_of_a_batchs_upkeep_is_claimed_once_and_clean_up_retires_it(
    stores: tuple[ProviderBatchStore, ProviderBatchStore]
) -> None:
    first, second = stores
    now = datetime.now(UTC)
    older = ProviderBatchRecord("sim", "batch_3", "deepseek-v3.2", "/v1/embeddings", ("j-7",), now)
    newer = replace(older, batch_id="batch_4", job_ids=("j-8",))
    await first.record(older, [BatchedJob("j-7", "sim", "batch_3")])
    await first.record(newer, [BatchedJob("j-8", "sim", "batch_4")])
    assert await second.open_batches(10) == [older, newer]
    assert await second.open_batches(1) == [older]
    # Each step goes to one worker only
    assert await first.claim("sim", "batch_3", CANCEL)
    assert not await second.claim("sim", "batch_3", CANCEL)
    assert await second.open_batches(10) == [older, newer]  # cancelled, it still has files
    assert await second.claim("sim", "batch_3", CLEAN_UP)
    assert not await first.claim("sim", "batch_3", CLEAN_UP)
    # and the batch cleaned up is open no more; its records stay for its jobs
    assert await first.open_batches(10) == [newer]
    assert await first.batch("sim", "batch_3") == older


async def test_recent_batches_are_paged_newest_first_retired_ones_included(
    stores: tuple[ProviderBatchStore, ProviderBatchStore]
) -> None:
    first, second = stores
    now = datetime.now(UTC)
    batches = [ProviderBatchRecord("sim", f"batch_r{n}", "deepseek-v3.2", "/v1/chat/completions",
                                   (f"j-r{n}",), now + timedelta(seconds=n)) for n in range(3)]
    for batch in batches:
        await first.record(batch, [BatchedJob(batch.job_ids[0], "sim", batch.batch_id)])
    # Given the oldest retired from the open batches
    assert await first.claim("sim", "batch_r0", CLEAN_UP)
    newest_first = batches[::-1]
    # Then every batch is listed, the newest first, a page at a time
    assert await second.recent(10) == (newest_first, False)
    assert await second.recent(2) == (newest_first[:2], True)
    assert await second.recent(2, after=("sim", "batch_r1")) == (newest_first[2:], False)
    assert await second.recent(2, after=("sim", "batch_r0")) == ([], False)
    # and after a batch it never recorded, none
    assert await second.recent(2, after=("sim", "batch_unknown")) == ([], False)
    assert await second.recent(2, after=("other", "batch_r1")) == ([], False)


async def test_the_entries_of_many_jobs_are_read_at_once(
    stores: tuple[ProviderBatchStore, ProviderBatchStore]
) -> None:
    first, second = stores
    batch = ProviderBatchRecord("sim", "batch_m", "deepseek-v3.2", "/v1/chat/completions",
                                ("j-m1", "j-m2"), datetime.now(UTC))
    entries = [BatchedJob("j-m1", "sim", "batch_m", HOLD), BatchedJob("j-m2", "sim", "batch_m")]
    await first.record(batch, entries)
    await first.put_jobs([entries[1].served_live("its line failed")])
    assert await second.jobs(["j-m2", "j-none", "j-m1"]) == {
        "j-m1": entries[0], "j-m2": BatchedJob("j-m2", "sim", "batch_m", None, "its line failed")}
    assert await second.jobs([]) == {}
