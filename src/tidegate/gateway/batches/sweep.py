"""Every gateway's sweep: the batches nobody asks about still collect their answers and end, and
files past their `expires_at` are deleted.

A line's answer is read from its job, which the queue keeps only `finished_ttl_s` after it ends
(tidegate.gateway.batches.runs keeps each answer once seen). A client that polls its batch makes
that happen; the sweep makes it happen for the others: every `batch_sweep_s` it follows up to
`batch_sweep_limit` batches in progress, those checked longest ago first, so a round costs a
bounded time however many batches there are, and a batch waits its turn at most a few rounds.
Each round then deletes up to as many expired files (metadata and bytes), except the input file
of a batch still in progress, kept until the batch ends.

Several gateway replicas sweep the same store: each change of a batch's status is a
compare-and-set and each answer is written once, so two sweeps (or a sweep and a client's poll)
meeting on one batch agree, and a file deleted twice is deleted once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

from tidegate._shutdown import cancel_bounded
from tidegate.errors import ConfigError
from tidegate.gateway.batches.runs import READS_PER_CHECK, followed
from tidegate.gateway.core.state import GatewayState

__all__ = ["SweepReport", "check_sweep", "sweep_once", "sweeping"]

log = logging.getLogger("tidegate.gateway.batches")


@dataclass(frozen=True, slots=True)
class SweepReport:
    """What one round did: the batches it followed (of them, those it saw end) and the files it
    deleted."""

    followed: int = 0
    ended: int = 0
    deleted_files: int = 0


def check_sweep(state: GatewayState) -> None:
    """Refuse a sweep too slow for the queue's retention: the largest batch's lines, read
    READS_PER_CHECK a round, must all be read within half of `finished_ttl_s`, so no answer is
    dropped by the queue before a sweep has kept it."""
    settings = state.settings
    rounds = math.ceil(settings.max_batch_lines / READS_PER_CHECK)
    ttl_s = state.queue.settings.finished_ttl_s
    if settings.batch_sweep_s * rounds > ttl_s / 2:
        raise ConfigError(
            f"[gateway] batch_sweep_s ({settings.batch_sweep_s:g}) is too long for the queue's "
            f"finished_ttl_s ({ttl_s:g}): a batch of max_batch_lines ({settings.max_batch_lines}) lines "
            f"takes {rounds} sweeps to read, which must fit in half the retention; lower batch_sweep_s "
            f"to at most {ttl_s / 2 / rounds:g} or raise the queue's ?finished_ttl_s=")


async def sweep_once(state: GatewayState, *, now_s: float | None = None) -> SweepReport:
    """One round: follow the batches in progress checked longest ago, then delete the expired
    files (as of `now_s`, now by default) that no batch in progress reads."""
    limit = state.settings.batch_sweep_limit
    swept = ended = 0
    for batch in await state.batches.active_batches(limit):
        try:
            after = await followed(state, batch)
        except Exception:  # one batch's trouble (a record, a backend blip) must not stop the others
            log.exception("the sweep could not follow batch %s", batch.id)
            continue
        swept += 1
        ended += after.status != batch.status and after.status in ("completed", "expired", "cancelled")
    return SweepReport(followed=swept, ended=ended,
                       deleted_files=await _delete_expired(state, time.time() if now_s is None else now_s))


async def _delete_expired(state: GatewayState, now_s: float) -> int:
    """Delete up to `batch_sweep_limit` expired files, passing over the inputs of batches in
    progress (read past them, so that those never hold up the others)."""
    limit = state.settings.batch_sweep_limit
    expired = await state.batches.expired_files(now_s, limit)
    if not expired:
        return 0
    in_use = {batch.input_file_id for batch in await state.batches.active_batches()}
    if in_use:
        expired = await state.batches.expired_files(now_s, limit + len(in_use))
    deleted = 0
    for file in expired:
        if file.id not in in_use and deleted < limit:
            deleted += await state.batches.delete_file(file.id)
    return deleted


async def _sweep_forever(state: GatewayState) -> None:
    interval_s = state.settings.batch_sweep_s
    while True:
        await asyncio.sleep(interval_s)
        try:
            report = await sweep_once(state)
        except asyncio.CancelledError:
            raise
        except Exception:  # the sweep must outlive a passing backend error
            log.exception("the batch sweep failed; trying again in %gs", interval_s)
            continue
        if report.ended or report.deleted_files:
            log.info("batch sweep: %d batches followed, %d ended, %d expired files deleted",
                     report.followed, report.ended, report.deleted_files)


@contextlib.asynccontextmanager
async def sweeping(state: GatewayState) -> AsyncIterator[None]:
    """The gateway's sweep, every `batch_sweep_s` while inside (the first round one interval
    in); refuses settings too slow for the queue's retention (`check_sweep`)."""
    check_sweep(state)
    task = asyncio.create_task(_sweep_forever(state), name="tidegate-batch-sweep")
    try:
        yield
    finally:
        await cancel_bounded(task, "the batch sweep's stop")
