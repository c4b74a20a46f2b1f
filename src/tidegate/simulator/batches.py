"""OpenAI's Files and Batch APIs, simulated: a provider batch answers many requests at once, later.

`POST /v1/files` takes a JSONL file (multipart/form-data, purpose `batch`) of request lines
`{"custom_id", "method": "POST", "url", "body"}`; `POST /v1/batches` runs one in the background.
Its life is OpenAI's: `validating` (a file that is not such lines, all for the batch's endpoint
with distinct custom ids, fails the batch, its `errors` saying where), `in_progress` for
`batch_latency_s`, then `finalizing` and `completed`; a cancel makes it `cancelling`, then
`cancelled` (lines not answered by then are in neither file), and the `batch_fault` setting makes
it `failed` (at validation) or `expired` (at its end, every line in the error file as
`batch_expired`).

Each line is answered by the simulator's own chat and embeddings generation (the `AnswerLine` it
hands in), outside the per-model rate limits: a provider batch runs on capacity of its own, which
is what it is for. An answer goes to the output file, a refusal (unknown model, malformed body)
to the error file, both as `{"id", "custom_id", "response": {"status_code", "request_id", "body"},
"error": null}`. `BatchStats` counts files, batches and lines, so a test can see that nothing was
submitted twice.

Files live in memory until deleted (`DELETE /v1/files/{id}`) or the simulator stops, batches
until it stops; an upload is bounded by
`batch_max_file_bytes` and `batch_max_lines`.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import random
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from contextlib import suppress
from dataclasses import dataclass, field
from typing import Any, Final

import orjson
from aiohttp import BodyPartReader, web

from tidegate.simulator.requests import InvalidRequest, parse_json_object
from tidegate.simulator.settings import BatchFault, SimulatorSettings

__all__ = ["BATCH_ENDPOINTS", "CHAT_URL", "EMBEDDINGS_URL", "AnswerLine", "BatchService", "BatchStats",
           "LineAnswer"]

logger = logging.getLogger(__name__)

CHAT_URL: Final = "/v1/chat/completions"
EMBEDDINGS_URL: Final = "/v1/embeddings"
BATCH_ENDPOINTS: Final = (CHAT_URL, EMBEDDINGS_URL)
COMPLETION_WINDOW: Final = "24h"
WINDOW_S: Final = 24 * 3600
MAX_ERRORS: Final = 100  # of a failed validation, as a file of 50,000 bad lines would give
MAX_METADATA_PAIRS: Final = 16
MAX_LIST_LIMIT: Final = 100
LINES_PER_TURN: Final = 200  # lines answered between two turns given back to the event loop
_FIELD_BYTES: Final = 1024  # of a form field other than the file
ACTIVE: Final = frozenset({"validating", "in_progress"})
JSON: Final = "application/json"


@dataclass(frozen=True, slots=True)
class LineAnswer:
    """How the simulator answered one batch line: the HTTP status and body its endpoint would have
    given, with the model and tokens of an answer (for the stats)."""

    status: int
    body: dict[str, Any]
    model: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0


AnswerLine = Callable[[str, dict[str, Any]], LineAnswer]
"""Answers one line: its url (one of BATCH_ENDPOINTS) and its request body."""


@dataclass
class BatchStats:
    """What the batch API saw since the simulator started (or was reset)."""

    files: int = 0
    created: int = 0
    ended: Counter[str] = field(default_factory=Counter)
    lines: int = 0
    lines_by_status: Counter[int] = field(default_factory=Counter)
    lines_by_model: Counter[str] = field(default_factory=Counter)
    prompt_tokens: int = 0
    completion_tokens: int = 0

    def count(self, answer: LineAnswer) -> None:
        """Count one answered line (of an OpenAI batch or an Anthropic Message Batch)."""
        self.lines += 1
        self.lines_by_status[answer.status] += 1
        if answer.model is not None:
            self.lines_by_model[answer.model] += 1
        self.prompt_tokens += answer.prompt_tokens
        self.completion_tokens += answer.completion_tokens

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (status codes become strings, as JSON keys must be)."""
        return {
            "files": self.files, "created": self.created, "ended": dict(sorted(self.ended.items())),
            "lines": self.lines,
            "lines_by_status": {str(status): n for status, n in sorted(self.lines_by_status.items())},
            "lines_by_model": dict(sorted(self.lines_by_model.items())),
            "prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
        }


@dataclass(frozen=True, slots=True)
class _File:
    id: str
    filename: str
    purpose: str
    content: bytes
    created_at: int

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "object": "file", "bytes": len(self.content), "created_at": self.created_at,
                "filename": self.filename, "purpose": self.purpose, "status": "processed",
                "status_details": None, "expires_at": None}


@dataclass(frozen=True, slots=True)
class _Line:
    custom_id: str
    url: str
    body: dict[str, Any]


class _Invalid(Exception):
    """The input file is not a batch's: the batch fails with these errors."""

    def __init__(self, errors: list[dict[str, Any]]) -> None:
        super().__init__(errors[0]["message"])
        self.errors = errors


@dataclass(slots=True)
class _Batch:
    id: str
    endpoint: str
    input_file_id: str
    metadata: dict[str, str] | None
    created_at: int
    fault: BatchFault | None
    status: str = "validating"
    moments: dict[str, int] = field(default_factory=dict)  # when it entered each later status
    errors: list[dict[str, Any]] | None = None
    output_file_id: str | None = None
    error_file_id: str | None = None
    total: int = 0
    completed: int = 0
    failed: int = 0
    cancel: asyncio.Event = field(default_factory=asyncio.Event)

    def enter(self, status: str) -> None:
        self.status = status
        self.moments[status] = int(time.time())

    def to_json(self) -> dict[str, Any]:
        moments = {f"{status}_at": self.moments.get(status)
                   for status in ("in_progress", "finalizing", "completed", "failed", "expired",
                                  "cancelling", "cancelled")}
        return {
            "id": self.id, "object": "batch", "endpoint": self.endpoint,
            "errors": None if self.errors is None else {"object": "list", "data": self.errors},
            "input_file_id": self.input_file_id, "completion_window": COMPLETION_WINDOW,
            "status": self.status, "output_file_id": self.output_file_id,
            "error_file_id": self.error_file_id, "created_at": self.created_at,
            "expires_at": self.created_at + WINDOW_S, **moments,
            "request_counts": {"total": self.total, "completed": self.completed, "failed": self.failed},
            "metadata": self.metadata,
        }


_Handler = Callable[["BatchService", web.Request], Awaitable[web.StreamResponse]]


def _endpoint(handler: _Handler) -> _Handler:
    """An endpoint of the batch API: the request's API key is checked first, and an InvalidRequest
    the handler raises becomes its OpenAI-shaped answer."""

    @functools.wraps(handler)
    async def endpoint(service: BatchService, request: web.Request) -> web.StreamResponse:
        try:
            service._authorize(request)
            return await handler(service, request)
        except InvalidRequest as exc:
            return _refusal(exc)

    return endpoint


class BatchService:
    """The files and batches of one simulator, and the handlers of their endpoints.

    `settings` gives the simulator's settings in force, `authorized` checks a request's API key,
    and `answer` answers one line (see the module docstring).
    """

    def __init__(self, settings: Callable[[], SimulatorSettings],
                 authorized: Callable[[web.Request], bool], answer: AnswerLine) -> None:
        self._settings = settings
        self._authorized = authorized
        self._answer = answer
        self._files: dict[str, _File] = {}
        self._batches: dict[str, _Batch] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._ids = random.Random(f"{settings().seed}:batches")
        self.stats = BatchStats()

    def reset(self) -> None:
        """Forget the stats and restart the ids from the seed; files and batches stay."""
        self.stats = BatchStats()
        self._ids = random.Random(f"{self._settings().seed}:batches")

    async def close(self) -> None:
        """Stop the batches still running (the simulator is stopping)."""
        tasks, self._tasks = self._tasks, set()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # -- files

    @_endpoint
    async def create_file(self, request: web.Request) -> web.StreamResponse:
        """POST /v1/files: store an uploaded file (multipart: `purpose` and `file`)."""
        purpose, filename, content = await self._upload(request)
        stored = _File(self._new_id("file-"), filename, purpose, content, int(time.time()))
        self._files[stored.id] = stored
        self.stats.files += 1
        return _json(200, stored.to_json())

    @_endpoint
    async def get_file(self, request: web.Request) -> web.StreamResponse:
        """GET /v1/files/{file_id}."""
        return _json(200, self._file(request.match_info["file_id"], "file_id").to_json())

    @_endpoint
    async def file_content(self, request: web.Request) -> web.StreamResponse:
        """GET /v1/files/{file_id}/content: the file's bytes."""
        stored = self._file(request.match_info["file_id"], "file_id")
        return web.Response(status=200, body=stored.content, content_type="application/octet-stream")

    @_endpoint
    async def delete_file(self, request: web.Request) -> web.StreamResponse:
        """DELETE /v1/files/{file_id}: forget the file (a batch that ran on it keeps its id)."""
        stored = self._file(request.match_info["file_id"], "file_id")
        del self._files[stored.id]
        return _json(200, {"id": stored.id, "object": "file", "deleted": True})

    async def _upload(self, request: web.Request) -> tuple[str, str, bytes]:
        if not request.content_type.startswith("multipart/"):
            raise InvalidRequest("A file upload must be multipart/form-data.", code="invalid_request")
        limit = self._settings().batch_max_file_bytes
        purpose: str | None = None
        upload: tuple[str, bytes] | None = None
        async for part in await request.multipart():
            if not isinstance(part, BodyPartReader):
                raise InvalidRequest("A nested multipart part is not a form field.", code="invalid_request")
            if part.name == "purpose":
                purpose = (await _read_part(part, _FIELD_BYTES, "purpose")).decode(errors="replace")
            elif part.name == "file":
                upload = (part.filename or "upload.jsonl", await _read_part(part, limit, "file"))
            else:
                await part.release()  # e.g. expires_after: not simulated, files stay until the end
        if purpose is None:
            raise InvalidRequest("Missing required parameter: 'purpose'.", param="purpose",
                                 code="missing_required_parameter")
        if purpose != "batch":
            raise InvalidRequest(f"Invalid value for 'purpose': {purpose!r}; the simulator stores "
                                 "only files of purpose 'batch'.", param="purpose", code="invalid_value")
        if upload is None:
            raise InvalidRequest("Missing required parameter: 'file'.", param="file",
                                 code="missing_required_parameter")
        return purpose, *upload

    def _file(self, file_id: str, param: str) -> _File:
        stored = self._files.get(file_id)
        if stored is None:
            raise InvalidRequest(f"No such File object: {file_id}", status=404, param=param,
                                 code="file_not_found")
        return stored

    # -- batches

    @_endpoint
    async def create_batch(self, request: web.Request) -> web.StreamResponse:
        """POST /v1/batches: start a batch on an uploaded file."""
        body = parse_json_object(await request.read())
        endpoint, metadata = _batch_fields(body)
        source = self._file(body["input_file_id"], "input_file_id")
        if source.purpose != "batch":
            raise InvalidRequest(f"File {source.id} has purpose {source.purpose!r}, not 'batch'.",
                                 param="input_file_id", code="invalid_value")
        batch = _Batch(self._new_id("batch_"), endpoint, source.id, metadata, int(time.time()),
                       self._settings().batch_fault)
        self._batches[batch.id] = batch
        self.stats.created += 1
        task = asyncio.create_task(self._run(batch, source.content), name=f"simulated {batch.id}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return _json(200, batch.to_json())

    @_endpoint
    async def get_batch(self, request: web.Request) -> web.StreamResponse:
        """GET /v1/batches/{batch_id}."""
        return _json(200, self._batch(request.match_info["batch_id"]).to_json())

    @_endpoint
    async def cancel_batch(self, request: web.Request) -> web.StreamResponse:
        """POST /v1/batches/{batch_id}/cancel: a batch still running becomes `cancelling`."""
        batch = self._batch(request.match_info["batch_id"])
        if batch.status in ACTIVE:
            batch.enter("cancelling")
            batch.cancel.set()
        elif batch.status != "cancelling":
            raise InvalidRequest(f"Cannot cancel a batch with status '{batch.status}'.", status=409,
                                 code="batch_not_cancellable")
        return _json(200, batch.to_json())

    @_endpoint
    async def list_batches(self, request: web.Request) -> web.StreamResponse:
        """GET /v1/batches: the newest first, `limit` (1-100, 20) at a time `after` an id."""
        limit = _limit(request.query.get("limit", "20"))
        newest = list(reversed(self._batches.values()))
        after = request.query.get("after")
        if after is not None:
            start = next((i + 1 for i, batch in enumerate(newest) if batch.id == after), None)
            if start is None:
                raise InvalidRequest(f"No such Batch object: {after}", param="after", code="batch_not_found")
            newest = newest[start:]
        page = [batch.to_json() for batch in newest[:limit]]
        return _json(200, {"object": "list", "data": page, "first_id": page[0]["id"] if page else None,
                           "last_id": page[-1]["id"] if page else None, "has_more": len(newest) > limit})

    def _batch(self, batch_id: str) -> _Batch:
        batch = self._batches.get(batch_id)
        if batch is None:
            raise InvalidRequest(f"No such Batch object: {batch_id}", status=404, param="batch_id",
                                 code="batch_not_found")
        return batch

    # -- running a batch

    async def _run(self, batch: _Batch, content: bytes) -> None:
        try:
            await self._steps(batch, content)
        except Exception:  # a fault of the simulator's own must not leave the batch running for ever
            logger.exception("simulated batch %s failed", batch.id)
            batch.errors = [_line_error("server_error", "The simulator failed while running the batch.")]
            self._end(batch, "failed")

    async def _steps(self, batch: _Batch, content: bytes) -> None:
        try:
            lines = _lines(content, batch.endpoint, self._settings().batch_max_lines)
            if batch.fault == "failed":
                raise _Invalid([_line_error("batch_failed", "The batch failed (a simulated fault).")])
        except _Invalid as exc:
            batch.errors = exc.errors
            self._end(batch, "failed")
            return
        batch.total = len(lines)
        if batch.status == "validating":  # not cancelling already
            batch.enter("in_progress")
            with suppress(TimeoutError):
                async with asyncio.timeout(self._settings().batch_latency_s):
                    await batch.cancel.wait()
        if batch.cancel.is_set():
            self._end(batch, "cancelled")
        elif batch.fault == "expired":
            batch.failed = len(lines)
            batch.error_file_id = self._output(batch, "error", [_expired(self._new_id("batch_req_"), line)
                                                                 for line in lines])
            self._end(batch, "expired")
        else:
            await self._answer_lines(batch, lines)

    async def _answer_lines(self, batch: _Batch, lines: list[_Line]) -> None:
        outputs: list[bytes] = []
        errors: list[bytes] = []
        for number, line in enumerate(lines):
            if number and number % LINES_PER_TURN == 0:
                await asyncio.sleep(0)
                if batch.cancel.is_set():
                    break
            answer = self._answer(line.url, line.body)
            self.stats.count(answer)
            record = orjson.dumps({"id": self._new_id("batch_req_"), "custom_id": line.custom_id,
                                   "response": {"status_code": answer.status,
                                                "request_id": self._new_id("req_"), "body": answer.body},
                                   "error": None})
            (outputs if answer.status == 200 else errors).append(record)
        batch.completed, batch.failed = len(outputs), len(errors)
        if not batch.cancel.is_set():
            batch.enter("finalizing")
        batch.output_file_id = self._output(batch, "output", outputs)
        batch.error_file_id = self._output(batch, "error", errors)
        self._end(batch, "cancelled" if batch.cancel.is_set() else "completed")

    def _output(self, batch: _Batch, kind: str, records: list[bytes]) -> str | None:
        """Store the output or error file of `batch` (none when it would be empty)."""
        if not records:
            return None
        stored = _File(self._new_id("file-"), f"{batch.id}_{kind}.jsonl", "batch_output",
                       b"".join(record + b"\n" for record in records), int(time.time()))
        self._files[stored.id] = stored
        return stored.id

    def _end(self, batch: _Batch, status: str) -> None:
        batch.enter(status)
        self.stats.ended[status] += 1

    # -- helpers

    def _authorize(self, request: web.Request) -> None:
        if not self._authorized(request):
            raise InvalidRequest("Incorrect API key provided.", status=401, code="invalid_api_key")

    def _new_id(self, prefix: str) -> str:
        return f"{prefix}{self._ids.getrandbits(96):024x}"


def _batch_fields(body: dict[str, Any]) -> tuple[str, dict[str, str] | None]:
    """The endpoint and metadata of a batch's creation, its other fields checked."""
    unknown = set(body) - {"input_file_id", "endpoint", "completion_window", "metadata",
                           "output_expires_after"}
    if unknown:
        raise InvalidRequest(f"Unrecognized request argument supplied: {sorted(unknown)[0]}",
                             param=sorted(unknown)[0], code="unknown_parameter")
    for name in ("input_file_id", "endpoint", "completion_window"):
        if not isinstance(body.get(name), str):
            raise InvalidRequest(f"Missing required parameter: '{name}'.", param=name,
                                 code="missing_required_parameter")
    endpoint = body["endpoint"]
    if endpoint not in BATCH_ENDPOINTS:
        raise InvalidRequest(f"Invalid value for 'endpoint': {endpoint!r}; the simulator's batches call "
                             f"{' or '.join(BATCH_ENDPOINTS)}.", param="endpoint", code="invalid_value")
    if body["completion_window"] != COMPLETION_WINDOW:
        raise InvalidRequest(f"Invalid value for 'completion_window': it must be '{COMPLETION_WINDOW}'.",
                             param="completion_window", code="invalid_value")
    metadata = body.get("metadata")
    if metadata is not None and not (
            isinstance(metadata, dict) and len(metadata) <= MAX_METADATA_PAIRS
            and all(isinstance(k, str) and isinstance(v, str) and len(k) <= 64 and len(v) <= 512
                    for k, v in metadata.items())):
        raise InvalidRequest(f"Invalid 'metadata': at most {MAX_METADATA_PAIRS} string pairs (keys up to 64 "
                             "characters, values up to 512).", param="metadata", code="invalid_value")
    return endpoint, metadata


def _lines(content: bytes, endpoint: str, max_lines: int) -> list[_Line]:
    """The request lines of an input file, or _Invalid naming the lines that are not."""
    lines: list[_Line] = []
    errors: list[dict[str, Any]] = []
    seen: set[str] = set()
    for number, raw in enumerate(content.splitlines(), start=1):
        if not raw.strip():
            continue
        if len(lines) + len(errors) >= max_lines:
            raise _Invalid([_line_error("too_many_tasks", f"The batch has more than {max_lines} requests.")])
        try:
            line = _line(raw, endpoint, number)
            if line.custom_id in seen:
                raise _Invalid([_line_error("duplicate_custom_id", f"The custom_id {line.custom_id!r} is "
                                            "used more than once.", number, "custom_id")])
        except _Invalid as exc:
            errors.extend(exc.errors)
            if len(errors) >= MAX_ERRORS:
                break
            continue
        seen.add(line.custom_id)
        lines.append(line)
    if errors:
        raise _Invalid(errors)
    if not lines:
        raise _Invalid([_line_error("empty_file", "The input file has no requests.")])
    return lines


def _line(raw: bytes, endpoint: str, number: int) -> _Line:
    try:
        record = orjson.loads(raw)
    except orjson.JSONDecodeError:
        record = None
    if not isinstance(record, dict):
        raise _Invalid([_line_error("invalid_json_line", "This line is not a JSON object.", number)])
    custom_id, method, url, body = (record.get(name) for name in ("custom_id", "method", "url", "body"))
    if not isinstance(custom_id, str) or not custom_id:
        raise _Invalid([_line_error("missing_required_parameter", "The line has no 'custom_id' string.",
                                    number, "custom_id")])
    if method != "POST":
        raise _Invalid([_line_error("invalid_method", "A batch request's 'method' must be 'POST'.",
                                    number, "method")])
    if url != endpoint:
        raise _Invalid([_line_error("invalid_url", f"The line's 'url' {url!r} is not the batch's endpoint "
                                    f"{endpoint!r}.", number, "url")])
    if not isinstance(body, dict):
        raise _Invalid([_line_error("invalid_body", "The line's 'body' must be a JSON object.", number,
                                    "body")])
    return _Line(custom_id, url, body)


def _line_error(code: str, message: str, line: int | None = None, param: str | None = None) -> dict[str, Any]:
    return {"code": code, "message": message, "param": param, "line": line}


def _expired(identifier: str, line: _Line) -> bytes:
    return orjson.dumps({"id": identifier, "custom_id": line.custom_id, "response": None,
                         "error": {"code": "batch_expired", "message": "This request could not be "
                                   "executed before the completion window expired."}})


def _limit(value: str) -> int:
    try:
        limit = int(value)
    except ValueError:
        limit = 0
    if not 1 <= limit <= MAX_LIST_LIMIT:
        raise InvalidRequest(f"Invalid 'limit': it must be an integer from 1 to {MAX_LIST_LIMIT}.",
                             param="limit", code="invalid_value")
    return limit


async def _read_part(part: BodyPartReader, limit: int, name: str) -> bytes:
    """A form field's bytes, or InvalidRequest once it exceeds `limit` (nothing more is kept)."""
    data = bytearray()
    while chunk := await part.read_chunk():
        data += chunk
        if len(data) > limit:
            raise InvalidRequest(f"The '{name}' is too large: the limit is {limit} bytes.", param=name,
                                 code="file_too_large" if name == "file" else "invalid_value")
    return bytes(data)


def _json(status: int, body: Any) -> web.Response:
    return web.Response(status=status, body=orjson.dumps(body), content_type=JSON)


def _refusal(exc: InvalidRequest) -> web.Response:
    return web.Response(status=exc.status, body=exc.body(), content_type=JSON)
