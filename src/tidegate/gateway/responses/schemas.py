"""The request and response bodies of OpenAI's Responses API, for validation and for the OpenAPI
document.

The request model names every field the gateway translates or may leave out without changing the
answer. Any other field is kept aside (`extra="allow"`) only to be refused by name: a chat-only
upstream cannot honour it, and dropping it silently would answer another question than the one
asked; when every provider that may serve the request speaks the Responses API natively, it is
sent on as it is. Input items and tools are objects here; their shapes are checked item by item
by the translation (tidegate.gateway.responses.dialect), whose errors name the item.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from tidegate.config import ServiceTier
from tidegate.gateway.core.limits import MAX_METADATA_KEYS, MAX_OUTPUT_TOKENS, MAX_TOP_LOGPROBS
from tidegate.gateway.core.schemas import PriorityValue

__all__ = [
    "MAX_METADATA_KEYS",
    "CompactedResponse",
    "ResponseCompactRequest",
    "ResponseCreateRequest",
    "ResponseDeleted",
    "ResponseInputTokens",
    "ResponseInputTokensRequest",
    "ResponseItemList",
    "ResponseObject",
]


class ResponseCreateRequest(BaseModel):
    """A Responses API request. `model` is required, as OpenAI requires it: "auto" lets tidegate
    route by priority, size and budget; `priority` is tidegate's, as on chat completions. Ranges
    are those of OpenAI's API reference, checked before anything is queued."""

    model_config = ConfigDict(
        extra="allow", strict=True,
        json_schema_extra={"examples": [{
            "model": "auto", "instructions": "Answer in one line.",
            "input": "Summarise this ticket.", "priority": "high",
        }]},
    )

    model: str = Field(min_length=1, description=(
        'A model tidegate serves (GET /v1/models), or "auto" to route by priority, size and budget '
        "over the models the key's tenant may use."))
    input: str | list[dict[str, Any]] = Field(description=(
        "Text, or items: messages (roles user, system, developer, assistant; input_text, "
        "output_text, input_image and input_file parts: `file_data`, or the `file_id` of an "
        "upload with purpose user_data), function_call and function_call_output."))
    instructions: str | None = None
    previous_response_id: str | None = Field(None, min_length=1)
    max_output_tokens: int | None = Field(None, ge=1, le=MAX_OUTPUT_TOKENS)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, ge=0, le=1)
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS, description=(
        "Served by a provider that speaks the Responses API natively only."))
    tools: list[dict[str, Any]] | None = Field(None, description=(
        "Function tools; any other (built-in) tool when a native provider serves the request."))
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    text: dict[str, Any] | None = Field(None, description="`format`: text, json_object or json_schema.")
    reasoning: dict[str, Any] | None = Field(None, description=(
        "`effort`; more (`summary`) when a native provider serves the request."))
    metadata: dict[str, str] | None = Field(None, max_length=MAX_METADATA_KEYS)
    store: bool | None = Field(None, description=(
        "false: the response cannot be retrieved or continued afterwards."))
    background: bool | None = Field(None, description="Answer at once with status `queued`; poll it.")
    stream: bool | None = None
    stream_options: dict[str, Any] | None = None
    include: list[str] | None = Field(None, description=(
        "Served by a provider that speaks the Responses API natively only."))
    truncation: Literal["disabled", "auto"] | None = Field(None, description=(
        "auto: served by a provider that speaks the Responses API natively only."))
    user: str | None = None
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None
    priority: PriorityValue | None = None
    service_tier: ServiceTier | None = Field(None, description=(
        "The provider's processing tier, sent upstream as given; left out, the provider's tier "
        "policy may pick one by the job's priority. The response's `service_tier` names the tier "
        "the call ran at, and the job is charged that tier's price."))


class ResponseInputTokensRequest(BaseModel):
    """What POST /v1/responses/input_tokens counts: the fields of a Responses request that reach
    the model's input (OpenAI's own list for this endpoint). `model` may be left out, as OpenAI
    allows: "auto" then. Any other field is refused by name (`invalid_request`): nothing else
    reaches the input."""

    model_config = ConfigDict(
        extra="forbid", strict=True,
        json_schema_extra={"examples": [{"model": "auto", "instructions": "Answer in one line.",
                                         "input": "Summarise this ticket."}]},
    )

    model: str = Field("auto", min_length=1, description=(
        'The model the count is for, checked as a response\'s would be; "auto" when left out.'))
    input: str | list[dict[str, Any]] = Field(default_factory=list, description=(
        "As a response's `input`."))
    instructions: str | None = None
    previous_response_id: str | None = Field(None, min_length=1, description=(
        "The stored response whose conversation comes before the input, counted with it."))
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    text: dict[str, Any] | None = None
    reasoning: dict[str, Any] | None = None
    truncation: Literal["disabled", "auto"] | None = None

    def as_response(self) -> ResponseCreateRequest:
        """The Responses request whose input this counts, to be translated as any other."""
        return ResponseCreateRequest.model_validate(self.model_dump(exclude_unset=True) | {
            "model": self.model, "input": self.input})  # the same fields and types: it cannot fail


class ResponseCompactRequest(BaseModel):
    """What POST /v1/responses/compact compacts: the conversation of `previous_response_id`, then
    `input` (at least one of the two), with `instructions` before it, by `model` ("auto" lets
    tidegate route). `priority` is tidegate's. A field OpenAI adds to this endpoint (`image`,
    `prompt_cache_options`, …) is kept aside and refused by name (`unsupported_parameter`), unless
    every provider that may serve the model speaks the Responses API natively: it is then sent on
    as it is."""

    model_config = ConfigDict(
        extra="allow", strict=True,
        json_schema_extra={"examples": [{"model": "auto", "previous_response_id": "resp_0123456789abcdef",
                                         "input": "Let's go on."}]},
    )

    model: str = Field(min_length=1, description=(
        'The model that compacts the conversation (GET /v1/models), or "auto".'))
    input: str | list[dict[str, Any]] | None = Field(None, description=(
        "As a response's `input`: the conversation, or what follows that of "
        "`previous_response_id`."))
    instructions: str | None = None
    previous_response_id: str | None = Field(None, min_length=1, description=(
        "A stored response of the key's tenant whose conversation (its input and output) comes "
        "before `input`."))
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None
    priority: PriorityValue | None = None
    service_tier: ServiceTier | None = None

    def as_response(self) -> ResponseCreateRequest:
        """The conversation to compact as a Responses request, to be read as any other: the
        fields declared here (what a chat completion may be asked as well), the input as items."""
        given = self.model_dump(exclude_unset=True, exclude=set(self.model_extra or ()))
        return ResponseCreateRequest.model_validate(given | {"input": self.input or []})


class CompactedResponse(BaseModel):
    """A compacted conversation: its user messages, then one compaction item; given as the `input`
    of the next response, it stands for the whole conversation. The compaction item is OpenAI's own
    (encrypted) when a provider speaking the Responses API compacted it, else tidegate's, whose
    `encrypted_content` is its summary in clear (see the Responses API page)."""

    model_config = ConfigDict(extra="allow")

    id: str = Field(examples=["resp_0123456789abcdef"])
    object: Literal["response.compaction"] = "response.compaction"
    created_at: int
    output: list[dict[str, Any]]
    usage: dict[str, Any]


class ResponseInputTokens(BaseModel):
    """The input tokens of a Responses request, estimated."""

    object: Literal["response.input_tokens"] = "response.input_tokens"
    input_tokens: int


class ResponseObject(BaseModel):
    """A response: the job that answers it, in the Responses API's shape."""

    model_config = ConfigDict(extra="allow")

    id: str = Field(examples=["resp_0123456789abcdef"])
    object: Literal["response"] = "response"
    created_at: int
    status: Literal["queued", "in_progress", "completed", "incomplete", "failed", "cancelled"]
    model: str
    output: list[dict[str, Any]]
    usage: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    incomplete_details: dict[str, Any] | None = None
    service_tier: str | None = Field(None, description=(
        "The tier the call ran at as the provider named it, else the tier asked for."))


class ResponseDeleted(BaseModel):
    """What DELETE did."""

    id: str
    object: Literal["response.deleted"] = "response.deleted"
    deleted: bool = True


class ResponseItemList(BaseModel):
    """A page of a response's input items."""

    object: Literal["list"] = "list"
    data: list[dict[str, Any]]
    first_id: str | None = None
    last_id: str | None = None
    has_more: bool = False
