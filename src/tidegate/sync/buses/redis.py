"""redis:// — Redis Streams, one stream per entity type.

- Keys: `<prefix>:{<entity_type>}:changes`. The hash tag is the entity type, so on Redis Cluster
  (`redis+cluster://`) the entity types spread over the shards while each stream stays whole.
  A read over several streams is one XREADGROUP per slot there (a cluster refuses one command
  over keys of several slots): pipelined when it does not block; when it does, one blocking read
  per slot at once, the first to answer ending the others (see `_read_new`).
- Publish: each stream's changes as entries of up to `changes_per_entry` changes (100 by
  default; the entry layout, both forms readers take, and how it is bounded: `redis_entries`),
  `XADD key MAXLEN ~ N * changes <JSON array>` for every entry, all in one pipeline (one round
  trip) without MULTI: one transaction's changes may belong to streams on different Cluster
  shards, and a half-published transaction is harmless (publish did not return, so the source
  replays the whole transaction and the cache ignores the versions it already has). Each XADD is
  durable as far as the server's persistence settings make it (AOF with fsync for the strictest
  promise). A batch of 500 changes costs five XADDs rather than 500, and the consumer reads,
  parses and acks entries in the same proportion. Consumers of versions before several-changes
  entries read them as malformed: a rolling upgrade publishes with `changes_per_entry=1` until
  every consumer runs this version.
- `format=debezium`: one Debezium event an entry on streams `<prefix>.<schema>.<table>` (the
  layout: `redis_entries`); `changes_per_entry` does not apply.
- Groups: `XGROUP CREATE key group 0 MKSTREAM` when a subscription opens. `0`, not `$`: a group
  created after publishing still gets every change the stream retains, as on every bus.
- Fetch: after a (re)start a consumer first re-reads its own pending entries (`XREADGROUP … 0`),
  so nothing delivered before a crash is forgotten; then entries another consumer left pending
  for `reclaim_idle_s` (it died or hung) are taken over with `XAUTOCLAIM`, looked for every
  `reclaim_interval_s`; then new entries with `XREADGROUP … BLOCK` (no polling for new entries).
  Each change of an entry is its own delivery; the entry is XACKed once every one of them is
  acked, so a consumer that dies with part of an entry applied has the whole entry redelivered
  (the cache ignores what it has). Closing a subscription marks its unacked entries idle
  (`XCLAIM … IDLE`), so the next XAUTOCLAIM of another consumer takes them at once instead of
  after `reclaim_idle_s`.
- Order: one consumer per group sees each entity's changes in order; several consumers of one
  group may interleave them (a reclaimed entry arrives after newer ones), which the cache's
  compare-and-set on versions makes harmless.
- Lost connection (a Redis restart): every call is retried on a fresh connection with capped
  exponential backoff and jitter for up to `tidegate._redis.RETRY_WITHIN_S` (2 s), then fails as
  BusUnavailable (logged once per outage, each recovery counted in
  `tidegate_redis_reconnects_total{component="bus"}`).
  Sending a call twice is harmless here: an XADD twice is a duplicate the cache ignores, an XACK
  twice acks nothing more, and an XREADGROUP whose reply was lost left its entries pending for
  this consumer, so after a reconnect the consumer re-reads its own pending entries first.
- Restart without persistence: the streams and groups are gone. The next read finds no group
  (NOGROUP), creates it again (from `0`, so every change published since is delivered) and fails
  that fetch once with BusUnavailable saying so: what was published before and not acked is gone
  from the bus, and the consumer's owner (the sync pipeline) reopens and replays it from the
  source's confirmed position. Acked changes are applied already and never needed again.
- Cap: `max_len` changes (default 1,000,000 per entity type). The producer trims to the oldest
  entry of the newest `max_len` changes it wrote (`XTRIM MINID ~`, sent with the next publish),
  and every XADD carries `MAXLEN ~ max_len` entries for what it never wrote (see
  `redis_entries`). Redis trims whole stream nodes, so a stream holds at least `max_len` changes
  and at most a node's worth of entries more (`stream-node-max-entries`, 100 by default).
  Trimming does not wait for the groups: a group that falls more than `max_len` changes behind
  loses the oldest; size the cap for the longest outage of a consumer. Pending entries found
  trimmed away are logged and counted in `lost` — entries, not changes: how many changes a
  trimmed entry held is gone with it (at most `changes_per_entry`). Redis's own figures count
  entries too (`XINFO GROUPS`' lag and pending); the pipeline's own lag and pending figures count
  changes.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from tidegate._redis import Outage, RedisClient, call_with_reconnect, driver_errors, is_cluster_url
from tidegate._urls import redact_url
from tidegate.errors import BusUnavailable, MissingDependency
from tidegate.sync.buses.base import BusBase, BusSettings, SubscriptionBase, log
from tidegate.sync.buses.debezium import ENTITY_ID_HEADER, VERSION_HEADER, topic_of
from tidegate.sync.buses.redis_entries import (
    FIELD_KEY,
    FIELD_MANY,
    FIELD_ONE,
    FIELD_VALUE,
    TrimWindow,
    debezium_entries_of,
    entries_of,
)
from tidegate.sync.changes import Change
from tidegate.sync.contracts import Delivery

try:
    from redis.crc import key_slot
    from redis.exceptions import ResponseError
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise MissingDependency("the Redis bus needs redis-py: pip install 'tidegate[redis]'") from exc

__all__ = ["DEFAULT_MAX_LEN", "RedisBus", "RedisSubscription"]

DEFAULT_MAX_LEN = 1_000_000
_START = b"0-0"
_DRIVER_ERRORS = driver_errors()


class RedisBus(BusBase):
    """`bus_for("redis://host:port/db")`: Redis Streams; see the module doc."""

    def __init__(self, url: str, settings: BusSettings | None = None) -> None:
        super().__init__(url, settings or BusSettings())
        self.max_len = self.settings.max_len or DEFAULT_MAX_LEN
        # Pending entries trimmed away by the cap before they were acked; an entry holds one
        # change or several, and how many is gone with it.
        self.lost = 0
        self._windows: dict[str, TrimWindow] = {}  # per stream: see redis_entries
        self.redis: Any = None
        self.outage = Outage("bus", url)

    def stream_key(self, entity_type: str) -> str:
        """The stream of one entity type: named as Debezium names topics with format=debezium
        (one key, so it needs no hash tag to stay on one Cluster shard)."""
        if self.settings.format == "debezium":
            return topic_of(self.debezium_source, entity_type)
        return f"{self.settings.prefix}:{{{entity_type}}}:changes"

    def unavailable(self, exc: Exception) -> BusUnavailable:
        """A driver error as BusUnavailable naming the URL (password hidden)."""
        return BusUnavailable(f"Redis bus at {redact_url(self.url)}: {exc}")

    def subscribe(self, group: str, consumer: str, entity_types: Sequence[str]) -> RedisSubscription:
        """A consumer of `group`; entering it (`async with`) creates the group where missing."""
        return RedisSubscription(self, group, consumer, entity_types)

    async def retrying(self, step: Callable[[], Awaitable[Any]]) -> Any:
        """Run `step`, sending it again on a lost or refused connection (see the module doc);
        driver errors propagate untranslated."""
        return await call_with_reconnect(step, self.outage)

    async def _open(self) -> None:
        # RedisClient leaves the driver's own retries off: reconnecting is `retrying`'s, on its
        # own bounded schedule.
        client = RedisClient(self.url, what="Redis bus", unavailable=BusUnavailable)
        await client.ping()
        self.redis = client.client

    async def _close(self) -> None:
        await self.redis.aclose()

    async def _publish(self, changes: Sequence[Change]) -> None:
        debezium = self.settings.format == "debezium"
        if debezium:
            entries = debezium_entries_of(changes, self.debezium_source, schemas=self.settings.schemas)
        else:
            entries = entries_of(changes, self.stream_key, self.settings.changes_per_entry)
        # The trims earlier publishes asked for ride along with these entries (see redis_entries).
        trims = [(key, window.min_id) for key, window in self._windows.items() if window.min_id is not None]

        async def send() -> list[Any]:
            async with self.redis.pipeline(transaction=False) as pipe:
                for key, min_id in trims:
                    pipe.xtrim(key, minid=min_id, approximate=True)
                for entry in entries:
                    pipe.xadd(entry.key, entry.fields, maxlen=self.max_len, approximate=True)
                replies: list[Any] = await pipe.execute()
                return replies

        try:
            replies = await self.retrying(send)
        except _DRIVER_ERRORS as exc:
            raise self.unavailable(exc) from exc
        for key, min_id in trims:
            self._windows[key].trimmed(min_id)
        if debezium or self.settings.changes_per_entry == 1:
            return  # one change an entry: MAXLEN counts changes already
        for entry, entry_id in zip(entries, replies[len(trims):], strict=True):
            window = self._windows.get(entry.key)
            if window is None:
                window = self._windows[entry.key] = TrimWindow(self.max_len)
            window.wrote(entry_id, entry.changes)


class RedisSubscription(SubscriptionBase):
    """One consumer of one group on a RedisBus."""

    bus: RedisBus

    def __init__(self, bus: RedisBus, group: str, consumer: str, entity_types: Sequence[str]) -> None:
        super().__init__(bus, group, consumer, entity_types)
        self._keys = [bus.stream_key(t) for t in self.entity_types]
        # Per stream: where the re-read of our own pending entries is (None once done), and
        # where the scan for entries to reclaim continues.
        self._history: dict[str, bytes | None] = dict.fromkeys(self._keys, b"0")
        self._reclaim_cursor: dict[str, bytes] = dict.fromkeys(self._keys, _START)
        self._next_reclaim = 0.0  # monotonic time of the next XAUTOCLAIM pass
        self._buffer: deque[Delivery] = deque()  # read beyond max_count, not yet handed out
        # Per entry handed out or buffered and not yet acked: the indices of its changes still
        # unacked. The entry is XACKed once none is left.
        self._unacked: dict[tuple[str, bytes], set[int]] = {}
        # Changes an entry held in the latest read: reads ask for about `room` changes' worth of
        # entries, so that entries of many changes do not pile up in the buffer. Until a read
        # says otherwise, entries are taken to be as full as this bus writes them.
        debezium = bus.settings.format == "debezium"  # one event an entry
        self._changes_per_entry = float(1 if debezium else bus.settings.changes_per_entry)
        # The streams by Redis Cluster slot, each group one XREADGROUP (one group off a cluster).
        slots: dict[int, list[str]] = {}
        for key in self._keys:
            slots.setdefault(key_slot(key.encode()) if is_cluster_url(bus.url) else 0, []).append(key)
        self._slot_of = {key: slot for slot, keys in slots.items() for key in keys}

    async def _open(self) -> None:
        await self._call(self._create_groups)

    async def _create_groups(self) -> None:
        for key in self._keys:
            try:
                await self.bus.redis.xgroup_create(key, self.group, id="0", mkstream=True)
            except ResponseError as exc:
                if not str(exc).startswith("BUSYGROUP"):
                    raise

    async def _call(self, step: Any, *args: Any) -> Any:
        """Run a step across a lost connection (see the module doc), translating driver errors;
        a stream or group that vanished is created again, and the step fails once saying so."""
        reconnects = self._reconnects_seen
        try:
            result = await self.bus.retrying(lambda: step(*args))
        except ResponseError as exc:
            if not str(exc).startswith("NOGROUP"):
                raise self.bus.unavailable(exc) from exc
            await self._recreate_groups()
            raise self.bus.unavailable(
                RuntimeError(f"consumer group {self.group} had vanished (a Redis restart without "
                             "persistence?) and was created again; changes published before it "
                             "vanished and not acked are gone from the bus")) from exc
        except _DRIVER_ERRORS as exc:
            raise self.bus.unavailable(exc) from exc
        if self._reconnects_seen != reconnects:
            # A reply lost with the connection may have carried entries now pending for us.
            self._reread_history()
        return result

    @property
    def _reconnects_seen(self) -> int:
        return self.bus.outage.recoveries

    def _reread_history(self) -> None:
        self._history = dict.fromkeys(self._keys, b"0")

    async def _recreate_groups(self) -> None:
        log.error("%r: group %s vanished from Redis; creating it again", self, self.group)
        try:
            await self.bus.retrying(self._create_groups)
        except _DRIVER_ERRORS as exc:
            raise self.bus.unavailable(exc) from exc
        self._reread_history()
        self._reclaim_cursor = dict.fromkeys(self._keys, _START)
        self._unacked.clear()
        self._buffer.clear()

    async def _close(self) -> None:
        if not self._unacked:
            return
        by_key: dict[str, list[bytes]] = {}
        for key, entry_id in self._unacked:
            by_key.setdefault(key, []).append(entry_id)
        idle_ms = int(self.bus.settings.reclaim_idle_s * 1000)
        try:
            async with self.bus.redis.pipeline(transaction=False) as pipe:
                for key, ids in by_key.items():
                    pipe.xclaim(key, self.group, self.consumer, 0, ids, idle=idle_ms, justid=True)
                await pipe.execute()
        except _DRIVER_ERRORS as exc:
            # Not fatal: the entries stay pending and are reclaimed after reclaim_idle_s anyway.
            log.warning("%r: could not hand %d unacked entries back: %s",
                        self, len(self._unacked), self.bus.unavailable(exc))
        self._unacked.clear()

    # -- fetching ---------------------------------------------------------------------------

    async def _fetch(self, max_count: int, timeout_s: float) -> list[Delivery]:
        deadline = time.monotonic() + timeout_s
        out: list[Delivery] = []
        while self._buffer and len(out) < max_count:
            out.append(self._buffer.popleft())
        while len(out) < max_count and any(c is not None for c in self._history.values()):
            out += await self._call(self._read_history, max_count - len(out))
            if out:
                # New entries wait until the old ones are all handed out again: read together,
                # entries handed out now would come back with the rest of the history.
                return out
        while len(out) < max_count:
            now = time.monotonic()
            if now >= self._next_reclaim:
                out += await self._call(self._reclaim, max_count - len(out), now)
            if len(out) >= max_count:
                break
            # Block only while nothing is in hand, and never past the next reclaim pass.
            block_s = 0.0 if out else min(deadline, self._next_reclaim) - time.monotonic()
            out += await self._call(self._read_new, max_count - len(out), block_s)
            if out or time.monotonic() >= deadline:
                break
        return out

    async def _read_history(self, room: int) -> list[Delivery]:
        """Our own pending entries, left by an earlier run of this consumer."""
        streams: dict[str, bytes | str] = {
            key: cursor for key, cursor in self._history.items() if cursor is not None}
        keys = list(streams)
        if not keys:
            return []
        count = self._entries_for(room)
        reply = await self._read_now(streams, count)
        seen = {self._key_of(key) for key, _ in reply}
        for key in keys:
            if key not in seen:
                self._history[key] = None
        out: list[Delivery] = []
        for raw_key, entries in reply:
            key = self._key_of(raw_key)
            # Fewer than asked for: that was the last of this stream's history.
            self._history[key] = entries[-1][0] if len(entries) >= count else None
            # Re-read after a reconnect, the history holds entries handed out and not acked yet.
            fresh = [entry for entry in entries if (key, entry[0]) not in self._unacked]
            out += await self._deliveries(key, fresh)
        return self._keep(out, room)

    async def _reclaim(self, room: int, now: float) -> list[Delivery]:
        """Take over entries other consumers left pending for reclaim_idle_s."""
        idle_ms = int(self.bus.settings.reclaim_idle_s * 1000)
        out: list[Delivery] = []
        more = False
        for key in self._keys:
            if len(out) >= room:
                more = True
                break
            cursor, entries, *rest = await self.bus.redis.xautoclaim(
                key, self.group, self.consumer, idle_ms, start_id=self._reclaim_cursor[key],
                count=self._entries_for(room - len(out)))
            self._reclaim_cursor[key] = cursor
            more = more or cursor != _START
            deleted = rest[0] if rest else []
            if deleted:
                self._count_lost(key, deleted)
            out += await self._deliveries(key, entries)
        # A scan that stopped early continues on the next fetch; a full one waits its interval.
        self._next_reclaim = now if more else now + self.bus.settings.reclaim_interval_s
        return self._keep(out, room)

    async def _read_new(self, room: int, block_s: float) -> list[Delivery]:
        # BLOCK 0 would wait forever: below a millisecond, do not block at all.
        block_ms = int(block_s * 1000)
        streams: dict[str, bytes | str] = dict.fromkeys(self._keys, ">")
        count = self._entries_for(room)
        if len(set(self._slot_of.values())) == 1:
            reply = await self.bus.redis.xreadgroup(
                self.group, self.consumer, streams, count=count, block=block_ms if block_ms >= 1 else None)
        else:
            # Streams on several slots: what is there already, in one round trip; only when
            # there is nothing, a wait on every slot at once.
            reply = await self._read_now(streams, count)
            if not reply and block_ms >= 1:
                reply = await self._read_first(streams, count, block_ms)
        out: list[Delivery] = []
        for raw_key, entries in reply or []:
            out += await self._deliveries(self._key_of(raw_key), entries)
        return self._keep(out, room)

    def _by_slot(self, streams: dict[str, bytes | str]) -> list[dict[str, bytes | str]]:
        """`streams` split into one XREADGROUP's worth per slot."""
        groups: dict[int, dict[str, bytes | str]] = {}
        for key, cursor in streams.items():
            groups.setdefault(self._slot_of[key], {})[key] = cursor
        return list(groups.values())

    async def _read_now(self, streams: dict[str, bytes | str], count: int) -> list[Any]:
        """XREADGROUP without blocking over `streams`: one command, or one per slot in a
        pipeline (on a cluster, one round trip per node, all at once)."""
        groups = self._by_slot(streams)
        if len(groups) == 1:
            reply = await self.bus.redis.xreadgroup(self.group, self.consumer, streams, count=count)
            return list(reply or [])
        async with self.bus.redis.pipeline(transaction=False) as pipe:
            for group in groups:
                pipe.xreadgroup(self.group, self.consumer, group, count=count)
            replies = await pipe.execute()
        return [stream for reply in replies for stream in reply or []]

    async def _read_first(self, streams: dict[str, bytes | str], count: int, block_ms: int) -> list[Any]:
        """One XREADGROUP BLOCK per slot at once, each on its own connection; the first answer
        ends the others. A read ended so may have taken entries whose reply it never read: they
        are pending for this consumer, so its own history is read again on the next fetch."""
        reads = {asyncio.ensure_future(self.bus.redis.xreadgroup(
                     self.group, self.consumer, group, count=count, block=block_ms))
                 for group in self._by_slot(streams)}
        try:
            await asyncio.wait(reads, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for read in reads:
                read.cancel()
            # The reads end at once (a cancelled read closes its connection), and are collected
            # here so that none outlives this fetch.
            outcomes = await asyncio.gather(*reads, return_exceptions=True)
        if any(read.cancelled() for read in reads):
            self._reread_history()
        reply: list[Any] = []
        for outcome in outcomes:
            if isinstance(outcome, BaseException) and not isinstance(outcome, asyncio.CancelledError):
                raise outcome
            if isinstance(outcome, list):
                reply += outcome
        return reply

    def _entries_for(self, room: int) -> int:
        """How many entries to read for about `room` changes."""
        return max(1, int(room / self._changes_per_entry))

    def _keep(self, deliveries: list[Delivery], room: int) -> list[Delivery]:
        """Hand out `room`; the rest waits in the buffer (COUNT applies per stream, and an entry
        may hold several changes, so a read may bring more)."""
        self._buffer.extend(deliveries[room:])
        return deliveries[:room]

    def _key_of(self, raw: bytes | str) -> str:
        return raw.decode() if isinstance(raw, bytes) else raw

    async def _deliveries(self, key: str, entries: list[tuple[bytes, dict[bytes, bytes]]]) -> list[Delivery]:
        """Entries as deliveries, one per change; trimmed entries and those with no change are
        acked and counted instead."""
        out: list[Delivery] = []
        skipped: list[bytes] = []
        for entry_id, fields in entries:
            if not fields:  # the entry is gone: trimmed by the cap while it was pending
                self._count_lost(key, [entry_id])
                skipped.append(entry_id)
                continue
            changes = self._decode(key, entry_id, fields)
            if not changes:
                skipped.append(entry_id)
                continue
            self._unacked[(key, entry_id)] = set(range(len(changes)))
            out += [Delivery(change, (key, entry_id, index)) for index, change in enumerate(changes)]
        if entries:
            self._changes_per_entry = max(1.0, len(out) / len(entries))
        if skipped:
            await self.bus.redis.xack(key, self.group, *skipped)
        return out

    def _decode(self, key: str, entry_id: bytes, fields: dict[bytes, bytes]) -> list[Change]:
        """The changes of an entry in either form (see redis_entries)."""
        where = f"{key} {entry_id.decode()}"
        value = fields.get(FIELD_VALUE)
        if value is not None:
            change = self.bus.decode_debezium(
                fields.get(FIELD_KEY), value, fields.get(VERSION_HEADER.encode()),
                fields.get(ENTITY_ID_HEADER.encode()), where)
            return [] if change is None else [change]
        many = fields.get(FIELD_MANY)
        if many is not None:
            return self.bus.decode_many(many, f"{key} {entry_id.decode()}")
        change = self.bus.decode(fields.get(FIELD_ONE), f"{key} {entry_id.decode()}")
        return [] if change is None else [change]

    def _count_lost(self, key: str, entry_ids: Sequence[bytes]) -> None:
        self.bus.lost += len(entry_ids)
        log.warning("%r: %d pending entries of %s were trimmed by MAXLEN %d before they were acked "
                    "(first: %s); raise max_len", self, len(entry_ids), key, self.bus.max_len,
                    entry_ids[0].decode())

    # -- acking -----------------------------------------------------------------------------

    async def _ack(self, deliveries: Sequence[Delivery]) -> None:
        acked: dict[tuple[str, bytes], set[int]] = {}
        for delivery in deliveries:
            key, entry_id, index = delivery.handle
            acked.setdefault((key, entry_id), set()).add(index)
        # An entry is done once every change it carries is acked; until then it stays pending,
        # so a consumer that dies with part of it applied has all of it redelivered.
        by_key: dict[str, list[bytes]] = {}
        for entry, indices in acked.items():
            left = self._unacked.get(entry)
            if left is None or left <= indices:
                by_key.setdefault(entry[0], []).append(entry[1])
        if by_key:
            await self._xack(by_key)
        for entry, indices in acked.items():
            left = self._unacked.get(entry)
            if left is not None:
                left -= indices
                if not left:
                    del self._unacked[entry]

    async def _xack(self, by_key: dict[str, list[bytes]]) -> None:
        async def send() -> None:
            async with self.bus.redis.pipeline(transaction=False) as pipe:
                for key, ids in by_key.items():
                    pipe.xack(key, self.group, *ids)
                await pipe.execute()

        try:
            await self.bus.retrying(send)
        except _DRIVER_ERRORS as exc:
            raise self.bus.unavailable(exc) from exc
