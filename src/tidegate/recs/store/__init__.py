"""The recommender's state: `recs_store_for("memory://" | "redis://…")` (see `base`)."""

from tidegate.recs.store.base import (
    ItemChanges,
    RecentItem,
    RecsStore,
    StoreStats,
    UserEvent,
    UserOutcome,
    UserParams,
    UserState,
    recs_store_for,
)

__all__ = [
    "ItemChanges",
    "RecentItem",
    "RecsStore",
    "StoreStats",
    "UserEvent",
    "UserOutcome",
    "UserParams",
    "UserState",
    "recs_store_for",
]
