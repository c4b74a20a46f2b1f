"""redis:// recommendation store: state shared by every replica; each read-modify-write is one Lua
script (lua/*.lua, each documenting its KEYS and ARGV).

Keys, each carrying the `{hash tag}` of the unit it belongs to, so every script runs within one
Redis Cluster slot:

- `{<prefix>:recs:items}:data|log|version`: the catalogue (item id → msgpack item), its change
  log (item id → version of its last change) and version counter;
- `{<prefix>:recs:user:<user id>}:state`: a user's profile (16-bit fixed point components, see
  tidegate.recs.store.profile), recent items, purchased items and their buy-again counts, one
  packed string (see lua/record.lua); `…:bought|again` are the sorted sets of purchases and
  counts of an earlier layout, read and deleted by the user's next write;
- `{<prefix>:recs:item:<item id>}:neighbours`: an item's co-occurrence list (sorted by log weight,
  bounded);
- `{<prefix>:recs:trending}:all` and `…:category:<name>`: trending lists (sorted by log weight,
  bounded), one tag so that one script updates them all;
- `{<prefix>:recs}:meta`: user count and update times;
- `{<prefix>:recs}:formats`: the store's format (see tidegate._formats and `redis_store`).

On a Redis Cluster (`redis+cluster://`) the units spread over the shards. A batch that touches
many units (users, items' neighbours) is one pipeline: on a cluster one per node at once, each
script in it sent as EVALSHA (`RedisClient.pipelined`).

An item is stored as msgpack `[id, name, categories, price, stock, vector]`, the vector as
little-endian float32 bytes; its description is not kept (it only served to hash its vector).
"""

from __future__ import annotations

import struct
from collections.abc import Awaitable, Mapping, Sequence
from typing import Any, TypeVar

import numpy as np

from tidegate._formats import FormatCheck, RedisStore, StoreFormat
from tidegate._redis import RedisClient, driver_errors, is_cluster_url, lua_source
from tidegate._urls import redact_url
from tidegate.errors import CacheUnavailable, ConfigError, MissingDependency
from tidegate.recs.model import Item
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
from tidegate.recs.store.profile import unpack_profile

try:
    import msgpack
    import redis
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise MissingDependency(
        "the Redis recommendation store needs redis-py and msgpack: pip install 'tidegate[redis]'"
    ) from exc

__all__ = ["REDIS_FORMAT", "RedisRecsStore", "redis_store"]

# The store's format (see tidegate._formats). Format 1 is 0.1.0's layout, now recorded (the
# per-user sorted sets of an earlier layout are still read and removed by a user's next write).
REDIS_FORMAT = StoreFormat.initial("recs")


def redis_store(prefix: str) -> RedisStore:
    """Where the recommendation store under `prefix` keeps its format: the field "recs" of the
    hash `{<prefix>:recs}:formats`. A store with data has its catalogue or its meta hash."""
    return RedisStore(REDIS_FORMAT, f"{{{prefix}:recs}}:formats",
                      (f"{{{prefix}:recs:items}}:data", f"{{{prefix}:recs}}:meta"))


_SCRIPTS = ("item_put", "item_delete", "items_since", "record", "log_add", "note")
SCRIPT_CHUNK = 5000  # additions per log_add call
NEIGHBOUR_LISTS_PER_CALL = 200  # co-occurrence lists updated by one log_add call (one server)
USERS_PER_CALL = 50  # users recorded by one record call (one server)
NO_BOUND = 2**53  # a bound no list reaches
T = TypeVar("T")


class RedisRecsStore(RecsStore):
    """`recs_store_for("redis://host:6379/0")`; any number of processes may share one store."""

    kind = "redis"

    def __init__(self, url: str, *, prefix: str = "tidegate", max_connections: int = 64) -> None:
        super().__init__()
        if not prefix or "{" in prefix or "}" in prefix:
            raise ConfigError(
                f"a recommendation store prefix must be non-empty and without braces, not {prefix!r}"
            )
        self.url = url
        self._cluster = is_cluster_url(url)
        self.prefix = prefix
        self._max_connections = max_connections
        items = f"{{{prefix}:recs:items}}"
        self._item_keys = [f"{items}:data", f"{items}:log", f"{items}:version"]
        self._trending_tag = f"{{{prefix}:recs:trending}}"
        self._meta_key = f"{{{prefix}:recs}}:meta"
        self._format = FormatCheck(redis_store(prefix))
        self._client: RedisClient | None = None
        self._redis: Any = None
        self._scripts: dict[str, Any] = {}

    # ------------------------------------------------------------------ plumbing

    async def _open(self) -> None:
        client = RedisClient(
            self.url, what="the recommendation store", unavailable=CacheUnavailable,
            max_connections=self._max_connections,
            scripts={name: lua_source("tidegate.recs.store", name) for name in _SCRIPTS})
        await client.ping()
        try:
            await self._format.ready(client)  # refuses a newer store before anything reads it
        except BaseException:
            await client.aclose()
            raise
        self._client, self._redis, self._scripts = client, client.client, client.scripts

    async def _close(self) -> None:
        if self._redis is not None:
            await self._redis.aclose()

    async def _guard(self, call: Awaitable[T]) -> T:
        """Await a Redis call, translating driver errors (the URL without credentials)."""
        try:
            return await call
        except driver_errors() as exc:
            raise CacheUnavailable(f"recommendation store at {redact_url(self.url)}: {exc}") from exc

    def _script_command(self, name: str, keys: list[str], args: list[Any]) -> tuple[Any, ...]:
        assert self._client is not None
        return self._client.script_command(name, keys, args)

    async def _pipelined(self, calls: list[tuple[Any, ...]]) -> list[Any]:
        """`calls` in one pipeline (see RedisClient.pipelined), driver errors translated."""
        assert self._client is not None
        return await self._guard(self._client.pipelined(calls))

    def _user_keys(self, user_id: str) -> list[str]:
        tag = f"{{{self.prefix}:recs:user:{user_id}}}"
        return [f"{tag}:state", f"{tag}:bought", f"{tag}:again"]

    def _neighbours_key(self, item_id: str) -> str:
        return f"{{{self.prefix}:recs:item:{item_id}}}:neighbours"

    def _trending_key(self, scope: str | None) -> str:
        return f"{self._trending_tag}:all" if scope is None else f"{self._trending_tag}:category:{scope}"

    # ------------------------------------------------------------------ catalogue

    async def _put_item(self, item: Item) -> int:
        version = await self._guard(
            self._scripts["item_put"](keys=self._item_keys, args=[item.item_id, _pack_item(item)])
        )
        return int(version)

    async def _delete_item(self, item_id: str) -> Item | None:
        held = await self._guard(self._scripts["item_delete"](keys=self._item_keys, args=[item_id]))
        if not held:
            return None
        item = _unpack_item(held)
        async with self._redis.pipeline(transaction=False) as pipe:
            for scope in (None, *item.categories):
                pipe.zrem(self._trending_key(scope), item_id)
            pipe.delete(self._neighbours_key(item_id))
            await self._guard(pipe.execute())
        return item

    async def _items_version(self) -> int:
        return int(await self._guard(self._redis.get(self._item_keys[2])) or 0)

    async def _items_since(self, version: int, limit: int) -> ItemChanges:
        flat = await self._guard(self._scripts["items_since"](keys=self._item_keys, args=[version, limit]))
        current, rest = int(flat[0]), flat[1:]
        changes = tuple(
            (rest[i].decode(), _unpack_item(rest[i + 2]) if rest[i + 2] else None)
            for i in range(0, len(rest), 3)
        )
        if len(changes) < limit:
            return ItemChanges(current, changes, True)
        return ItemChanges(int(rest[-2]), changes, False)

    # ------------------------------------------------------------------ users

    async def _record_users(
        self, batch: Sequence[tuple[str, Sequence[UserEvent]]], params: UserParams
    ) -> list[UserOutcome]:
        head = [
            repr(params.half_life_s), repr(params.session_window_s), params.recent_items,
            params.max_purchased,
            repr(params.pair_half_life_s), repr(params.repeat_half_life_s), params.max_repeat,
        ]
        packed: dict[tuple[float, ...], bytes] = {}
        users: list[tuple[list[str], bytes]] = []
        for user_id, events in batch:
            flat: list[Any] = []
            for event in events:
                vector = b""
                if event.vector is not None:
                    vector = packed.get(event.vector) or packed.setdefault(
                        event.vector, np.asarray(event.vector, dtype="<f4").tobytes()
                    )
                flat += [event.item_id, float(event.at_s), float(event.weight), event.purchase, vector]
            # Lua's cmsgpack reads no bin type
            users.append((self._user_keys(user_id), msgpack.packb(flat, use_bin_type=False)))
        # Several users a script call on one server, as for the neighbour lists (see there).
        per_call = 1 if self._cluster else USERS_PER_CALL
        calls = []
        for start in range(0, len(users), per_call):
            chunk = users[start:start + per_call]
            keys = [key for user_keys, _ in chunk for key in user_keys]
            calls.append(self._script_command("record", keys, [*head, *(events for _, events in chunk)]))
        outcomes = []
        for replies in await self._pipelined(calls):
            for reply in replies:
                pairs = tuple(
                    (reply[i].decode(), reply[i + 1].decode(), float(reply[i + 2]))
                    for i in range(1, len(reply), 3)
                )
                outcomes.append(UserOutcome(bool(reply[0]), pairs))
        return outcomes

    async def _user_state(self, user_id: str) -> UserState | None:
        state_key, bought_key, again_key = self._user_keys(user_id)
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.get(state_key)
            pipe.zrange(bought_key, 0, -1, withscores=True)
            pipe.zrange(again_key, 0, -1, withscores=True)
            packed, bought, again = await self._guard(pipe.execute(raise_on_error=False))
        purchased: dict[str, float]
        repeat: dict[str, float]
        if isinstance(packed, Exception):  # the earliest layout (lua/record.lua), or a failure
            profile, flat = await self._earlier_state(state_key, packed)
            purchased, repeat = _from_scores(bought), _from_scores(again)
        elif packed is None:
            return None
        else:
            profile, flat, folded = _unpack_state(packed)
            if folded is None:  # an earlier string: purchases and counts in their sorted sets
                purchased, repeat = _from_scores(bought), _from_scores(again)
            else:
                purchased, repeat = folded
        if flat is None:
            return None
        recent = tuple(
            RecentItem(_text(flat[i]), float(flat[i + 1]), float(flat[i + 2])) for i in range(0, len(flat), 3)
        )
        return UserState(
            profile=tuple(profile[1:]),
            profile_at_s=profile[0] if profile else 0.0,
            recent=recent,
            purchased=purchased,
            repeat=repeat,
        )

    async def _earlier_state(self, state_key: str, error: Exception) -> tuple[list[float], list[Any] | None]:
        """A user's profile and recent items from a hash of the earlier layout ("p", "r"), which
        lua/record.lua replaces on the user's next interaction."""
        if not isinstance(error, redis.ResponseError) or "WRONGTYPE" not in str(error):
            raise CacheUnavailable(f"recommendation store at {redact_url(self.url)}: {error}") from error
        profile_blob, recent_blob = await self._guard(self._redis.hmget(state_key, "p", "r"))
        profile = [float(x) for x in msgpack.unpackb(profile_blob)] if profile_blob else []
        return profile, None if recent_blob is None else msgpack.unpackb(recent_blob)

    # ------------------------------------------------------------------ co-occurrence

    async def _add_neighbours(self, updates: Mapping[str, Mapping[str, float]], max_neighbours: int) -> None:
        # One script call per NEIGHBOUR_LISTS_PER_CALL lists on one server: redis-py's cost per
        # reply, not the server's, was most of a batch's time. A cluster's lists live in other
        # slots, so there each list is a call of its own (in one pipeline per node).
        per_call = 1 if self._cluster else NEIGHBOUR_LISTS_PER_CALL
        items = list(updates.items())
        calls = []
        for start in range(0, len(items), per_call):
            chunk = items[start:start + per_call]
            flat: list[Any] = []
            for index, (_, adds) in enumerate(chunk, start=1):
                for other, value in adds.items():
                    flat += [index, other, value]
            keys = [self._neighbours_key(item_id) for item_id, _ in chunk]
            calls.append(self._script_command("log_add", keys, [max_neighbours, msgpack.packb(flat)]))
        await self._pipelined(calls)

    async def _neighbours(self, item_ids: Sequence[str], limit: int) -> dict[str, list[tuple[str, float]]]:
        async with self._redis.pipeline(transaction=False) as pipe:
            for item_id in item_ids:
                pipe.zrevrange(self._neighbours_key(item_id), 0, limit - 1, withscores=True)
            replies = await self._guard(pipe.execute())
        return {
            item_id: [(member.decode(), float(score)) for member, score in reply]
            for item_id, reply in zip(item_ids, replies, strict=True)
            if reply
        }

    # ------------------------------------------------------------------ trending

    async def _add_trending(self, updates: Mapping[str | None, Mapping[str, float]], max_size: int) -> None:
        keys = [self._trending_key(scope) for scope in updates]
        triples: list[Any] = []
        for index, adds in enumerate(updates.values(), start=1):
            for item_id, value in adds.items():
                triples += [index, item_id, value]
        # A large batch goes in several calls, so no single script holds the server for long;
        # only the last trims, every list, so the outcome is the same as one call.
        step = 3 * SCRIPT_CHUNK
        chunks = [triples[start:start + step] for start in range(0, len(triples), step)]
        last = len(chunks)

        def args(number: int, chunk: list[Any]) -> list[Any]:
            if number < last:
                return [NO_BOUND, msgpack.packb(chunk)]
            return [max_size, msgpack.packb(chunk), *(["all"] if last > 1 else [])]

        await self._pipelined([self._script_command("log_add", keys, args(number, chunk))
                               for number, chunk in enumerate(chunks, start=1)])

    async def _trending_top(self, scope: str | None, start: int, count: int) -> list[tuple[str, float]]:
        reply = await self._guard(
            self._redis.zrevrange(self._trending_key(scope), start, start + count - 1, withscores=True)
        )
        return [(member.decode(), float(score)) for member, score in reply]

    async def _trending_scores(self, scope: str | None, item_ids: Sequence[str]) -> list[float | None]:
        reply = await self._guard(self._redis.zmscore(self._trending_key(scope), list(item_ids)))
        return [None if score is None else float(score) for score in reply]

    # ------------------------------------------------------------------ bookkeeping

    async def _note_update(self, at_s: float, interaction_at_s: float, new_users: int) -> None:
        await self._guard(
            self._scripts["note"](keys=[self._meta_key], args=[repr(at_s), repr(interaction_at_s), new_users])
        )

    async def _stats(self) -> StoreStats:
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.hlen(self._item_keys[0])
            pipe.hmget(self._meta_key, "users", "updated", "newest")
            items, (users, updated, newest) = await self._guard(pipe.execute())
        return StoreStats(
            int(items), int(users or 0),
            None if updated is None else float(updated), None if newest is None else float(newest),
        )


_STATE_HEAD = struct.Struct("<dI")
LAYOUT = 2**31  # lua/record.lua: a layout word from here on is the current layout's
EXPONENT_BIAS = 2048  # lua/record.lua keeps the profile's exponent plus this


Folded = tuple[dict[str, float], dict[str, float]]  # purchases, buy-again counts


def _unpack_state(packed: bytes) -> tuple[list[float], list[Any], Folded | None]:
    """The profile ([time, component, ...], [] when none), the flat recent list and, in the
    current layout, the purchases and buy-again counts of a user's packed state (see
    lua/record.lua; None for those in an earlier string, which kept them in sorted sets)."""
    at_s, word = _STATE_HEAD.unpack_from(packed)
    if word < LAYOUT:
        end = _STATE_HEAD.size + 4 * word
        components = np.frombuffer(packed, dtype="<f4", count=word, offset=_STATE_HEAD.size).tolist()
        return [at_s, *components] if word else [], msgpack.unpackb(packed[end:]), None
    size, exponent = word % 65536, (word - LAYOUT) // 65536 - EXPONENT_BIAS
    profile = [at_s, *unpack_profile(packed, _STATE_HEAD.size, size, exponent)] if size else []
    flat, bought, again = msgpack.unpackb(packed[_STATE_HEAD.size + 2 * size:])
    return profile, flat, (_pairs(bought), _pairs(again))


def _pairs(flat: Sequence[Any]) -> dict[str, float]:
    return {_text(flat[i]): float(flat[i + 1]) for i in range(0, len(flat), 2)}


def _from_scores(entries: Sequence[tuple[bytes, float]]) -> dict[str, float]:
    return {member.decode(): float(score) for member, score in entries}


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _pack_item(item: Item) -> bytes:
    vector = np.asarray(item.vector if item.vector is not None else (), dtype="<f4").tobytes()
    packed: bytes = msgpack.packb(
        [item.item_id, item.name, list(item.categories), item.price, item.stock, vector], use_bin_type=True
    )
    return packed


def _unpack_item(blob: bytes) -> Item:
    item_id, name, categories, price, stock, vector = msgpack.unpackb(blob, raw=False)
    return Item(
        item_id=item_id, name=name, categories=tuple(categories), price=price, stock=stock,
        vector=tuple(float(x) for x in np.frombuffer(vector, dtype="<f4")),
    )
