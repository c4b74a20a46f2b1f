"""What a batch and a file keep over time, with the official OpenAI SDK against a real gateway (a
worker and the simulated provider behind it), on SQLite and on Redis: a line's answer outlives its
job in the queue, the gateways' sweep ends a batch nobody asks about, files expire and are
deleted (never the input of a batch in progress), and listing pages through one tenant's files.

One gateway per backend serves the module, its sweep every 0.1 s; a second one, whose queue keeps
a finished job one second, shows the queue's own retention at work."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import openai
import pytest
import pytest_asyncio
from openai import AsyncOpenAI

from conftest import BACKENDS
from support.gateway import Gateway, module_gateway
from support.waiting import eventually
from test_gateway_batches import SLOW_MODEL, chat_line, ended, jsonl, lines_of, slow, status_of, upload
from tidegate.ai import result_of
from tidegate.app.components import Given
from tidegate.app.gateway import open_gateway_state
from tidegate.config import TidegateConfig
from tidegate.errors import ConfigError
from tidegate.gateway.batches.sweep import sweep_once
from tidegate.gateway.core.settings import GatewaySettings
from tidegate.jobs import FINAL_STATES, Job
from tidegate.queue import Queue

pytestmark = pytest.mark.asyncio(loop_scope="module")

SETTINGS = GatewaySettings(max_batch_lines=100, batch_progress_s=0.05, batch_sweep_s=0.1)
DAY_S = 86_400


@pytest_asyncio.fixture(scope="module", loop_scope="module", params=BACKENDS)
async def gw(request: pytest.FixtureRequest,
             tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Gateway]:
    """A gateway sweeping every 0.1 s, with a worker and the simulator, on each queue backend."""
    async with module_gateway(request, tmp_path_factory, settings=SETTINGS) as gateway:
        yield gateway


@pytest_asyncio.fixture(scope="module", loop_scope="module", params=BACKENDS)
async def short(request: pytest.FixtureRequest,
                tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Gateway]:
    """The same, its queue keeping a finished job one second."""
    async with module_gateway(request, tmp_path_factory, settings=SETTINGS,
                              queue_settings={"finished_ttl_s": 1.0}) as gateway:
        yield gateway


async def create(client: AsyncOpenAI, lines: list[dict[str, Any]]) -> str:
    """The id of a new chat batch of these lines."""
    file_id = await upload(client, [*lines])
    batch = await client.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions",
                                        completion_window="24h")
    return batch.id


async def final_jobs(gw: Gateway, batch_id: str, custom_ids: list[str]) -> dict[str, Job]:
    """The jobs of these lines of the batch, once each has ended (waited for as they run)."""
    lines = {line.custom_id: line.job_id for line in await gw.state.batches.get_lines(batch_id)}
    jobs = await asyncio.gather(*(gw.queue.wait(lines[custom_id] or "", 20.0) for custom_id in custom_ids))
    assert all(job.state in FINAL_STATES for job in jobs)
    return dict(zip(custom_ids, jobs, strict=True))


def bodies(jobs: dict[str, Job]) -> dict[str, Any]:
    """What each job answered, as the provider's body."""
    results = {custom_id: result_of(job) for custom_id, job in jobs.items()}
    return {custom_id: None if result is None else result.response for custom_id, result in results.items()}


async def output_bodies(client: AsyncOpenAI, file_id: str | None) -> dict[str, Any]:
    """The answers of an output file, by custom_id."""
    return {line["custom_id"]: line["response"]["body"] for line in await lines_of(client, file_id)}


async def forget(gw: Gateway, jobs: dict[str, Job]) -> None:
    """Delete finished jobs from the queue, as its retention does."""
    for job in jobs.values():
        assert await gw.queue.forget(job.id) is True
        assert await gw.queue.get(job.id) is None


async def stored_status(gw: Gateway, batch_id: str, wanted: str) -> None:
    """Wait, reading the store and never the API, until the batch has the status `wanted`."""
    async def reached() -> bool:
        batch = await gw.state.batches.get_batch(batch_id)
        return batch is not None and batch.status == wanted

    await eventually(reached, f"the stored batch is {wanted}")


# ---------------------------------------------------------------------- answers


async def test_answers_of_lines_whose_jobs_left_the_queue_are_in_the_output_file(gw: Gateway) -> None:
    async with gw.openai("acme") as client:
        with slow(gw, SLOW_MODEL, 2_000):
            # Given a batch whose fast lines end while its slow line still runs
            fast = [f"f{n}" for n in range(4)]
            batch_id = await create(client, [chat_line(custom_id, f"Say {custom_id}") for custom_id in fast]
                                    + [chat_line("slow", model=SLOW_MODEL)])
            early = await final_jobs(gw, batch_id, fast)
            polled = await client.batches.retrieve(batch_id)

            # When the queue drops the fast lines' jobs before the batch ends
            await forget(gw, early)
            late = await final_jobs(gw, batch_id, ["slow"])
            batch = await ended(client, batch_id)

        # Then every answer is in the output file, each the body its job returned
        assert polled.status == "in_progress"
        assert batch.status == "completed" and batch.error_file_id is None
        assert batch.request_counts is not None and batch.request_counts.completed == 5
        assert await output_bodies(client, batch.output_file_id) == bodies(early | late)
        assert all(body["choices"][0]["message"]["content"] for body in bodies(early | late).values())


async def test_the_sweep_collects_the_answers_and_ends_a_batch_nobody_polls(gw: Gateway) -> None:
    async with gw.openai("acme") as client:
        with slow(gw, SLOW_MODEL, 1_500):
            # Given a batch nobody asks about after making it, its fast lines ended
            fast = ["a", "b", "c"]
            batch_id = await create(client, [chat_line(custom_id) for custom_id in fast]
                                    + [chat_line("slow", model=SLOW_MODEL)])
            early = await final_jobs(gw, batch_id, fast)

            # When the sweep has kept their answers, and the queue then drops their jobs
            async def kept() -> bool:
                return set(await gw.state.batches.get_answers(batch_id)) >= set(fast)

            await eventually(kept, "the sweep has kept the fast lines' answers")
            await forget(gw, early)
            late = await final_jobs(gw, batch_id, ["slow"])
            await stored_status(gw, batch_id, "completed")

        # Then the sweep ended the batch with every answer, and dropped the answers it copied
        batch = await client.batches.retrieve(batch_id)
        assert batch.status == "completed" and batch.request_counts is not None
        assert batch.request_counts.completed == 4
        assert await output_bodies(client, batch.output_file_id) == bodies(early | late)
        assert await gw.state.batches.get_answers(batch_id) == {}


async def test_a_queue_that_keeps_finished_jobs_a_second_loses_no_answer(short: Gateway) -> None:
    # Given a gateway whose queue drops a finished job a second after it ends
    async with short.openai("acme") as client:
        with slow(short, SLOW_MODEL, 3_000):
            # When a batch's fast lines end long before its slow line, and nobody polls
            fast = [f"q{n}" for n in range(4)]
            batch_id = await create(client, [chat_line(custom_id) for custom_id in fast]
                                    + [chat_line("slow", model=SLOW_MODEL)])
            early = await final_jobs(short, batch_id, fast)
            late = await final_jobs(short, batch_id, ["slow"])
            await stored_status(short, batch_id, "completed")
            async def dropped() -> bool:  # by the queue's upkeep, a second after they ended
                await short.queue.maintain()
                return not any([await short.queue.get(job.id) for job in (early | late).values()])

            await eventually(dropped, "the queue has dropped every finished job")

        # Then the output file holds every line's answer, though no job is left in the queue
        batch = await client.batches.retrieve(batch_id)
        assert batch.status == "completed"
        assert await output_bodies(client, batch.output_file_id) == bodies(early | late)



async def test_a_sweep_too_slow_for_the_queues_retention_is_refused(tmp_path: Path) -> None:
    queue = Queue.from_url(f"sqlite:///{tmp_path / 'queue.db'}", finished_ttl_s=100.0)
    async with queue:
        # A batch of 50,000 lines takes 25 sweeps to read: 25 minutes at 60 s a sweep
        with pytest.raises(ConfigError, match="batch_sweep_s"):
            async with open_gateway_state(TidegateConfig(queue_url=f"sqlite:///{tmp_path / 'queue.db'}"),
                                          settings=GatewaySettings(batch_sweep_s=60.0),
                                          given=Given(queue=queue), recs_url=None):
                pass


# ---------------------------------------------------------------------- files


def expiring(seconds: int, anchor: str = "created_at") -> Any:
    """An upload's `expires_after`."""
    return {"anchor": anchor, "seconds": seconds}


async def gone(client: AsyncOpenAI, file_id: str) -> None:
    """Assert the file answers 404 to a retrieve and to a read of its content."""
    for attempt in (client.files.retrieve(file_id), client.files.content(file_id)):
        with pytest.raises(openai.NotFoundError) as missing:
            await attempt
        assert status_of(missing.value) == (404, "file_not_found")


async def test_an_expired_upload_is_deleted_by_the_sweep_unless_a_batch_in_progress_reads_it(
    gw: Gateway,
) -> None:
    async with gw.openai("globex") as client:
        with slow(gw, SLOW_MODEL, 3_000):
            # Given two uploads that expire in an hour, one of them read by a batch in progress,
            # and one kept the default 30 days
            lapsing = await client.files.create(file=("a.jsonl", jsonl([chat_line("a")])), purpose="batch",
                                                expires_after=expiring(3600))
            read = await client.files.create(file=("b.jsonl", jsonl([chat_line("s", model=SLOW_MODEL)])),
                                             purpose="batch", expires_after=expiring(3600))
            kept = await client.files.create(file=("c.jsonl", jsonl([chat_line("c")])), purpose="batch")
            batch = await client.batches.create(input_file_id=read.id, endpoint="/v1/chat/completions",
                                                completion_window="24h")

            # When a sweep runs two hours later
            report = await sweep_once(gw.state, now_s=time.time() + 2 * 3600)

            # Then the lapsed file is gone; the one the batch reads and the one kept stay
            assert lapsing.expires_at == lapsing.created_at + 3600
            assert kept.expires_at == kept.created_at + 30 * DAY_S
            assert report.deleted_files >= 1
            await gone(client, lapsing.id)
            assert (await client.files.retrieve(read.id)).expires_at == read.created_at + 3600
            assert (await client.files.retrieve(kept.id)).id == kept.id
            done = await ended(client, batch.id)

        # Once the batch has ended, its input goes at the next sweep; its output and the upload
        # kept by default 30 days on
        await sweep_once(gw.state, now_s=time.time() + 2 * 3600)
        await gone(client, read.id)
        output = await client.files.retrieve(done.output_file_id or "")
        assert output.expires_at == output.created_at + 30 * DAY_S
        assert (await client.files.retrieve(kept.id)).id == kept.id
        await sweep_once(gw.state, now_s=time.time() + 31 * DAY_S)
        await gone(client, output.id)
        await gone(client, kept.id)


async def test_an_expiry_out_of_bounds_or_from_another_anchor_is_refused(gw: Gateway) -> None:
    async with gw.openai("globex") as client:
        before = [file.id async for file in client.files.list()]
        for expires_after, param in ((expiring(3599), "expires_after[seconds]"),
                                     (expiring(30 * DAY_S + 1), "expires_after[seconds]"),
                                     (expiring(3600, "last_active_at"), "expires_after[anchor]")):
            with pytest.raises(openai.BadRequestError) as refused:
                await client.files.create(file=("a.jsonl", b"{}\n"), purpose="batch",
                                          expires_after=expires_after)
            assert status_of(refused.value) == (400, "invalid_expires_after")
            assert refused.value.response.json()["error"]["param"] == param
        assert [file.id async for file in client.files.list()] == before


# ---------------------------------------------------------------------- listing


async def test_a_tenants_files_and_batches_are_listed_in_pages_and_no_other_tenant_sees_them(
    gw: Gateway,
) -> None:
    async with gw.openai("bulkco") as mine, gw.openai("narrow") as theirs:
        # Given five files and three batches of one tenant, and a file and a batch of another
        made = [await mine.files.create(file=(f"{n}.jsonl", jsonl([chat_line("a")])), purpose="batch")
                for n in range(5)]
        batches = [await create(mine, [chat_line("a")]) for _ in range(3)]
        other_file = await upload(theirs, [chat_line("a", model="deepseek-v3.2")])
        other_batch = await create(theirs, [chat_line("a", model="deepseek-v3.2")])

        # When the tenant pages through its files two at a time
        first = await mine.files.list(limit=2, purpose="batch")
        listed = [file async for file in await mine.files.list(limit=2, purpose="batch")]
        listed_batches = [batch.id async for batch in await mine.batches.list(limit=2)]

        # Then every page follows the one before, newest first, with only the tenant's own
        assert len(first.data) == 2 and first.has_more
        newest_first = sorted(listed, key=lambda file: (file.created_at, file.id), reverse=True)
        assert [file.id for file in listed] == [file.id for file in newest_first]
        assert {file.id for file in made} <= {file.id for file in listed}
        assert other_file not in {file.id for file in listed}
        assert set(batches) <= set(listed_batches) and other_batch not in listed_batches
        assert len(listed_batches) == len(set(listed_batches))
        # Another tenant's id as a cursor reads nothing, and its records are 404 as before
        assert (await mine.files.list(after=other_file)).data == []
        assert (await mine.batches.list(after=other_batch)).data == []
        for attempt in (mine.files.retrieve(other_file), mine.batches.retrieve(other_batch),
                        theirs.files.content(made[0].id)):
            with pytest.raises(openai.NotFoundError):
                await attempt
