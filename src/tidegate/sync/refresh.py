"""AI refresh rules: changes that need AI work become jobs on the request flow's queue.

A rule watches columns of one entity type ("products: name, description"). When an applied
insert or update changes one of them — compared with the row the cache held before, so no
before-image is needed — an embedding request for the rule's text is enqueued at the rule's
priority (LOW by default: it must never delay interactive traffic). The idempotency key is
derived from (entity, version), so a change replayed after a crash or delivered twice never
enqueues a second job.

Whoever needs a refresh's outcome (the recommender swaps an item's vector when its embedding
arrives) passes `on_enqueued`: it is handed each batch's (change, job id) pairs once they are
enqueued.
"""

from __future__ import annotations

import logging
import string
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from tidegate.ai import AIRequest
from tidegate.config import RefreshRule
from tidegate.errors import ConfigError
from tidegate.jobs import JobSpec
from tidegate.queue import Queue
from tidegate.sync.changes import Change, Op
from tidegate.sync.contracts import ApplyOutcome, ApplyResult
from tidegate.sync.metrics import SyncMetrics

__all__ = ["RefreshListener", "RefreshSink", "refresh_idempotency_key"]

log = logging.getLogger("tidegate.sync.refresh")


def refresh_idempotency_key(change: Change, rule_number: int = 0) -> str:
    """The key that makes one change enqueue at most one job per rule (rules numbered per
    entity type in configuration order)."""
    return f"refresh:{change.entity_type}:{change.entity_id}:{change.version.key}:{rule_number}"


RefreshListener = Callable[[Sequence[tuple[Change, str]]], None]
"""Told the (change, job id) pairs of each enqueued batch (an idempotent repeat gives the first
job's id). It must not block: it runs inside the change flow's apply."""


class _Blank(dict[str, Any]):
    """Format mapping: a column the row lacks (or NULL) renders empty instead of failing."""

    def __missing__(self, key: str) -> str:
        return ""


def _render(template: str, row: Mapping[str, Any]) -> str:
    values = _Blank({k: "" if v is None else v for k, v in row.items()})
    return string.Formatter().vformat(template, (), values).strip()


class RefreshSink:
    """Enqueues the refresh jobs the configured rules ask for (a `Sink` of the pipeline)."""

    name = "refresh"

    def __init__(self, queue: Queue, rules: Sequence[RefreshRule], *, embedding_model: str,
                 metrics: SyncMetrics | None = None, on_enqueued: RefreshListener | None = None) -> None:
        for rule in rules:
            try:
                _render(rule.text, {})
            except (ValueError, IndexError, KeyError) as exc:
                raise ConfigError(
                    f"refresh rule for {rule.entity_type}: the text {rule.text!r} is not a format string "
                    f"over column names ({exc})"
                ) from exc
        self._rules: dict[str, list[RefreshRule]] = {}
        for rule in rules:
            self._rules.setdefault(rule.entity_type, []).append(rule)
        self._queue = queue
        self._embedding_model = embedding_model
        self._metrics = metrics
        self._on_enqueued = on_enqueued

    def jobs_for(self, result: ApplyResult) -> list[JobSpec]:
        """The refresh jobs one applied change calls for (none for stale changes or deletes)."""
        change = result.change
        if result.outcome is not ApplyOutcome.APPLIED or change.op not in (Op.INSERT, Op.UPDATE):
            return []
        after = change.after or {}
        before = result.previous if result.previous is not None else change.before
        specs = []
        for number, rule in enumerate(self._rules.get(change.entity_type, ())):
            if before is not None and all(before.get(c) == after.get(c) for c in rule.columns):
                continue
            text = _render(rule.text, after)
            if not text:
                continue
            request = AIRequest.of("embeddings", {"model": rule.model or self._embedding_model,
                                                  "input": text})
            specs.append(JobSpec(payload=request.to_payload(), priority=rule.priority, tenant=rule.tenant,
                                 idempotency_key=refresh_idempotency_key(change, number)))
        return specs

    async def apply(self, results: Sequence[ApplyResult]) -> None:
        """Enqueue every refresh job of the batch in one atomic write."""
        specs: list[JobSpec] = []
        changes: list[Change] = []
        for result in results:
            jobs = self.jobs_for(result)
            specs.extend(jobs)
            changes.extend([result.change] * len(jobs))
            if jobs and self._metrics is not None:
                self._metrics.refresh_jobs.labels(result.change.entity_type).inc(len(jobs))
        step = self._queue.settings.max_batch
        ids: list[str] = []
        for start in range(0, len(specs), step):
            ids.extend(await self._queue.enqueue_many(specs[start:start + step]))
        if specs and self._on_enqueued is not None:
            self._on_enqueued(list(zip(changes, ids, strict=True)))
        if specs:
            log.debug("enqueued %d refresh job(s)", len(specs))
