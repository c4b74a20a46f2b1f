"""The provider batch client against the simulated provider's Batch API: a batch submitted,
polled until it ended and collected, a result for every line asked for (answered, refused, or not
run because the batch expired, was cancelled or failed), an ended batch's files deleted, and
failures as UpstreamError."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import msgspec
import pytest

from support.waiting import eventually
from tidegate.config import ProviderConfig
from tidegate.contract import decode
from tidegate.dispatch.provider_batches.clients.openai import (
    BatchLineRequest,
    ProviderBatch,
    ProviderBatchClient,
)
from tidegate.errors import UpstreamError
from tidegate.providers.client import UpstreamClient
from tidegate.simulator import Simulator, SimulatorSettings

CHAT = "/v1/chat/completions"
CHAT_MODEL = "gpt-4.1"
KEY_ENV = "TIDEGATE_TEST_BATCH_KEY"
KEY = "sk-batch-test"


def line(custom_id: str, model: str = CHAT_MODEL, **body: Any) -> BatchLineRequest:
    return BatchLineRequest(custom_id, CHAT, decode("chat", {
        "model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 10, **body}))


@pytest.fixture
def simulator() -> Simulator:
    return Simulator(SimulatorSettings(seed=3, require_api_key=KEY, batch_latency_s=0.05,
                                       batch_max_file_bytes=16 * 1024))


@pytest.fixture
async def batches(simulator: Simulator,
                  monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[ProviderBatchClient]:
    monkeypatch.setenv(KEY_ENV, KEY)
    async with simulator.running() as url, UpstreamClient(
            ProviderConfig(name="sim", base_url=url, timeout_s=5.0, api_key_env=KEY_ENV)) as client:
        yield ProviderBatchClient(client)


async def ended(batches: ProviderBatchClient, batch_id: str) -> ProviderBatch:
    # polled, as a provider's batch is: nothing announces its end
    return await eventually(lambda: batches.retrieve(batch_id), f"batch {batch_id} ends",
                            until=lambda batch: batch.ended, every_s=0.01)


async def test_a_submitted_batch_is_collected_with_a_result_for_every_line(
    simulator: Simulator, batches: ProviderBatchClient,
) -> None:
    submitted = await batches.submit([line("job-1"), line("job-2")], endpoint=CHAT, metadata={"run": "r1"})
    assert not submitted.ended and submitted.total in (0, 2)

    batch = await ended(batches, submitted.id)
    results = await batches.results(batch, ["job-1", "job-2"])

    assert (batch.status, batch.total, batch.completed, batch.failed) == ("completed", 2, 2, 0)
    assert list(results) == ["job-1", "job-2"]
    for custom_id, result in results.items():
        assert result.custom_id == custom_id and result.status_code == 200
        assert result.body["object"] == "chat.completion" and result.body["choices"][0]["message"]["content"]
    assert simulator.stats_dict()["batches"]["created"] == 1


async def test_a_failed_line_keeps_its_status_and_error_body(batches: ProviderBatchClient) -> None:
    # A line the provider refuses: built past the contract's check, which would refuse it first
    bad = line("bad")
    bad = replace(bad, body=msgspec.structs.replace(bad.body, max_tokens=-1))
    lines = [line("good"), line("unknown", model="no-such-model"), bad]

    batch = await ended(batches, (await batches.submit(lines, endpoint=CHAT)).id)
    results = await batches.results(batch, ["good", "unknown", "bad"])

    assert (batch.completed, batch.failed) == (1, 2)
    assert results["good"].status_code == 200
    assert results["unknown"].status_code == 404
    assert results["unknown"].body["error"]["code"] == "model_not_found"
    assert results["bad"].status_code == 400 and results["bad"].body["error"]["param"] == "max_tokens"


async def test_an_expired_batch_reports_every_line(simulator: Simulator,
                                                   batches: ProviderBatchClient) -> None:
    simulator.configure({"batch_fault": "expired"})

    batch = await ended(batches, (await batches.submit([line("a"), line("b")], endpoint=CHAT)).id)
    results = await batches.results(batch, ["a", "b"])

    assert batch.status == "expired"
    assert {(r.custom_id, r.status_code, r.body["error"]["code"]) for r in results.values()} == {
        ("a", 0, "batch_expired"), ("b", 0, "batch_expired")}


async def test_a_failed_batch_reports_every_line_with_why_it_failed(
    simulator: Simulator, batches: ProviderBatchClient,
) -> None:
    simulator.configure({"batch_fault": "failed"})

    batch = await ended(batches, (await batches.submit([line("a"), line("b")], endpoint=CHAT)).id)
    results = await batches.results(batch, ["a", "b"])

    assert batch.status == "failed" and batch.errors and "batch_failed" in batch.errors[0]
    assert all(r.status_code == 0 and r.body["error"]["code"] == "batch_failed" for r in results.values())
    assert batch.errors[0] in results["a"].body["error"]["message"]


async def test_a_cancelled_batch_reports_its_lines_as_cancelled(
    simulator: Simulator, batches: ProviderBatchClient,
) -> None:
    simulator.configure({"batch_latency_s": 3600})
    submitted = await batches.submit([line("a")], endpoint=CHAT)

    cancelling = await batches.cancel(submitted.id)
    batch = await ended(batches, submitted.id)
    again = await batches.cancel(submitted.id)  # it ended: returned as it is
    results = await batches.results(batch, ["a"])

    assert cancelling.status in ("cancelling", "cancelled") and batch.status == again.status == "cancelled"
    assert (results["a"].status_code, results["a"].body["error"]["code"]) == (0, "batch_cancelled")
    assert simulator.stats_dict()["batches"]["lines"] == 0


async def test_results_wait_for_the_batch_to_end(simulator: Simulator, batches: ProviderBatchClient) -> None:
    simulator.configure({"batch_latency_s": 3600})
    batch = await batches.submit([line("a")], endpoint=CHAT)

    with pytest.raises(ValueError, match="ended"):
        await batches.results(batch, ["a"])


@pytest.mark.parametrize(("lines", "problem"), [
    ([], "at least one line"),
    ([line("a"), line("a")], "custom_id 'a'"),
    ([BatchLineRequest("e", "/v1/embeddings", decode("embeddings", {"model": "text-embedding-3-small",
                                                                      "input": "x"}))],
     "endpoint"),
], ids=["empty", "duplicate", "other-endpoint"])
async def test_a_batch_the_provider_would_fail_is_not_sent(
    simulator: Simulator, batches: ProviderBatchClient, lines: list[BatchLineRequest], problem: str,
) -> None:
    with pytest.raises(ValueError, match=problem):
        await batches.submit(lines, endpoint=CHAT)

    assert simulator.stats_dict()["batches"]["files"] == 0


async def test_provider_refusals_are_client_errors_that_are_not_retried(batches: ProviderBatchClient) -> None:
    with pytest.raises(UpstreamError) as unknown:
        await batches.retrieve("batch_missing")
    with pytest.raises(UpstreamError) as large:
        await batches.submit([line("a", messages=[{"role": "user", "content": "x" * 20_000}])], endpoint=CHAT)

    assert (unknown.value.kind, unknown.value.status, unknown.value.retryable) == ("client", 404, False)
    assert unknown.value.body is not None and unknown.value.body.code == "batch_not_found"
    assert large.value.status == 400 and large.value.body is not None
    assert large.value.body.code == "file_too_large"


async def test_an_unreachable_provider_is_a_retryable_connection_error() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    async with UpstreamClient(ProviderConfig(name="gone", base_url=f"http://127.0.0.1:{port}/v1",
                                             timeout_s=2.0)) as client:
        with pytest.raises(UpstreamError) as caught:
            await ProviderBatchClient(client).retrieve("batch_1")

    assert (caught.value.kind, caught.value.retryable) == ("connection", True)
    assert "GET /batches/batch_1" in str(caught.value)


async def test_a_batch_is_found_again_by_its_metadata_newest_first(batches: ProviderBatchClient) -> None:
    first = await batches.submit([line("a")], endpoint=CHAT, metadata={"run": "r-0", "kind": "bulk"})
    for i in range(1, 101):  # the first falls to the second page of the provider's listing
        last = await batches.submit([line("a")], endpoint=CHAT, metadata={"run": f"r-{i}", "kind": "bulk"})

    found = await batches.find({"run": "r-0"})
    newest = await batches.find({"kind": "bulk"})

    assert found is not None and found.id == first.id
    assert newest is not None and newest.id == last.id
    assert await batches.find({"run": "r-404"}) is None
    assert await batches.find({"run": "r-0"}, newest=50) is None


async def test_an_ended_batchs_files_are_deleted_at_the_provider_once(batches: ProviderBatchClient) -> None:
    submitted = await batches.submit([line("a"), line("b", model="no-such-model")], endpoint=CHAT)
    # Not while the batch runs: its files are in use
    with pytest.raises(ValueError, match="ended"):
        await batches.delete_files(submitted.id)
    batch = await ended(batches, submitted.id)
    assert batch.output_file_id is not None and batch.error_file_id is not None

    # Its input, output and error files go; a second time there is nothing left to delete
    assert await batches.delete_files(batch.id) == 3
    assert await batches.delete_files(batch.id) == 0
    assert not await batches.delete_file(batch.output_file_id)
    with pytest.raises(UpstreamError) as gone:
        await batches.results(batch, ["a"])
    assert gone.value.status == 404
