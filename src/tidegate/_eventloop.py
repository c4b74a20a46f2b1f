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

A process that loads a large state before serving (the change flow's snapshot into an in-process
entity cache and recommender: hundreds of thousands of container objects) freezes it too, once it
is loaded (`freeze_loaded`): a full collection otherwise walks all of it with the event loop
standing still (200-360 ms measured on 2 cores, BENCHMARKS.md), and after the collection that
precedes the freeze the collector's own rule (a full collection only once the objects that
survived since the last one exceed a quarter of those it kept then) makes full collections rare.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, TypeVar

__all__ = ["GC_THRESHOLDS", "freeze_loaded", "loop_factory", "run", "server_gc"]

T = TypeVar("T")

GC_THRESHOLDS = (10_000, 20, 20)

_server_gc_depth = 0  # how many server_gc blocks are running (freeze_loaded acts only inside one)


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
    global _server_gc_depth
    thresholds = gc.get_threshold()
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)
    _server_gc_depth += 1
    try:
        yield
    finally:
        _server_gc_depth -= 1
        gc.set_threshold(*thresholds)
        gc.unfreeze()


def freeze_loaded() -> bool:
    """Inside `server_gc()` (a tidegate process), collect once and freeze everything alive out of
    the collector's reach: called when a large state has been loaded (the change flow's
    snapshot). Outside it (a library user's program, a test) it does nothing: that program's
    collector is its own. Returns whether it froze."""
    if _server_gc_depth == 0:
        return False
    gc.collect()
    gc.freeze()
    return True
