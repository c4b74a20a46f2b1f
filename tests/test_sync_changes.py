"""Change events: canonical values, checksums, UTC timestamps, versions and the wire form."""

from __future__ import annotations

import uuid
from datetime import UTC, date, datetime, time, timedelta, timezone
from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidegate.errors import InvalidChange
from tidegate.sync import Change, Op, Version, canonical, checksum, entity_id_of, normalise_timestamp
from tidegate.sync.contracts import Transaction
from tidegate.sync.tracker import PositionTracker
from tidegate.sync.values import source_zone

COMMIT = datetime(2026, 11, 29, 10, 0, tzinfo=UTC)
EXPECTED = "2026-11-29T10:00:00.000000Z"


@pytest.mark.parametrize("value", [
    datetime(2026, 11, 29, 10, 0, tzinfo=UTC),
    datetime(2026, 11, 29, 11, 0, tzinfo=timezone(timedelta(hours=1))),
    "2026-11-29T10:00:00Z",
    "2026-11-29 12:00:00+02:00",
    1_795_946_400,  # epoch seconds
    1_795_946_400_000,  # epoch milliseconds
    "1795946400",
    1_795_946_400.0,
])
def test_every_timestamp_form_normalises_to_one_utc_iso_string(value: object) -> None:
    assert normalise_timestamp(value) == EXPECTED


def test_naive_timestamps_are_read_in_the_source_zone() -> None:
    berlin = source_zone("Europe/Berlin")
    assert normalise_timestamp(datetime(2026, 11, 29, 11, 0), berlin) == EXPECTED
    assert normalise_timestamp("2026-11-29T11:00:00", berlin) == EXPECTED
    assert normalise_timestamp(datetime(2026, 11, 29, 10, 0)) == EXPECTED  # UTC by default


@pytest.mark.parametrize("bad", ["yesterday", True, float("nan"), [], "10**99"])
def test_a_value_that_is_no_timestamp_is_refused_by_name(bad: object) -> None:
    with pytest.raises(InvalidChange, match="timestamp"):
        normalise_timestamp(bad)


def test_an_unknown_source_zone_is_refused() -> None:
    with pytest.raises(InvalidChange, match="Mars/Olympus"):
        source_zone("Mars/Olympus")


def test_canonical_values_have_one_form_per_type() -> None:
    row = {
        "price": Decimal("149.990"), "when": datetime(2026, 11, 29, 10, 0, tzinfo=UTC),
        "day": date(2026, 1, 2),
        "at": time(8, 30), "id": uuid.UUID(int=1), "raw": b"\x00\xff", "tags": ("a", "b"),
        "doc": {"z": 1, "a": [Decimal("1E+2")]}, "n": None, "ok": True, "x": 1.5,
    }
    assert canonical(row) == {
        "price": "149.990", "when": EXPECTED, "day": "2026-01-02", "at": "08:30:00",
        "id": "00000000-0000-0000-0000-000000000001", "raw": "00ff", "tags": ["a", "b"],
        "doc": {"z": 1, "a": ["100"]}, "n": None, "ok": True, "x": 1.5,
    }
    with pytest.raises(InvalidChange, match="canonical"):
        canonical({"v": float("inf")})
    with pytest.raises(InvalidChange, match="set"):
        canonical({"v": {1, 2}})


def test_the_checksum_ignores_key_order_and_sees_every_value() -> None:
    assert checksum({"a": 1, "b": {"x": 1, "y": 2}}) == checksum({"b": {"y": 2, "x": 1}, "a": 1})
    assert checksum({"a": 1}) != checksum({"a": "1"})
    assert len(checksum(None)) == 64


@given(st.tuples(st.integers(0, 2**64 - 1), st.integers(0, 2**32 - 1)),
       st.tuples(st.integers(0, 2**64 - 1), st.integers(0, 2**32 - 1)))
def test_version_keys_sort_like_versions(a: tuple[int, int], b: tuple[int, int]) -> None:
    va, vb = Version(*a), Version(*b)
    assert (va < vb) == (va.key < vb.key)
    assert Version.from_key(va.key) == va


def test_entity_ids_of_single_and_composite_keys() -> None:
    assert entity_id_of({"id": "SKU-1"}, ["id"]) == "SKU-1"
    assert entity_id_of({"id": 7}, ["id"]) == "7"
    assert entity_id_of({"order": 7, "line": "a"}, ["order", "line"]) == '[7,"a"]'
    with pytest.raises(InvalidChange, match="line"):
        entity_id_of({"order": 7, "line": None}, ["order", "line"])


def test_entity_ids_of_keys_that_are_empty_or_look_like_encodings() -> None:
    # '' and strings starting with a double quote take their JSON form; the rest stay plain.
    assert entity_id_of({"id": ""}, ["id"]) == '""'
    assert entity_id_of({"id": '""'}, ["id"]) == '"\\"\\""'
    assert entity_id_of({"id": '"x'}, ["id"]) == '"\\"x"'
    assert entity_id_of({"id": " "}, ["id"]) == " "
    assert entity_id_of({"id": "[1,2]"}, ["id"]) == "[1,2]"
    assert entity_id_of({"a": "", "b": ""}, ["a", "b"]) == '["",""]'
    assert entity_id_of({"a": "a,b", "b": "c"}, ["a", "b"]) != entity_id_of(
        {"a": "a", "b": "b,c"}, ["a", "b"])


@given(st.text(), st.text())
def test_entity_ids_of_one_text_column_are_injective_and_never_empty(a: str, b: str) -> None:
    first, second = entity_id_of({"k": a}, ["k"]), entity_id_of({"k": b}, ["k"])
    assert first and second
    assert (first == second) == (a == b)


PART = st.one_of(st.text(max_size=4), st.integers(-2**63, 2**63 - 1))


@given(st.lists(st.tuples(st.text(max_size=4), PART), min_size=2, max_size=2))
def test_entity_ids_of_composite_keys_are_injective(keys: list[tuple[str, str | int]]) -> None:
    (a1, b1), (a2, b2) = keys
    first = entity_id_of({"a": a1, "b": b1}, ["a", "b"])
    second = entity_id_of({"a": a2, "b": b2}, ["a", "b"])
    assert (first == second) == ((a1, b1) == (a2, b2) and type(b1) is type(b2))


def test_a_change_survives_its_wire_form_and_keeps_its_checksum() -> None:
    change = Change.of_row(entity_type="products", op=Op.UPDATE, key_columns=["id"], version=Version(99, 2),
                           commit_time=COMMIT, after={"id": "p1", "price": Decimal("9.50")},
                           before={"id": "p1", "price": Decimal("9.00")}, xid=42)
    assert change.checksum == checksum({"id": "p1", "price": "9.50"})
    assert Change.from_json(change.to_json()) == change


def test_a_delete_is_checksummed_over_the_row_it_removed_and_a_truncate_has_no_row() -> None:
    delete = Change.of_row(entity_type="t", op=Op.DELETE, key_columns=["id"], version=Version(1, 0),
                           commit_time=COMMIT, before={"id": 1})
    assert delete.entity_id == "1" and delete.checksum == checksum({"id": 1})
    truncate = Change.of_row(entity_type="t", op=Op.TRUNCATE, key_columns=["id"], version=Version(2, 0),
                             commit_time=COMMIT)
    assert truncate.entity_id == "*" and truncate.checksum == checksum(None)


def test_unchanged_columns_are_filled_and_the_checksum_then_covers_them() -> None:
    partial = Change.of_row(entity_type="t", op=Op.UPDATE, key_columns=["id"], version=Version(5, 0),
                            commit_time=COMMIT, after={"id": 1, "n": 2}, unchanged=["body"])
    full = partial.with_columns({"id": 1, "n": 1, "body": "long text"})
    assert full.unchanged == () and full.after == {"id": 1, "n": 2, "body": "long text"}
    assert full.checksum == checksum(full.after) != partial.checksum
    assert partial.with_columns({}).unchanged == ("body",)


@pytest.mark.parametrize(("data", "field"), [
    (b"not json", "not JSON"), (b"[]", "JSON object"), (b'{"entity_type": "t"}', "entity_id"),
    (b'{"entity_type": "t", "entity_id": "1", "op": "upsert", "key": {}}', "op 'upsert'"),
])
def test_a_malformed_event_is_refused_naming_what_is_wrong(data: bytes, field: str) -> None:
    with pytest.raises(InvalidChange, match=field):
        Change.from_json(data)


def test_a_naive_commit_time_is_refused() -> None:
    with pytest.raises(InvalidChange, match="timezone-aware"):
        Change("t", "1", Op.INSERT, {"id": 1}, {"id": 1}, None, datetime(2026, 1, 1), Version(1, 0))


def _change(entity_id: str, lsn: int, ordinal: int = 0) -> Change:
    return Change.of_row(entity_type="t", op=Op.INSERT, key_columns=["id"], version=Version(lsn, ordinal),
                         commit_time=COMMIT, after={"id": entity_id})


def test_a_position_is_confirmable_only_when_it_and_everything_before_is_applied() -> None:
    tracker = PositionTracker()
    first = Transaction((_change("a", 10), _change("b", 10, 1)), position=11)
    second = Transaction((_change("c", 20),), position=21)
    heartbeat = Transaction((), position=30)
    for transaction in (first, second, heartbeat):
        tracker.add(transaction)
    assert tracker.applied(second.changes[0])  # applied out of order
    assert tracker.take_confirmable().position is None
    tracker.applied(first.changes[0])
    assert tracker.take_confirmable().position is None
    assert not tracker.applied(_change("zz", 99))  # unknown: ignored
    tracker.applied(first.changes[1])
    assert tracker.take_confirmable().position == 30
    assert tracker.pending_changes == 0


def test_snapshot_marks_come_back_in_order_and_are_not_streamed_changes() -> None:
    tracker = PositionTracker()
    batches = [Transaction((_change(str(i), 5),), position=None, snapshot_mark={"after": i})
               for i in range(3)]
    for batch in batches:
        tracker.add(batch)
    assert not tracker.applied(batches[1].changes[0])
    assert tracker.take_confirmable().snapshot_marks == []
    tracker.applied(batches[0].changes[0])
    confirmable = tracker.take_confirmable()
    assert confirmable.snapshot_marks == [{"after": 0}, {"after": 1}] and confirmable.position is None
