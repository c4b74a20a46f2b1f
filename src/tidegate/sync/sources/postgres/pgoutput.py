"""Decoder of PostgreSQL's `pgoutput` logical replication messages, protocol version 1.

Each replication message's payload is one logical message, tagged by its first byte (see the
PostgreSQL manual, "Logical Replication Message Formats"). Integers are big-endian; strings are
NUL-terminated in the server encoding; LSNs are 64-bit; timestamps are microseconds since
2000-01-01 UTC. Column values arrive as TupleData: per column a kind byte — 'n' NULL,
'u' an unchanged TOASTed value the server did not send, 't' text (or 'b' binary) with its length.
Only the decoding lives here; turning text into Python values is `tidegate.sync.sources.postgres.types`.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import NamedTuple

from tidegate.errors import SourceError

__all__ = [
    "Begin",
    "Column",
    "ColumnValue",
    "Commit",
    "Delete",
    "Insert",
    "LogicalMessage",
    "Message",
    "Origin",
    "Relation",
    "Truncate",
    "TupleData",
    "Type",
    "Update",
    "decode_message",
    "format_lsn",
    "parse_lsn",
    "tuple_texts",
]

PG_EPOCH = datetime(2000, 1, 1, tzinfo=UTC)

# TupleData column kinds.
NULL = "n"
UNCHANGED_TOAST = "u"
TEXT = "t"
BINARY = "b"

_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")
_UINT32 = struct.Struct(">I")
BEGIN_FIELDS = struct.Struct(">QqI")  # final_lsn, commit_time, xid
COMMIT_FIELDS = struct.Struct(">bQQq")  # flags, commit_lsn, end_lsn, commit_time
_KINDS = {ord(TEXT): TEXT, ord(BINARY): BINARY}
_SENT = frozenset(_KINDS)

# Truncate option bits.
TRUNCATE_CASCADE = 1
TRUNCATE_RESTART_IDENTITY = 2

# Relation column flag: the column is part of the replica identity (the key).
COLUMN_IN_KEY = 1


def pg_timestamp(micros: int) -> datetime:
    """A PostgreSQL timestamp (microseconds since 2000-01-01 UTC) as an aware datetime."""
    return PG_EPOCH + timedelta(microseconds=micros)


def format_lsn(lsn: int) -> str:
    """An LSN in PostgreSQL's own notation, e.g. 0/16B3748."""
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"


def parse_lsn(text: str) -> int:
    """The inverse of `format_lsn`."""
    high, _, low = text.partition("/")
    try:
        return (int(high, 16) << 32) | int(low, 16)
    except ValueError as exc:
        raise SourceError(f"{text!r} is not an LSN") from exc


class ColumnValue(NamedTuple):
    """One column of a TupleData: `kind` is 'n', 'u', 't' or 'b'; `data` the raw bytes for t/b.
    (A NamedTuple: one is made per column of every row, and tuples are the cheapest to make.)"""

    kind: str
    data: bytes | None = None

    @property
    def is_null(self) -> bool:
        """The column is NULL."""
        return self.kind == NULL

    @property
    def is_unchanged_toast(self) -> bool:
        """The column is a TOASTed value the server left out because the update did not change it."""
        return self.kind == UNCHANGED_TOAST


TupleData = tuple[ColumnValue, ...]

_NOT_SENT = {ord(NULL): ColumnValue(NULL), ord(UNCHANGED_TOAST): ColumnValue(UNCHANGED_TOAST)}


@dataclass(frozen=True, slots=True)
class Begin:
    """'B': a transaction starts; `final_lsn` is its commit record's LSN."""

    final_lsn: int
    commit_time: datetime
    xid: int


@dataclass(frozen=True, slots=True)
class Commit:
    """'C': the transaction committed; `end_lsn` is the position to confirm once it is applied."""

    flags: int
    commit_lsn: int
    end_lsn: int
    commit_time: datetime


@dataclass(frozen=True, slots=True)
class Origin:
    """'O': the transaction was replicated from another node."""

    origin_lsn: int
    name: str


@dataclass(frozen=True, slots=True)
class Column:
    """A column of a Relation message."""

    flags: int
    name: str
    type_oid: int
    type_modifier: int

    @property
    def in_key(self) -> bool:
        """Part of the relation's replica identity."""
        return bool(self.flags & COLUMN_IN_KEY)


@dataclass(frozen=True, slots=True)
class Relation:
    """'R': describes a relation before its first change in the session (and after each change of
    its definition). `namespace` is "" for pg_catalog; `replica_identity` is pg_class.relreplident
    ('d' default, 'n' nothing, 'f' full, 'i' index)."""

    relation_id: int
    namespace: str
    name: str
    replica_identity: str
    columns: tuple[Column, ...]


@dataclass(frozen=True, slots=True)
class Type:
    """'Y': describes a non-built-in data type used by a following Relation."""

    type_oid: int
    namespace: str
    name: str


@dataclass(frozen=True, slots=True)
class Insert:
    """'I': a new row."""

    relation_id: int
    new: TupleData


@dataclass(frozen=True, slots=True)
class Update:
    """'U': a changed row. `old_kind` is 'K' (the old key, sent when it changed), 'O' (the whole
    old row, REPLICA IDENTITY FULL) or None (neither was sent), with `old` accordingly."""

    relation_id: int
    old_kind: str | None
    old: TupleData | None
    new: TupleData


@dataclass(frozen=True, slots=True)
class Delete:
    """'D': a removed row; `old_kind` 'K' (key columns, the others NULL) or 'O' (the whole row)."""

    relation_id: int
    old_kind: str
    old: TupleData


@dataclass(frozen=True, slots=True)
class Truncate:
    """'T': the relations were truncated."""

    options: int
    relation_ids: tuple[int, ...]

    @property
    def cascade(self) -> bool:
        """TRUNCATE ... CASCADE."""
        return bool(self.options & TRUNCATE_CASCADE)

    @property
    def restart_identity(self) -> bool:
        """TRUNCATE ... RESTART IDENTITY."""
        return bool(self.options & TRUNCATE_RESTART_IDENTITY)


@dataclass(frozen=True, slots=True)
class LogicalMessage:
    """'M': a message written with pg_logical_emit_message (tidegate's heartbeats)."""

    transactional: bool
    lsn: int
    prefix: str
    content: bytes


Message = Begin | Commit | Origin | Relation | Type | Insert | Update | Delete | Truncate | LogicalMessage


class _Reader:
    """Reads big-endian fields off one message, raising SourceError when it runs short."""

    __slots__ = ("_data", "_encoding", "_pos")

    def __init__(self, data: bytes, encoding: str) -> None:
        self._data = data
        self._encoding = encoding
        self._pos = 0

    def _take(self, size: int) -> bytes:
        end = self._pos + size
        if size < 0 or end > len(self._data):
            raise SourceError(
                f"truncated pgoutput message {self._data[:1]!r}: needed {size} bytes at offset "
                f"{self._pos} of {len(self._data)}"
            )
        chunk = self._data[self._pos:end]
        self._pos = end
        return chunk

    def _unpack(self, fmt: str) -> int:
        size = struct.calcsize(fmt)
        value: int = struct.unpack(fmt, self._take(size))[0]
        return value

    def int8(self) -> int:
        return self._unpack(">b")

    def byte(self) -> str:
        return chr(self._take(1)[0])

    def int16(self) -> int:
        return self._unpack(">h")

    def int32(self) -> int:
        return self._unpack(">i")

    def uint32(self) -> int:
        return self._unpack(">I")

    def int64(self) -> int:
        return self._unpack(">q")

    def uint64(self) -> int:
        return self._unpack(">Q")

    def string(self) -> str:
        end = self._data.find(b"\0", self._pos)
        if end < 0:
            raise SourceError(f"unterminated string in pgoutput message {self._data[:1]!r}")
        text = self._data[self._pos:end].decode(self._encoding)
        self._pos = end + 1
        return text

    def raw(self, size: int) -> bytes:
        return self._take(size)

    def peek(self) -> str | None:
        return chr(self._data[self._pos]) if self._pos < len(self._data) else None

    def tuple_data(self) -> TupleData:
        # The hot path (every row of every change): fields are read straight off the buffer.
        data, pos, end = self._data, self._pos, len(self._data)
        if pos + 2 > end:
            self._take(2)  # raises, naming the shortfall
        (count,) = _INT16.unpack_from(data, pos)
        pos += 2
        columns = []
        for _ in range(count):
            if pos >= end:
                self._pos = pos
                self._take(1)
            kind = data[pos]
            pos += 1
            if kind in _SENT:
                if pos + 4 > end:
                    self._pos = pos
                    self._take(4)
                (size,) = _INT32.unpack_from(data, pos)
                pos += 4
                if size < 0 or pos + size > end:
                    self._pos = pos
                    self._take(size)  # raises, naming the shortfall
                columns.append(ColumnValue(_KINDS[kind], data[pos:pos + size]))
                pos += size
            elif kind in _NOT_SENT:
                columns.append(_NOT_SENT[kind])
            else:
                raise SourceError(f"unknown TupleData column kind {chr(kind)!r}")
        self._pos = pos
        return tuple(columns)


def tuple_texts(data: bytes, pos: int) -> tuple[list[str | None], list[int], int]:
    """The TupleData at `pos` of a message as its columns' text (None for NULL and for an
    unchanged TOAST value), the indexes of the unchanged ones, and the offset after it.

    The stream's hot path: one text per column and no object per column, where `tuple_data`
    (what `decode_message` returns) keeps each column's kind and bytes."""
    texts: list[str | None] = []
    unchanged: list[int] = []
    try:
        (count,) = _INT16.unpack_from(data, pos)
        pos += 2
        for index in range(count):
            kind = data[pos]
            if kind == 0x74:  # 't'
                (size,) = _INT32.unpack_from(data, pos + 1)
                start = pos + 5
                pos = start + size
                if size < 0 or pos > len(data):
                    raise IndexError(pos)
                texts.append(data[start:pos].decode("utf-8"))
            elif kind == 0x6E:  # 'n'
                texts.append(None)
                pos += 1
            elif kind == 0x75:  # 'u'
                texts.append(None)
                unchanged.append(index)
                pos += 1
            elif kind == 0x62:  # 'b'
                raise SourceError("binary column values arrived, but the source asks for text")
            else:
                raise SourceError(f"unknown TupleData column kind {chr(kind)!r}")
    except (IndexError, struct.error) as exc:
        raise SourceError(f"truncated pgoutput message {data[:1]!r}: a TupleData runs past its "
                          f"end ({len(data)} bytes)") from exc
    return texts, unchanged, pos


def decode_message(payload: bytes, encoding: str = "utf-8") -> Message:
    """Decode one pgoutput (protocol version 1) message; `encoding` is the server encoding of its
    strings (names, prefixes). Unknown or malformed messages raise SourceError."""
    if not payload:
        raise SourceError("empty pgoutput message")
    reader = _Reader(payload, encoding)
    tag = reader.byte()
    decoder = _DECODERS.get(tag)
    if decoder is None:
        raise SourceError(
            f"unknown pgoutput message type {tag!r} (streamed and two-phase messages need "
            "protocol version 2 or later, which tidegate does not request)"
        )
    return decoder(reader)


def _begin(r: _Reader) -> Begin:
    return Begin(final_lsn=r.uint64(), commit_time=pg_timestamp(r.int64()), xid=r.uint32())


def _commit(r: _Reader) -> Commit:
    return Commit(flags=r.int8(), commit_lsn=r.uint64(), end_lsn=r.uint64(),
                  commit_time=pg_timestamp(r.int64()))


def _origin(r: _Reader) -> Origin:
    return Origin(origin_lsn=r.uint64(), name=r.string())


def _relation(r: _Reader) -> Relation:
    relation_id, namespace, name = r.uint32(), r.string(), r.string()
    identity = r.byte()
    columns = tuple(
        Column(flags=r.int8(), name=r.string(), type_oid=r.uint32(), type_modifier=r.int32())
        for _ in range(r.int16())
    )
    return Relation(relation_id, namespace, name, identity, columns)


def _type(r: _Reader) -> Type:
    return Type(type_oid=r.uint32(), namespace=r.string(), name=r.string())


def _insert(r: _Reader) -> Insert:
    relation_id = r.uint32()
    _expect(r, "N", "Insert")
    return Insert(relation_id, r.tuple_data())


def _update(r: _Reader) -> Update:
    relation_id = r.uint32()
    old_kind: str | None = None
    old: TupleData | None = None
    if r.peek() in ("K", "O"):
        old_kind = r.byte()
        old = r.tuple_data()
    _expect(r, "N", "Update")
    return Update(relation_id, old_kind, old, r.tuple_data())


def _delete(r: _Reader) -> Delete:
    relation_id = r.uint32()
    old_kind = r.byte()
    if old_kind not in ("K", "O"):
        raise SourceError(f"pgoutput Delete message with old tuple kind {old_kind!r} (want K or O)")
    return Delete(relation_id, old_kind, r.tuple_data())


def _truncate(r: _Reader) -> Truncate:
    count = r.int32()
    options = r.int8()
    return Truncate(options, tuple(r.uint32() for _ in range(count)))


def _message(r: _Reader) -> LogicalMessage:
    # Protocol version 1 has no xid field here (only streamed transactions, version 2+, send it).
    flags = r.int8()
    lsn = r.uint64()
    prefix = r.string()
    content = r.raw(r.int32())
    return LogicalMessage(transactional=bool(flags & 1), lsn=lsn, prefix=prefix, content=content)


def _expect(r: _Reader, tag: str, what: str) -> None:
    found = r.byte()
    if found != tag:
        raise SourceError(f"pgoutput {what} message: expected {tag!r}, found {found!r}")


_DECODERS: dict[str, Callable[[_Reader], Message]] = {
    "B": _begin,
    "C": _commit,
    "O": _origin,
    "R": _relation,
    "Y": _type,
    "I": _insert,
    "U": _update,
    "D": _delete,
    "T": _truncate,
    "M": _message,
}
