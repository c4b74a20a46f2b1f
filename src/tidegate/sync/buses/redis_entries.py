"""How the Redis bus lays changes out in stream entries, and how it trims a stream by changes.

An entry carries one field:

- `changes`: a JSON array of up to `changes_per_entry` changes of the stream's entity type, in
  publish order, each exactly as `Change.to_json` writes it (joined, not re-encoded), the array
  at most `MAX_ENTRY_BYTES` long unless one change alone is longer (a change is never split);
- `change`: one change's JSON, the form of versions before several-changes entries, still
  written with `changes_per_entry=1`.

Readers take both forms, so a stream written by an older version reads on after an upgrade.

With `format=debezium` (see `debezium.py`) an entry is one Debezium event, the extended form of
Debezium Server's Redis sink: `key` (absent for a truncate, which has no key), `value`, and
tidegate's `tidegate.version` and `tidegate.entity_id`. Streams are not compacted, so a delete
gets no tombstone: the delete event itself says the row is gone.

Stream length counts entries, and an entry now holds one change or many: `MAXLEN ~ max_len`
alone would keep anywhere from `max_len` to `changes_per_entry * max_len` changes. So the
producer remembers how many changes each entry it wrote holds (`TrimWindow`) and trims with
`XTRIM MINID ~` to the oldest entry of its newest `max_len` changes; the XADD's own
`MAXLEN ~ max_len` stays as the bound for entries this producer never wrote (a previous run's,
another producer's), and never drops below `max_len` changes either (an entry holds at least one).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from tidegate.sync.buses.debezium import DebeziumSource, records_of
from tidegate.sync.changes import Change, changes_to_json

__all__ = ["FIELD_KEY", "FIELD_MANY", "FIELD_ONE", "FIELD_VALUE", "MAX_ENTRY_BYTES", "Entry",
           "TrimWindow", "debezium_entries_of", "entries_of"]

FIELD_ONE = b"change"
FIELD_MANY = b"changes"
FIELD_KEY = b"key"
FIELD_VALUE = b"value"
# Far below Redis's limits, and what one read may hand a consumer at once per entry; 100 changes
# of a few hundred bytes each stay well inside it.
MAX_ENTRY_BYTES = 512 * 1024


class Entry(NamedTuple):
    """One stream entry to write."""

    key: str
    fields: dict[bytes, bytes]
    changes: int


def entries_of(changes: Sequence[Change], stream_key: Callable[[str], str],
               changes_per_entry: int) -> list[Entry]:
    """`changes` as stream entries: each stream's changes in publish order, `changes_per_entry`
    (and `MAX_ENTRY_BYTES`) at most an entry."""
    by_key: dict[str, list[bytes]] = {}
    keys: dict[str, str] = {}
    for change in changes:
        key = keys.get(change.entity_type)
        if key is None:
            key = keys[change.entity_type] = stream_key(change.entity_type)
        by_key.setdefault(key, []).append(change.to_json())
    out: list[Entry] = []
    for key, encoded in by_key.items():
        if changes_per_entry == 1:
            out += [Entry(key, {FIELD_ONE: one}, 1) for one in encoded]
            continue
        chunk: list[bytes] = []
        size = 0
        for one in encoded:
            if chunk and (len(chunk) >= changes_per_entry or size + len(one) > MAX_ENTRY_BYTES):
                out.append(Entry(key, {FIELD_MANY: changes_to_json(chunk)}, len(chunk)))
                chunk, size = [], 0
            chunk.append(one)
            size += len(one) + 1
        out.append(Entry(key, {FIELD_MANY: changes_to_json(chunk)}, len(chunk)))
    return out


def debezium_entries_of(changes: Sequence[Change], source: DebeziumSource, *,
                        schemas: bool) -> list[Entry]:
    """`changes` as Debezium events, one an entry, on streams named as Debezium names topics."""
    out: list[Entry] = []
    for change in changes:
        for record in records_of(change, source, schemas=schemas, tombstones=False):
            assert record.value is not None  # no tombstones asked for
            fields = {FIELD_VALUE: record.value, **{name.encode(): value for name, value in record.headers}}
            if record.key is not None:
                fields[FIELD_KEY] = record.key
            out.append(Entry(record.topic, fields, 1))
    return out


@dataclass(slots=True)
class _Block:
    """Consecutive entries of one stream: the first one's id, and the changes they hold."""

    first_id: bytes
    changes: int


class TrimWindow:
    """The entries this producer wrote to one stream, as few of the newest as hold `max_changes`
    changes; `min_id` is where the stream may be trimmed to, once older entries fell out.

    Consecutive entries are kept as blocks of about `max_changes / BLOCKS` changes, each under
    the id of its first entry, so the window holds a few hundred blocks whatever the entries'
    size (one change an entry, from lone transactions, would otherwise mean up to `max_changes`
    ids in memory per stream). Trimming to a block's first id keeps the whole block: the stream
    holds at least `max_changes` changes and at most a block's worth more, on top of the node
    Redis's `~` trims by."""

    BLOCKS = 256

    def __init__(self, max_changes: int) -> None:
        self.max_changes = max_changes
        self._block_changes = max(1, max_changes // self.BLOCKS)
        self._blocks: deque[_Block] = deque()
        self._changes = 0
        self.min_id: bytes | None = None  # to trim to on the next publish; None: nothing new

    def wrote(self, entry_id: bytes, changes: int) -> None:
        """An entry of `changes` changes was written with this id (ids only grow)."""
        blocks = self._blocks
        if blocks and blocks[-1].changes < self._block_changes:
            blocks[-1].changes += changes
        else:
            blocks.append(_Block(entry_id, changes))
        self._changes += changes
        while self._changes - blocks[0].changes >= self.max_changes:
            self._changes -= blocks.popleft().changes
            self.min_id = blocks[0].first_id

    def trimmed(self, min_id: bytes) -> None:
        """The stream was trimmed to `min_id`: nothing to send until the window moves on."""
        if self.min_id == min_id:
            self.min_id = None
