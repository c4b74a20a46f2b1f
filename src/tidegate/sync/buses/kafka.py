"""kafka:// — Kafka, or any broker speaking its protocol, through aiokafka.

- Topics: `<prefix>.<entity_type>.changes`, created when missing (by the publisher and by every
  subscription, so neither has to come first) with `partitions` partitions and
  `replication_factor` replicas. Key = entity id, value = `Change.to_json()`: one entity's
  changes share a partition, which keeps them in order.
- `format=debezium`: topics `<prefix>.<schema>.<table>`, key = the primary key and value =
  Debezium's envelope (see `debezium.py`), then a tombstone after each delete unless
  `tombstones=false`; tidegate's version and entity id ride as record headers. The key is the
  same for every change of a row, so its changes still share a partition.
- Publish: producer with `acks="all"` and, unless `idempotence=false`, idempotence (a retried send
  is never written twice); publish returns once every change is acknowledged. aiokafka keeps at
  most one request in flight per partition, so retries cannot reorder a partition either way.
- Consume: a consumer group with manual commits; its Kafka group id is `<prefix>.<group>`
  (groups are broker-wide, the prefix keeps deployments apart). `ack` commits, per partition,
  only up to the highest offset below which every delivery is acked: an ack of a later delivery
  never commits past an unacked earlier one. A group created after publishing starts at the
  oldest retained offset (`auto_offset_reset="earliest"`).
- Commits leave in the background: `ack` records the offsets and returns; one commit at a time
  is in flight, carrying the newest offset of every partition acked meanwhile. So the consumer's
  next fetch never waits for the broker's commit round trip (on Tansu 4-7 ms at p50, 90-190 ms
  at p99 in bench/sync.py on a busy machine). Closing, and a rebalance taking partitions away,
  first wait for what was acked to be committed. A consumer that dies between an ack and its
  commit has those deliveries delivered again (at least once, as for any unacked delivery); a
  commit the broker refuses surfaces as BusUnavailable from the next `fetch` or `ack`.
- Fetch wait: the broker holds a fetch that finds nothing new for up to `fetch_max_wait_ms`.
  Apache Kafka answers it as soon as a change arrives; Tansu does not, it looks again only at
  points within the wait, so there the wait is the latency a change can wait on the broker
  (bench/sync_tansu.py measures it). The default, 20 ms, costs an idle consumer 50 small
  requests a second.
- Redelivery is Kafka's: there is no per-entry reclaim. A consumer that closes, stops
  heartbeating for `session_timeout_s` (died) or does not fetch for `max_poll_interval_s` (hung)
  leaves the group; its partitions go to the others, which resume after the committed offsets,
  so its unacked deliveries, and the deliveries after them, come again. A restarted consumer
  resumes the same way.
- Order: one consumer per group sees each entity's changes in order; while partitions move
  between consumers, deliveries may repeat (the cache's compare-and-set makes that harmless).
- Retention is the broker's (`retention.ms` / `retention.bytes` of the topics).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from tidegate.errors import BusUnavailable, ConfigError, MissingDependency
from tidegate.sync.buses.base import BusBase, BusSettings, SubscriptionBase, log
from tidegate.sync.buses.debezium import (
    ENTITY_ID_HEADER,
    VERSION_HEADER,
    DebeziumRecord,
    records_of,
    topic_of,
)
from tidegate.sync.changes import Change
from tidegate.sync.contracts import Delivery

try:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic
    from aiokafka.errors import CommitFailedError, IllegalStateError, KafkaError
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise MissingDependency("the Kafka bus needs aiokafka: pip install 'tidegate[kafka]'") from exc

__all__ = ["KafkaBus", "KafkaSubscription"]

_TOPIC = re.compile(r"^[A-Za-z0-9._-]{1,249}$")
_TOPIC_EXISTS = 36  # Kafka's TOPIC_ALREADY_EXISTS error code


def _ms(seconds: float) -> int:
    return max(1, int(seconds * 1000))


class KafkaBus(BusBase):
    """`bus_for("kafka://host:port[,host:port]")`; see the module doc."""

    def __init__(self, url: str, settings: BusSettings | None = None) -> None:
        super().__init__(url, settings or BusSettings())
        parts = urlsplit(url)
        if "@" in parts.netloc:
            raise ConfigError("kafka:// URLs with credentials are not supported: the bus connects "
                              "in plaintext without SASL")
        if not parts.netloc or parts.path.strip("/"):
            raise ConfigError(f"a Kafka bus URL is kafka://host:port[,host:port], got {url!r}")
        self.bootstrap_servers = parts.netloc
        self._producer: Any = None
        self._admin: Any = None
        self._topics: set[str] = set()  # known to exist
        self._topic_lock = asyncio.Lock()

    def topic(self, entity_type: str) -> str:
        """The topic of one entity type: Debezium's name for it with format=debezium."""
        if self.settings.format == "debezium":
            name = topic_of(self.debezium_source, entity_type)
        else:
            name = f"{self.settings.prefix}.{entity_type}.changes"
        if not _TOPIC.match(name):
            raise ConfigError(f"entity type {entity_type!r} cannot name a Kafka topic ({name!r}): topic "
                              "names are 1-249 of the characters A-Z a-z 0-9 . _ -")
        return name

    def group_id(self, group: str) -> str:
        """The Kafka group of a consumer group: groups are broker-wide, so the prefix scopes them
        (as the streams scope them on Redis)."""
        return f"{self.settings.prefix}.{group}"

    def unavailable(self, exc: Exception, doing: str = "") -> BusUnavailable:
        """A driver error as BusUnavailable naming the brokers."""
        what = f" {doing}" if doing else ""
        return BusUnavailable(f"Kafka bus at kafka://{self.bootstrap_servers}{what}: "
                              f"{type(exc).__name__}: {exc}")

    def client_options(self) -> dict[str, Any]:
        """What every aiokafka client of this bus is given."""
        return {"bootstrap_servers": self.bootstrap_servers,
                "request_timeout_ms": _ms(self.settings.request_timeout_s)}

    def subscribe(self, group: str, consumer: str, entity_types: Sequence[str]) -> KafkaSubscription:
        """A consumer of `group`; entering it (`async with`) joins the group."""
        return KafkaSubscription(self, group, consumer, entity_types)

    async def _open(self) -> None:
        self._admin = AIOKafkaAdminClient(**self.client_options())
        self._producer = AIOKafkaProducer(
            **self.client_options(), acks="all", enable_idempotence=self.settings.idempotence)
        doing = "(connecting)"
        try:
            await self._admin.start()
            if self.settings.idempotence:
                # The broker is reachable now: a failure from here on is its answer to the
                # producer's InitProducerId, which some Kafka-protocol brokers do not support.
                doing = "(starting the idempotent producer: set idempotence=false for a broker without it)"
            await self._producer.start()
        except KafkaError as exc:
            await self._close()
            raise self.unavailable(exc, doing) from exc

    async def _close(self) -> None:
        for close in (self._producer.stop, self._admin.close):
            try:
                await close()
            except KafkaError as exc:
                log.warning("%r: closing a Kafka client failed: %s", self, exc)

    async def ensure_topics(self, entity_types: Iterable[str]) -> list[str]:
        """The topics of these entity types, created where missing."""
        topics = [self.topic(t) for t in entity_types]
        if all(t in self._topics for t in topics):
            return topics
        async with self._topic_lock:
            missing = [t for t in dict.fromkeys(topics) if t not in self._topics]
            if missing:
                await self._create_topics(missing)
        return topics

    async def _create_topics(self, names: list[str]) -> None:
        new = [NewTopic(name, self.settings.partitions, self.settings.replication_factor) for name in names]
        try:
            response = await self._admin.create_topics(new)
        except KafkaError as exc:
            raise self.unavailable(exc, f"creating topics {', '.join(names)}") from exc
        for error in response.topic_errors:
            topic, code = error[0], error[1]
            if code not in (0, _TOPIC_EXISTS):
                message = error[2] if len(error) > 2 and error[2] else f"error code {code}"
                raise BusUnavailable(f"Kafka bus at kafka://{self.bootstrap_servers}: cannot create "
                                     f"topic {topic}: {message}")
        self._topics.update(names)

    def _records(self, changes: Sequence[Change], topics: Sequence[str]) -> Iterable[DebeziumRecord]:
        """What to send for these changes, in order: in tidegate's format one record a change,
        keyed by entity id; in Debezium's, its events and tombstones (see `debezium.py`)."""
        if self.settings.format == "debezium":
            source, s = self.debezium_source, self.settings
            for change in changes:
                yield from records_of(change, source, schemas=s.schemas, tombstones=s.tombstones)
            return
        for topic, change in zip(topics, changes, strict=True):
            yield DebeziumRecord(topic, change.entity_id.encode(), change.to_json(), ())

    async def _publish(self, changes: Sequence[Change]) -> None:
        topics = await self.ensure_topics(change.entity_type for change in changes)
        sent: list[asyncio.Future[Any]] = []
        try:
            for record in self._records(changes, topics):
                sent.append(await self._producer.send(
                    record.topic, value=record.value, key=record.key, headers=list(record.headers) or None))
            results = await asyncio.gather(*sent, return_exceptions=True)
        except KafkaError as exc:
            for future in sent:  # they fail too: their errors are this one
                future.add_done_callback(_observe)
            raise self.unavailable(exc, "publishing") from exc
        failed = [r for r in results if isinstance(r, Exception)]
        if failed:
            raise self.unavailable(failed[0], f"publishing ({len(failed)} of {len(changes)} changes failed)")


def _observe(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()


@dataclass(slots=True)
class _Partition:
    """Deliveries of one assigned partition not yet committed, oldest first."""

    epoch: int  # which assignment they came from: acks from an older one are ignored
    outstanding: dict[int, bool]  # offset → acked, in offset order


class _Rebalance(ConsumerRebalanceListener):  # type: ignore[misc]  # aiokafka is untyped
    def __init__(self, subscription: KafkaSubscription) -> None:
        self.subscription = subscription

    async def on_partitions_revoked(self, revoked: Any) -> None:
        # What was acked before the partitions go is committed first (aiokafka awaits this).
        try:
            await self.subscription.settle_commits()
        finally:
            self.subscription.forget(revoked)

    def on_partitions_assigned(self, assigned: Any) -> None:
        self.subscription.forget(assigned)


class KafkaSubscription(SubscriptionBase):
    """One consumer of one group on a KafkaBus: an aiokafka consumer with manual commits."""

    bus: KafkaBus

    def __init__(self, bus: KafkaBus, group: str, consumer: str, entity_types: Sequence[str]) -> None:
        super().__init__(bus, group, consumer, entity_types)
        self._consumer: Any = None
        self._partitions: dict[Any, _Partition] = {}
        self._epoch = 0
        self._to_commit: dict[Any, int] = {}  # partition → offset acked, not yet sent
        self._committer: asyncio.Task[None] | None = None
        self._commit_failure: BusUnavailable | None = None

    async def _open(self) -> None:
        topics = await self.bus.ensure_topics(self.entity_types)
        s = self.bus.settings
        self._consumer = AIOKafkaConsumer(
            **self.bus.client_options(), group_id=self.bus.group_id(self.group), client_id=self.consumer,
            enable_auto_commit=False, auto_offset_reset="earliest",
            session_timeout_ms=_ms(s.session_timeout_s), heartbeat_interval_ms=_ms(s.heartbeat_interval_s),
            rebalance_timeout_ms=_ms(s.session_timeout_s), max_poll_interval_ms=_ms(s.max_poll_interval_s),
            fetch_max_wait_ms=s.fetch_max_wait_ms,
        )
        self._consumer.subscribe(topics, listener=_Rebalance(self))
        try:
            await self._consumer.start()
        except KafkaError as exc:
            await self._consumer.stop()
            raise self.bus.unavailable(exc, f"joining group {self.group}") from exc

    async def _close(self) -> None:
        # Leaving the group hands this consumer's partitions, from the committed offsets, to the
        # others: its unacked deliveries reach them. What was acked is committed before.
        await self.settle_commits()
        if self._commit_failure is not None:
            log.warning("%r: %s; the deliveries after the last committed offset come again",
                        self, self._commit_failure)
        try:
            await self._consumer.stop()
        except KafkaError as exc:
            log.warning("%r: leaving the group failed: %s", self, exc)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # this close itself is being cancelled
            # With the broker gone, aiokafka's fetcher cancels its pending fetch on stop and lets
            # that cancellation out of stop(): the consumer is stopped all the same.
            log.warning("%r: left the group without a goodbye: the broker is unreachable", self)

    def forget(self, partitions: Iterable[Any]) -> None:
        """Partitions were revoked or (re)assigned: deliveries handed out before are not ours to
        commit any more (the group resumes after the committed offset and delivers them again)."""
        self._epoch += 1
        for tp in partitions:
            self._partitions.pop(tp, None)

    async def _fetch(self, max_count: int, timeout_s: float) -> list[Delivery]:
        self._raise_commit_failure()
        try:
            batches = await self._consumer.getmany(timeout_ms=int(timeout_s * 1000), max_records=max_count)
        except KafkaError as exc:
            raise self.bus.unavailable(exc, "fetching") from exc
        out: list[Delivery] = []
        skipped: list[tuple[Any, int, int]] = []
        for tp, records in batches.items():
            track = self._partitions.get(tp)
            if track is None:
                track = self._partitions[tp] = _Partition(self._epoch, {})
            for record in records:
                handle = (tp, record.offset, track.epoch)
                track.outstanding[record.offset] = False
                change = self._decode(record, f"{tp.topic}[{tp.partition}]@{record.offset}")
                if change is None:
                    skipped.append(handle)
                else:
                    out.append(Delivery(change, handle))
        if skipped:
            await self._commit(skipped)
        return out

    def _decode(self, record: Any, where: str) -> Change | None:
        if self.bus.settings.format != "debezium":
            return self.bus.decode(record.value, where)
        if record.value is None:
            return None  # a tombstone: the delete before it was the change
        headers = dict(record.headers or ())
        return self.bus.decode_debezium(record.key, record.value, headers.get(VERSION_HEADER),
                                        headers.get(ENTITY_ID_HEADER), where)

    async def _ack(self, deliveries: Sequence[Delivery]) -> None:
        self._raise_commit_failure()
        await self._commit([delivery.handle for delivery in deliveries])

    async def _commit(self, handles: Sequence[tuple[Any, int, int]]) -> None:
        """Mark these acked; commit each partition up to its first unacked delivery."""
        touched = set()
        for tp, offset, epoch in handles:
            track = self._partitions.get(tp)
            if track is None or track.epoch != epoch or offset not in track.outstanding:
                continue  # from before a rebalance: the group delivers it again
            track.outstanding[offset] = True
            touched.add(tp)
        offsets: dict[Any, int] = {}
        for tp in touched:
            track = self._partitions[tp]
            done = None
            while track.outstanding:
                first = next(iter(track.outstanding))
                if not track.outstanding[first]:
                    break
                del track.outstanding[first]
                done = first
            if done is not None:
                offsets[tp] = done + 1
        if not offsets:
            return
        self._to_commit.update(offsets)
        if self._committer is None or self._committer.done():
            self._committer = asyncio.create_task(self._send_commits(), name=f"{self!r} commits")

    async def _send_commits(self) -> None:
        """Commit what was acked, one request at a time, until nothing is left to send."""
        while self._to_commit and self._commit_failure is None:
            offsets, self._to_commit = self._to_commit, {}
            try:
                await self._consumer.commit(offsets)
            except (CommitFailedError, IllegalStateError) as exc:
                # The partitions moved to another consumer meanwhile: it resumes from the last
                # committed offset, so these deliveries come again there (harmless duplicates).
                log.info("%r: commit skipped, partitions were reassigned: %s", self, exc)
            except KafkaError as exc:
                self._commit_failure = self.bus.unavailable(exc, "committing offsets")

    async def settle_commits(self) -> None:
        """Wait until every offset acked so far was committed or refused, at most the request
        timeout (a broker that does not answer must not hold a close or a rebalance up)."""
        committer = self._committer
        if committer is None:
            return
        timeout_s = self.bus.settings.request_timeout_s
        try:
            await asyncio.wait_for(asyncio.shield(committer), timeout_s)
        except TimeoutError:
            log.warning("%r: offsets acked may not be committed, the broker did not answer within "
                        "%.0f s: those deliveries come again", self, timeout_s)

    def _raise_commit_failure(self) -> None:
        failure, self._commit_failure = self._commit_failure, None
        if failure is not None:
            raise failure
