"""The pgoutput decoder, the text-value decoders and the transaction assembler.

The byte strings below were captured from PostgreSQL 15 (`pg_logical_slot_get_binary_changes`
with proto_version 1, messages on) for this schema and these statements:

    CREATE TABLE items (id int PRIMARY KEY, name text, price numeric(10,2), tags text[],
                        doc jsonb, seen timestamptz);
    CREATE TABLE pairs (a int, b text, v text, PRIMARY KEY (a, b));   -- REPLICA IDENTITY FULL
    INSERT INTO items VALUES (1, 'café', 12.50, '{a,"b c",NULL}', '{"k": [1, 2]}',
                              '2024-05-06 07:08:09.123456+00'), (2, NULL, NULL, NULL, NULL, NULL);
    UPDATE items SET id = 3 WHERE id = 2;  DELETE FROM items WHERE id = 3;
    UPDATE pairs SET v = 'v2';  TRUNCATE items, pairs RESTART IDENTITY CASCADE;

A further test decodes a stream the fixture's server produces while the test runs.
"""

from __future__ import annotations

import contextlib
import uuid
from datetime import UTC, date, datetime, time, timedelta, timezone
from decimal import Decimal
from typing import Any

import psycopg2  # type: ignore[import-untyped]
import pytest

from tidegate.errors import SourceError
from tidegate.sync.changes import Op, Version
from tidegate.sync.sources.postgres.catalog import TableInfo
from tidegate.sync.sources.postgres.pgoutput import (
    Begin,
    Column,
    ColumnValue,
    Commit,
    Delete,
    Insert,
    LogicalMessage,
    Origin,
    Relation,
    Truncate,
    Type,
    Update,
    decode_message,
    format_lsn,
    parse_lsn,
)
from tidegate.sync.sources.postgres.stream import TransactionAssembler
from tidegate.sync.sources.postgres.types import canonical_decoder_for, decode_text, decoder_for
from tidegate.sync.values import canonical

COMMIT_TIME = datetime(2026, 11, 29, 10, 13, 54, 191248, tzinfo=UTC)

BEGIN = "42000000000194cff80003046651b60790000002d9"
COMMIT = "4300000000000194cff8000000000194d0280003046651b60790"
RELATION_ITEMS = (
    "52000040017075626c6963006974656d73006400060169640000000017ffffffff006e616d650000000019ffffffff"
    "00707269636500000006a4000a0006007461677300000003f1ffffffff00646f630000000edaffffffff007365656e"
    "00000004a0ffffffff"
)
RELATION_PAIRS = (
    "52000040087075626c69630070616972730066000301610000000017ffffffff01620000000019ffffffff0176000000"
    "0019ffffffff"
)
INSERT_FULL = (
    "49000040014e00067400000001317400000005636166c3a9740000000531322e3530740000000e7b612c22622063222c"
    "4e554c4c7d740000000d7b226b223a205b312c20325d7d740000001d323032342d30352d30362030373a30383a3039"
    "2e3132333435362b3030"
)
INSERT_NULLS = "49000040014e00067400000001326e6e6e6e6e"
UPDATE_KEY = "55000040014b00067400000001326e6e6e6e6e4e00067400000001336e6e6e6e6e"
DELETE_KEY = "44000040014b00067400000001336e6e6e6e6e"
UPDATE_FULL = (
    "55000040084f0003740000000131740000000178740000000276314e0003740000000131740000000178740000000276"
    "32"
)
DELETE_FULL = "44000040084f000374000000013174000000017874000000027632"
TRUNCATE = "5400000002030000400100004008"
MESSAGE_TRANSACTIONAL = "4d01000000000194623074696465676174652e6865617274626561740000000003686231"
MESSAGE_PLAIN = "4d0000000000019462a874696465676174652e6865617274626561740000000003686232"
ORIGIN = "4f0000000000abcdef757073747265616d00"
TYPE = "59000040027075626c6963006d6f6f6400"

ITEMS = TableInfo(
    schema="public", name="items", relation_id=16385,
    columns=("id", "name", "price", "tags", "doc", "seen"),
    type_oids={"id": 23, "name": 25, "price": 1700, "tags": 1009, "doc": 3802, "seen": 1184},
    key_columns=("id",), key_types=("integer",), replica_identity="d",
    toastable=("name", "price", "tags", "doc"),
)
PAIRS = TableInfo(
    schema="public", name="pairs", relation_id=16392, columns=("a", "b", "v"),
    type_oids={"a": 23, "b": 25, "v": 25}, key_columns=("a", "b"), key_types=("integer", "text"),
    replica_identity="f", toastable=("b", "v"),
)


def decode(hex_text: str) -> Any:
    return decode_message(bytes.fromhex(hex_text))


# ---------------------------------------------------------------------- messages


def test_begin_and_commit() -> None:
    assert decode(BEGIN) == Begin(final_lsn=0x194CFF8, commit_time=COMMIT_TIME, xid=729)
    assert decode(COMMIT) == Commit(flags=0, commit_lsn=0x194CFF8, end_lsn=0x194D028,
                                    commit_time=COMMIT_TIME)


def test_relation_lists_columns_types_and_key_flags() -> None:
    relation = decode(RELATION_ITEMS)
    assert isinstance(relation, Relation)
    assert (relation.relation_id, relation.namespace, relation.name) == (16385, "public", "items")
    assert relation.replica_identity == "d"
    assert [(c.name, c.type_oid, c.in_key) for c in relation.columns] == [
        ("id", 23, True), ("name", 25, False), ("price", 1700, False), ("tags", 1009, False),
        ("doc", 3802, False), ("seen", 1184, False)]
    # numeric(10,2): typmod is ((10 << 16) | 2) + 4
    assert relation.columns[2].type_modifier == (10 << 16 | 2) + 4
    pairs = decode(RELATION_PAIRS)
    assert pairs.replica_identity == "f"
    # Under REPLICA IDENTITY FULL every column identifies the row.
    assert [c.name for c in pairs.columns if c.in_key] == ["a", "b", "v"]


def test_insert_carries_text_and_null_columns() -> None:
    insert = decode(INSERT_FULL)
    assert isinstance(insert, Insert)
    assert insert.relation_id == 16385
    assert [c.data for c in insert.new] == [
        b"1", "café".encode(), b"12.50", b'{a,"b c",NULL}', b'{"k": [1, 2]}',
        b"2024-05-06 07:08:09.123456+00"]
    nulls = decode(INSERT_NULLS)
    assert nulls.new[0] == ColumnValue("t", b"2")
    assert all(column.is_null for column in nulls.new[1:])


def test_update_and_delete_with_old_key_or_old_row() -> None:
    update = decode(UPDATE_KEY)
    assert isinstance(update, Update)
    assert update.old_kind == "K"
    assert update.old is not None and update.old[0].data == b"2"
    assert update.new[0].data == b"3"
    full = decode(UPDATE_FULL)
    assert full.old_kind == "O"
    assert full.old is not None and [c.data for c in full.old] == [b"1", b"x", b"v1"]
    assert [c.data for c in full.new] == [b"1", b"x", b"v2"]
    delete = decode(DELETE_KEY)
    assert isinstance(delete, Delete) and delete.old_kind == "K" and delete.old[0].data == b"3"
    assert decode(DELETE_FULL).old_kind == "O"


def test_update_without_old_tuple() -> None:
    # UPDATE items SET price = 13 WHERE id = 1 (key unchanged: no old tuple is sent).
    update = decode(
        "55000040014e00067400000001317400000005636166c3a9740000000531332e3030740000000e7b612c2262"
        "2063222c4e554c4c7d740000000d7b226b223a205b312c20325d7d740000001d323032342d30352d30362030"
        "373a30383a30392e3132333435362b3030")
    assert update.old_kind is None and update.old is None
    assert update.new[2].data == b"13.00"


def test_truncate_flags_and_relations() -> None:
    truncate = decode(TRUNCATE)
    assert truncate == Truncate(options=3, relation_ids=(16385, 16392))
    assert truncate.cascade and truncate.restart_identity


def test_logical_messages_origin_and_type() -> None:
    assert decode(MESSAGE_TRANSACTIONAL) == LogicalMessage(
        transactional=True, lsn=0x1946230, prefix="tidegate.heartbeat", content=b"hb1")
    assert decode(MESSAGE_PLAIN) == LogicalMessage(
        transactional=False, lsn=0x19462A8, prefix="tidegate.heartbeat", content=b"hb2")
    assert decode(ORIGIN) == Origin(origin_lsn=0xABCDEF, name="upstream")
    assert decode(TYPE) == Type(type_oid=16386, namespace="public", name="mood")


def test_unchanged_toast_column_kind() -> None:
    # An Update whose second column is an unchanged TOAST value ('u'): 2 columns, 't' "1", 'u'.
    update = decode("5500004001" + "4e" + "0002" + "74" + "00000001" + "31" + "75")
    assert update.new[1].is_unchanged_toast
    assert update.new[1].data is None


@pytest.mark.parametrize("payload", [
    "", "5a00", BEGIN[:-4], INSERT_FULL[:40], "49000040014e0001780000", "44000040015800",
    "55000040015800",
])
def test_malformed_messages_raise_source_error(payload: str) -> None:
    with pytest.raises(SourceError):
        decode(payload)


def test_lsn_notation() -> None:
    assert format_lsn(0x1_0000_00AB) == "1/AB"
    assert parse_lsn("16/B374D848") == (0x16 << 32) | 0xB374D848
    with pytest.raises(SourceError):
        parse_lsn("nope")


# ---------------------------------------------------------------------- values


@pytest.mark.parametrize(("oid", "text", "expected"), [
    (21, "-7", -7), (23, "12", 12), (20, "-9223372036854775808", -9223372036854775808),
    (26, "4294967295", 4294967295),
    (1700, "1.10", Decimal("1.10")), (1700, "NaN", "NaN"),
    (700, "1.5", 1.5), (701, "-0.25", -0.25), (701, "Infinity", "Infinity"),
    (25, "héllo", "héllo"), (1043, "x", "x"), (1042, "ab  ", "ab  "), (19, "pg_class", "pg_class"),
    (16, "t", True), (16, "f", False),
    (1184, "2024-05-06 07:08:09.123456+05:30",
     datetime(2024, 5, 6, 7, 8, 9, 123456, tzinfo=timezone(timedelta(hours=5, minutes=30)))),
    (1184, "infinity", "infinity"), (1184, "0044-03-15 00:00:00+00 BC", "0044-03-15 00:00:00+00 BC"),
    (1114, "2024-05-06 07:08:09", datetime(2024, 5, 6, 7, 8, 9)), (1114, "-infinity", "-infinity"),
    (1082, "2024-01-31", date(2024, 1, 31)), (1083, "13:14:15.5", time(13, 14, 15, 500000)),
    (1083, "24:00:00", "24:00:00"),
    (114, '{"a": 1}', {"a": 1}), (3802, '{"a": [1, 2.5, null], "b": "x"}', {"a": [1, 2.5, None], "b": "x"}),
    (2950, "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", uuid.UUID("a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11")),
    (17, "\\x00ff10", b"\x00\xff\x10"),
    (1007, "{1,NULL,3}", [1, None, 3]), (1016, "{{1,2},{3,NULL}}", [[1, 2], [3, None]]),
    (1009, '{a,"b c",NULL,"NULL","q\\"x","{}"}', ["a", "b c", None, "NULL", 'q"x', "{}"]),
    (1231, "{1.5,NaN}", [Decimal("1.5"), "NaN"]), (1000, "{t,f}", [True, False]),
    (1185, '{"2024-01-01 00:00:00+00",NULL}', [datetime(2024, 1, 1, tzinfo=UTC), None]),
    (1115, '{"2024-01-01 10:00:00"}', [datetime(2024, 1, 1, 10)]),
    (1182, "{2024-01-01}", [date(2024, 1, 1)]), (1183, "{10:00:00}", [time(10)]),
    (3807, '{"{\\"a\\": 1}",NULL}', [{"a": 1}, None]), (199, '{"[1]"}', [[1]]),
    (2951, "{a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11}", [uuid.UUID("a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11")]),
    (1001, '{"\\\\x0102",NULL}', [b"\x01\x02", None]), (1007, "{}", []),
    (600, "(1,2)", "(1,2)"), (1186, "1 day", "1 day"),
])
def test_text_values_decode_by_type(oid: int, text: str, expected: object) -> None:
    assert decode_text(oid, text) == expected


def test_null_decodes_to_none() -> None:
    assert decode_text(23, None) is None


@pytest.mark.parametrize(("oid", "text"), [
    (21, "-7"), (23, "0"), (20, "-9223372036854775808"), (26, "4294967295"),
    (1700, "1.10"), (1700, "0.00"), (1700, "-0.5"), (1700, "12"), (1700, "-0"), (1700, "NaN"),
    (1700, "Infinity"), (1700, "-Infinity"), (1700, "123456789012345678901234567890.000000001"),
    (1700, "1E+3"), (1700, "007"), (16, "t"), (16, "f"),
    (1184, "2024-05-06 07:08:09.123456+00"), (1184, "2024-05-06 07:08:09+00"),
    (1184, "2024-05-06 07:08:09.1+00"), (1184, "0001-01-01 00:00:00+00"),
    (1184, "2024-05-06 07:08:09.12+05:30"), (1184, "12024-05-06 07:08:09+00"),
    (1184, "0044-03-15 00:00:00+00 BC"), (1184, "infinity"), (1184, "-infinity"),
    (1114, "2024-05-06 07:08:09"), (25, "héllo"), (1009, '{a,"b c",NULL}'), (1231, "{1.5,NaN}"),
    (1185, '{"2024-01-01 00:00:00+00",NULL}'), (3802, '{"a": [1, 2.5]}'), (17, "\\x00ff"),
    (2950, "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"), (1186, "1 day"),
])
def test_canonical_decoders_equal_decoding_then_canonicalising(oid: int, text: str) -> None:
    zone = timezone(timedelta(hours=2))
    fast = canonical_decoder_for(oid, zone)(text)
    slow = canonical(decoder_for(oid, zone)(text))
    assert fast == slow and type(fast) is type(slow)


# ---------------------------------------------------------------------- assembler


def test_captured_stream_assembles_into_transactions() -> None:
    assembler = TransactionAssembler([ITEMS, PAIRS], UTC, clock=lambda: 1.0)
    t = "{:016x}0003046651b60790{:08x}"

    def begin(lsn: int, xid: int) -> str:
        return "42" + t.format(lsn, xid)

    def commit(lsn: int, end: int) -> str:
        return f"4300{lsn:016x}{end:016x}0003046651b60790"

    stream = [
        begin(0x100, 1), RELATION_ITEMS, INSERT_FULL, INSERT_NULLS, commit(0x100, 0x130),
        begin(0x200, 2), UPDATE_KEY, DELETE_KEY, commit(0x200, 0x230),
        begin(0x300, 3), RELATION_PAIRS, UPDATE_FULL, DELETE_FULL, commit(0x300, 0x330),
        begin(0x400, 4), TRUNCATE, commit(0x400, 0x430),
        MESSAGE_PLAIN,
        begin(0x500, 5), MESSAGE_TRANSACTIONAL, commit(0x500, 0x530),
    ]
    transactions = [tx for hex_text in stream if (tx := assembler.feed(decode(hex_text))) is not None]
    assert [tx.position for tx in transactions] == [0x130, 0x230, 0x330, 0x430, 0x19462A8, 0x530]

    inserts = transactions[0].changes
    assert [(c.op, c.entity_id, c.version) for c in inserts] == [
        (Op.INSERT, "1", Version(0x100, 0)), (Op.INSERT, "2", Version(0x100, 1))]
    assert inserts[0].after == {"id": 1, "name": "café", "price": "12.50", "tags": ["a", "b c", None],
                                "doc": {"k": [1, 2]}, "seen": "2024-05-06T07:08:09.123456Z"}
    assert inserts[0].xid == 1 and inserts[0].captured_at == 1.0
    assert inserts[1].after == {"id": 2, "name": None, "price": None, "tags": None, "doc": None,
                                "seen": None}

    # The key changed 2 → 3: the old entity is deleted first, then the row under its new key.
    moved = transactions[1].changes
    assert [(c.op, c.entity_id, c.version.ordinal) for c in moved] == [
        (Op.DELETE, "2", 0), (Op.UPDATE, "3", 1), (Op.DELETE, "3", 2)]
    assert moved[0].before == {"id": 2}
    assert moved[2].before == {"id": 3}

    full = transactions[2].changes
    assert full[0].op is Op.UPDATE and full[0].entity_id == '[1,"x"]'
    assert full[0].before == {"a": 1, "b": "x", "v": "v1"}
    assert full[0].after == {"a": 1, "b": "x", "v": "v2"}
    assert full[1].op is Op.DELETE and full[1].before == {"a": 1, "b": "x", "v": "v2"}

    truncated = transactions[3].changes
    assert [(c.op, c.entity_type, c.entity_id) for c in truncated] == [
        (Op.TRUNCATE, "items", "*"), (Op.TRUNCATE, "pairs", "*")]
    # Heartbeats: empty transactions whose position can be confirmed.
    assert transactions[4].changes == () and transactions[5].changes == ()


def test_payloads_assemble_as_their_decoded_messages() -> None:
    # The stream reads Begin, Commit and row messages straight off their bytes: the changes
    # must be those of decoding each message first, to every field.
    t = "{:016x}0003046651b60790{:08x}"
    stream = [
        "42" + t.format(0x100, 1), RELATION_ITEMS, INSERT_FULL, INSERT_NULLS, UPDATE_KEY,
        DELETE_KEY, f"4300{0x100:016x}{0x130:016x}0003046651b60790",
        "42" + t.format(0x200, 2), RELATION_PAIRS, UPDATE_FULL, DELETE_FULL, TRUNCATE,
        f"4300{0x200:016x}{0x230:016x}0003046651b60791", MESSAGE_PLAIN,
    ]
    decoded = TransactionAssembler([ITEMS, PAIRS], UTC, clock=lambda: 1.0)
    raw = TransactionAssembler([ITEMS, PAIRS], UTC, clock=lambda: 1.0)
    for hex_text in stream:
        expected = decoded.feed(decode(hex_text))
        got = raw.feed_payload(bytes.fromhex(hex_text))
        assert got == expected
        if got is not None and expected is not None:
            assert got.commit_time == expected.commit_time
            assert [c.source_key for c in got.changes] == [c.source_key for c in expected.changes]


@pytest.mark.parametrize("payload", [INSERT_FULL[:30], UPDATE_KEY[:-4], DELETE_KEY[:12],
                                     "49000040015800", "44000040015800"])
def test_malformed_row_payloads_raise_source_error(payload: str) -> None:
    assembler = TransactionAssembler([ITEMS], UTC)
    assembler.feed_payload(bytes.fromhex(RELATION_ITEMS))
    assembler.feed_payload(bytes.fromhex("42" + "0000000000000100" + "0003046651b60790" + "00000001"))
    with pytest.raises(SourceError):
        assembler.feed_payload(bytes.fromhex(payload))


def test_unchanged_toast_is_listed_or_filled_from_the_old_row() -> None:
    table = TableInfo(schema="public", name="docs", relation_id=7, columns=("id", "body"),
                      type_oids={"id": 23, "body": 25}, key_columns=("id",), key_types=("integer",),
                      replica_identity="d", toastable=("body",))
    assembler = TransactionAssembler([table], UTC)
    columns = (Column(1, "id", 23, -1), Column(0, "body", 25, -1))
    assembler.feed(Relation(7, "public", "docs", "d", columns))
    assembler.feed(Begin(0x10, COMMIT_TIME, 9))
    new = (ColumnValue("t", b"1"), ColumnValue("u"))
    assembler.feed(Update(7, None, None, new))
    old_full = (ColumnValue("t", b"1"), ColumnValue("t", b"big"))
    assembler.feed(Update(7, "O", old_full, new))
    tx = assembler.feed(Commit(0, 0x10, 0x20, COMMIT_TIME))
    assert tx is not None
    listed, filled = tx.changes
    assert listed.after == {"id": 1} and listed.unchanged == ("body",)
    assert filled.after == {"id": 1, "body": "big"} and filled.unchanged == ()


def test_changes_of_tables_not_configured_are_left_out() -> None:
    assembler = TransactionAssembler([PAIRS], UTC)
    for hex_text in ("42" + "0000000000000100" + "0003046651b60790" + "00000001", RELATION_ITEMS,
                     INSERT_FULL):
        assert assembler.feed(decode(hex_text)) is None
    tx = assembler.feed(decode(f"4300{0x100:016x}{0x130:016x}0003046651b60790"))
    assert tx is not None and tx.changes == () and tx.position == 0x130


def test_change_outside_a_transaction_is_a_protocol_error() -> None:
    assembler = TransactionAssembler([ITEMS], UTC)
    assembler.feed(decode(RELATION_ITEMS))
    with pytest.raises(SourceError):
        assembler.feed(decode(INSERT_FULL))


# ---------------------------------------------------------------------- live server


def test_decodes_what_the_server_sends_now(pg_dsn: str) -> None:
    with contextlib.closing(psycopg2.connect(pg_dsn)) as conn, conn.cursor() as cur:
        conn.autocommit = True
        cur.execute("SET synchronous_commit = on")  # the SQL interface reads only flushed WAL
        cur.execute("CREATE TABLE t (id bigint PRIMARY KEY, v text, n numeric)")
        cur.execute("CREATE PUBLICATION p FOR TABLE t")
        cur.execute("SELECT pg_create_logical_replication_slot('decoder_live', 'pgoutput')")
        cur.execute("INSERT INTO t SELECT g, 'v' || g, g / 4.0 FROM generate_series(1, 3) g")
        cur.execute("UPDATE t SET v = NULL WHERE id = 2")
        cur.execute("DELETE FROM t WHERE id = 3")
        cur.execute("TRUNCATE t")
        cur.execute("SELECT pg_logical_emit_message(true, 'tidegate.heartbeat', 'x')")
        cur.execute(
            "SELECT data FROM pg_logical_slot_get_binary_changes('decoder_live', NULL, NULL, "
            "'proto_version', '1', 'publication_names', 'p', 'messages', 'true')")
        messages = [decode_message(bytes(row[0])) for row in cur.fetchall()]
        cur.execute("SELECT pg_drop_replication_slot('decoder_live')")
    kinds = [type(m).__name__ for m in messages]
    assert kinds.count("Begin") == kinds.count("Commit") == 5
    table = TableInfo(schema="public", name="t", relation_id=0, columns=("id", "v", "n"),
                      type_oids={"id": 20, "v": 25, "n": 1700}, key_columns=("id",),
                      key_types=("bigint",), replica_identity="d", toastable=("v", "n"))
    assembler = TransactionAssembler([table], UTC)
    txs = [tx for m in messages if (tx := assembler.feed(m)) is not None]
    assert [[(c.op, c.entity_id) for c in tx.changes] for tx in txs] == [
        [(Op.INSERT, "1"), (Op.INSERT, "2"), (Op.INSERT, "3")], [(Op.UPDATE, "2")],
        [(Op.DELETE, "3")], [(Op.TRUNCATE, "*")], []]
    assert txs[0].changes[2].after == {"id": 3, "v": "v3", "n": "0.75000000000000000000"}
    assert txs[1].changes[0].after == {"id": 2, "v": None, "n": "0.50000000000000000000"}
    assert len({c.version.lsn for c in txs[0].changes}) == 1
