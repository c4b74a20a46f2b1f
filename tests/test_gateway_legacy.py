"""OpenAI's legacy /v1/completions and /v1/moderations through the gateway's queue, with the
official SDK against a real gateway, a worker and the simulated provider, on both queue backends:
served when a configured provider offers them (a model of their kind), 404 `unsupported_endpoint`
when none does."""

from __future__ import annotations

from decimal import Decimal

import openai
import pytest
from openai.types import (
    Completion,
    ModerationCreateResponse,
    ModerationImageURLInputParam,
    ModerationTextInputParam,
)

from conftest import QueueFactory
from support.gateway import open_gateway, with_legacy_models
from test_gateway_batches import ended, lines_of, upload
from tidegate.ai import Usage
from tidegate.costs import cost_micros
from tidegate.jobs import JobState, Priority
from tidegate.simulator.catalogue import legacy_models

INSTRUCT = "gpt-3.5-turbo-instruct"
MODERATION = "omni-moderation-latest"


async def test_a_completion_is_queued_at_its_priority_and_charged_by_the_models_prices(
    queue_factory: QueueFactory,
) -> None:
    async with open_gateway(queue_factory, configure=with_legacy_models) as gw, gw.openai("acme") as client:
        raw = await client.completions.with_raw_response.create(
            model=INSTRUCT, prompt="Once upon a time", max_tokens=8, extra_headers={"X-Priority": "high"})

        completion = Completion.model_validate(raw.http_response.json(), strict=True)
        assert completion.object == "text_completion" and completion.choices[0].text
        assert completion.usage is not None and completion.usage.completion_tokens <= 8
        job_id = raw.headers["X-Tidegate-Job-Id"]
        view = (await gw.http.get(f"/v1/jobs/{job_id}", headers=gw.auth("acme"))).json()
        assert (view["kind"], view["priority"], view["state"], view["model"]) == (
            "completion", "high", "succeeded", INSTRUCT)
        [priced] = [model for model in legacy_models() if model.name == INSTRUCT]
        spent = completion.usage
        charged = cost_micros(priced, Usage(spent.prompt_tokens, spent.completion_tokens))
        assert charged > 0 and view["result"]["cost_micros"] == charged
        assert Decimal(raw.headers["X-Tidegate-Cost-Usd"]) == Decimal(view["cost_usd"]) > 0


async def test_a_list_of_prompts_gets_a_choice_each(queue_factory: QueueFactory) -> None:
    async with open_gateway(queue_factory, configure=with_legacy_models) as gw, gw.openai("acme") as client:
        completion = await client.completions.create(model=INSTRUCT, prompt=["Say", "Hello"], echo=True)

        assert [choice.index for choice in completion.choices] == [0, 1]
        assert completion.choices[0].text.startswith("Say")


@pytest.mark.parametrize("relay", [True, False], ids=["relayed", "whole-answer"])
async def test_a_streamed_completion_relays_text_completion_chunks(
    queue_factory: QueueFactory, relay: bool,
) -> None:
    async with open_gateway(queue_factory, configure=with_legacy_models, worker_streams=relay) as gw, \
            gw.openai("acme") as client:
        async with client.completions.with_streaming_response.create(
            model=INSTRUCT, prompt="Say hello", max_tokens=12, stream=True,
            stream_options={"include_usage": True},
        ) as response:
            job_id = response.headers["X-Tidegate-Job-Id"]
            chunks = [chunk async for chunk in await response.parse()]

        assert all(isinstance(chunk, Completion) and chunk.object == "text_completion" for chunk in chunks)
        text = "".join(chunk.choices[0].text for chunk in chunks if chunk.choices)
        assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0
        assert [chunk.choices[0].finish_reason for chunk in chunks if chunk.choices][-1] in ("stop", "length")
        job = await gw.queue.wait(job_id, 5)
        assert job.state is JobState.SUCCEEDED
        assert job.result["response"]["object"] == "text_completion"
        assert text and job.result["response"]["choices"][0]["text"] == text
        assert job.result["cost_micros"] > 0


async def test_a_moderation_is_queued_classified_and_free(queue_factory: QueueFactory) -> None:
    async with open_gateway(queue_factory, configure=with_legacy_models) as gw, gw.openai("acme") as client:
        raw = await client.moderations.with_raw_response.create(
            input=["I will kill them all", "What a quiet morning"], extra_headers={"X-Priority": "low"})

        moderation = ModerationCreateResponse.model_validate(raw.http_response.json(), strict=True)
        assert moderation.model == MODERATION  # "auto": the first moderation model configured
        assert [result.flagged for result in moderation.results] == [True, False]
        assert moderation.results[0].categories.violence
        assert moderation.results[0].category_applied_input_types.violence == ["text"]
        job = await gw.queue.get(raw.headers["X-Tidegate-Job-Id"])
        assert job is not None and job.state is JobState.SUCCEEDED
        assert (job.priority, job.payload["kind"]) == (Priority.LOW, "moderation")
        assert job.result["cost_micros"] == 0
        assert Decimal(raw.headers["X-Tidegate-Cost-Usd"]) == 0
        metrics = (await gw.http.get("/metrics")).text
        assert f'model="{MODERATION}"' in metrics  # counted like any other call


async def test_a_multimodal_moderation_names_the_input_types_applied(queue_factory: QueueFactory) -> None:
    async with open_gateway(queue_factory, configure=with_legacy_models) as gw, gw.openai("acme") as client:
        items: list[ModerationTextInputParam | ModerationImageURLInputParam] = [
            {"type": "text", "text": "a calm lake"},
            {"type": "image_url", "image_url": {"url": "https://example.com/lake.png"}}]
        moderation = await client.moderations.create(model=MODERATION, input=items)

        [result] = moderation.results
        assert result.category_applied_input_types.violence == ["text", "image"]
        assert result.category_applied_input_types.hate == ["text"]


async def test_tenant_entitlements_and_rate_limits_apply(queue_factory: QueueFactory) -> None:
    async with open_gateway(queue_factory, configure=with_legacy_models) as gw, \
            gw.openai("narrow") as narrow, gw.openai("slow") as slow:
        with pytest.raises(openai.PermissionDeniedError) as named:
            await narrow.completions.create(model=INSTRUCT, prompt="Say hello")
        with pytest.raises(openai.PermissionDeniedError) as routed:
            await narrow.moderations.create(input="Say hello")  # auto: no moderation model allowed
        await slow.moderations.create(input="Say hello")
        with pytest.raises(openai.RateLimitError) as limited:
            await slow.moderations.create(input="Say hello again")

        assert named.value.code == routed.value.code == "model_not_allowed"
        assert limited.value.response.headers["Retry-After"]


async def test_malformed_bodies_and_other_models_are_refused_and_queue_nothing(
    queue_factory: QueueFactory,
) -> None:
    async with open_gateway(queue_factory, configure=with_legacy_models, worker=False) as gw:
        refused = [
            ("/v1/completions", {"model": INSTRUCT}, 400, "invalid_request"),
            ("/v1/completions", {"model": INSTRUCT, "prompt": []}, 400, "invalid_request"),
            ("/v1/completions", {"model": INSTRUCT, "prompt": [[]]}, 400, "invalid_request"),
            ("/v1/completions", {"model": INSTRUCT, "prompt": "hi", "logprobs": 9}, 400, "invalid_request"),
            ("/v1/completions", {"model": INSTRUCT, "prompt": "a", "stop": list("abcde")}, 400,
             "invalid_request"),
            ("/v1/completions", {"prompt": "hi"}, 400, "invalid_request"),
            ("/v1/completions", {"model": "gpt-4.1", "prompt": "hi"}, 400, "wrong_model_kind"),
            ("/v1/completions", {"model": "text-davinci-001", "prompt": "hi"}, 404, "model_not_found"),
            ("/v1/moderations", {"input": 5}, 400, "invalid_request"),
            ("/v1/moderations", {"input": []}, 400, "invalid_request"),
            ("/v1/moderations", {"input": [{"type": "video", "url": "x"}]}, 400, "invalid_request"),
            ("/v1/moderations", {"model": INSTRUCT, "input": "hi"}, 400, "wrong_model_kind"),
        ]
        for path, body, status, code in refused:
            answer = await gw.http.post(path, json=body, headers=gw.auth("acme"))
            assert (answer.status_code, answer.json()["error"]["code"]) == (status, code), (path, body)

        assert await gw.depth() == 0


async def test_batches_call_the_legacy_endpoints_a_provider_offers(queue_factory: QueueFactory) -> None:
    async with open_gateway(queue_factory, configure=with_legacy_models) as gw, gw.openai("acme") as client:
        prompts = await upload(client, [{"custom_id": f"c{n}", "method": "POST", "url": "/v1/completions",
                                         "body": {"model": INSTRUCT, "prompt": f"Line {n}"}}
                                        for n in range(2)])
        inputs = await upload(client, [{"custom_id": "m0", "method": "POST", "url": "/v1/moderations",
                                        "body": {"input": "I will attack at dawn"}}])

        created = [await client.batches.create(input_file_id=prompts, endpoint="/v1/completions",
                                               completion_window="24h"),
                   await client.batches.create(input_file_id=inputs, endpoint="/v1/moderations",
                                               completion_window="24h")]
        completed = [await ended(client, batch.id) for batch in created]

        assert [batch.status for batch in completed] == ["completed", "completed"]
        completions, moderations = [await lines_of(client, batch.output_file_id) for batch in completed]
        assert sorted(line["custom_id"] for line in completions) == ["c0", "c1"]
        assert all(Completion.model_validate(line["response"]["body"]).choices for line in completions)
        [moderation] = moderations
        assert ModerationCreateResponse.model_validate(moderation["response"]["body"]).results[0].flagged


async def test_without_a_provider_offering_them_the_legacy_endpoints_answer_404(
    queue_factory: QueueFactory,
) -> None:
    async with open_gateway(queue_factory, worker=False) as gw, gw.openai("acme") as client:
        with pytest.raises(openai.NotFoundError) as completions:
            await client.completions.create(model=INSTRUCT, prompt="Say hello")
        with pytest.raises(openai.NotFoundError) as moderations:
            await client.moderations.create(input="Say hello")
        malformed = await gw.http.post("/v1/completions", json={"prompt": 5}, headers=gw.auth("acme"))

        for refused in (completions.value, moderations.value):
            assert refused.code == "unsupported_endpoint"
            assert "/v1/chat/completions" in refused.message
            assert "/v1/completions," not in refused.message and "/v1/moderations," not in refused.message
        assert "use /v1/chat/completions" in completions.value.message
        assert (malformed.status_code, malformed.json()["error"]["code"]) == (400, "invalid_request")
        assert await gw.depth() == 0
        models = [model.id async for model in client.models.list()]
        assert INSTRUCT not in models
        with pytest.raises(openai.BadRequestError) as batch:
            await client.batches.create(input_file_id="file-unread", endpoint="/v1/completions",
                                        completion_window="24h")
        assert batch.value.code == "unsupported_endpoint"


async def test_asynchronous_jobs_of_the_legacy_kinds_while_a_provider_offers_them(
    queue_factory: QueueFactory,
) -> None:
    jobs = {"jobs": [{"kind": "completion", "body": {"model": INSTRUCT, "prompt": "Say hello"}},
                     {"kind": "moderation", "priority": "bulk", "body": {"input": "a calm lake"}}]}
    async with open_gateway(queue_factory, configure=with_legacy_models) as gw:
        accepted = await gw.http.post("/v1/jobs", json=jobs, headers=gw.auth("acme"))
        assert accepted.status_code == 202, accepted.text
        completion, moderation = [await gw.queue.wait(job_id, 5) for job_id in accepted.json()["ids"]]

        assert completion.state is moderation.state is JobState.SUCCEEDED
        assert Completion.model_validate(completion.result["response"]).choices[0].text
        assert ModerationCreateResponse.model_validate(moderation.result["response"]).results
        assert moderation.priority is Priority.BULK

    async with open_gateway(queue_factory, worker=False) as gw:
        refused = await gw.http.post("/v1/jobs", json=jobs, headers=gw.auth("acme"))
        assert refused.status_code == 400
        assert (refused.json()["error"]["code"], refused.json()["error"]["param"]) == (
            "unsupported_kind", "jobs.0.kind")
        assert await gw.depth() == 0
