"""Debezium's change event envelope (`?format=debezium` on kafka:// and redis:// bus URLs).

The layout follows the Debezium PostgreSQL connector's documentation, "Data change events"
(https://debezium.io/documentation/reference/stable/connectors/postgresql.html#postgresql-events,
mirrored at https://docs.redhat.com/en/documentation/red_hat_build_of_debezium/2.3.7/html/
debezium_user_guide/descriptions-of-debezium-postgresql-connector-data-change-events), so that
consumers written for Debezium read what tidegate publishes:

- key: the primary-key columns, `{"id": 7}` (a truncate has no row, so no key: null);
- value: `{"before", "after", "source", "op", "ts_ms", "ts_us", "ts_ns", "transaction"}`, `op`
  one of c (insert), u (update), d (delete), r (snapshot read), t (truncate); `before` is the
  old row where the source has it (REPLICA IDENTITY FULL, the SQLite outbox), else null, and for
  a delete without it the key columns, as Debezium writes it; `ts_ms` (`ts_us`, `ts_ns`) is when
  the source saw the change;
- `source`: `version` (tidegate's), `connector` ("postgresql" or "sqlite"), `name` (the bus
  prefix, Debezium's `topic.prefix`), `ts_ms`/`ts_us`/`ts_ns` (the commit time), `snapshot`
  ("true" for snapshot reads, else "false"), `db`, `sequence` (null: tidegate does not know
  the previous commit's LSN), `schema`, `table`, `txId`, `lsn` (the transaction's commit LSN;
  the SQLite outbox's sequence number), `xmin` (null);
- `transaction`: null, as Debezium writes it without `provide.transaction.metadata`;
- with `schemas=true`, key and value are wrapped as `{"schema": …, "payload": …}`, as Kafka's
  JsonConverter writes them with `schemas.enable=true`; the default is schemaless (the
  converter's `schemas.enable=false`).

Values are tidegate's canonical row values (`tidegate.sync.values`), which are Debezium's JSON
rendering for `decimal.handling.mode=string` (numeric as a plain decimal string),
`binary.handling.mode=hex`, uuid, text and numbers, and for timestamptz in every
`time.precision.mode` (`io.debezium.time.ZonedTimestamp`, ISO 8601 in UTC). A change does not
carry its columns' declared types, so timestamp without time zone, date and time keep their ISO
strings (Debezium's `adaptive` mode would write epoch integers) and json/jsonb values stay JSON
(Debezium writes `io.debezium.data.Json` as a string). Columns PostgreSQL did not send (unchanged
TOAST values the source could not fill) carry Debezium's `unavailable.value.placeholder`,
`__debezium_unavailable_value`.

What Debezium has no field for travels beside the value, so tidegate's own consumers rebuild the
exact change (`change_of`): the version and the entity id, as Kafka record headers or as extra
fields of the Redis stream entry (`tidegate.version`, `tidegate.entity_id`).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any, Literal, NamedTuple

import orjson

import tidegate
from tidegate.errors import InvalidChange
from tidegate.sync.changes import MAX_ORDINAL, TRUNCATED, Change, Op, Version, entity_id_of
from tidegate.sync.values import JsonValue, Row

__all__ = [
    "ENTITY_ID_HEADER",
    "UNAVAILABLE",
    "VERSION_HEADER",
    "Connector",
    "DebeziumRecord",
    "DebeziumSource",
    "change_of",
    "records_of",
    "topic_of",
]

Connector = Literal["postgresql", "sqlite"]

UNAVAILABLE = "__debezium_unavailable_value"  # Debezium's unavailable.value.placeholder default
VERSION_HEADER = "tidegate.version"
ENTITY_ID_HEADER = "tidegate.entity_id"
# The schema tables without one live in: tidegate's entity types leave it out.
DEFAULT_SCHEMA: dict[str, str] = {"postgresql": "public", "sqlite": "main"}

_OPS = {Op.INSERT: "c", Op.UPDATE: "u", Op.DELETE: "d", Op.TRUNCATE: "t"}
_OPS_BACK = {"c": Op.INSERT, "r": Op.INSERT, "u": Op.UPDATE, "d": Op.DELETE, "t": Op.TRUNCATE}


class DebeziumSource(NamedTuple):
    """What `source` says about where the changes come from."""

    connector: Connector
    name: str  # Debezium's topic.prefix: the bus prefix
    db: str


class DebeziumRecord(NamedTuple):
    """One message to publish: a value of None is a tombstone."""

    topic: str
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...]


def split_entity_type(entity_type: str, connector: Connector) -> tuple[str, str]:
    """(schema, table) of an entity type: `shop.products` → (shop, products); `products` is in
    the connector's default schema."""
    schema, dot, table = entity_type.rpartition(".")
    return (schema, table) if dot else (DEFAULT_SCHEMA[connector], entity_type)


def topic_of(source: DebeziumSource, entity_type: str) -> str:
    """Debezium's topic name, `<topic.prefix>.<schema>.<table>`."""
    schema, table = split_entity_type(entity_type, source.connector)
    return f"{source.name}.{schema}.{table}"


def records_of(change: Change, source: DebeziumSource, *, schemas: bool, tombstones: bool,
               now_s: float | None = None) -> list[DebeziumRecord]:
    """The messages one change publishes: its event, then, for a delete where `tombstones`,
    a tombstone (same key, null value) so that a compacted topic can drop the key."""
    topic = topic_of(source, change.entity_type)
    key_row = None if change.op is Op.TRUNCATE else change.key
    value: object = envelope(change, source, now_s=now_s)
    key: object = key_row
    if schemas:  # built only when asked for: the schemaless default is the hot path
        value = {"schema": _value_schema(topic, change, source), "payload": value}
        if key_row is not None:
            key = {"schema": _key_schema(topic, key_row), "payload": key_row}
    headers = ((VERSION_HEADER, change.version.key.encode()),
               (ENTITY_ID_HEADER, change.entity_id.encode()))
    key_bytes = None if key is None else _json(key)
    records = [DebeziumRecord(topic, key_bytes, _json(value), headers)]
    if change.op is Op.DELETE and tombstones:
        records.append(DebeziumRecord(topic, key_bytes, None, headers))
    return records


def envelope(change: Change, source: DebeziumSource, *, now_s: float | None = None) -> dict[str, Any]:
    """The event's value, without the schema wrapper."""
    schema, table = split_entity_type(change.entity_type, source.connector)
    commit_us = _epoch_us(change.commit_time)
    snapshot = is_snapshot_read(change)
    processed_us = int((now_s if now_s is not None else change.captured_at or time.time()) * 1_000_000)
    return {
        "before": _before(change),
        "after": _with_placeholders(change.after, change.unchanged),
        "source": {
            "version": tidegate.__version__, "connector": source.connector, "name": source.name,
            "ts_ms": commit_us // 1000, "snapshot": "true" if snapshot else "false",
            "db": source.db, "sequence": None, "ts_us": commit_us, "ts_ns": commit_us * 1000,
            "schema": schema, "table": table, "txId": change.xid, "lsn": change.version.lsn,
            "xmin": None,
        },
        "op": "r" if snapshot else _OPS[change.op],
        "ts_ms": processed_us // 1000, "ts_us": processed_us, "ts_ns": processed_us * 1000,
        "transaction": None,
    }


def _before(change: Change) -> Row | None:
    # Without REPLICA IDENTITY FULL, Debezium's delete events carry the key columns as `before`.
    if change.op is Op.DELETE and change.before is None:
        return change.key
    return change.before


def is_snapshot_read(change: Change) -> bool:
    """A row read by a snapshot (or re-read after a schema change) rather than written: the
    source says so (`Change.read`); a change that came through tidegate's own JSON, which does
    not carry the flag, is a read when it has the last ordinal of its position, which only
    re-reads take."""
    return change.op is Op.INSERT and (change.read or change.version.ordinal == MAX_ORDINAL)


def change_of(key: bytes | None, value: bytes | None, version_key: bytes | str | None,
              entity_id: bytes | str | None) -> Change:
    """The change a Debezium event carries: exactly the one `records_of` published when tidegate's
    version and entity id came beside it, else (an event of Debezium itself) one derived from
    its fields (`_version`). Raises InvalidChange for what is not a change event."""
    if value is None:
        raise InvalidChange("a tombstone carries no change")
    payload = _payload(value)
    try:
        source = payload["source"]
        op = _OPS_BACK[payload["op"]]
        schema, table = source["schema"], source["table"]
        connector = source["connector"]
        entity_type = table if schema == DEFAULT_SCHEMA.get(connector) else f"{schema}.{table}"
        after, unchanged = _without_placeholders(payload.get("after"))
        key_row = _payload(key) if key is not None else {}
        if op is Op.TRUNCATE:
            key_row, entity = {}, TRUNCATED
        elif entity_id is not None:
            entity = _text(entity_id)
        else:
            entity = entity_id_of(key_row, list(key_row))
        return Change(
            entity_type=entity_type, entity_id=entity, op=op, key=key_row,
            after=after, before=payload.get("before"), commit_time=_commit_time(source),
            version=_version(source, version_key), xid=source.get("txId"), unchanged=unchanged,
            captured_at=_processed_s(payload), read=payload["op"] == "r",
        )
    except (KeyError, TypeError, ValueError) as exc:
        if isinstance(exc, InvalidChange):
            raise
        raise InvalidChange(f"a Debezium event lacks or mistypes {exc}") from exc


def _version(source: Mapping[str, Any], version_key: bytes | str | None) -> Version:
    """tidegate's version where tidegate published the event; for Debezium's own events, the
    change's own LSN (`source.lsn`). One row's changes are written to the WAL in commit order
    (a second writer of a row waits on the first's lock until it commits), so their LSNs order
    them as versions must; changes of different rows need no order."""
    if version_key is not None:
        return Version.from_key(_text(version_key))
    lsn = source.get("lsn")
    if not isinstance(lsn, int) or isinstance(lsn, bool) or lsn < 0:
        raise InvalidChange(f"a Debezium event's source.lsn must be a non-negative integer, got {lsn!r}")
    return Version(lsn, 0)


def _commit_time(source: Mapping[str, Any]) -> datetime:
    # ts_us (Debezium 2.6 and later) keeps the microseconds ts_ms drops.
    micros = source.get("ts_us")
    if not isinstance(micros, int):
        micros = int(source["ts_ms"]) * 1000
    return _EPOCH + timedelta(microseconds=micros)


def _processed_s(payload: Mapping[str, Any]) -> float:
    micros = payload.get("ts_us")
    if isinstance(micros, int):
        return micros / 1_000_000
    millis = payload.get("ts_ms")
    return millis / 1000 if isinstance(millis, int) else 0.0


# ---------------------------------------------------------------------- rendering details


def _json(value: object) -> bytes:
    return orjson.dumps(value)


def _text(raw: bytes | str) -> str:
    return raw.decode() if isinstance(raw, bytes) else raw


def _payload(raw: bytes) -> Any:
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InvalidChange(f"a Debezium message is not JSON: {exc}") from exc
    # With schemas.enable the converter wraps every message as {"schema", "payload"}.
    if isinstance(data, dict) and set(data) == {"schema", "payload"}:
        data = data["payload"]
    if not isinstance(data, dict):
        raise InvalidChange("a Debezium message must be a JSON object")
    return data


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _epoch_us(moment: datetime) -> int:
    delta = moment - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def _with_placeholders(after: Row | None, unchanged: tuple[str, ...]) -> Row | None:
    if after is None or not unchanged:
        return after
    return {**after, **dict.fromkeys(unchanged, UNAVAILABLE)}


def _without_placeholders(after: Row | None) -> tuple[Row | None, tuple[str, ...]]:
    if after is None:
        return None, ()
    unchanged = tuple(column for column, value in after.items() if value == UNAVAILABLE)
    if not unchanged:
        return after, ()
    return {c: v for c, v in after.items() if c not in unchanged}, unchanged


# Kafka Connect schemas, as JsonConverter writes them with schemas.enable=true. Column types are
# inferred from the values (a change does not carry the declared ones): a NULL gives an optional
# string.


def _field_type(value: JsonValue) -> dict[str, Any]:
    if isinstance(value, bool):
        return {"type": "boolean"}
    if isinstance(value, int):
        return {"type": "int64"}
    if isinstance(value, float):
        return {"type": "double"}
    if isinstance(value, list):
        item = _field_type(value[0]) if value else {"type": "string"}
        return {"type": "array", "items": {**item, "optional": True}}
    if isinstance(value, dict):
        return {"type": "string", "name": "io.debezium.data.Json", "version": 1}
    return {"type": "string"}


def _row_schema(name: str, row: Mapping[str, JsonValue], *, optional: bool, field: str | None = None,
                required: tuple[str, ...] = ()) -> dict[str, Any]:
    fields = [{**_field_type(value), "optional": column not in required, "field": column}
              for column, value in row.items()]
    schema: dict[str, Any] = {"type": "struct", "fields": fields, "optional": optional, "name": name}
    if field is not None:
        schema["field"] = field
    return schema


def _key_schema(topic: str, key: Mapping[str, JsonValue]) -> dict[str, Any]:
    return _row_schema(f"{topic}.Key", key, optional=False, required=tuple(key))


def _source_schema(connector: Connector) -> dict[str, Any]:
    def field(name: str, kind: str, optional: bool = False) -> dict[str, Any]:
        return {"type": kind, "optional": optional, "field": name}

    snapshot = {"type": "string", "optional": True, "name": "io.debezium.data.Enum", "version": 1,
                "parameters": {"allowed": "true,last,false,incremental"}, "default": "false",
                "field": "snapshot"}
    return {"type": "struct", "optional": False, "field": "source",
            "name": f"io.debezium.connector.{connector}.Source",
            "fields": [field("version", "string"), field("connector", "string"), field("name", "string"),
                       field("ts_ms", "int64"), snapshot, field("db", "string"),
                       field("sequence", "string", True), field("ts_us", "int64", True),
                       field("ts_ns", "int64", True), field("schema", "string"),
                       field("table", "string"), field("txId", "int64", True),
                       field("lsn", "int64", True), field("xmin", "int64", True)]}


_TRANSACTION_SCHEMA: dict[str, Any] = {
    "type": "struct", "optional": True, "name": "event.block", "version": 1, "field": "transaction",
    "fields": [{"type": "string", "optional": False, "field": "id"},
               {"type": "int64", "optional": False, "field": "total_order"},
               {"type": "int64", "optional": False, "field": "data_collection_order"}]}


def _value_schema(topic: str, change: Change, source: DebeziumSource) -> dict[str, Any]:
    row = change.after if change.after is not None else (change.before or {})
    image = {**row, **({c: UNAVAILABLE for c in change.unchanged})}
    required = tuple(change.key) if change.op is not Op.TRUNCATE else ()
    return {
        "type": "struct", "optional": False, "name": f"{topic}.Envelope", "version": 2,
        "fields": [
            _row_schema(f"{topic}.Value", image, optional=True, field="before", required=required),
            _row_schema(f"{topic}.Value", image, optional=True, field="after", required=required),
            _source_schema(source.connector),
            {"type": "string", "optional": False, "field": "op"},
            {"type": "int64", "optional": True, "field": "ts_ms"},
            {"type": "int64", "optional": True, "field": "ts_us"},
            {"type": "int64", "optional": True, "field": "ts_ns"},
            _TRANSACTION_SCHEMA,
        ],
    }
