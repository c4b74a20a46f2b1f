"""Open once, close once: the lifecycle every queue, store, cache, bus and change source shares.

An object is used as an async context manager (or with `open()` and `close()`); opening is
idempotent while open, closing is idempotent, and a closed object cannot reopen — make a new one
(as httpx clients do). Using it before it is open or after it is closed raises the subclass's
`unavailable_error`, naming the object and what to do.

Subclasses implement `_open` and `_close`. One that runs work of its own while open (the queue's
upkeep task) starts it in `_opened` and stops it in `_closing`, which by default only calls
`_close`.
"""

from __future__ import annotations

import abc
import enum
from typing import ClassVar, Self

from tidegate.errors import TidegateError

__all__ = ["Lifecycle"]


class _State(enum.Enum):
    NEW = "not opened"
    OPEN = "open"
    CLOSED = "closed"


class Lifecycle(abc.ABC):
    """The lifecycle above; subclasses implement `_open` and `_close` and set `unavailable_error`."""

    unavailable_error: ClassVar[type[TidegateError]] = TidegateError
    what: ClassVar[str] = "this object"  # how messages name it: "the entity cache"
    reopen_hint: ClassVar[str] = "create a new one"  # what to do instead of reopening

    def __init__(self) -> None:
        self._lifecycle = _State.NEW

    @property
    def is_open(self) -> bool:
        """True between a successful open and close."""
        return self._lifecycle is _State.OPEN

    async def open(self) -> Self:
        """Connect. Idempotent while open; a closed object cannot reopen."""
        if self._lifecycle is _State.CLOSED:
            raise self.unavailable_error(f"{self._described()} was closed; {self.reopen_hint}")
        if self._lifecycle is _State.NEW:
            await self._open()
            self._lifecycle = _State.OPEN
            self._opened()
        return self

    async def close(self) -> None:
        """Release connections. Idempotent."""
        was_open = self._lifecycle is _State.OPEN
        self._lifecycle = _State.CLOSED
        if was_open:
            await self._closing()

    async def __aenter__(self) -> Self:
        return await self.open()

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    def _check_open(self) -> None:
        if self._lifecycle is not _State.OPEN:
            state = self._lifecycle.value
            raise self.unavailable_error(f"{self._described()} is {state}: use `async with` or open()")

    def _described(self) -> str:
        """How error messages name this object."""
        return self.what

    def _opened(self) -> None:
        """Called once, right after a successful `_open`: start what runs while open."""
        return None  # most objects run nothing of their own

    async def _closing(self) -> None:
        """What `close()` does to an open object: stop what `_opened` started, then `_close`."""
        await self._close()

    @abc.abstractmethod
    async def _open(self) -> None:
        """Connect; driver errors as `unavailable_error`."""

    @abc.abstractmethod
    async def _close(self) -> None:
        """Release what `_open` took."""
