"""A batch's lines: reading the input file (each line checked as its endpoint would check the
request: `Dialect.parse`, then the intake's entitlement checks), making each line's answer from its
job once the job has ended (`line_answer`, kept in the batch store at once), and writing the
output and error files from those answers, in OpenAI's batch file formats.

A malformed line never fails the batch: it becomes a line of the error file, its number and the
reason given, and the other lines run.

A `/v1/responses` line is read as POST /v1/responses reads its body (validated, then translated
into a chat job that keeps the request as its `origin`), so what that route refuses is the line's
error with the same code, and what it takes is taken: a field with no chat translation (a built-in
tool, `reasoning`, `include`, …) when every provider that may serve the line's model speaks the
Responses API (tidegate.gateway.core.native), the job then `native_only` and sent as written, and
refused (`unsupported_tool`, `unsupported_parameter`) otherwise. `background` and `stream` are
refused too (code `unsupported_parameter`): a batch line already runs in the background, and its
answer is a line of the output file. Its answer is the Response object GET /v1/responses/{id}
renders for its job (the upstream's own Response for a native one), which stays retrievable there
(it is a response of the batch's tenant, `resp_<job id>`, unless the line said `store: false`).

A line's `previous_response_id` names a response of the batch's tenant that has its answer when
the batch is created: its conversation is read then, once, and the line continues it. A response
of another tenant, an unknown one (an id of another line of the same batch is one: no line has
run when the lines are read) and one without an answer yet make the line an error
(`response_not_found`, `previous_response_unavailable`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import orjson

from tidegate.ai import AIRequest, Kind, result_of
from tidegate.coord.tenants import Tenant
from tidegate.gateway.batches.store import BatchLine, LineAnswer, LineError
from tidegate.gateway.core.dialect import validated
from tidegate.gateway.core.errors import ApiError
from tidegate.gateway.core.intake import JobDraft, draft_job
from tidegate.gateway.core.native import served_natively
from tidegate.gateway.core.state import GatewayState
from tidegate.gateway.core.views import failure_view
from tidegate.gateway.openai.dialect import OPENAI
from tidegate.gateway.responses.dialect import RESPONSES
from tidegate.gateway.responses.lookup import conversation, origin_of
from tidegate.gateway.responses.output import render
from tidegate.gateway.responses.schemas import ResponseCreateRequest
from tidegate.jobs import Job, JobState, Priority

__all__ = ["SERVED_ENDPOINTS", "ParsedLine", "answer_lines", "line_answer", "parse_lines"]

SERVED_ENDPOINTS: Final[Mapping[str, Kind]] = {
    "/v1/chat/completions": "chat",
    "/v1/embeddings": "embeddings",
    "/v1/responses": "chat",
    "/v1/completions": "completion",  # served while a configured provider offers them
    "/v1/moderations": "moderation",
}
"""The endpoints a batch may call, and the kind of job each line becomes."""

RESPONSES_ENDPOINT: Final = "/v1/responses"
MAX_CUSTOM_ID_CHARS: Final = 512
# Lines checked between two turns given back to the event loop: checking 50,000 lines takes
# seconds of CPU, during which the gateway must go on answering interactive calls.
LINES_PER_TURN: Final = 200


@dataclass(frozen=True, slots=True)
class ParsedLine:
    """One input line: its job, ready to enqueue, or why it cannot be one."""

    custom_id: str | None
    draft: JobDraft | None = None
    error: LineError | None = None


async def parse_lines(state: GatewayState, tenant: Tenant, content: bytes, *, endpoint: str,
                      priority: Priority) -> list[ParsedLine]:
    """Every non-blank line of `content` (JSON Lines), checked. Two lines with one custom_id:
    the second is an error, since answers are matched to requests by it."""
    kind = SERVED_ENDPOINTS[endpoint]
    parsed: list[ParsedLine] = []
    seen: set[str] = set()
    for number, raw in enumerate(content.split(b"\n"), start=1):
        if number % LINES_PER_TURN == 0:
            await asyncio.sleep(0)
        if not raw.strip():
            continue
        line = await _parse_line(state, tenant, raw, number, endpoint=endpoint, kind=kind, priority=priority)
        custom_id = line.custom_id
        if custom_id is not None and line.error is None:
            if custom_id in seen:
                line = ParsedLine(custom_id, error=LineError(
                    code="duplicate_custom_id", line=number, param="custom_id",
                    message=f"line {number}: custom_id {custom_id!r} is used by an earlier line"))
            seen.add(custom_id)
        parsed.append(line)
    return parsed


async def _parse_line(state: GatewayState, tenant: Tenant, raw: bytes, number: int, *, endpoint: str,
                kind: Kind, priority: Priority) -> ParsedLine:
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        return _bad(None, number, "invalid_json", f"not a JSON object: {exc}")
    if not isinstance(data, dict):
        return _bad(None, number, "invalid_json", "not a JSON object")
    custom_id = data.get("custom_id")
    if not isinstance(custom_id, str) or not 0 < len(custom_id) <= MAX_CUSTOM_ID_CHARS:
        return _bad(None, number, "invalid_custom_id",
                    f"custom_id must be a string of 1-{MAX_CUSTOM_ID_CHARS} characters", "custom_id")
    if data.get("method") != "POST":
        return _bad(custom_id, number, "invalid_method", "method must be POST", "method")
    if data.get("url") != endpoint:
        return _bad(custom_id, number, "mismatched_url",
                    f"url {data.get('url')!r} is not the batch's endpoint {endpoint}", "url")
    body = data.get("body")
    if not isinstance(body, dict):
        return _bad(custom_id, number, "invalid_body", "body must be a JSON object", "body")
    try:
        request = (await _responses_request(state, tenant, body) if endpoint == RESPONSES_ENDPOINT
                   else OPENAI.parse(kind, body, "body"))
        draft = draft_job(state, tenant, request, priority=priority, keep_stream=False)
    except ApiError as exc:
        return _bad(custom_id, number, exc.code or "invalid_request", exc.message, exc.param)
    return ParsedLine(custom_id, draft=draft)


async def _responses_request(state: GatewayState, tenant: Tenant, body: dict[str, Any]) -> AIRequest:
    """The chat job of a `/v1/responses` line, continuing its `previous_response_id` if it names
    one, its native-only fields taken or refused as the route takes or refuses them."""
    request = validated(ResponseCreateRequest, body, "body")
    for field in ("background", "stream"):
        if getattr(request, field):
            raise ApiError(400, f"{field} is not served in a batch line: the batch runs the request "
                           "and its output file holds the response", code="unsupported_parameter",
                           param=field)
    previous = request.previous_response_id
    history = None if previous is None else await conversation(state, tenant, previous)
    return RESPONSES.translate(request, history, native=served_natively(state, "responses", request.model))


def _bad(custom_id: str | None, number: int, code: str, message: str, param: str | None = None) -> ParsedLine:
    return ParsedLine(custom_id, error=LineError(code=code, message=f"line {number}: {message}", line=number,
                                                 param=param))


def line_answer(line: BatchLine, job: Job | None) -> LineAnswer:
    """The final outcome of a line whose job has ended (`line.ended` set; `job` None when the
    queue no longer keeps it): its answer for the output file, or its line of the error file."""
    if job is not None and job.state is JobState.SUCCEEDED:
        return LineAnswer(output=True, record=_answer(line, job))
    return LineAnswer(output=False, record=_failure(line, job))


def answer_lines(lines: list[BatchLine], answers: Mapping[str, LineAnswer]) -> tuple[bytes, bytes]:
    """The output file (one line per succeeded request) and the error file (every other line)
    of a batch whose jobs are final, as JSON Lines, in input order, from the answers recorded
    as its lines ended (a line without one: its job was gone before anyone saw it end)."""
    output: list[bytes] = []
    errors: list[bytes] = []
    for line in lines:
        answer = None if line.job_id is None else answers.get(line.custom_id or "")
        if answer is None:
            errors.append(_failure(line, None))
        else:
            (output if answer.output else errors).append(answer.record)
    return b"".join(output), b"".join(errors)


def _record(line: BatchLine, response: dict[str, Any] | None, error: dict[str, Any] | None) -> bytes:
    request_id = line.job_id or f"line-{line.error.line if line.error else 0}"
    return orjson.dumps({"id": f"batch_req_{request_id}", "custom_id": line.custom_id, "response": response,
                         "error": error}) + b"\n"


def _answer(line: BatchLine, job: Job) -> bytes:
    """The line's answer: the provider's body, or for a job made from a Responses request the
    Response object its retrieve renders."""
    origin = origin_of(job)
    result = result_of(job)
    body = render(job, origin) if origin is not None else None if result is None else result.response
    return _record(line, {"status_code": 200, "request_id": job.id, "body": body}, None)


def _failure(line: BatchLine, job: Job | None) -> bytes:
    """A line that produced no answer: a provider's (or tidegate's) refusal keeps its status and
    error body, as OpenAI's error file does; a line that never ran says why."""
    if line.error is not None:
        return _record(line, None, {"code": line.error.code, "message": line.error.message})
    if line.ended == JobState.EXPIRED.value:
        return _record(line, None, {"code": "batch_expired",
                                    "message": "the request was not started within the completion window"})
    if line.ended == JobState.CANCELLED.value:
        return _record(line, None, {"code": "batch_cancelled", "message": "the batch was cancelled before "
                                    "the request was started"})
    if job is None or job.state is not JobState.DEAD:
        return _record(line, None, {"code": "job_not_found",
                                    "message": "the line's job is gone (past the queue's retention)"})
    failure = failure_view(job)
    status = 502 if failure is None else failure.status
    error = {"message": job.last_error or "the request failed", "type": "upstream_error",
             "param": None, "code": "job_failed"}
    if failure is not None:
        error = {"message": failure.message, "type": failure.type, "param": failure.param,
                 "code": failure.code}
    return _record(line, {"status_code": status, "request_id": job.id, "body": {"error": error}}, None)
