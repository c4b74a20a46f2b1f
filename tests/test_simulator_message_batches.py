"""The simulated provider's Message Batches API, spoken to with the official Anthropic SDK: a batch's
life and results in Anthropic's shapes, errored requests, faults, cancellation, listing with its
cursors, refusals, and the batch stats it is counted in."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import anthropic
import pytest
from anthropic.types.messages import MessageBatch, MessageBatchIndividualResponse

from support.waiting import eventually
from tidegate.simulator import Simulator, SimulatorSettings

MODEL = "deepseek-v3.2"
KEY = "sk-sim-1"


@pytest.fixture
def simulator() -> Simulator:
    return Simulator(SimulatorSettings(seed=5, require_api_key=KEY, batch_latency_s=0.05))


@pytest.fixture
async def sdk(simulator: Simulator) -> AsyncIterator[anthropic.AsyncAnthropic]:
    async with (simulator.running() as url,
                anthropic.AsyncAnthropic(base_url=url.removesuffix("/v1"), api_key=KEY,
                                         max_retries=0) as client):
        yield client


def request(custom_id: str, model: str = MODEL, **params: Any) -> Any:
    return {"custom_id": custom_id,
            "params": {"model": model, "max_tokens": 20, **params,
                       "messages": [{"role": "user", "content": f"Say {custom_id}."}]}}


async def ended(sdk: anthropic.AsyncAnthropic, batch_id: str) -> MessageBatch:
    # polled: nothing announces a batch's end
    return await eventually(lambda: sdk.messages.batches.retrieve(batch_id), f"batch {batch_id} ends",
                            until=lambda batch: batch.processing_status == "ended")


async def results(sdk: anthropic.AsyncAnthropic, batch_id: str) -> dict[str, MessageBatchIndividualResponse]:
    return {item.custom_id: item async for item in await sdk.messages.batches.results(batch_id)}


async def test_a_batch_runs_then_ends_with_a_message_for_every_request(
    simulator: Simulator, sdk: anthropic.AsyncAnthropic
) -> None:
    created = await sdk.messages.batches.create(requests=[request("a"), request("b")])
    assert created.processing_status == "in_progress" and created.id.startswith("msgbatch_")
    assert created.request_counts.processing == 2 and created.results_url is None
    batch = await ended(sdk, created.id)
    assert batch.request_counts.succeeded == 2 and batch.request_counts.processing == 0
    assert batch.ended_at is not None and batch.results_url is not None
    assert batch.expires_at > batch.created_at
    answers = await results(sdk, batch.id)
    assert sorted(answers) == ["a", "b"]
    for answer in answers.values():
        assert answer.result.type == "succeeded"
        message = answer.result.message
        assert message.model == MODEL and message.content[0].type == "text"
        assert message.usage.output_tokens > 0 and message.usage.service_tier == "batch"
    stats = simulator.stats_dict()["batches"]
    assert (stats["created"], stats["lines"], stats["ended"]) == (1, 2, {"completed": 1})
    assert stats["lines_by_model"] == {MODEL: 2}
    assert simulator.stats() == {}  # not live traffic


async def test_a_request_the_model_refuses_is_errored_with_its_anthropic_error(
    sdk: anthropic.AsyncAnthropic
) -> None:
    requests = [request("good"), request("bad", model="claude-none"), request("long", max_tokens=0)]
    created = await sdk.messages.batches.create(requests=requests)
    batch = await ended(sdk, created.id)
    assert (batch.request_counts.succeeded, batch.request_counts.errored) == (1, 2)
    answers = await results(sdk, batch.id)
    assert answers["good"].result.type == "succeeded"
    for custom_id in ("bad", "long"):
        result = answers[custom_id].result
        assert result.type == "errored"
        assert result.error.type == "error" and result.error.error.message
    bad = answers["bad"].result
    assert bad.type == "errored" and bad.error.error.type == "not_found_error"


@pytest.mark.parametrize(("fault", "outcome", "counted"), [("expired", "expired", "expired"),
                                                           ("failed", "errored", "failed")])
async def test_a_fault_ends_every_request_so(simulator: Simulator, sdk: anthropic.AsyncAnthropic, fault: str,
                                             outcome: str, counted: str) -> None:
    simulator.configure({"batch_fault": fault})
    created = await sdk.messages.batches.create(requests=[request("a"), request("b")])
    batch = await ended(sdk, created.id)
    assert getattr(batch.request_counts, outcome) == 2
    assert {answer.result.type for answer in (await results(sdk, batch.id)).values()} == {outcome}
    assert simulator.stats_dict()["batches"]["ended"] == {counted: 1}


async def test_a_cancelled_batch_ends_with_its_requests_canceled(
    simulator: Simulator, sdk: anthropic.AsyncAnthropic
) -> None:
    simulator.configure({"batch_latency_s": 30})
    created = await sdk.messages.batches.create(requests=[request("a"), request("b")])
    canceling = await sdk.messages.batches.cancel(created.id)
    assert canceling.processing_status == "canceling" and canceling.cancel_initiated_at is not None
    batch = await ended(sdk, created.id)
    assert batch.request_counts.canceled == 2
    assert {answer.result.type for answer in (await results(sdk, batch.id)).values()} == {"canceled"}
    again = await sdk.messages.batches.cancel(created.id)  # an ended batch is answered as it is
    assert again.processing_status == "ended"
    assert simulator.stats_dict()["batches"]["ended"] == {"cancelled": 1}


async def test_batches_are_listed_newest_first_with_anthropics_cursors(sdk: anthropic.AsyncAnthropic) -> None:
    ids = [(await sdk.messages.batches.create(requests=[request(f"r{n}")])).id for n in range(5)]
    newest = list(reversed(ids))
    first = await sdk.messages.batches.list(limit=2)
    assert [batch.id for batch in first.data] == newest[:2] and first.has_more
    assert (first.first_id, first.last_id) == (newest[0], newest[1])
    listed = [batch.id async for batch in await sdk.messages.batches.list(limit=2)]  # every page
    assert listed == newest
    older = await sdk.messages.batches.list(limit=10, after_id=newest[1])
    assert [batch.id for batch in older.data] == newest[2:] and not older.has_more
    newer = await sdk.messages.batches.list(limit=10, before_id=newest[2])
    assert [batch.id for batch in newer.data] == newest[:2]


async def test_bad_creations_and_unknown_batches_are_refused_in_anthropics_shape(
    simulator: Simulator, sdk: anthropic.AsyncAnthropic
) -> None:
    refused: list[tuple[Any, str]] = [
        ({"requests": []}, "requests"),
        ({"requests": [request("a"), request("a")]}, "more than once"),
        ({"requests": [request("has space")]}, "custom_id"),
        ({"requests": [{"custom_id": "a", "params": "text"}]}, "params"),
        ({"requests": [request("a", stream=True)]}, "stream"),
        ({"requests": [request("a")], "extra": 1}, "extra"),
    ]
    for body, problem in refused:
        with pytest.raises(anthropic.BadRequestError) as caught:
            await sdk.post("/v1/messages/batches", cast_to=MessageBatch, body=body)
        refusal = caught.value.body
        assert isinstance(refusal, dict) and refusal["type"] == "error"
        assert refusal["error"]["type"] == "invalid_request_error" and problem in refusal["error"]["message"]
    with pytest.raises(anthropic.NotFoundError):
        await sdk.messages.batches.retrieve("msgbatch_none")
    with pytest.raises(anthropic.BadRequestError):
        await sdk.messages.batches.list(limit=0)
    running = await sdk.messages.batches.create(requests=[request("a")])
    simulator.configure({"batch_latency_s": 30})
    slow = await sdk.messages.batches.create(requests=[request("a")])
    with pytest.raises(anthropic.BadRequestError, match="not yet ended"):
        await sdk.get(f"/v1/messages/batches/{slow.id}/results", cast_to=bytes)
    await sdk.messages.batches.cancel(slow.id)
    await ended(sdk, running.id)
    async with anthropic.AsyncAnthropic(base_url=sdk.base_url, api_key="wrong", max_retries=0) as stranger:
        with pytest.raises(anthropic.AuthenticationError) as unknown:
            await stranger.messages.batches.list()
    assert unknown.value.body == {"type": "error", "error": {"type": "authentication_error",
                                                             "message": "invalid x-api-key"}}
    assert simulator.stats_dict()["batches"]["created"] == 2
