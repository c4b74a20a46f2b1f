"""A provider's own batch API (OpenAI's Files + Batch): submit many requests at once, collect later.

OpenAI and Anthropic answer a batch within a window (24 h) at half the price of single calls, which
suits BULK jobs with a long deadline. `BatchClient` is what a caller needs of either (Anthropic's
is `.anthropic.AnthropicBatchClient`; `batch_client` picks one by the provider's `api`).
`ProviderBatchClient` speaks OpenAI's shape over the provider's pooled `UpstreamClient`: the lines
go up as one JSONL file (purpose `batch`), a batch is created on it, polled until it ended, and its
output and error files are read back into one `BatchLineResult` per line. A creation whose answer
was lost may still have created the batch: `find` looks it up by the metadata it was given, so that
it is not submitted twice. Files stay at the provider until deleted: `delete_files` removes an
ended batch's input, output and error files.

Failures leave as `UpstreamError` (tidegate.errors), whose `kind` and `retryable` tell the caller
what to do, as the other provider calls do.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Protocol
from urllib.parse import quote

import aiohttp
import orjson

from tidegate.contract import RequestBody, to_body
from tidegate.errors import UpstreamError
from tidegate.providers.client import UpstreamClient

__all__ = ["ENDED_STATUSES", "BatchClient", "BatchLineRequest", "BatchLineResult", "ProviderBatch",
           "ProviderBatchClient", "check_lines", "missing_line"]

ENDED_STATUSES: Final = frozenset({"completed", "failed", "expired", "cancelled"})
"""The statuses after which a batch changes no more."""

FILES_PATH: Final = "/files"
BATCHES_PATH: Final = "/batches"
UPLOAD_NAME: Final = "tidegate-batch.jsonl"
CONFLICT: Final = 409
NOT_FOUND: Final = 404
MISSING_CODES: Final = {"expired": "batch_expired", "cancelled": "batch_cancelled", "failed": "batch_failed"}
"""The error code of a line in neither file of a batch that ended so."""
MESSAGE_ERRORS: Final = 3  # of a failed batch's errors, quoted in its lines' message
LIST_PAGE: Final = 100  # batches a page of OpenAI's listing holds at most
FIND_DEPTH: Final = 1000  # batches `find` looks through by default


@dataclass(frozen=True, slots=True)
class BatchLineRequest:
    """One request of a batch: `custom_id` names it in the results (tidegate uses the job id),
    `url` is its endpoint ("/v1/chat/completions" or "/v1/embeddings"), `body` its request body,
    model included."""

    custom_id: str
    url: str
    body: RequestBody


@dataclass(frozen=True, slots=True)
class ProviderBatch:
    """A batch as the provider last described it.

    `status` is OpenAI's: validating, in_progress, finalizing, completed, failed, expired,
    cancelling or cancelled. The file ids are set once the batch has output (or failed lines).
    `errors` are why a batch `failed` (its input file was refused), as "line 3:
    duplicate_custom_id: ..." each.
    """

    id: str
    status: str
    output_file_id: str | None
    error_file_id: str | None
    total: int
    completed: int
    failed: int
    errors: tuple[str, ...] = ()

    @property
    def ended(self) -> bool:
        """Whether the batch changes no more: completed, failed, expired or cancelled."""
        return self.status in ENDED_STATUSES


@dataclass(frozen=True, slots=True)
class BatchLineResult:
    """The answer to one line: its HTTP status (200 on success) and body (the chat completion or
    embeddings, or the error body).

    A line the provider did not run has `status_code` 0 and the body `{"error": {"code",
    "message"}}`: the error its error file gave (OpenAI's `batch_expired`), or, for a line in
    neither file of the ended batch, `batch_expired`, `batch_cancelled` or `batch_failed` by how
    the batch ended (`batch_line_missing` for a completed one).
    """

    custom_id: str
    status_code: int
    body: dict[str, Any]


class BatchClient(Protocol):
    """Submits, polls and collects one provider's batches (see ProviderBatchClient for what each
    call does; a provider's client says how it maps its API to these)."""

    async def submit(self, lines: Sequence[BatchLineRequest], *, endpoint: str,
                     completion_window: str = "24h",
                     metadata: Mapping[str, str] | None = None) -> ProviderBatch:
        """Create a batch of `lines`, all for `endpoint`, tagged with `metadata` for `find`."""
        ...

    async def retrieve(self, batch_id: str) -> ProviderBatch:
        """The batch as the provider describes it now."""
        ...

    async def results(self, batch: ProviderBatch, custom_ids: Iterable[str]) -> dict[str, BatchLineResult]:
        """A result for every one of `custom_ids` of an ended batch."""
        ...

    async def cancel(self, batch_id: str) -> ProviderBatch:
        """Ask the provider to cancel the batch."""
        ...

    async def delete_files(self, batch_id: str) -> int:
        """Delete what an ended batch left at the provider (its files); how many were deleted."""
        ...

    async def find(self, metadata: Mapping[str, str], *, newest: int = FIND_DEPTH) -> ProviderBatch | None:
        """The newest batch submitted with every pair of `metadata`, or None."""
        ...


class ProviderBatchClient:
    """Submits, polls and collects one provider's batches over its pooled UpstreamClient."""

    def __init__(self, client: UpstreamClient) -> None:
        self.client = client

    async def submit(self, lines: Sequence[BatchLineRequest], *, endpoint: str,
                     completion_window: str = "24h",
                     metadata: Mapping[str, str] | None = None) -> ProviderBatch:
        """Upload `lines` as a JSONL file (purpose `batch`) to {base_url}/files, then create a
        batch on it at {base_url}/batches for `endpoint` ("/v1/chat/completions" or
        "/v1/embeddings").

        Raises ValueError, before sending anything, when there are no lines, two share a
        custom_id or one is not for `endpoint`: the provider would fail the whole batch. A
        failure of the creation leaves the uploaded file at the provider; one that may have
        reached it (a timeout, a cut connection) may also have created the batch: `find` with
        its metadata finds it again rather than submit it twice.
        """
        content = _jsonl(lines, endpoint)
        form = aiohttp.FormData()
        form.add_field("purpose", "batch")
        form.add_field("file", content, filename=UPLOAD_NAME, content_type="application/jsonl")
        uploaded = await self.client.send("POST", FILES_PATH, form=form)
        file_id = _text(uploaded.body, "id")
        if file_id is None:
            raise self._malformed("POST", FILES_PATH, "a file object without an id")
        body: dict[str, Any] = {"input_file_id": file_id, "endpoint": endpoint,
                                "completion_window": completion_window}
        if metadata is not None:
            body["metadata"] = dict(metadata)
        created = await self.client.send("POST", BATCHES_PATH, body=body)
        return self._batch("POST", BATCHES_PATH, created.body)

    async def retrieve(self, batch_id: str) -> ProviderBatch:
        """The batch as the provider describes it now."""
        path = f"{BATCHES_PATH}/{quote(batch_id, safe='')}"
        return self._batch("GET", path, (await self.client.send("GET", path)).body)

    async def results(self, batch: ProviderBatch, custom_ids: Iterable[str]) -> dict[str, BatchLineResult]:
        """A result for every one of `custom_ids` of an ended batch, read from its output and error
        files (a line in neither is reported with status_code 0, see BatchLineResult); lines of
        the files not asked for are left out. Raises ValueError for a batch that has not ended."""
        if not batch.ended:
            raise ValueError(f"batch {batch.id} is {batch.status}: its results are read once it ended")
        wanted = dict.fromkeys(custom_ids)  # in the order asked, each once
        found: dict[str, BatchLineResult] = {}
        for file_id in (batch.output_file_id, batch.error_file_id):
            if file_id is not None:
                path = f"{FILES_PATH}/{quote(file_id, safe='')}/content"
                for result in self._records(path, await self.client.download(path)):
                    if result.custom_id in wanted:
                        found[result.custom_id] = result
        missing = missing_line(batch)
        return {custom_id: found.get(custom_id) or BatchLineResult(custom_id, 0, missing)
                for custom_id in wanted}

    async def cancel(self, batch_id: str) -> ProviderBatch:
        """Ask the provider to cancel the batch: it goes `cancelling`, then `cancelled` (the lines
        answered by then are in its files). A batch that already ended is returned as it is."""
        path = f"{BATCHES_PATH}/{quote(batch_id, safe='')}/cancel"
        try:
            answer = await self.client.send("POST", path)
        except UpstreamError as exc:
            if exc.status != CONFLICT:  # OpenAI's answer to cancelling a batch that has ended
                raise
            return await self.retrieve(batch_id)
        return self._batch("POST", path, answer.body)

    async def delete_file(self, file_id: str) -> bool:
        """Delete one file at the provider ({base_url}/files/{id}): True when it was, False when it
        was gone already."""
        path = f"{FILES_PATH}/{quote(file_id, safe='')}"
        try:
            answer = await self.client.send("DELETE", path)
        except UpstreamError as exc:
            if exc.status != NOT_FOUND:
                raise
            return False
        return answer.body.get("deleted") is True

    async def delete_files(self, batch_id: str) -> int:
        """Delete the input, output and error files of an ended batch at the provider; how many
        were deleted (one gone already is not counted). Raises ValueError for a batch that has not
        ended: its files are still in use."""
        path = f"{BATCHES_PATH}/{quote(batch_id, safe='')}"
        body = (await self.client.send("GET", path)).body
        batch = self._batch("GET", path, body)
        if not batch.ended:
            raise ValueError(f"batch {batch.id} is {batch.status}: its files are deleted once it ended")
        files = (_text(body, "input_file_id"), batch.output_file_id, batch.error_file_id)
        return sum([await self.delete_file(file_id) for file_id in files if file_id is not None])

    async def find(self, metadata: Mapping[str, str], *, newest: int = FIND_DEPTH) -> ProviderBatch | None:
        """The newest batch whose metadata holds every pair of `metadata`, among the `newest`
        batches the provider lists (newest first), or None: how a batch whose creation was sent
        but not answered is found again."""
        wanted = dict(metadata).items()
        async for path, item in self._listing(newest):
            held = item.get("metadata")
            if isinstance(held, dict) and wanted <= held.items():
                return self._batch("GET", path, item)
        return None

    async def _listing(self, most: int) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        """The provider's batches, newest first, at most `most`, each with the path of its page."""
        after: str | None = None
        while most > 0:
            path = f"{BATCHES_PATH}?limit={min(most, LIST_PAGE)}"
            if after is not None:
                path += f"&after={quote(after, safe='')}"
            page = (await self.client.send("GET", path)).body
            data = page.get("data")
            items = [item for item in data if isinstance(item, dict)] if isinstance(data, list) else []
            for item in items:
                yield path, item
            most -= len(items)
            after = _text(items[-1], "id") if items else None
            if after is None or page.get("has_more") is not True:
                return

    # -- reading the provider's answers

    def _batch(self, method: str, path: str, body: dict[str, Any]) -> ProviderBatch:
        identifier, status = _text(body, "id"), _text(body, "status")
        if identifier is None or status is None:
            raise self._malformed(method, path, "a batch object without an id and a status")
        counts = body.get("request_counts")
        counts = counts if isinstance(counts, dict) else {}
        errors = body.get("errors")
        listed = errors.get("data") if isinstance(errors, dict) else None
        return ProviderBatch(identifier, status, _text(body, "output_file_id"), _text(body, "error_file_id"),
                             _count(counts, "total"), _count(counts, "completed"), _count(counts, "failed"),
                             tuple(_error_text(error) for error in listed or () if isinstance(error, dict)))

    def _records(self, path: str, content: bytes) -> Iterator[BatchLineResult]:
        for number, raw in enumerate(content.splitlines(), start=1):
            if not raw.strip():
                continue
            try:
                record = orjson.loads(raw)
            except orjson.JSONDecodeError:
                record = None
            result = _line_result(record) if isinstance(record, dict) else None
            if result is None:
                raise self._malformed("GET", path, f"line {number} that is not a batch result")
            yield result

    def _malformed(self, method: str, path: str, what: str) -> UpstreamError:
        return UpstreamError(f"{self.client.provider.name}: {method} {path} answered {what}",
                             kind="malformed", status=200)


def _jsonl(lines: Sequence[BatchLineRequest], endpoint: str) -> bytes:
    """The input file: one `{"custom_id", "method", "url", "body"}` line each."""
    check_lines(lines, endpoint)
    return b"".join(orjson.dumps({"custom_id": line.custom_id, "method": "POST", "url": line.url,
                                  "body": to_body(line.body)}) + b"\n" for line in lines)


def check_lines(lines: Sequence[BatchLineRequest], endpoint: str) -> None:
    """Raise ValueError when there are no lines, two share a custom_id or one is not for
    `endpoint`: a provider would refuse the whole batch."""
    if not lines:
        raise ValueError("a batch needs at least one line")
    seen: set[str] = set()
    for line in lines:
        if line.custom_id in seen:
            raise ValueError(f"two lines of the batch have the custom_id {line.custom_id!r}")
        if line.url != endpoint:
            raise ValueError(f"line {line.custom_id!r} is for {line.url}, not the batch's endpoint "
                             f"{endpoint}")
        seen.add(line.custom_id)


def _line_result(record: dict[str, Any]) -> BatchLineResult | None:
    """One line of an output or error file: its response (status and body), or the error of a
    line the provider did not run (status 0). None when it is neither."""
    custom_id, response, error = record.get("custom_id"), record.get("response"), record.get("error")
    if not isinstance(custom_id, str):
        return None
    if isinstance(response, dict):
        status, body = response.get("status_code"), response.get("body")
        if isinstance(status, int) and not isinstance(status, bool) and isinstance(body, dict):
            return BatchLineResult(custom_id, status, body)
        return None
    if isinstance(error, dict):
        return BatchLineResult(custom_id, 0, {"error": error})
    return None


def missing_line(batch: ProviderBatch) -> dict[str, Any]:
    """The error body of a line the ended `batch` gave no result for."""
    code = MISSING_CODES.get(batch.status, "batch_line_missing")
    message = f"The batch {batch.id} ended {batch.status} without answering this request"
    if batch.errors:
        message += ": " + "; ".join(batch.errors[:MESSAGE_ERRORS])
    return {"error": {"code": code, "message": message + "."}}


def _error_text(error: dict[str, Any]) -> str:
    """One of a failed batch's errors as a line of text: "line 3: duplicate_custom_id: ..."."""
    line, code, message = error.get("line"), error.get("code"), error.get("message")
    parts = [f"line {line}" if isinstance(line, int) else None, code if isinstance(code, str) else None,
             message if isinstance(message, str) else None]
    return ": ".join(part for part in parts if part) or "unknown error"


def _text(body: dict[str, Any], name: str) -> str | None:
    value = body.get(name)
    return value if isinstance(value, str) and value else None


def _count(counts: dict[str, Any], name: str) -> int:
    value = counts.get(name)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0
