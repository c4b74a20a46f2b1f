"""The PostgreSQL replication stream: pgoutput messages → committed `Transaction`s, read on a
thread of its own (psycopg2 blocks) and handed to asyncio with backpressure.

`TransactionAssembler` is pure: it turns decoded messages into transactions and can be fed
messages from anywhere (the tests feed it bytes captured from a server). `ReplicationReader`
owns the replication connection, its feedback (the flush position the pipeline confirmed) and
the optional heartbeats.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import select
import struct
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, tzinfo
from typing import Any, NoReturn

from tidegate.errors import SourceError
from tidegate.sync.backfill import (
    SCHEMA_PREFIX,
    BackfillRequest,
    Shape,
    backfill_version,
    parse_schema_message,
    shape_of_relation,
)
from tidegate.sync.changes import Change, Op, Version
from tidegate.sync.contracts import Transaction
from tidegate.sync.sources.postgres.catalog import TableInfo
from tidegate.sync.sources.postgres.driver import psycopg2
from tidegate.sync.sources.postgres.pgoutput import (
    BEGIN_FIELDS,
    BINARY,
    COMMIT_FIELDS,
    NULL,
    TEXT,
    Begin,
    Column,
    Commit,
    Delete,
    Insert,
    LogicalMessage,
    Message,
    Relation,
    Truncate,
    TupleData,
    Update,
    decode_message,
    pg_timestamp,
    tuple_texts,
)
from tidegate.sync.sources.postgres.types import Decoder, canonical_decoder_for, is_identity

__all__ = ["HEARTBEAT_PREFIX", "ReplicationReader", "TransactionAssembler", "document_key"]

logger = logging.getLogger(__name__)

HEARTBEAT_PREFIX = "tidegate.heartbeat"
POLL_S = 0.2  # longest the reader sleeps on an idle socket before looking at stop/feedback/heartbeat
# While the consumer is behind and the reader waits for room, it still tells the server it is
# alive this often, so wal_sender_timeout does not end the connection.
BLOCKED_FEEDBACK_S = 1.0
# A hand-over to the event loop carries at most this many transactions, and waits at most this
# long after its first one for more (while the socket keeps having more to read).
HAND_OVER_TRANSACTIONS = 256
HAND_OVER_S = 0.005
# A restarted source may find the slot still held by its predecessor's walsender, which exits a
# moment after its connection closes: wait this long for it before failing.
SLOT_BUSY_WAIT_S = 10.0


# A TupleData as `tuple_texts` reads it: each column's text (None: NULL or not sent) and the
# indexes of the columns not sent (unchanged TOAST values).
_Texts = tuple[list[str | None], list[int]]


@dataclass(slots=True)
class _RelationState:
    table: TableInfo | None  # None: a relation the source was not configured for
    columns: tuple[Column, ...]
    names: tuple[str, ...]
    # Per column, by its type (domains resolved to their base), text → canonical value; None
    # where the text is the value (text types), so the hot loop skips the call.
    decoders: tuple[Decoder | None, ...]
    # Per key column of the table, its position in `columns` (None: not among them); found once
    # here, since every change of the relation looks its key up.
    key_indexes: tuple[int | None, ...] = ()


@dataclass(slots=True)
class _OpenTransaction:
    final_lsn: int  # the commit record's LSN: every change's version starts with it
    commit_time: datetime
    xid: int
    micros: int | None = None  # commit_time as sent, when read from bytes (Commit repeats it)
    changes: list[Change] = field(default_factory=list)


class TransactionAssembler:
    """Turns pgoutput messages into committed transactions of `Change`s.

    Versions are (the commit record's LSN from Begin, the change's index in the transaction);
    each transaction's position is its Commit's end LSN. Changes to relations not configured
    are dropped, but their transaction still yields (empty) so its position can be confirmed.
    """

    def __init__(self, tables: Sequence[TableInfo], zone: tzinfo,
                 base_types: Mapping[int, int] | None = None,
                 clock: Callable[[], float] = time.time,
                 shapes: Mapping[str, Shape | None] | None = None) -> None:
        self._tables = {(table.schema, table.name): table for table in tables}
        self._zone = zone
        self._base_types = dict(base_types or {})
        self._clock = clock
        self._relations: dict[int, _RelationState] = {}
        self._open: _OpenTransaction | None = None
        # Schema changes (see tidegate.sync.backfill): the shape the cache's rows are in per
        # entity type (None: the table is gone; absent: not known, nothing compared), the
        # backfills the open transaction asks for, and those of committed transactions by
        # position until the source takes them. Written on the reader thread, read by the source
        # after the transaction was handed over.
        self.shapes: dict[str, Shape | None] = dict(shapes or {})
        self._asked: list[BackfillRequest] = []
        self._backfills: dict[int, list[BackfillRequest]] = {}
        self._documents = {table.entity_type for table in tables if document_key(table, self._base_types)}

    def feed(self, message: Message) -> Transaction | None:
        """Take one message; returns a transaction when it completes one."""
        if isinstance(message, Begin):
            self._begin(_OpenTransaction(message.final_lsn, message.commit_time, message.xid))
        elif isinstance(message, Commit):
            return self._commit(message.end_lsn, message.commit_time)
        elif isinstance(message, Relation):
            self._relation(message)
        elif isinstance(message, Truncate):
            self._truncate(message)
        elif isinstance(message, Insert):
            self._insert(self._change_state(message.relation_id, "Insert"), _texts_of(message.new))
        elif isinstance(message, Update):
            state = self._change_state(message.relation_id, "Update")
            old = _texts_of(message.old) if message.old is not None else None
            self._update(state, message.old_kind, old, _texts_of(message.new))
        elif isinstance(message, Delete):
            self._delete(self._change_state(message.relation_id, "Delete"), message.old_kind,
                         _texts_of(message.old))
        elif isinstance(message, LogicalMessage):
            return self._logical_message(message)
        # Origin and Type messages carry nothing the changes need.
        return None

    def feed_payload(self, payload: bytes) -> Transaction | None:
        """Take one message as the server sent it: the same as `feed(decode_message(payload))`,
        with the messages every transaction has (Begin, Commit, Insert, Update, Delete) read
        straight into changes, without an object per message or per column."""
        tag = payload[0] if payload else 0
        if tag in _ROW_TAGS:
            self._row_message(payload, tag)
            return None
        if tag == 0x42 and len(payload) == 1 + BEGIN_FIELDS.size:  # 'B'
            final_lsn, micros, xid = BEGIN_FIELDS.unpack_from(payload, 1)
            self._begin(_OpenTransaction(final_lsn, pg_timestamp(micros), xid, micros))
            return None
        if tag == 0x43 and len(payload) == 1 + COMMIT_FIELDS.size:  # 'C'
            _, _, end_lsn, micros = COMMIT_FIELDS.unpack_from(payload, 1)
            open_ = self._open
            # Commit repeats Begin's time: the datetime made for Begin serves again.
            if open_ is not None and open_.micros == micros:
                return self._commit(end_lsn, open_.commit_time)
            return self._commit(end_lsn, pg_timestamp(micros))
        return self.feed(decode_message(payload))

    # ------------------------------------------------------------------ messages

    def _begin(self, transaction: _OpenTransaction) -> None:
        if self._open is not None:
            raise SourceError("pgoutput Begin inside an open transaction")
        self._open = transaction

    def _commit(self, end_lsn: int, commit_time: datetime) -> Transaction:
        if self._open is None:
            raise SourceError("pgoutput Commit without a Begin")
        changes, self._open = tuple(self._open.changes), None
        if self._asked:
            self._backfills.setdefault(end_lsn, []).extend(self._asked)
            self._asked = []
        return Transaction(changes, position=end_lsn, commit_time=commit_time)

    def _relation(self, relation: Relation) -> None:
        key = (relation.namespace or "pg_catalog", relation.name)
        table = self._tables.get(key)
        decoders = tuple(canonical_decoder_for(self._base_types.get(c.type_oid, c.type_oid), self._zone)
                         for c in relation.columns)
        if table is not None:
            previous = self._relations.get(relation.relation_id)
            table = _reshaped(table, relation, previous.columns if previous is not None else None)
            self._tables[key] = table
            self._keep_documents(table)
            self._shape_seen(table, shape_of_relation(relation), "relation message")
            if not table.key_columns:
                table = None  # a dropped table's replayed changes, without a key: its rows go
        positions = {c.name: i for i, c in enumerate(relation.columns)}
        key_indexes = tuple(positions.get(name) for name in table.key_columns) if table else ()
        self._relations[relation.relation_id] = _RelationState(
            table, relation.columns, tuple(c.name for c in relation.columns),
            tuple(None if is_identity(decode) else decode for decode in decoders), key_indexes)

    def _shape_seen(self, table: TableInfo, shape: Shape | None, reason: str) -> None:
        """The table has `shape` from this transaction on: a shape other than the one the cache
        holds asks for a backfill at this transaction's commit (see tidegate.sync.backfill)."""
        name = table.entity_type
        if name not in self.shapes or self.shapes[name] == shape or self._open is None:
            self.shapes.setdefault(name, shape)
            return
        self.shapes[name] = shape
        self._asked.append(BackfillRequest(
            table=f"{table.schema}.{table.name}", entity_type=name,
            version=backfill_version(self._open.final_lsn), shape=shape, reason=reason))

    def follow(self, table: TableInfo) -> None:
        """Take `table`'s changes from now on (a configured table created or re-created while
        the source runs). Called from another thread; a dict assignment is atomic."""
        self._tables[(table.schema, table.name)] = table
        self._keep_documents(table)

    def _keep_documents(self, table: TableInfo) -> None:
        """Whether the table's key is a JSON document, after its columns changed."""
        if document_key(table, self._base_types):
            self._documents.add(table.entity_type)
        else:
            self._documents.discard(table.entity_type)

    def table(self, entity_type: str) -> TableInfo | None:
        """The table as the stream last described it (columns renamed, added, dropped)."""
        return next((t for t in list(self._tables.values()) if t.entity_type == entity_type), None)

    def take_backfills(self, position: int | None) -> list[BackfillRequest]:
        """The backfills the transaction committed at `position` asks for (taken once)."""
        return self._backfills.pop(position, []) if position is not None else []

    def _logical_message(self, message: LogicalMessage) -> Transaction | None:
        # A transactional heartbeat arrives inside its own Begin..Commit, which yields the empty
        # transaction; a non-transactional one stands alone at its LSN.
        if message.prefix == HEARTBEAT_PREFIX and not message.transactional:
            return Transaction((), position=message.lsn)
        if message.prefix == SCHEMA_PREFIX and message.transactional and self._open is not None:
            self._schema_message(message.content)
        return None

    def _schema_message(self, content: bytes) -> None:
        """The source saw the catalog differ from the known shape of a table (or the table
        gone): the change is committed before this message's transaction."""
        entity_type, shape = parse_schema_message(content)
        table = self.table(entity_type)
        if table is None or self.shapes.get(entity_type, ()) == shape:
            return
        if shape is None:
            # A dropped table has no rows: its cached ones go, as a TRUNCATE would take them.
            self._emit(table, Op.TRUNCATE)
        self._shape_seen(table, shape, "dropped" if shape is None else "catalog")

    def _row_message(self, payload: bytes, tag: int) -> None:
        """An Insert, Update or Delete read off its bytes (see `feed_payload`)."""
        what = _ROW_TAGS[tag]
        if len(payload) < 6:
            _malformed(payload)
        (relation_id,) = _RELATION_ID.unpack_from(payload, 1)
        state = self._change_state(relation_id, what)
        if state.table is None:
            return  # a table not followed: its values are not even read
        kind, pos = payload[5], 6
        if tag == 0x55 and kind in (0x4B, 0x4F):  # an Update with its old key ('K') or row ('O')
            old_texts, old_unchanged, pos = tuple_texts(payload, pos)
            old_kind: str | None = chr(kind)
            old: _Texts | None = (old_texts, old_unchanged)
            if pos >= len(payload):
                _malformed(payload)
            kind, pos = payload[pos], pos + 1
        else:
            old_kind, old = None, None
        if tag == 0x44:  # 'D': its one tuple is the old key or row
            if kind not in (0x4B, 0x4F):
                _malformed(payload)
            texts, unchanged, _ = tuple_texts(payload, pos)
            self._delete(state, chr(kind), (texts, unchanged))
            return
        if kind != 0x4E:  # 'N'
            _malformed(payload)
        texts, unchanged, _ = tuple_texts(payload, pos)
        if tag == 0x49:
            self._insert(state, (texts, unchanged))
        else:
            self._update(state, old_kind, old, (texts, unchanged))

    def _change_state(self, relation_id: int, what: str) -> _RelationState:
        if self._open is None:
            raise SourceError(f"pgoutput {what} outside a transaction")
        return self._state(relation_id)

    def _truncate(self, message: Truncate) -> None:
        if self._open is None:
            raise SourceError("pgoutput Truncate outside a transaction")
        for relation_id in message.relation_ids:
            state = self._state(relation_id)
            if state.table is not None:
                self._emit(state.table, Op.TRUNCATE)

    def _insert(self, state: _RelationState, new: _Texts) -> None:
        if state.table is None:
            return
        after, _ = self._row(state, new)
        self._emit(state.table, Op.INSERT, after=after, source_key=_key_text(state, new[0]))

    def _delete(self, state: _RelationState, old_kind: str, old: _Texts) -> None:
        table = state.table
        if table is None:
            return
        before, _ = self._row(state, old)
        if old_kind == "K":
            before = {c: before.get(c) for c in table.key_columns}
        self._emit(table, Op.DELETE, before=before, source_key=_key_text(state, old[0]))

    def _update(self, state: _RelationState, old_kind: str | None, old: _Texts | None,
                new: _Texts) -> None:
        table = state.table
        if table is None:
            return
        after, unchanged = self._row(state, new)
        before: dict[str, object] | None = None
        key_text = _key_text(state, new[0], old[0] if old is not None else None)
        if old is not None:
            before, _ = self._row(state, old)
            if old_kind == "O":
                # REPLICA IDENTITY FULL: the old row is complete (PostgreSQL inlines its TOASTed
                # values), so unchanged ones are taken from it.
                fill = [column for column in unchanged if column in before]
            else:
                # The old key alone ('K'): sent when the key changed, or when a key value is
                # stored out of line; an unchanged out-of-line key value is taken from it.
                before = {c: before.get(c) for c in table.key_columns}
                fill = [column for column in unchanged if column in before]
            for column in fill:
                after[column] = before[column]
                unchanged.remove(column)
        if before is not None and any(before.get(c) != after.get(c) for c in table.key_columns):
            # The key changed: the entity under the old key is gone. Its removal comes first, so
            # a reader of this transaction never sees two rows for one database row.
            old_key = _key_text(state, old[0]) if old is not None else None
            self._emit(table, Op.DELETE, before=dict(before), source_key=old_key)
        self._emit(table, Op.UPDATE, after=after, before=before, unchanged=unchanged,
                   source_key=key_text)

    # ------------------------------------------------------------------ rows

    def _state(self, relation_id: int) -> _RelationState:
        state = self._relations.get(relation_id)
        if state is None:
            raise SourceError(f"pgoutput change for relation {relation_id} before its Relation message")
        return state

    def _row(self, state: _RelationState, data: _Texts) -> tuple[dict[str, object], list[str]]:
        """Canonical values of the columns sent (naive timestamps read in the source zone), and
        the names of the unchanged TOAST ones."""
        texts, unchanged = data
        names = state.names
        if len(texts) != len(names):
            raise SourceError(f"pgoutput tuple has {len(texts)} columns, its relation {len(names)}")
        row: dict[str, object] = {}
        for name, decode, text in zip(names, state.decoders, texts, strict=True):
            row[name] = text if text is None or decode is None else decode(text)
        if not unchanged:
            return row, []
        missing = [names[index] for index in unchanged]
        for name in missing:
            del row[name]
        return row, missing

    def _emit(self, table: TableInfo, op: Op, *, after: dict[str, object] | None = None,
              before: dict[str, object] | None = None, unchanged: Sequence[str] = (),
              source_key: Sequence[str] | None = None) -> None:
        """Append a change of rows already canonical (the decoders make them so)."""
        open_ = self._open
        assert open_ is not None
        version = Version(open_.final_lsn, len(open_.changes))
        open_.changes.append(Change.of_canonical_row(
            entity_type=table.entity_type, op=op, key_columns=table.key_columns, version=version,
            commit_time=open_.commit_time, after=after, before=before, xid=open_.xid,
            captured_at=self._clock(), unchanged=unchanged, source_key=source_key,
            documents=table.entity_type in self._documents,
        ))


def _reshaped(table: TableInfo, relation: Relation,
              previous: Sequence[Column] | None) -> TableInfo:
    """`table` with the columns `relation` describes. A renamed key column keeps its place in
    the key: a rename is recognised as the same position, type and count of columns as before
    with another name (before: the previous Relation message of this session, else the table as
    last described — the catalog at start, whose names a replayed older message may predate)."""
    names = tuple(c.name for c in relation.columns)
    # A table known by name only (dropped before this run) takes the key the message flags.
    key_columns = table.key_columns or tuple(c.name for c in relation.columns if c.in_key)
    before = ([(c.name, c.type_oid) for c in previous] if previous is not None
              else [(name, table.type_oids.get(name, 0)) for name in table.columns])
    if not set(key_columns) <= set(names) and len(before) == len(names):
        renamed = {name: new.name for (name, oid), new in zip(before, relation.columns, strict=True)
                   if oid == new.type_oid}
        key_columns = tuple(renamed.get(c, c) for c in key_columns)
    flagged = [c.name for c in relation.columns if c.in_key]
    if not set(key_columns) <= set(names) and len(key_columns) == len(flagged) == 1:
        key_columns = (flagged[0],)  # no earlier message to compare with: the one key column
    type_oids = {c.name: c.type_oid for c in relation.columns}
    if names == table.columns and key_columns == table.key_columns and type_oids == table.type_oids:
        return table
    return dataclasses.replace(
        table, columns=names, type_oids=type_oids, key_columns=key_columns,
        toastable=tuple(c for c in table.toastable if c in type_oids))


_DOCUMENT_TYPES = frozenset({114, 3802})  # json, jsonb
_ROW_TAGS = {0x49: "Insert", 0x55: "Update", 0x44: "Delete"}
_RELATION_ID = struct.Struct(">I")


def document_key(table: TableInfo, base_types: Mapping[int, int]) -> bool:
    """True when the table's key is one column of JSON documents (jsonb, or a domain over it),
    whose values may be strings and numbers alike: its entity ids take the array form
    (`entity_id_of(..., documents=True)`)."""
    if len(table.key_columns) != 1:
        return False
    oid = table.type_oids.get(table.key_columns[0], 0)
    return base_types.get(oid, oid) in _DOCUMENT_TYPES


def _key_text(state: _RelationState, *tuples: list[str | None] | None) -> tuple[str, ...] | None:
    """The key columns' values as the server's text, from the first tuple that sent each (an
    unchanged out-of-line key value is only in the old key tuple); None when one was not sent."""
    texts: list[str] = []
    for index in state.key_indexes:
        for data in tuples:
            if data is None:
                continue
            if index is None or index >= len(data):
                return None
            text = data[index]
            if text is not None:
                texts.append(text)
                break
        else:
            return None
    return tuple(texts)


def _texts_of(data: TupleData) -> _Texts:
    """A decoded TupleData (`decode_message`'s) in the form `tuple_texts` reads."""
    texts: list[str | None] = []
    unchanged: list[int] = []
    for index, (kind, raw) in enumerate(data):
        if kind == TEXT and raw is not None:
            texts.append(raw.decode("utf-8"))
        elif kind == BINARY:
            raise SourceError("binary column values arrived, but the source asks for text")
        else:
            texts.append(None)
            if kind != NULL:
                unchanged.append(index)
    return texts, unchanged


def _malformed(payload: bytes) -> NoReturn:
    """Raise the decoder's own error for a message the fast path cannot read."""
    decode_message(payload)
    raise SourceError(f"malformed pgoutput message {payload[:1]!r}")


class ReplicationReader:
    """Reads the slot on a thread of its own and puts committed transactions on `queue`, in
    lists: everything read while the socket had more to give, handed over in one call.

    Hand-over does not wait for the event loop: the thread schedules the put and reads on, so a
    transaction costs no thread → loop → thread round trip (that wait, two GIL hand-offs per
    transaction, capped the stream at a third of what it reaches without). Nor is a transaction
    handed over on its own while more are readable: each hand-over wakes the event loop (a write
    to its self-pipe, a pass of its selector), which under a backlog cost as much as decoding the
    transaction. A list ends when the socket has nothing more to read (so a transaction arriving
    alone is handed over at once), at `HAND_OVER_TRANSACTIONS`, or `HAND_OVER_S` after its first.
    Memory stays bounded by `max_pending` transactions: the thread reserves room for each list
    and the consumer gives it back (`taken`) when it takes the list off the queue; without room
    the thread waits, still answering the server's keepalives. A failure is put on the queue as
    the exception itself, after the transactions that came before it.
    """

    # Over seven parameters (PLR0913): outstanding, issue 27: not yet folded into an object.
    def __init__(self, *, connect: Callable[[bool], Any], slot_name: str, publication: str,  # noqa: PLR0913
                 assembler: TransactionAssembler, loop: asyncio.AbstractEventLoop,
                 queue: asyncio.Queue[list[Transaction] | BaseException], status_interval_s: float,
                 heartbeat_s: float | None, max_pending: int) -> None:
        self._connect = connect
        self._slot_name = slot_name
        self._publication = publication
        self._assembler = assembler
        self._loop = loop
        self._queue = queue
        self._status_interval_s = status_interval_s
        self._heartbeat_s = heartbeat_s
        self._stopping = threading.Event()
        self._max_pending = max_pending
        self._list_max = min(max_pending, HAND_OVER_TRANSACTIONS)
        self._pending = 0  # transactions handed over and not yet taken (guarded by _room)
        self._room = threading.Condition()
        self._thread = threading.Thread(target=self._run, name=f"pg-replication-{slot_name}",
                                        daemon=True)
        # Written by the asyncio side, read by the thread (a plain int: assignment is atomic).
        self.confirmed_lsn = 0
        self._received_lsn = 0
        self._reported = (0, 0)

    def start(self) -> None:
        """Start reading."""
        self._thread.start()

    def stop(self) -> None:
        """Ask the thread to finish (it closes its connections); `join` waits for it."""
        self._stopping.set()

    def taken(self, count: int) -> None:
        """The consumer took `count` transactions off the queue: their room is free again."""
        with self._room:
            self._pending -= count
            self._room.notify()

    def join(self, timeout_s: float | None = None) -> None:
        """Wait for the thread to end."""
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    # ------------------------------------------------------------------ thread

    def _run(self) -> None:
        conn = heartbeat_conn = None
        try:
            conn = self._connect(True)
            cursor = self._start(conn)
            if self._heartbeat_s is not None:
                heartbeat_conn = self._connect(False)
            next_heartbeat = time.monotonic() + (self._heartbeat_s or 0.0)
            while not self._stopping.is_set():
                self._feedback(cursor)
                if heartbeat_conn is not None and time.monotonic() >= next_heartbeat:
                    self._heartbeat(heartbeat_conn)
                    next_heartbeat = time.monotonic() + (self._heartbeat_s or 0.0)
                transactions, drained = self._read(cursor)
                if transactions:
                    self._hand_over(transactions, cursor)
                if drained:
                    select.select([conn], [], [], POLL_S)
            # Stopping: what the pipeline confirmed last (its drain ends with a confirm) goes
            # out before the connection closes.
            self._feedback(cursor, final=True)
        except BaseException as exc:  # every failure must reach the consumer, not die here
            if not self._stopping.is_set():
                self._hand_over(exc, None)
        finally:
            for connection in (conn, heartbeat_conn):
                if connection is not None:
                    try:
                        connection.close()
                    except Exception:  # closing a broken connection: nothing left to save
                        logger.debug("closing a replication connection failed", exc_info=True)

    def _read(self, cursor: Any) -> tuple[list[Transaction], bool]:
        """The transactions the socket holds now, up to one list's worth, and whether it was
        read empty (True: wait for it before reading again)."""
        transactions: list[Transaction] = []
        feed = self._assembler.feed_payload
        deadline = 0.0
        try:
            while True:
                message = cursor.read_message()
                if message is None:
                    return transactions, True
                transaction = feed(message.payload)
                if transaction is None:
                    continue
                if transaction.position is not None:
                    self._received_lsn = max(self._received_lsn, transaction.position)
                transactions.append(transaction)
                if len(transactions) == 1:
                    deadline = time.monotonic() + HAND_OVER_S
                if len(transactions) >= self._list_max or time.monotonic() >= deadline:
                    return transactions, False
        except BaseException:
            if transactions:  # what came before the failure reaches the consumer before it
                self._hand_over(transactions, cursor)
            raise

    def _start(self, conn: Any) -> Any:
        deadline = time.monotonic() + SLOT_BUSY_WAIT_S
        while True:
            cursor = conn.cursor()
            try:
                cursor.start_replication(
                    slot_name=self._slot_name, decode=False,
                    status_interval=self._status_interval_s,
                    options={"proto_version": "1", "publication_names": self._publication,
                             "messages": "true"},
                )
                return cursor
            except psycopg2.errors.ObjectInUse:
                if time.monotonic() >= deadline or self._stopping.is_set():
                    raise
                time.sleep(POLL_S)

    def _feedback(self, cursor: Any, *, final: bool = False) -> None:
        """Report the positions. A flush position the pipeline newly confirmed goes out at once
        (forced; psycopg2 would otherwise hold it until the status interval, and a sync that
        restarts more often than that would never advance the slot), so a restart replays only
        what was in flight. Otherwise psycopg2 sends them every status interval and whenever the
        server asks for a reply; the flush position is only ever what the pipeline confirmed.
        (psycopg2 also moves it up to a keepalive's WAL end once every message it returned is
        confirmed: nothing the pipeline still has to apply lies below that point.)"""
        flush = self.confirmed_lsn
        write = max(self._received_lsn, flush)
        if (write, flush) != self._reported or final:
            cursor.send_feedback(write_lsn=write, flush_lsn=flush,
                                 force=final or flush != self._reported[1])
            self._reported = (write, flush)

    def _heartbeat(self, conn: Any) -> None:
        # Transactional, so its transaction's commit flushes the WAL: a non-transactional
        # message alone is not flushed (before PostgreSQL 17) and so never reaches the slot on an
        # idle server — exactly when a heartbeat is needed.
        with conn.cursor() as cur:
            cur.execute("SELECT pg_logical_emit_message(true, %s, now()::text)", (HEARTBEAT_PREFIX,))

    def _hand_over(self, item: list[Transaction] | BaseException, cursor: Any) -> None:
        if isinstance(item, list) and not self._reserve(len(item), cursor):
            return
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, item)
        except RuntimeError:  # the event loop is gone: nobody is left to consume
            self._stopping.set()

    def _reserve(self, count: int, cursor: Any) -> bool:
        """Wait for room for `count` more transactions; False when stopping meanwhile."""
        while True:
            with self._room:
                if self._room.wait_for(lambda: self._pending + count <= self._max_pending,
                                       BLOCKED_FEEDBACK_S):
                    self._pending += count
                    return True
            if self._stopping.is_set():
                return False
            if cursor is not None:  # the consumer is behind: keep the server answered
                self._feedback(cursor)
                cursor.send_feedback(force=True)
