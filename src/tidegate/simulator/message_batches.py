"""Anthropic's Message Batches API, simulated: many Messages requests at once, answered later.

`POST /v1/messages/batches` takes `{"requests": [{"custom_id", "params"}]}` (custom ids unique,
1-64 of `[a-zA-Z0-9_-]`; `params` a Messages request) and runs it in the background: the batch
is `in_progress` for `batch_latency_s`, then `ended`, its results readable at its `results_url`
(`GET /v1/messages/batches/{id}/results`, JSONL, one `{"custom_id", "result"}` a request). A
cancel makes it `canceling`, then `ended`, the requests not answered by then `canceled`. The
`batch_fault` setting ends it with every request `errored` (failed: Anthropic fails requests, not
batches) or `expired`. `GET /v1/messages/batches` lists the newest first (`limit`, `after_id`,
`before_id`).

Each request is answered by the simulator's own Messages generation (the `AnswerLine` it hands
in, for MESSAGES_URL), outside the per-model rate limits, as OpenAI's batches are; a refusal
(unknown model, malformed params) is the request's `errored` result with its Anthropic error
body. Batches are counted in the same `BatchStats` as OpenAI's (their ends in OpenAI's words:
completed, cancelled, expired, failed). The key comes as `x-api-key` (or a Bearer token), and
errors are Anthropic-shaped.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import random
import re
import time
from collections.abc import Awaitable, Callable
from contextlib import suppress
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final

import orjson
from aiohttp import web

from tidegate.simulator.batches import LINES_PER_TURN, AnswerLine, BatchStats
from tidegate.simulator.messages import anthropic_error_body
from tidegate.simulator.requests import InvalidRequest, json_type, parse_json_object
from tidegate.simulator.settings import BatchFault, SimulatorSettings

__all__ = ["MESSAGES_URL", "MessageBatchService"]

logger = logging.getLogger(__name__)

MESSAGES_URL: Final = "/v1/messages"
WINDOW_S: Final = 24 * 3600
MAX_LIST_LIMIT: Final = 1000
DEFAULT_LIST_LIMIT: Final = 20
CUSTOM_ID: Final = re.compile(r"[a-zA-Z0-9_-]{1,64}")
OUTCOMES: Final = ("succeeded", "errored", "canceled", "expired")
# How each way of ending is counted in BatchStats.ended (the words of OpenAI's statuses).
_ENDS: Final = {"completed": "completed", "canceled": "cancelled", "expired": "expired", "failed": "failed"}
JSON: Final = "application/json"


@dataclass(slots=True)
class _MessageBatch:
    id: str
    requests: list[tuple[str, dict[str, Any]]]
    created_at: float
    fault: BatchFault | None
    status: str = "in_progress"
    cancel_initiated_at: float | None = None
    ended_at: float | None = None
    results: list[bytes] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(OUTCOMES, 0))
    cancel: asyncio.Event = field(default_factory=asyncio.Event)

    def to_json(self, origin: str) -> dict[str, Any]:
        ended = self.status == "ended"
        processing = 0 if ended else len(self.requests)
        return {
            "id": self.id, "type": "message_batch", "processing_status": self.status,
            "request_counts": {"processing": processing, **self.counts},
            "created_at": _moment(self.created_at), "expires_at": _moment(self.created_at + WINDOW_S),
            "ended_at": _moment(self.ended_at), "cancel_initiated_at": _moment(self.cancel_initiated_at),
            "archived_at": None,
            "results_url": f"{origin}/v1/messages/batches/{self.id}/results" if ended else None,
        }

    def add(self, custom_id: str, result: dict[str, Any]) -> None:
        """Record one request's result (counted only once the batch ended, as Anthropic does)."""
        self.results.append(orjson.dumps({"custom_id": custom_id, "result": result}))
        self.counts[result["type"]] += 1


_Handler = Callable[["MessageBatchService", web.Request], Awaitable[web.StreamResponse]]


def _endpoint(handler: _Handler) -> _Handler:
    """An endpoint of the API: the key is checked first, and an InvalidRequest the handler raises
    becomes its Anthropic-shaped answer."""

    @functools.wraps(handler)
    async def endpoint(service: MessageBatchService, request: web.Request) -> web.StreamResponse:
        try:
            if not service._authorized(request):
                raise InvalidRequest("invalid x-api-key", status=401)
            return await handler(service, request)
        except InvalidRequest as exc:
            return web.Response(status=exc.status, body=anthropic_error_body(exc.status, exc.message),
                                content_type=JSON)

    return endpoint


class MessageBatchService:
    """The Message Batches of one simulator and the handlers of their endpoints.

    `settings` gives the simulator's settings in force, `authorized` checks a request's key,
    `answer` answers one request (url MESSAGES_URL) and `stats` gives the BatchStats to count in.
    """

    def __init__(self, settings: Callable[[], SimulatorSettings], authorized: Callable[[web.Request], bool],
                 answer: AnswerLine, stats: Callable[[], BatchStats]) -> None:
        self._settings = settings
        self._authorized = authorized
        self._answer = answer
        self._stats = stats
        self._batches: dict[str, _MessageBatch] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._ids = random.Random(f"{settings().seed}:message_batches")

    def reset(self) -> None:
        """Restart the ids from the seed; batches stay."""
        self._ids = random.Random(f"{self._settings().seed}:message_batches")

    async def close(self) -> None:
        """Stop the batches still running (the simulator is stopping)."""
        tasks, self._tasks = self._tasks, set()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # -- endpoints

    @_endpoint
    async def create(self, request: web.Request) -> web.StreamResponse:
        """POST /v1/messages/batches."""
        requests = _requests(parse_json_object(await request.read()), self._settings().batch_max_lines)
        batch = _MessageBatch(f"msgbatch_{self._ids.getrandbits(96):024x}", requests, time.time(),
                              self._settings().batch_fault)
        self._batches[batch.id] = batch
        self._stats().created += 1
        task = asyncio.create_task(self._run(batch), name=f"simulated {batch.id}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return _json(batch.to_json(_origin(request)))

    @_endpoint
    async def retrieve(self, request: web.Request) -> web.StreamResponse:
        """GET /v1/messages/batches/{batch_id}."""
        return _json(self._batch(request).to_json(_origin(request)))

    @_endpoint
    async def results(self, request: web.Request) -> web.StreamResponse:
        """GET /v1/messages/batches/{batch_id}/results: the JSONL of an ended batch's results."""
        batch = self._batch(request)
        if batch.status != "ended":
            raise InvalidRequest(f"Message Batch {batch.id} has not yet ended: its results are not "
                                 "available.", status=400)
        return web.Response(body=b"".join(line + b"\n" for line in batch.results),
                            content_type="application/binary")

    @_endpoint
    async def cancel(self, request: web.Request) -> web.StreamResponse:
        """POST /v1/messages/batches/{batch_id}/cancel: a batch in progress becomes `canceling`;
        one canceling or ended is answered as it is."""
        batch = self._batch(request)
        if batch.status == "in_progress":
            batch.status = "canceling"
            batch.cancel_initiated_at = time.time()
            batch.cancel.set()
        return _json(batch.to_json(_origin(request)))

    @_endpoint
    async def list_batches(self, request: web.Request) -> web.StreamResponse:
        """GET /v1/messages/batches: the newest first, `limit` (1-1000, 20) at a time, after
        `after_id` (older) or before `before_id` (newer)."""
        newest = list(reversed(self._batches.values()))
        limit = _limit(request.query.get("limit", str(DEFAULT_LIST_LIMIT)))
        after, before = request.query.get("after_id"), request.query.get("before_id")
        if after is not None and before is not None:
            raise InvalidRequest("after_id and before_id cannot both be given.")
        if after is not None:
            newest = newest[_position(newest, after, "after_id") + 1:]
            page = newest[:limit]
        elif before is not None:
            newest = newest[:_position(newest, before, "before_id")]
            page = newest[-limit:]
        else:
            page = newest[:limit]
        data = [batch.to_json(_origin(request)) for batch in page]
        first, last = (data[0]["id"], data[-1]["id"]) if data else (None, None)
        return _json({"data": data, "has_more": len(newest) > limit, "first_id": first, "last_id": last})

    def _batch(self, request: web.Request) -> _MessageBatch:
        batch_id = request.match_info["batch_id"]
        batch = self._batches.get(batch_id)
        if batch is None:
            raise InvalidRequest(f"No Message Batch with id {batch_id!r}.", status=404)
        return batch

    # -- running a batch

    async def _run(self, batch: _MessageBatch) -> None:
        try:
            await self._steps(batch)
        except Exception:  # a fault of the simulator's own must not leave the batch running for ever
            logger.exception("simulated message batch %s failed", batch.id)
            answered = {orjson.loads(line)["custom_id"] for line in batch.results}
            for custom_id, _ in batch.requests:
                if custom_id not in answered:
                    batch.add(custom_id, _errored(500, "The simulator failed while running the batch."))
            self._end(batch, "failed")

    async def _steps(self, batch: _MessageBatch) -> None:
        with suppress(TimeoutError):
            async with asyncio.timeout(self._settings().batch_latency_s):
                await batch.cancel.wait()
        if batch.fault is not None and not batch.cancel.is_set():
            for custom_id, _ in batch.requests:
                batch.add(custom_id, {"type": "expired"} if batch.fault == "expired"
                          else _errored(500, "The request failed (a simulated fault)."))
            self._end(batch, batch.fault)
            return
        stats = self._stats()
        for number, (custom_id, params) in enumerate(batch.requests):
            if number % LINES_PER_TURN == 0 and number:
                await asyncio.sleep(0)
            if batch.cancel.is_set():
                batch.add(custom_id, {"type": "canceled"})
                continue
            answer = self._answer(MESSAGES_URL, params)
            stats.count(answer)
            batch.add(custom_id, {"type": "succeeded", "message": answer.body} if answer.status == 200
                      else {"type": "errored", "error": answer.body})
        self._end(batch, "canceled" if batch.cancel.is_set() else "completed")

    def _end(self, batch: _MessageBatch, how: str) -> None:
        batch.status = "ended"
        batch.ended_at = time.time()
        self._stats().ended[_ENDS[how]] += 1


def _requests(body: dict[str, Any], max_lines: int) -> list[tuple[str, dict[str, Any]]]:
    """The requests of a batch's creation, checked: their params are answered (or refused) one by
    one as the batch runs."""
    unknown = sorted(set(body) - {"requests"})
    if unknown:
        raise InvalidRequest(f"{unknown[0]}: Extra inputs are not permitted")
    requests = body.get("requests")
    if not isinstance(requests, list) or not requests:
        raise InvalidRequest("requests: expected a non-empty array of requests" if isinstance(requests, list)
                             else f"requests: Field required, an array (got {json_type(requests)})")
    if len(requests) > max_lines:
        raise InvalidRequest(f"requests: a batch holds at most {max_lines} requests, not {len(requests)}")
    checked: list[tuple[str, dict[str, Any]]] = []
    seen: set[str] = set()
    for index, item in enumerate(requests):
        custom_id = item.get("custom_id") if isinstance(item, dict) else None
        params = item.get("params") if isinstance(item, dict) else None
        if not isinstance(custom_id, str) or not CUSTOM_ID.fullmatch(custom_id):
            raise InvalidRequest(f"requests.{index}.custom_id: expected 1 to 64 letters, digits, '_' or '-'")
        if custom_id in seen:
            raise InvalidRequest(f"requests.{index}.custom_id: {custom_id!r} is used more than once; "
                                 "custom_id must be unique within a batch")
        if not isinstance(params, dict):
            raise InvalidRequest(f"requests.{index}.params: expected an object (a Messages request)")
        if params.get("stream") is True:
            raise InvalidRequest(f"requests.{index}.params.stream: a batched request cannot stream")
        seen.add(custom_id)
        checked.append((custom_id, params))
    return checked


def _errored(status: int, message: str) -> dict[str, Any]:
    return {"type": "errored", "error": orjson.loads(anthropic_error_body(status, message))}


def _position(batches: list[_MessageBatch], batch_id: str, param: str) -> int:
    for index, batch in enumerate(batches):
        if batch.id == batch_id:
            return index
    raise InvalidRequest(f"{param}: no Message Batch with id {batch_id!r}.")


def _limit(value: str) -> int:
    try:
        limit = int(value)
    except ValueError:
        limit = 0
    if not 1 <= limit <= MAX_LIST_LIMIT:
        raise InvalidRequest(f"limit: expected an integer from 1 to {MAX_LIST_LIMIT}")
    return limit


def _moment(at: float | None) -> str | None:
    """An RFC 3339 time, as Anthropic writes them."""
    return None if at is None else datetime.fromtimestamp(at, UTC).isoformat().replace("+00:00", "Z")


def _origin(request: web.Request) -> str:
    return str(request.url.origin())


def _json(body: dict[str, Any]) -> web.Response:
    return web.Response(status=200, body=orjson.dumps(body), content_type=JSON)
