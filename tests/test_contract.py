"""The typed request contract (tidegate.contract) refuses what the OpenAI dialect's pydantic models
refuse and accepts what they accept, naming the same field, and gives the provider back the body
the caller sent, unknown fields included. The pydantic models stay for the OpenAPI document while
the door decodes with the contract, so this holds the two to one definition.
"""

from __future__ import annotations

from typing import Any

import openai
import pytest
from pydantic import BaseModel, ValidationError

from test_gateway_validation import CHAT_ERRORS
from tidegate.ai import AIRequest
from tidegate.contract import ChatRequest, InvalidRequestBody, decode, to_body
from tidegate.errors import InvalidJob
from tidegate.gateway.openai.schemas import (
    ChatCompletionRequest,
    CompletionRequest,
    EmbeddingsRequest,
    ModerationRequest,
)

MODELS: dict[str, type[BaseModel]] = {"chat": ChatCompletionRequest, "embeddings": EmbeddingsRequest,
                                      "completion": CompletionRequest, "moderation": ModerationRequest}
BASE: dict[str, dict[str, Any]] = {
    "chat": {"model": "auto", "messages": [{"role": "user", "content": "Say hello"}]},
    "embeddings": {"model": "auto", "input": "red running shoes"},
    "completion": {"model": "auto", "prompt": "Once upon a time"},
    "moderation": {"input": "I want to hug them."},
}
_INT64 = 2**63
ROLES = [{"role": role, "content": "Hi"} for role in ("system", "developer", "user", "assistant")]
# (kind, fields over the kind's base body): bodies both must accept, at the bounds and beyond the
# names they know.
ACCEPTED: list[tuple[str, dict[str, Any]]] = [
    ("chat", {"messages": [*ROLES, {"role": "tool", "content": "42", "tool_call_id": "call_1"},
                           {"role": "function", "content": "42", "name": "lookup"},
                           {"role": "user", "content": [{"type": "text", "text": "Hi"}]},
                           {"role": "assistant", "content": None, "tool_calls": [{"id": "c"}]}]}),
    ("chat", {"seed": _INT64 - 1, "temperature": 2, "top_p": 1, "n": 128, "presence_penalty": -2,
              "frequency_penalty": 2, "logprobs": True, "top_logprobs": 20, "stop": ["a", "b", "c", "d"],
              "logit_bias": {"50256": -100}, "max_completion_tokens": 1, "max_tokens": 1_000_000}),
    ("chat", {"stream": True, "stream_options": {"include_usage": True}, "priority": "high",
              "service_tier": "flex", "user": "u", "stop": "end", "temperature": 0.5}),
    ("chat", {"tools": [{"type": "function", "function": {"name": "f"}}], "metadata": {"k": "v"},
              "extra": "a field of that name is the caller's too", "parallel_tool_calls": False}),
    ("chat", {"priority": 1, "seed": None, "temperature": None}),
    ("chat", {"messages": [{"role": "user", "content": "Hi", "cache_control": {"type": "ephemeral"}},
                           {"role": "assistant", "content": "Hello", "reasoning_content": "r", "extra": 1}]}),
    ("embeddings", {"input": ["red", "blue"], "dimensions": 3072, "encoding_format": "base64"}),
    ("embeddings", {"input": [1, 2, 3], "user": "u", "service_tier": "auto"}),
    ("embeddings", {"input": [[1, 2], [3]], "provider_option": {"x": 1}}),
    ("completion", {"prompt": ["a", ""], "max_tokens": 0, "best_of": 20, "logprobs": 5, "echo": True,
                    "stop": ["x"], "suffix": "!", "logit_bias": {"1": 100}}),
    ("completion", {"prompt": [1, 2], "stream": True}),
    ("completion", {"prompt": [[1], [2, 3]]}),
    ("moderation", {"input": ["a", "b"], "model": "omni-moderation-latest"}),
    ("moderation", {"input": [{"type": "text", "text": "a"},
                              {"type": "image_url", "image_url": {"url": "https://x/y.png"}}]}),
]
# (kind, fields over the base body, the field both name)
REFUSED: list[tuple[str, dict[str, Any], str]] = [
    *(("chat", given, param) for _, given, param in CHAT_ERRORS),
    ("chat", {"messages": []}, "messages"),
    ("chat", {"messages": "Hi"}, "messages"),
    ("chat", {"model": ""}, "model"),
    ("chat", {"model": 5}, "model"),
    ("chat", {"stream": "yes"}, "stream"),
    ("chat", {"max_tokens": 1.0}, "max_tokens"),
    ("chat", {"max_tokens": "5"}, "max_tokens"),
    ("chat", {"stop": 5}, "stop"),
    ("chat", {"stop": ["a", 5]}, "stop.1"),
    ("chat", {"service_tier": "scale"}, "service_tier"),
    ("chat", {"messages": [{"content": "Hi"}]}, "messages.0.role"),
    ("chat", {"messages": [{"role": "user", "content": 5}]}, "messages.0.content"),
    ("chat", {"messages": [{"role": "user", "mine": 1}, {"role": "wizard", "mine": 1}]}, "messages.1.role"),
    ("chat", {"messages": [{"mine": 1, "role": "user", "content": 5}]}, "messages.0.content"),
    ("embeddings", {"model": openai.omit}, "model"),
    ("embeddings", {"input": ""}, "input"),
    ("embeddings", {"input": []}, "input"),
    ("embeddings", {"input": ["red", ""]}, "input"),
    ("embeddings", {"input": [[1], []]}, "input"),
    ("embeddings", {"input": ["a", 1]}, "input"),
    ("embeddings", {"input": ["a"] * 2049}, "input"),
    ("embeddings", {"dimensions": 0}, "dimensions"),
    ("embeddings", {"dimensions": 3073}, "dimensions"),
    ("embeddings", {"encoding_format": "int8"}, "encoding_format"),
    ("completion", {"prompt": []}, "prompt"),
    ("completion", {"prompt": [[]]}, "prompt"),
    ("completion", {"prompt": 5}, "prompt"),
    ("completion", {"best_of": 21}, "best_of"),
    ("completion", {"logprobs": 6}, "logprobs"),
    ("completion", {"max_tokens": -1}, "max_tokens"),
    ("completion", {"stop": [""]}, "stop.0"),
    ("completion", {"stop": []}, "stop"),
    ("completion", {"logit_bias": {"1": -101}}, "logit_bias.1"),
    ("moderation", {"input": []}, "input"),
    ("moderation", {"input": 5}, "input"),
    ("moderation", {"input": [{"type": "audio", "text": "a"}]}, "input.0.type"),
    ("moderation", {"input": [{"type": "text", "text": "a", "more": 1}]}, "input.0"),
    ("moderation", {"input": [{"type": "image_url", "image_url": {"url": ""}}]}, "input.0.image_url.url"),
    ("moderation", {"model": ""}, "model"),
]


def body_of(kind: str, fields: dict[str, Any]) -> dict[str, Any]:
    """The kind's base body with `fields` over it (`openai.omit` takes a field out)."""
    merged = {**BASE[kind], **fields}
    return {key: value for key, value in merged.items() if value is not openai.omit}


@pytest.mark.parametrize(("kind", "fields"), ACCEPTED)
def test_what_the_models_accept_the_contract_accepts_and_hands_back_as_sent(
        kind: str, fields: dict[str, Any]) -> None:
    body = body_of(kind, fields)
    expected = MODELS[kind].model_validate(body).model_dump(exclude_unset=True)

    request = decode(kind, body)

    given = {key: value for key, value in expected.items() if value is not None}  # null is absent
    given.pop("stream", None) if given.get("stream") is False else None
    assert to_body(request) == given


@pytest.mark.parametrize(("kind", "fields", "param"), REFUSED)
def test_what_the_models_refuse_the_contract_refuses_naming_the_same_field(
        kind: str, fields: dict[str, Any], param: str) -> None:
    body = body_of(kind, fields)
    with pytest.raises(ValidationError):
        MODELS[kind].model_validate(body)

    with pytest.raises(InvalidRequestBody) as refused:
        decode(kind, body)

    assert refused.value.param == param


def test_unknown_fields_are_kept_beside_the_named_ones_at_every_level() -> None:
    body = {"model": "gpt-4.1", "messages": [{"role": "user", "content": "Hi", "cache_control": {"x": 1}}],
            "temperature": 0.5, "metadata": {"ticket": "T-1"}}

    request = decode("chat", body)

    assert isinstance(request, ChatRequest)
    assert (request.model, request.temperature) == ("gpt-4.1", 0.5)
    assert request.extra == {"metadata": {"ticket": "T-1"}}
    assert request.messages[0].extra == {"cache_control": {"x": 1}}
    assert to_body(request) == body


def test_a_body_that_is_not_an_object_is_refused() -> None:
    with pytest.raises(InvalidRequestBody) as refused:
        decode("chat", ["not", "an", "object"])

    assert refused.value.param == "body"


def test_a_job_request_holds_the_struct_of_its_kind() -> None:
    embeddings = decode("embeddings", BASE["embeddings"])

    assert AIRequest("embeddings", embeddings).body is embeddings
    with pytest.raises(InvalidJob, match="EmbeddingsRequest"):
        AIRequest("chat", embeddings)
