"""The event bus: `bus_for("memory://" | "redis://…" | "kafka://…")` (see `base`)."""

from tidegate.sync.buses.base import (
    BusBase,
    BusSettings,
    SubscriptionBase,
    bus_for,
)

__all__ = [
    "BusBase",
    "BusSettings",
    "SubscriptionBase",
    "bus_for",
]
