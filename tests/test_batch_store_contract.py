"""The batch store's contract (files and their bytes, their expiry, batches, their lines and their
lines' answers, compare-and-set on a batch's status, per-tenant listing in pages), one suite on
every backend of the queue: the same SQLite file, Redis, Redis Cluster. Two store objects on one
queue stand for two gateway replicas."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence

import pytest

from conftest import QueueFactory
from support.dispatch import queue_url_of
from support.redis_keys import redis_client
from tidegate.errors import QueueClosed
from tidegate.gateway.batches.store import (
    BatchLine,
    BatchRecord,
    BatchStore,
    LineAnswer,
    LineError,
    StoredFile,
    batch_store_for,
)
from tidegate.gateway.batches.store.redis import RedisBatchStore


@pytest.fixture
async def stores(queue_factory: QueueFactory) -> AsyncIterator[tuple[BatchStore, BatchStore]]:
    """Two stores of the test's queue, as two gateway replicas would hold."""
    first, second = batch_store_for(queue_url_of(queue_factory)), batch_store_for(queue_url_of(queue_factory))
    async with first, second:
        yield first, second


def a_file(file_id: str, tenant: str = "acme", *, purpose: str = "batch",
           created_at: int = 100, expires_at: int | None = None) -> StoredFile:
    """A file's metadata."""
    return StoredFile(id=file_id, tenant=tenant, filename=f"{file_id}.jsonl", purpose=purpose, bytes=3,
                      created_at=created_at, expires_at=expires_at)


async def put_files(store: BatchStore, *files: StoredFile) -> None:
    """Store files of a few bytes."""
    for file in files:
        await store.put_file(file, b"{}")


async def paged(read: Callable[[str | None], Awaitable[tuple[Sequence[StoredFile | BatchRecord], bool]]],
                ) -> list[str]:
    """The ids of every record `read(after)` pages through, following its cursor."""
    ids: list[str] = []
    after = None
    while True:
        records, more = await read(after)
        ids += [record.id for record in records]
        if not more:
            return ids
        after = ids[-1]


async def all_files(store: BatchStore, tenant: str, purpose: str | None = None, *,
                    page: int = 2) -> list[str]:
    """The ids of every file of the tenant, read `page` at a time."""
    return await paged(lambda after: store.page_files(tenant, purpose, after=after, limit=page))


async def all_batches(store: BatchStore, tenant: str | None = None, *, page: int = 2) -> list[str]:
    """The ids of every batch (of the tenant), read `page` at a time."""
    return await paged(lambda after: store.page_batches(tenant, after=after, limit=page))


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
    await put_files(one, a_file("file-old", created_at=1), a_file("file-new", created_at=2),
                    a_file("file-out", purpose="batch_output", created_at=3),
                    a_file("file-theirs", tenant="globex"))

    assert await all_files(other, "acme") == ["file-out", "file-new", "file-old"]
    assert await all_files(other, "acme", "batch") == ["file-new", "file-old"]
    assert await all_files(other, "globex") == ["file-theirs"]
    assert await all_files(other, "initech") == []


async def test_files_are_paged_by_a_cursor_ties_in_one_second_ordered_by_id(
    stores: tuple[BatchStore, BatchStore],
) -> None:
    one, other = stores
    # Given seven files of one tenant, three made in the same second, and files of another
    for n, created_at in enumerate((5, 7, 7, 7, 9, 11, 12)):
        await one.put_file(a_file(f"file-{n}", created_at=created_at), b"{}")
    await one.put_file(a_file("file-theirs", tenant="globex", created_at=8), b"{}")

    first, more = await other.page_files("acme", limit=3)
    rest, done = await other.page_files("acme", after=first[-1].id, limit=10)

    # Then each page follows the one before, newest first, ids breaking ties, nothing repeated
    assert ([f.id for f in first], more) == (["file-6", "file-5", "file-4"], True)
    assert ([f.id for f in rest], done) == (["file-3", "file-2", "file-1", "file-0"], False)
    assert await all_files(other, "acme", page=1) == [f"file-{n}" for n in range(6, -1, -1)]
    # A cursor that is not the tenant's (unknown, another tenant's) reads nothing
    assert await other.page_files("acme", after="file-theirs", limit=10) == ([], False)
    assert await other.page_files("acme", after="file-unknown", limit=10) == ([], False)
    # A file deleted leaves the listing
    await one.delete_file("file-5")
    assert "file-5" not in await all_files(other, "acme")


async def test_expired_files_are_found_soonest_first_until_deleted(
    stores: tuple[BatchStore, BatchStore],
) -> None:
    one, other = stores
    await put_files(one, a_file("file-late", expires_at=300), a_file("file-soon", expires_at=200),
                    a_file("file-kept"), a_file("file-theirs", tenant="globex", expires_at=250))

    assert [f.id for f in await other.expired_files(199, 10)] == []
    assert [f.id for f in await other.expired_files(250, 10)] == ["file-soon", "file-theirs"]
    assert [f.id for f in await other.expired_files(10_000, 2)] == ["file-soon", "file-theirs"]
    assert (await other.get_file("file-late")) == a_file("file-late", expires_at=300)
    await other.delete_file("file-soon")
    assert [f.id for f in await one.expired_files(10_000, 10)] == ["file-theirs", "file-late"]


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


async def test_batches_are_listed_per_tenant_or_all_newest_first_in_pages(
    stores: tuple[BatchStore, BatchStore],
) -> None:
    one, other = stores
    await one.insert_batch(a_batch("batch_a", created_at=1))
    await one.insert_batch(a_batch("batch_b", created_at=2))
    await one.insert_batch(a_batch("batch_c", created_at=2))
    await one.insert_batch(a_batch("batch_g", tenant="globex", created_at=3))
    await one.insert_batch(a_batch("batch_z", created_at=4))

    first, more = await other.page_batches("acme", limit=2)
    assert ([b.id for b in first], more) == (["batch_z", "batch_c"], True)
    assert await all_batches(other, "acme") == ["batch_z", "batch_c", "batch_b", "batch_a"]
    assert await all_batches(other, "globex") == ["batch_g"]
    assert await all_batches(other) == ["batch_z", "batch_g", "batch_c", "batch_b", "batch_a"]
    assert await other.page_batches("acme", after="batch_g", limit=5) == ([], False)
    # A batch changing status stays where it was listed
    await one.swap_batch(a_batch("batch_c", created_at=2).update(status="in_progress"), "validating")
    assert await all_batches(other, "acme", page=3) == ["batch_z", "batch_c", "batch_b", "batch_a"]


async def test_active_batches_are_those_in_progress_checked_longest_ago_first(
    stores: tuple[BatchStore, BatchStore],
) -> None:
    one, other = stores
    for batch_id, checked_ms in (("batch_a", 30), ("batch_b", 10), ("batch_c", 20), ("batch_d", 5)):
        await one.insert_batch(a_batch(batch_id))
        in_progress = a_batch(batch_id).update(status="in_progress", checked_ms=checked_ms)
        await one.swap_batch(in_progress, "validating")
    # batch_d ends; batch_a is cancelling, still followed
    await one.swap_batch(a_batch("batch_d").update(status="completed", checked_ms=5), "in_progress")
    await one.swap_batch(a_batch("batch_a").update(status="cancelling", checked_ms=1), "in_progress")
    await one.insert_batch(a_batch("batch_v"))  # validating: not yet followed

    assert [b.id for b in await other.active_batches()] == ["batch_a", "batch_b", "batch_c"]
    assert [b.id for b in await other.active_batches(2)] == ["batch_a", "batch_b"]
    # A check moves a batch to the back
    await one.swap_batch(a_batch("batch_a").update(status="cancelling", checked_ms=99), "cancelling")
    assert [b.id for b in await other.active_batches(2)] == ["batch_b", "batch_c"]


async def test_a_lines_answer_is_written_once_and_dropped_with_the_batch(
    stores: tuple[BatchStore, BatchStore],
) -> None:
    one, other = stores
    answered = LineAnswer(output=True, record=b'{"custom_id": "a", "response": {"body": "\xc3\xa9"}}\n')
    failed = LineAnswer(output=False, record=b'{"custom_id": "b", "error": {"code": "batch_expired"}}\n')
    await one.put_answers("batch_1", {"a": answered, "b": failed})
    # Another replica, later, finds the job gone: what was recorded first stays
    await asyncio.gather(
        other.put_answers("batch_1", {"a": LineAnswer(output=False, record=b"gone\n")}),
        one.put_answers("batch_1", {"c": answered}))
    await other.put_answers("batch_1", {})

    assert await other.get_answers("batch_1") == {"a": answered, "b": failed, "c": answered}
    assert await other.get_answers("batch_2") == {}
    await one.drop_answers("batch_1")
    assert await other.get_answers("batch_1") == {}


async def test_a_closed_store_refuses_use(queue_factory: QueueFactory) -> None:
    store = batch_store_for(queue_url_of(queue_factory))
    async with store:
        await store.put_file(a_file("file-a"), b"x")
    with pytest.raises(QueueClosed):
        await store.get_file("file-a")


@pytest.mark.redis_only
async def test_records_stored_before_the_indexes_are_indexed_once_and_stale_entries_dropped(
    queue_factory: QueueFactory,
) -> None:
    # Given a file and two batches written as an older version wrote them: hashes only, no index
    store = batch_store_for(queue_url_of(queue_factory))
    assert isinstance(store, RedisBatchStore)
    running = a_batch("batch_old").update(status="in_progress", checked_ms=7)
    client = redis_client(store.url)
    try:
        await client.hset(store.files_key, "file-old", a_file("file-old", expires_at=50).model_dump_json())
        await client.set(f"tidegate:{{{store.name}}}:file:file-old", b"{}")
        await client.hset(store.batches_key, mapping={
            "batch_old": running.model_dump_json(),
            "batch_done": a_batch("batch_done").update(status="completed").model_dump_json()})
        async with store:
            # Then the first reads find them, each index by its own key
            assert await all_files(store, "acme") == ["file-old"]
            assert [f.id for f in await store.expired_files(60, 10)] == ["file-old"]
            assert await all_batches(store, "acme") == ["batch_old", "batch_done"]
            assert [b.id for b in await store.active_batches()] == ["batch_old"]
            assert await client.get(store.indexed_key) == b"1"

            # And an entry whose record is gone or ended leaves the sweep's indexes when read
            await client.hdel(store.files_key, "file-old")
            ended = running.update(status="completed")
            await client.hset(store.batches_key, "batch_old", ended.model_dump_json())
            assert await store.expired_files(60, 10) == []
            assert await store.active_batches() == []
            assert await client.zcard(store.expiring_key) == await client.zcard(store.active_key) == 0
    finally:
        await client.aclose()
