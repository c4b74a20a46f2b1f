"""psycopg2 for the PostgreSQL source, imported in one place: without the `postgres` extra,
importing the source says how to install it."""

from __future__ import annotations

from tidegate.errors import MissingDependency

try:
    import psycopg2  # type: ignore[import-untyped]
    import psycopg2.errors  # type: ignore[import-untyped]
    import psycopg2.extensions  # type: ignore[import-untyped]
    import psycopg2.extras  # type: ignore[import-untyped]
    from psycopg2 import sql
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise MissingDependency(
        "the PostgreSQL source needs psycopg2: pip install 'tidegate[postgres]'"
    ) from exc

__all__ = ["psycopg2", "sql"]
