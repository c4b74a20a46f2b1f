"""Anthropic's Message Batches API as a `BatchClient`: chat jobs at half the price, answered
within 24 h.

A chat line goes up as a Messages request (`tidegate.providers.adapters.anthropic.messages_body`,
as a live call would send it) in one `POST {base}/messages/batches`, and each succeeded result
comes back as the chat.completion of its Message (`chat_completion`, usage included), so the job's
result has the form a live call gives it. Anthropic has no embeddings: a batch is for
"/v1/chat/completions" only.

Anthropic's batch is `in_progress`, `canceling` or `ended`, with counts of its requests'
outcomes; as a `ProviderBatch` it is in_progress, cancelling, or, once ended, `cancelled` (a
cancel ended it), `expired` (every request expired) or `completed`. Its results are read from
`GET {base}/messages/batches/{id}/results`: `succeeded` → status 200 and the chat.completion;
`errored` → the status of its error's type and the error body as it is; `canceled` and `expired`
→ status 0 and `{"error": {"code": "batch_cancelled" | "batch_expired", "message"}}`.

A Message Batch carries no metadata. `find` needs something the batch keeps that names its
submission: the custom_ids, the only thing of a request that comes back. So the first request's
custom_id carries a tag of each metadata pair (`{custom_id}--{8 hex digits a pair}`, the pair's
BLAKE2b digest; Anthropic's custom_ids have at most 64 characters, room for tidegate's job ids and
a few pairs), which `results` strips again. `find` reads the results of the ended batches the
provider lists, newest first (the latest 100 by default, each ended one costing a download of its
results the first time), for a custom_id whose tags hold those of every pair asked for.
Results exist only once a batch ended: a batch still running cannot be recognised, so `find`
answers None for it, and a creation whose answer was lost while its batch still runs may be sent
again (the jobs are served once; the copy costs its price).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from typing import Any, Final
from urllib.parse import quote

import orjson

from tidegate.contract import ChatRequest
from tidegate.dispatch.provider_batches.clients.openai import (
    BatchLineRequest,
    BatchLineResult,
    ProviderBatch,
    check_lines,
    missing_line,
)
from tidegate.errors import UpstreamError
from tidegate.providers.adapters.anthropic import chat_completion, messages_body
from tidegate.providers.client import UpstreamClient

__all__ = ["CHAT_ENDPOINT", "AnthropicBatchClient"]

CHAT_ENDPOINT: Final = "/v1/chat/completions"
BATCHES_PATH: Final = "/messages/batches"
WINDOW: Final = "24h"  # Anthropic's only one
MAX_CUSTOM_ID: Final = 64
TAG_MARK: Final = "--"  # between a custom_id and the tags of the batch's metadata
TAG_BYTES: Final = 4  # of a pair's digest: 8 hex digits
LIST_PAGE: Final = 100
FIND_DEPTH: Final = 100  # batches `find` looks through by default: each ended one costs a download
TAGS_CACHED: Final = 4096  # ended batches whose tags are kept (they change no more)
_STATUSES: Final = {"in_progress": "in_progress", "canceling": "cancelling"}
# The HTTP status of an errored request's error type (Anthropic's errors API).
_ERROR_STATUSES: Final = {
    "invalid_request_error": 400, "authentication_error": 401, "billing_error": 402,
    "permission_error": 403, "not_found_error": 404, "request_too_large": 413,
    "rate_limit_error": 429, "api_error": 500, "timeout_error": 504, "overloaded_error": 529,
}
_UNRUN: Final = {"canceled": ("batch_cancelled", "The batch was cancelled before this request ran."),
                 "expired": ("batch_expired", "This request could not be run before the batch expired.")}


class AnthropicBatchClient:
    """Submits, polls and collects one Anthropic provider's Message Batches over its pooled
    UpstreamClient (a `BatchClient`; see the module docstring)."""

    def __init__(self, client: UpstreamClient) -> None:
        self.client = client
        self._tagged: OrderedDict[str, tuple[frozenset[str], ...]] = OrderedDict()

    async def submit(self, lines: Sequence[BatchLineRequest], *, endpoint: str,
                     completion_window: str = WINDOW,
                     metadata: Mapping[str, str] | None = None) -> ProviderBatch:
        """Create one Message Batch of `lines` (chat completion bodies, model included), the
        first request's custom_id tagged with `metadata` (see the module docstring).

        Raises ValueError, before sending anything, for no lines, a repeated custom_id, a line not
        for `endpoint`, an endpoint other than chat completions, a window other than 24 h, or a
        custom_id Anthropic would refuse (1 to 64 of letters, digits, `_` and `-`, the tags
        included)."""
        if endpoint != CHAT_ENDPOINT:
            raise ValueError(f"Anthropic's Message Batches serve {CHAT_ENDPOINT} only, not {endpoint}")
        if completion_window != WINDOW:
            raise ValueError(f"Anthropic's Message Batches end within {WINDOW}, not {completion_window}")
        check_lines(lines, endpoint)
        tags = "".join(_tag(key, value) for key, value in (metadata or {}).items())
        requests = []
        for number, line in enumerate(lines):
            custom_id = f"{line.custom_id}{TAG_MARK}{tags}" if tags and number == 0 else line.custom_id
            if not _valid_custom_id(custom_id):
                raise ValueError(f"custom_id {custom_id!r} is not 1 to {MAX_CUSTOM_ID} letters, digits, '_' "
                                 "or '-'")
            if not isinstance(line.body, ChatRequest):
                raise ValueError(f"line {line.custom_id!r} is not a chat completion request")
            requests.append({"custom_id": custom_id,
                             "params": messages_body(line.body, line.body.model)})
        created = await self.client.send("POST", BATCHES_PATH, body={"requests": requests})
        return self._batch("POST", BATCHES_PATH, created.body)

    async def retrieve(self, batch_id: str) -> ProviderBatch:
        """The batch as the provider describes it now."""
        path = _path(batch_id)
        return self._batch("GET", path, (await self.client.send("GET", path)).body)

    async def results(self, batch: ProviderBatch, custom_ids: Iterable[str]) -> dict[str, BatchLineResult]:
        """A result for every one of `custom_ids` of an ended batch (a request it gave no result
        for is reported with status_code 0); results not asked for are left out. Raises ValueError
        for a batch that has not ended."""
        if not batch.ended:
            raise ValueError(f"batch {batch.id} is {batch.status}: its results are read once it ended")
        wanted = dict.fromkeys(custom_ids)
        found: dict[str, BatchLineResult] = {}
        for sent, result in await self._records(batch.id):
            custom_id = sent if sent in wanted else _untagged(sent)
            if custom_id in wanted:
                found[custom_id] = _line_result(custom_id, result)
        missing = missing_line(batch)
        return {custom_id: found.get(custom_id) or BatchLineResult(custom_id, 0, missing)
                for custom_id in wanted}

    async def cancel(self, batch_id: str) -> ProviderBatch:
        """Ask Anthropic to cancel the batch: it goes `canceling`, then ended (its requests not
        run by then `canceled`)."""
        path = f"{_path(batch_id)}/cancel"
        return self._batch("POST", path, (await self.client.send("POST", path)).body)

    async def delete_files(self, batch_id: str) -> int:
        """Nothing to delete: a Message Batch takes its requests inline and keeps no files (its
        results stay at Anthropic until it expires them, 29 days on)."""
        return 0

    async def find(self, metadata: Mapping[str, str], *, newest: int = FIND_DEPTH) -> ProviderBatch | None:
        """The newest ended batch, among the `newest` the provider lists, one of whose custom_ids
        carries the tag of every pair of `metadata`, or None (a batch still running cannot be
        recognised: see the module docstring)."""
        wanted = {_tag(key, value) for key, value in metadata.items()}
        async for path, item in self._listing(newest):
            batch = self._batch("GET", path, item)
            if batch.ended and any(wanted <= tags for tags in await self._tags_of(batch.id)):
                return batch
        return None

    async def _tags_of(self, batch_id: str) -> tuple[frozenset[str], ...]:
        """The tags of each tagged custom_id of an ended batch, read once per batch: the jobs of
        one submission each ask `find` for it."""
        tags = self._tagged.get(batch_id)
        if tags is None:
            records = await self._records(batch_id)
            tags = tuple(frozenset(found) for sent, _ in records if (found := _tags(sent)))
            self._tagged[batch_id] = tags
            while len(self._tagged) > TAGS_CACHED:
                self._tagged.popitem(last=False)
        self._tagged.move_to_end(batch_id)
        return tags

    async def _listing(self, most: int) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        """The provider's batches, newest first, at most `most`, each with the path of its page."""
        after: str | None = None
        while most > 0:
            path = f"{BATCHES_PATH}?limit={min(most, LIST_PAGE)}"
            if after is not None:
                path += f"&after_id={quote(after, safe='')}"
            page = (await self.client.send("GET", path)).body
            data = page.get("data")
            items = [item for item in data if isinstance(item, dict)] if isinstance(data, list) else []
            for item in items:
                yield path, item
            most -= len(items)
            after = _text(page, "last_id")
            if after is None or not items or page.get("has_more") is not True:
                return

    # -- reading the provider's answers

    def _batch(self, method: str, path: str, body: dict[str, Any]) -> ProviderBatch:
        identifier, status = _text(body, "id"), _text(body, "processing_status")
        if identifier is None or status is None:
            raise self._malformed(method, path, "a message batch without an id and a processing_status")
        raw = body.get("request_counts")
        counts = {name: _count(raw, name) for name in ("processing", "succeeded", "errored", "canceled",
                                                        "expired")} if isinstance(raw, dict) else {}
        unrun = counts.get("canceled", 0) + counts.get("expired", 0)
        return ProviderBatch(identifier, _status(status, counts), None, None, sum(counts.values()),
                             counts.get("succeeded", 0), counts.get("errored", 0) + unrun)

    async def _records(self, batch_id: str) -> list[tuple[str, dict[str, Any]]]:
        """The `(custom_id, result)` records of an ended batch's results."""
        path = f"{_path(batch_id)}/results"
        records: list[tuple[str, dict[str, Any]]] = []
        for number, raw in enumerate((await self.client.download(path)).splitlines(), start=1):
            if not raw.strip():
                continue
            try:
                record = orjson.loads(raw)
            except orjson.JSONDecodeError:
                record = None
            custom_id = record.get("custom_id") if isinstance(record, dict) else None
            result = record.get("result") if isinstance(record, dict) else None
            if not isinstance(custom_id, str) or not isinstance(result, dict):
                raise self._malformed("GET", path, f"line {number} that is not a batch result")
            records.append((custom_id, result))
        return records

    def _malformed(self, method: str, path: str, what: str) -> UpstreamError:
        return UpstreamError(f"{self.client.provider.name}: {method} {path} answered {what}",
                             kind="malformed", status=200)


def _line_result(custom_id: str, result: dict[str, Any]) -> BatchLineResult:
    """One request's result in the job's form (see the module docstring)."""
    kind = result.get("type")
    message, error = result.get("message"), result.get("error")
    if kind == "succeeded" and isinstance(message, dict):
        return BatchLineResult(custom_id, 200, chat_completion(message))
    if kind == "errored" and isinstance(error, dict):
        detail = error.get("error")
        error_type = detail.get("type") if isinstance(detail, dict) else None
        return BatchLineResult(custom_id, _ERROR_STATUSES.get(str(error_type), 500), error)
    code, message_text = _UNRUN.get(str(kind), ("batch_line_missing", f"The batch answered {kind!r} for it."))
    return BatchLineResult(custom_id, 0, {"error": {"code": code, "message": message_text}})


def _status(processing: str, counts: Mapping[str, int]) -> str:
    """A Message Batch's processing status (and, once ended, its counts) as ProviderBatch's."""
    if processing != "ended":
        return _STATUSES.get(processing, processing)
    if counts.get("canceled", 0):
        return "cancelled"
    if counts.get("expired", 0) and not counts.get("succeeded", 0) and not counts.get("errored", 0):
        return "expired"
    return "completed"


def _tag(key: str, value: str) -> str:
    return hashlib.blake2b(f"{key}={value}".encode(), digest_size=TAG_BYTES).hexdigest()


def _tags(custom_id: str) -> set[str]:
    """The tags a custom_id carries (none for an untagged one)."""
    _, mark, tags = custom_id.rpartition(TAG_MARK)
    width = 2 * TAG_BYTES
    if not mark or len(tags) % width:
        return set()
    return {tags[i:i + width] for i in range(0, len(tags), width)}


def _untagged(custom_id: str) -> str:
    """The custom_id as the line had it, its tags stripped."""
    return custom_id.rpartition(TAG_MARK)[0] if _tags(custom_id) else custom_id


def _valid_custom_id(custom_id: str) -> bool:
    return 0 < len(custom_id) <= MAX_CUSTOM_ID and all(c.isascii() and (c.isalnum() or c in "_-")
                                                       for c in custom_id)


def _path(batch_id: str) -> str:
    return f"{BATCHES_PATH}/{quote(batch_id, safe='')}"


def _text(body: dict[str, Any], name: str) -> str | None:
    value = body.get(name)
    return value if isinstance(value, str) and value else None


def _count(counts: dict[str, Any], name: str) -> int:
    value = counts.get(name)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0
