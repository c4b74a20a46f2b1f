"""What the PostgreSQL source reads from and writes to the catalog: the configured tables (columns,
types, keys, replica identity), the publication, the replication slot and its status.

Everything here is blocking psycopg2 on a plain connection; the source calls it from a thread.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from tidegate.errors import SourceError
from tidegate.sync.sources.postgres.driver import sql
from tidegate.sync.sources.postgres.pgoutput import parse_lsn

__all__ = [
    "SlotInfo",
    "TableInfo",
    "base_types",
    "drop_slot",
    "ensure_publication",
    "entity_type_of",
    "inspect_tables",
    "row_estimates",
    "slot_info",
    "split_table_name",
    "warn_toast_risk",
]

logger = logging.getLogger(__name__)

DEFAULT_SCHEMA = "public"
# How long dropping a slot waits for the walsender of a connection that just closed to let go.
SLOT_RELEASE_WAIT_S = 10.0

# Storage strategies that let PostgreSQL move a value out of line (TOAST): extended, external,
# main. Only 'p' (plain: fixed-size types such as int or timestamp) is never TOASTed.
_TOASTABLE_STORAGE = ("x", "e", "m")



def entity_type_of(schema: str, name: str) -> str:
    """The entity type of a table's changes: its name, schema-qualified outside `public`."""
    return name if schema == DEFAULT_SCHEMA else f"{schema}.{name}"

@dataclass(frozen=True, slots=True)
class TableInfo:
    """One configured table as the catalog describes it."""

    schema: str
    name: str
    relation_id: int
    columns: tuple[str, ...]  # in attnum order, generated columns left out (pgoutput omits them)
    type_oids: dict[str, int]
    key_columns: tuple[str, ...]  # the replica identity index when USING INDEX, else the primary key
    key_types: tuple[str, ...]  # format_type of each key column, for typed keyset comparisons
    replica_identity: str  # pg_class.relreplident: d(efault), n(othing), f(ull), i(ndex)
    toastable: tuple[str, ...]  # columns whose values may be TOASTed

    @property
    def entity_type(self) -> str:
        """The changes' entity type: the table's name, schema-qualified outside `public`."""
        return entity_type_of(self.schema, self.name)

    @property
    def identifier(self) -> Any:
        """The table as a quoted SQL identifier."""
        return sql.Identifier(self.schema, self.name)


@dataclass(frozen=True, slots=True)
class SlotInfo:
    """A replication slot as pg_replication_slots shows it."""

    name: str
    plugin: str | None
    database: str | None
    active: bool
    active_pid: int | None
    confirmed_flush_lsn: int | None
    restart_lsn: int | None


def entity_type_of_name(name: str) -> str:
    """The entity type of a configured table name ("table" or "schema.table"), as
    `TableInfo.entity_type` names it."""
    return entity_type_of(*split_table_name(name))


def split_table_name(name: str) -> tuple[str, str]:
    """("schema", "table") of "schema.table" or "table" (in `public`)."""
    schema, dot, table = name.strip().rpartition(".")
    if not table or (dot and not schema):
        raise SourceError(f"{name!r} is not a table name (table or schema.table)")
    return (schema or DEFAULT_SCHEMA), table


_TABLE_SQL = """
SELECT c.oid, c.relreplident, c.relkind
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = %s AND c.relname = %s
"""

_COLUMNS_SQL = """
SELECT a.attname, a.atttypid, a.attstorage, format_type(a.atttypid, a.atttypmod)
FROM pg_attribute a
WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped AND a.attgenerated = ''
ORDER BY a.attnum
"""

# The replica identity index when REPLICA IDENTITY USING INDEX names one (its columns are what
# the old key tuple carries, and a change of them is what PostgreSQL reports as a key change),
# else the primary key; columns in index order.
_KEY_SQL = """
SELECT i.indisprimary, array_agg(a.attname ORDER BY k.ord)
FROM pg_index i
CROSS JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord)
JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
WHERE i.indrelid = %s AND (i.indisprimary OR i.indisreplident)
GROUP BY i.indexrelid, i.indisprimary, i.indisreplident
ORDER BY i.indisreplident DESC, i.indisprimary DESC
LIMIT 1
"""


def inspect_tables(cur: Any, names: Sequence[str]) -> list[TableInfo]:
    """Look up every configured table; one that is missing or has neither a primary key nor a
    replica identity index raises SourceError naming it."""
    tables = []
    for name in names:
        schema, table = split_table_name(name)
        cur.execute(_TABLE_SQL, (schema, table))
        row = cur.fetchone()
        if row is None:
            raise SourceError(f"table {schema}.{table} does not exist (configured as {name!r})")
        relation_id, identity, kind = row
        if kind not in ("r", "p"):
            raise SourceError(f"{schema}.{table} is not a table (relkind {kind!r})")
        cur.execute(_COLUMNS_SQL, (relation_id,))
        columns = cur.fetchall()
        cur.execute(_KEY_SQL, (relation_id,))
        key_row = cur.fetchone()
        if key_row is None:
            raise SourceError(
                f"table {schema}.{table} has neither a primary key nor a replica identity index: "
                "its rows cannot be identified (add a primary key)"
            )
        key_columns = tuple(key_row[1])
        sql_types = {column: sql_type for column, _, _, sql_type in columns}
        tables.append(TableInfo(
            schema=schema, name=table, relation_id=relation_id,
            columns=tuple(column for column, *_ in columns),
            type_oids={column: oid for column, oid, _, _ in columns},
            key_columns=key_columns,
            key_types=tuple(sql_types[column] for column in key_columns),
            replica_identity=identity,
            toastable=tuple(column for column, _, storage, _ in columns
                            if storage in _TOASTABLE_STORAGE),
        ))
    return tables


def toast_risk(tables: Iterable[TableInfo]) -> str | None:
    """One line naming the tables whose unchanged TOASTed columns cannot come from a before-image
    (any table with a text column but REPLICA IDENTITY FULL), or None when there are none."""
    identities = {"d": "DEFAULT", "n": "NOTHING", "i": "USING INDEX"}
    by_identity: dict[str, list[str]] = {}
    for table in tables:
        if table.replica_identity != "f" and table.toastable:
            name = identities.get(table.replica_identity, table.replica_identity)
            by_identity.setdefault(name, []).append(f"{table.schema}.{table.name}")
    if not by_identity:
        return None
    listed = "; ".join(f"REPLICA IDENTITY {identity}: {', '.join(names)}"
                       for identity, names in by_identity.items())
    return (f"{listed}. An update leaving a large (TOASTed) value unchanged is completed from the "
            "row's previous image or the table; REPLICA IDENTITY FULL sends it instead")


def warn_toast_risk(tables: Iterable[TableInfo]) -> None:
    """Warn once, in one line, about the tables `toast_risk` names: an ordinary table with a text
    column is one, and is served correctly; the line says what an update of it costs."""
    line = toast_risk(tables)
    if line is not None:
        logger.warning("%s", line)


def base_types(cur: Any) -> dict[int, int]:
    """Domain type OID → the OID of the built-in type under it (domains of domains resolved).
    pgoutput names a domain column's type by the domain's OID, a SELECT by its base type's."""
    cur.execute("SELECT oid, typbasetype FROM pg_type WHERE typtype = 'd'")
    direct = {oid: base for oid, base in cur.fetchall()}
    resolved = {}
    for oid, base in direct.items():
        seen = {oid}
        while base in direct and base not in seen:
            seen.add(base)
            base = direct[base]
        resolved[oid] = base
    return resolved


def ensure_publication(cur: Any, publication: str, tables: Sequence[TableInfo]) -> None:
    """Create the publication FOR TABLE the configured tables, or add the ones it lacks."""
    cur.execute("SELECT puballtables FROM pg_publication WHERE pubname = %s", (publication,))
    row = cur.fetchone()
    identifiers = [table.identifier for table in tables]
    if row is None:
        cur.execute(sql.SQL("CREATE PUBLICATION {} FOR TABLE {}").format(
            sql.Identifier(publication), sql.SQL(", ").join(identifiers)))
        logger.info("created publication %s for %s", publication,
                    ", ".join(table.entity_type for table in tables))
        return
    if row[0]:
        return  # FOR ALL TABLES already covers them
    cur.execute("SELECT schemaname, tablename FROM pg_publication_tables WHERE pubname = %s",
                (publication,))
    published = {(schema, name) for schema, name in cur.fetchall()}
    missing = [table for table in tables if (table.schema, table.name) not in published]
    if missing:
        cur.execute(sql.SQL("ALTER PUBLICATION {} ADD TABLE {}").format(
            sql.Identifier(publication), sql.SQL(", ").join(t.identifier for t in missing)))
        logger.info("added %s to publication %s",
                    ", ".join(table.entity_type for table in missing), publication)


def slot_info(cur: Any, slot_name: str) -> SlotInfo | None:
    """The slot, or None when it does not exist."""
    cur.execute(
        "SELECT slot_name, plugin, database, active, active_pid, confirmed_flush_lsn::text, "
        "restart_lsn::text FROM pg_replication_slots WHERE slot_name = %s", (slot_name,))
    row = cur.fetchone()
    if row is None:
        return None
    name, plugin, database, active, pid, confirmed, restart = row
    return SlotInfo(name, plugin, database, bool(active), pid,
                    parse_lsn(confirmed) if confirmed else None,
                    parse_lsn(restart) if restart else None)


def drop_slot(cur: Any, slot_name: str) -> None:
    """Drop the slot; one in use by another connection raises SourceError naming its pid."""
    deadline = time.monotonic() + SLOT_RELEASE_WAIT_S
    info = slot_info(cur, slot_name)
    while info is not None and info.active and time.monotonic() < deadline:
        time.sleep(0.1)
        info = slot_info(cur, slot_name)
    if info is None:
        return
    if info.active:
        raise SourceError(
            f"replication slot {slot_name} is in use by backend pid {info.active_pid}: stop the "
            "other tidegate sync process first"
        )
    cur.execute("SELECT pg_drop_replication_slot(%s)", (slot_name,))


def row_estimates(cur: Any, tables: Sequence[TableInfo]) -> dict[str, int]:
    """Rows per table: the planner's estimate, counted when the table was never analysed."""
    counts = {}
    for table in tables:
        cur.execute("SELECT reltuples::bigint FROM pg_class WHERE oid = %s", (table.relation_id,))
        row = cur.fetchone()
        estimate = int(row[0]) if row is not None else -1
        if estimate < 0:
            cur.execute(sql.SQL("SELECT count(*) FROM {}").format(table.identifier))
            counted = cur.fetchone()
            estimate = int(counted[0]) if counted is not None else 0
        counts[table.entity_type] = estimate
    return counts


def deferrable_keys(cur: Any, tables: Sequence[TableInfo]) -> frozenset[str]:
    """Entity types of the tables with a DEFERRABLE primary key or unique constraint."""
    cur.execute("SELECT DISTINCT conrelid FROM pg_constraint WHERE contype IN ('p', 'u') "
                "AND condeferrable AND conrelid = ANY(%s)", ([t.relation_id for t in tables],))
    deferrable = {row[0] for row in cur.fetchall()}
    return frozenset(t.entity_type for t in tables if t.relation_id in deferrable)
