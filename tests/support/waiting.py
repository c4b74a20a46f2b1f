"""Waiting for state that another task, thread or process changes: the one polling helper of the
suite. A test that needs an ordering asserts it by reading the state it waits for, here, rather
than sleeping for a guessed time.

    job = await eventually(lambda: queue.get(job_id), "the job is done",
                           until=lambda job: job is not None and job.state is JobState.DONE)

The bound is a liveness bound (a broken product fails the test instead of hanging it), never a
speed assertion: it is generous, and on timeout the message names what was awaited and the last
value seen.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar, overload

T = TypeVar("T")
Ignored = tuple[type[Exception], ...]  # exceptions of a probe that mean "not yet"

TIMEOUT_S = 30.0  # long enough for a busy 2-core machine; a failure, not a pass, waits this long
EVERY_S = 0.02  # short enough that the test moves on as soon as the state is there
SHOWN_CHARS = 2000  # of the last value seen, in the failure message


def _holds(value: object) -> bool:
    return bool(value)


@dataclass
class _Missed:
    """A look that raised an exception the caller counts as "not yet"."""

    error: Exception


def _look(probe: Callable[[], Any], ignoring: Ignored) -> Any:
    try:
        return probe()
    except ignoring as exc:
        return _Missed(exc)


async def _look_async(probe: Callable[[], Any], ignoring: Ignored) -> Any:
    try:
        value = probe()
        return await value if inspect.isawaitable(value) else value
    except ignoring as exc:
        return _Missed(exc)


@dataclass
class _Wait:
    """One wait's bound and what its latest look saw."""

    what: str
    until: Callable[[Any], bool]
    timeout_s: float
    describe: Callable[[Any], str]
    give_up: float = field(init=False)
    last: Any = None

    def __post_init__(self) -> None:
        self.give_up = time.monotonic() + self.timeout_s

    def holds(self, value: Any) -> bool:
        """Whether `value` is what was awaited; raises once the time is up."""
        if not isinstance(value, _Missed) and self.until(value):
            return True
        self.last = value
        if time.monotonic() > self.give_up:
            raise self._failure()
        return False

    def _failure(self) -> AssertionError:
        last = self.last
        seen = (f"{type(last.error).__name__}: {last.error}" if isinstance(last, _Missed)
                else self.describe(last))
        if len(seen) > SHOWN_CHARS:
            seen = seen[:SHOWN_CHARS] + "…"
        return AssertionError(f"timed out after {self.timeout_s:g}s waiting until {self.what}; "
                              f"last seen: {seen}")


@overload
async def eventually(probe: Callable[[], Awaitable[T]], what: str, *, until: Callable[[T], bool] = _holds,
                     timeout_s: float = TIMEOUT_S, every_s: float = EVERY_S,
                     ignoring: Ignored = (), describe: Callable[[T], str] = repr) -> T: ...
@overload
async def eventually(probe: Callable[[], T], what: str, *, until: Callable[[T], bool] = _holds,
                     timeout_s: float = TIMEOUT_S, every_s: float = EVERY_S,
                     ignoring: Ignored = (), describe: Callable[[T], str] = repr) -> T: ...
async def eventually(probe: Callable[[], Any], what: str, *, until: Callable[[Any], bool] = _holds,
                     timeout_s: float = TIMEOUT_S, every_s: float = EVERY_S,
                     ignoring: Ignored = (), describe: Callable[[Any], str] = repr) -> Any:
    """Call `probe` (sync or async) every `every_s` until `until(value)` holds (by default: the
    value is truthy) and return that value; fail naming `what` and `describe(last value)` after
    `timeout_s`. An exception of a type in `ignoring` counts as "not yet" (a server still
    starting); any other ends the wait at once (say, a process that exited)."""
    wait = _Wait(what, until, timeout_s, describe)
    while True:  # polling is the point: the state changes elsewhere, announced by nothing here
        if wait.holds(value := await _look_async(probe, ignoring)):
            return value
        await asyncio.sleep(every_s)


def eventually_sync(probe: Callable[[], T], what: str, *, until: Callable[[T], bool] = _holds,
                    timeout_s: float = TIMEOUT_S, every_s: float = EVERY_S,
                    ignoring: Ignored = (), describe: Callable[[T], str] = repr) -> T:
    """`eventually` for code without an event loop (a thread, a synchronous test or fixture)."""
    wait = _Wait(what, until, timeout_s, describe)
    while not wait.holds(value := _look(probe, ignoring)):
        time.sleep(every_s)
    return value  # type: ignore[no-any-return]
