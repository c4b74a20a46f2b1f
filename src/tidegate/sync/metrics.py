"""Prometheus metrics of the change flow: freshness (commit → bus, commit → applied), replication
lag, events by table and operation, and what the pipeline had to skip or fill in."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from tidegate._labels import Labelled

__all__ = ["SyncMetrics"]

# Freshness is promised in tens of milliseconds: fine buckets there, coarse ones for trouble.
_FRESHNESS_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.035, 0.05, 0.075, 0.1, 0.15, 0.25,
                        0.5, 1, 2.5, 5, 10, 30, 60)


class SyncMetrics:
    """One set per registry, so tests and several pipelines in one process keep their own."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.commit_to_bus = Histogram(
            "tidegate_sync_commit_to_bus_seconds", "From the source commit to published on the bus",
            ["entity_type"], buckets=_FRESHNESS_BUCKETS_S, registry=r,
        )
        self.commit_to_applied = Histogram(
            "tidegate_sync_commit_to_applied_seconds",
            "From the source commit to applied by every sink (the cache first)",
            ["entity_type"], buckets=_FRESHNESS_BUCKETS_S, registry=r,
        )
        self.events = Counter(
            "tidegate_sync_events", "Changes applied, by table and operation",
            ["entity_type", "op"], registry=r,
        )
        self.stale = Counter(
            "tidegate_sync_stale", "Changes the cache ignored as duplicate or older than its state",
            ["entity_type"], registry=r,
        )
        self.unresolved_unchanged = Counter(
            "tidegate_sync_unresolved_unchanged_columns",
            "Unchanged (TOAST) columns neither a before-image nor the cache could fill",
            ["entity_type"], registry=r,
        )
        self.refresh_jobs = Counter(
            "tidegate_sync_refresh_jobs", "AI refresh jobs enqueued by refresh rules",
            ["entity_type"], registry=r,
        )
        self.lag_seconds = Gauge(
            "tidegate_sync_lag_seconds", "Age of the last applied change's commit when applied",
            registry=r,
        )
        self.lag_bytes = Gauge(
            "tidegate_sync_replication_lag_bytes",
            "WAL between the server's current position and the slot's confirmed flush position",
            registry=r,
        )
        self.slot_active = Gauge(
            "tidegate_sync_slot_active", "1 while the replication slot is in use", registry=r,
        )
        self.confirmed_position = Gauge(
            "tidegate_sync_confirmed_position", "Last source position confirmed (LSN or outbox seq)",
            registry=r,
        )
        self.backfills = Counter(
            "tidegate_sync_backfills", "Tables re-read after a schema change (or dropped)",
            ["entity_type"], registry=r,
        )
        self.backfill_rows = Counter(
            "tidegate_sync_backfill_rows", "Rows re-read by backfills after a schema change",
            ["entity_type"], registry=r,
        )
        self.drift_rows = Gauge(
            "tidegate_sync_drift_rows",
            "Rows the last `sync verify` found wrong in the cache (kind: missing, extra, differing; "
            "unsettled: still changing when it gave up)", ["entity_type", "kind"], registry=r,
        )
        self.pending = Gauge(
            "tidegate_sync_pending_changes", "Changes published and not yet applied", registry=r,
        )
        # Children bound once, for the per-change path.
        self.commit_to_bus_of = Labelled(self.commit_to_bus).labels
        self.commit_to_applied_of = Labelled(self.commit_to_applied).labels
        self.events_of = Labelled(self.events).labels
        self.stale_of = Labelled(self.stale).labels
