"""OpenAI's legacy completions and moderations below the gateway: their job payloads are checked
like every other kind, their streamed chunks read as text, their costs are estimated from the
prompt and the most output they allow (moderations: none), and the router sends them only to a
model of their kind; the simulator answers them in OpenAI's shapes, and an Anthropic upstream
refuses them as a client error."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from openai import AsyncOpenAI
from openai.types import Completion, ModerationCreateResponse

from tidegate.ai import AIRequest, Finish, StreamPart, TextDelta
from tidegate.config import ProviderConfig, TidegateConfig
from tidegate.contract import RequestBody, decode, to_body
from tidegate.costs import (
    COMPLETION_DEFAULT_MAX_TOKENS,
    IMAGE_TOKENS,
    estimate_input_tokens,
    estimate_output_tokens,
)
from tidegate.dispatch.router import Router
from tidegate.dispatch.tiers import tier_of
from tidegate.errors import InvalidJob, RoutingError, UpstreamError
from tidegate.jobs import Priority
from tidegate.providers.adapters.anthropic import AnthropicAdapter
from tidegate.providers.client import UpstreamClient
from tidegate.simulator.catalogue import default_models, legacy_models
from tidegate.simulator.server import Simulator
from tidegate.simulator.settings import SimulatorSettings

INSTRUCT = "gpt-3.5-turbo-instruct"
MODERATION = "omni-moderation-latest"


@pytest.mark.parametrize("body", [
    {"prompt": "Once"}, {"prompt": ["Once", "Twice"]}, {"prompt": [1, 2, 3]}, {"prompt": [[1], [2, 3]]},
])
def test_a_completion_payload_takes_every_prompt_shape(body: dict[str, Any]) -> None:
    request = AIRequest.from_payload({"kind": "completion", "body": {"model": "auto", **body}})

    assert request.kind == "completion" and to_body(request.body) == {"model": "auto", **body}


@pytest.mark.parametrize(("kind", "body"), [
    ("completion", {}), ("completion", {"prompt": []}), ("completion", {"prompt": [[]]}),
    ("completion", {"prompt": ["a", [1]]}), ("completion", {"prompt": 7}),
    ("moderation", {}), ("moderation", {"input": 7}),
])
def test_a_malformed_legacy_payload_is_an_invalid_job(kind: str, body: dict[str, Any]) -> None:
    with pytest.raises(InvalidJob, match="prompt" if kind == "completion" else "input"):
        AIRequest.from_payload({"kind": kind, "body": body})


def test_a_text_completion_chunk_reads_as_its_text_and_finish() -> None:
    head = {"id": "cmpl-1", "object": "text_completion", "model": INSTRUCT}
    text = StreamPart.decode(orjson.dumps({**head, "choices": [
        {"index": 0, "text": " hello", "logprobs": None, "finish_reason": None}]}))
    end = StreamPart.decode(orjson.dumps({**head, "choices": [
        {"index": 0, "text": "", "logprobs": None, "finish_reason": "length"}]}))

    assert (text.text, text.events, text.model) == (" hello", (TextDelta(" hello"),), INSTRUCT)
    assert end.events == (Finish("length"),)


def test_legacy_estimates() -> None:
    def completion(**body: Any) -> RequestBody:
        return decode("completion", {"model": INSTRUCT, **body})

    assert estimate_input_tokens(completion(prompt="a" * 10, suffix="abcd")) == 3 + 1
    assert estimate_input_tokens(completion(prompt=[[1, 2], [3]])) == 3
    assert estimate_output_tokens(completion(prompt="x")) == COMPLETION_DEFAULT_MAX_TOKENS
    assert estimate_output_tokens(completion(prompt=["x", "y"], max_tokens=5, best_of=3)) == 30
    assert estimate_output_tokens(completion(prompt=[1, 2, 3], max_tokens=5)) == 5  # one prompt
    items = [{"type": "text", "text": "abcd"}, {"type": "image_url", "image_url": {"url": "https://x/y.png"}}]
    assert estimate_input_tokens(decode("moderation", {"input": items})) == 1 + IMAGE_TOKENS
    assert estimate_output_tokens(decode("moderation", {"input": "anything", "max_tokens": 9})) == 0


def _router(*, legacy: bool = True) -> Router:
    models = (*default_models(), *legacy_models()) if legacy else default_models()
    provider = ProviderConfig(name="sim", base_url="http://127.0.0.1:9/v1", models=models)
    return Router(TidegateConfig(providers=(provider,)))


def test_legacy_jobs_route_only_to_a_model_of_their_kind() -> None:
    def route(kind: Any, model: str | None, router: Router | None = None,
              allowed: frozenset[str] | None = None) -> str:
        decision = (router or _router()).route(kind=kind, requested_model=model, priority=Priority.HIGH,
                                               estimated_input_tokens=10, allowed_models=allowed)
        assert decision.fallbacks == ()
        return decision.model.name

    assert route("completion", INSTRUCT) == route("completion", None) == INSTRUCT
    assert route("moderation", "auto") == MODERATION
    with pytest.raises(RoutingError) as chat_model:
        route("completion", "gpt-4.1")
    with pytest.raises(RoutingError) as unoffered:
        route("moderation", None, _router(legacy=False))
    with pytest.raises(RoutingError) as narrow:
        route("moderation", None, allowed=frozenset({"gpt-4.1"}))
    assert (chat_model.value.refusal, unoffered.value.refusal, narrow.value.refusal) == (
        "wrong_model_kind", "model_not_found", "model_not_allowed")


async def test_the_simulator_answers_in_openais_shapes_and_refuses_what_it_does_not_serve() -> None:
    async with Simulator(SimulatorSettings(seed=1)).running() as base_url:
        client = AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0)
        plain = await client.completions.with_raw_response.create(
            model=INSTRUCT, prompt=["Say", "Hello"], echo=True, stop="queue")
        moderated = await client.moderations.with_raw_response.create(input=["a bomb", "a kettle"])
        again = await client.moderations.with_raw_response.create(input=["a bomb", "a kettle"])
        stream = await client.completions.create(model=INSTRUCT, prompt="Hi", stream=True)
        chunks = [chunk async for chunk in stream]
        with pytest.raises(Exception, match="one prompt at a time"):
            await client.completions.create(model=INSTRUCT, prompt=["a", "b"], stream=True)
        with pytest.raises(Exception, match="does not support the completion endpoint"):
            await client.completions.create(model="gpt-4.1", prompt="Hi")
        await client.close()

    completion = Completion.model_validate(plain.http_response.json(), strict=True)
    for prompt, choice in zip(["Say", "Hello"], completion.choices, strict=True):
        assert choice.text.startswith(prompt) and "queue" not in choice.text.removeprefix(prompt)
    moderation = ModerationCreateResponse.model_validate(moderated.http_response.json(), strict=True)
    assert [result.flagged for result in moderation.results] == [True, False]
    assert moderation.results[0].categories.illicit_violent
    assert again.http_response.json()["results"] == moderated.http_response.json()["results"]  # deterministic
    assert "".join(chunk.choices[0].text for chunk in chunks if chunk.choices)
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")


async def test_an_anthropic_upstream_refuses_legacy_jobs_as_a_client_error() -> None:
    provider = ProviderConfig(name="claude", base_url="http://127.0.0.1:9/v1", api="anthropic")
    async with UpstreamClient(provider) as client:
        adapter = AnthropicAdapter(client)
        for request in (AIRequest.of("completion", {"model": INSTRUCT, "prompt": "Hi"}),
                        AIRequest.of("moderation", {"input": "Hi"})):
            with pytest.raises(UpstreamError) as refused:
                await adapter.complete(request, "claude-sonnet-4.5")
            error = refused.value
            assert (error.kind, error.retryable, error.status) == ("client", False, 400)


def test_the_tier_policy_adds_no_tier_to_legacy_jobs() -> None:
    provider = ProviderConfig(name="openai", base_url="http://127.0.0.1:9/v1", service_tiers={"bulk": "flex"})

    chat = {"model": "auto", "messages": [{"role": "user", "content": "x"}]}
    assert tier_of(AIRequest.of("chat", chat), provider, Priority.BULK) == "flex"
    assert tier_of(AIRequest.of("moderation", {"input": "x"}), provider, Priority.BULK) is None
    assert tier_of(AIRequest.of("completion", {"model": INSTRUCT, "prompt": "x", "service_tier": "flex"}),
                   provider, Priority.NORMAL) == "flex"  # the caller's own, as given
