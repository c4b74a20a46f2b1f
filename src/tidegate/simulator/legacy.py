"""OpenAI's legacy endpoints in the simulated provider: `/v1/completions` (plain and SSE) and
`/v1/moderations`.

A completion is a chat answer in another shape: `parse_completion` reads the request into the
simulator's `ChatRequest` (wire "completions"), so the server paces, limits, faults and generates
its words exactly as for a chat, and only the rendering differs (`text_completion_body`,
`text_completion_frames`). Each prompt of a list gets its own choice; a stream answers one prompt,
and `n` (or `best_of`) above 1 is refused, as the simulator's chat does.

A moderation is classified deterministically from its text (`moderation_body`): a category is
flagged when the input holds one of its trigger words, and every score is otherwise a small value
that depends only on the text, so the same input is always judged the same way.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

import orjson

from tidegate.simulator.content import TOKENS_PER_IMAGE, embedding_vector, estimate_text_tokens
from tidegate.simulator.requests import (
    MAX_EMBEDDING_INPUTS,
    ChatRequest,
    InvalidRequest,
    check_range,
    check_stop,
    check_stream,
    json_type,
    model_of,
    optional_positive_int,
    service_tier_of,
)

__all__ = [
    "CATEGORIES",
    "COMPLETION_DEFAULT_MAX_TOKENS",
    "CompletionRequest",
    "Drawn",
    "ModerationRequest",
    "moderation_body",
    "parse_completion",
    "parse_moderation",
    "text_completion_body",
    "text_completion_frames",
]

COMPLETION_DEFAULT_MAX_TOKENS: Final = 16  # OpenAI's default for a completion without max_tokens
MAX_LOGPROBS: Final = 5

# OpenAI's moderation categories, with the input types each is applied to and the words that
# make the simulator flag it.
CATEGORIES: Final[Mapping[str, tuple[tuple[str, ...], tuple[str, ...]]]] = {
    "harassment": (("text",), ("idiot", "loser")),
    "harassment/threatening": (("text",), ("threaten",)),
    "hate": (("text",), ("hate",)),
    "hate/threatening": (("text",), ("exterminate",)),
    "illicit": (("text",), ("steal", "shoplift")),
    "illicit/violent": (("text",), ("bomb", "weapon")),
    "self-harm": (("text", "image"), ("self-harm",)),
    "self-harm/intent": (("text", "image"), ("suicide",)),
    "self-harm/instructions": (("text", "image"), ("overdose",)),
    "sexual": (("text", "image"), ("explicit",)),
    "sexual/minors": (("text",), ("underage",)),
    "violence": (("text", "image"), ("kill", "attack", "murder")),
    "violence/graphic": (("text", "image"), ("gore", "blood")),
}
FLAGGED_SCORE: Final = 0.93
BASELINE_SCORE: Final = 0.01  # the most an unflagged category scores

Drawn = tuple[list[str], str, str | None]
"""One simulated answer: its words, its finish reason, and the stop sequence met (if any)."""


@dataclass(frozen=True, slots=True)
class CompletionRequest(ChatRequest):
    """A valid legacy completion request: the chat fields the server's pacing and generation read,
    plus the prompts (as text, token ids written out) and whether to echo them."""

    prompts: tuple[str, ...] = ()
    echo_prompt: bool = False


@dataclass(frozen=True, slots=True)
class ModerationRequest:
    """A valid moderation request: one entry per result to give (each input of a list of strings,
    or all the items of a multimodal input together), as its text and its input types."""

    model: str
    inputs: tuple[tuple[str, frozenset[str]], ...]
    prompt_tokens: int
    service_tier: str | None = None


def parse_completion(body: dict[str, Any]) -> CompletionRequest:
    """Validate a legacy completion request body."""
    model = model_of(body)
    prompts = _prompts(body.get("prompt"))
    stream, include_usage = check_stream(body)
    for name in ("n", "best_of"):
        if body.get(name) not in (None, 1):
            raise InvalidRequest(f"The simulator supports only {name}=1.", param=name, code="invalid_value")
    if stream and len(prompts) > 1:
        raise InvalidRequest("The simulator streams one prompt at a time.", param="prompt",
                             code="invalid_value")
    logprobs = body.get("logprobs")
    if logprobs is not None and not (isinstance(logprobs, int) and not isinstance(logprobs, bool)
                                     and 0 <= logprobs <= MAX_LOGPROBS):
        raise InvalidRequest(f"Invalid 'logprobs': expected an integer from 0 to {MAX_LOGPROBS}.",
                             param="logprobs", code="invalid_value")
    echo = body.get("echo", False)
    if not isinstance(echo, bool | None):
        raise InvalidRequest(f"Invalid type for 'echo': expected a boolean, but got {json_type(echo)}.",
                             param="echo", code="invalid_type")
    suffix = body.get("suffix")
    if suffix is not None and not isinstance(suffix, str):
        raise InvalidRequest(f"Invalid type for 'suffix': expected a string, but got {json_type(suffix)}.",
                             param="suffix", code="invalid_type")
    check_range(body, "temperature", 0.0, 2.0)
    check_range(body, "top_p", 0.0, 1.0)
    max_tokens = optional_positive_int(body, "max_tokens") or COMPLETION_DEFAULT_MAX_TOKENS
    prompt_tokens = sum(estimate_text_tokens(prompt) for prompt in prompts)
    if suffix:
        prompt_tokens += estimate_text_tokens(suffix)
    return CompletionRequest(model, prompt_tokens, max_tokens, stream, include_usage,
                             check_stop(body.get("stop")), wire="completions",
                             service_tier=service_tier_of(body), prompts=prompts, echo_prompt=bool(echo))


def _prompts(prompt: object) -> tuple[str, ...]:
    """Each prompt as text: a string, strings, token ids, or lists of token ids (written out)."""
    if prompt is None:
        raise InvalidRequest("Missing required parameter: 'prompt'.", param="prompt",
                             code="missing_required_parameter")
    if isinstance(prompt, str):
        return (prompt,)
    items: list[object] = prompt if isinstance(prompt, list) else []
    if items and all(_token(item) for item in items):
        items = [items]  # one prompt given as token ids
    if not items or len(items) > MAX_EMBEDDING_INPUTS:
        raise InvalidRequest(f"'prompt' must be a string or an array of 1 to {MAX_EMBEDDING_INPUTS} prompts.",
                             param="prompt", code="invalid_value")
    prompts: list[str] = []
    for item in items:
        if isinstance(item, str):
            prompts.append(item)
        elif isinstance(item, list) and item and all(_token(token) for token in item):
            prompts.append(" ".join(map(str, item)))
        else:
            raise InvalidRequest("Invalid 'prompt': each prompt must be a string or a non-empty array of "
                                 "token ids.", param="prompt", code="invalid_value")
    return tuple(prompts)


def _token(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def text_completion_body(identifier: str, model: str, request: CompletionRequest,
                         answers: Sequence[Drawn]) -> dict[str, Any]:
    """The whole answer: one choice per prompt (its text after the prompt when echoed)."""
    choices: list[dict[str, Any]] = []
    completion = 0
    for index, (prompt, (words, finish, stop)) in enumerate(zip(request.prompts, answers, strict=True)):
        text = " ".join(words)
        choice: dict[str, Any] = {"index": index, "text": prompt + text if request.echo_prompt else text,
                                  "logprobs": None, "finish_reason": finish}
        if stop is not None:
            choice["stop_reason"] = stop  # the sequence met, named as vLLM names it
        choices.append(choice)
        completion += len(words)
    return {"id": _cmpl(identifier), "object": "text_completion", "created": int(time.time()),
            "model": model, "choices": choices, "usage": _usage(request.prompt_tokens, completion)}


def text_completion_frames(identifier: str, model: str, request: CompletionRequest,
                           answer: Drawn) -> tuple[bytes, list[bytes], bytes, bytes]:
    """A streamed answer's events: what opens it (the echoed prompt, if asked), a word each, the
    finish (and usage, if asked), `[DONE]`; and the torn event a fault half way sends."""
    words, finish, stop = answer
    head = {"id": _cmpl(identifier), "object": "text_completion", "created": int(time.time()), "model": model}

    def event(text: str, finish_reason: str | None = None) -> bytes:
        choice: dict[str, Any] = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
        if finish_reason is not None and stop is not None:
            choice["stop_reason"] = stop
        return b"data: " + orjson.dumps({**head, "choices": [choice]}) + b"\n\n"

    opening = event(request.prompts[0]) if request.echo_prompt else b""
    tail = event("", finish)
    if request.include_usage:
        usage = {**head, "choices": [], "usage": _usage(request.prompt_tokens, len(words))}
        tail += b"data: " + orjson.dumps(usage) + b"\n\n"
    pieces = [event(word if i == 0 else " " + word) for i, word in enumerate(words)]
    return opening, pieces, tail + b"data: [DONE]\n\n", b'data: {"id": "cmpl-broken", "choi\n\n'


def _cmpl(identifier: str) -> str:
    return "cmpl-" + identifier.removeprefix("chatcmpl-")


def _usage(prompt: int, completion: int) -> dict[str, int]:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


# ---------------------------------------------------------------------------- moderations


def parse_moderation(body: dict[str, Any]) -> ModerationRequest:
    """Validate a moderation request body: `input` is a string, strings, or multimodal items
    (`{"type": "text", "text"}` and `{"type": "image_url", "image_url": {"url"}}`); `model`
    defaults to omni-moderation-latest, as OpenAI's does."""
    model = body.get("model", "omni-moderation-latest")
    if not isinstance(model, str) or not model:
        raise InvalidRequest(f"Invalid type for 'model': expected a string, but got {json_type(model)}.",
                             param="model", code="invalid_type")
    value = body.get("input")
    if value is None:
        raise InvalidRequest("Missing required parameter: 'input'.", param="input",
                             code="missing_required_parameter")
    if isinstance(value, str):
        inputs: list[tuple[str, frozenset[str]]] = [(value, frozenset({"text"}))]
    elif isinstance(value, list) and value and len(value) <= MAX_EMBEDDING_INPUTS:
        texts = all(isinstance(item, str) for item in value)
        inputs = [(item, frozenset({"text"})) for item in value] if texts else [_multimodal(value)]
    else:
        raise InvalidRequest(f"'input' must be a string or an array of 1 to {MAX_EMBEDDING_INPUTS} inputs.",
                             param="input", code="invalid_value")
    tokens = sum(estimate_text_tokens(text) + (TOKENS_PER_IMAGE if "image" in types else 0)
                 for text, types in inputs)
    return ModerationRequest(model, tuple(inputs), tokens)


def _multimodal(items: list[Any]) -> tuple[str, frozenset[str]]:
    """The text of multimodal items (classified together) and the input types among them."""
    texts: list[str] = []
    types: set[str] = set()
    for i, item in enumerate(items):
        kind = item.get("type") if isinstance(item, dict) else None
        if kind == "text" and isinstance(item.get("text"), str):
            texts.append(item["text"])
            types.add("text")
        elif kind == "image_url" and isinstance((item.get("image_url") or {}).get("url"), str):
            types.add("image")
        else:
            raise InvalidRequest(f"Invalid 'input[{i}]': expected a text or an image_url item.",
                                 param=f"input[{i}]", code="invalid_value")
    return "\n".join(texts), frozenset(types)


def moderation_body(identifier: str, model: str, request: ModerationRequest) -> dict[str, Any]:
    """The classification of each input (see the module's docstring for how it is decided)."""
    return {"id": "modr-" + identifier.removeprefix("chatcmpl-"), "model": model,
            "results": [_result(text, types) for text, types in request.inputs]}


def _result(text: str, types: frozenset[str]) -> dict[str, Any]:
    lowered = text.lower()
    noise = embedding_vector(hashlib.blake2b(text.encode()).digest(), len(CATEGORIES))
    categories: dict[str, bool] = {}
    scores: dict[str, float] = {}
    applied: dict[str, list[Literal["text", "image"]]] = {}
    for (name, (accepts, words)), jitter in zip(CATEGORIES.items(), noise, strict=True):
        flagged = any(word in lowered for word in words)
        categories[name] = flagged
        scores[name] = FLAGGED_SCORE if flagged else round(abs(jitter) * BASELINE_SCORE, 6)
        applied[name] = [kind for kind in ("text", "image") if kind in accepts and kind in types]
    return {"flagged": any(categories.values()), "categories": categories, "category_scores": scores,
            "category_applied_input_types": applied}
