"""Change sources: PostgreSQL logical replication (`postgres/`) and SQLite triggers (`sqlite/`)."""

from __future__ import annotations

from urllib.parse import urlsplit

__all__ = ["POSTGRES_SCHEMES", "position_text"]

POSTGRES_SCHEMES = ("postgresql", "postgres")


def position_text(source_url: str, position: int | None) -> str:
    """A source's position as its operator reads it elsewhere: a PostgreSQL LSN in PostgreSQL's
    own X/Y notation (as `sync status` and pg_replication_slots print it), a SQLite outbox
    sequence number as it is; "none yet" before the first confirmation."""
    if position is None:
        return "none yet"
    if urlsplit(source_url).scheme in POSTGRES_SCHEMES:
        from tidegate.sync.sources.postgres.pgoutput import format_lsn

        return format_lsn(position)
    return str(position)
