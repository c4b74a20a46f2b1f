"""What the SQLite source puts into the database it watches, and how it reads rows back.

Every captured table gets AFTER INSERT, UPDATE and DELETE triggers that write the row's images
(`json_object` over its columns) to the outbox table `_tidegate_outbox`, in the transaction that
changed the row: a change is in the outbox exactly when it is committed. Outbox sequence numbers
come from AUTOINCREMENT, so they are never reused, and SQLite has one writer at a time, so they
are assigned in commit order.

- Keys: the table's PRIMARY KEY columns (composite keys too). A table without one is keyed by
  its rowid, which then appears in the row images as the column `rowid`; VACUUM may renumber the
  rowids of such a table, so give captured tables a primary key.
- Values travel as SQLite holds them, with two exceptions JSON forces: a BLOB becomes lower-case
  hex (as `canonical` writes bytes) and a REAL is written with 17 significant digits by SQLite's
  own printf, so it reads back as the same double (SQLite's printf is exact below about 1e200;
  the JSON functions would round to 15 digits). An infinite REAL arrives as the text "Inf".
  The snapshot reads rows through the same expressions, so a row hashes the same either way.
- Trigger names carry a hash of their SQL: when a table's columns change, the names no longer
  match, and installing again replaces them. Triggers name every column, so SQLite refuses
  `ALTER TABLE … DROP COLUMN` on a captured table: run `drop_triggers`, the ALTER and
  `install_triggers` in one transaction (nothing is missed, nothing is blocked).
- `INSERT OR REPLACE` removes a conflicting row without firing DELETE triggers unless
  `PRAGMA recursive_triggers` is on: a row replaced under its own key arrives as an insert that
  overwrites it, but one removed for another UNIQUE column goes unseen. Use an upsert
  (`ON CONFLICT … DO UPDATE`) or turn recursive triggers on.
"""

from __future__ import annotations

import enum
import hashlib
import logging
import sqlite3
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import date, datetime, tzinfo
from typing import Any

from tidegate.errors import InvalidChange, SourceError
from tidegate.sync.values import Row, normalise_timestamp

__all__ = [
    "OUTBOX",
    "OUTBOX_SCHEMA",
    "ROWID",
    "RowReader",
    "TableShape",
    "captured_tables",
    "drop_triggers",
    "drop_triggers_except",
    "install_triggers",
    "quote_identifier",
    "read_shape",
]

log = logging.getLogger("tidegate.sync.sqlite")

OUTBOX = "_tidegate_outbox"
TRIGGER_PREFIX = "_tidegate_"
ROWID = "rowid"  # the key column of a table without a primary key

OUTBOX_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS {OUTBOX} (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,  -- never reused: positions only grow
    entity_type TEXT NOT NULL,
    op TEXT NOT NULL,                       -- insert | update | delete
    key_json TEXT NOT NULL,
    before_json TEXT,
    after_json TEXT,
    changed_at TEXT NOT NULL                -- the statement's time, UTC: SQLite has no commit time
);
"""

# json_object takes at most SQLITE_MAX_FUNCTION_ARG (100 by default) arguments: wider rows are
# continued with json_insert, 48 columns per call.
_COLUMNS_PER_CALL = 48
_MAX_DOUBLE = "1.7976931348623157e308"
_HASH_CHARS = 12
_OPS = ("insert", "update", "delete")


class ColumnKind(enum.Enum):
    """How a column's values are normalised, from its declared type (or the settings)."""

    PLAIN = "plain"
    TIMESTAMP = "timestamp"  # TIMESTAMP, DATETIME, TIMESTAMPTZ…: UTC ISO 8601
    DATE = "date"  # DATE: the date as written, never shifted by a zone


def column_kind(declared_type: str) -> ColumnKind:
    """The kind of a column declared with `declared_type`. A TIME-of-day column has no date to
    place it in UTC, so it stays plain (its values pass as written)."""
    upper = declared_type.upper()
    if "TIMESTAMP" in upper or ("DATE" in upper and "TIME" in upper):
        return ColumnKind.TIMESTAMP
    if "DATE" in upper:
        return ColumnKind.DATE
    return ColumnKind.PLAIN


def quote_identifier(identifier: str) -> str:
    """`identifier` as an SQL identifier."""
    return '"' + identifier.replace('"', '""') + '"'


def _literal(text: str) -> str:
    """`text` as an SQL string literal."""
    return "'" + text.replace("'", "''") + "'"


@dataclass(frozen=True, slots=True)
class TableShape:
    """A captured table as the triggers and the reader see it."""

    name: str
    columns: tuple[str, ...]  # the image's columns, in table order (`rowid` first when keyed by it)
    key_columns: tuple[str, ...]
    kinds: Mapping[str, ColumnKind] = field(default_factory=dict)  # columns that are not PLAIN

    @property
    def keyed_by_rowid(self) -> bool:
        """True for a table without a primary key."""
        return self.key_columns == (ROWID,)

    def image_sql(self, ref: str) -> str:
        """An SQL expression: the JSON object of row `ref` (NEW, OLD or the table itself)."""
        pairs = [(column, _value_sql(f"{ref}.{quote_identifier(column)}")) for column in self.columns]
        head, rest = pairs[:_COLUMNS_PER_CALL], pairs[_COLUMNS_PER_CALL:]
        expr = "json_object(" + ", ".join(f"{_literal(c)}, {v}" for c, v in head) + ")"
        for start in range(0, len(rest), _COLUMNS_PER_CALL):
            chunk = rest[start:start + _COLUMNS_PER_CALL]
            expr = f"json_insert({expr}, " + ", ".join(
                f"{_literal('$.' + _json_key(c))}, {v}" for c, v in chunk) + ")"
        return expr

    def key_sql(self, ref: str) -> str:
        """An SQL expression: the JSON object of row `ref`'s key columns."""
        return "json_object(" + ", ".join(
            f"{_literal(c)}, {_value_sql(f'{ref}.{quote_identifier(c)}')}" for c in self.key_columns) + ")"

    def triggers(self) -> dict[str, str]:
        """Trigger name → CREATE TRIGGER statement, for the three operations."""
        made: dict[str, str] = {}
        for op in _OPS:
            before = self.image_sql("OLD") if op != "insert" else "NULL"
            after = self.image_sql("NEW") if op != "delete" else "NULL"
            key = self.key_sql("OLD" if op == "delete" else "NEW")
            body = (
                f"INSERT INTO {OUTBOX} (entity_type, op, key_json, before_json, after_json, changed_at) "
                f"VALUES ({_literal(self.name)}, {_literal(op)}, {key}, {before}, {after}, "
                "strftime('%Y-%m-%dT%H:%M:%fZ', 'now'));"
            )
            digest = hashlib.sha256(f"{self.name}\0{op}\0{body}".encode()).hexdigest()[:_HASH_CHARS]
            name = f"{TRIGGER_PREFIX}{self.name}_{op}_{digest}"
            made[name] = (f"CREATE TRIGGER IF NOT EXISTS {quote_identifier(name)} AFTER {op.upper()} "
                          f"ON {quote_identifier(self.name)} FOR EACH ROW BEGIN {body} END")
        return made

    def select_sql(self, *, after_key: bool) -> str:
        """The snapshot's page query: raw key values, then the image; by key, after a key if asked."""
        keys = ", ".join(quote_identifier(c) for c in self.key_columns)
        table = quote_identifier(self.name)
        where = f" WHERE ({keys}) > ({', '.join('?' for _ in self.key_columns)})" if after_key else ""
        return (f"SELECT {keys}, {self.image_sql(table)} FROM {table}{where} "
                f"ORDER BY {keys} LIMIT ?")

    def row_sql(self) -> str:
        """The image of the row with the given raw key values."""
        table = quote_identifier(self.name)
        match = " AND ".join(f"{quote_identifier(c)} IS ?" for c in self.key_columns)
        return f"SELECT {self.image_sql(table)} FROM {table} WHERE {match}"


def _value_sql(column: str) -> str:
    # A BLOB cannot be a JSON value; a REAL would lose digits (see the module doc).
    real = (f"CASE WHEN abs({column}) <= {_MAX_DOUBLE} THEN json(printf('%!.17g', {column})) "
            f"ELSE printf('%!.17g', {column}) END")
    return (f"CASE typeof({column}) WHEN 'blob' THEN lower(hex({column})) "
            f"WHEN 'real' THEN {real} ELSE {column} END")


def _json_key(column: str) -> str:
    if '"' in column:
        raise SourceError(f"column {column!r} cannot be captured: a name with '\"' in a table of "
                          f"more than {_COLUMNS_PER_CALL} columns has no JSON path")
    return f'"{column}"'


def read_shape(conn: sqlite3.Connection, table: str,
               timestamp_columns: Sequence[str] | None = None) -> TableShape:
    """The shape of `table` as the database has it now. `timestamp_columns`, when given,
    replaces the timestamp columns found from declared types (DATE columns stay dates)."""
    found = conn.execute(
        "SELECT type, name, sql FROM sqlite_master WHERE type IN ('table', 'view') "
        "AND name = ? COLLATE NOCASE", (table,)).fetchone()
    if found is None:
        raise SourceError(f"table {table!r} does not exist")
    kind, name, sql = found
    if kind != "table" or str(sql or "").upper().startswith("CREATE VIRTUAL"):
        raise SourceError(f"{table!r} is a {'view' if kind == 'view' else 'virtual table'}: "
                          "only ordinary tables can be captured")
    if name.startswith(TRIGGER_PREFIX):
        raise SourceError(f"table {table!r} belongs to tidegate and cannot be captured")
    # hidden: 0 an ordinary column, 2/3 a generated one (both are in NEW/OLD and in SELECT).
    info = conn.execute("SELECT name, type, pk FROM pragma_table_xinfo(?) WHERE hidden IN (0, 2, 3) "
                        "ORDER BY cid", (name,)).fetchall()
    columns = tuple(str(c) for c, _, _ in info)
    keys = tuple(str(c) for c, _, pk in sorted((r for r in info if r[2]), key=lambda r: r[2]))
    if not keys:
        if ROWID in (c.lower() for c in columns):
            raise SourceError(f"table {name!r} has no primary key and a column named rowid: "
                              "give it a primary key to capture it")
        keys = (ROWID,)
        columns = (ROWID, *columns)
    kinds = {str(c): column_kind(str(t or "")) for c, t, _ in info}
    if timestamp_columns is not None:
        unknown = sorted(set(timestamp_columns) - set(columns))
        if unknown:
            raise SourceError(f"timestamp column(s) {', '.join(unknown)} do not exist in table {name!r}")
        kinds = {c: k for c, k in kinds.items() if k is ColumnKind.DATE}
        kinds.update(dict.fromkeys(timestamp_columns, ColumnKind.TIMESTAMP))
    return TableShape(name, columns, keys, {c: k for c, k in kinds.items() if k is not ColumnKind.PLAIN})


def _our_triggers(conn: sqlite3.Connection, table: str | None = None) -> list[tuple[str, str]]:
    rows = conn.execute(
        "SELECT name, tbl_name FROM sqlite_master WHERE type = 'trigger' AND name LIKE ? ESCAPE '\\'",
        (TRIGGER_PREFIX.replace("_", "\\_") + "%",)).fetchall()
    return [(str(n), str(t)) for n, t in rows if table is None or str(t).lower() == table.lower()]


def captured_tables(conn: sqlite3.Connection) -> set[str]:
    """The tables (lower-cased) that carry tidegate's capture triggers."""
    return {table.lower() for _, table in _our_triggers(conn)}


def install_triggers(conn: sqlite3.Connection, shape: TableShape) -> bool:
    """Create the outbox if missing and make `shape`'s triggers the table's capture triggers,
    in the caller's transaction. True when anything changed (nothing does when they are current)."""
    conn.execute(OUTBOX_SCHEMA)
    wanted = shape.triggers()
    existing = {name for name, _ in _our_triggers(conn, shape.name)}
    if existing == set(wanted):
        return False
    for name in existing - set(wanted):
        conn.execute(f"DROP TRIGGER IF EXISTS {quote_identifier(name)}")
    for name in set(wanted) - existing:
        conn.execute(wanted[name])
    return True


def drop_triggers(conn: sqlite3.Connection, table: str) -> int:
    """Remove tidegate's capture triggers from `table` in the caller's transaction (the outbox
    stays); how many there were."""
    names = [name for name, _ in _our_triggers(conn, table)]
    for name in names:
        conn.execute(f"DROP TRIGGER IF EXISTS {quote_identifier(name)}")
    return len(names)


def drop_triggers_except(conn: sqlite3.Connection, tables: Iterable[str]) -> list[str]:
    """Remove capture triggers from every table not in `tables` (no longer configured, so its
    changes would only fill the outbox); the tables they were on."""
    keep = {t.lower() for t in tables}
    dropped = sorted({t for name, t in _our_triggers(conn) if t.lower() not in keep})
    for table in dropped:
        drop_triggers(conn, table)
    return dropped


class RowReader:
    """Brings one table's row images (parsed outbox JSON or snapshot rows) to the form changes
    carry: timestamp columns as UTC ISO 8601, DATE columns as ISO dates. A value that is not a
    timestamp is passed on unchanged with a warning (once per column), never dropped."""

    def __init__(self, shape: TableShape, zone: tzinfo) -> None:
        self.shape = shape
        self._zone = zone
        self._warned: set[str] = set()

    def normalise(self, row: dict[str, Any]) -> Row:
        """`row` with its timestamp and date columns normalised (in place, and returned)."""
        for column, kind in self.shape.kinds.items():
            value = row.get(column)
            if value is None:
                continue
            try:
                row[column] = (normalise_timestamp(value, self._zone) if kind is ColumnKind.TIMESTAMP
                               else _iso_date(value, self._zone))
            except InvalidChange as exc:
                if column not in self._warned:
                    self._warned.add(column)
                    log.warning("%s.%s: %s; such values are passed on as written",
                                self.shape.name, column, exc)
        return row

    def missing(self, row: Mapping[str, Any]) -> list[str]:
        """Columns of the table that `row` lacks (an image written before a column was added)."""
        return [c for c in self.shape.columns if c not in row]


def _iso_date(value: object, zone: tzinfo) -> str:
    if isinstance(value, str):
        text = value.strip()
        try:
            return date.fromisoformat(text).isoformat()
        except ValueError:
            pass
        try:  # a date with a time of day: the date as written
            return datetime.fromisoformat(text.replace("Z", "+00:00").replace(" ", "T", 1)).date().isoformat()
        except ValueError:
            pass
    # An epoch number (or numeric text): the day it falls on in the source's zone.
    moment = datetime.fromisoformat(normalise_timestamp(value, zone))
    return moment.astimezone(zone).date().isoformat()
