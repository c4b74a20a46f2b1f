"""The change flow: committed database changes → event bus → versioned entity cache and other
sinks, with AI refresh work handed to the queue."""

from tidegate.sync.changes import Change, Op, Version, entity_id_of
from tidegate.sync.contracts import (
    ApplyOutcome,
    ApplyResult,
    Bus,
    ChangeSource,
    CheckpointStore,
    Delivery,
    EntityCache,
    Entry,
    Sink,
    Subscription,
    Transaction,
)
from tidegate.sync.values import canonical, canonical_json, checksum, normalise_timestamp

__all__ = [
    "ApplyOutcome",
    "ApplyResult",
    "Bus",
    "Change",
    "ChangeSource",
    "CheckpointStore",
    "Delivery",
    "EntityCache",
    "Entry",
    "Op",
    "Sink",
    "Subscription",
    "Transaction",
    "Version",
    "canonical",
    "canonical_json",
    "checksum",
    "entity_id_of",
    "normalise_timestamp",
]
