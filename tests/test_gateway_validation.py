"""Errors at the door: what a caller can get wrong is refused at once, in the API's own error shape,
and nothing is queued or dead-lettered. The official OpenAI and Anthropic SDKs, unchanged, against
a real gateway on both queue backends.

Two gateways per backend: one without a worker, where a job that was queued would stay in the
queue for the test to see; one with a worker, for `model: "auto"` routed over a tenant's models.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import anthropic
import openai
import pytest
import pytest_asyncio
from anthropic.types import MessageParam
from openai.types.chat import ChatCompletionMessageParam

from conftest import BACKENDS
from support.gateway import Gateway, add_tenants, module_gateway
from tidegate.coord.tenants import Tenant
from tidegate.jobs import Priority

pytestmark = pytest.mark.asyncio(loop_scope="module")

HELLO: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Say hello"}]
HELLO_CLAUDE: list[MessageParam] = [{"role": "user", "content": "Say hello"}]
TENANTS = (
    Tenant(name="acme", max_priority=Priority.CRITICAL),
    # Allowed one model, which the tiers of normal, low and bulk do not list.
    Tenant(name="only41", max_priority=Priority.CRITICAL, allowed_models=("gpt-4.1",)),
    # Allowed no chat model at all: an embeddings model, and a name no provider serves.
    Tenant(name="nochat", max_priority=Priority.CRITICAL,
           allowed_models=("text-embedding-3-small", "gpt-9")),
    Tenant(name="narrow", allowed_models=("deepseek-v3.2",)),  # a 128k-token window
)


@pytest_asyncio.fixture(scope="module", loop_scope="module", params=BACKENDS)
async def door(request: pytest.FixtureRequest,
               tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Gateway]:
    """A gateway without a worker: whatever it queued stays queued."""
    async with module_gateway(request, tmp_path_factory, worker=False, tenants=False) as gateway:
        gateway.keys.update(await add_tenants(gateway.state.tenants, TENANTS))
        yield gateway


@pytest_asyncio.fixture(scope="module", loop_scope="module", params=BACKENDS)
async def served(request: pytest.FixtureRequest,
                 tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Gateway]:
    """A gateway with a worker and the simulator behind it."""
    async with module_gateway(request, tmp_path_factory, tenants=False) as gateway:
        gateway.keys.update(await add_tenants(gateway.state.tenants, TENANTS))
        yield gateway


def claude(gw: Gateway, tenant: str = "acme") -> anthropic.AsyncAnthropic:
    """The Anthropic SDK pointed at the gateway, its key as x-api-key; no retries."""
    return anthropic.AsyncAnthropic(base_url=gw.url, api_key=None, max_retries=0,
                                    default_headers={"x-api-key": gw.keys[tenant]})


async def assert_nothing_queued(gw: Gateway) -> None:
    """No job waits, runs, waits for its time or lies dead: the refusal changed nothing."""
    stats = await gw.queue.stats()
    assert (stats.depth, stats.in_flight, stats.delayed, stats.dead) == (0, 0, 0, 0)
    assert await gw.queue.dead_letters() == []


def openai_error(exc: openai.APIStatusError) -> dict[str, Any]:
    """The `error` object the gateway answered (the SDK prefixes its message)."""
    body = exc.response.json()
    assert set(body) == {"error"}
    error: dict[str, Any] = body["error"]
    assert error["type"] and error["code"] and error["message"]
    return error


def anthropic_error(exc: anthropic.APIStatusError) -> dict[str, Any]:
    """The `error` object of an Anthropic-shaped answer."""
    body = exc.response.json()
    assert body["type"] == "error"
    error: dict[str, Any] = body["error"]
    assert error["type"] and error["code"] and error["message"]
    return error


# ---------------------------------------------------------------------------- OpenAI chat

_INT64 = 2**63
# Each body field that OpenAI's reference bounds, out of its bounds, and the param named.
CHAT_ERRORS: list[tuple[str, dict[str, Any], str]] = [
    ("unknown role", {"messages": [{"role": "wizard", "content": "Hi"}]}, "messages.0.role"),
    ("no model", {"model": openai.omit}, "model"),
    ("seed above int64", {"seed": 10**30}, "seed"),
    ("seed below int64", {"seed": -_INT64 - 1}, "seed"),
    ("temperature above 2", {"temperature": 2.5}, "temperature"),
    ("temperature below 0", {"temperature": -0.1}, "temperature"),
    ("top_p above 1", {"top_p": 1.5}, "top_p"),
    ("n of 0", {"n": 0}, "n"),
    ("n above 128", {"n": 129}, "n"),
    ("max_tokens of 0", {"max_tokens": 0}, "max_tokens"),
    ("max_completion_tokens of 0", {"max_completion_tokens": 0}, "max_completion_tokens"),
    ("presence_penalty above 2", {"presence_penalty": 2.5}, "presence_penalty"),
    ("frequency_penalty below -2", {"frequency_penalty": -3}, "frequency_penalty"),
    ("logprobs not a boolean", {"logprobs": "yes"}, "logprobs"),
    ("top_logprobs above 20", {"top_logprobs": 21}, "top_logprobs"),
    ("top_logprobs below 0", {"top_logprobs": -1}, "top_logprobs"),
    ("five stop sequences", {"stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ("logit_bias above 100", {"logit_bias": {"50256": 101}}, "logit_bias.50256"),
]


@pytest.mark.parametrize(("given", "param"), [case[1:] for case in CHAT_ERRORS],
                         ids=[case[0] for case in CHAT_ERRORS])
async def test_a_chat_completion_out_of_the_reference_is_refused_at_the_door(
    door: Gateway, given: dict[str, Any], param: str,
) -> None:
    async with door.openai("acme") as client:
        with pytest.raises(openai.BadRequestError) as refused:
            await client.chat.completions.create(model="auto", messages=HELLO,
                                                 extra_body=given)

    error = openai_error(refused.value)
    assert error["type"] == "invalid_request_error"
    assert (error["code"], error["param"]) == ("invalid_request", param)
    assert param in error["message"]
    await assert_nothing_queued(door)


async def test_the_roles_of_the_reference_and_the_bounds_themselves_are_accepted(door: Gateway) -> None:
    messages: list[dict[str, str]] = [{"role": role, "content": "Hi"}
                                      for role in ("system", "developer", "user", "assistant")]
    messages += [{"role": "tool", "content": "42", "tool_call_id": "call_1"},
                 {"role": "function", "content": "42", "name": "lookup"}]
    fields = {"seed": _INT64 - 1, "temperature": 2, "top_p": 1, "n": 128, "presence_penalty": -2,
              "frequency_penalty": 2, "logprobs": True, "top_logprobs": 20, "stop": ["a", "b", "c", "d"],
              "logit_bias": {"50256": -100}, "max_completion_tokens": 1}
    async with door.openai("acme") as client:
        # No worker: the call waits for its job until the timeout it gave, and is answered 504
        with pytest.raises(openai.APIStatusError) as waited:
            await client.chat.completions.create(
                model="auto", messages=HELLO, extra_body={**fields, "messages": messages},
                extra_headers={"X-Tidegate-Timeout": "0.2"})

    assert waited.value.status_code == 504
    job = await door.queue.get(openai_error(waited.value)["job_id"])
    assert job is not None and job.payload["body"]["seed"] == _INT64 - 1
    assert await door.queue.cancel(job.id)
    await door.queue.forget(job.id)


async def test_an_embeddings_request_out_of_the_reference_is_refused_at_the_door(door: Gateway) -> None:
    async with door.openai("acme") as client:
        for given, param in (({"model": openai.omit}, "model"), ({"input": ""}, "input"),
                             ({"input": ["red", ""]}, "input"), ({"dimensions": 0}, "dimensions")):
            with pytest.raises(openai.BadRequestError) as refused:
                await client.embeddings.create(model="auto", input="red running shoes", extra_body=given)

            error = openai_error(refused.value)
            assert (error["code"], error["param"]) == ("invalid_request", param), given
    await assert_nothing_queued(door)


async def test_a_job_body_is_checked_as_its_endpoint_checks_it(door: Gateway) -> None:
    # POST /v1/jobs: the body without a model, and a role no API has
    for body, param in (({"messages": HELLO}, "body.model"),
                        ({"model": "auto", "messages": [{"role": "wizard", "content": "Hi"}]},
                         "body.messages.0.role")):
        answer = await door.http.post("/v1/jobs", json={"kind": "chat", "body": body},
                                      headers=door.auth("acme"))

        error = answer.json()["error"]
        assert (answer.status_code, error["code"], error["param"]) == (400, "invalid_request", "body")
        assert param in error["message"]
    await assert_nothing_queued(door)


# ---------------------------------------------------------------------------- Responses API

RESPONSES_ERRORS: list[tuple[str, dict[str, Any], str, str]] = [
    ("no model", {"model": openai.omit}, "model", "invalid_request"),
    ("unknown role", {"input": [{"role": "wizard", "content": "Hi"}]}, "input[0].role", "invalid_value"),
    ("temperature above 2", {"temperature": 3}, "temperature", "invalid_request"),
    ("top_p above 1", {"top_p": 2}, "top_p", "invalid_request"),
    ("max_output_tokens of 0", {"max_output_tokens": 0}, "max_output_tokens", "invalid_request"),
    ("top_logprobs above 20", {"top_logprobs": 21}, "top_logprobs", "invalid_request"),
]


@pytest.mark.parametrize(("given", "param", "code"), [case[1:] for case in RESPONSES_ERRORS],
                         ids=[case[0] for case in RESPONSES_ERRORS])
async def test_a_response_out_of_the_reference_is_refused_at_the_door(
    door: Gateway, given: dict[str, Any], param: str, code: str,
) -> None:
    async with door.openai("acme") as client:
        with pytest.raises(openai.BadRequestError) as refused:
            await client.responses.create(model="auto", input="Hi", extra_body=given)

    error = openai_error(refused.value)
    assert (error["type"], error["code"], error["param"]) == ("invalid_request_error", code, param)
    await assert_nothing_queued(door)


# ---------------------------------------------------------------------------- Anthropic Messages

MESSAGES_ERRORS: list[tuple[str, dict[str, Any], str]] = [
    ("unknown role", {"messages": [{"role": "wizard", "content": "Hi"}]}, "messages.0.role"),
    ("system as a message", {"messages": [{"role": "system", "content": "Be brief"}]}, "messages.0.role"),
    ("no model", {"model": anthropic.omit}, "model"),
    ("temperature above 1", {"temperature": 1.5}, "temperature"),
    ("top_p above 1", {"top_p": 1.5}, "top_p"),
    ("top_k below 0", {"top_k": -1}, "top_k"),
    ("max_tokens of 0", {"max_tokens": 0}, "max_tokens"),
    ("five stop sequences", {"stop_sequences": ["a", "b", "c", "d", "e"]}, "stop_sequences"),
]


@pytest.mark.parametrize(("given", "param"), [case[1:] for case in MESSAGES_ERRORS],
                         ids=[case[0] for case in MESSAGES_ERRORS])
async def test_a_message_out_of_the_reference_is_refused_at_the_door(
    door: Gateway, given: dict[str, Any], param: str,
) -> None:
    async with claude(door) as client:
        with pytest.raises(anthropic.BadRequestError) as refused:
            await client.messages.create(model="auto", max_tokens=64, messages=HELLO_CLAUDE,
                                         extra_body=given)

    error = anthropic_error(refused.value)
    assert (error["type"], error["code"]) == ("invalid_request_error", "invalid_request")
    assert param in error["message"]
    await assert_nothing_queued(door)


# ---------------------------------------------------------------------------- routing refusals


async def test_a_tenant_that_may_use_no_chat_model_is_refused_with_403_on_every_api(door: Gateway) -> None:
    async with door.openai("nochat") as client:
        with pytest.raises(openai.PermissionDeniedError) as chat:
            await client.chat.completions.create(model="auto", messages=HELLO)
        with pytest.raises(openai.PermissionDeniedError) as response:
            await client.responses.create(model="auto", input="Hi")
    async with claude(door, "nochat") as messages:
        with pytest.raises(anthropic.PermissionDeniedError) as message:
            await messages.messages.create(model="auto", max_tokens=64, messages=HELLO_CLAUDE)

    for error in (openai_error(chat.value), openai_error(response.value)):
        assert error["type"] == "permission_error"
        assert (error["code"], error["param"]) == ("model_not_allowed", "model")
        assert "no chat model may serve this tenant" in error["message"]
    assert (anthropic_error(message.value)["type"], anthropic_error(message.value)["code"]) == (
        "permission_error", "model_not_allowed")
    # An asynchronous job is refused alike, rather than accepted to end dead
    job = await door.http.post("/v1/jobs", headers=door.auth("nochat"),
                               json={"kind": "chat", "body": {"model": "auto", "messages": HELLO}})
    assert (job.status_code, job.json()["error"]["code"]) == (403, "model_not_allowed")
    await assert_nothing_queued(door)


async def test_an_input_no_allowed_model_can_hold_is_refused_at_the_door(door: Gateway) -> None:
    # ~130k tokens (one per non-ASCII character): over deepseek's 128k, the tenant's one model
    async with door.openai("narrow") as client:
        with pytest.raises(openai.BadRequestError) as refused:
            await client.chat.completions.create(model="auto",
                                                 messages=[{"role": "user", "content": "é" * 130_000}])

    error = openai_error(refused.value)
    assert (error["code"], error["param"]) == ("model_not_available", "model")
    assert "deepseek-v3.2 holds 128000 tokens" in error["message"]
    await assert_nothing_queued(door)


@pytest.mark.parametrize("priority", [priority.name.lower() for priority in Priority])
async def test_a_tenant_allowed_only_gpt_4_1_is_served_by_it_at_every_priority(
    served: Gateway, priority: str,
) -> None:
    async with served.openai("only41") as client:
        raw = await client.chat.completions.with_raw_response.create(
            model="auto", messages=HELLO, extra_headers={"X-Priority": priority})

    assert raw.headers["X-Tidegate-Model"] == raw.parse().model == "gpt-4.1"
    job = await served.queue.get(raw.headers["X-Tidegate-Job-Id"])
    assert job is not None and job.priority is Priority.parse(priority)
    assert await served.queue.dead_letters() == []
    assert (await served.queue.stats()).dead == 0


async def test_a_tenant_allowed_only_gpt_4_1_is_served_by_it_on_the_messages_api(served: Gateway) -> None:
    async with claude(served, "only41") as client:
        message = await client.messages.create(model="auto", max_tokens=64, messages=HELLO_CLAUDE,
                                               extra_headers={"X-Priority": "bulk"})

    assert message.model == "gpt-4.1"
    assert await served.queue.dead_letters() == []


async def test_auto_still_keeps_to_the_tier_when_it_lists_an_allowed_model(served: Gateway) -> None:
    async with served.openai("acme") as client:
        raw = await client.chat.completions.with_raw_response.create(
            model="auto", messages=HELLO, extra_headers={"X-Priority": "normal"})

    assert raw.headers["X-Tidegate-Model"] == "gemini-2.5-flash"  # the normal tier's first
