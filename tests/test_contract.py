"""The typed request contract (tidegate.contract) refuses what the OpenAI dialect's pydantic models
refuse and accepts what they accept, naming the same field, and gives the provider back the body
the caller sent, unknown fields included. The pydantic models stay for the OpenAPI document while
the door decodes with the contract, so this holds the two to one definition.

The same holds for the requests a job keeps as its origin (the Responses and Messages dialects'
models, `decode_origin`) on the fields their structs check (the nested items and blocks are the
dialects' to check), and such a request goes back byte for byte as it was validated: the stored
payload and the body a native upstream is sent are what they were when the origin was a dict.
"""

from __future__ import annotations

from typing import Any

import msgspec
import openai
import orjson
import pytest
from pydantic import BaseModel, ValidationError

from test_gateway_validation import CHAT_ERRORS
from tidegate.ai import AIRequest, Origin, OriginApi
from tidegate.contract import (
    ChatRequest,
    InvalidRequestBody,
    ResponsesRequest,
    decode,
    decode_origin,
    sent_or,
    to_body,
)
from tidegate.errors import InvalidJob
from tidegate.gateway.anthropic.schemas import MessagesRequest
from tidegate.gateway.openai.schemas import (
    ChatCompletionRequest,
    CompletionRequest,
    EmbeddingsRequest,
    ModerationRequest,
)
from tidegate.gateway.responses.schemas import ResponseCreateRequest

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
# The requests a job keeps as its origin, in the Responses and Messages dialects' models.
ORIGIN_MODELS: dict[str, type[BaseModel]] = {"responses": ResponseCreateRequest,
                                                   "anthropic": MessagesRequest}
ORIGIN_BASE: dict[str, dict[str, Any]] = {
    "responses": {"model": "auto", "input": "Say hello"},
    "anthropic": {"model": "auto", "max_tokens": 64, "messages": [{"role": "user", "content": "Say hello"}]},
}
ITEMS = [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi"}]},
         {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
         {"type": "function_call_output", "call_id": "c1", "output": "42"}]
BLOCKS = [{"role": "user", "content": [{"type": "text", "text": "Hi",
                                         "cache_control": {"type": "ephemeral"}}]},
          {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {}}]},
          {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "42"}]}]
ORIGIN_ACCEPTED: list[tuple[OriginApi, dict[str, Any]]] = [
    ("responses", {"input": ITEMS, "instructions": "Be brief.", "previous_response_id": "resp_1",
                   "max_output_tokens": 1_000_000, "temperature": 2, "top_p": 1, "top_logprobs": 20,
                   "tools": [{"type": "web_search_preview"}],
                   "tool_choice": {"type": "function", "name": "f"}, "parallel_tool_calls": False,
                   "text": {"format": {"type": "json_object"}},
                   "reasoning": {"effort": "low", "summary": "auto"},
                   "metadata": {f"k{index}": "v" for index in range(16)}}),
    ("responses", {"store": False, "background": True, "stream": True,
                   "stream_options": {"include_obfuscation": False},
                   "include": ["reasoning.encrypted_content"], "truncation": "auto", "user": "u",
                   "prompt_cache_key": "p", "safety_identifier": "s", "priority": "high",
                   "service_tier": "flex"}),
    # Nulls and the API's defaults, sent explicitly, stay as sent.
    ("responses", {"instructions": None, "temperature": None, "store": None, "metadata": None, "priority": 1,
                   "parallel_tool_calls": True, "tool_choice": "auto", "background": False}),
    # Fields tidegate does not name, one of them called `extra`, after the named ones.
    ("responses", {"prompt": {"id": "pmpt_1"}, "extra": "the caller's", "conversation": "conv_1",
                   "top_p": 0.5}),
    ("anthropic", {"messages": BLOCKS, "system": "Be brief.", "tools": [{"name": "f", "input_schema": {}}],
                   "tool_choice": {"type": "auto"}, "stop_sequences": ["a", "b", "c", "d"], "stream": True,
                   "temperature": 1, "top_p": 0, "top_k": 5,
                   "thinking": {"type": "enabled", "budget_tokens": 1024}, "metadata": {"user_id": "u"},
                   "priority": "low", "service_tier": "standard_only"}),
    ("anthropic", {"system": [{"type": "text", "text": "Be brief."}], "stream": False,
                   "max_tokens": 1_000_000}),
    ("anthropic", {"system": None, "temperature": None, "top_k": None, "metadata": None,
                   "service_tier": None}),
]
# (api, fields over the base body, the field the struct names); a struct checks its own fields,
# not the items and blocks inside them.
ORIGIN_REFUSED: list[tuple[str, dict[str, Any], str]] = [
    ("responses", {"input": openai.omit}, "input"),
    ("responses", {"input": 5}, "input"),
    ("responses", {"input": [1]}, "input.0"),
    ("responses", {"model": ""}, "model"),
    ("responses", {"model": 5}, "model"),
    ("responses", {"instructions": 5}, "instructions"),
    ("responses", {"previous_response_id": ""}, "previous_response_id"),
    ("responses", {"max_output_tokens": 0}, "max_output_tokens"),
    ("responses", {"max_output_tokens": 1.0}, "max_output_tokens"),
    ("responses", {"temperature": 2.5}, "temperature"),
    ("responses", {"temperature": "1"}, "temperature"),
    ("responses", {"top_p": -0.1}, "top_p"),
    ("responses", {"top_logprobs": 21}, "top_logprobs"),
    ("responses", {"tools": {"type": "web_search_preview"}}, "tools"),
    ("responses", {"tool_choice": 5}, "tool_choice"),
    ("responses", {"parallel_tool_calls": "no"}, "parallel_tool_calls"),
    ("responses", {"metadata": {f"k{index}": "v" for index in range(17)}}, "metadata"),
    ("responses", {"metadata": {"k": 1}}, "metadata"),
    ("responses", {"store": "yes"}, "store"),
    ("responses", {"background": 1}, "background"),
    ("responses", {"include": ["a", 1]}, "include.1"),
    ("responses", {"truncation": "middle"}, "truncation"),
    ("responses", {"priority": 1.5}, "priority"),
    ("responses", {"service_tier": "scale"}, "service_tier"),
    ("anthropic", {"model": openai.omit}, "model"),
    ("anthropic", {"model": ""}, "model"),
    ("anthropic", {"max_tokens": openai.omit}, "max_tokens"),
    ("anthropic", {"max_tokens": 0}, "max_tokens"),
    ("anthropic", {"max_tokens": 1_000_001}, "max_tokens"),
    ("anthropic", {"messages": []}, "messages"),
    ("anthropic", {"messages": "Hi"}, "messages"),
    ("anthropic", {"system": 5}, "system"),
    ("anthropic", {"tool_choice": "auto"}, "tool_choice"),
    ("anthropic", {"stop_sequences": ["a"] * 5}, "stop_sequences"),
    ("anthropic", {"stream": None}, "stream"),
    ("anthropic", {"temperature": 1.5}, "temperature"),
    ("anthropic", {"top_k": -1}, "top_k"),
    ("anthropic", {"service_tier": "priority"}, "service_tier"),
]


def body_of(kind: str, fields: dict[str, Any]) -> dict[str, Any]:
    """The base body of the kind (or origin's API) with `fields` over it (`openai.omit` takes a
    field out)."""
    merged = {**{**BASE, **ORIGIN_BASE}[kind], **fields}
    return {key: value for key, value in merged.items() if value is not openai.omit}


def decoded(kind: str, body: dict[str, Any]) -> object:
    """`body` decoded as a request of `kind`, or as an origin's in that API."""
    return decode_origin(kind, body) if kind in ORIGIN_BASE else decode(kind, body)


@pytest.mark.parametrize(("kind", "fields"), ACCEPTED)
def test_what_the_models_accept_the_contract_accepts_and_hands_back_as_sent(
        kind: str, fields: dict[str, Any]) -> None:
    body = body_of(kind, fields)
    expected = MODELS[kind].model_validate(body).model_dump(exclude_unset=True)

    request = decode(kind, body)

    given = {key: value for key, value in expected.items() if value is not None}  # null is absent
    given.pop("stream", None) if given.get("stream") is False else None
    assert to_body(request) == given


@pytest.mark.parametrize(("kind", "fields", "param"), [*REFUSED, *ORIGIN_REFUSED])
def test_what_the_models_refuse_the_contract_refuses_naming_the_same_field(
        kind: str, fields: dict[str, Any], param: str) -> None:
    body = body_of(kind, fields)
    with pytest.raises(ValidationError):
        {**MODELS, **ORIGIN_MODELS}[kind].model_validate(body)

    with pytest.raises(InvalidRequestBody) as refused:
        decoded(kind, body)

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


# ---------------------------------------------------------------------------- origins


@pytest.mark.parametrize(("api", "fields"), ORIGIN_ACCEPTED)
def test_what_the_origin_models_accept_the_contract_accepts_and_hands_back_byte_for_byte(
        api: OriginApi, fields: dict[str, Any]) -> None:
    validated = ORIGIN_MODELS[api].model_validate(body_of(api, fields)).model_dump(exclude_unset=True)

    request = decode_origin(api, validated)

    # The very bytes of the dict the origin was: the same fields, values and order.
    assert orjson.dumps(to_body(request)) == orjson.dumps(validated)


@pytest.mark.parametrize(("api", "fields"), ORIGIN_ACCEPTED)
def test_an_origin_is_stored_as_the_dict_it_was_and_read_back_as_the_same_struct(
        api: OriginApi, fields: dict[str, Any]) -> None:
    validated = ORIGIN_MODELS[api].model_validate(body_of(api, fields)).model_dump(exclude_unset=True)
    origin = Origin.of(api, validated, native_only=True)

    stored = orjson.loads(orjson.dumps(origin.to_payload()))

    assert stored == {"api": api, "body": validated, "native_only": True}
    assert Origin.from_payload(stored) == origin


def test_an_origins_fields_read_as_sent_and_unknown_ones_are_kept_beside_them() -> None:
    body = {"model": "gpt-4.1", "input": "Hi", "store": False, "instructions": None, "prompt": {"id": "p"}}

    request = decode_origin("responses", body)

    assert isinstance(request, ResponsesRequest)
    assert (request.model, request.input) == ("gpt-4.1", "Hi")
    assert (request.store, request.instructions) == (False, None)
    assert request.temperature is msgspec.UNSET and request.extra == {"prompt": {"id": "p"}}
    assert not request.stored and not request.in_background
    assert request.input_items == [{"type": "message", "role": "user", "content": "Hi"}]
    # The API's defaults read where the caller left a field out or sent null.
    assert (sent_or(request.temperature, 1.0), sent_or(request.instructions, "none")) == (1.0, "none")


def test_a_responses_origin_stored_by_0_1_0_without_a_model_still_reads() -> None:
    # 0.1.0 defaulted a Responses request's model to "auto" and stored the request as given.
    stored = {"api": "responses", "body": {"input": "Hi", "background": True}}

    origin = Origin.from_payload(stored)

    assert origin is not None and isinstance(origin.body, ResponsesRequest)
    assert sent_or(origin.body.model, "auto") == "auto" and origin.body.in_background
    assert origin.to_payload() == stored
    with pytest.raises(ValidationError):  # the door requires one now, as OpenAI does
        ResponseCreateRequest.model_validate(stored["body"])


def test_an_origins_body_is_its_apis_struct() -> None:
    messages = decode_origin("anthropic", ORIGIN_BASE["anthropic"])

    with pytest.raises(InvalidJob, match="ResponsesRequest"):
        Origin("responses", messages)
    with pytest.raises(InvalidJob, match="origin body: input"):
        Origin.from_payload({"api": "responses", "body": {"model": "auto", "input": 5}})
