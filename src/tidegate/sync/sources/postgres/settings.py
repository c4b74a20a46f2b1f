"""What the PostgreSQL source is configured with and reports, and how it connects: its settings
(from a postgresql:// URL), its status, the libpq parameters and the connection they open."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from tidegate.errors import ConfigError, SourceError
from tidegate.sync.sources.postgres import catalog as pg_catalog
from tidegate.sync.sources.postgres.driver import psycopg2
from tidegate.sync.sources.postgres.pgoutput import format_lsn
from tidegate.sync.sources.postgres.types import SESSION_OPTIONS
from tidegate.sync.values import JsonValue, source_zone

__all__ = [
    "CHECKPOINT_PREFIX", "PostgresSourceSettings", "SourceStatus", "catalog_errors", "connect",
    "connection_params", "describe", "redact_dsn",
]

# The checkpoint of a source is kept under this prefix and its slot's name.
CHECKPOINT_PREFIX = "pg:"


class PostgresSourceSettings(BaseModel):
    """How the PostgreSQL source connects and what it reads."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    dsn: str = Field(min_length=1)  # libpq keyword DSN or postgresql:// URL
    tables: tuple[str, ...] = Field(min_length=1)  # "table" (schema public) or "schema.table"
    slot_name: str = Field("tidegate", pattern=r"^[a-z0-9_]{1,63}$")
    publication_name: str = Field("tidegate", pattern=r"^[A-Za-z0-9_]{1,63}$")
    # Emit a heartbeat message this often so an idle publication does not pin WAL (None: off).
    heartbeat_s: float | None = Field(None, gt=0)
    # The zone naive `timestamp` values are read in (None: UTC).
    source_zone: str | None = None
    snapshot_batch_size: int = Field(1000, gt=0)
    # How often the confirmed position is reported to the server (psycopg2's minimum is 1 s).
    status_interval_s: float = Field(10.0, ge=1.0)
    # Committed transactions read ahead of the consumer; the reader waits when this many wait.
    max_pending_transactions: int = Field(1000, gt=0)
    # How often the catalog is compared with the tables' known shapes, to catch a schema change
    # of a table no one writes to afterwards (None: only Relation messages tell).
    schema_check_s: float | None = Field(5.0, gt=0)

    @field_validator("source_zone")
    @classmethod
    def _known_zone(cls, value: str | None) -> str | None:
        source_zone(value)  # raises InvalidChange (a ValueError) for an unknown zone
        return value

    @field_validator("tables")
    @classmethod
    def _table_names(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for name in value:
            try:
                pg_catalog.split_table_name(name)
            except SourceError as exc:
                raise ValueError(str(exc)) from None
        return value

    @classmethod
    def from_url(cls, url: str, **options: Any) -> PostgresSourceSettings:
        """Settings from a postgresql:// URL whose query may carry the fields above (`?slot_name=
        s&tables=products,users`); other query parameters stay in the DSN for libpq. Keyword
        options win over the URL. Invalid settings raise ConfigError naming them."""
        parts = urlsplit(url)
        ours, theirs = {}, []
        for key, value in parse_qsl(parts.query, keep_blank_values=True):
            if key in cls.model_fields and key != "dsn":
                ours[key] = tuple(v for v in value.split(",") if v) if key == "tables" else value
            else:
                theirs.append((key, value))
        dsn = parts._replace(query=urlencode(theirs)).geturl()
        try:
            return cls.model_validate({**ours, **options, "dsn": dsn})
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in error['loc'])}: {error['msg']}" for error in exc.errors()
            )
            raise ConfigError(
                f"invalid PostgreSQL source settings for {redact_dsn(url)}: {problems}") from None


@dataclass(frozen=True, slots=True)
class SourceStatus:
    """What `tidegate sync status` shows about the PostgreSQL source."""

    slot_name: str
    slot_exists: bool
    active: bool
    confirmed_flush_lsn: int | None
    restart_lsn: int | None
    current_lsn: int
    lag_bytes: int | None  # WAL written since the confirmed position
    table_rows: dict[str, int]  # entity type → rows (the planner's estimate where it has one)
    snapshot_done: bool | None  # None: no checkpoint for the slot

    def to_dict(self) -> dict[str, JsonValue]:
        """JSON-ready, LSNs in PostgreSQL's X/Y notation."""
        def lsn(value: int | None) -> str | None:
            return format_lsn(value) if value is not None else None

        return {
            "slot_name": self.slot_name, "slot_exists": self.slot_exists, "active": self.active,
            "confirmed_flush_lsn": lsn(self.confirmed_flush_lsn),
            "restart_lsn": lsn(self.restart_lsn), "current_lsn": lsn(self.current_lsn),
            "lag_bytes": self.lag_bytes, "table_rows": dict(self.table_rows),
            "snapshot_done": self.snapshot_done,
        }


@contextlib.contextmanager
def catalog_errors(doing: str) -> Iterator[None]:
    """Driver errors while talking to the catalog, as SourceError saying what was being done."""
    try:
        yield
    except psycopg2.Error as exc:
        raise SourceError(f"{doing}: {type(exc).__name__}: {exc}".strip()) from exc


def connection_params(dsn: str) -> dict[str, str]:
    """libpq's keywords for `dsn`, with the session settings and encoding the source relies on."""
    try:
        params: dict[str, str] = psycopg2.extensions.parse_dsn(dsn)
    except psycopg2.ProgrammingError as exc:
        raise ConfigError(f"invalid PostgreSQL DSN {redact_dsn(dsn)!r}: {exc}".strip()) from exc
    pinned = " ".join(f"-c {name}={value.replace(' ', '')}" for name, value in SESSION_OPTIONS.items())
    params["options"] = f"{params.get('options', '')} {pinned}".strip()
    # Names and values must arrive in one known encoding (pgoutput converts to the client's).
    params["client_encoding"] = "UTF8"
    params.setdefault("application_name", "tidegate-sync")
    return params


def describe(params: dict[str, str]) -> str:
    """user@host:port/dbname, for messages (never the password)."""
    user = params.get("user", "")
    return (f"{user + '@' if user else ''}{params.get('host', 'localhost')}:"
            f"{params.get('port', '5432')}/{params.get('dbname', user)}")


def redact_dsn(dsn: str) -> str:
    """`dsn` with its password masked, for messages."""
    if "://" in dsn:
        parts = urlsplit(dsn)
        if parts.password:
            return parts._replace(netloc=parts.netloc.replace(f":{parts.password}@", ":***@")).geturl()
        return dsn
    return re.sub(r"(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)", r"\1***", dsn)


def connect(params: dict[str, str], *, replication: bool) -> Any:
    """A connection with the session settings every value's text form depends on; plain ones
    are autocommit. Failures raise SourceError naming the server (never the password)."""
    factory = psycopg2.extras.LogicalReplicationConnection if replication else None
    try:
        conn = psycopg2.connect(connection_factory=factory, **params)
    except psycopg2.Error as exc:
        raise SourceError(f"cannot connect to PostgreSQL at {describe(params)}: {exc}".strip()) from exc
    if not replication:
        conn.autocommit = True
    return conn
