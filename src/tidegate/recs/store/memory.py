"""memory:// recommendation store: state in this process (the embedded default).

No operation awaits in between, so each is atomic in the event loop. Values are copied in and out
(tuples, frozen dataclasses), so callers never share mutable state with the store. `UserRecord`
is also the plain-Python statement of what lua/record.lua does for the Redis store.

Per-user state is kept packed: one `bytes` value per user (`pack_user`), its item ids as 32-bit
codes of an index the store shares across users (`ItemCodes`). A user holding a 64-dimension
profile and 7 recent items takes about 0.5 KB that way, against 3.6 KB as a `UserRecord` of Python
floats and small objects; and since neither `bytes` nor a dict of strings to `bytes` is a
container the garbage collector tracks, a million users add nothing to the walk of a full
collection. A batch unpacks each of its users into a `UserRecord`, applies the events and packs it
again (a few microseconds per user).
"""

from __future__ import annotations

import heapq
import struct
from array import array
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from operator import itemgetter
from typing import NamedTuple

from tidegate.recs.model import Item
from tidegate.recs.score import decay_factor, log_add, log_weight
from tidegate.recs.store.base import (
    ItemChanges,
    RecentItem,
    RecsStore,
    StoreStats,
    UserEvent,
    UserOutcome,
    UserParams,
    UserState,
)

__all__ = ["BoundedScores", "ItemCodes", "MemoryRecsStore", "UserRecord", "pack_user", "unpack_user"]

_BY_SCORE_THEN_ID = itemgetter(1, 0)


class BoundedScores:
    """A sorted set of log weights that only grow, bounded by dropping the weakest.

    Scores only ever increase (log-adds of positive weights), so a min-heap with lazy deletion
    finds the weakest entry in O(log n): an entry whose score is no longer current is stale and
    skipped. The heap is built the first time the set outgrows its bound: a set that never does
    (most neighbour lists of a large catalogue) pays nothing for it."""

    def __init__(self) -> None:
        self.scores: dict[str, float] = {}
        self._heap: list[tuple[float, str]] | None = None  # None: not kept yet
        self._ranked: list[tuple[str, float]] | None = None
        self._head: list[tuple[str, float]] = []  # a prefix of the ranking, when _ranked is None

    def __len__(self) -> int:
        return len(self.scores)

    def add(self, member: str, log_value: float) -> None:
        self.add_all(((member, log_value),))

    def add_all(self, adds: Iterable[tuple[str, float]]) -> None:
        """`add` each (member, log value), in order."""
        scores, heap = self.scores, self._heap
        for member, log_value in adds:
            current = scores.get(member)
            score = log_value if current is None else log_add(current, log_value)
            scores[member] = score
            if heap is not None:
                heapq.heappush(heap, (score, member))
        self._changed()
        if heap is not None and len(heap) > 2 * len(scores) + 64:
            self._heap = None  # rebuilt from the scores when next needed

    def trim(self, max_size: int) -> None:
        """Drop the weakest entries past `max_size` (ties: the smallest id first, as Redis does)."""
        scores = self.scores
        if len(scores) <= max_size:
            return
        heap = self._heap
        if heap is None:
            heap = self._heap = [(s, m) for m, s in scores.items()]
            heapq.heapify(heap)
        while len(scores) > max_size:
            score, member = heapq.heappop(heap)
            if scores.get(member) == score:
                del scores[member]
        self._changed()

    def remove(self, member: str) -> None:
        if self.scores.pop(member, None) is not None:
            self._changed()  # its heap entries are now stale

    def _changed(self) -> None:
        self._ranked = None
        self._head = []

    def ranked(self) -> list[tuple[str, float]]:
        """Strongest first; equal scores in descending id order (as ZREVRANGE)."""
        if self._ranked is None:
            self._ranked = sorted(self.scores.items(), key=_BY_SCORE_THEN_ID, reverse=True)
        return self._ranked

    def top(self, start: int, count: int) -> list[tuple[str, float]]:
        """`ranked()[start:start + count]`. A list written to between reads (trending, under a
        stream of interactions) would be sorted whole for every read; its head alone is a
        partial selection, several times cheaper on a list of thousands."""
        end = start + count
        if self._ranked is not None or 4 * end >= len(self.scores):
            return self.ranked()[start:end]
        if len(self._head) < end:
            self._head = heapq.nlargest(end, self.scores.items(), key=_BY_SCORE_THEN_ID)
        return self._head[start:end]


class _Entry(NamedTuple):
    """A recent item inside a `UserRecord` (a tuple: cheaper to make than a `RecentItem`)."""

    item_id: str
    at_s: float
    weight: float


@dataclass(slots=True)
class UserRecord:
    """One user's state and the rules that update it (see `tidegate.recs.store.base`)."""

    profile: list[float] = field(default_factory=list)
    profile_at_s: float = 0.0
    recent: list[_Entry] = field(default_factory=list)  # newest first
    purchased: dict[str, float] = field(default_factory=dict)
    repeat: dict[str, float] = field(default_factory=dict)  # item id -> log2 decayed purchase count

    def apply(self, event: UserEvent, params: UserParams) -> list[tuple[str, str, float]]:
        """Apply one event; returns the co-occurrence pairs it made."""
        self._add_to_profile(event, params.half_life_s)
        pairs = []
        for entry in self.recent:
            if entry.item_id != event.item_id and abs(event.at_s - entry.at_s) <= params.session_window_s:
                weight = min(event.weight, entry.weight)
                if weight > 0:
                    at_s = max(event.at_s, entry.at_s)
                    pairs.append((event.item_id, entry.item_id,
                                  log_weight(weight, at_s, params.pair_half_life_s)))
        self._touch(event)
        del self.recent[params.recent_items:]
        if event.purchase:
            self.purchased[event.item_id] = max(event.at_s, self.purchased.get(event.item_id, event.at_s))
            value = log_weight(1.0, event.at_s, params.repeat_half_life_s)
            held = self.repeat.get(event.item_id)
            self.repeat[event.item_id] = value if held is None else log_add(held, value)
        return pairs

    def trim(self, params: UserParams) -> None:
        """The bounds of the purchased set and the buy-again counts, once per batch."""
        self.trim_purchased(params.max_purchased)
        excess = len(self.repeat) - params.max_repeat
        if excess > 0:
            # The weakest counts go (ties: the smallest id first, as Redis does).
            for item_id, _ in heapq.nsmallest(excess, self.repeat.items(), key=_BY_SCORE_THEN_ID):
                del self.repeat[item_id]

    def trim_purchased(self, max_purchased: int) -> None:
        """Forget the oldest purchases past the bound (ties: the smallest id first, as Redis
        does); done once per batch, after its events."""
        excess = len(self.purchased) - max_purchased
        if excess > 0:
            for item_id, _ in sorted(self.purchased.items(), key=lambda kv: (kv[1], kv[0]))[:excess]:
                del self.purchased[item_id]

    def _add_to_profile(self, event: UserEvent, half_life_s: float) -> None:
        if event.vector is None:
            return
        if not self.profile:
            self.profile = [event.weight * x for x in event.vector]
            self.profile_at_s = event.at_s
        elif event.at_s >= self.profile_at_s:
            factor = decay_factor(event.at_s - self.profile_at_s, half_life_s)
            self.profile = [
                s * factor + event.weight * x for s, x in zip(self.profile, event.vector, strict=True)
            ]
            self.profile_at_s = event.at_s
        else:
            weight = event.weight * decay_factor(self.profile_at_s - event.at_s, half_life_s)
            self.profile = [s + weight * x for s, x in zip(self.profile, event.vector, strict=True)]

    def _touch(self, event: UserEvent) -> None:
        """Make the event's item a recent item. The list stays newest first; among equal times the
        entry updated last comes first."""
        at_s, weight = event.at_s, event.weight
        for index, entry in enumerate(self.recent):
            if entry.item_id == event.item_id:
                if at_s < entry.at_s:
                    return  # an older event: the entry stays as it is
                if at_s == entry.at_s:
                    weight = max(weight, entry.weight)
                del self.recent[index]
                break
        position = 0
        while position < len(self.recent) and self.recent[position].at_s > at_s:
            position += 1
        self.recent.insert(position, _Entry(event.item_id, at_s, weight))

    def state(self) -> UserState:
        return UserState(
            tuple(self.profile), self.profile_at_s, tuple(RecentItem(*entry) for entry in self.recent),
            dict(self.purchased),
            dict(self.repeat),
        )


class ItemCodes:
    """Item ids as small integers, for packed per-user state: each id seen gets the next code and
    keeps it (a removed item's code stays; codes grow with the ids ever seen, not with users)."""

    def __init__(self) -> None:
        self._codes: dict[str, int] = {}
        self._ids: list[str] = []

    def __len__(self) -> int:
        return len(self._ids)

    def code(self, item_id: str) -> int:
        found = self._codes.get(item_id)
        if found is None:
            found = self._codes[item_id] = len(self._ids)
            self._ids.append(item_id)
        return found

    def item_id(self, code: int) -> str:
        return self._ids[code]


# profile time, then how many profile components, recent items, purchases and buy-again counts
_HEADER = struct.Struct("<dIIII")


def pack_user(record: UserRecord, codes: ItemCodes) -> bytes:
    """A user's record as one `bytes`: the header, then arrays of float32 profile components
    (rounded to nearest, as the Redis store keeps them), recent items (codes, times, weights),
    purchases (codes, times) and buy-again counts (codes, log2 counts), these kept exactly."""
    recent, purchased, repeat = record.recent, record.purchased, record.repeat
    parts = [
        _HEADER.pack(record.profile_at_s, len(record.profile), len(recent), len(purchased), len(repeat)),
        array("f", record.profile).tobytes(),
        array("i", [codes.code(entry.item_id) for entry in recent]).tobytes(),
        array("d", [entry.at_s for entry in recent]).tobytes(),
        array("d", [entry.weight for entry in recent]).tobytes(),
        array("i", [codes.code(item_id) for item_id in purchased]).tobytes(),
        array("d", purchased.values()).tobytes(),
        array("i", [codes.code(item_id) for item_id in repeat]).tobytes(),
        array("d", repeat.values()).tobytes(),
    ]
    return b"".join(parts)


def unpack_user(blob: bytes, codes: ItemCodes) -> UserRecord:
    """The record `pack_user` packed."""
    profile_at_s, dimension, n_recent, n_purchased, n_repeat = _HEADER.unpack_from(blob)
    view = memoryview(blob)
    offset = _HEADER.size

    def floats(count: int, typecode: str = "d") -> array[float]:
        nonlocal offset
        values: array[float] = array(typecode)  # "d" or "f"
        values.frombytes(view[offset:offset + values.itemsize * count])
        offset += values.itemsize * count
        return values

    def ints(count: int) -> array[int]:
        nonlocal offset
        values = array("i")
        values.frombytes(view[offset:offset + values.itemsize * count])
        offset += values.itemsize * count
        return values

    profile = floats(dimension, "f").tolist()
    recent_codes, recent_at, recent_weight = ints(n_recent), floats(n_recent), floats(n_recent)
    bought_codes, bought_at = ints(n_purchased), floats(n_purchased)
    again_codes, again_value = ints(n_repeat), floats(n_repeat)
    item_id = codes.item_id
    return UserRecord(
        profile,
        profile_at_s,
        [_Entry(item_id(c), at, w) for c, at, w in zip(recent_codes, recent_at, recent_weight, strict=True)],
        {item_id(c): at for c, at in zip(bought_codes, bought_at, strict=True)},
        {item_id(c): v for c, v in zip(again_codes, again_value, strict=True)},
    )


class MemoryRecsStore(RecsStore):
    """`recs_store_for("memory://")`: the state of one process."""

    kind = "memory"

    def __init__(self) -> None:
        super().__init__()
        self._items: dict[str, Item] = {}
        self._item_versions: dict[str, int] = {}  # item id -> version of its last change
        self._version = 0
        self._users: dict[str, bytes] = {}  # user id -> pack_user(record)
        self._codes = ItemCodes()
        self._neighbour_lists: dict[str, BoundedScores] = {}
        self._trending_lists: dict[str | None, BoundedScores] = {}
        self._users_seen = 0  # counted by note_update, as the Redis store counts them
        self._last_update_s: float | None = None
        self._last_interaction_s: float | None = None

    async def _open(self) -> None:
        pass

    async def _close(self) -> None:
        pass

    # ------------------------------------------------------------------ catalogue

    def _bump(self, item_id: str) -> int:
        self._version += 1
        # Re-inserting keeps the dict in change order, so items_since reads it from the end.
        self._item_versions.pop(item_id, None)
        self._item_versions[item_id] = self._version
        return self._version

    async def _put_item(self, item: Item) -> int:
        self._items[item.item_id] = item
        return self._bump(item.item_id)

    async def _delete_item(self, item_id: str) -> Item | None:
        item = self._items.pop(item_id, None)
        if item is None:
            return None
        self._bump(item_id)
        for scope in (None, *item.categories):
            scores = self._trending_lists.get(scope)
            if scores is not None:
                scores.remove(item_id)
        self._neighbour_lists.pop(item_id, None)
        return item

    async def _items_version(self) -> int:
        return self._version

    async def _items_since(self, version: int, limit: int) -> ItemChanges:
        changed: list[tuple[str, int]] = []
        for item_id in reversed(self._item_versions):
            item_version = self._item_versions[item_id]
            if item_version <= version:
                break
            changed.append((item_id, item_version))
        changed.reverse()
        page = changed[:limit]
        complete = len(changed) <= limit
        reached = self._version if complete else page[-1][1]
        changes = tuple((item_id, self._items.get(item_id)) for item_id, _ in page)
        return ItemChanges(reached, changes, complete)

    # ------------------------------------------------------------------ users

    async def _record_users(
        self, batch: Sequence[tuple[str, Sequence[UserEvent]]], params: UserParams
    ) -> list[UserOutcome]:
        outcomes = []
        for user_id, events in batch:
            blob = self._users.get(user_id)
            record = UserRecord() if blob is None else unpack_user(blob, self._codes)
            pairs = [pair for event in events for pair in record.apply(event, params)]
            record.trim(params)
            self._users[user_id] = pack_user(record, self._codes)
            outcomes.append(UserOutcome(blob is None, tuple(pairs)))
        return outcomes

    async def _user_state(self, user_id: str) -> UserState | None:
        blob = self._users.get(user_id)
        return None if blob is None else unpack_user(blob, self._codes).state()

    # ------------------------------------------------------------------ co-occurrence

    async def _add_neighbours(self, updates: Mapping[str, Mapping[str, float]], max_neighbours: int) -> None:
        for item_id, adds in updates.items():
            scores = self._neighbour_lists.get(item_id)
            if scores is None:
                scores = self._neighbour_lists[item_id] = BoundedScores()
            scores.add_all(adds.items())
            scores.trim(max_neighbours)

    async def _neighbours(self, item_ids: Sequence[str], limit: int) -> dict[str, list[tuple[str, float]]]:
        found = {}
        for item_id in item_ids:
            scores = self._neighbour_lists.get(item_id)
            if scores:
                found[item_id] = scores.top(0, limit)
        return found

    # ------------------------------------------------------------------ trending

    async def _add_trending(self, updates: Mapping[str | None, Mapping[str, float]], max_size: int) -> None:
        for scope, adds in updates.items():
            scores = self._trending_lists.get(scope)
            if scores is None:
                scores = self._trending_lists[scope] = BoundedScores()
            scores.add_all(adds.items())
            scores.trim(max_size)

    async def _trending_top(self, scope: str | None, start: int, count: int) -> list[tuple[str, float]]:
        scores = self._trending_lists.get(scope)
        return [] if scores is None else scores.top(start, count)

    async def _trending_scores(self, scope: str | None, item_ids: Sequence[str]) -> list[float | None]:
        scores = self._trending_lists.get(scope)
        return [None if scores is None else scores.scores.get(item_id) for item_id in item_ids]

    # ------------------------------------------------------------------ bookkeeping

    async def _note_update(self, at_s: float, interaction_at_s: float, new_users: int) -> None:
        self._users_seen += new_users
        self._last_update_s = at_s if self._last_update_s is None else max(at_s, self._last_update_s)
        if self._last_interaction_s is None or interaction_at_s > self._last_interaction_s:
            self._last_interaction_s = interaction_at_s

    async def _stats(self) -> StoreStats:
        return StoreStats(len(self._items), self._users_seen, self._last_update_s, self._last_interaction_s)
