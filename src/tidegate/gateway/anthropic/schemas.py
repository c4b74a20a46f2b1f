"""The request and response bodies of the Anthropic dialect (the Messages API), for validation and
for the OpenAPI document.

Unlike the OpenAI dialect's, these models refuse fields they do not name (`extra="forbid"`): a
Messages request is translated into a chat completion, and a field the translation does not know
(`thinking`, a `document` block) would otherwise be dropped without a word, changing the answer.
`cache_control` is the exception: a caching hint, it changes what a call costs, never what it
answers, and is accepted and left out. Types are strict, as in the OpenAI dialect. What has a name
here and no chat translation (`top_k`, `thinking` and the thinking blocks sent back with it) is
served only when every provider that may answer speaks the Messages API natively (the request
then goes to it as it is, `cache_control` included).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from tidegate.gateway.core.limits import MAX_OUTPUT_TOKENS
from tidegate.gateway.core.schemas import PriorityValue

__all__ = [
    "AnthropicError",
    "AnthropicErrorBody",
    "Base64ImageSource",
    "CacheCreation",
    "ContentBlock",
    "CountTokensRequest",
    "ImageBlock",
    "InputMessage",
    "Message",
    "MessageUsage",
    "MessagesRequest",
    "OutputTokensDetails",
    "RedactedThinkingBlock",
    "TextBlock",
    "ThinkingBlock",
    "ThinkingConfig",
    "TokenCount",
    "Tool",
    "ToolChoice",
    "ToolResultBlock",
    "ToolUseBlock",
    "UrlImageSource",
]

_STRICT = ConfigDict(extra="forbid", strict=True)


class _Block(BaseModel):
    model_config = _STRICT

    cache_control: dict[str, Any] | None = Field(None, description="Accepted and not used: a hint "
                                                 "about the provider's prompt cache.")


class TextBlock(_Block):
    """Text."""

    type: Literal["text"]
    text: str


class Base64ImageSource(BaseModel):
    """An image given inline."""

    model_config = _STRICT

    type: Literal["base64"]
    media_type: Literal["image/jpeg", "image/png", "image/gif", "image/webp"]
    data: str = Field(min_length=1)


class UrlImageSource(BaseModel):
    """An image the provider fetches."""

    model_config = _STRICT

    type: Literal["url"]
    url: str = Field(min_length=1)


class ImageBlock(_Block):
    """An image, inline or by URL."""

    type: Literal["image"]
    source: Annotated[Base64ImageSource | UrlImageSource, Field(discriminator="type")]


class ToolUseBlock(_Block):
    """A tool call the assistant made, in a conversation sent back."""

    type: Literal["tool_use"]
    id: str = Field(min_length=1)
    name: str = Field(min_length=1)
    input: dict[str, Any]


class ToolResultBlock(_Block):
    """What a tool call returned: text, or text and image blocks."""

    type: Literal["tool_result"]
    tool_use_id: str = Field(min_length=1)
    content: str | list[Annotated[TextBlock | ImageBlock, Field(discriminator="type")]] | None = None
    is_error: bool | None = None


class ThinkingBlock(_Block):
    """The model's reasoning in an assistant turn sent back (with extended thinking), signed."""

    type: Literal["thinking"]
    thinking: str
    signature: str


class RedactedThinkingBlock(_Block):
    """Reasoning the provider keeps encrypted, sent back as it came."""

    type: Literal["redacted_thinking"]
    data: str


ContentBlock = Annotated[TextBlock | ImageBlock | ToolUseBlock | ToolResultBlock | ThinkingBlock
                         | RedactedThinkingBlock, Field(discriminator="type")]


class InputMessage(BaseModel):
    """One turn of the conversation."""

    model_config = _STRICT

    role: Literal["user", "assistant"]
    content: str | list[ContentBlock]


class Tool(BaseModel):
    """A client tool the model may call."""

    model_config = _STRICT

    name: str = Field(min_length=1, max_length=128, pattern=r"^[a-zA-Z0-9_-]+$")
    description: str | None = None
    input_schema: dict[str, Any] = Field(description="A JSON Schema of the tool's input (an object).")
    cache_control: dict[str, Any] | None = None
    type: Literal["custom"] | None = None


class ToolChoice(BaseModel):
    """Whether and which tool to call: `auto`, `any` (some tool), `tool` (the one named), `none`."""

    model_config = _STRICT

    type: Literal["auto", "any", "tool", "none"]
    name: str | None = Field(None, min_length=1, description="The tool, with `type: tool`.")
    disable_parallel_tool_use: bool | None = None


class _Metadata(BaseModel):
    model_config = _STRICT

    user_id: str | None = Field(None, max_length=256)


class ThinkingConfig(BaseModel):
    """Extended thinking: `enabled` with a budget of tokens, or `disabled`."""

    model_config = _STRICT

    type: Literal["enabled", "disabled"]
    budget_tokens: int | None = Field(None, ge=1)


class _Conversation(BaseModel):
    """What a Messages request and a token count share."""

    model_config = _STRICT

    model: str = Field(min_length=1, description='A model tidegate serves, or "auto" to route by '
                       "priority.")
    messages: list[InputMessage] = Field(min_length=1)
    system: str | list[TextBlock] | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None


class MessagesRequest(_Conversation):
    """A Messages API request. `priority` is tidegate's (like the X-Priority header) and is never
    sent to the provider. `top_k` and `thinking` have no counterpart in the chat completions a job
    carries: they are served by a provider that speaks the Messages API natively, and refused with
    400 rather than dropped when another may answer."""

    model_config = ConfigDict(
        extra="forbid", strict=True,
        json_schema_extra={"examples": [{
            "model": "auto", "max_tokens": 256, "system": "Answer in one line.",
            "messages": [{"role": "user", "content": "Summarise this ticket."}],
        }]},
    )

    max_tokens: int = Field(ge=1, le=MAX_OUTPUT_TOKENS)
    stop_sequences: list[str] | None = Field(None, max_length=4, description=(
        "At most 4: what an OpenAI-compatible upstream accepts."))
    stream: bool = False
    temperature: float | None = Field(None, ge=0, le=1)
    top_p: float | None = Field(None, ge=0, le=1)
    top_k: int | None = Field(None, ge=0, description=(
        "Served only when every provider of the model speaks the Messages API natively; else 400."))
    thinking: ThinkingConfig | None = Field(None, description=(
        "Served only when every provider of the model speaks the Messages API natively; else 400."))
    metadata: _Metadata | None = None
    priority: PriorityValue | None = None
    service_tier: Literal["auto", "standard_only"] | None = Field(None, description=(
        "standard_only: the provider's standard (default) tier; auto (or left out): the tier the "
        "provider's tier policy picks by the job's priority. `usage.service_tier` names the tier "
        "used, and the job is charged its price."))


class CountTokensRequest(_Conversation):
    """A conversation whose input tokens are counted."""

    model_config = ConfigDict(
        extra="forbid", strict=True,
        json_schema_extra={"examples": [{"model": "auto",
                                         "messages": [{"role": "user", "content": "Hello"}]}]},
    )


class TokenCount(BaseModel):
    """The input tokens of a conversation, estimated."""

    input_tokens: int


class CacheCreation(BaseModel):
    """The input tokens written to the prompt cache, by how long they are kept."""

    ephemeral_5m_input_tokens: int
    ephemeral_1h_input_tokens: int


class OutputTokensDetails(BaseModel):
    """What the output tokens were spent on."""

    thinking_tokens: int


class MessageUsage(BaseModel):
    """Tokens the call consumed, as the provider counted them: `input_tokens` leaves out those read
    from the prompt cache and written to it, counted apart."""

    input_tokens: int
    output_tokens: int
    cache_creation_input_tokens: int | None = None
    cache_read_input_tokens: int | None = None
    cache_creation: CacheCreation | None = None
    output_tokens_details: OutputTokensDetails | None = None
    service_tier: Literal["standard", "priority", "batch"] | None = None


class Message(BaseModel):
    """The model's answer: text and tool_use blocks."""

    model_config = ConfigDict(extra="allow")

    id: str
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    content: list[dict[str, Any]]
    model: str
    stop_reason: Literal["end_turn", "max_tokens", "stop_sequence", "tool_use", "refusal"] | None
    stop_sequence: str | None = None
    usage: MessageUsage


class AnthropicErrorBody(BaseModel):
    """The inside of an error answer: Anthropic's `type` and `message`, with tidegate's `code`
    (always present) and the job concerned, if any."""

    model_config = ConfigDict(json_schema_extra={"examples": [{
        "type": "invalid_request_error", "message": "invalid request: max_tokens: Field required",
        "code": "invalid_request"}]})

    type: str
    message: str
    code: str | None = None
    job_id: str | None = None


class AnthropicError(BaseModel):
    """An error answer, as Anthropic's API shapes it."""

    type: Literal["error"] = "error"
    error: AnthropicErrorBody
