"""The recommender as the change flow feeds it: one `Recommender` on the change flow's cache
backend (memory, or Redis so that every gateway replica serves the same state), the `RecsSink`
that follows the entity cache, and — when refresh rules enqueue embedding jobs — the watcher that
swaps an item's vector once its job succeeds. `tidegate up` and `tidegate sync` both build it
here."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

from prometheus_client import CollectorRegistry

from tidegate.config import TidegateConfig
from tidegate.queue import Queue
from tidegate.recs.engine import Recommender
from tidegate.recs.monitor import RecsMonitor
from tidegate.recs.refresh_watch import RefreshWatcher
from tidegate.recs.sink import RecsMapping, RecsSink
from tidegate.recs.store.base import recs_store_for
from tidegate.sync.contracts import EntityCache
from tidegate.sync.values import Row

__all__ = ["RecsWiring", "open_recommendations"]


@dataclass(frozen=True, slots=True)
class RecsWiring:
    """What the change flow needs to feed the recommender."""

    sink: RecsSink  # holds the recommender and its monitor
    watcher: RefreshWatcher | None  # None without a queue and a cache to read rows from


async def open_recommendations(stack: contextlib.AsyncExitStack, config: TidegateConfig, *,
                               queue: Queue | None, cache: EntityCache | None,
                               registry: CollectorRegistry | None = None) -> RecsWiring:
    """Open the recommender's store on `stack` and wire its sink (the demo shop's tables and
    columns, its metrics in `registry` or a registry of its own) and, given a queue and the
    entity cache, the embedding watcher."""
    store = await stack.enter_async_context(recs_store_for(config.sync.cache_url, prefix=config.sync.prefix))
    sink = RecsSink(Recommender(store, config.recs), mapping=RecsMapping(), monitor=RecsMonitor(registry))
    if cache is None or queue is None:
        return RecsWiring(sink, None)
    products = sink.mapping.products

    async def current_row(item_id: str) -> Row | None:
        return await cache.get_entity(products, item_id)

    return RecsWiring(sink, await stack.enter_async_context(RefreshWatcher(queue, sink, current_row)))
