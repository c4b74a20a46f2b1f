"""Which job waits in which of a provider's own batches (`ProviderBatchStore`: in the queue's
SQLite file or on its Redis server, picked by `provider_batch_store_for(queue_url)`), so that any
worker collects a job another one submitted, and none submits it twice."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tidegate.coord._store import imported_when_named
from tidegate.dispatch.provider_batches.store.base import (
    CANCEL,
    CLEAN_UP,
    KEEP_S,
    BatchedJob,
    ProviderBatchRecord,
    ProviderBatchStore,
    provider_batch_store_for,
)
from tidegate.dispatch.provider_batches.store.sqlite import SqliteProviderBatchStore

if TYPE_CHECKING:
    from tidegate.dispatch.provider_batches.store.redis import RedisProviderBatchStore

__all__ = [
    "CANCEL",
    "CLEAN_UP",
    "KEEP_S",
    "BatchedJob",
    "ProviderBatchRecord",
    "ProviderBatchStore",
    "RedisProviderBatchStore",
    "SqliteProviderBatchStore",
    "provider_batch_store_for",
]

__getattr__ = imported_when_named(
    __name__, {"RedisProviderBatchStore": "tidegate.dispatch.provider_batches.store.redis"})
