"""The Redis bus's entry layout and its trim window (`tidegate.sync.buses.redis_entries`), on
their own; the bus contract suite runs them against redis-server."""

from __future__ import annotations

from datetime import UTC, datetime

import orjson

from tidegate.sync.buses.redis_entries import FIELD_MANY, FIELD_ONE, MAX_ENTRY_BYTES, TrimWindow, entries_of
from tidegate.sync.changes import Change, Op, Version

COMMIT = datetime(2026, 3, 4, 5, 6, 7, 890123, tzinfo=UTC)


def change(n: int, entity_type: str = "product", text: str = "") -> Change:
    return Change.of_row(entity_type=entity_type, op=Op.INSERT, key_columns=["id"], version=Version(n, 0),
                         commit_time=COMMIT, after={"id": n, "text": text})


def key_of(entity_type: str) -> str:
    return f"p:{{{entity_type}}}:changes"


def test_each_streams_changes_go_in_publish_order_into_entries_of_at_most_the_setting() -> None:
    changes = [change(n, "product" if n % 3 else "user") for n in range(25)]
    entries = entries_of(changes, key_of, 4)
    for entity_type in ("product", "user"):
        mine = [e for e in entries if e.key == key_of(entity_type)]
        carried = [Change.from_object(event) for e in mine for event in orjson.loads(e.fields[FIELD_MANY])]
        assert carried == [c for c in changes if c.entity_type == entity_type]
        assert all(1 <= e.changes <= 4 for e in mine)
        assert [e.changes for e in mine] == [len(orjson.loads(e.fields[FIELD_MANY])) for e in mine]


def test_one_change_an_entry_is_the_one_change_form() -> None:
    changes = [change(n) for n in range(3)]
    entries = entries_of(changes, key_of, 1)
    assert [e.fields for e in entries] == [{FIELD_ONE: c.to_json()} for c in changes]


def test_an_entry_stays_within_its_bytes_unless_one_change_alone_is_larger() -> None:
    third, whole = "x" * (MAX_ENTRY_BYTES // 3), "x" * MAX_ENTRY_BYTES
    changes = [change(1, text=third), change(2, text=third), change(3, text=third),
               change(4, text=whole), change(5)]
    entries = entries_of(changes, key_of, 100)
    # Two thirds and their fields fit; the third third does not; the change larger than the
    # bound goes alone (never split); the small one after it starts an entry of its own.
    assert [e.changes for e in entries] == [2, 1, 1, 1]
    sizes = [len(e.fields[FIELD_MANY]) for e in entries]
    assert sizes[2] > MAX_ENTRY_BYTES
    assert all(size <= MAX_ENTRY_BYTES for size in sizes[:2] + sizes[3:])


def test_the_trim_window_keeps_the_fewest_newest_entries_holding_the_cap() -> None:
    window = TrimWindow(10)
    window.wrote(b"1-0", 4)
    window.wrote(b"2-0", 4)
    assert window.min_id is None  # 8 changes: nothing to trim yet
    window.wrote(b"3-0", 4)
    assert window.min_id is None  # 12, but without the oldest only 8: it stays
    window.wrote(b"4-0", 3)
    assert window.min_id == b"2-0"  # 2-0, 3-0, 4-0 hold 11 >= 10; 3-0 and 4-0 only 7
    window.trimmed(b"2-0")
    assert window.min_id is None
    window.wrote(b"5-0", 100)
    assert window.min_id == b"5-0"  # one entry holds the whole cap
    window.trimmed(b"4-0")  # an older trim's answer does not clear a newer request
    assert window.min_id == b"5-0"


def test_the_trim_window_stays_small_for_entries_of_one_change_and_keeps_the_cap() -> None:
    window = TrimWindow(10_000)
    for n in range(1, 50_001):
        window.wrote(f"{n}-0".encode(), 1)
    assert len(window._blocks) <= TrimWindow.BLOCKS + 2  # the rounding of a block's size, and the one filling
    assert window.min_id is not None
    kept = 50_000 - int(window.min_id.split(b"-")[0]) + 1  # entries from min_id on, one change each
    assert 10_000 <= kept <= 10_000 + 10_000 // TrimWindow.BLOCKS
