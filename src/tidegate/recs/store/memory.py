"""memory:// recommendation store: state in this process (the embedded default).

No operation awaits in between, so each is atomic in the event loop. Values are copied in and out
(tuples, frozen dataclasses), so callers never share mutable state with the store. `UserRecord`
is also the plain-Python statement of what lua/record.lua does for the Redis store.

Per-user state is kept packed: one `bytes` value per user (`pack_user`), its item ids as 32-bit
codes of an index the store shares across users (`ItemCodes`). A user holding a 64-dimension
profile and 7 recent items takes about 0.4 KB that way, against 3.6 KB as a `UserRecord` of Python
floats and small objects; and since neither `bytes` nor a dict of strings to `bytes` is a
container the garbage collector tracks, a million users add nothing to the walk of a full
collection. A batch unpacks each of its users into a `UserRecord`, applies the events and packs it
again (a few microseconds per user).
"""

from __future__ import annotations

import functools
import heapq
import math
import struct
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from operator import itemgetter

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
from tidegate.recs.store.profile import pack_profile, unpack_profile

__all__ = ["BoundedScores", "ItemCodes", "MemoryRecsStore", "UserRecord", "pack_user", "unpack_user"]

_BY_SCORE_THEN_ID = itemgetter(1, 0)
_LN2 = math.log(2.0)


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
        # Members added to since `_head` was taken: the head is brought up to date from them
        # (scores only grow, so no other member can have entered it).
        self._touched: set[str] = set()

    def __len__(self) -> int:
        return len(self.scores)

    def add(self, member: str, log_value: float) -> None:
        self.add_all(((member, log_value),))

    def add_all(self, adds: Collection[tuple[str, float]]) -> None:
        """`add` each (member, log value), in order."""
        scores, heap = self.scores, self._heap
        get = scores.get
        for member, log_value in adds:
            current = get(member)
            if current is not None:  # score.log_add, inlined: this runs for every pair of a batch
                if current < log_value:
                    current, log_value = log_value, current
                log_value = current + math.log1p(2.0 ** (log_value - current)) / _LN2
            scores[member] = log_value
            if heap is not None:
                heapq.heappush(heap, (log_value, member))
        self._ranked = None
        if self._head:
            self._touched.update(member for member, _ in adds)
        if heap is not None and len(heap) > 2 * len(scores) + 64:
            self._heap = None  # rebuilt from the scores when next needed

    def update(self, adds: Collection[tuple[str, float]], max_size: int) -> None:
        """`add_all`, then `trim`."""
        self.add_all(adds)
        if len(self.scores) > max_size:
            self.trim(max_size)

    def trim(self, max_size: int) -> None:
        """Drop the weakest entries past `max_size` (ties: the smallest id first, as Redis does)."""
        scores = self.scores
        if len(scores) <= max_size:
            return
        heap = self._heap
        if heap is None:
            heap = self._heap = [(s, m) for m, s in scores.items()]
            heapq.heapify(heap)
        head = {member for member, _ in self._head}
        kept_head = True
        while len(scores) > max_size:
            score, member = heapq.heappop(heap)
            if scores.get(member) == score:
                del scores[member]
                kept_head = kept_head and member not in head
        self._ranked = None
        if not kept_head:
            self._changed()

    def remove(self, member: str) -> None:
        if self.scores.pop(member, None) is not None:
            self._changed()  # its heap entries are now stale

    def _changed(self) -> None:
        self._ranked = None
        self._head = []
        self._touched = set()

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
        scores = self.scores
        if len(self._head) < end:
            self._head = heapq.nlargest(end, scores.items(), key=_BY_SCORE_THEN_ID)
            self._touched = set()
        elif self._touched:
            # Every member outside the old head and untouched since ranks below all of it still.
            candidates = {member for member, _ in self._head} | self._touched
            self._head = heapq.nlargest(len(self._head), ((m, scores[m]) for m in candidates if m in scores),
                                        key=_BY_SCORE_THEN_ID)
            self._touched = set()
        return self._head[start:end]


@dataclass(slots=True)
class UserRecord:
    """One user's state and the rules that update it (see `tidegate.recs.store.base`)."""

    profile: list[float] = field(default_factory=list)
    profile_at_s: float = 0.0
    recent: list[tuple[str, float, float]] = field(default_factory=list)  # (id, time, weight), newest first
    purchased: dict[str, float] = field(default_factory=dict)
    repeat: dict[str, float] = field(default_factory=dict)  # item id -> log2 decayed purchase count

    def apply(self, event: UserEvent, params: UserParams) -> list[tuple[str, str, float]]:
        """Apply one event; returns the co-occurrence pairs it made."""
        self._add_to_profile(event, params.half_life_s)
        pairs = []
        item_id, at_s, weight = event.item_id, event.at_s, event.weight
        window_s, half_life_s = params.session_window_s, params.pair_half_life_s
        # Recent entries are plain (item id, time, weight) tuples: unpacking them is cheaper than
        # attribute access, and this loop runs for every recent item of every event.
        for other, other_at_s, other_weight in self.recent:
            if other != item_id and abs(at_s - other_at_s) <= window_s:
                pair_weight = other_weight if other_weight < weight else weight
                if pair_weight > 0:
                    pairs.append((item_id, other, log_weight(
                        pair_weight, other_at_s if other_at_s > at_s else at_s, half_life_s)))
        self._touch(event)
        del self.recent[params.recent_items:]
        if event.purchase:
            self.purchased[item_id] = max(at_s, self.purchased.get(item_id, at_s))
            value = log_weight(1.0, at_s, params.repeat_half_life_s)
            held = self.repeat.get(item_id)
            self.repeat[item_id] = value if held is None else log_add(held, value)
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
        vector, weight = event.vector, event.weight
        if vector is None:
            return
        if not self.profile:
            self.profile = [weight * x for x in vector]
            self.profile_at_s = event.at_s
        elif event.at_s >= self.profile_at_s:
            factor = decay_factor(event.at_s - self.profile_at_s, half_life_s)
            self.profile = [s * factor + weight * x for s, x in zip(self.profile, vector, strict=True)]
            self.profile_at_s = event.at_s
        else:
            weight *= decay_factor(self.profile_at_s - event.at_s, half_life_s)
            self.profile = [s + weight * x for s, x in zip(self.profile, vector, strict=True)]

    def _touch(self, event: UserEvent) -> None:
        """Make the event's item a recent item. The list stays newest first; among equal times the
        entry updated last comes first."""
        item_id, at_s, weight = event.item_id, event.at_s, event.weight
        recent = self.recent
        for index, (other, other_at_s, other_weight) in enumerate(recent):
            if other == item_id:
                if at_s < other_at_s:
                    return  # an older event: the entry stays as it is
                if at_s == other_at_s:
                    weight = max(weight, other_weight)
                del recent[index]
                break
        position = 0
        while position < len(recent) and recent[position][1] > at_s:
            position += 1
        recent.insert(position, (item_id, at_s, weight))

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
        self.ids: list[str] = []  # code -> item id

    def __len__(self) -> int:
        return len(self.ids)

    def code(self, item_id: str) -> int:
        found = self._codes.get(item_id)
        if found is None:
            found = self._codes[item_id] = len(self.ids)
            self.ids.append(item_id)
        return found


# profile time, how many profile components and their exponent (tidegate.recs.store.profile), then
# how many recent items, purchases and buy-again counts
_HEADER = struct.Struct("<dIiIII")


@functools.lru_cache(maxsize=1024)
def _lists_layout(recent: int, purchased: int, repeat: int) -> struct.Struct:
    """What follows the profile: recent items (codes, times, weights), purchases (codes, times),
    buy-again counts (codes, log2 counts). One precompiled struct per shape: a user's lists are
    packed and unpacked in one call each, which was most of a batch's cost per user."""
    return struct.Struct(f"<{recent}i{recent}d{recent}d{purchased}i{purchased}d{repeat}i{repeat}d")


def pack_user(record: UserRecord, codes: ItemCodes) -> bytes:
    """A user's record as one `bytes`: the header, then the profile in 16-bit fixed point (rounded
    as the Redis store rounds it, see tidegate.recs.store.profile), recent items (codes, times,
    weights), purchases (codes, times) and buy-again counts (codes, log2 counts), these kept
    exactly."""
    recent, purchased, repeat = record.recent, record.purchased, record.repeat
    code = codes.code
    ids, times, weights = zip(*recent, strict=True) if recent else ((), (), ())
    exponent, profile = pack_profile(record.profile)
    return b"".join((
        _HEADER.pack(record.profile_at_s, len(record.profile), exponent, len(recent), len(purchased),
                     len(repeat)),
        profile,
        _lists_layout(len(recent), len(purchased), len(repeat)).pack(
            *map(code, ids), *times, *weights, *map(code, purchased), *purchased.values(),
            *map(code, repeat), *repeat.values(),
        ),
    ))


def unpack_user(blob: bytes, codes: ItemCodes) -> UserRecord:
    """The record `pack_user` packed."""
    profile_at_s, dimension, exponent, n_recent, n_purchased, n_repeat = _HEADER.unpack_from(blob)
    profile = unpack_profile(blob, _HEADER.size, dimension, exponent)
    start = _HEADER.size + 2 * dimension
    values = _lists_layout(n_recent, n_purchased, n_repeat).unpack_from(blob, start)
    ids = codes.ids
    bought = 3 * n_recent
    again = bought + 2 * n_purchased
    return UserRecord(
        profile,
        profile_at_s,
        list(zip([ids[c] for c in values[:n_recent]], values[n_recent:2 * n_recent],
                 values[2 * n_recent:bought], strict=True)),
        dict(zip([ids[c] for c in values[bought:bought + n_purchased]],
                 values[bought + n_purchased:again], strict=True)),
        dict(zip([ids[c] for c in values[again:again + n_repeat]], values[again + n_repeat:], strict=True)),
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
            scores.update(adds.items(), max_neighbours)

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
            scores.update(adds.items(), max_size)

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
