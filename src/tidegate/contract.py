"""The typed request contract: one msgspec Struct per request kind the queue carries (OpenAI's chat
completion, embeddings, legacy completion and moderation bodies), decoded once at the door and
read as fields from there on.

The structs name the fields tidegate reads or bounds, with the ranges of OpenAI's API reference
(roles, `seed` within a 64-bit integer, `temperature` 0-2, `top_p` 0-1, `n` 1-128, penalties
-2..2, `top_logprobs` 0-20, up to 4 `stop` sequences, …), so a request the provider would refuse
is refused at the door naming the field, never queued to be refused upstream. Types are strict: a
string where a number belongs is refused, not coerced.

Every field a struct does not name (tools, response_format, whatever providers add next) is kept
in its `extra` dict, at the request's level and at each chat message's, and goes back into the
body the provider is sent (`to_body`) untouched. A caller's own field named `extra` is one of
those: it never reaches the struct's field of that name.

A request field the caller left out or sent as null reads None (or its default) and is left out
of the body again: OpenAI reads a null as an absent field. A message's `content` keeps the
difference (UNSET when left out), as some upstreams want the null of a message of tool calls.

`decode(kind, body)` is the one way in and raises InvalidRequestBody naming the field
(`param`, as a dotted path: `messages.0.role`); `to_body(request)` the one way out.

A job made from a request in another API's shape keeps that request as its origin (tidegate.ai
`Origin`), typed too: OpenAI's Responses request (`ResponsesRequest`) or compaction request
(`CompactRequest`), or Anthropic's Messages request (`MessagesRequest`), decoded by
`decode_origin(api, body)` and written back by the same `to_body`. Their fields are as the caller
sent them, UNSET when left out and None when sent as null, so the body goes back exactly as it
came: to a provider that speaks that API natively, and into the stored payload, whose layout is
unchanged. Their nested objects (input items, tools,
content blocks) stay JSON objects, checked item by item by the dialect that translates them;
`sent_or` reads a field with the default the API documents for one left out or null.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Annotated, Any, Final, Literal, TypeAlias, TypeVar

import msgspec

from tidegate.config import ServiceTier
from tidegate.errors import InvalidJob

__all__ = [
    "MAX_CHOICES",
    "MAX_EMBEDDING_DIMENSIONS",
    "MAX_EMBEDDING_INPUTS",
    "MAX_INPUT_TOKENS",
    "MAX_METADATA_KEYS",
    "MAX_OUTPUT_TOKENS",
    "MAX_STOPS",
    "MAX_TOP_LOGPROBS",
    "ChatMessage",
    "ChatRequest",
    "CompactRequest",
    "CompletionRequest",
    "EmbeddingsRequest",
    "InvalidRequestBody",
    "MessagesRequest",
    "ModerationImage",
    "ModerationRequest",
    "ModerationText",
    "OriginBody",
    "RequestBody",
    "ResponsesRequest",
    "decode",
    "decode_origin",
    "items_of",
    "origin_struct_of",
    "requested_tier",
    "sent_or",
    "struct_of",
    "to_body",
    "unstreamed",
    "with_tier",
]

# The bounds of a request body, as OpenAI's API reference states them (gateway/core/limits.py
# re-exports them beside the gateway's own).
MAX_EMBEDDING_DIMENSIONS: Final = 3072  # text-embedding-3-large's own size, OpenAI's largest
MAX_EMBEDDING_INPUTS: Final = 2048  # inputs in one embeddings request, as OpenAI allows
MAX_INPUT_TOKENS: Final = 8192  # token ids of one embeddings input, as OpenAI allows
MAX_CHOICES: Final = 128  # `n` of a chat completion, as OpenAI allows
MAX_TOP_LOGPROBS: Final = 20  # `top_logprobs` of a chat completion or a response, as OpenAI allows
MAX_STOPS: Final = 4  # `stop` sequences of a completion, as OpenAI allows
# max_tokens / max_completion_tokens: above every model's output limit, and small enough that the
# worker's budget estimate (tokens times price) stays an ordinary number.
MAX_OUTPUT_TOKENS: Final = 1_000_000
MAX_METADATA_KEYS: Final = 16  # `metadata` pairs of a response, as OpenAI allows


class InvalidRequestBody(InvalidJob):
    """A request body its struct refuses; `param` is the field, as a dotted path, and the message
    names it first (`messages.0.role: Invalid enum value 'wizard'`)."""

    def __init__(self, detail: str, param: str) -> None:
        super().__init__(f"{param}: {detail}")
        self.param = param
        self.detail = detail


_Model = Annotated[str, msgspec.Meta(min_length=1)]
_Seed = Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)]
_Penalty = Annotated[float, msgspec.Meta(ge=-2, le=2)]
_Temperature = Annotated[float, msgspec.Meta(ge=0, le=2)]
_TopP = Annotated[float, msgspec.Meta(ge=0, le=1)]
_Choices = Annotated[int, msgspec.Meta(ge=1, le=MAX_CHOICES)]
_Priority = int | str  # a priority name or level, checked by tidegate.jobs.Priority.parse
ChatRole = Literal["system", "developer", "user", "assistant", "tool", "function"]
_T = TypeVar("_T")
_D = TypeVar("_D")
# A field of an origin's request as the caller sent it: a value, null, or left out (UNSET).
_Sent: TypeAlias = _T | msgspec.UnsetType | None


class _Body(msgspec.Struct, kw_only=True, omit_defaults=True):
    """What every body struct has: the fields it does not name, carried through."""

    extra: dict[str, Any] = {}


class ChatMessage(_Body, kw_only=True, omit_defaults=True, forbid_unknown_fields=True):
    """One message of a conversation: its role, as OpenAI publishes them, and its content (text,
    or parts). The other fields OpenAI defines for a message are named, and carried as given
    (UNSET when left out); any further field is in `extra`."""

    role: ChatRole
    # UNSET when left out: an explicit null (an assistant's message of tool calls) goes on as null.
    content: str | list[dict[str, Any]] | msgspec.UnsetType | None = msgspec.UNSET
    name: Any = msgspec.UNSET
    tool_calls: Any = msgspec.UNSET
    tool_call_id: Any = msgspec.UNSET
    function_call: Any = msgspec.UNSET
    refusal: Any = msgspec.UNSET
    audio: Any = msgspec.UNSET


class ChatRequest(_Body, kw_only=True, omit_defaults=True):
    """An OpenAI chat completion request. `model` may be "auto" to let tidegate route;
    `priority` is tidegate's (the intake takes it out before the job is stored)."""

    model: _Model
    messages: Annotated[list[ChatMessage], msgspec.Meta(min_length=1)]
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    max_tokens: Annotated[int, msgspec.Meta(ge=1, le=MAX_OUTPUT_TOKENS)] | None = None
    max_completion_tokens: Annotated[int, msgspec.Meta(ge=1, le=MAX_OUTPUT_TOKENS)] | None = None
    temperature: _Temperature | None = None
    top_p: _TopP | None = None
    n: _Choices | None = None
    seed: _Seed | None = None
    presence_penalty: _Penalty | None = None
    frequency_penalty: _Penalty | None = None
    logprobs: bool | None = None
    top_logprobs: Annotated[int, msgspec.Meta(ge=0, le=MAX_TOP_LOGPROBS)] | None = None
    logit_bias: dict[str, int] | None = None  # each -100 to 100 (checked below, to name the token)
    stop: str | Annotated[list[str], msgspec.Meta(max_length=MAX_STOPS)] | None = None
    user: str | None = None
    priority: _Priority | None = None
    service_tier: ServiceTier | None = None

    def __post_init__(self) -> None:
        _check_logit_bias(self.logit_bias)


class EmbeddingsRequest(_Body, kw_only=True, omit_defaults=True):
    """An OpenAI embeddings request: `input` is a string, strings, token ids or lists of token
    ids, never empty (as OpenAI requires); `model` may be "auto"."""

    model: _Model
    input: str | list[str | int | list[int]]
    encoding_format: Literal["float", "base64"] | None = None
    dimensions: Annotated[int, msgspec.Meta(ge=1, le=MAX_EMBEDDING_DIMENSIONS)] | None = None
    user: str | None = None
    priority: _Priority | None = None
    service_tier: ServiceTier | None = None

    def __post_init__(self) -> None:
        if isinstance(self.input, str):
            if not self.input:
                raise InvalidRequestBody("input must not be empty", "input")
            return
        _check_inputs(self.input, "input", strings_may_be_empty=False)


class CompletionRequest(_Body, kw_only=True, omit_defaults=True):
    """An OpenAI legacy completion request (POST /v1/completions): `prompt` is a string,
    strings, token ids or lists of token ids."""

    model: _Model
    prompt: str | list[str | int | list[int]]
    suffix: str | None = None
    max_tokens: Annotated[int, msgspec.Meta(ge=0, le=MAX_OUTPUT_TOKENS)] | None = None
    temperature: _Temperature | None = None
    top_p: _TopP | None = None
    n: _Choices | None = None
    best_of: Annotated[int, msgspec.Meta(ge=0, le=20)] | None = None
    logprobs: Annotated[int, msgspec.Meta(ge=0, le=5)] | None = None
    echo: bool | None = None
    stop: str | Annotated[list[Annotated[str, msgspec.Meta(min_length=1)]],
                          msgspec.Meta(min_length=1, max_length=MAX_STOPS)] | None = None
    presence_penalty: _Penalty | None = None
    frequency_penalty: _Penalty | None = None
    logit_bias: dict[str, int] | None = None
    seed: _Seed | None = None
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    user: str | None = None
    priority: _Priority | None = None

    def __post_init__(self) -> None:
        _check_logit_bias(self.logit_bias)
        if not isinstance(self.prompt, str):
            _check_inputs(self.prompt, "prompt", strings_may_be_empty=True)


class ModerationText(msgspec.Struct, tag_field="type", tag="text", forbid_unknown_fields=True):
    """A text item of a multimodal moderation input."""

    text: str


class ImageUrl(msgspec.Struct, forbid_unknown_fields=True):
    """An image, by URL or as a data URL."""

    url: Annotated[str, msgspec.Meta(min_length=1)]


class ModerationImage(msgspec.Struct, tag_field="type", tag="image_url", forbid_unknown_fields=True):
    """An image item of a multimodal moderation input."""

    image_url: ImageUrl


class ModerationRequest(_Body, kw_only=True, omit_defaults=True):
    """An OpenAI moderation request (POST /v1/moderations): `input` is a string, strings, or
    multimodal items (text and images, classified together); `model` may be "auto" or left out."""

    model: _Model = "auto"
    input: str | Annotated[list[str | ModerationText | ModerationImage],
                           msgspec.Meta(min_length=1, max_length=MAX_EMBEDDING_INPUTS)]
    priority: _Priority | None = None

    def __post_init__(self) -> None:
        if isinstance(self.input, list) and len({isinstance(item, str) for item in self.input}) > 1:
            raise InvalidRequestBody("input must be strings or multimodal items, not both", "input")


class ResponsesRequest(_Body, kw_only=True, omit_defaults=True):
    """An OpenAI Responses API request (POST /v1/responses), kept as the origin of the chat job it
    is translated into. The fields are declared in the order the gateway's pydantic model declares
    them, so the body is written back in the order it was stored. `model` may be left out: 0.1.0
    stored a request without one, which then meant "auto" (`sent_or(request.model, "auto")`)."""

    model: _Model | msgspec.UnsetType = msgspec.UNSET
    input: str | list[dict[str, Any]]
    instructions: _Sent[str] = msgspec.UNSET
    previous_response_id: _Sent[Annotated[str, msgspec.Meta(min_length=1)]] = msgspec.UNSET
    max_output_tokens: _Sent[Annotated[int, msgspec.Meta(ge=1, le=MAX_OUTPUT_TOKENS)]] = msgspec.UNSET
    temperature: _Sent[_Temperature] = msgspec.UNSET
    top_p: _Sent[_TopP] = msgspec.UNSET
    top_logprobs: _Sent[Annotated[int, msgspec.Meta(ge=0, le=MAX_TOP_LOGPROBS)]] = msgspec.UNSET
    tools: _Sent[list[dict[str, Any]]] = msgspec.UNSET
    tool_choice: _Sent[str | dict[str, Any]] = msgspec.UNSET
    parallel_tool_calls: _Sent[bool] = msgspec.UNSET
    text: _Sent[dict[str, Any]] = msgspec.UNSET
    reasoning: _Sent[dict[str, Any]] = msgspec.UNSET
    metadata: _Sent[Annotated[dict[str, str], msgspec.Meta(max_length=MAX_METADATA_KEYS)]] = msgspec.UNSET
    store: _Sent[bool] = msgspec.UNSET
    background: _Sent[bool] = msgspec.UNSET
    stream: _Sent[bool] = msgspec.UNSET
    stream_options: _Sent[dict[str, Any]] = msgspec.UNSET
    include: _Sent[list[str]] = msgspec.UNSET
    truncation: _Sent[Literal["disabled", "auto"]] = msgspec.UNSET
    user: _Sent[str] = msgspec.UNSET
    prompt_cache_key: _Sent[str] = msgspec.UNSET
    safety_identifier: _Sent[str] = msgspec.UNSET
    priority: _Sent[_Priority] = msgspec.UNSET
    service_tier: _Sent[ServiceTier] = msgspec.UNSET

    @property
    def input_items(self) -> list[dict[str, Any]]:
        """The input as items (`items_of`)."""
        return items_of(self.input)

    @property
    def stored(self) -> bool:
        """Whether the response is kept, to be retrieved and continued (`store`: true unless false)."""
        return self.store is not False

    @property
    def in_background(self) -> bool:
        """Whether the caller asked to be answered at once and poll (`background`: false by default)."""
        return self.background is True


class CompactRequest(_Body, kw_only=True, omit_defaults=True):
    """An OpenAI compaction request (POST /v1/responses/compact), kept as the origin of the job that
    a provider speaking the Responses API serves natively; its fields in the order of the gateway's
    pydantic model. The conversation is `input`, after the one `previous_response_id` names (the
    gateway resolves it into the origin's `context`). `priority` is tidegate's; what OpenAI adds
    (`image`, `prompt_cache_options`, …) is carried in `extra`, sent as it is."""

    model: _Model
    input: _Sent[str | list[dict[str, Any]]] = msgspec.UNSET
    instructions: _Sent[str] = msgspec.UNSET
    previous_response_id: _Sent[Annotated[str, msgspec.Meta(min_length=1)]] = msgspec.UNSET
    prompt_cache_key: _Sent[str] = msgspec.UNSET
    safety_identifier: _Sent[str] = msgspec.UNSET
    priority: _Sent[_Priority] = msgspec.UNSET
    service_tier: _Sent[ServiceTier] = msgspec.UNSET

    @property
    def input_items(self) -> list[dict[str, Any]]:
        """The input as items (`items_of`; none when it was left out)."""
        return items_of(self.input) if isinstance(self.input, str | list) else []


class MessagesRequest(_Body, kw_only=True, omit_defaults=True):
    """An Anthropic Messages API request (POST /v1/messages), kept as the origin of the chat job it
    is translated into; its fields in the order of the gateway's pydantic model. `priority` is
    tidegate's, never sent to the provider."""

    model: _Model
    messages: Annotated[list[dict[str, Any]], msgspec.Meta(min_length=1)]
    system: _Sent[str | list[dict[str, Any]]] = msgspec.UNSET
    tools: _Sent[list[dict[str, Any]]] = msgspec.UNSET
    tool_choice: _Sent[dict[str, Any]] = msgspec.UNSET
    max_tokens: Annotated[int, msgspec.Meta(ge=1, le=MAX_OUTPUT_TOKENS)]
    stop_sequences: _Sent[Annotated[list[str], msgspec.Meta(max_length=MAX_STOPS)]] = msgspec.UNSET
    stream: bool | msgspec.UnsetType = msgspec.UNSET  # false when left out; null is refused
    temperature: _Sent[Annotated[float, msgspec.Meta(ge=0, le=1)]] = msgspec.UNSET
    top_p: _Sent[_TopP] = msgspec.UNSET
    top_k: _Sent[Annotated[int, msgspec.Meta(ge=0)]] = msgspec.UNSET
    thinking: _Sent[dict[str, Any]] = msgspec.UNSET
    metadata: _Sent[dict[str, Any]] = msgspec.UNSET
    priority: _Sent[_Priority] = msgspec.UNSET
    service_tier: _Sent[Literal["auto", "standard_only"]] = msgspec.UNSET


RequestBody: TypeAlias = ChatRequest | EmbeddingsRequest | CompletionRequest | ModerationRequest
OriginBody: TypeAlias = ResponsesRequest | CompactRequest | MessagesRequest

_STRUCTS: Final[Mapping[str, type[RequestBody]]] = {
    "chat": ChatRequest, "embeddings": EmbeddingsRequest, "completion": CompletionRequest,
    "moderation": ModerationRequest}
_ORIGIN_STRUCTS: Final[Mapping[str, type[OriginBody]]] = {
    "responses": ResponsesRequest, "compact": CompactRequest, "anthropic": MessagesRequest}
_Decoded = TypeVar("_Decoded", bound=_Body)


def struct_of(kind: str) -> type[RequestBody]:
    """The struct of a request `kind` ("chat", "embeddings", "completion", "moderation")."""
    return _STRUCTS[kind]


def origin_struct_of(api: str) -> type[OriginBody]:
    """The struct of an origin's request in `api` ("responses", "compact", "anthropic")."""
    return _ORIGIN_STRUCTS[api]


def _named(struct: type[msgspec.Struct]) -> frozenset[str]:
    return frozenset(struct.__struct_fields__) - {"extra"}


_NAMED: Final[Mapping[type[_Body], frozenset[str]]] = {
    struct: _named(struct) for struct in (*_STRUCTS.values(), *_ORIGIN_STRUCTS.values())}
_MESSAGE_NAMED: Final = _named(ChatMessage)


def _check_logit_bias(bias: dict[str, int] | None) -> None:
    for token, value in (bias or {}).items():
        if not -100 <= value <= 100:
            raise InvalidRequestBody(f"must be -100 to 100, got {value}", f"logit_bias.{token}")


def _check_inputs(items: list[str | int | list[int]], field: str, *, strings_may_be_empty: bool) -> None:
    """A list input is one kind throughout (strings, token ids, or lists of token ids), not empty,
    within OpenAI's counts, and holds no empty list of token ids (nor, for embeddings, an empty
    string)."""
    if not items:
        raise InvalidRequestBody(f"{field} must not be an empty list", field)
    kinds = {type(item) for item in items}
    if len(kinds) > 1:
        raise InvalidRequestBody(f"{field} must be strings, token ids or lists of token ids, "
                                 "one kind throughout", field)
    limit = MAX_INPUT_TOKENS if kinds == {int} else MAX_EMBEDDING_INPUTS
    if len(items) > limit:
        raise InvalidRequestBody(f"at most {limit} items, got {len(items)}", field)
    for index, item in enumerate(items):
        if isinstance(item, list) and (not item or len(item) > MAX_INPUT_TOKENS):
            raise InvalidRequestBody(f"item {index}: a list of token ids must hold 1-{MAX_INPUT_TOKENS} "
                                     "ids", field)
        if item == "" and not strings_may_be_empty:
            raise InvalidRequestBody(f"item {index}: must not be an empty string", field)


def _split(document: Mapping[str, Any], named: frozenset[str]) -> dict[str, Any]:
    """`document` with what `named` does not hold moved into its `extra`."""
    known: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    for key, value in document.items():
        (known if key in named else extra)[key] = value
    known["extra"] = extra
    return known


def _with_messages_carried(document: Mapping[str, Any]) -> Mapping[str, Any]:
    """A chat document whose messages carry the fields they do not name in `extra`."""
    messages = document.get("messages")
    if not isinstance(messages, list) or all(
            isinstance(message, dict) and message.keys() <= _MESSAGE_NAMED for message in messages):
        return document
    return {**document, "messages": [_split(message, _MESSAGE_NAMED) if isinstance(message, dict) else message
                                     for message in messages]}


_PATH: Final = re.compile(r" - at `\$(?P<path>[^`]*)`$")
_MISSING: Final = re.compile(r"^Object missing required field `(?P<field>[^`]+)`")
_UNKNOWN_IN_MESSAGE: Final = re.compile(r"^Object contains unknown field `[^`]*` - at `\$\.messages\[\d+\]`$")


def _param(error: msgspec.ValidationError) -> tuple[str, str]:
    """The dotted path of the field msgspec names (`$.messages[0].role` → `messages.0.role`), and
    what it says of it."""
    text = str(error)
    found = _PATH.search(text)
    path, detail = (found["path"], text[:found.start()]) if found else ("", text)
    parts = [part for part in re.split(r"[.\[\]]+", path) if part and part != "..."]
    missing = _MISSING.match(detail)
    if missing:
        parts.append(missing["field"])
        detail = "field required"
    return ".".join(parts) or "body", detail


def _refusal(error: msgspec.ValidationError) -> InvalidRequestBody:
    param, detail = _param(error)
    return InvalidRequestBody(detail, param)


def decode(kind: str, document: object) -> RequestBody:
    """The request of `kind` in `document` (a JSON object, parsed), checked; InvalidRequestBody
    names the first field refused."""
    return _decode(_STRUCTS[kind], document)


def decode_origin(api: str, document: object) -> OriginBody:
    """The request in another API's shape (`api`: "responses", "compact" or "anthropic") in `document`,
    checked as `decode` checks a request of a kind."""
    return _decode(_ORIGIN_STRUCTS[api], document)


def _decode(struct: type[_Decoded], document: object) -> _Decoded:
    if not isinstance(document, dict):
        raise InvalidRequestBody("the request body must be a JSON object", "body")
    named = _NAMED[struct]
    # A caller's own field named `extra` is not the struct's: split the body first.
    given: Mapping[str, Any] = _split(document, named) if "extra" in document else document
    try:
        # The struct ignores the request's fields it does not name; they are kept beside it.
        request = msgspec.convert(given, struct, strict=True)
    except msgspec.ValidationError as exc:
        if struct is not ChatRequest or not _UNKNOWN_IN_MESSAGE.match(str(exc)):
            raise _refusal(exc) from None
        # A message refuses a field it does not name (checking each message first would cost
        # every request): carry such fields in its extra, and convert again.
        given = _with_messages_carried(given)
        try:
            request = msgspec.convert(given, struct, strict=True)
        except msgspec.ValidationError as again:
            raise _refusal(again) from None
    if "extra" not in given and not given.keys() <= named:
        request.extra = {key: value for key, value in given.items() if key not in named}
    return request


def to_body(request: RequestBody | OriginBody) -> dict[str, Any]:
    """The body `request` was decoded from, as the provider is sent it: its fields (those given),
    and what it carried through."""
    body: dict[str, Any] = msgspec.to_builtins(request)
    extra = body.pop("extra", None)
    if extra:
        body.update(extra)
    for message in body.get("messages", ()) if isinstance(request, ChatRequest) else ():
        carried = message.pop("extra", None)
        if carried:
            message.update(carried)
    return body


def items_of(given: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A Responses request's input as items: text is one user message."""
    return [{"type": "message", "role": "user", "content": given}] if isinstance(given, str) else given


def sent_or(value: _Sent[_T], default: _D) -> _T | _D:
    """An origin's field as the caller sent it, or the API's `default` when it was left out or
    sent as null."""
    return default if value is None or value is msgspec.UNSET else value


def requested_tier(body: RequestBody) -> str | None:
    """The `service_tier` the caller named (a legacy completion's or moderation's, which OpenAI
    does not define, is carried in `extra`)."""
    if isinstance(body, ChatRequest | EmbeddingsRequest):
        return body.service_tier
    tier = body.extra.get("service_tier")
    return tier if isinstance(tier, str) else None


def with_tier(body: RequestBody, tier: str) -> RequestBody:
    """`body` sent at `tier`."""
    if isinstance(body, ChatRequest | EmbeddingsRequest):
        return msgspec.structs.replace(body, service_tier=tier)
    return msgspec.structs.replace(body, extra={**body.extra, "service_tier": tier})


def unstreamed(body: RequestBody) -> RequestBody:
    """`body` asking for the whole answer at once (a request whose chunks nobody reads)."""
    if isinstance(body, ChatRequest | CompletionRequest) and (body.stream or body.stream_options is not None):
        return msgspec.structs.replace(body, stream=False, stream_options=None)
    return body
