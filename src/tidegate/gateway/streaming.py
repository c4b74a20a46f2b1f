"""Relaying a streamed completion to the client as server-sent events.

The worker that calls the provider publishes each chunk to the relay under the job's id; the
gateway subscribes and writes `data: <chunk>` for each, then `data: [DONE]`. The job itself is
watched at the same time, because some endings publish nothing: a job that dies before its first
chunk (a refused request), is cancelled or expires. Until the first chunk arrives nothing has
been sent, so such an ending still gets a proper HTTP error status; after it, an error event.

A worker without a relay stores the whole answer instead of streaming it; the gateway then
sends that answer as one content chunk, so a streaming client is served either way.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import orjson
from fastapi.responses import StreamingResponse

from tidegate.coord.relay import ChunkRelay
from tidegate.gateway.errors import ApiError, error_body
from tidegate.gateway.outcomes import failure_of
from tidegate.gateway.state import GatewayState
from tidegate.jobs import Job, JobState, Priority
from tidegate.queue import Queue

__all__ = ["stream_job"]

# Once the job is final, every chunk it streamed is already in the relay; this is how long to
# wait for them to be read before deciding the stream is over.
END_GRACE_S = 0.25
DONE = b"data: [DONE]\n\n"


class StreamEnded(Exception):
    """The job stopped (or the wait ran out) without its stream being finished."""

    def __init__(self, job: Job) -> None:
        super().__init__(job.state.value)
        self.job = job


class RelayedStream:
    """One job's chunks from the relay, read against the job's own end."""

    def __init__(self, queue: Queue, relay: ChunkRelay, job_id: str, timeout_s: float) -> None:
        self._queue = queue
        self._job_id = job_id
        self._timeout_s = timeout_s
        self._chunks = relay.subscribe(job_id, timeout_s=timeout_s)
        self._final = asyncio.create_task(queue.wait(job_id, timeout_s))
        self._pending: asyncio.Task[bytes | None] | None = None
        self._received = 0

    async def _read(self) -> bytes | None:
        try:
            return await anext(self._chunks)
        except StopAsyncIteration:
            return None

    async def next(self) -> bytes | None:
        """The next chunk, or None after the last. Raises StreamEnded when the job ended with no
        further chunk, or when the wait ran out before the first chunk; TimeoutError when the
        relay stayed silent for the timeout."""
        if self._pending is None:
            self._pending = asyncio.create_task(self._read())
        while not self._pending.done():
            if self._final.done():
                job = self._final.result()
                if job.is_final:
                    await asyncio.wait({self._pending}, timeout=END_GRACE_S)
                    if not self._pending.done():
                        raise StreamEnded(job)
                    break
                if not self._received:
                    raise StreamEnded(job)
                # A stream under way may outlast one wait: keep watching the job, while the
                # relay's own timeout catches a stream that falls silent.
                self._final = asyncio.create_task(self._queue.wait(self._job_id, self._timeout_s))
            await asyncio.wait({self._pending, self._final}, return_when=asyncio.FIRST_COMPLETED)
        pending, self._pending = self._pending, None
        chunk = pending.result()
        if chunk is not None:
            self._received += 1
        return chunk

    async def settled_job(self) -> Job | None:
        """The job once final, after its stream ended: the worker completes it right after the
        last chunk, so this waits briefly for that. None if it does not come."""
        await asyncio.wait({self._final}, timeout=END_GRACE_S)
        if self._final.done() and not self._final.cancelled() and self._final.exception() is None:
            job = self._final.result()
            return job if job.is_final else None
        return None

    async def aclose(self) -> None:
        """Stop reading and watching."""
        for task in (self._pending, self._final):
            if task is not None and not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        close = getattr(self._chunks, "aclose", None)
        if close is not None:
            with contextlib.suppress(Exception):
                await close()


def _event(data: bytes) -> bytes:
    return b"data: " + data + b"\n\n"


def _error_event(error: ApiError) -> bytes:
    # The same shape as every other error answer, a code always present.
    body = error_body(error)
    body["code"] = body["code"] or "stream_failed"
    return _event(orjson.dumps({"error": body}))


def _model_of(chunk: bytes) -> str | None:
    try:
        document = orjson.loads(chunk)
    except orjson.JSONDecodeError:
        return None
    model = document.get("model") if isinstance(document, dict) else None
    return model if isinstance(model, str) else None


def _whole_answer_chunks(job: Job, include_usage: bool) -> list[bytes]:
    """A stored (non-streamed) chat completion as chunks: the content, then the finish."""
    response = job.result.get("response") if isinstance(job.result, dict) else None
    if not isinstance(response, dict):
        return []
    head = {"id": response.get("id", f"chatcmpl-{job.id}"), "object": "chat.completion.chunk",
            "created": response.get("created", int(time.time())), "model": response.get("model")}
    chunks: list[bytes] = []
    for choice in response.get("choices") or []:
        message = choice.get("message") or {}
        delta = {key: value for key, value in message.items() if value is not None}
        index = choice.get("index", 0)
        chunks.append(orjson.dumps({**head, "choices": [
            {"index": index, "delta": delta, "logprobs": None, "finish_reason": None}]}))
        chunks.append(orjson.dumps({**head, "choices": [
            {"index": index, "delta": {}, "logprobs": None, "finish_reason": choice.get("finish_reason")}]}))
    if include_usage and isinstance(response.get("usage"), dict):
        chunks.append(orjson.dumps({**head, "choices": [], "usage": response["usage"]}))
    return chunks


class _ChunkFilter:
    """Looks into each chunk: marks the first content (time to first token), spots an error
    chunk, and drops the usage-only chunk the worker always asks for when the client did not."""

    def __init__(self, include_usage: bool) -> None:
        self.include_usage = include_usage
        self.saw_content = False
        self.saw_error = False

    def keep(self, chunk: bytes) -> bytes | None:
        """The chunk to relay (an error chunk in the API's full error shape), or None to drop it."""
        try:
            document = orjson.loads(chunk)
        except orjson.JSONDecodeError:
            return chunk  # not ours to judge: relay it as the provider sent it
        if not isinstance(document, dict):
            return chunk
        if "error" in document:
            self.saw_error = True
            return _complete_error(document["error"])
        choices = document.get("choices")
        if choices == [] and "usage" in document and not self.include_usage:
            return None
        if not self.saw_content and isinstance(choices, list):
            self.saw_content = any(
                isinstance(choice, dict) and isinstance(choice.get("delta"), dict)
                and bool(choice["delta"].get("content"))
                for choice in choices
            )
        return chunk


def _complete_error(error: object) -> bytes:
    """An error chunk (the worker's, or the provider's own mid-stream error) with every field of
    the API's error shape and a code, so an SDK reading it sees what a non-streamed call would."""
    given = error if isinstance(error, dict) else {"message": str(error)}
    body = {"message": str(given.get("message") or "the stream failed"),
            "type": str(given.get("type") or "upstream_error"),
            "param": given.get("param") if isinstance(given.get("param"), str) else None,
            "code": str(given.get("code") or "stream_failed")}
    return orjson.dumps({"error": {**given, **body}})


async def stream_job(
    state: GatewayState,
    job_id: str,
    priority: Priority,
    body: dict[str, Any],
    *,
    timeout_s: float,
    started: float,
) -> StreamingResponse:
    """The SSE response relaying the job's chunks. Raises ApiError (an HTTP error status) when the
    job ends badly or the wait runs out before its first chunk."""
    options = body.get("stream_options")
    include_usage = isinstance(options, dict) and bool(options.get("include_usage"))
    relayed = RelayedStream(state.queue, state.relay, job_id, timeout_s)
    live: RelayedStream | None = relayed
    try:
        first = await relayed.next()
    except StreamEnded as ended:
        await relayed.aclose()
        if ended.job.state is not JobState.SUCCEEDED:
            raise failure_of(ended.job, timeout_s) from None
        state.recent.record(ended.job)
        head, live = _whole_answer_chunks(ended.job, include_usage), None
    except TimeoutError:
        await relayed.aclose()
        job = await state.queue.get(job_id)
        if job is None:
            raise ApiError(504, "no answer in time", code="timeout", job_id=job_id) from None
        raise failure_of(job, timeout_s) from None
    except BaseException:
        await relayed.aclose()
        raise
    else:
        head = [] if first is None else [first]
    relay = _Relay(state, live, include_usage, priority=priority, started=started)
    headers = {"X-Tidegate-Job-Id": job_id, "X-Tidegate-Priority": priority.name.lower(),
               "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    model = _model_of(head[0]) if head else None
    if model is not None:
        headers["X-Tidegate-Model"] = model
    return StreamingResponse(relay.events(head, timeout_s), media_type="text/event-stream",
                             headers=headers)


class _Relay:
    """Writes one job's chunks as SSE events: filtered, timed, ended with [DONE] or an error."""

    def __init__(self, state: GatewayState, stream: RelayedStream | None, include_usage: bool, *,
                 priority: Priority, started: float) -> None:
        self._state = state
        self._stream = stream
        self._filter = _ChunkFilter(include_usage)
        self._ttft = state.metrics.ttft.labels(priority.name.lower())
        self._started = started

    def _event(self, chunk: bytes) -> bytes | None:
        had_content = self._filter.saw_content
        kept = self._filter.keep(chunk)
        if kept is None:
            return None
        if self._filter.saw_content and not had_content:
            self._ttft.observe(time.perf_counter() - self._started)
        return _event(kept)

    async def events(self, head: list[bytes], timeout_s: float) -> AsyncIterator[bytes]:
        """The SSE body: the chunks already read, the rest as they arrive, then the end."""
        try:
            for chunk in head:
                if (event := self._event(chunk)) is not None:
                    yield event
            if self._stream is not None:
                async for event in self._rest(self._stream, timeout_s):
                    yield event
            if not self._filter.saw_error:
                yield DONE
        finally:
            if self._stream is not None:
                await self._stream.aclose()

    async def _rest(self, stream: RelayedStream, timeout_s: float) -> AsyncIterator[bytes]:
        while True:
            try:
                chunk = await stream.next()
            except StreamEnded as ended:
                if ended.job.state is not JobState.SUCCEEDED:
                    self._filter.saw_error = True
                    yield _error_event(failure_of(ended.job, timeout_s))
                return
            except TimeoutError:
                self._filter.saw_error = True
                yield _error_event(ApiError(504, f"no chunk within {timeout_s:g}s", code="timeout"))
                return
            if chunk is None:
                job = await stream.settled_job()
                if job is not None:
                    self._state.recent.record(job)
                return
            if (event := self._event(chunk)) is not None:
                yield event
