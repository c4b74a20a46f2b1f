"""The Anthropic batch client against the simulated provider's Message Batches: chat lines go up as
Messages requests and come back as chat.completions with usage, errored requests keep their
status and error, canceled and expired ones are status 0 with their code, a submission is found
again by the tags of its metadata, and the batch client is picked by the provider's api."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from support.waiting import eventually
from tidegate.config import ProviderBatchConfig, ProviderConfig
from tidegate.contract import decode
from tidegate.dispatch.provider_batches.clients import batch_client
from tidegate.dispatch.provider_batches.clients.anthropic import AnthropicBatchClient
from tidegate.dispatch.provider_batches.clients.openai import (
    BatchLineRequest,
    ProviderBatch,
    ProviderBatchClient,
)
from tidegate.errors import UpstreamError
from tidegate.providers.client import UpstreamClient
from tidegate.simulator import Simulator, SimulatorSettings

CHAT = "/v1/chat/completions"
MODEL = "deepseek-v3.2"
KEY_ENV = "TIDEGATE_TEST_ANTHROPIC_BATCH_KEY"
KEY = "sk-anthropic-batch-test"


def line(custom_id: str, model: str = MODEL, **body: Any) -> BatchLineRequest:
    return BatchLineRequest(custom_id, CHAT, decode("chat", {
        "model": model, "max_tokens": 10, **body,
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]}))


@pytest.fixture
def simulator() -> Simulator:
    return Simulator(SimulatorSettings(seed=3, require_api_key=KEY, batch_latency_s=0.05))


@pytest.fixture
async def upstream(simulator: Simulator, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[UpstreamClient]:
    monkeypatch.setenv(KEY_ENV, KEY)
    async with simulator.running() as url, UpstreamClient(ProviderConfig(
            name="claude", base_url=url, api="anthropic", timeout_s=5.0, api_key_env=KEY_ENV)) as client:
        yield client


@pytest.fixture
def batches(upstream: UpstreamClient) -> AnthropicBatchClient:
    return AnthropicBatchClient(upstream)


async def ended(batches: AnthropicBatchClient, batch_id: str) -> ProviderBatch:
    # polled: nothing announces a batch's end
    return await eventually(lambda: batches.retrieve(batch_id), f"batch {batch_id} ends",
                            until=lambda batch: batch.ended, every_s=0.01)


async def test_chat_lines_come_back_as_chat_completions_with_usage(
    simulator: Simulator, batches: AnthropicBatchClient
) -> None:
    submitted = await batches.submit([line("job-1"), line("job-2")], endpoint=CHAT, metadata={"run": "r1"})
    assert (submitted.status, submitted.ended, submitted.total) == ("in_progress", False, 2)

    batch = await ended(batches, submitted.id)
    results = await batches.results(batch, ["job-1", "job-2"])

    assert (batch.status, batch.total, batch.completed, batch.failed) == ("completed", 2, 2, 0)
    assert list(results) == ["job-1", "job-2"]  # the first one's tags stripped again
    for custom_id, result in results.items():
        body = result.body
        assert result.custom_id == custom_id and result.status_code == 200
        assert body["object"] == "chat.completion" and body["model"] == MODEL
        assert body["choices"][0]["message"]["content"] and body["choices"][0]["finish_reason"]
        usage = body["usage"]
        assert usage["prompt_tokens"] > 0 and usage["completion_tokens"] > 0
        assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    stats = simulator.stats_dict()["batches"]
    assert (stats["created"], stats["lines"], stats["lines_by_status"]) == (1, 2, {"200": 2})


async def test_an_errored_request_keeps_its_status_and_error(batches: AnthropicBatchClient) -> None:
    submitted = await batches.submit([line("good"), line("bad", model="claude-none")], endpoint=CHAT)
    batch = await ended(batches, submitted.id)
    results = await batches.results(batch, ["good", "bad", "never-sent"])

    assert (batch.status, batch.completed, batch.failed) == ("completed", 1, 1)
    assert results["good"].status_code == 200
    bad = results["bad"]
    assert bad.status_code == 404 and bad.body["type"] == "error"
    assert bad.body["error"]["type"] == "not_found_error" and "claude-none" in bad.body["error"]["message"]
    assert results["never-sent"].status_code == 0
    assert results["never-sent"].body["error"]["code"] == "batch_line_missing"


async def test_expired_and_cancelled_requests_are_status_0_with_their_code(
    simulator: Simulator, batches: AnthropicBatchClient
) -> None:
    simulator.configure({"batch_fault": "expired"})
    expired = await ended(batches, (await batches.submit([line("a")], endpoint=CHAT)).id)
    simulator.configure({"batch_fault": None, "batch_latency_s": 30})
    running = await batches.submit([line("b")], endpoint=CHAT)
    cancelling = await batches.cancel(running.id)
    cancelled = await ended(batches, running.id)

    assert expired.status == "expired" and cancelling.status == "cancelling"
    assert cancelled.status == "cancelled"
    assert (await batches.cancel(running.id)).status == "cancelled"  # ended: as it is
    for batch, custom_id, code in ((expired, "a", "batch_expired"), (cancelled, "b", "batch_cancelled")):
        result = (await batches.results(batch, [custom_id]))[custom_id]
        assert result.status_code == 0 and result.body["error"]["code"] == code


async def test_a_submission_is_found_again_by_its_metadata_once_its_batch_ended(
    simulator: Simulator, batches: AnthropicBatchClient
) -> None:
    first = await batches.submit([line("a"), line("b")], endpoint=CHAT,
                                 metadata={"submission": "t-0", "worker": "w-1"})
    last = await batches.submit([line("a")], endpoint=CHAT, metadata={"submission": "t-1", "worker": "w-1"})
    await ended(batches, first.id)
    await ended(batches, last.id)

    found = await batches.find({"submission": "t-0"})
    newest = await batches.find({"worker": "w-1"})

    assert found is not None and found.id == first.id
    assert newest is not None and newest.id == last.id
    assert await batches.find({"submission": "t-404"}) is None
    assert await batches.find({"submission": "t-0"}, newest=1) is None
    # A batch still running cannot be read: it is not found yet
    simulator.configure({"batch_latency_s": 30})
    await batches.submit([line("c")], endpoint=CHAT, metadata={"submission": "t-2"})
    assert await batches.find({"submission": "t-2"}) is None


@pytest.mark.parametrize(("lines", "endpoint", "problem"), [
    ([], CHAT, "at least one line"),
    ([line("a"), line("a")], CHAT, "custom_id"),
    ([line("a b")], CHAT, "letters, digits"),
    ([BatchLineRequest("e", "/v1/embeddings", decode("embeddings", {"model": "m", "input": "x"}))],
     "/v1/embeddings", "chat"),
    ([line("x" * 60)], CHAT, "letters, digits"),  # no room for the tags
])
async def test_a_batch_anthropic_would_refuse_is_not_sent(
    simulator: Simulator, batches: AnthropicBatchClient, lines: list[BatchLineRequest], endpoint: str,
    problem: str,
) -> None:
    with pytest.raises(ValueError, match=problem):
        await batches.submit(lines, endpoint=endpoint, metadata={"submission": "t"})
    with pytest.raises(ValueError, match="24h"):
        await batches.submit([line("a")], endpoint=CHAT, completion_window="48h")
    assert simulator.stats_dict()["batches"]["created"] == 0


async def test_provider_refusals_are_client_errors_that_are_not_retried(
    batches: AnthropicBatchClient
) -> None:
    with pytest.raises(UpstreamError) as unknown:
        await batches.retrieve("msgbatch_missing")
    assert (unknown.value.kind, unknown.value.status, unknown.value.retryable) == ("client", 404, False)
    running = await batches.submit([line("a")], endpoint=CHAT)
    with pytest.raises(ValueError, match="ended"):
        await batches.results(running, ["a"])


async def test_the_batch_client_is_picked_by_the_providers_api(upstream: UpstreamClient) -> None:
    assert isinstance(batch_client(upstream), AnthropicBatchClient)
    openai = UpstreamClient(upstream.provider.model_copy(update={"api": "openai"}))
    assert isinstance(batch_client(openai), ProviderBatchClient)


def test_an_anthropic_batch_section_serves_chat_only_within_24h() -> None:
    provider = {"name": "claude", "base_url": "https://api.anthropic.com/v1", "api": "anthropic"}
    chat_only = ProviderConfig(**provider, batch=ProviderBatchConfig(kinds=("chat",)))
    assert chat_only.batch is not None and chat_only.batch.kinds == ("chat",)
    with pytest.raises(ValueError, match="no embeddings"):
        ProviderConfig(**provider, batch=ProviderBatchConfig())
    with pytest.raises(ValueError, match="24h"):
        ProviderConfig(**provider, batch=ProviderBatchConfig(kinds=("chat",), completion_window="48h"))
