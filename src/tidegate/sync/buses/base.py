"""Event buses between the change source and the sinks; `bus_for(url)` picks one.

    memory://                       in this process (the embedded default), see `memory.py`
    redis://host:port/db            Redis Streams, see `redis.py` (redis+cluster://host:port on a
                                    Redis Cluster)
    kafka://host:port[,host:port]   Kafka or a Kafka-protocol broker (aiokafka), see `kafka.py`

What every bus promises (one contract suite, tests/test_bus_contract.py, runs on all three):

- Each consumer group gets every change; the consumers of one group share them. A delivery stays
  pending for its group until acked; a consumer that closes (or dies) without acking hands its
  deliveries to another consumer of the group. Delivery is at-least-once: sinks see duplicates.
- One consumer per group sees each entity's changes in publish order. Several consumers of one
  group may interleave one entity's changes (a reclaimed delivery arrives after a newer one); the
  cache's compare-and-set on versions makes that harmless.
- A group created after changes were published starts at the oldest change the bus still holds.
- An entry that is not a change (written by something else, or corrupted) is logged with its id,
  acked so it cannot wedge the group, and counted in the bus's `malformed` attribute (per change
  where an entry carries several: its good changes are still delivered).
- Errors of the driver surface as BusUnavailable naming the URL (never its password); a missing
  optional dependency as MissingDependency naming the extra to install.
"""

from __future__ import annotations

import abc
import logging
from collections.abc import Sequence
from typing import Any, Literal, Self
from urllib.parse import parse_qsl, urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from tidegate._lifecycle import Lifecycle
from tidegate._redis import is_redis_url
from tidegate._urls import redact_url, without_query
from tidegate.errors import BusUnavailable, ConfigError, InvalidChange
from tidegate.sync.buses.debezium import DebeziumSource, change_of
from tidegate.sync.changes import Change, changes_from_json
from tidegate.sync.contracts import Bus, Delivery

__all__ = ["BusBase", "BusSettings", "SubscriptionBase", "bus_for"]

log = logging.getLogger("tidegate.sync.bus")

_SCHEMES = "memory://, redis://host:port/db or kafka://host:port[,host:port]"


class BusSettings(BaseModel):
    """How a bus behaves; each field says which backends read it. Every field has a default."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    # Names every stream or topic: `<prefix>:{<entity_type>}:changes` (Redis),
    # `<prefix>.<entity_type>.changes` (Kafka).
    prefix: str = Field("tidegate", pattern=r"^[A-Za-z0-9_.-]{1,100}$")
    # Changes kept per entity type (memory, redis); None: the backend's default (see there).
    max_len: int | None = Field(None, gt=0)
    # Changes one stream entry carries at most (redis): a publish writes each stream's changes
    # as entries of up to this many, so a batch costs a few XADDs rather than one per change.
    # 1 writes one change an entry, in the form versions before several-changes entries read
    # (what a rolling upgrade publishes until every consumer reads both forms).
    changes_per_entry: int = Field(100, ge=1, le=10_000)
    # A delivery left unacked this long goes to another consumer of the group (memory, redis).
    reclaim_idle_s: float = Field(30.0, gt=0)
    # How often a Redis consumer looks for deliveries to reclaim while it waits for new ones.
    reclaim_interval_s: float = Field(1.0, gt=0)
    # Topics are created with these when missing (kafka).
    partitions: int = Field(6, ge=1)
    replication_factor: int = Field(1, ge=1)
    # Idempotent producer (kafka): retries never duplicate an entry. Needs a broker that answers
    # InitProducerId version 0, the only version aiokafka sends.
    idempotence: bool = True
    # Consumer group timing (kafka): a consumer silent for session_timeout_s, or not fetching
    # for max_poll_interval_s, leaves the group and its partitions go to the others.
    session_timeout_s: float = Field(10.0, gt=0)
    heartbeat_interval_s: float = Field(1.0, gt=0)
    max_poll_interval_s: float = Field(300.0, gt=0)
    # The longest one broker request (and one publish) may take before BusUnavailable (kafka).
    request_timeout_s: float = Field(30.0, gt=0)
    # How long the broker may hold a fetch that finds no new change (kafka). Apache Kafka answers
    # a waiting fetch as soon as a change arrives, so a long wait costs nothing there; Tansu looks
    # again only at points within the wait (see kafka.py), so the wait is the latency it adds.
    fetch_max_wait_ms: int = Field(20, ge=1, le=60_000)
    # What a change looks like on the bus (kafka, redis): tidegate's own JSON, or Debezium's
    # envelope for consumers written for Debezium (see `debezium.py`), on topics and streams
    # named `<prefix>.<schema>.<table>` as Debezium names its topics. tidegate's own consumers
    # read either.
    format: Literal["tidegate", "debezium"] = "tidegate"
    # format=debezium: key and value as `{"schema", "payload"}`, as Kafka's JsonConverter writes
    # them with schemas.enable=true; false (the default) writes them schemaless.
    schemas: bool = False
    # format=debezium on kafka: a tombstone (the key, a null value) after each delete, for
    # compacted topics (Debezium's tombstones.on.delete). Redis Streams have no compaction and
    # get none.
    tombstones: bool = True
    # format=debezium: `source.connector` and `source.db`; `tidegate sync` sets them from the
    # source URL.
    connector: Literal["postgresql", "sqlite"] = "postgresql"
    database: str = Field("", max_length=200)

    @model_validator(mode="after")
    def _heartbeat_within_session(self) -> Self:
        if self.heartbeat_interval_s >= self.session_timeout_s:
            raise ValueError(
                f"heartbeat_interval_s ({self.heartbeat_interval_s}) must be below "
                f"session_timeout_s ({self.session_timeout_s})"
            )
        return self


def bus_for(url: str, *, prefix: str | None = None, settings: BusSettings | None = None,
            **options: Any) -> Bus:
    """The bus a URL names. Settings come from `settings`, then the URL's query (`?max_len=1000`),
    then `prefix` (default "tidegate": it names the streams, topics and Kafka groups) and keyword
    options; later ones win. Nothing connects until the bus is entered (`async with`)."""
    parts = urlsplit(url)
    merged = {**(settings.model_dump(exclude_unset=True) if settings else {}),
              **dict(parse_qsl(parts.query)), **options}
    if prefix is not None:
        merged["prefix"] = prefix
    try:
        resolved = BusSettings.model_validate(merged)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(part) for part in error['loc']) or 'settings'}: {error['msg']}"
            for error in exc.errors()
        )
        raise ConfigError(f"invalid bus settings for {redact_url(url)}: {problems}") from None
    base_url = without_query(url)
    if parts.scheme == "memory":
        if parts.netloc or parts.path.strip("/"):
            raise ConfigError(f"memory:// takes no host or path, got {redact_url(url)!r}")
        if resolved.format != "tidegate":
            raise ConfigError(f"format={resolved.format} is for buses other processes read "
                              "(kafka://, redis://); memory:// keeps tidegate's own changes")
        from tidegate.sync.buses.memory import MemoryBus

        return MemoryBus(resolved)
    if is_redis_url(url):
        from tidegate.sync.buses.redis import RedisBus

        return RedisBus(base_url, resolved)
    if parts.scheme == "kafka":
        from tidegate.sync.buses.kafka import KafkaBus

        return KafkaBus(base_url, resolved)
    raise ConfigError(f"unsupported bus URL {redact_url(url)!r}: use {_SCHEMES}")


# ---------------------------------------------------------------------- shared by the backends


class BusBase(Lifecycle):
    """Lifecycle, argument checks and malformed-entry accounting shared by every bus. Backends
    implement `_open`, `_close` and `_publish`; `subscribe` returns their Subscription."""

    unavailable_error = BusUnavailable

    def __init__(self, url: str, settings: BusSettings) -> None:
        super().__init__()
        self.url = url
        self.settings = settings
        self.malformed = 0  # entries that were not changes: logged, acked and skipped

    def __repr__(self) -> str:
        return f"{type(self).__name__}({redact_url(self.url)!r})"

    def _described(self) -> str:
        return repr(self)

    def check_open(self) -> None:
        """Raise BusUnavailable unless the bus is open."""
        self._check_open()

    async def publish(self, changes: Sequence[Change]) -> None:
        """Publish durably, keeping each entity's changes in order; see the backend for how."""
        self.check_open()
        for index, change in enumerate(changes):
            if not isinstance(change, Change):
                raise InvalidChange(f"item {index} to publish is a {type(change).__name__}, not a Change")
        if changes:
            await self._publish(changes)

    @property
    def debezium_source(self) -> DebeziumSource:
        """What the `source` block of this bus's Debezium events names (format=debezium)."""
        s = self.settings
        return DebeziumSource(s.connector, s.prefix, s.database)

    def decode(self, raw: bytes | str | None, where: str) -> Change | None:
        """The change an entry carries, or None (logged and counted) when it carries none."""
        try:
            if raw is None:
                raise InvalidChange("the entry has no change field")
            return Change.from_json(raw)
        except InvalidChange as exc:
            self._skip(where, exc)
            return None

    def decode_debezium(self, key: bytes | None, value: bytes, version_key: bytes | None,
                        entity_id: bytes | None, where: str) -> Change | None:
        """The change a Debezium event this bus published carries (see `debezium.change_of`), or
        None (logged and counted) for anything else."""
        try:
            return change_of(key, value, version_key, entity_id)
        except InvalidChange as exc:
            self._skip(where, exc)
            return None

    def _skip(self, where: str, exc: InvalidChange) -> None:
        self.malformed += 1
        log.warning("%s: skipping malformed entry %s (acked, not delivered): %s", self, where, exc)

    def decode_many(self, raw: bytes | str, where: str) -> list[Change]:
        """The changes an entry of several carries (`changes_from_json`'s array); what is not a
        change is logged and counted, one by one, and the rest kept."""
        try:
            events = changes_from_json(raw)
        except InvalidChange as exc:
            self._skip(where, exc)
            return []
        out: list[Change] = []
        for index, event in enumerate(events):
            try:
                out.append(Change.from_object(event))
            except InvalidChange as exc:
                self.malformed += 1
                log.warning("%s: skipping malformed change %d of entry %s (not delivered): %s",
                            self, index, where, exc)
        return out

    @abc.abstractmethod
    def subscribe(self, group: str, consumer: str, entity_types: Sequence[str]) -> SubscriptionBase:
        """A consumer `consumer` of group `group` for the changes of `entity_types`."""

    @abc.abstractmethod
    async def _publish(self, changes: Sequence[Change]) -> None:
        """Publish a non-empty batch of changes durably."""


class SubscriptionBase(Lifecycle):
    """Lifecycle and argument checks shared by every subscription; backends implement `_open`,
    `_close`, `_fetch` and `_ack`. A closed subscription cannot reopen: subscribe again. It is
    usable only while its bus is open."""

    unavailable_error = BusUnavailable
    reopen_hint = "subscribe again"

    def __init__(self, bus: BusBase, group: str, consumer: str, entity_types: Sequence[str]) -> None:
        for name, value in (("group", group), ("consumer", consumer)):
            if not isinstance(value, str) or not value:
                raise ConfigError(f"a subscription needs a non-empty {name} name, got {value!r}")
        if isinstance(entity_types, str):
            raise ConfigError(f"entity_types must be a sequence of names, got the string {entity_types!r}")
        types = tuple(dict.fromkeys(entity_types))
        if not types or not all(isinstance(t, str) and t for t in types):
            raise ConfigError(f"a subscription needs at least one entity type, got {entity_types!r}")
        super().__init__()
        self.bus = bus
        self.group = group
        self.consumer = consumer
        self.entity_types = types

    def __repr__(self) -> str:
        return f"{type(self).__name__}(group={self.group!r}, consumer={self.consumer!r})"

    def _described(self) -> str:
        return repr(self)

    async def open(self) -> Self:
        """Join the group; the bus must be open."""
        self.bus.check_open()
        return await super().open()

    def _check_open(self) -> None:
        super()._check_open()
        self.bus.check_open()

    async def fetch(self, max_count: int, timeout_s: float) -> list[Delivery]:
        """Up to `max_count` deliveries, waiting at most `timeout_s` for the first (without
        polling); reclaimed deliveries of dead consumers of the group come first."""
        self._check_open()
        if isinstance(max_count, bool) or not isinstance(max_count, int) or max_count < 1:
            raise ValueError(f"max_count must be an integer >= 1, got {max_count!r}")
        if timeout_s < 0:
            raise ValueError(f"timeout_s must be >= 0, got {timeout_s!r}")
        return await self._fetch(max_count, timeout_s)

    async def ack(self, deliveries: Sequence[Delivery]) -> None:
        """These deliveries are done: the group never gets them again."""
        self._check_open()
        if deliveries:
            await self._ack(deliveries)

    @abc.abstractmethod
    async def _open(self) -> None:
        """Join the group (creating it where missing)."""

    @abc.abstractmethod
    async def _close(self) -> None:
        """Leave the group, handing unacked deliveries to its other consumers."""

    @abc.abstractmethod
    async def _fetch(self, max_count: int, timeout_s: float) -> list[Delivery]:
        """Up to `max_count` deliveries (arguments checked), waiting at most `timeout_s`."""

    @abc.abstractmethod
    async def _ack(self, deliveries: Sequence[Delivery]) -> None:
        """Settle a non-empty batch of deliveries."""
