"""Real-time recommendations computed incrementally from the change flow."""

from tidegate.recs.engine import Recommender
from tidegate.recs.model import (
    DEFAULT_KIND_WEIGHTS,
    Interaction,
    InteractionKind,
    Item,
    Recommendation,
    RecQuery,
    RecResult,
    RecsSettings,
)
from tidegate.recs.store.base import RecsStore, recs_store_for

__all__ = [
    "DEFAULT_KIND_WEIGHTS",
    "Interaction",
    "InteractionKind",
    "Item",
    "RecQuery",
    "RecResult",
    "Recommendation",
    "Recommender",
    "RecsSettings",
    "RecsStore",
    "recs_store_for",
]
