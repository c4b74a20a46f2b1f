"""The batch store's contract (files and their bytes, batches, their lines, compare-and-set on a
batch's status), one suite on every backend of the queue: the same SQLite file, Redis, Redis
Cluster. Two store objects on one queue stand for two gateway replicas."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from conftest import QueueFactory
from dispatch_support import queue_url_of
from tidegate.coord.batches import BatchLine, BatchRecord, BatchStore, LineError, StoredFile, batch_store_for
from tidegate.errors import QueueClosed


@pytest.fixture
async def stores(queue_factory: QueueFactory) -> AsyncIterator[tuple[BatchStore, BatchStore]]:
    """Two stores of the test's queue, as two gateway replicas would hold."""
    first, second = batch_store_for(queue_url_of(queue_factory)), batch_store_for(queue_url_of(queue_factory))
    async with first, second:
        yield first, second


def a_file(file_id: str, tenant: str = "acme", *, purpose: str = "batch",
           created_at: int = 100) -> StoredFile:
    """A file's metadata."""
    return StoredFile(id=file_id, tenant=tenant, filename=f"{file_id}.jsonl", purpose=purpose, bytes=3,
                      created_at=created_at)


def a_batch(batch_id: str, tenant: str = "acme", *, created_at: int = 100) -> BatchRecord:
    """A batch just made."""
    return BatchRecord(id=batch_id, tenant=tenant, priority=4, input_file_id="file-1",
                       endpoint="/v1/chat/completions", completion_window="24h", status="validating",
                       created_at=created_at, expires_at=created_at + 86_400)


async def test_a_file_and_its_bytes_are_seen_by_another_replica_until_deleted(
    stores: tuple[BatchStore, BatchStore],
) -> None:
    one, other = stores
    content = bytes(range(256)) * 4  # any bytes, not only text, come back as they were
    await one.put_file(a_file("file-a"), content)

    assert await other.get_file("file-a") == a_file("file-a")
    assert await other.file_content("file-a") == content
    assert await other.delete_file("file-a") is True
    assert await one.get_file("file-a") is None
    assert await one.file_content("file-a") is None
    assert await one.delete_file("file-a") is False


async def test_files_are_listed_per_tenant_newest_first_and_by_purpose(
    stores: tuple[BatchStore, BatchStore],
) -> None:
    one, other = stores
    await one.put_file(a_file("file-old", created_at=1), b"{}")
    await one.put_file(a_file("file-new", created_at=2), b"{}")
    await one.put_file(a_file("file-out", purpose="batch_output", created_at=3), b"{}")
    await one.put_file(a_file("file-theirs", tenant="globex"), b"{}")

    assert [f.id for f in await other.list_files("acme")] == ["file-out", "file-new", "file-old"]
    assert [f.id for f in await other.list_files("acme", "batch")] == ["file-new", "file-old"]
    assert [f.id for f in await other.list_files("globex")] == ["file-theirs"]
    assert await other.list_files("initech") == []


async def test_a_batch_is_inserted_once_and_its_lines_kept_in_order(
    stores: tuple[BatchStore, BatchStore],
) -> None:
    one, other = stores
    assert await one.insert_batch(a_batch("batch_1")) is True
    assert await other.insert_batch(a_batch("batch_1").update(endpoint="/v1/embeddings")) is False
    lines = [BatchLine(custom_id="b", job_id="j1"),
             BatchLine(custom_id=None, error=LineError(code="invalid_json", message="line 2: bad", line=2)),
             BatchLine(custom_id="a", job_id="j3", ended="succeeded")]
    await one.put_lines("batch_1", lines)

    assert await other.get_batch("batch_1") == a_batch("batch_1")
    assert await other.get_lines("batch_1") == lines
    assert await other.get_lines("batch_unknown") == []
    assert await other.get_batch("batch_unknown") is None


async def test_a_status_change_is_a_compare_and_set_and_one_of_two_racers_wins(
    stores: tuple[BatchStore, BatchStore],
) -> None:
    one, other = stores
    await one.insert_batch(a_batch("batch_1"))
    in_progress = a_batch("batch_1").update(status="in_progress", in_progress_at=101)
    assert await one.swap_batch(in_progress, "validating") is True
    assert await other.swap_batch(in_progress.update(status="failed"), "validating") is False

    # Two replicas finalize at once: exactly one moves it on
    wins = await asyncio.gather(one.swap_batch(in_progress.update(status="finalizing"), "in_progress"),
                                other.swap_batch(in_progress.update(status="cancelling"), "in_progress"))
    assert sorted(wins) == [False, True]
    stored = await one.get_batch("batch_1")
    assert stored is not None and stored.status == ("finalizing" if wins[0] else "cancelling")
    assert await one.swap_batch(a_batch("batch_unknown"), "validating") is False


async def test_batches_are_listed_per_tenant_or_all_newest_first(
    stores: tuple[BatchStore, BatchStore],
) -> None:
    one, other = stores
    await one.insert_batch(a_batch("batch_a", created_at=1))
    await one.insert_batch(a_batch("batch_b", created_at=2))
    await one.insert_batch(a_batch("batch_g", tenant="globex", created_at=3))

    assert [b.id for b in await other.list_batches("acme")] == ["batch_b", "batch_a"]
    assert [b.id for b in await other.list_batches()] == ["batch_g", "batch_b", "batch_a"]


async def test_a_closed_store_refuses_use(queue_factory: QueueFactory) -> None:
    store = batch_store_for(queue_url_of(queue_factory))
    async with store:
        await store.put_file(a_file("file-a"), b"x")
    with pytest.raises(QueueClosed):
        await store.get_file("file-a")
