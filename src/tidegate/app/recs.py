"""The recommender as the change flow feeds it: one `Recommender` on the change flow's cache
backend (memory, or Redis so that every gateway replica serves the same state), the `RecsSink`
that follows the entity cache, and — when refresh rules enqueue embedding jobs — the watcher that
swaps an item's vector once its job succeeds. `tidegate up` and `tidegate sync` both build it
here."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

from prometheus_client import CollectorRegistry

from tidegate._formats import migrating
from tidegate._shutdown import enter_bounded
from tidegate.config import TidegateConfig
from tidegate.queue import Queue
from tidegate.recs.engine import Recommender
from tidegate.recs.monitor import RecsMonitor
from tidegate.recs.refresh_watch import RefreshWatcher
from tidegate.recs.sink import RecsMapping, RecsSink
from tidegate.recs.store.base import recs_store_for
from tidegate.sync.contracts import EntityCache
from tidegate.sync.values import Row

__all__ = ["RecsWiring", "open_recommendations", "open_recommender"]


@dataclass(frozen=True, slots=True)
class RecsWiring:
    """What the change flow needs to feed the recommender."""

    sink: RecsSink  # holds the recommender and its monitor
    watcher: RefreshWatcher | None  # None without a queue and a cache to read rows from


async def open_recommender(stack: contextlib.AsyncExitStack, config: TidegateConfig, url: str) -> Recommender:
    """A recommender (its settings `config.recs`) on the store at `url` under the change flow's
    prefix, the store opened on `stack` (its close bounded)."""
    with migrating(config.storage.migrate):  # built in the configured migrate mode
        built = recs_store_for(url, prefix=config.sync.prefix)
    store = await enter_bounded(stack, built, "the recommender's store")
    return Recommender(store, config.recs)


async def open_recommendations(stack: contextlib.AsyncExitStack, config: TidegateConfig, *,
                               queue: Queue | None, cache: EntityCache | None,
                               registry: CollectorRegistry | None = None,
                               recommender: Recommender | None = None) -> RecsWiring:
    """Wire the recommender's sink (the demo shop's tables and columns, its metrics in
    `registry` or a registry of its own) and, given a queue and the entity cache, the embedding
    watcher, on `stack`. The recommender is the given one, else one opened on the change flow's
    cache backend (`config.sync.cache_url`)."""
    if recommender is None:
        recommender = await open_recommender(stack, config, config.sync.cache_url)
    sink = RecsSink(recommender, mapping=RecsMapping(), monitor=RecsMonitor(registry))
    if cache is None or queue is None:
        return RecsWiring(sink, None)
    products = sink.mapping.products

    async def current_row(item_id: str) -> Row | None:
        return await cache.get_entity(products, item_id)

    return RecsWiring(sink, await stack.enter_async_context(RefreshWatcher(queue, sink, current_row)))
