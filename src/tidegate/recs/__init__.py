"""Real-time recommendations computed incrementally from the change flow."""

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

__all__ = [
    "DEFAULT_KIND_WEIGHTS",
    "Interaction",
    "InteractionKind",
    "Item",
    "RecQuery",
    "RecResult",
    "Recommendation",
    "RecsSettings",
]
