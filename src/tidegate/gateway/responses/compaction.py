"""POST /v1/responses/compact: a conversation compacted by a model, as a job of the queue.

OpenAI answers with the conversation's user messages, then one compaction item, opaque, that
stands for the rest; the caller gives that output as the `input` of its next response. Its item
is encrypted by OpenAI, and only OpenAI reads it back, so the way a compaction goes is chosen at
the door by the providers that may serve the model (tidegate.gateway.core.native):

- every one speaks the Responses API natively: the job's origin is the compaction request itself
  (api "compact", contract.CompactRequest), which the worker sends to the provider's
  /responses/compact (the conversation of `previous_response_id` as input items before the
  input, as for a response: tidegate.providers.adapters.native); its answer, OpenAI's own
  compaction item in it, comes back as the upstream gave it. A later response given that item is
  served natively too, by the same rule.
- otherwise: the job is a chat completion asking the model for a summary of the conversation
  (instructions, the earlier conversation, the input, then COMPACTION_PROMPT), translated as a
  response's input is, so what a chat completion cannot carry is refused by name. Its answer
  becomes tidegate's own compaction item (tidegate.gateway.responses.summaries), after the
  conversation's user messages as OpenAI lays them out; a later response through tidegate reads
  it as the summary it holds, whichever provider serves that response.

Either way the job is the caller's: at its priority, within its budgets and limits, retried like
any other. It is not a response (nor is OpenAI's compaction): it cannot be retrieved or continued
as one, and its job is kept only as long as a finished call's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from tidegate.ai import AIRequest, AIResult
from tidegate.contract import items_of
from tidegate.gateway.core.dialect import decoded_origin
from tidegate.gateway.responses.dialect import RESPONSES
from tidegate.gateway.responses.input import invalid
from tidegate.gateway.responses.output import (
    Continued,
    as_listed,
    assistant_message,
    response_id,
    response_usage,
)
from tidegate.gateway.responses.schemas import ResponseCompactRequest, ResponseCreateRequest
from tidegate.gateway.responses.summaries import summary_item, with_summaries_read
from tidegate.jobs import Job

__all__ = ["COMPACTION_PROMPT", "Compaction", "compacted", "compaction"]

COMPACTION_PROMPT: Final = (
    "Compact the conversation above. Write a summary from which it can go on without its earlier "
    "turns: the facts established, the decisions made, the tools called and what they returned, "
    "and what is still open. The user's messages are kept word for word beside the summary: do "
    "not repeat them. Answer with the summary alone.")
"""The last message of a compaction's chat job, after the conversation."""

_NATIVE_DOCUMENT: Final = "response.compaction"


@dataclass(frozen=True, slots=True)
class Compaction:
    """A compaction request read at the door: the job that compacts it, and the user messages
    its answer keeps before tidegate's compaction item."""

    request: AIRequest
    retained: tuple[dict[str, Any], ...]


def compaction(body: ResponseCompactRequest, conversation: ResponseCreateRequest,
               history: Continued | None, *, native: bool) -> Compaction:
    """The job of a compaction request. `conversation`: the request's conversation as a Responses
    request (`ResponseCompactRequest.as_response`, its files inlined); `history`: that of
    `previous_response_id`; `native`: every provider that may serve the model speaks the
    Responses API (see the module)."""
    if not body.input and history is None:
        raise invalid("nothing to compact: give input, previous_response_id, or both", "empty_input",
                      "input")
    extra = sorted(body.model_extra or {})
    if extra and not native:
        raise invalid(f"{extra[0]!r} is not supported by this gateway's compaction: only a provider "
                      "speaking the Responses API takes it, and none serves this model",
                      "unsupported_parameter", extra[0])
    read = with_summaries_read(conversation)
    asking = read.model_copy(update={"input": [*items_of(read.input),
                                               {"role": "user", "content": COMPACTION_PROMPT}]})
    translated = RESPONSES.translate(asking, history, native=native)
    context = () if history is None else history.items
    origin = None
    if native:
        assert translated.origin is not None  # a Responses request's job always has its origin
        given = body.model_dump(exclude_unset=True)
        if body.input is not None:
            given["input"] = read.input
        origin = decoded_origin("compact", given, context=context,
                                native_only=translated.origin.native_only or bool(extra))
    retained = tuple(item for item in (*context, *items_of(body.input or [])) if _is_user_message(item))
    return Compaction(AIRequest(kind="chat", body=translated.body, origin=origin), retained)


def _is_user_message(item: Mapping[str, Any]) -> bool:
    return item.get("type", "message") == "message" and item.get("role") == "user"


def compacted(job: Job, result: AIResult, retained: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The compacted conversation of a compaction's succeeded job: a native upstream's own, with
    the job's id; else the `retained` user messages, then tidegate's compaction item holding the
    summary the model wrote."""
    answer = result.response or {}
    if answer.get("object") == _NATIVE_DOCUMENT:
        return {**answer, "id": response_id(job.id)}
    summary = assistant_message(answer).get("content") or ""
    document: dict[str, Any] = {
        "id": response_id(job.id), "object": _NATIVE_DOCUMENT, "created_at": int(job.created_at.timestamp()),
        "output": [*as_listed(job.id, retained), summary_item(f"cmp_{job.id}", summary)],
        "usage": response_usage(answer.get("usage")) or response_usage({})}
    tier = answer.get("service_tier")
    if isinstance(tier, str):
        document["service_tier"] = tier
    return document
