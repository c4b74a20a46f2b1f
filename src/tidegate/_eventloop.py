"""How every tidegate process runs: on uvloop (libuv, in C) where it is installed, the standard
asyncio loop otherwise, with the cyclic garbage collector set for a long-running server.

On the gateway's hot path uvloop's socket handling and callbacks cost less than the standard
loop's (BENCHMARKS.md, "Gateway overhead"). Nothing in tidegate depends on which loop runs: the
tests that start processes run them on uvloop, the in-process tests on the standard loop.

The collector: a request allocates a few hundred container objects, nearly all freed by their
reference counts; with Python's default thresholds (700, 10, 10) the collector still ran every few
requests and walked the whole heap of imported modules at each full collection, about a tenth of
the gateway's CPU. Everything alive when the loop starts (the modules, the settings) is frozen out
of its reach, and the youngest generation is collected every GC_THRESHOLDS[0] allocations: a
young collection then walks at most that many objects, well under a millisecond.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, TypeVar

__all__ = ["GC_THRESHOLDS", "loop_factory", "run", "server_gc"]

T = TypeVar("T")

GC_THRESHOLDS = (10_000, 20, 20)


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop]:
    """What makes the event loop of a tidegate process: uvloop's when it is installed."""
    try:
        import uvloop
    except ImportError:  # Windows, or a build without it: the standard loop works the same
        return asyncio.new_event_loop
    return uvloop.new_event_loop


def run(main: Coroutine[Any, Any, T]) -> T:
    """Run `main` to its end on a new loop from `loop_factory()`, as `asyncio.run` does, with
    `server_gc()` while it runs."""
    with server_gc(), asyncio.Runner(loop_factory=loop_factory()) as runner:
        return runner.run(main)


@contextlib.contextmanager
def server_gc() -> Iterator[None]:
    """While the block runs, the objects alive at its start are frozen out of the collector's
    reach and the collector runs at GC_THRESHOLDS; both are undone at its end (a command run
    inside another program, such as a test, leaves that program's collector as it was)."""
    thresholds = gc.get_threshold()
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)
        gc.unfreeze()
