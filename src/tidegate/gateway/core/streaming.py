"""Relaying a streamed completion to the client as server-sent events, in any dialect.

The worker that calls the provider publishes each chunk to the relay under the job's id; the
gateway subscribes and writes each as the call's dialect frames it (`data: <chunk>` for OpenAI's),
then the dialect's end (`data: [DONE]`). The job itself is watched at the same time, because some
endings publish nothing: a job that dies before its first chunk (a refused request), is
cancelled or expires. Until the first chunk arrives nothing has been sent, so such an ending
still gets a proper HTTP error status; after it, an error frame.

A worker without a relay stores the whole answer instead of streaming it; the gateway then
sends that answer as the chunks of one stream, so a streaming client is served either way.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

from fastapi.responses import StreamingResponse

from tidegate.ai import StreamPart, result_of
from tidegate.coord.relay import ChunkRelay
from tidegate.gateway.core.dialect import Dialect, StreamRenderer
from tidegate.gateway.core.errors import ApiError
from tidegate.gateway.core.intake import Submitted
from tidegate.gateway.core.outcomes import failure_of, left_waiting
from tidegate.gateway.core.state import GatewayState
from tidegate.jobs import Job, JobState, Priority
from tidegate.queue import Queue

__all__ = ["stream_job"]

# Once the job is final, every chunk it streamed is already in the relay; this is how long to
# wait for them to be read before deciding the stream is over.
END_GRACE_S = 0.25


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


async def stream_job(state: GatewayState, dialect: Dialect, submitted: Submitted, *,
                     started: float) -> StreamingResponse:
    """The SSE response relaying the job's chunks, in `dialect`'s frames. Raises ApiError (an
    HTTP error status) when the job ends badly or the wait runs out before its first chunk."""
    job_id, timeout_s = submitted.job_id, submitted.timeout_s
    renderer = dialect.stream(submitted.request)
    relayed = RelayedStream(state.queue, state.relay, job_id, timeout_s)
    live: RelayedStream | None = relayed
    try:
        first = await relayed.next()
    except StreamEnded as ended:
        await relayed.aclose()
        if ended.job.state is not JobState.SUCCEEDED:
            await left_waiting(state, ended.job)
            raise failure_of(ended.job, timeout_s) from None
        result = result_of(ended.job)
        state.recent.record(ended.job, result)
        head, live = [] if result is None else renderer.whole_answer(result, job_id), None
    except TimeoutError:
        await relayed.aclose()
        job = await state.queue.get(job_id)
        if job is None:
            raise ApiError(504, "no answer in time", code="timeout", job_id=job_id) from None
        await left_waiting(state, job)
        raise failure_of(job, timeout_s) from None
    except BaseException:
        await relayed.aclose()
        raise
    else:
        head = [] if first is None else [StreamPart.decode(first)]
    relay = _Relay(state, live, renderer, priority=submitted.priority, started=started)
    headers = {"X-Tidegate-Job-Id": job_id, "X-Tidegate-Priority": submitted.priority.name.lower(),
               "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    model = head[0].model if head else None
    if model is not None:
        headers["X-Tidegate-Model"] = model
    return StreamingResponse(relay.events(head, timeout_s), media_type="text/event-stream",
                             headers=headers)


class _Relay:
    """Writes one job's parts as SSE events: rendered, timed, ended by the dialect's end or an
    error."""

    def __init__(self, state: GatewayState, stream: RelayedStream | None, renderer: StreamRenderer, *,
                 priority: Priority, started: float) -> None:
        self._state = state
        self._stream = stream
        self._renderer = renderer
        self._ttft = state.metrics.ttft.labels(priority.name.lower())
        self._started = started

    def _event(self, part: StreamPart) -> bytes | None:
        had_content = self._renderer.saw_content
        frame = self._renderer.frame(part)
        if self._renderer.saw_content and not had_content:
            self._ttft.observe(time.perf_counter() - self._started)
        return frame

    async def events(self, head: list[StreamPart], timeout_s: float) -> AsyncIterator[bytes]:
        """The SSE body: the parts already read, the rest as they arrive, then the end."""
        try:
            for part in head:
                if (event := self._event(part)) is not None:
                    yield event
            if self._stream is not None:
                async for event in self._rest(self._stream, timeout_s):
                    yield event
            if not self._renderer.failed:
                yield self._renderer.end_frame()
        finally:
            if self._stream is not None:
                await self._stream.aclose()

    async def _rest(self, stream: RelayedStream, timeout_s: float) -> AsyncIterator[bytes]:
        while True:
            try:
                chunk = await stream.next()
            except StreamEnded as ended:
                if ended.job.state is not JobState.SUCCEEDED:
                    await left_waiting(self._state, ended.job)
                    yield self._renderer.error_frame(failure_of(ended.job, timeout_s))
                return
            except TimeoutError:
                silent = ApiError(504, f"no chunk within {timeout_s:g}s", code="timeout")
                yield self._renderer.error_frame(silent)
                return
            if chunk is None:
                job = await stream.settled_job()
                if job is not None:
                    self._state.recent.record(job, result_of(job))
                return
            if (event := self._event(StreamPart.decode(chunk))) is not None:
                yield event
