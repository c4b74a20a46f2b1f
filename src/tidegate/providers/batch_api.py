"""A provider's own batch API (OpenAI's Files + Batch): submit many requests at once, collect later.

OpenAI and Anthropic answer a batch within a window (24 h) at half the price of single calls, which
suits BULK jobs with a long deadline. `ProviderBatchClient` speaks OpenAI's shape over the
provider's pooled `UpstreamClient`: the lines go up as one JSONL file (purpose `batch`), a batch is
created on it, polled until it ended, and its output and error files are read back into one
`BatchLineResult` per line.

Failures leave as `UpstreamError` (tidegate.errors), whose `kind` and `retryable` tell the caller
what to do, as the other provider calls do.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from tidegate.providers.client import UpstreamClient

__all__ = ["ENDED_STATUSES", "BatchLineRequest", "BatchLineResult", "ProviderBatch", "ProviderBatchClient"]

ENDED_STATUSES: Final = frozenset({"completed", "failed", "expired", "cancelled"})
"""The statuses after which a batch changes no more."""


@dataclass(frozen=True, slots=True)
class BatchLineRequest:
    """One request of a batch: `custom_id` names it in the results (tidegate uses the job id),
    `url` is its endpoint ("/v1/chat/completions" or "/v1/embeddings"), `body` its request body,
    model included."""

    custom_id: str
    url: str
    body: dict[str, Any]


@dataclass(frozen=True, slots=True)
class ProviderBatch:
    """A batch as the provider last described it.

    `status` is OpenAI's: validating, in_progress, finalizing, completed, failed, expired,
    cancelling or cancelled. The file ids are set once the batch has output (or failed lines).
    """

    id: str
    status: str
    output_file_id: str | None
    error_file_id: str | None
    total: int
    completed: int
    failed: int

    @property
    def ended(self) -> bool:
        """Whether the batch changes no more: completed, failed, expired or cancelled."""
        return self.status in ENDED_STATUSES


@dataclass(frozen=True, slots=True)
class BatchLineResult:
    """The answer to one line: its HTTP status (200 on success) and body (the chat completion or
    embeddings, or the error body).

    A line in neither file of an ended batch (it expired, was cancelled, or the batch failed) has
    `status_code` 0 and the body `{"error": {"code": "batch_expired" (or batch_cancelled,
    batch_failed), "message": ...}}`.
    """

    custom_id: str
    status_code: int
    body: dict[str, Any]


class ProviderBatchClient:
    """Submits, polls and collects one provider's batches over its pooled UpstreamClient."""

    def __init__(self, client: UpstreamClient) -> None:
        self.client = client

    async def submit(self, lines: Sequence[BatchLineRequest], *, endpoint: str,
                     completion_window: str = "24h",
                     metadata: Mapping[str, str] | None = None) -> ProviderBatch:
        """Upload `lines` as a JSONL file (purpose `batch`) to {base_url}/files, then create a
        batch on it at {base_url}/batches for `endpoint` ("/v1/chat/completions" or
        "/v1/embeddings")."""
        raise NotImplementedError

    async def retrieve(self, batch_id: str) -> ProviderBatch:
        """The batch as the provider describes it now."""
        raise NotImplementedError

    async def results(self, batch: ProviderBatch, custom_ids: Iterable[str]) -> dict[str, BatchLineResult]:
        """A result for every one of `custom_ids` of an ended batch, read from its output and error
        files (a line in neither is reported with status_code 0, see BatchLineResult)."""
        raise NotImplementedError

    async def cancel(self, batch_id: str) -> ProviderBatch:
        """Ask the provider to cancel the batch; it goes `cancelling`, then `cancelled`."""
        raise NotImplementedError
