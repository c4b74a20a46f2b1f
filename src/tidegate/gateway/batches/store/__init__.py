"""Files and batches: what the Files API's uploads and the Batch API's batches keep between
calls, in the queue's backend by a `BatchStore` (`batch_store_for(queue_url)`: the SQLite file or
the Redis server), so every gateway replica serves the same ones."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tidegate.coord._store import imported_when_named
from tidegate.gateway.batches.store.base import ACTIVE, BatchStore, batch_store_for
from tidegate.gateway.batches.store.models import (
    BatchFields,
    BatchLine,
    BatchRecord,
    BatchStatus,
    LineAnswer,
    LineError,
    RequestCounts,
    StoredFile,
)
from tidegate.gateway.batches.store.sqlite import SqliteBatchStore

if TYPE_CHECKING:
    from tidegate.gateway.batches.store.redis import RedisBatchStore

__all__ = [
    "ACTIVE",
    "BatchFields",
    "BatchLine",
    "BatchRecord",
    "BatchStatus",
    "BatchStore",
    "LineAnswer",
    "LineError",
    "RedisBatchStore",
    "RequestCounts",
    "SqliteBatchStore",
    "StoredFile",
    "batch_store_for",
]

__getattr__ = imported_when_named(__name__, {"RedisBatchStore": "tidegate.gateway.batches.store.redis"})
