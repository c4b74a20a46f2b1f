"""A batch's life: made (its lines read, checked and enqueued as jobs), followed (its progress
read from its jobs, each line's answer kept as its job is seen ended) and ended (finalized into
its output and error files), or cancelled.

Every line is a tidegate job of the batch's tenant, at the batch's priority (bulk by default),
with the completion window as its deadline: paced, budgeted, retried and dead-lettered like every
job, and overtaken by interactive traffic at a higher priority.

The queue keeps a finished job only for its retention (`finished_ttl_s`), shorter than a batch
may run or wait to be asked about, so a line's answer is copied into the batch store the moment
its job is seen ended (`BatchStore.put_answers`, written once per line), and the batch's files
are made from those copies. Who follows: whichever gateway is asked about the batch (retrieve,
list, cancel), and every gateway's sweep (tidegate.gateway.batches.sweep) for the batches nobody
asks about. Any replica can finish what another began: the output files get ids derived from
the batch's id and identical contents wherever they are written, and each change of status is a
compare-and-set (`BatchStore.swap_batch`), so two replicas finalizing at once agree. Reading a
batch's jobs costs one read per job, so a check reads at most READS_PER_CHECK jobs not yet seen
ended, the lines remember the jobs seen ended, and a batch is checked at most once per
`batch_progress_s` (a gateway setting); between two checks the stored counts answer.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import logging
import secrets
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Final, TypeVar

from tidegate.coord.tenants import Tenant
from tidegate.gateway.batches.lines import (
    SERVED_ENDPOINTS,
    ParsedLine,
    answer_lines,
    line_answer,
    parse_lines,
)
from tidegate.gateway.batches.schemas import BatchRequest
from tidegate.gateway.batches.store import (
    ACTIVE,
    BatchLine,
    BatchRecord,
    LineAnswer,
    RequestCounts,
    StoredFile,
)
from tidegate.gateway.core.errors import ApiError
from tidegate.gateway.core.intake import enqueue, header_priority, resolve_priority
from tidegate.gateway.core.state import GatewayState
from tidegate.jobs import FINAL_STATES, Job, JobState, Priority, now_ms

__all__ = ["CHUNK_JOBS", "READS_PER_CHECK", "cancel_batch", "create_batch", "followed"]

log = logging.getLogger("tidegate.gateway.batches")

CHUNK_JOBS: Final = 200  # jobs per enqueue: each chunk one atomic write, none holding the loop long
READ_CONCURRENCY: Final = 64  # job reads in flight while a batch's progress is read
# Jobs read at most per progress check: a check costs a bounded time whatever the batch's size.
READS_PER_CHECK: Final = 2_000
_FINAL_BATCH: Final = frozenset({"completed", "failed", "expired", "cancelled"})
_NOT_STARTED: Final = frozenset({JobState.QUEUED, JobState.DELAYED, JobState.FAILED})
# A batch left `validating` this long was left by a create that stopped: the same create
# (its Idempotency-Key) resumes it.
VALIDATING_STALE_S: Final = 300
# A batch left `finalizing` this long is finalized again by whoever asks: its finalizer stopped.
FINALIZE_TAKEOVER_S: Final = 120

T = TypeVar("T")


def _window_s(window: str) -> int:
    return int(window.removesuffix("h")) * 3600


def _batch_id(tenant: Tenant, idempotency_key: str | None) -> str:
    """A fresh id; with an Idempotency-Key, one derived from it, so a repeated create finds the
    first batch (and its jobs: their keys derive from the batch's id) instead of doubling them."""
    if idempotency_key is None:
        return f"batch_{secrets.token_hex(16)}"
    digest = hashlib.sha256(f"{tenant.name}\0{idempotency_key}".encode()).hexdigest()
    return f"batch_{digest[:32]}"


def _job_key(tenant: Tenant, batch_id: str, custom_id: str) -> str:
    digest = hashlib.sha256(custom_id.encode()).hexdigest()[:32]
    return f"{tenant.name}:{batch_id}:{digest}"


async def create_batch(state: GatewayState, tenant: Tenant, body: BatchRequest, *,
                       priority_header: str | None, idempotency_key: str | None) -> BatchRecord:
    """Check the request, read its file, enqueue its good lines in chunks and store the batch.
    A request refused as a whole (endpoint, file, priority, too many lines) leaves nothing."""
    served = [endpoint for endpoint, kind in SERVED_ENDPOINTS.items()
              if kind in ("chat", "embeddings") or state.offers(kind)]
    if body.endpoint not in served:
        raise ApiError(400, f"endpoint {body.endpoint!r} is not served by batches: use one of "
                       f"{', '.join(served)}", code="unsupported_endpoint", param="endpoint")
    priority = resolve_priority(tenant, header_priority(priority_header), body.priority, Priority.BULK)
    file = await state.batches.get_file(body.input_file_id)
    if file is None or file.tenant != tenant.name or file.expired(time.time()):
        raise ApiError(404, f"no file with id {body.input_file_id!r}", code="file_not_found",
                       param="input_file_id")
    if file.purpose != "batch":
        raise ApiError(400, f"file {file.id!r} was uploaded for {file.purpose!r}, not 'batch'",
                       code="invalid_file_purpose", param="input_file_id")
    batch_id = _batch_id(tenant, idempotency_key)
    known = await state.batches.get_batch(batch_id)
    if known is not None and not _abandoned(_repeated(known, body)):
        return known
    content = await state.batches.file_content(file.id) or b""
    limit = state.settings.max_batch_lines
    count = sum(1 for raw in content.split(b"\n") if raw.strip())
    if count > limit:
        raise ApiError(400, f"the file has {count} lines, over the limit of {limit} per batch",
                       code="too_many_lines", param="input_file_id")
    parsed = await parse_lines(state, tenant, content, endpoint=body.endpoint, priority=priority)
    if not parsed:
        raise ApiError(400, f"file {file.id!r} holds no request", code="empty_file", param="input_file_id")
    # A create resumed (its first call stopped before the batch began) keeps its time and window:
    # the jobs it had written are found again by their keys, never doubled.
    created = int(time.time()) if known is None else known.created_at
    record = BatchRecord(
        id=batch_id, tenant=tenant.name, priority=int(priority), input_file_id=file.id,
        endpoint=body.endpoint, completion_window=body.completion_window, status="validating",
        created_at=created, expires_at=created + _window_s(body.completion_window), metadata=body.metadata,
        request_counts=RequestCounts(total=len(parsed)))
    if known is None and not await state.batches.insert_batch(record):
        known = await state.batches.get_batch(batch_id)  # the same create, repeated at once
        assert known is not None
        return _repeated(known, body)
    return await _start(state, tenant, record, parsed)


def _abandoned(batch: BatchRecord) -> bool:
    """Whether a batch was left `validating` by a create that stopped (a gateway that died)."""
    return batch.status == "validating" and time.time() - batch.created_at > VALIDATING_STALE_S


async def _start(state: GatewayState, tenant: Tenant, record: BatchRecord,
                 parsed: list[ParsedLine]) -> BatchRecord:
    """Enqueue the checked lines, store them, and start the batch (or fail it: no good line)."""
    lines = await _enqueue_lines(state, tenant, record, parsed)
    await state.batches.put_lines(record.id, lines)
    errors = [line.error for line in lines if line.error is not None]
    now = int(time.time())
    if all(line.job_id is None for line in lines):
        ended = record.update(status="failed", failed_at=now, errors=errors[:100],
                              request_counts=RequestCounts(total=len(lines), failed=len(lines)))
    else:
        ended = record.update(status="in_progress", in_progress_at=now,
                              request_counts=RequestCounts(total=len(lines), failed=len(errors)))
    await state.batches.swap_batch(ended, "validating")
    return ended


def _repeated(known: BatchRecord, body: BatchRequest) -> BatchRecord:
    if (known.input_file_id, known.endpoint) != (body.input_file_id, body.endpoint):
        raise ApiError(409, "the Idempotency-Key was first used for another batch: repeat the same "
                       "request to get it, or use a new key", code="idempotency_key_reused",
                       param="Idempotency-Key")
    return known


async def _enqueue_lines(state: GatewayState, tenant: Tenant, record: BatchRecord,
                         parsed: list[ParsedLine]) -> list[BatchLine]:
    """Enqueue the good lines in chunks, each with the batch's deadline and a key derived from
    the batch and its custom_id; if the queue refuses a chunk (full), the chunks already written
    are cancelled and the batch fails, so a refused batch leaves no work behind."""
    good = [(line.custom_id, line.draft) for line in parsed
            if line.draft is not None and line.custom_id is not None]
    job_ids: dict[str, str] = {}
    try:
        for start in range(0, len(good), CHUNK_JOBS):
            chunk = good[start:start + CHUNK_JOBS]
            left_s = max(record.expires_at * 1000 - now_ms(), 1) / 1000
            drafts = [dataclasses.replace(draft, timeout_s=left_s,
                                          idempotency_key=_job_key(tenant, record.id, custom_id))
                      for custom_id, draft in chunk]
            ids = await enqueue(state, tenant, drafts, derived_keys=True)
            job_ids.update({custom_id: job_id for (custom_id, _), job_id in zip(chunk, ids, strict=True)})
    except BaseException:
        await _bounded(state.queue.cancel, job_ids.values())
        failed = record.update(status="failed", failed_at=int(time.time()),
                               request_counts=RequestCounts(total=len(parsed), failed=len(parsed)))
        await state.batches.swap_batch(failed, "validating")
        raise
    return [BatchLine(custom_id=line.custom_id, error=line.error,
                      job_id=job_ids.get(line.custom_id or "") if line.error is None else None)
            for line in parsed]


async def _bounded(call: Callable[[str], Awaitable[T]], ids: Iterable[str]) -> list[T]:
    """`call(id)` for every id, READ_CONCURRENCY at a time, in order."""
    ids = list(ids)
    results: list[T] = []
    for start in range(0, len(ids), READ_CONCURRENCY):
        chunk = ids[start:start + READ_CONCURRENCY]
        results.extend(await asyncio.gather(*(call(job_id) for job_id in chunk)))
    return results


async def _jobs_of(state: GatewayState, lines: Sequence[BatchLine]) -> dict[str, Job | None]:
    ids = [line.job_id for line in lines if line.job_id is not None]
    return dict(zip(ids, await _bounded(state.queue.get, ids), strict=True))


async def followed(state: GatewayState, batch: BatchRecord, *, force: bool = False) -> BatchRecord:
    """The batch with its progress brought up to date (at most every `batch_progress_s` unless
    `force`), finalized when every job is final."""
    if batch.status not in ACTIVE:
        return batch
    if batch.status == "finalizing" and time.time() - (batch.finalizing_at or 0) < FINALIZE_TAKEOVER_S:
        return batch  # another call is writing its files
    every_ms = state.settings.batch_progress_s * 1000
    if not force and batch.status != "finalizing" and now_ms() - batch.checked_ms < every_ms:
        return batch
    lines = await _seen_ended(state, batch, await state.batches.get_lines(batch.id))
    counts = _counts(lines)
    if any(_running(line) for line in lines):
        updated = batch.update(request_counts=counts, checked_ms=now_ms())
        if await state.batches.swap_batch(updated, batch.status):
            return updated
        return await _stored(state, batch)
    return await _finalize(state, batch, lines)


def _running(line: BatchLine) -> bool:
    return line.job_id is not None and line.ended is None


async def _seen_ended(state: GatewayState, batch: BatchRecord, lines: list[BatchLine]) -> list[BatchLine]:
    """The lines with the final state of up to READS_PER_CHECK more of their jobs, oldest first
    (the queue serves one level first in, first out, so those are the likeliest to have ended).
    The answers of those ended are recorded first, then the lines, so no check reads a finished
    job again and no answer depends on the queue still keeping its job. Two replicas storing the
    lines at once may lose each other's news: the next check reads it again, and an answer
    already recorded stays as it was (even if the job is gone by then)."""
    unknown = [index for index, line in enumerate(lines) if _running(line)][:READS_PER_CHECK]
    jobs = await _bounded(state.queue.get, [lines[index].job_id or "" for index in unknown])
    answers: dict[str, LineAnswer] = {}
    for index, job in zip(unknown, jobs, strict=True):
        if job is None or job.state in FINAL_STATES:
            ended = "gone" if job is None else job.state.value
            line = lines[index] = lines[index].model_copy(update={"ended": ended})
            answers[line.custom_id or ""] = line_answer(line, job)
    if answers:
        await state.batches.put_answers(batch.id, answers)
        await state.batches.put_lines(batch.id, lines)
    return lines


def _counts(lines: list[BatchLine]) -> RequestCounts:
    completed = sum(1 for line in lines if line.ended == JobState.SUCCEEDED.value)
    ended = sum(1 for line in lines if line.ended is not None or line.job_id is None)
    return RequestCounts(total=len(lines), completed=completed, failed=ended - completed)


async def _stored(state: GatewayState, batch: BatchRecord) -> BatchRecord:
    stored = await state.batches.get_batch(batch.id)
    return stored if stored is not None else batch


async def _finalize(state: GatewayState, batch: BatchRecord, lines: list[BatchLine]) -> BatchRecord:
    """Write the output and error files from the lines' recorded answers, then end the batch:
    cancelled if it was being cancelled, expired if a line ran out of its window, completed
    otherwise; its answers, now in its files, are dropped."""
    now = int(time.time())
    answers = await state.batches.get_answers(batch.id)
    output, errors = answer_lines(lines, answers)
    # Counted by the answers, as the files are: a line whose end was stored by one replica and
    # lost by another's write of the lines, then seen "gone", is still answered.
    completed = sum(1 for answer in answers.values() if answer.output)
    counts = RequestCounts(total=len(lines), completed=completed, failed=len(lines) - completed)
    if batch.status != "finalizing":
        finalizing = batch.update(status="finalizing", finalizing_at=now, request_counts=counts)
        if not await state.batches.swap_batch(finalizing, batch.status):
            return await _stored(state, batch)  # cancelled or finalized meanwhile: theirs stands
        batch = finalizing
    suffix = batch.id.removeprefix("batch_")
    output_id = await _write(state, batch, f"file-{suffix}-output", "batch_output_output.jsonl", output)
    error_id = await _write(state, batch, f"file-{suffix}-errors", "batch_output_errors.jsonl", errors)
    if batch.cancelling_at is not None:
        ended = batch.update(status="cancelled", cancelled_at=now)
    elif any(line.ended == JobState.EXPIRED.value for line in lines):
        ended = batch.update(status="expired", expired_at=now)
    else:
        ended = batch.update(status="completed", completed_at=now)
    ended = ended.update(output_file_id=output_id, error_file_id=error_id, request_counts=counts)
    if not await state.batches.swap_batch(ended, "finalizing"):
        return await _stored(state, batch)
    await state.batches.drop_answers(batch.id)
    return ended


async def _write(state: GatewayState, batch: BatchRecord, file_id: str, filename: str,
                 content: bytes) -> str | None:
    """Store a generated file, unless one of its id exists: written by an earlier finalizer of
    the batch, from the same answers, before it could drop them (a finalizer taking over late
    may read them dropped, and must not write what it would make of that)."""
    if not content:
        return None
    if await state.batches.get_file(file_id) is not None:
        return file_id
    now = int(time.time())
    retention_s = state.settings.batch_output_retention_s
    await state.batches.put_file(StoredFile(
        id=file_id, tenant=batch.tenant, filename=filename, purpose="batch_output", bytes=len(content),
        created_at=now, expires_at=None if retention_s is None else now + retention_s), content)
    return file_id


async def cancel_batch(state: GatewayState, batch: BatchRecord) -> BatchRecord:
    """Cancel the batch's jobs not yet started; started ones finish and are in its output file.
    The batch is `cancelling` until they have, then `cancelled`."""
    if batch.status in _FINAL_BATCH or batch.status == "finalizing":
        raise ApiError(409, f"batch {batch.id!r} is {batch.status}: only a batch in progress can be "
                       "cancelled", code="batch_not_cancellable", param="batch_id")
    if batch.status == "validating":
        raise ApiError(409, f"batch {batch.id!r} is still being validated: cancel it once it is in "
                       "progress", code="batch_not_cancellable", param="batch_id")
    if batch.status == "in_progress":
        cancelling = batch.update(status="cancelling", cancelling_at=int(time.time()))
        if not await state.batches.swap_batch(cancelling, "in_progress"):
            return await cancel_batch(state, await _stored(state, batch))
        batch = cancelling
    lines = [line for line in await state.batches.get_lines(batch.id) if _running(line)]
    jobs = await _jobs_of(state, lines)
    # A job claimed between this read and its cancel is cancelled while it runs (its answer is
    # then discarded): the window is one round trip, and the line says it was cancelled.
    waiting = [job_id for job_id, job in jobs.items() if job is not None and job.state in _NOT_STARTED]
    await _bounded(state.queue.cancel, waiting)
    return await followed(state, batch, force=True)

