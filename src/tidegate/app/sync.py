"""Assembling the change flow from configuration: `tidegate sync`, `tidegate sync status` and
`tidegate up` all build it here.

The checkpoint store is the entity cache itself, so snapshot progress and the cache's contents
can never disagree: a fresh memory cache means a fresh snapshot, a Redis cache that survived a
crash means resuming where it stopped.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Sequence
from pathlib import PurePosixPath
from typing import Any
from urllib.parse import urlsplit

from tidegate._formats import migrating
from tidegate.config import SyncConfig, TidegateConfig
from tidegate.errors import BusUnavailable, CacheUnavailable, ConfigError, SourceError
from tidegate.queue import Queue
from tidegate.sync.buses.base import BusBase, bus_for
from tidegate.sync.cache import open_cache
from tidegate.sync.contracts import Bus, ChangeSource, CheckpointStore, EntityCache, Sink
from tidegate.sync.metrics import SyncMetrics
from tidegate.sync.pipeline import Pipeline, PipelineSettings
from tidegate.sync.refresh import RefreshListener, RefreshSink
from tidegate.sync.values import JsonValue

__all__ = ["entity_types_of", "open_sync", "source_for", "supervise_sync", "sync_status"]

log = logging.getLogger("tidegate.sync")

_POSTGRES_SCHEMES = ("postgresql", "postgres")


def entity_types_of(config: SyncConfig) -> tuple[str, ...]:
    """The entity types the configured tables produce (PostgreSQL drops the `public.` schema,
    and so does Debezium's)."""
    if urlsplit(config.source_url).scheme in (*_POSTGRES_SCHEMES, "debezium"):
        return tuple(t.removeprefix("public.") for t in config.tables)
    return config.tables


def source_names(config: SyncConfig) -> dict[str, Any]:
    """What a Debezium-format bus names as its events' source (`source.connector`, `source.db`):
    the source URL's kind and its database (PostgreSQL) or file name without suffix (SQLite)."""
    parts = urlsplit(config.source_url)
    if parts.scheme == "debezium":
        return {}  # Debezium names its own events
    if parts.scheme in _POSTGRES_SCHEMES:
        return {"connector": "postgresql", "database": parts.path.strip("/")}
    return {"connector": "sqlite", "database": PurePosixPath(parts.path).stem}


def source_for(config: SyncConfig, checkpoints: CheckpointStore) -> ChangeSource:
    """The change source the source URL names, not yet opened."""
    scheme = urlsplit(config.source_url).scheme
    if scheme in _POSTGRES_SCHEMES:
        from tidegate.sync.sources.postgres.source import PostgresSource, PostgresSourceSettings

        return PostgresSource(PostgresSourceSettings.from_url(
            config.source_url, tables=config.tables, slot_name=config.slot,
            publication_name=config.publication, heartbeat_s=config.heartbeat_s,
            source_zone=config.source_timezone,
        ), checkpoints)
    if scheme == "debezium":
        from tidegate.sync.sources.debezium import DebeziumFeed

        return DebeziumFeed()
    if scheme == "sqlite":
        from tidegate.sync.sources.sqlite.source import SqliteSource

        return SqliteSource.from_url(config.source_url, checkpoints, tables=config.tables,
                                     source_zone=config.source_timezone, batch_size=config.batch_size)
    raise ConfigError(f"unsupported change source URL scheme {scheme!r}: use postgresql://…, sqlite:///… "
                      "or debezium:// (an existing Debezium deployment writes the bus)")


@contextlib.asynccontextmanager
async def open_sync(
    config: TidegateConfig,
    *,
    queue: Queue | None = None,
    cache: EntityCache | None = None,
    sinks: Sequence[Sink] = (),
    metrics: SyncMetrics | None = None,
    settings: PipelineSettings | None = None,
    on_refresh: RefreshListener | None = None,
) -> AsyncIterator[Pipeline]:
    """The whole change flow, opened: source, bus, cache (the given one, else the configured
    one), refresh rules (on `queue`, else the configured queue; `on_refresh` is told the jobs
    they enqueue) and extra sinks. Run it with `await pipeline.run(stop)`."""
    sync = config.sync
    metrics = metrics or SyncMetrics()
    async with contextlib.AsyncExitStack() as stack:
        if cache is None:
            with migrating(config.storage.migrate):  # built in the configured migrate mode
                built = open_cache(sync)
            cache = await stack.enter_async_context(built)
        bus = bus_for(sync.bus_url, prefix=sync.prefix, **source_names(sync))
        _check_debezium_feed(sync, bus)
        bus = await stack.enter_async_context(bus)
        source = await stack.enter_async_context(source_for(sync, cache))
        all_sinks = list(sinks)
        if sync.refresh:
            if queue is None:
                with migrating(config.storage.migrate):
                    opened = Queue.from_url(config.queue_url)
                queue = await stack.enter_async_context(opened)
            refresh = RefreshSink(queue, sync.refresh, embedding_model=config.routing.embedding_model,
                                  metrics=metrics, on_enqueued=on_refresh)
            all_sinks.insert(0, refresh)
        yield Pipeline(source, bus, cache, entity_types_of(sync), sinks=all_sinks, metrics=metrics,
                       settings=settings or sync.pipeline)


def _check_debezium_feed(config: SyncConfig, bus: Bus) -> None:
    """debezium:// reads Debezium's topics: only a Kafka bus in Debezium's format has them."""
    if urlsplit(config.source_url).scheme != "debezium":
        return
    if not (isinstance(bus, BusBase) and urlsplit(bus.url).scheme == "kafka"
            and bus.settings.format == "debezium"):
        raise ConfigError("source debezium:// reads the topics an existing Debezium deployment writes: "
                          "the bus must be kafka://host:port?format=debezium, with prefix set to "
                          "Debezium's topic.prefix")


async def sync_status(config: SyncConfig) -> dict[str, JsonValue]:
    """What `tidegate sync status` shows: the source's position and lag (`source`), per table
    the rows in the source next to the live entries in the cache (`tables`), and the last
    `sync verify`'s report (`verify`, None if never)."""
    async with open_cache(config) as cache:
        source: dict[str, Any]
        if urlsplit(config.source_url).scheme in _POSTGRES_SCHEMES:
            from tidegate.sync.sources.postgres.source import PostgresSource

            pg = source_for(config, cache)
            assert isinstance(pg, PostgresSource)
            source = (await pg.status()).to_dict()
            rows = source.pop("table_rows")
        elif urlsplit(config.source_url).scheme == "debezium":
            # Debezium's database is not ours to read: its position is the group's offsets.
            source, rows = {"kind": "debezium"}, {}
        else:
            from tidegate.sync.sources.sqlite.source import SqliteSource

            lite = source_for(config, cache)
            assert isinstance(lite, SqliteSource)
            source = await lite.status()
            rows = {name: table["rows"] for name, table in source.pop("tables").items()}
        tables: dict[str, JsonValue] = {}
        for table, entity_type in zip(config.tables, entity_types_of(config), strict=True):
            tables[entity_type] = {"source_rows": rows.get(entity_type, rows.get(table)),
                                   "cached": await cache.count(entity_type)}
        from tidegate.sync.verify import LAST_VERIFY_CHECKPOINT

        last_verify = await cache.get_checkpoint(LAST_VERIFY_CHECKPOINT)
    return {"source": source, "tables": tables, "verify": last_verify}


RESTART_AFTER_S = 2.0  # how long `supervise_sync` waits before it reopens a failed change flow


async def supervise_sync(config: TidegateConfig, stop: asyncio.Event, *, queue: Queue | None = None,
                         cache: EntityCache | None = None, sinks: Sequence[Sink] = (),
                         metrics: SyncMetrics | None = None,
                         on_refresh: RefreshListener | None = None) -> None:
    """Run the change flow until `stop` is set, reopening it after a failure of the source, the
    bus or the cache (logged, then retried after RESTART_AFTER_S): what `tidegate up` runs beside
    the gateway, where one lost connection must not take the request flow down with it."""
    while not stop.is_set():
        try:
            async with open_sync(config, queue=queue, cache=cache, sinks=sinks, metrics=metrics,
                                 on_refresh=on_refresh) as pipeline:
                await pipeline.run(stop)
        except (SourceError, BusUnavailable, CacheUnavailable) as exc:
            log.error("change flow stopped: %s; restarting in %.0f s", exc, RESTART_AFTER_S)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), RESTART_AFTER_S)
