"""GET /v1/admin/provider-batches on both queue backends: the batches a worker sent to the
simulator's own batch API, the newest first and a page at a time, each with its jobs' progress
(waiting, collected, cancelled) as the queue knows it, counted over an even sample of a large
batch; an empty list that says so when no provider has a `batch` section."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from conftest import QueueFactory
from support.dispatch import wait_final
from support.gateway import Gateway, open_gateway
from support.provider_batches import bulk_jobs, gateway_sending_batches, waiting_in_a_batch
from tidegate.dispatch.provider_batches.store import BatchedJob, ProviderBatchRecord
from tidegate.gateway.admin.provider_batches import SAMPLE_JOBS
from tidegate.jobs import JobState

PATH = "/v1/admin/provider-batches"


async def listed(gw: Gateway, query: str = "") -> dict[str, Any]:
    """The admin's page of provider batches."""
    answer = await gw.http.get(f"{PATH}{query}", headers=gw.auth("ops"))
    assert answer.status_code == 200, answer.text
    page: dict[str, Any] = answer.json()
    return page


async def pages(gw: Gateway, limit: int) -> list[dict[str, Any]]:
    """Every provider batch listed, read `limit` at a time."""
    rows: list[dict[str, Any]] = []
    after = ""
    for _ in range(100):
        page = await listed(gw, f"?limit={limit}{after}")
        assert len(page["data"]) <= limit
        rows += page["data"]
        if not page["has_more"]:
            return rows
        after = f"&after={page['last_id']}"
    raise AssertionError("the pages never ended")


def progress(page: dict[str, Any]) -> list[dict[str, int]]:
    return [row["progress"] for row in page["data"]]


def counts(sampled: int, **where: int) -> dict[str, int]:
    return {"sampled": sampled, "waiting": 0, "collected": 0, "served_live": 0, "cancelled": 0, "other": 0,
            **where}


async def test_provider_batches_are_listed_newest_first_with_their_jobs_progress(
    queue_factory: QueueFactory
) -> None:
    async with gateway_sending_batches(queue_factory, batch_latency_s=1.5) as gw:
        # Given three BULK jobs with a two days' deadline waiting in one provider batch
        first_ids = await bulk_jobs(gw.queue, 3)
        await waiting_in_a_batch(gw.queue, first_ids)
        page = await listed(gw)
        assert progress(page) == [counts(3, waiting=3)]
        [first] = page["data"]
        assert (first["provider"], first["model"], first["endpoint"], first["lines"]) == (
            "sim", "deepseek-v3.2", "/v1/chat/completions", 3)
        assert first["id"] == f"sim/{first['batch_id']}" and first["batch_id"].startswith("batch_")
        assert datetime.fromisoformat(first["submitted_at"]).tzinfo is not None
        assert (page["first_id"], page["has_more"], page["enabled"]) == (first["id"], False, True)
        # When one of them is cancelled, and two more jobs go in a second batch
        assert await gw.queue.cancel(first_ids[0])
        second_ids = await bulk_jobs(gw.queue, 2)
        jobs = await wait_final(gw.queue, first_ids + second_ids)
        assert [job.state for job in jobs] == [JobState.CANCELLED] + [JobState.SUCCEEDED] * 4

        # Then both are listed, the newest first, with what became of their jobs
        page = await listed(gw)
        assert [row["lines"] for row in page["data"]] == [2, 3]
        assert progress(page) == [counts(2, collected=2), counts(3, collected=2, cancelled=1)]
        # and a page at a time
        assert await pages(gw, limit=1) == page["data"]


@pytest.mark.sqlite_only  # what is counted does not depend on the backend
async def test_the_progress_of_a_large_batch_is_counted_over_an_even_sample(
    queue_factory: QueueFactory
) -> None:
    async with gateway_sending_batches(queue_factory, worker=False) as gw:
        # Given a batch of more jobs than the gateway reads for one, none of them served
        lines = 2 * SAMPLE_JOBS + 50
        ids = await bulk_jobs(gw.queue, lines)
        store = gw.state.provider_batches
        assert store is not None
        await store.record(ProviderBatchRecord("sim", "batch_big", "deepseek-v3.2", "/v1/chat/completions",
                                               tuple(ids), datetime.now(UTC)),
                           [BatchedJob(job_id, "sim", "batch_big") for job_id in ids])
        # and every other one of its first hundred lines served live
        await store.put_jobs([BatchedJob(job_id, "sim", "batch_big").served_live("its line failed")
                              for job_id in ids[:SAMPLE_JOBS:2]])
        [row] = (await listed(gw))["data"]
        assert row["lines"] == lines
        # Then its progress is counted over SAMPLE_JOBS of them, spread over all its lines
        sampled = [ids[n * lines // SAMPLE_JOBS] for n in range(SAMPLE_JOBS)]
        live = len(set(sampled) & set(ids[:SAMPLE_JOBS:2]))
        assert 0 < live < SAMPLE_JOBS // 2
        assert row["progress"] == counts(SAMPLE_JOBS, waiting=SAMPLE_JOBS - live, served_live=live)


@pytest.mark.sqlite_only  # no store is read
async def test_without_a_batch_section_the_list_is_empty_and_says_so(queue_factory: QueueFactory) -> None:
    async with open_gateway(queue_factory, worker=False) as gw:
        assert gw.state.provider_batches is None
        page = await listed(gw)
        assert (page["data"], page["has_more"], page["enabled"]) == ([], False, False)


@pytest.mark.sqlite_only  # refused before any store is read
async def test_bad_cursors_and_other_tenants_are_refused(queue_factory: QueueFactory) -> None:
    async with gateway_sending_batches(queue_factory, worker=False) as gw:
        for query, status, code in (("?after=no-slash", 400, "invalid_request"),
                                    ("?after=/batch_1", 400, "invalid_request"),
                                    ("?limit=0", 400, "invalid_request")):
            answer = await gw.http.get(f"{PATH}{query}", headers=gw.auth("ops"))
            assert answer.status_code == status, (query, answer.text)
            assert answer.json()["error"]["code"] == code
        assert (await listed(gw, "?after=sim/batch_unknown"))["data"] == []
        answer = await gw.http.get(PATH, headers=gw.auth("acme"))
        assert answer.status_code == 403
        assert answer.json()["error"]["code"] == "admin_only"
