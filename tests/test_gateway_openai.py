"""The official OpenAI SDK, unchanged, against a real gateway over HTTP, with a worker and the
simulated provider behind it, on both queue backends."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from openai import AsyncStream
from openai.types.chat import ChatCompletionChunk, ChatCompletionMessageParam

from conftest import QueueFactory
from support.dispatch import running_worker
from support.gateway import open_gateway, serving
from tidegate.app.gateway import open_gateway_state
from tidegate.config import TidegateConfig
from tidegate.jobs import JobState, Priority
from tidegate.simulator.server import InjectedFault

HELLO: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Say hello"}]


def error_of(exc: openai.APIStatusError) -> dict[str, Any]:
    """The `error` object of the answer, as the gateway sent it (the SDK prefixes its message)."""
    error: dict[str, Any] = exc.response.json()["error"]
    return error


async def test_a_chat_completion_returns_the_providers_answer_with_tidegate_headers(
    queue_factory: QueueFactory,
) -> None:
    async with open_gateway(queue_factory) as gw, gw.openai("acme") as client:
        raw = await client.chat.completions.with_raw_response.create(
            model="auto", messages=HELLO, extra_headers={"X-Priority": "high"}
        )
        completion = raw.parse()

        assert completion.choices[0].message.content
        job_id = raw.headers["X-Tidegate-Job-Id"]
        assert raw.headers["X-Tidegate-Model"] == completion.model == "gpt-4.1"  # the high tier
        assert float(raw.headers["X-Tidegate-Queue-Wait-Ms"]) >= 0
        assert float(raw.headers["X-Tidegate-Cost-Usd"]) > 0
        job = await gw.queue.get(job_id)
        assert job is not None and job.state is JobState.SUCCEEDED
        assert (job.tenant, job.priority) == ("acme", Priority.HIGH)
        assert job.result["response"]["id"] == completion.id


async def test_a_priority_in_the_body_is_used_and_never_reaches_the_provider(
    queue_factory: QueueFactory,
) -> None:
    async with open_gateway(queue_factory) as gw, gw.openai("acme") as client:
        raw = await client.chat.completions.with_raw_response.create(
            model="deepseek-v3.2", messages=HELLO, extra_body={"priority": "low"}
        )

        job = await gw.queue.get(raw.headers["X-Tidegate-Job-Id"])
        assert job is not None and job.priority is Priority.LOW
        assert "priority" not in job.payload["body"]
        assert job.payload["body"]["model"] == "deepseek-v3.2"


async def test_a_stream_relays_the_chunks_while_the_provider_still_writes(
    queue_factory: QueueFactory,
) -> None:
    async with open_gateway(queue_factory) as gw, gw.openai("acme") as client:
        # Given a provider that takes a while between tokens
        gw.sim.configure({"defaults": {"inter_token_ms": 10, "completion_tokens": 20,
                                       "completion_tokens_p99": 21}})
        # When the client streams
        async with client.chat.completions.with_streaming_response.create(
            model="gpt-4.1", messages=HELLO, stream=True
        ) as response:
            job_id = response.headers["X-Tidegate-Job-Id"]
            assert response.headers["X-Tidegate-Model"] == "gpt-4.1"
            pieces: list[str] = []
            state_at_first_content = None
            chunks = await response.parse()
            assert isinstance(chunks, AsyncStream)
            chunk: ChatCompletionChunk
            async for chunk in chunks:
                text = chunk.choices[0].delta.content if chunk.choices else None
                if text and state_at_first_content is None:
                    job = await gw.queue.get(job_id)
                    assert job is not None
                    state_at_first_content = job.state
                pieces.append(text or "")

        # Then content arrived before the job was finished, and it adds up to the answer
        assert state_at_first_content is JobState.LEASED
        job = await gw.queue.wait(job_id, 5)
        assert job.state is JobState.SUCCEEDED
        answer = job.result["response"]["choices"][0]["message"]["content"]
        assert answer and "".join(pieces) == answer
        view = (await gw.http.get(f"/v1/jobs/{job_id}", headers=gw.auth("acme"))).json()
        assert view["timings"]["ttft_ms"] >= 0
        metrics = (await gw.http.get("/metrics")).text
        assert 'tidegate_gateway_ttft_seconds_count{priority="normal"} 1.0' in metrics


async def test_a_stream_is_served_from_the_whole_answer_when_the_worker_cannot_relay(
    queue_factory: QueueFactory,
) -> None:
    async with open_gateway(queue_factory, worker_streams=False) as gw, gw.openai("acme") as client:
        stream = await client.chat.completions.create(
            model="gpt-4.1", messages=HELLO, stream=True, stream_options={"include_usage": True})
        chunks = [chunk async for chunk in stream]

        text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
        assert text and chunks[-1].usage is not None and chunks[-1].usage.total_tokens > 0
        assert chunks[-2].choices[0].finish_reason == "stop"


async def test_a_stream_cut_off_by_the_provider_ends_with_an_error_event(
    queue_factory: QueueFactory,
) -> None:
    async with open_gateway(queue_factory) as gw, gw.openai("acme") as client:
        gw.sim.inject("gpt-4.1", InjectedFault("reset"))  # strikes half way through the stream
        stream = await client.chat.completions.create(model="gpt-4.1", messages=HELLO, stream=True)
        received = []
        with pytest.raises(openai.APIError):
            async for chunk in stream:
                received.append(chunk)

        assert received  # the client had the first half when the error came
        assert gw.sim.stats()["gpt-4.1"].received == 1  # not retried: the client saw chunks


async def test_a_stream_that_dies_before_its_first_chunk_is_an_http_error(
    queue_factory: QueueFactory,
) -> None:
    async with open_gateway(queue_factory) as gw, gw.openai("acme") as client:
        gw.sim.inject("gpt-4.1", InjectedFault("status", status=422, message="unsupported parameter"))
        with pytest.raises(openai.UnprocessableEntityError, match="unsupported parameter"):
            await client.chat.completions.create(model="gpt-4.1", messages=HELLO, stream=True)


async def test_embeddings_and_models(queue_factory: QueueFactory) -> None:
    async with open_gateway(queue_factory) as gw, gw.openai("acme") as client, \
            gw.openai("narrow") as narrow:
        embedded = await client.embeddings.create(model="text-embedding-3-small",
                                                  input=["red shoes", "blue kettle"])
        models = [model.id async for model in client.models.list()]
        narrow_models = [model.id async for model in narrow.models.list()]

        assert len(embedded.data) == 2 and embedded.data[0].embedding
        assert {"gpt-4.1", "text-embedding-3-small"} <= set(models)
        assert narrow_models == ["deepseek-v3.2"]
        assert (await client.models.retrieve("gpt-4.1")).id == "gpt-4.1"


async def test_refusals_surface_as_the_sdks_exception_types_and_queue_nothing(
    queue_factory: QueueFactory,
) -> None:
    async with open_gateway(queue_factory, worker=False) as gw, gw.openai("acme") as acme, \
            gw.openai("narrow") as narrow, gw.openai(api_key="tg_000000000000_" + "x" * 43) as stranger:
        with pytest.raises(openai.AuthenticationError):
            await stranger.chat.completions.create(model="auto", messages=HELLO)
        with pytest.raises(openai.PermissionDeniedError, match="above the maximum"):
            await acme.chat.completions.create(model="auto", messages=HELLO,
                                               extra_headers={"X-Priority": "critical"})
        with pytest.raises(openai.PermissionDeniedError, match="not allowed"):
            await narrow.chat.completions.create(model="gpt-4.1", messages=HELLO)
        with pytest.raises(openai.BadRequestError, match="invalid priority"):
            await acme.chat.completions.create(model="auto", messages=HELLO, extra_body={"priority": "asap"})
        with pytest.raises(openai.NotFoundError, match="does not exist"):
            await acme.chat.completions.create(model="gpt-9", messages=HELLO)
        with pytest.raises(openai.NotFoundError):
            await acme.models.retrieve("gpt-9")

        assert await gw.depth() == 0


async def test_a_tenant_over_its_rate_gets_429_with_retry_after(queue_factory: QueueFactory) -> None:
    async with open_gateway(queue_factory) as gw, gw.openai("slow") as client:
        await client.chat.completions.create(model="auto", messages=HELLO)
        with pytest.raises(openai.RateLimitError) as refused:
            await client.chat.completions.create(model="auto", messages=HELLO)

        assert int(refused.value.response.headers["Retry-After"]) >= 1
        assert refused.value.code == "rate_limit_exceeded"


async def test_a_dead_job_answers_with_the_providers_error(queue_factory: QueueFactory) -> None:
    async with open_gateway(queue_factory) as gw, gw.openai("acme") as client:
        # A client error is not retried and keeps its status and the provider's own words
        gw.sim.inject("gpt-4.1", InjectedFault("status", status=400, message="context too long"))
        with pytest.raises(openai.BadRequestError) as bad:
            await client.chat.completions.create(model="gpt-4.1", messages=HELLO)
        gw.sim.inject("gpt-4.1", InjectedFault("status", status=404, message="no such deployment"))
        with pytest.raises(openai.NotFoundError) as missing:
            await client.chat.completions.create(model="gpt-4.1", messages=HELLO)
        # A server error is retried; after the last attempt it is a 502
        gw.sim.inject("gpt-4.1", InjectedFault("error", times=3))
        with pytest.raises(openai.InternalServerError) as failed:
            await client.chat.completions.create(model="gpt-4.1", messages=HELLO)

        assert error_of(bad.value)["message"] == "context too long"
        assert (bad.value.type, bad.value.code) == ("invalid_request_error", "upstream_client_error")
        assert error_of(missing.value)["message"] == "no such deployment"
        assert failed.value.status_code == 502
        assert failed.value.code == "upstream_error"
        assert error_of(failed.value)["message"].startswith("the job failed after 3 attempt(s): gpt-4.1: ")
        dead = await gw.queue.get(bad.value.response.headers["X-Tidegate-Job-Id"])
        assert dead is not None and dead.state is JobState.DEAD


async def test_a_dead_job_shows_its_structured_failure(queue_factory: QueueFactory) -> None:
    async with open_gateway(queue_factory) as gw, gw.openai("acme") as client:
        gw.sim.inject("gpt-4.1", InjectedFault("status", status=404, message="no such deployment"))
        with pytest.raises(openai.NotFoundError) as missing:
            await client.chat.completions.create(model="gpt-4.1", messages=HELLO)
        job_id = missing.value.response.headers["X-Tidegate-Job-Id"]

        view = (await gw.http.get(f"/v1/jobs/{job_id}", headers=gw.auth("acme"))).json()
        letters = (await gw.http.get("/v1/dlq", headers=gw.auth("ops"))).json()["data"]

        expected = {"status": 404, "type": "invalid_request_error", "code": "upstream_client_error",
                    "message": "no such deployment", "param": None, "upstream_status": 404,
                    "model": "gpt-4.1"}
        assert view["state"] == "dead"
        assert view["failure"] == expected
        assert [letter["failure"] for letter in letters if letter["id"] == job_id] == [expected]


async def test_a_job_the_workers_router_refuses_answers_with_the_refusal(queue_factory: QueueFactory) -> None:
    async with open_gateway(queue_factory, worker=False) as gw, gw.openai("acme") as client:
        # Given workers whose config no longer serves a model the gateway still lists (a rolling
        # change of config)
        config = gw.state.config
        [provider] = config.providers
        kept = tuple(model for model in provider.models if model.name != "gpt-4.1")
        shrunk = config.model_copy(update={"providers": (provider.model_copy(update={"models": kept}),)})
        worker_queue = await queue_factory.open(maintenance_interval_s=0.2)
        async with running_worker(worker_queue, shrunk):
            # When a call names it, then it is answered with the router's refusal, not a 502
            with pytest.raises(openai.NotFoundError, match=r"'gpt-4\.1' is unknown") as refused:
                await client.chat.completions.create(model="gpt-4.1", messages=HELLO)

        assert (refused.value.code, refused.value.param) == ("model_not_found", "model")
        assert gw.sim.stats().get("gpt-4.1") is None or gw.sim.stats()["gpt-4.1"].received == 0


async def test_a_job_dead_without_a_recorded_failure_answers_502_with_its_last_error(
    queue_factory: QueueFactory,
) -> None:
    async with open_gateway(queue_factory, worker=False, queue_settings={"default_max_attempts": 1}) as gw, \
            gw.openai("acme") as client:
        # Given a worker that takes the job's only attempt and vanishes: its lease runs out
        vanished = asyncio.create_task(gw.queue.claim("vanished", lease_s=0.1, timeout_s=10))
        with pytest.raises(openai.InternalServerError) as failed:
            await client.chat.completions.create(model="gpt-4.1", messages=HELLO)
        assert len(await vanished) == 1

        assert failed.value.status_code == 502
        assert failed.value.code == "job_failed"
        assert "lease expired: worker vanished" in error_of(failed.value)["message"]


async def test_a_gateway_with_no_provider_offers_no_model_and_answers_ai_calls_503(tmp_path: Path) -> None:
    # Given a gateway whose config names no provider (and no simulator)
    config = TidegateConfig(queue_url=f"sqlite:///{tmp_path / 'queue.db'}")
    async with open_gateway_state(config, recs_url=None) as state, serving(state) as url, \
            httpx.AsyncClient(base_url=url, timeout=20.0) as http:
        # When a client lists the models and calls one, named or routed
        models = (await http.get("/v1/models")).json()
        answers = [await http.post("/v1/chat/completions", json={
            "model": model, "messages": [{"role": "user", "content": "hello"}]})
            for model in ("auto", "gpt-4.1")]
        depth = (await state.queue.stats()).depth
    # Then no model is offered, each call is refused naming the cause, and nothing was queued
    assert models["data"] == []
    assert [answer.status_code for answer in answers] == [503, 503]
    assert {answer.json()["error"]["code"] for answer in answers} == {"no_provider_configured"}
    assert "[[providers]]" in answers[0].json()["error"]["message"]
    assert depth == 0
