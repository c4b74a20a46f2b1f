"""What the SQLite source is configured with: the database file, its tables and how it polls,
from a sqlite:/// URL."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from tidegate._sqlite import sqlite_path
from tidegate.errors import ConfigError
from tidegate.sync.values import source_zone

__all__ = ["SqliteSourceSettings"]


class SqliteSourceSettings(BaseModel):
    """Where the SQLite source reads and how: `SqliteSourceSettings.from_url("sqlite:///shop.db?tables=products,users")`."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    path: str = Field(min_length=1)
    tables: tuple[str, ...] = Field(min_length=1)
    poll_interval_s: float = Field(0.01, gt=0, le=60)
    batch_size: int = Field(1_000, gt=0, le=100_000)  # outbox rows (or snapshot rows) per Transaction
    source_zone: str | None = None  # the zone naive timestamps are read in (None: UTC)
    # table → its timestamp columns, replacing those found from declared types (DATE/TIME).
    timestamp_columns: dict[str, tuple[str, ...]] = Field(default_factory=dict)

    @field_validator("path")
    @classmethod
    def _a_file(cls, value: str) -> str:
        if value == ":memory:" or value.startswith("file::memory:"):
            raise ValueError("an in-memory database has no other connections to capture: use a file")
        return value

    @field_validator("tables")
    @classmethod
    def _distinct(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        lowered = [t.lower() for t in value]
        repeated = sorted({t for t in lowered if lowered.count(t) > 1})
        if repeated:
            raise ValueError(f"table(s) listed twice: {', '.join(repeated)}")
        if any(not t.strip() for t in value):
            raise ValueError("a table name is empty")
        return value

    @field_validator("source_zone")
    @classmethod
    def _known_zone(cls, value: str | None) -> str | None:
        source_zone(value)  # raises InvalidChange (a ValueError) naming an unknown zone
        return value

    @property
    def checkpoint_name(self) -> str:
        """The checkpoint this database's snapshot progress is kept under."""
        return f"sqlite:{Path(self.path).resolve()}"

    @classmethod
    def from_url(cls, url: str, **options: Any) -> SqliteSourceSettings:
        """`sqlite:///relative.db` or `sqlite:////abs/path.db`, with query parameters
        (`?tables=products,users&poll_interval_s=0.05`) and then `options` (later ones win)."""
        parts = urlsplit(url)
        if parts.scheme != "sqlite":
            raise ConfigError(f"{url!r} is not a sqlite:/// URL")
        query: dict[str, Any] = dict(parse_qsl(parts.query))
        if "tables" in query:
            query["tables"] = tuple(t for t in query["tables"].split(",") if t)
        path = sqlite_path(url)
        try:
            return cls.model_validate({"path": path, **query, **options})
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors())
            raise ConfigError(f"invalid SQLite source settings for {url}: {problems}") from None
