"""Schema changes mid-stream: re-reading a table whose columns changed, so rows the stream does
not touch read as the database would.

PostgreSQL rewrites no cached row: after `ADD COLUMN` (with or without a default, volatile ones
included), `DROP COLUMN`, `ALTER COLUMN … TYPE` or `RENAME COLUMN`, the rows already cached are in
the old shape until something re-reads them. pgoutput tells when: a Relation message precedes the
first change of a table after its definition changed. A table no one writes to after the change
sends nothing, so the source also compares the catalog with the known shapes every few seconds and,
on a difference, writes a transactional logical message (`SCHEMA_PREFIX`) into the WAL whose
position stands for "the change is committed by now".

The rule, by version. Let L be the commit LSN of the transaction that carried the Relation message
(or the schema message). The backfill reads every row of the table, in key order and in bounded
batches, each batch in a read that starts after L committed, and writes it with version
(L, 2**32-1):

- above every change committed before L (older shapes) and above that transaction's own changes,
  which the read already contains: the backfill replaces them;
- below every change committed after L: a streamed change of a row wins over the backfilled row
  (the cache's compare-and-set on versions), whether it is applied before or after it. When it is
  applied after it, the row may show, for a moment, a state older than the backfill read, then
  the later changes of the stream bring it to the database's state: every change after L is in
  the stream. Versions never go backwards.

A backfill that dies half-way (a crash) is done again: the shape the cache holds is recorded in
the source's checkpoint only once the backfill's last batch is applied, and a restarted source
compares the catalog with that record.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import tzinfo
from typing import Any

import orjson

from tidegate.errors import InvalidChange, SourceError
from tidegate.sync.changes import MAX_ORDINAL, Change, Op, Version
from tidegate.sync.sources.postgres import catalog as pg_catalog
from tidegate.sync.sources.postgres.catalog import TableInfo
from tidegate.sync.sources.postgres.driver import psycopg2, sql
from tidegate.sync.sources.postgres.pgoutput import Relation
from tidegate.sync.sources.postgres.types import decode_text

__all__ = [
    "SCHEMA_PREFIX",
    "BackfillRequest",
    "Shape",
    "backfill_version",
    "parse_schema_message",
    "read_batch",
    "row_changes",
    "schema_message",
    "select_batch",
    "shape_of_relation",
    "shapes_of_catalog",
]

logger = logging.getLogger(__name__)

SCHEMA_PREFIX = "tidegate.schema"

Shape = tuple[tuple[str, int, int], ...]
"""A table's replicated columns in order: (name, type OID, type modifier) each. A change in any of
them can change how a cached value must read (numeric(10,2) → numeric(10,3) changes "1.50")."""

_SHAPE_SQL = """
SELECT a.attname, a.atttypid, a.atttypmod
FROM pg_attribute a
WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped AND a.attgenerated = ''
ORDER BY a.attnum
"""

_RELATION_SQL = """
SELECT c.oid FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = %s AND c.relname = %s AND c.relkind IN ('r', 'p')
"""


@dataclass(frozen=True, slots=True)
class BackfillRequest:
    """Re-read `entity_type` (configured as `table`) at `version`; `shape` None: the table was
    dropped (its rows were removed by a TRUNCATE change; nothing to read)."""

    table: str
    entity_type: str
    version: Version
    shape: Shape | None
    reason: str


def backfill_version(commit_lsn: int) -> Version:
    """The version of rows re-read because of a schema change seen in the transaction that
    committed at `commit_lsn`: above that transaction's changes, below every later one."""
    return Version(commit_lsn, MAX_ORDINAL)


def shape_of_relation(relation: Relation) -> Shape:
    """The shape a Relation message describes."""
    return tuple((c.name, c.type_oid, c.type_modifier) for c in relation.columns)


def shapes_of_catalog(cur: Any, tables: Sequence[str]) -> dict[str, Shape | None]:
    """Configured table name → its shape now (None: the table does not exist)."""
    shapes: dict[str, Shape | None] = {}
    for name in tables:
        schema, table = pg_catalog.split_table_name(name)
        cur.execute(_RELATION_SQL, (schema, table))
        row = cur.fetchone()
        if row is None:
            shapes[name] = None
            continue
        cur.execute(_SHAPE_SQL, (row[0],))
        shapes[name] = tuple((n, int(oid), int(mod)) for n, oid, mod in cur.fetchall())
    return shapes


def schema_message(entity_type: str, shape: Shape | None) -> str:
    """The content of a schema message: the table's entity type and its shape (null: dropped)."""
    return orjson.dumps({"entity_type": entity_type,
                         "shape": [list(c) for c in shape] if shape is not None else None}).decode()


def parse_schema_message(content: bytes) -> tuple[str, Shape | None]:
    """The inverse of `schema_message`."""
    try:
        raw = orjson.loads(content)
        shape = raw["shape"]
        return str(raw["entity_type"]), (
            tuple((str(n), int(o), int(m)) for n, o, m in shape) if shape is not None else None)
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        raise SourceError(f"malformed {SCHEMA_PREFIX} message {content[:200]!r}") from exc


def encode_shape(shape: Shape | None) -> list[list[str | int]] | None:
    """A shape as the checkpoint stores it (JSON)."""
    return [list(c) for c in shape] if shape is not None else None


def decode_shape(value: object) -> Shape | None:
    """The inverse of `encode_shape`."""
    if not isinstance(value, list):
        return None
    return tuple((str(n), int(o), int(m)) for n, o, m in value)


# ---------------------------------------------------------------------- reading rows


def select_batch(cur: Any, table: TableInfo, after: Sequence[str | None] | None,
                 limit: int) -> list[dict[str, str | None]]:
    """Up to `limit` rows of `table` after key `after` (key texts) in key order (keyset
    pagination: a batch costs the same anywhere in the table), each column as its type's text
    (the cursor must return text, as pgoutput sends it: pg_types decodes both the same way)."""
    keys = sql.SQL(", ").join(sql.Identifier(c) for c in table.key_columns)
    where = sql.SQL("")
    if after is not None:
        typed = sql.SQL(", ").join(sql.SQL("%s::" + t) for t in table.key_types)
        where = sql.SQL("WHERE ({}) > ({})").format(keys, typed)
    query = sql.SQL("SELECT {} FROM {} {} ORDER BY {} LIMIT {}").format(
        sql.SQL(", ").join(sql.Identifier(c) for c in table.columns), table.identifier,
        where, keys, sql.Literal(limit))
    cur.execute(query, tuple(after) if after is not None else None)
    return [dict(zip(table.columns, row, strict=True)) for row in cur.fetchall()]


def decode_row(table: TableInfo, row: Mapping[str, str | None], base_types: Mapping[int, int],
               zone: tzinfo) -> dict[str, Any]:
    """A row read as PostgreSQL's text, decoded column by column as the stream decodes its values
    (timestamps made aware in the source zone)."""
    return {column: decode_text(base_types.get(oid, oid), row[column], zone)
            for column, oid in table.type_oids.items()}


def row_changes(table: TableInfo, rows: Sequence[Mapping[str, str | None]], version: Version,
                commit_time: Any, base_types: Mapping[int, int], zone: tzinfo,
                documents: bool) -> list[Change]:
    """Rows read as text, as INSERT changes at `version` (timestamps made aware in the source
    zone by the decoder, as the stream's are); `documents`: the key is one JSON column, whose
    entity ids take the array form."""
    changes = []
    for row in rows:
        values = decode_row(table, row, base_types, zone)
        try:
            changes.append(Change.of_row(
                entity_type=table.entity_type, op=Op.INSERT, key_columns=table.key_columns,
                version=version, commit_time=commit_time, after=values, documents=documents,
                read=True))
        except InvalidChange as exc:
            raise SourceError(f"row of {table.entity_type} read from the table: {exc}") from exc
    return changes


def read_batch(conn: Any, request: BackfillRequest, after: list[str | None] | None, size: int,
               base_types: Mapping[int, int], zone: tzinfo,
               documents: Callable[[TableInfo], bool],
               ) -> tuple[list[Change], list[str | None] | None, TableInfo | None]:
    """One backfill batch in a short REPEATABLE READ transaction of its own: the table as the
    catalog describes it now and up to `size` rows after key `after`. Returns the changes, the key
    of the last row (as text) and the table (None: it no longer exists, the backfill ends).

    The transaction reads the catalog and the rows at one snapshot, so the columns asked for are
    the ones the rows have even if another ALTER commits meanwhile (it sends a Relation message of
    its own and so a backfill of its own)."""
    conn.autocommit = False
    conn.set_session(isolation_level=psycopg2.extensions.ISOLATION_LEVEL_REPEATABLE_READ,
                     readonly=True)
    try:
        with conn.cursor() as cur:
            if shapes_of_catalog(cur, [request.table])[request.table] is None:
                return [], None, None
            (table,) = pg_catalog.inspect_tables(cur, [request.table])
            cur.execute("SELECT now()")
            (as_of,) = cur.fetchone()
            psycopg2.extensions.register_type(raw_text_caster(), cur)
            rows = select_batch(cur, table, after, size)
    except psycopg2.Error as exc:
        raise SourceError(f"backfill read of {request.entity_type} failed: {exc}".strip()) from exc
    finally:
        with contextlib.suppress(psycopg2.Error):
            conn.rollback()
    changes = row_changes(table, rows, request.version, as_of, base_types, zone, documents(table))
    last = [rows[-1][column] for column in table.key_columns] if rows else after
    return changes, last, table


def raw_text_caster() -> Any:
    """A psycopg2 type caster that leaves every value as the text its output function wrote.
    psycopg2 leaves types it has no caster for as text; this covers the ones it has."""
    oids = tuple(psycopg2.extensions.string_types)
    return psycopg2.extensions.new_type(oids, "TIDEGATE_RAW_TEXT", lambda value, _cursor: value)
