"""tidegate's own compaction items: the conversation summary a model wrote for POST
/v1/responses/compact when no provider that may serve the model speaks the Responses API, and
how a later request reads it back.

OpenAI's compaction item is `{"type": "compaction", "encrypted_content": "..."}`, opaque: only
OpenAI can read it. tidegate cannot make one for another provider, so its own item has the same
shape, with a content that is not encrypted at all: SUMMARY_PREFIX, then the summary's text. A
later request through tidegate (POST /v1/responses, its token count, a batch's `/v1/responses`
line) reads such an item as the developer message it stands for (`with_summaries_read`), before
anything else sees the input, so every upstream gets it as a message: a chat upstream as a system
message, one that speaks the Responses API as a developer message, never as an item it cannot
read. A compaction item of OpenAI's is left as it is (only a provider speaking the Responses
API takes it). Reading the summary as a message grants nothing: a caller may send developer
messages of its own anyway.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from tidegate.gateway.responses.schemas import ResponseCreateRequest

__all__ = ["SUMMARY_PREFIX", "summary_item", "summary_message", "summary_text", "with_summaries_read"]

SUMMARY_PREFIX: Final = "tidegate.summary.v1:"
"""What the `encrypted_content` of tidegate's compaction item opens with, before the summary."""

_READ_AS: Final = "Summary of the earlier conversation, written when it was compacted:\n\n"


def summary_item(item_id: str, text: str) -> dict[str, Any]:
    """tidegate's compaction item holding the summary `text`."""
    return {"id": item_id, "type": "compaction", "encrypted_content": SUMMARY_PREFIX + text}


def summary_text(item: Mapping[str, Any]) -> str | None:
    """The summary in one of tidegate's compaction items; None for any other item (OpenAI's own
    compaction items included)."""
    content = item.get("encrypted_content")
    if item.get("type") != "compaction" or not isinstance(content, str):
        return None
    if not content.startswith(SUMMARY_PREFIX):
        return None  # OpenAI's own
    return content.removeprefix(SUMMARY_PREFIX)


def summary_message(text: str) -> dict[str, Any]:
    """The developer message a summary is read as."""
    return {"type": "message", "role": "developer", "content": _READ_AS + text}


def with_summaries_read(request: ResponseCreateRequest) -> ResponseCreateRequest:
    """The request with each of tidegate's compaction items in its input replaced by its summary's
    developer message; the request itself when it holds none."""
    if isinstance(request.input, str):
        return request
    texts = [summary_text(item) for item in request.input]
    if all(text is None for text in texts):
        return request
    read = [item if text is None else summary_message(text)
            for item, text in zip(request.input, texts, strict=True)]
    return request.model_copy(update={"input": read})
