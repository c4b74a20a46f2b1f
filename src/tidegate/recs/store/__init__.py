"""The recommender's state: `recs_store_for("memory://" | "redis://…")`, one module per backend
behind the contract of `base` (where the state's types live)."""

from tidegate.recs.store.base import RecsStore, recs_store_for

__all__ = ["RecsStore", "recs_store_for"]
