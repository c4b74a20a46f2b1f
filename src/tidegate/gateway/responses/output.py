"""A job as a Responses API object: its status, output items and usage, rendered from the job's
state, its chat completion and the Responses request it was made from (the payload's `origin`).

A response is its job: `resp_<job id>`. Nothing else is stored, so what retrieval shows is what the
queue holds, for as long as its retention keeps the job. A job served by a provider that speaks
the Responses API natively holds the upstream's own Response: it is shown as it is, with the
response's id and the settings that are tidegate's (`store`, `background`,
`previous_response_id`) as the client gave them (`native_response`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from tidegate.ai import AIRequest, AIResult, Origin, Usage, result_of
from tidegate.contract import ResponsesRequest, sent_or, to_body
from tidegate.gateway.core.views import failure_view
from tidegate.gateway.responses.input import input_messages
from tidegate.jobs import Job, JobState

__all__ = [
    "RESPONSE_PREFIX",
    "Continued",
    "answered_status",
    "as_listed",
    "assistant_message",
    "continued",
    "is_native",
    "job_id_of",
    "listed_items",
    "native_response",
    "output_items",
    "render",
    "request_of",
    "response_id",
    "response_object",
    "response_usage",
    "status_of",
]

RESPONSE_PREFIX: Final = "resp_"

_WAITING: Final = {JobState.QUEUED: "queued", JobState.DELAYED: "queued", JobState.FAILED: "queued",
                   JobState.LEASED: "in_progress", JobState.CANCELLED: "cancelled"}
# Chat finish reasons that cut an answer short, as the Responses API names the reason.
_INCOMPLETE: Final = {"length": "max_output_tokens", "content_filter": "content_filter"}


def response_id(job_id: str) -> str:
    """The id of the response a job is."""
    return RESPONSE_PREFIX + job_id


def job_id_of(identifier: str) -> str | None:
    """The job id inside a response id, or None when it is not one."""
    job_id = identifier.removeprefix(RESPONSE_PREFIX)
    return job_id if job_id != identifier and job_id else None


def answered_status(finish_reason: str | None) -> tuple[str, dict[str, Any] | None]:
    """The status of an answered response and its `incomplete_details`, by the chat finish
    reason: completed, or incomplete when the answer was cut short."""
    reason = _INCOMPLETE.get(finish_reason or "")
    return ("completed", None) if reason is None else ("incomplete", {"reason": reason})


def status_of(job: Job, result: AIResult | None) -> tuple[str, dict[str, Any] | None]:
    """The response's status and its `incomplete_details`."""
    if job.state is JobState.SUCCEEDED:
        return answered_status(None if result is None else result.finish_reason)
    if job.state in (JobState.DEAD, JobState.EXPIRED):
        return "failed", None
    return _WAITING[job.state], None


def _error(job: Job) -> dict[str, str] | None:
    """A failed response's `error`: OpenAI's codes, the message the worker recorded."""
    if job.state is JobState.EXPIRED:
        return {"code": "server_error", "message": "the response passed its deadline before a worker "
                                                   "could start it"}
    if job.state is not JobState.DEAD:
        return None
    failure = failure_view(job)
    if failure is None:
        return {"code": "server_error", "message": job.last_error or "the response failed"}
    code = ("rate_limit_exceeded" if failure.status == 429 else
            "invalid_prompt" if 400 <= failure.status < 500 else "server_error")
    return {"code": code, "message": failure.message}


def output_items(job_id: str, completion: Mapping[str, Any] | None, *,
                 status: str = "completed") -> list[dict[str, Any]]:
    """The output items of a chat completion: its text as one message, then each tool call as a
    function_call item."""
    message = assistant_message(completion)
    items: list[dict[str, Any]] = []
    text = message.get("content")
    if isinstance(text, str) and text:
        items.append({"id": f"msg_{job_id}", "type": "message", "role": "assistant", "status": status,
                      "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]})
    for index, call in enumerate(message.get("tool_calls") or ()):
        function = call["function"]
        items.append({"id": f"fc_{job_id}_{index}", "type": "function_call", "status": "completed",
                      "call_id": call["id"], "name": function["name"], "arguments": function["arguments"]})
    return items


def assistant_message(completion: Mapping[str, Any] | None) -> dict[str, Any]:
    """The first choice's message of a chat completion, reduced to what another turn sends back:
    its text and tool calls."""
    choices = (completion or {}).get("choices")
    first = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else {}
    given = first.get("message")
    message: Mapping[str, Any] = given if isinstance(given, dict) else {}
    content = message.get("content")
    reduced: dict[str, Any] = {"role": "assistant", "content": content if isinstance(content, str) else None}
    calls = [call for call in message.get("tool_calls") or () if _is_call(call)]
    if calls:
        reduced["tool_calls"] = [{"id": call["id"], "type": "function",
                                  "function": {"name": call["function"]["name"],
                                               "arguments": call["function"].get("arguments") or ""}}
                                 for call in calls]
    return reduced


def _is_call(call: object) -> bool:
    function = call.get("function") if isinstance(call, dict) else None
    return (isinstance(call, dict) and isinstance(call.get("id"), str) and isinstance(function, dict)
            and isinstance(function.get("name"), str))


def response_usage(usage: object) -> dict[str, Any] | None:
    """Chat usage in the Responses API's names."""
    if not isinstance(usage, dict):
        return None
    counts = Usage.from_json(usage)
    return {"input_tokens": counts.input_tokens, "output_tokens": counts.output_tokens,
            "total_tokens": counts.total_tokens,
            "input_tokens_details": {"cached_tokens": counts.cached_input_tokens,
                                     "cache_write_tokens": counts.cache_write_tokens},
            "output_tokens_details": {"reasoning_tokens": counts.reasoning_tokens}}


def request_of(origin: Origin) -> ResponsesRequest:
    """The Responses request a response was made from (its job's origin)."""
    if not isinstance(origin.body, ResponsesRequest):
        raise TypeError(f"a response is made from a Responses request, not a {type(origin.body).__name__}")
    return origin.body


def echoed(origin: Origin) -> dict[str, Any]:
    """The request's settings as a response repeats them, with the API's defaults for those left
    out (or sent as null)."""
    body = request_of(origin)
    return {
        "instructions": sent_or(body.instructions, None), "metadata": sent_or(body.metadata, {}),
        "max_output_tokens": sent_or(body.max_output_tokens, None), "max_tool_calls": None,
        "parallel_tool_calls": sent_or(body.parallel_tool_calls, True),
        "previous_response_id": sent_or(body.previous_response_id, None),
        "temperature": sent_or(body.temperature, 1.0), "top_p": sent_or(body.top_p, 1.0),
        "tool_choice": sent_or(body.tool_choice, "auto"), "tools": sent_or(body.tools, []),
        "text": sent_or(body.text, None) or {"format": {"type": "text"}}, "truncation": "disabled",
        "reasoning": {"effort": (sent_or(body.reasoning, None) or {}).get("effort"), "summary": None},
        "store": body.stored, "background": body.in_background,
        "user": sent_or(body.user, None), "service_tier": sent_or(body.service_tier, None),
    }


# Over seven parameters (PLR0913): outstanding, issue 27: not yet folded into an object.
def response_object(job_id: str, created_at: int, origin: Origin, *, status: str, model: str | None,  # noqa: PLR0913
                    output: list[dict[str, Any]], usage: dict[str, Any] | None,
                    error: dict[str, str] | None = None, incomplete: dict[str, Any] | None = None,
                    completed_at: int | None = None, service_tier: object = None) -> dict[str, Any]:
    """A response object: what is known of the answer, and the request's settings. Its
    `service_tier` is the one the answer named (`service_tier`), else the one asked for."""
    document = {"id": response_id(job_id), "object": "response", "created_at": created_at,
                "status": status, "completed_at": completed_at, "error": error,
                "incomplete_details": incomplete, "model": model or sent_or(request_of(origin).model, "auto"),
                "output": output, "usage": usage, **echoed(origin)}
    if isinstance(service_tier, str):
        document["service_tier"] = service_tier
    return document


def is_native(document: Mapping[str, Any] | None) -> bool:
    """Whether a job's answer is a native upstream's Response (not a chat completion)."""
    return document is not None and document.get("object") == "response"


def native_response(job_id: str, origin: Origin, document: Mapping[str, Any]) -> dict[str, Any]:
    """A native upstream's Response as this response: its id, and tidegate's own settings."""
    body = request_of(origin)
    return {**document, "id": response_id(job_id), "store": body.stored, "background": body.in_background,
            "previous_response_id": sent_or(body.previous_response_id, None)}


def render(job: Job, origin: Origin) -> dict[str, Any]:
    """The response object of a job made from a Responses request, as the job stands."""
    result = result_of(job)
    completion = result.response if result is not None and job.state is JobState.SUCCEEDED else None
    if is_native(completion):
        assert completion is not None
        return native_response(job.id, origin, completion)
    status, incomplete = status_of(job, result)
    finished = job.finished_at if status == "completed" else None
    return response_object(
        job.id, int(job.created_at.timestamp()), origin, status=status,
        model=result.model if result is not None else None,
        output=[] if completion is None else output_items(job.id, completion, status=status),
        usage=response_usage((completion or {}).get("usage")), error=_error(job), incomplete=incomplete,
        completed_at=None if finished is None else int(finished.timestamp()),
        service_tier=(completion or {}).get("service_tier"))


def listed_items(job_id: str, origin: Origin) -> list[dict[str, Any]]:
    """The response's own input as items with ids, in the order given."""
    return as_listed(job_id, request_of(origin).input_items)


def as_listed(job_id: str, items: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Input items as the API lists them: with ids (their own, else made from `job_id` and their
    place) and the fields the API always gives."""
    listed: list[dict[str, Any]] = []
    for index, item in enumerate(items):
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            content = item.get("content") or []
            text_type = "output_text" if role == "assistant" else "input_text"
            parts = [{"type": text_type, "text": content}] if isinstance(content, str) else content
            listed.append({"id": item.get("id") or f"msg_{job_id}_{index}", "type": "message", "role": role,
                           "status": "completed", "content": [_listed_part(part) for part in parts]})
        else:
            prefix = "fc" if kind == "function_call" else "fco"
            identifier = item.get("id") or f"{prefix}_{job_id}_{index}"
            listed.append({"status": "completed", **item, "id": identifier})
    return listed


def _listed_part(part: dict[str, Any]) -> dict[str, Any]:
    """A content part as a listed item shows it: with the fields the API always gives."""
    if part["type"] == "output_text":
        return {"type": "output_text", "text": part["text"], "annotations": part.get("annotations") or []}
    if part["type"] == "input_image":
        return {"type": "input_image", "image_url": part.get("image_url"),
                "detail": part.get("detail") or "auto"}
    return part


@dataclass(frozen=True, slots=True)
class Continued:
    """The conversation a continued response brings: as Responses items (the earlier response's
    own context, input and output), for a native upstream; and as chat messages when the earlier
    response was translated (`chat`, its job's messages and answer), else read from the items."""

    items: tuple[dict[str, Any], ...]
    chat: tuple[dict[str, Any], ...] | None = None

    def messages(self) -> list[dict[str, Any]]:
        """The chat messages; a 400 (UNTRANSLATABLE) for an item a chat completion cannot carry."""
        return list(self.chat) if self.chat is not None else input_messages(self.items)


def continued(job: Job, origin: Origin, answer: Mapping[str, Any] | None) -> Continued:
    """The conversation a response continuing `job` (which answered `answer`) brings. Its
    instructions are left out, as the API does not carry them over."""
    request = request_of(origin)
    earlier = [*origin.context, *request.input_items]
    if is_native(answer):
        assert answer is not None
        output = answer.get("output")
        return Continued((*earlier, *(output if isinstance(output, list) else ())))
    # tidegate's own item ids mean nothing upstream: the items go without them.
    produced = [{key: value for key, value in item.items() if key != "id"}
                for item in output_items(job.id, answer)]
    chat = None
    if not origin.native_only:
        messages = to_body(AIRequest.from_payload(job.payload).body)["messages"]
        chat = (*(messages[1:] if sent_or(request.instructions, None) is not None else messages),
                assistant_message(answer))
    return Continued((*earlier, *produced), chat)
