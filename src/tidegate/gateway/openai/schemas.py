"""The request and response bodies of the OpenAI dialect, for validation and for the OpenAPI
document.

The request models name the fields the gateway reads and checks, and let every other field
through untouched (`extra="allow"`): tools, response_format and whatever providers add next
reach the provider as the client sent them. Types are strict: a string where a number belongs is
refused, not coerced. The ranges are those of OpenAI's API reference (roles, `seed` within a
64-bit integer, `temperature` 0-2, `top_p` 0-1, `n` 1-128, penalties -2..2, `top_logprobs`
0-20, up to 4 `stop` sequences, …), so a request the provider would refuse is refused at the door
with a 400 naming the field, never queued to be refused upstream and dead-lettered. `model` is
required, as OpenAI requires it: `"auto"` asks tidegate to route.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PlainValidator, WithJsonSchema, field_validator

from tidegate.config import ServiceTier
from tidegate.gateway.core.limits import (
    MAX_CHOICES,
    MAX_EMBEDDING_DIMENSIONS,
    MAX_EMBEDDING_INPUTS,
    MAX_INPUT_TOKENS,
    MAX_OUTPUT_TOKENS,
    MAX_STOPS,
    MAX_TOP_LOGPROBS,
)
from tidegate.gateway.core.schemas import PriorityValue

__all__ = [
    "ChatCompletion",
    "ChatCompletionRequest",
    "ChatMessage",
    "Completion",
    "CompletionRequest",
    "Embeddings",
    "EmbeddingsRequest",
    "Moderation",
    "ModerationRequest",
]

_PASS_THROUGH = ConfigDict(extra="allow", strict=True)
_MODEL_DESCRIPTION = ('A model tidegate serves (GET /v1/models), or "auto" to route by priority, size '
                      "and budget over the models the key's tenant may use.")
# OpenAI's own bounds (its API reference), shared by the chat and legacy completion models.
_Seed = Annotated[int, Field(ge=-(2**63), le=2**63 - 1, description="Within a 64-bit signed integer.")]
_Penalty = Annotated[float, Field(ge=-2, le=2)]
_LogitBias = dict[str, Annotated[int, Field(ge=-100, le=100)]]
_ChatRole = Literal["system", "developer", "user", "assistant", "tool", "function"]


def _stops(value: object) -> str | list[str]:
    """A chat completion's `stop`: one sequence, or a list of at most MAX_STOPS (checked here
    rather than as a union, whose refusal would name each branch instead of the field)."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(item, str) for item in value):
        if len(value) > MAX_STOPS:
            raise ValueError(f"at most {MAX_STOPS} stop sequences, got {len(value)}")
        return value
    raise ValueError("stop must be a string or a list of strings")


_ChatStop = Annotated[str | list[str], PlainValidator(_stops), WithJsonSchema({"anyOf": [
    {"type": "string"}, {"type": "array", "items": {"type": "string"}, "maxItems": MAX_STOPS}]})]
_TIER_DESCRIPTION = (
    "The provider's processing tier: auto, default, flex (cheaper, slower) or priority (faster, "
    "dearer). Sent upstream as given; left out, the provider's tier policy may choose one by the "
    "job's priority. The answer's `service_tier` names the tier used, and the job is charged its price.")


class ChatMessage(BaseModel):
    """One message of a conversation (any further OpenAI fields pass through)."""

    model_config = _PASS_THROUGH

    role: _ChatRole = Field(examples=["user"])
    content: str | list[dict[str, Any]] | None = Field(None, examples=["Say hello"])


class ChatCompletionRequest(BaseModel):
    """An OpenAI chat completion request. `model` may be "auto" to let tidegate route by priority,
    size and budget; `priority` is tidegate's and is removed before the body reaches the
    provider."""

    model_config = ConfigDict(
        extra="allow", strict=True,
        json_schema_extra={"examples": [{
            "model": "auto", "priority": "high",
            "messages": [{"role": "user", "content": "Summarise this ticket in one line."}],
        }]},
    )

    model: str = Field(min_length=1, description=_MODEL_DESCRIPTION)
    messages: list[ChatMessage] = Field(min_length=1)
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    max_tokens: int | None = Field(None, ge=1, le=MAX_OUTPUT_TOKENS)
    max_completion_tokens: int | None = Field(None, ge=1, le=MAX_OUTPUT_TOKENS)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, ge=0, le=1)
    n: int | None = Field(None, ge=1, le=MAX_CHOICES)
    seed: _Seed | None = None
    presence_penalty: _Penalty | None = None
    frequency_penalty: _Penalty | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    logit_bias: _LogitBias | None = Field(None, description="Token id → bias, each -100 to 100.")
    stop: _ChatStop | None = Field(None, description=f"Up to {MAX_STOPS} sequences.")
    user: str | None = None
    priority: PriorityValue | None = None
    service_tier: ServiceTier | None = Field(None, description=_TIER_DESCRIPTION)


_Texts = Annotated[list[str], Field(max_length=MAX_EMBEDDING_INPUTS)]
_TokenIds = Annotated[list[int], Field(max_length=MAX_INPUT_TOKENS)]  # one input, as token ids


class EmbeddingsRequest(BaseModel):
    """An OpenAI embeddings request; `model` may be "auto" (the configured embedding model).
    Inputs are not empty, as OpenAI requires."""

    model_config = ConfigDict(
        extra="allow", strict=True,
        json_schema_extra={"examples": [{"model": "text-embedding-3-small",
                                         "input": ["red running shoes", "blue kettle"]}]},
    )

    model: str = Field(min_length=1, description=_MODEL_DESCRIPTION)
    input: str | _Texts | _TokenIds | Annotated[list[_TokenIds], Field(max_length=MAX_EMBEDDING_INPUTS)]
    encoding_format: Literal["float", "base64"] | None = None
    dimensions: int | None = Field(None, ge=1, le=MAX_EMBEDDING_DIMENSIONS, description=(
        "The size of each vector; at most the model's own (OpenAI's largest is 3072)."))
    user: str | None = None
    priority: PriorityValue | None = None
    service_tier: ServiceTier | None = Field(None, description=_TIER_DESCRIPTION)

    @field_validator("input")
    @classmethod
    def _not_empty(cls, value: str | list[Any]) -> str | list[Any]:
        if isinstance(value, list) and not value:
            raise ValueError("input must not be an empty list")
        items = [value] if isinstance(value, str) else value
        if any(item == "" or item == [] for item in items):
            raise ValueError("input must not hold an empty string, nor an empty list of token ids")
        return value


_Prompts = Annotated[list[str], Field(min_length=1, max_length=MAX_EMBEDDING_INPUTS)]
_TokenIdLists = Annotated[list[_TokenIds], Field(min_length=1, max_length=MAX_EMBEDDING_INPUTS)]
_Stops = Annotated[list[Annotated[str, Field(min_length=1)]], Field(min_length=1, max_length=MAX_STOPS)]


class CompletionRequest(BaseModel):
    """An OpenAI legacy completion request (POST /v1/completions): `prompt` is a string, strings,
    token ids or lists of token ids. `model` names a completion model (e.g.
    gpt-3.5-turbo-instruct), or "auto" for the first one configured."""

    model_config = ConfigDict(
        extra="allow", strict=True,
        json_schema_extra={"examples": [{"model": "gpt-3.5-turbo-instruct", "prompt": "Once upon a time",
                                         "max_tokens": 32}]},
    )

    model: str = Field(min_length=1)
    prompt: str | _Prompts | _TokenIds | _TokenIdLists
    suffix: str | None = None
    max_tokens: int | None = Field(None, ge=0, le=MAX_OUTPUT_TOKENS)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, ge=0, le=1)
    n: int | None = Field(None, ge=1, le=MAX_CHOICES)
    best_of: int | None = Field(None, ge=0, le=20)
    logprobs: int | None = Field(None, ge=0, le=5)
    echo: bool | None = None
    stop: str | _Stops | None = None
    presence_penalty: _Penalty | None = None
    frequency_penalty: _Penalty | None = None
    logit_bias: _LogitBias | None = None
    seed: _Seed | None = None
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    user: str | None = None
    priority: PriorityValue | None = None

    @field_validator("prompt")
    @classmethod
    def _not_empty(cls, value: str | list[Any]) -> str | list[Any]:
        if isinstance(value, list) and (not value or any(item == [] for item in value)):
            raise ValueError("prompt must not be an empty list, nor hold an empty list of token ids")
        return value


class ModerationText(BaseModel):
    """A text item of a multimodal moderation input."""

    model_config = ConfigDict(extra="forbid", strict=True)

    type: Literal["text"]
    text: str


class ImageUrl(BaseModel):
    """An image, by URL or as a data URL."""

    model_config = ConfigDict(extra="forbid", strict=True)

    url: str = Field(min_length=1)


class ModerationImage(BaseModel):
    """An image item of a multimodal moderation input."""

    model_config = ConfigDict(extra="forbid", strict=True)

    type: Literal["image_url"]
    image_url: ImageUrl


_ModerationItem = Annotated[ModerationText | ModerationImage, Field(discriminator="type")]


_ModerationItems = Annotated[list[_ModerationItem], Field(min_length=1, max_length=MAX_EMBEDDING_INPUTS)]


class ModerationRequest(BaseModel):
    """An OpenAI moderation request (POST /v1/moderations): `input` is a string, strings, or
    multimodal items (text and images, classified together). `model` may be "auto" (or left out)
    for the first moderation model configured."""

    model_config = ConfigDict(
        extra="allow", strict=True,
        json_schema_extra={"examples": [{"model": "omni-moderation-latest", "input": "I want to hug them."}]},
    )

    model: str = Field("auto", min_length=1)
    input: str | _Prompts | _ModerationItems
    priority: PriorityValue | None = None


class ChatCompletion(BaseModel):
    """The provider's chat completion, as OpenAI shapes it (relayed unchanged)."""

    model_config = ConfigDict(extra="allow")

    id: str
    object: str = "chat.completion"
    created: int
    model: str
    choices: list[dict[str, Any]]
    usage: dict[str, Any] | None = None
    service_tier: str | None = Field(None, description="The tier the call ran at, when one was sent.")


class Embeddings(BaseModel):
    """The provider's embeddings answer, as OpenAI shapes it (relayed unchanged)."""

    model_config = ConfigDict(extra="allow")

    object: str = "list"
    data: list[dict[str, Any]]
    model: str
    usage: dict[str, Any] | None = None
    service_tier: str | None = Field(None, description="The tier the call ran at, when one was sent.")


class Completion(ChatCompletion):
    """The provider's legacy completion, as OpenAI shapes it (relayed unchanged): a chat
    completion's fields, its choices holding `text`."""

    object: str = "text_completion"


class Moderation(BaseModel):
    """The provider's moderation, as OpenAI shapes it (relayed unchanged): one result per input
    (one for all the items of a multimodal input)."""

    model_config = ConfigDict(extra="allow")

    id: str
    model: str
    results: list[dict[str, Any]]
