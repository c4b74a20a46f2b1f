"""Stopping a process: the one handling of SIGTERM and SIGINT that `tidegate up`, `tidegate
gateway` and `tidegate worker` share, and bounded awaits for the steps of a shutdown.

The first SIGTERM or SIGINT starts a graceful stop (the caller's `stop`); a second one forces
it (`force`: skip what is left of the grace). Either way the process returns from its main
coroutine and exits 0 after its drain — the signal is never re-raised, since a process killed
by its own signal has closed nothing (container platforms and systemd send SIGTERM and read
the exit status).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import threading
from collections.abc import Awaitable, Callable, Iterator
from contextlib import AbstractAsyncContextManager, AsyncExitStack
from typing import TypeVar

__all__ = [
    "CLOSE_BOUND_S",
    "HARD_STOP_MARGIN_S",
    "STOP_SIGNALS",
    "bounded",
    "cancel_bounded",
    "close_bounded",
    "enter_bounded",
    "stop_on_signals",
]

log = logging.getLogger("tidegate.shutdown")

T = TypeVar("T")

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
# How long one close step (a pool, a session, a background task) may take once asked to stop:
# past it the step is abandoned with a warning, so no single close holds a shutdown forever.
CLOSE_BOUND_S = 5.0
# Past its grace by this much, a stopping process exits at once whatever still runs: the last
# guard of the bound, for what no timeout inside the event loop can end (a blocked thread, the
# interpreter's own teardown). It exits 1 and says so, since something was stuck.
HARD_STOP_MARGIN_S = 15.0
EXIT_STUCK = 1


@contextlib.contextmanager
def stop_on_signals(
    stop: Callable[[], None], *, force: Callable[[], None] | None = None, grace_s: float | None = None,
) -> Iterator[None]:
    """While the block runs, the first SIGTERM or SIGINT calls `stop` and a later one `force`.
    With `grace_s`, the first signal also arms a watchdog: `grace_s + HARD_STOP_MARGIN_S` later
    the process exits with status 1 if it is still running."""
    loop = asyncio.get_running_loop()
    received: list[signal.Signals] = []

    def handle(sig: signal.Signals) -> None:
        received.append(sig)
        if len(received) == 1:
            log.warning("%s received: stopping gracefully (send it again to stop at once)", sig.name)
            if grace_s is not None:
                _arm_watchdog(grace_s + HARD_STOP_MARGIN_S)
            stop()
        elif force is not None:
            log.warning("%s received again: stopping at once", sig.name)
            force()

    for sig in STOP_SIGNALS:
        loop.add_signal_handler(sig, handle, sig)
    try:
        yield
    finally:
        for sig in STOP_SIGNALS:
            loop.remove_signal_handler(sig)


def _arm_watchdog(after_s: float) -> None:
    # A daemon thread, not the event loop: it fires even when the loop itself is what hangs, and
    # it never delays a process that exits in time.
    def expire() -> None:
        message = f"tidegate: still stopping {after_s:.0f}s after the stop signal; exiting now\n"
        os.write(2, message.encode())
        os._exit(EXIT_STUCK)

    timer = threading.Timer(after_s, expire)
    timer.daemon = True
    timer.start()


async def bounded(step: Awaitable[T], what: str, timeout_s: float = CLOSE_BOUND_S) -> T | None:
    """`step` awaited for at most `timeout_s`; past that it is cancelled, a warning names it,
    and None is returned, so one stuck close cannot hold the whole shutdown."""
    try:
        async with asyncio.timeout(timeout_s):
            return await step
    except TimeoutError:
        log.warning("%s did not finish within %.1fs; abandoned", what, timeout_s)
        return None


async def cancel_bounded(task: asyncio.Task[object], what: str, timeout_s: float = CLOSE_BOUND_S) -> None:
    """Cancel `task` and wait, bounded like `bounded`, until it has ended."""
    task.cancel()
    await bounded(_ended(task), what, timeout_s)


async def _ended(task: asyncio.Task[object]) -> None:
    with contextlib.suppress(asyncio.CancelledError):
        await task


async def enter_bounded(stack: AsyncExitStack, manager: AbstractAsyncContextManager[T], what: str) -> T:
    """`stack.enter_async_context(manager)`, its exit bounded like `bounded`: a part that cannot
    close in time is abandoned with a warning and the parts opened before it still close."""
    value = await manager.__aenter__()
    stack.push_async_callback(lambda: bounded(manager.__aexit__(None, None, None), f"closing {what}"))
    return value


def close_bounded(stack: AsyncExitStack, close: Callable[[], Awaitable[object]], what: str) -> None:
    """On the stack's exit, `close()`, bounded like `bounded`."""
    stack.push_async_callback(lambda: bounded(close(), f"closing {what}"))
