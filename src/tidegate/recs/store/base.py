"""Where the recommender keeps its state: `recs_store_for("memory://" | "redis://host:port/db")`.

Everything a replica needs lives in the store, so any number of `Recommender`s on one Redis serve
the same recommendations: the item catalogue (attributes and unit vectors, with a version counter
and a change log so a replica refreshes its in-process item matrix cheaply), per-user state (the
decayed profile vector, the recent items, the purchased items and their decayed purchase
counts), the co-occurrence neighbour list
of each item, and the trending scores, global and per category. One contract, two backends, one
test suite (tests/test_recs_store_contract.py).

Semantics (the same for memory:// and redis://; the Redis backend does each read-modify-write in
one Lua script, so concurrent writers never lose an update):

- `record_users` applies each user's events in the order given. Per event: the profile decays to
  the event's time and adds `weight · vector` (see `tidegate.recs.score`; an event without a
  vector, for an item the catalogue does not know yet, leaves the profile alone); the profile is
  computed in double precision and kept in 16-bit fixed point with a power-of-two scale, rounded
  once the user's events of the batch are applied (`tidegate.recs.store.profile`: a quarter of
  the bytes of double, each component to within 2^-15 of the largest); each recent
  item `r` other than the event's item, touched within `session_window_s` of it, makes a
  co-occurrence pair of weight `min(weight, r.weight)` at the later of the two times (a log
  weight with the co-occurrence half-life), returned to the caller; then the event's item
  becomes a recent item (its entry takes the event's time and weight when the event is newer,
  the larger weight when it is as old, and stays when it is older) and the recent list keeps the
  `recent_items` newest (among equal times, the entry updated last comes first); a purchase
  records its latest time in the purchased set and log-adds `log_weight(1, time, repeat
  half-life)` to the item's buy-again count. Once the user's events of the batch are applied,
  the purchased set keeps the `max_purchased` newest and the counts the `max_repeat` largest
  (ties, both: the smallest id goes first). The purchased set is meant to be complete (its bound
  far above any real user's distinct purchases, so "exclude purchased" is exact); the counts
  only rank the user's own items, so a trim loses only counts weaker than every kept one. A
  user is new when the store held nothing for them.
- `add_neighbours` and `add_trending` log-add forward-decayed weights (`score.log_add`) to sorted
  lists, then drop the weakest entries past the bound (ties: the smallest id goes first).
- `delete_item` removes the item, its trending entries (global and its categories) and its own
  neighbour list; other items' neighbour lists still name it until they are trimmed, so readers
  skip ids that are not in the catalogue.
- Item versions count catalogue changes; `items_since(v)` returns the changes after version `v`
  (each item once, at its latest state), in pages. A removed item leaves its id in the change
  log, so a replica that was behind learns of the removal.
- `stats().users` counts the new users reported to `note_update`.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from tidegate._lifecycle import Lifecycle
from tidegate._redis import is_redis_url
from tidegate._urls import redact_url
from tidegate.errors import CacheUnavailable, ConfigError
from tidegate.recs.model import Item

__all__ = [
    "ItemChanges",
    "RecentItem",
    "RecsStore",
    "StoreStats",
    "UserEvent",
    "UserOutcome",
    "UserParams",
    "UserState",
    "recs_store_for",
]

@dataclass(frozen=True, slots=True)
class UserParams:
    """How `record_users` updates a user's state."""

    half_life_s: float  # the profile's
    session_window_s: float
    recent_items: int
    max_purchased: int
    # Added after the first release (defaults keep constructions of the earlier fields valid).
    co_occurrence_half_life_s: float | None = None  # the pairs' log weights; None: half_life_s
    repeat_half_life_s: float = 90 * 86_400.0  # the buy-again counts
    max_repeat: int = 1000  # buy-again counts kept per user

    @property
    def pair_half_life_s(self) -> float:
        """The half-life of the co-occurrence pairs' log weights."""
        return self.half_life_s if self.co_occurrence_half_life_s is None else self.co_occurrence_half_life_s


@dataclass(frozen=True, slots=True)
class UserEvent:
    """One interaction as the store applies it: the kind already turned into its weight, the
    item's unit vector looked up (None: the item is not in the catalogue)."""

    item_id: str
    at_s: float  # seconds since the Unix epoch
    weight: float
    purchase: bool
    vector: tuple[float, ...] | None


@dataclass(frozen=True, slots=True)
class RecentItem:
    """An item the user touched lately: when last, and with which kind weight."""

    item_id: str
    at_s: float
    weight: float


@dataclass(frozen=True, slots=True)
class UserState:
    """What the store holds for one user."""

    profile: tuple[float, ...]  # the decayed profile as of `profile_at_s`; () when none
    profile_at_s: float
    recent: tuple[RecentItem, ...]  # newest first
    purchased: Mapping[str, float]  # item id -> time of its last purchase (s)
    # item id -> log2 of its forward-decayed purchase count (`score.log_weight` with the repeat
    # half-life per purchase; `score.decayed` reads it); added later, hence the default
    repeat: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class UserOutcome:
    """What recording one user's events did: whether the user was new, and the co-occurrence
    pairs `(item, other item, log weight)` the events made (to be added in both directions)."""

    new_user: bool
    pairs: tuple[tuple[str, str, float], ...]


@dataclass(frozen=True, slots=True)
class ItemChanges:
    """A page of catalogue changes: each changed item's id and state (None: removed), and the
    version the reader has reached with them; `complete` when no later change remains."""

    version: int
    changes: tuple[tuple[str, Item | None], ...]
    complete: bool


@dataclass(frozen=True, slots=True)
class StoreStats:
    """Counts and times for `Recommender.health()`."""

    items: int
    users: int
    last_update_s: float | None  # when interactions were last recorded (the recorder's clock)
    last_interaction_s: float | None  # the newest interaction time recorded


class RecsStore(Lifecycle):
    """The recommender's state (see the module docstring). Use it as an async context manager (or
    call `open()` and `close()`); a closed store cannot reopen. Backends implement the `_hooks`."""

    unavailable_error = CacheUnavailable
    what = "the recommendation store"

    kind: str = ""

    # ------------------------------------------------------------------ catalogue

    async def put_item(self, item: Item) -> int:
        """Store (or replace) an item, its `vector` being its unit vector; returns the catalogue
        version this change has."""
        self._check_open()
        return await self._put_item(item)

    async def delete_item(self, item_id: str) -> Item | None:
        """Remove an item with its trending entries and its neighbour list; returns what was
        stored (None: nothing, and the version does not move)."""
        self._check_open()
        return await self._delete_item(item_id)

    async def items_version(self) -> int:
        """The catalogue version: how many changes it has had."""
        self._check_open()
        return await self._items_version()

    async def items_since(self, version: int, limit: int = 1000) -> ItemChanges:
        """Up to `limit` items changed after `version`, oldest change first."""
        self._check_open()
        return await self._items_since(version, limit)

    # ------------------------------------------------------------------ users

    async def record_users(
        self, batch: Sequence[tuple[str, Sequence[UserEvent]]], params: UserParams
    ) -> list[UserOutcome]:
        """Apply each user's events (see the module docstring); one outcome per user, in order.
        A user should appear once per batch."""
        self._check_open()
        return await self._record_users(batch, params) if batch else []

    async def user_state(self, user_id: str) -> UserState | None:
        """The user's state (None: the store knows nothing of the user)."""
        self._check_open()
        return await self._user_state(user_id)

    # ------------------------------------------------------------------ co-occurrence

    async def add_neighbours(self, updates: Mapping[str, Mapping[str, float]], max_neighbours: int) -> None:
        """Log-add `updates[item][neighbour]` (forward-decayed log weights) to each item's list,
        keeping its `max_neighbours` strongest."""
        self._check_open()
        if updates:
            await self._add_neighbours(updates, max_neighbours)

    async def neighbours(self, item_ids: Sequence[str], limit: int) -> dict[str, list[tuple[str, float]]]:
        """The `limit` strongest neighbours (id, log weight) of each item, strongest first; items
        without neighbours are left out."""
        self._check_open()
        return await self._neighbours(item_ids, limit) if item_ids else {}

    # ------------------------------------------------------------------ trending

    async def add_trending(self, updates: Mapping[str | None, Mapping[str, float]], max_size: int) -> None:
        """Log-add `updates[scope][item]` (scope None: global, else a category), keeping the
        `max_size` most popular items per scope."""
        self._check_open()
        if updates:
            await self._add_trending(updates, max_size)

    async def trending_top(self, scope: str | None, start: int, count: int) -> list[tuple[str, float]]:
        """Items `start` to `start + count - 1` of the scope by popularity (id, log weight)."""
        self._check_open()
        return await self._trending_top(scope, start, count) if count > 0 else []

    async def trending_scores(self, scope: str | None, item_ids: Sequence[str]) -> list[float | None]:
        """The log popularity of each item in the scope (None: not trending there)."""
        self._check_open()
        return await self._trending_scores(scope, item_ids) if item_ids else []

    # ------------------------------------------------------------------ bookkeeping

    async def note_update(self, *, at_s: float, interaction_at_s: float, new_users: int) -> None:
        """Record that interactions were applied at `at_s`, the newest of them from
        `interaction_at_s`, and that `new_users` users were seen for the first time."""
        self._check_open()
        await self._note_update(at_s, interaction_at_s, new_users)

    async def stats(self) -> StoreStats:
        """Item and user counts, last update and newest interaction times."""
        self._check_open()
        return await self._stats()

    # ------------------------------------------------------------------ hooks

    @abc.abstractmethod
    async def _open(self) -> None: ...

    @abc.abstractmethod
    async def _close(self) -> None: ...

    @abc.abstractmethod
    async def _put_item(self, item: Item) -> int: ...

    @abc.abstractmethod
    async def _delete_item(self, item_id: str) -> Item | None: ...

    @abc.abstractmethod
    async def _items_version(self) -> int: ...

    @abc.abstractmethod
    async def _items_since(self, version: int, limit: int) -> ItemChanges: ...

    @abc.abstractmethod
    async def _record_users(
        self, batch: Sequence[tuple[str, Sequence[UserEvent]]], params: UserParams
    ) -> list[UserOutcome]: ...

    @abc.abstractmethod
    async def _user_state(self, user_id: str) -> UserState | None: ...

    @abc.abstractmethod
    async def _add_neighbours(
        self, updates: Mapping[str, Mapping[str, float]], max_neighbours: int
    ) -> None: ...

    @abc.abstractmethod
    async def _neighbours(
        self, item_ids: Sequence[str], limit: int
    ) -> dict[str, list[tuple[str, float]]]: ...

    @abc.abstractmethod
    async def _add_trending(
        self, updates: Mapping[str | None, Mapping[str, float]], max_size: int
    ) -> None: ...

    @abc.abstractmethod
    async def _trending_top(self, scope: str | None, start: int, count: int) -> list[tuple[str, float]]: ...

    @abc.abstractmethod
    async def _trending_scores(self, scope: str | None, item_ids: Sequence[str]) -> list[float | None]: ...

    @abc.abstractmethod
    async def _note_update(self, at_s: float, interaction_at_s: float, new_users: int) -> None: ...

    @abc.abstractmethod
    async def _stats(self) -> StoreStats: ...


def recs_store_for(url: str, *, prefix: str = "tidegate") -> RecsStore:
    """The recommendation store for `url`, not yet opened (use it with `async with`).

    - `memory://`: a store of its own in this process (each call makes a separate one);
    - `redis://host:port/db` (also `rediss://`, `unix://`, or `redis+cluster://host:port` for a
      Redis Cluster): shared by every process using the same Redis and `prefix`; needs
      `pip install 'tidegate[redis]'`."""
    scheme = urlsplit(url).scheme
    if scheme == "memory":
        from tidegate.recs.store.memory import MemoryRecsStore

        return MemoryRecsStore()
    if is_redis_url(url):
        from tidegate.recs.store.redis import RedisRecsStore

        return RedisRecsStore(url, prefix=prefix)
    raise ConfigError(
        f"unsupported recommendation store URL {redact_url(url)!r}: use memory:// or redis://host:port/db"
    )
