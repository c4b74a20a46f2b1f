"""The batch store's contract: the Files API's files (metadata and bytes) and the Batch API's
batches and their lines, kept in the queue's own backend so that every gateway replica sees the
same ones (nothing a second replica needs lives in process memory).

`BatchStore` checks the lifecycle and converts records once, around a few storage `_hooks` that
`sqlite.SqliteBatchStore` and `redis.RedisBatchStore` implement; `batch_store_for(queue_url)`
picks one by the queue's URL.

- SQLite (`sqlite:///path`): the queue's file, tables `batch_files` (metadata and bytes),
  `batches` and `batch_lines`, rows under the store's name.
- Redis (`redis://…?name=X`): hashes `tidegate:{X}:files` and `tidegate:{X}:batches` (id → JSON),
  and one string per file's bytes (`tidegate:{X}:file:<id>`) and per batch's lines
  (`tidegate:{X}:batch_lines:<id>`), all with the queue's hash tag.

A batch changes state by compare-and-set on its status (`swap_batch`), so two replicas that
finalize one batch at once, or a cancel that meets a finalization, never undo each other.
"""

from __future__ import annotations

import abc

from pydantic import TypeAdapter

from tidegate.coord._store import OpensOnFirstUse, backend_of, queue_name_of, sqlite_path_of, without_query
from tidegate.coord.batches.models import BatchLine, BatchRecord, BatchStatus, StoredFile
from tidegate.errors import QueueClosed

__all__ = ["BatchStore", "batch_store_for"]

# A batch's lines in one go, in pydantic's own code: 50,000 of them one model at a time would
# hold the event loop for a second.
_LINES = TypeAdapter(list[BatchLine])


class BatchStore(OpensOnFirstUse):
    """Files and batches, kept in the queue's backend. Opens on first use; a closed store raises
    QueueClosed."""

    unavailable_error = QueueClosed
    what = "this batch store"

    def __init__(self, name: str) -> None:
        super().__init__()
        self.name = name

    # -- files

    async def put_file(self, file: StoredFile, content: bytes) -> None:
        """Store a file and its bytes (replacing one of the same id: generated files are written
        again, identical, by whichever replica finalizes their batch)."""
        await self._ready()
        await self._put_file(file.id, file.tenant, file.model_dump_json(), content)

    async def get_file(self, file_id: str) -> StoredFile | None:
        """The file's metadata, or None."""
        await self._ready()
        raw = await self._get_file(file_id)
        return None if raw is None else StoredFile.model_validate_json(raw)

    async def file_content(self, file_id: str) -> bytes | None:
        """The file's bytes, or None."""
        await self._ready()
        return await self._file_content(file_id)

    async def list_files(self, tenant: str, purpose: str | None = None) -> list[StoredFile]:
        """The tenant's files (of `purpose` when given), newest first."""
        await self._ready()
        files = [StoredFile.model_validate_json(raw) for raw in await self._list_files(tenant)]
        files = [file for file in files if purpose is None or file.purpose == purpose]
        return sorted(files, key=lambda file: (file.created_at, file.id), reverse=True)

    async def delete_file(self, file_id: str) -> bool:
        """Delete a file and its bytes; False when there was none."""
        await self._ready()
        return await self._delete_file(file_id)

    # -- batches

    async def insert_batch(self, batch: BatchRecord) -> bool:
        """Store a new batch; False (nothing written) when its id is taken."""
        await self._ready()
        return await self._insert_batch(batch.id, batch.tenant, batch.status, batch.model_dump_json())

    async def get_batch(self, batch_id: str) -> BatchRecord | None:
        """The batch, or None."""
        await self._ready()
        raw = await self._get_batch(batch_id)
        return None if raw is None else BatchRecord.model_validate_json(raw)

    async def list_batches(self, tenant: str | None = None) -> list[BatchRecord]:
        """Batches (all, or the tenant's), newest first."""
        await self._ready()
        batches = [BatchRecord.model_validate_json(raw) for raw in await self._list_batches(tenant)]
        return sorted(batches, key=lambda batch: (batch.created_at, batch.id), reverse=True)

    async def swap_batch(self, batch: BatchRecord, expected: BatchStatus) -> bool:
        """Replace the stored batch with `batch` if its status is still `expected`, in one atomic
        step; False (nothing written) otherwise."""
        await self._ready()
        return await self._swap_batch(batch.id, expected, batch.status, batch.model_dump_json())

    async def put_lines(self, batch_id: str, lines: list[BatchLine]) -> None:
        """Store a batch's lines, in input order."""
        await self._ready()
        await self._put_lines(batch_id, _LINES.dump_json(lines))

    async def get_lines(self, batch_id: str) -> list[BatchLine]:
        """A batch's lines, in input order (none stored: an empty list)."""
        await self._ready()
        raw = await self._get_lines(batch_id)
        return [] if raw is None else _LINES.validate_json(raw)

    # -- storage hooks, implemented by each backend (the store open)

    @abc.abstractmethod
    async def _put_file(self, file_id: str, tenant: str, meta: str, content: bytes) -> None: ...

    @abc.abstractmethod
    async def _get_file(self, file_id: str) -> str | bytes | None: ...

    @abc.abstractmethod
    async def _file_content(self, file_id: str) -> bytes | None: ...

    @abc.abstractmethod
    async def _list_files(self, tenant: str) -> list[str | bytes]:
        """The metadata of the tenant's files, in any order."""

    @abc.abstractmethod
    async def _delete_file(self, file_id: str) -> bool: ...

    @abc.abstractmethod
    async def _insert_batch(self, batch_id: str, tenant: str, status: str, record: str) -> bool: ...

    @abc.abstractmethod
    async def _get_batch(self, batch_id: str) -> str | bytes | None: ...

    @abc.abstractmethod
    async def _list_batches(self, tenant: str | None) -> list[str | bytes]:
        """The records of every batch (of `tenant` when given), in any order."""

    @abc.abstractmethod
    async def _swap_batch(self, batch_id: str, expected: str, status: str, record: str) -> bool: ...

    @abc.abstractmethod
    async def _put_lines(self, batch_id: str, lines: bytes) -> None: ...

    @abc.abstractmethod
    async def _get_lines(self, batch_id: str) -> bytes | None: ...


def batch_store_for(queue_url: str) -> BatchStore:
    """The batch store of a queue: the same SQLite file (its own tables) or the same Redis server
    (keys under the queue's `?name=`, "default" when not given)."""
    name = queue_name_of(queue_url)
    if backend_of(queue_url) == "redis":
        from tidegate.coord.batches.redis import RedisBatchStore

        return RedisBatchStore(without_query(queue_url), name)
    from tidegate.coord.batches.sqlite import SqliteBatchStore

    return SqliteBatchStore(sqlite_path_of(queue_url), name)
