"""`debezium://`: the changes come from an existing Debezium deployment, straight onto the bus.

Debezium's PostgreSQL connector already writes every change to Kafka topics
`<topic.prefix>.<schema>.<table>`, which is where a `format=debezium` bus with the same prefix
reads them (see `tidegate.sync.buses.debezium`). So this source reads nothing and publishes
nothing: the pipeline's consumer group takes Debezium's events off those topics into the cache,
the recommender and the refresh rules, and its committed offsets are the position (a restart
resumes after them, at least once; the cache's versions make repeats harmless). Each event's
version is its `source.lsn`, which orders one row's changes (see `debezium._version`), so a
replayed or late event never overwrites a newer one. Tombstones are skipped: the delete before
each one is the change.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Self

from tidegate.sync.contracts import Transaction
from tidegate.sync.values import JsonValue

__all__ = ["DebeziumFeed"]


class DebeziumFeed:
    """The ChangeSource of `debezium://`: its transactions never come (Debezium publishes them),
    and it waits until closed so that the pipeline keeps consuming."""

    def __init__(self) -> None:
        self._closed = asyncio.Event()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self._closed.set()

    async def transactions(self) -> AsyncIterator[Transaction]:
        """None: Debezium writes them to the bus itself. Ends when the source is closed."""
        await self._closed.wait()
        return
        yield  # an async generator that yields nothing

    async def confirm(self, position: int) -> None:
        """Nothing to confirm: the consumer group's committed offsets are the position."""

    async def confirm_snapshot(self, mark: JsonValue) -> None:
        """Debezium takes its own snapshots."""
