"""Group commit for a server round trip: calls that arrive while one is being sent go out
together in the next.

A worker finishing hundreds of calls a second would otherwise spend a Redis round trip on each
result and each spend record, and redis-py's work per command (lending a pooled connection,
packing, a reply timeout) costs more than the script it runs. `GroupCall` sends the first call at
the event loop's next turn, with every call made in the meantime, and while that batch is on its
way collects the next one: one round trip per batch, and no call waits longer than the one before
it takes. At a low rate each batch holds one call, sent one loop turn later than a direct call.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

__all__ = ["GroupCall"]

T = TypeVar("T")
R = TypeVar("R")

MAX_ITEMS = 256  # calls one batch holds at most


class GroupCall(Generic[T, R]):
    """`await group.call(item)` sends `item` with the others of its batch through `send`, which
    returns one outcome per item, in order: the item's result, or an exception its caller raises.
    An exception raised by `send` itself reaches every caller of the batch. A caller cancelled
    while its batch is on its way does not unsend its item."""

    def __init__(self, send: Callable[[list[T]], Awaitable[Sequence[R | BaseException]]], *,
                 max_items: int = MAX_ITEMS) -> None:
        self._send = send
        self._max_items = max_items
        self._pending: list[tuple[T, asyncio.Future[R]]] = []
        self._sender: asyncio.Task[None] | None = None

    async def call(self, item: T) -> R:
        future: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        self._pending.append((item, future))
        if self._sender is None:
            self._sender = asyncio.create_task(self._send_all())
        return await future

    async def drain(self) -> None:
        """Return once every call made so far has been sent and answered."""
        if self._sender is not None:
            await asyncio.shield(self._sender)

    async def _send_all(self) -> None:
        batch: list[tuple[T, asyncio.Future[R]]] = []
        try:
            while self._pending:
                batch = self._pending[:self._max_items]
                del self._pending[:self._max_items]
                try:
                    outcomes = await self._send([item for item, _ in batch])
                except Exception as exc:
                    for _, future in batch:
                        if not future.done():
                            future.set_exception(exc)
                    continue
                for (_, future), outcome in zip(batch, outcomes, strict=True):
                    if future.done():
                        continue  # its caller was cancelled
                    if isinstance(outcome, BaseException):
                        future.set_exception(outcome)
                    else:
                        future.set_result(outcome)
        finally:
            self._sender = None
            # Only when this task was cancelled mid-way: nobody will answer these callers now.
            for _, future in (*batch, *self._pending):
                if not future.done():
                    future.cancel()
            self._pending.clear()
