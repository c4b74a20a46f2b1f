"""The batch store's contract: the Files API's files (metadata and bytes) and the Batch API's
batches, their lines and their lines' answers, kept in the queue's own backend so that every
gateway replica sees the same ones (nothing a second replica needs lives in process memory).

`BatchStore` checks the lifecycle and converts records once, around a few storage `_hooks` that
`sqlite.SqliteBatchStore` and `redis.RedisBatchStore` implement; `batch_store_for(queue_url)`
picks one by the queue's URL.

- SQLite (`sqlite:///path`): the queue's file, tables `batch_files` (metadata and bytes),
  `batches`, `batch_lines` and `batch_answers`, rows under the store's name, indexed by tenant
  and creation time.
- Redis (`redis://…?name=X`): hashes `tidegate:{X}:files` and `tidegate:{X}:batches` (id → JSON),
  one string per file's bytes (`tidegate:{X}:file:<id>`) and per batch's lines
  (`tidegate:{X}:batch_lines:<id>`), one hash per batch's answers, and sorted sets that index
  them (see redis.py), all with the queue's hash tag.

A batch changes state by compare-and-set on its status (`swap_batch`), so two replicas that
finalize one batch at once, or a cancel that meets a finalization, never undo each other. A
line's answer is written once (`put_answers`): a replica that writes it again changes nothing.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from typing import Final

from pydantic import TypeAdapter

from tidegate._urls import without_query
from tidegate.coord._store import OpensOnFirstUse, backend_of, queue_name_of, sqlite_path_of
from tidegate.errors import QueueClosed
from tidegate.gateway.batches.store.models import BatchLine, BatchRecord, BatchStatus, LineAnswer, StoredFile

__all__ = ["ACTIVE", "BatchStore", "batch_store_for"]

# A batch's lines in one go, in pydantic's own code: 50,000 of them one model at a time would
# hold the event loop for a second.
_LINES = TypeAdapter(list[BatchLine])
# The statuses of a batch whose lines are still followed: what `active_batches` answers.
ACTIVE: Final = frozenset({"in_progress", "cancelling", "finalizing"})
# A stored answer's first byte: which file its line belongs to.
_OUTPUT, _ERROR = b"o", b"e"


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
        """Store a file and its bytes (replacing one of the same id)."""
        await self._ready()
        await self._put_file(file, file.model_dump_json(), content)

    async def get_file(self, file_id: str) -> StoredFile | None:
        """The file's metadata, or None."""
        await self._ready()
        raw = await self._get_file(file_id)
        return None if raw is None else StoredFile.model_validate_json(raw)

    async def file_content(self, file_id: str) -> bytes | None:
        """The file's bytes, or None."""
        await self._ready()
        return await self._file_content(file_id)

    async def page_files(self, tenant: str, purpose: str | None = None, *, after: str | None = None,
                         limit: int) -> tuple[list[StoredFile], bool]:
        """Up to `limit` of the tenant's files (of `purpose` when given), newest first, after the
        file `after` (none when the tenant has no such file), and whether more follow: a cost
        of the page's size, however many files other tenants keep."""
        await self._ready()
        raws = await self._page_files(tenant, purpose, after, limit + 1)
        files = [StoredFile.model_validate_json(raw) for raw in raws]
        return files[:limit], len(files) > limit

    async def delete_file(self, file_id: str) -> bool:
        """Delete a file and its bytes; False when there was none."""
        await self._ready()
        return await self._delete_file(file_id)

    async def expired_files(self, now_s: float, limit: int) -> list[StoredFile]:
        """Up to `limit` files whose `expires_at` is at or before `now_s`, soonest expired first."""
        await self._ready()
        return [StoredFile.model_validate_json(raw) for raw in await self._expired_files(int(now_s), limit)]

    # -- batches

    async def insert_batch(self, batch: BatchRecord) -> bool:
        """Store a new batch; False (nothing written) when its id is taken."""
        await self._ready()
        return await self._insert_batch(batch, batch.model_dump_json())

    async def get_batch(self, batch_id: str) -> BatchRecord | None:
        """The batch, or None."""
        await self._ready()
        raw = await self._get_batch(batch_id)
        return None if raw is None else BatchRecord.model_validate_json(raw)

    async def page_batches(self, tenant: str | None = None, *, after: str | None = None,
                           limit: int) -> tuple[list[BatchRecord], bool]:
        """Up to `limit` batches (all, or the tenant's), newest first, after the batch `after`
        (none when there is no such batch), and whether more follow."""
        await self._ready()
        raws = await self._page_batches(tenant, after, limit + 1)
        batches = [BatchRecord.model_validate_json(raw) for raw in raws]
        return batches[:limit], len(batches) > limit

    async def active_batches(self, limit: int | None = None) -> list[BatchRecord]:
        """Batches still followed (in progress, cancelling, finalizing), those checked longest
        ago first: up to `limit`, or all of them."""
        await self._ready()
        return [BatchRecord.model_validate_json(raw) for raw in await self._active_batches(limit)]

    async def swap_batch(self, batch: BatchRecord, expected: BatchStatus) -> bool:
        """Replace the stored batch with `batch` if its status is still `expected`, in one atomic
        step; False (nothing written) otherwise."""
        await self._ready()
        return await self._swap_batch(batch, expected, batch.model_dump_json())

    async def put_lines(self, batch_id: str, lines: list[BatchLine]) -> None:
        """Store a batch's lines, in input order."""
        await self._ready()
        await self._put_lines(batch_id, _LINES.dump_json(lines))

    async def get_lines(self, batch_id: str) -> list[BatchLine]:
        """A batch's lines, in input order (none stored: an empty list)."""
        await self._ready()
        raw = await self._get_lines(batch_id)
        return [] if raw is None else _LINES.validate_json(raw)

    async def put_answers(self, batch_id: str, answers: Mapping[str, LineAnswer]) -> None:
        """Record the final outcome of ended lines, by custom_id. Each is written once: one
        already recorded is kept as it is (another replica saw the same end first, or saw the
        job while the queue still kept it)."""
        if not answers:
            return
        await self._ready()
        await self._put_answers(batch_id, {custom_id: (_OUTPUT if answer.output else _ERROR) + answer.record
                                           for custom_id, answer in answers.items()})

    async def get_answers(self, batch_id: str) -> dict[str, LineAnswer]:
        """The answers recorded for a batch's lines, by custom_id."""
        await self._ready()
        return {custom_id: LineAnswer(output=raw[:1] == _OUTPUT, record=raw[1:])
                for custom_id, raw in (await self._get_answers(batch_id)).items()}

    async def drop_answers(self, batch_id: str) -> None:
        """Forget a batch's answers: its output and error files hold them now."""
        await self._ready()
        await self._drop_answers(batch_id)

    # -- storage hooks, implemented by each backend (the store open)

    @abc.abstractmethod
    async def _put_file(self, file: StoredFile, meta: str, content: bytes) -> None: ...

    @abc.abstractmethod
    async def _get_file(self, file_id: str) -> str | bytes | None: ...

    @abc.abstractmethod
    async def _file_content(self, file_id: str) -> bytes | None: ...

    @abc.abstractmethod
    async def _page_files(self, tenant: str, purpose: str | None, after: str | None,
                          count: int) -> list[str | bytes]:
        """The metadata of up to `count` of the tenant's files, newest first (by created_at, then
        id), after the tenant's file `after` when given (none when it has no such file)."""

    @abc.abstractmethod
    async def _delete_file(self, file_id: str) -> bool: ...

    @abc.abstractmethod
    async def _expired_files(self, now_s: int, count: int) -> list[str | bytes]: ...

    @abc.abstractmethod
    async def _insert_batch(self, batch: BatchRecord, record: str) -> bool: ...

    @abc.abstractmethod
    async def _get_batch(self, batch_id: str) -> str | bytes | None: ...

    @abc.abstractmethod
    async def _page_batches(self, tenant: str | None, after: str | None, count: int) -> list[str | bytes]:
        """The records of up to `count` batches (of `tenant` when given), as `_page_files`."""

    @abc.abstractmethod
    async def _active_batches(self, count: int | None) -> list[str | bytes]: ...

    @abc.abstractmethod
    async def _swap_batch(self, batch: BatchRecord, expected: str, record: str) -> bool: ...

    @abc.abstractmethod
    async def _put_lines(self, batch_id: str, lines: bytes) -> None: ...

    @abc.abstractmethod
    async def _get_lines(self, batch_id: str) -> bytes | None: ...

    @abc.abstractmethod
    async def _put_answers(self, batch_id: str, answers: dict[str, bytes]) -> None:
        """Store each answer whose custom_id has none yet."""

    @abc.abstractmethod
    async def _get_answers(self, batch_id: str) -> dict[str, bytes]: ...

    @abc.abstractmethod
    async def _drop_answers(self, batch_id: str) -> None: ...


def batch_store_for(queue_url: str) -> BatchStore:
    """The batch store of a queue: the same SQLite file (its own tables) or the same Redis server
    (keys under the queue's `?name=`, "default" when not given)."""
    name = queue_name_of(queue_url)
    if backend_of(queue_url) == "redis":
        from tidegate.gateway.batches.store.redis import RedisBatchStore

        return RedisBatchStore(without_query(queue_url), name)
    from tidegate.gateway.batches.store.sqlite import SqliteBatchStore

    return SqliteBatchStore(sqlite_path_of(queue_url), name)
