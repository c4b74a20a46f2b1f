"""The event loop every tidegate process runs on: uvloop (libuv, in C) where it is installed, the
standard asyncio loop otherwise.

On the gateway's hot path uvloop's socket handling and callbacks cost about half of what the
standard loop's do (BENCHMARKS.md, "Gateway overhead"). Nothing in tidegate depends on which loop
runs: the tests that start processes run them on uvloop, the in-process tests on the standard loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

__all__ = ["loop_factory", "run"]

T = TypeVar("T")


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop]:
    """What makes the event loop of a tidegate process: uvloop's when it is installed."""
    try:
        import uvloop
    except ImportError:  # Windows, or a build without it: the standard loop works the same
        return asyncio.new_event_loop
    return uvloop.new_event_loop


def run(main: Coroutine[Any, Any, T]) -> T:
    """Run `main` to its end on a new loop from `loop_factory()`, as `asyncio.run` does."""
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        return runner.run(main)
