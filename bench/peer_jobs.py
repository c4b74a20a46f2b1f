"""The no-op job of each peer, importable by name (arq and RQ workers look jobs up by path).

Each job only records that it ran, so the benchmark can verify that every enqueued job was
processed exactly as often as it should be, without a Redis round trip of its own (which would
slow the peers down compared with tidegate's no-op path).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from saq.types import Context


class Tally:
    """Jobs run in this process: how many, which, and an event set when all expected have run."""

    def __init__(self) -> None:
        self.expected = 0
        self.count = 0
        self.seen: set[int] = set()
        self.done: asyncio.Event | None = None

    def reset(self, expected: int, *, with_event: bool = True) -> None:
        """Start counting afresh; the event (made in the running loop) fires at `expected`."""
        self.expected = expected
        self.count = 0
        self.seen = set()
        self.done = asyncio.Event() if with_event else None

    def record(self, n: int) -> None:
        """Note one run of the job with payload `n`."""
        self.count += 1
        self.seen.add(n)
        if self.done is not None and self.count >= self.expected:
            self.done.set()


TALLY = Tally()


async def saq_noop(ctx: Context, *, n: int) -> None:
    """SAQ job: SAQ calls `fn(ctx, **kwargs)`."""
    TALLY.record(n)


async def arq_noop(ctx: dict[str, Any], n: int) -> None:
    """arq job: arq calls `fn(ctx, *args, **kwargs)`."""
    TALLY.record(n)


def rq_noop(n: int) -> None:
    """RQ job: a plain function, run in the worker process (SimpleWorker does not fork)."""
    TALLY.record(n)
