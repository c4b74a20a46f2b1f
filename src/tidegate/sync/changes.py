"""`Change`: one committed row change, the same whatever source produced it.

A change's `version` is (commit position, ordinal within the transaction). PostgreSQL gives the
commit LSN; several rows of one transaction share it, so the ordinal orders them. The SQLite outbox
gives its sequence number as the position. Versions order every change to one entity: the cache
applies a change only when its version is newer than what it holds.

Rows arrive canonical (see `tidegate.sync.values`): the after-image of inserts and updates, the
before-image where the source has one (REPLICA IDENTITY FULL, the outbox's OLD row), and the key
columns always. `checksum` is the SHA-256 of the canonical JSON of the after-image, or of the
before-image/key for a delete, so a replayed change can be recognised and a cache compared with
its database.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, NamedTuple

import orjson

from tidegate.errors import InvalidChange
from tidegate.sync.values import JsonValue, Row, canonical, canonical_json, checksum

__all__ = ["MAX_ORDINAL", "Change", "Op", "Version", "changes_from_json", "changes_to_json", "entity_id_of"]

# The highest ordinal a version carries (Version.key gives it 8 hex digits): a version at it comes
# after every change of its position, which is what a snapshot or a re-read of a table states.
MAX_ORDINAL = 2**32 - 1


class Op(enum.StrEnum):
    """What happened to the row."""

    INSERT = "insert"
    UPDATE = "update"
    DELETE = "delete"
    TRUNCATE = "truncate"  # the whole table: entity_id is "*" and there is no row


class Version(NamedTuple):
    """(commit position, ordinal in the transaction); tuples order them."""

    lsn: int
    ordinal: int

    @property
    def key(self) -> str:
        """Fixed-width hex that sorts like the version, for stores that compare strings (Lua
        numbers are doubles and would lose LSN bits above 2**53)."""
        return f"{self.lsn:016x}{self.ordinal:08x}"

    @classmethod
    def from_key(cls, key: str) -> Version:
        """The inverse of `key`."""
        if len(key) != 24:
            raise InvalidChange(f"{key!r} is not a version key (24 hex digits)")
        try:
            return cls(int(key[:16], 16), int(key[16:], 16))
        except ValueError as exc:
            raise InvalidChange(f"{key!r} is not a version key (24 hex digits)") from exc

    def __str__(self) -> str:
        return f"{self.lsn >> 32:X}/{self.lsn & 0xFFFFFFFF:X}#{self.ordinal}"


TRUNCATED = "*"


def entity_id_of(key: Mapping[str, JsonValue], key_columns: Sequence[str], *,
                 documents: bool = False) -> str:
    """The id of the row with primary-key values `key` (canonical), an injective encoding of the
    key tuple. This is the one place ids are made: every reader of a cache (`sync verify`, the
    recommender, tests) must call it rather than build ids itself.

    - One key column: a string value is itself, unless it is empty or starts with a double quote,
      in which case it is its JSON string (`""` for ''), so plain forms (non-empty, never starting
      with `"`) and JSON forms (always starting with `"`) cannot meet; a non-string value (an
      integer, an array) is its canonical JSON. One column has one type, so its values are either
      all strings or all non-strings, and "7" (text) and 7 (integer) never share a table. The plain
      form keeps the ids caches already hold for ordinary keys. The exception is a column of JSON
      documents (jsonb), whose values may be the string "7" and the number 7: `documents=True`
      (the source says so for such a key) gives it the array form below.
    - Several key columns: the canonical JSON array of the values in key-column order, which is
      injective by itself (strings are quoted, so a part may hold commas, brackets or '').

    A key value may not be NULL: PostgreSQL's primary keys and replica identity indexes, the only
    keys the sources accept, are NOT NULL.
    """
    if not key_columns:
        raise InvalidChange("a row needs at least one key column to have an entity id")
    missing = [c for c in key_columns if key.get(c) is None]
    if missing:
        raise InvalidChange(f"key column(s) {', '.join(missing)} missing or NULL")
    if len(key_columns) == 1 and not documents:
        value = key[key_columns[0]]
        if isinstance(value, str) and value and value[0] != '"':
            return value
        return canonical_json(value).decode()
    return canonical_json([key[c] for c in key_columns]).decode()


@dataclass(frozen=True, slots=True)
class Change:
    """One committed change of one row (or a whole table for TRUNCATE)."""

    entity_type: str  # the table (schema-qualified when not in the default schema)
    entity_id: str
    op: Op
    key: Row
    after: Row | None
    before: Row | None
    commit_time: datetime  # UTC, timezone-aware
    version: Version
    xid: int | None = None
    checksum: str = ""
    # Columns the source did not send because they are unchanged (PostgreSQL's unchanged TOAST
    # values) and could not fill from a before-image: they are missing from `after` until the
    # pipeline fills them (`tidegate.sync.fill`, through `with_columns`), and the checksum covers
    # the row only once they are filled.
    unchanged: tuple[str, ...] = ()
    # When the change was seen by the source (epoch seconds, this host's clock): with commit_time
    # it gives the freshness figures; not part of the row and not compared.
    captured_at: float = field(default=0.0, compare=False)
    # The key as the source's own text (PostgreSQL's output of each key column), so the source
    # can read the row back by key to fill `unchanged`; in process only: not on the wire, not
    # compared.
    source_key: tuple[str, ...] | None = field(default=None, compare=False)
    # The row was read from its table (a snapshot, a re-read after a schema change) rather than
    # written by a transaction: what Debezium's format calls a read (op "r"). In process and in
    # Debezium's format only: tidegate's own JSON leaves it out, and it is not compared.
    read: bool = field(default=False, compare=False)

    def __post_init__(self) -> None:
        if self.commit_time.tzinfo is None:
            raise InvalidChange("a change's commit_time must be timezone-aware")
        if self.commit_time.utcoffset():
            object.__setattr__(self, "commit_time", self.commit_time.astimezone(UTC))
        if self.op in (Op.INSERT, Op.UPDATE) and self.after is None:
            raise InvalidChange(f"an {self.op} change needs an after-image")
        if not self.checksum:
            object.__setattr__(self, "checksum", checksum(self.image))

    @property
    def image(self) -> Row | None:
        """The row this change leaves behind, or for a delete the row it removed (or its key)."""
        if self.op is Op.TRUNCATE:
            return None
        if self.op is Op.DELETE:
            return self.before if self.before is not None else self.key
        return self.after

    def with_columns(self, values: Mapping[str, JsonValue]) -> Change:
        """This change with unchanged columns filled in from `values` (canonical), checksum
        recomputed; columns `values` lacks stay listed in `unchanged`."""
        if self.after is None or not self.unchanged:
            return self
        after = dict(self.after)
        still = []
        for column in self.unchanged:
            if column in values:
                after[column] = values[column]
            else:
                still.append(column)
        return dataclasses.replace(self, after=after, unchanged=tuple(still), checksum="")

    # of_row and of_canonical_row take over seven parameters (PLR0913): keyword-only, one per
    # field of the Change record they build, as its own constructor does.
    @classmethod
    def of_row(cls, *, entity_type: str, op: Op, key_columns: Sequence[str],  # noqa: PLR0913
               version: Version,
               commit_time: datetime, after: Mapping[str, Any] | None = None,
               before: Mapping[str, Any] | None = None, xid: int | None = None,
               captured_at: float = 0.0, unchanged: Sequence[str] = (),
               source_key: Sequence[str] | None = None, documents: bool = False,
               read: bool = False) -> Change:
        """A Change from raw row values (made canonical here); the key is taken from the
        after-image, else the before-image. `documents`: see `entity_id_of`; `read`: the row
        was read from its table, not written (see the field)."""
        return cls.of_canonical_row(
            entity_type=entity_type, op=op, key_columns=key_columns, version=version,
            commit_time=commit_time, after=canonical(after) if after is not None else None,
            before=canonical(before) if before is not None else None, xid=xid,
            captured_at=captured_at, unchanged=unchanged, source_key=source_key, documents=documents,
            read=read)

    @classmethod
    def of_canonical_row(cls, *, entity_type: str, op: Op, key_columns: Sequence[str],  # noqa: PLR0913
                         version: Version, commit_time: datetime, after: Row | None = None,
                         before: Row | None = None, xid: int | None = None,
                         captured_at: float = 0.0, unchanged: Sequence[str] = (),
                         source_key: Sequence[str] | None = None,
                         documents: bool = False, read: bool = False) -> Change:
        """`of_row` for rows whose values are canonical already (a source that decodes straight
        to canonical values); the rows are taken as they are, not copied."""
        source = after if after is not None else before
        if op is Op.TRUNCATE:
            return cls(entity_type, TRUNCATED, op, {}, None, None, commit_time, version, xid,
                       captured_at=captured_at)
        if source is None:
            raise InvalidChange(f"a {op} change of {entity_type} has no row to take its key from")
        key = {c: source.get(c) for c in key_columns}
        return cls(entity_type, entity_id_of(key, key_columns, documents=documents), op, key,
                   after, before, commit_time, version, xid, unchanged=tuple(unchanged),
                   captured_at=captured_at,
                   source_key=tuple(source_key) if source_key is not None else None, read=read)

    def to_json(self) -> bytes:
        """The change as JSON bytes, the form every bus carries."""
        # orjson writes the Op (a str enum) as its value and the tuple as an array: no
        # per-change `.value` look-up (an enum property) nor list copy on the bus's hot path.
        return orjson.dumps({
            "entity_type": self.entity_type, "entity_id": self.entity_id, "op": self.op,
            "key": self.key, "after": self.after, "before": self.before,
            "commit_time": _iso(self.commit_time),
            "version": self.version.key, "xid": self.xid, "checksum": self.checksum,
            "unchanged": self.unchanged, "captured_at": self.captured_at,
        })

    @classmethod
    def from_json(cls, data: bytes | str) -> Change:
        """The inverse of `to_json`; a malformed event raises InvalidChange naming the field."""
        try:
            raw = orjson.loads(data)
        except orjson.JSONDecodeError as exc:
            raise InvalidChange(f"a change event is not JSON: {exc}") from exc
        return cls.from_object(raw)

    @classmethod
    def from_object(cls, raw: object) -> Change:
        """`from_json` for an event already parsed (one element of `changes_from_json`'s array)."""
        if not isinstance(raw, dict):
            raise InvalidChange("a change event must be a JSON object")
        try:
            return cls(
                entity_type=_str(raw, "entity_type"), entity_id=_str(raw, "entity_id"),
                op=_op(raw["op"]), key=raw["key"], after=raw.get("after"), before=raw.get("before"),
                commit_time=datetime.fromisoformat(_str(raw, "commit_time")),
                version=Version.from_key(_str(raw, "version")), xid=raw.get("xid"),
                checksum=_str(raw, "checksum"), unchanged=tuple(raw.get("unchanged") or ()),
                captured_at=float(raw.get("captured_at") or 0.0),
            )
        except KeyError as exc:
            raise InvalidChange(f"a change event lacks the field {exc.args[0]!r}") from exc
        except ValueError as exc:
            if isinstance(exc, InvalidChange):
                raise
            raise InvalidChange(f"a change event has an invalid field: {exc}") from exc


def changes_to_json(encoded: Sequence[bytes]) -> bytes:
    """Several changes' `to_json` forms as one JSON array, joined as they are (not re-encoded):
    the form a bus entry that carries several changes holds."""
    return b"[" + b",".join(encoded) + b"]"


def changes_from_json(data: bytes | str) -> list[object]:
    """The events of a `changes_to_json` array, parsed but not yet checked: each goes through
    `Change.from_object`, so that one malformed event does not cost its neighbours."""
    try:
        raw = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise InvalidChange(f"a change batch is not JSON: {exc}") from exc
    if not isinstance(raw, list):
        raise InvalidChange("a change batch must be a JSON array")
    return raw


@functools.lru_cache(maxsize=1024)
def _iso(moment: datetime) -> str:
    # Every change of a transaction carries its one commit time, and isoformat with a timespec
    # costs a microsecond: written once per transaction. (Equal datetimes give equal text here:
    # commit times are UTC, see Change.__post_init__.)
    return moment.isoformat(timespec="microseconds")


_OPS: dict[object, Op] = {op.value: op for op in Op}
_OP_NAMES = ", ".join(op.value for op in Op)


def _op(value: object) -> Op:
    # A dict look-up: Op(value) goes through EnumMeta.__call__, a microsecond per change read
    # off a bus.
    try:
        return _OPS[value]
    except (KeyError, TypeError):
        raise InvalidChange(f"a change event's op {value!r} is not one of "
                            f"{_OP_NAMES}") from None


def _str(raw: Mapping[str, Any], name: str) -> str:
    value = raw[name]
    if not isinstance(value, str):
        raise InvalidChange(f"a change event's {name!r} must be a string")
    return value
