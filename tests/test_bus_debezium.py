"""`format=debezium` on the kafka:// and redis:// buses: what they publish is Debezium's envelope,
field by field against hand-written events (read raw off the session's Tansu broker and
redis-server), and tidegate's own consumers read it back as the very changes published.
The PostgreSQL source end to end over these buses is in test_sync_pipeline.py."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

import orjson
import pytest

import tidegate
from support.redis_keys import delete_keys, redis_client
from support.waiting import eventually
from tidegate.errors import ConfigError
from tidegate.sync.buses.base import BusBase, bus_for
from tidegate.sync.changes import MAX_ORDINAL, Change, Op, Version

pytestmark = pytest.mark.timeout(60)

BACKENDS = ["redis", "kafka"]
FAST: dict[str, Any] = {"partitions": 1, "session_timeout_s": 2.0, "heartbeat_interval_s": 0.2,
                        "request_timeout_s": 5.0, "reclaim_idle_s": 0.5, "reclaim_interval_s": 0.1}
COMMIT = datetime(2026, 3, 4, 5, 6, 7, 890123, tzinfo=UTC)
COMMIT_US = 1_772_600_767_890_123  # COMMIT in epoch microseconds
SEEN_S = 1_772_600_768.5  # when the source saw the changes (captured_at)
SEEN_US = 1_772_600_768_500_000


def _change(op: Op, version: Version, *, after: dict[str, Any] | None = None,
            before: dict[str, Any] | None = None, xid: int | None = 7,
            entity_type: str = "products", unchanged: tuple[str, ...] = ()) -> Change:
    change = Change.of_row(entity_type=entity_type, op=op, key_columns=["id"], version=version,
                           commit_time=COMMIT, after=after, before=before, xid=xid,
                           captured_at=SEEN_S, unchanged=unchanged)
    return change


ROW_1 = {"id": 1, "name": "lamp", "price": "12.50", "seen": "2026-03-04T05:06:07.890123Z"}
ROW_2 = {"id": 2, "name": "desk", "price": "99.00", "seen": None}
ROW_2B = {**ROW_2, "name": "big desk"}
ROW_2C = {**ROW_2, "name": "bigger desk", "price": "120.00"}

# The sequence every test publishes: a snapshot read, an insert, an update without and one with
# the old row (REPLICA IDENTITY FULL), a delete without and one with the old row, a truncate.
CHANGES = [
    _change(Op.INSERT, Version(100, MAX_ORDINAL), after=ROW_1, xid=None),
    _change(Op.INSERT, Version(200, 0), after=ROW_2),
    _change(Op.UPDATE, Version(300, 0), after=ROW_2B),
    _change(Op.UPDATE, Version(300, 1), after=ROW_2C, before=ROW_2B),
    _change(Op.DELETE, Version(400, 0), before={"id": 1}),
    _change(Op.DELETE, Version(410, 0), before=ROW_2C),
    _change(Op.TRUNCATE, Version(500, 0)),
]


def _source(lsn: int, *, snapshot: str = "false", txid: int | None = 7) -> dict[str, Any]:
    return {"version": tidegate.__version__, "connector": "postgresql", "name": "PREFIX",
            "ts_ms": COMMIT_US // 1000, "snapshot": snapshot, "db": "shop", "sequence": None,
            "ts_us": COMMIT_US, "ts_ns": COMMIT_US * 1000, "schema": "public", "table": "products",
            "txId": txid, "lsn": lsn, "xmin": None}


def _event(op: str, before: Any, after: Any, source: dict[str, Any]) -> dict[str, Any]:
    return {"before": before, "after": after, "source": source, "op": op, "ts_ms": SEEN_US // 1000,
            "ts_us": SEEN_US, "ts_ns": SEEN_US * 1000, "transaction": None}


# (key, value) of every message, in order, written out by hand from Debezium's documentation;
# None stands for a tombstone's value (Kafka only).
EXPECTED: list[tuple[Any, Any]] = [
    ({"id": 1}, _event("r", None, ROW_1, _source(100, snapshot="true", txid=None))),
    ({"id": 2}, _event("c", None, ROW_2, _source(200))),
    ({"id": 2}, _event("u", None, ROW_2B, _source(300))),
    ({"id": 2}, _event("u", ROW_2B, ROW_2C, _source(300))),
    ({"id": 1}, _event("d", {"id": 1}, None, _source(400))),
    ({"id": 1}, None),
    ({"id": 2}, _event("d", ROW_2C, None, _source(410))),
    ({"id": 2}, None),
    (None, _event("t", None, None, _source(500))),
]


def _expected(prefix: str, *, tombstones: bool) -> list[tuple[Any, Any]]:
    out = []
    for key, value in EXPECTED:
        if value is None:
            if tombstones:
                out.append((key, None))
            continue
        out.append((key, orjson.loads(orjson.dumps(value).replace(b'"PREFIX"', f'"{prefix}"'.encode()))))
    return out


class DebeziumBuses:
    """Opens format=debezium buses on one backend under this test's own prefix."""

    def __init__(self, backend: str, url: str) -> None:
        self.backend = backend
        self.url = url
        self.prefix = f"t{uuid.uuid4().hex[:12]}"
        self.opened: list[BusBase] = []
        self.topic_name: str | None = None  # another table's topic than the products'

    async def open(self, **options: Any) -> BusBase:
        """An opened bus publishing Debezium's format; options are BusSettings fields."""
        bus = bus_for(self.url, prefix=self.prefix, **{**FAST, "format": "debezium",
                                                       "database": "shop", **options})
        assert isinstance(bus, BusBase)
        await bus.__aenter__()
        self.opened.append(bus)
        return bus

    @property
    def topic(self) -> str:
        """Where the products' changes go: Debezium's `<topic.prefix>.<schema>.<table>`."""
        return self.topic_name or f"{self.prefix}.public.products"

    async def raw(self, count: int) -> list[tuple[bytes | None, bytes | None, dict[str, bytes]]]:
        """The first `count` messages of the topic or stream as they are stored: key, value,
        headers (Kafka) or the entry's other fields (Redis)."""
        if self.backend == "kafka":
            return await self._raw_kafka(count)
        client = redis_client(self.url)
        try:
            entries = await client.xrange(self.topic)
        finally:
            await client.aclose()
        out = []
        for _id, fields in entries[:count]:
            rest = {k.decode(): v for k, v in fields.items() if k not in (b"key", b"value")}
            out.append((fields.get(b"key"), fields.get(b"value"), rest))
        return out

    async def _raw_kafka(self, count: int) -> list[tuple[bytes | None, bytes | None, dict[str, bytes]]]:
        from aiokafka import AIOKafkaConsumer

        consumer = AIOKafkaConsumer(self.topic, bootstrap_servers=urlsplit(self.url).netloc,
                                    auto_offset_reset="earliest", group_id=None, fetch_max_wait_ms=20)
        await consumer.start()
        got: list[tuple[bytes | None, bytes | None, dict[str, bytes]]] = []
        try:
            async def enough() -> bool:
                batches = await consumer.getmany(timeout_ms=200)
                got.extend((r.key, r.value, dict(r.headers)) for rs in batches.values() for r in rs)
                return len(got) >= count

            await eventually(enough, f"{count} messages on {self.topic}", timeout_s=20)
        finally:
            await consumer.stop()
        return got[:count]

    async def aclose(self) -> None:
        """Close every bus opened here."""
        while self.opened:
            await self.opened.pop().__aexit__(None, None, None)


@pytest.fixture(params=BACKENDS)
async def buses(request: pytest.FixtureRequest) -> AsyncIterator[DebeziumBuses]:
    """DebeziumBuses on the session's redis-server or Tansu broker."""
    if request.param == "redis":
        factory = DebeziumBuses("redis", request.getfixturevalue("redis_server"))
    else:
        factory = DebeziumBuses("kafka", request.getfixturevalue("kafka_broker").bus_url)
    try:
        yield factory
    finally:
        await factory.aclose()
        if factory.backend == "redis":
            await delete_keys(factory.url, f"{factory.prefix}.*")


def _decoded(raw: list[tuple[bytes | None, bytes | None, dict[str, bytes]]]) -> list[tuple[Any, Any]]:
    return [(None if k is None else orjson.loads(k), None if v is None else orjson.loads(v))
            for k, v, _ in raw]


async def test_each_change_is_published_as_debeziums_envelope(buses: DebeziumBuses) -> None:
    # Given a debezium-format bus; When the sequence is published
    bus = await buses.open()
    await bus.publish(CHANGES)
    # Then the topic (stream) holds Debezium's events, and on Kafka a tombstone after each delete
    expected = _expected(buses.prefix, tombstones=buses.backend == "kafka")
    raw = await buses.raw(len(expected))
    got = _decoded(raw)
    assert len(got) == len(expected)
    for index, ((key, value), (want_key, want_value)) in enumerate(zip(got, expected, strict=True)):
        assert key == want_key, f"message {index}"
        if want_value is None:
            assert value is None, f"message {index} is a tombstone"
            continue
        assert set(value) == set(want_value), f"message {index}"
        for name, want in want_value.items():
            assert value[name] == want, f"message {index}, field {name}"
    # and tidegate's version and entity id ride beside each event
    assert [(h["tidegate.version"], h["tidegate.entity_id"]) for _, v, h in raw if v is not None] == [
        (c.version.key.encode(), c.entity_id.encode()) for c in CHANGES]


async def test_schemas_enable_wraps_key_and_value_as_jsonconverter_does(buses: DebeziumBuses) -> None:
    bus = await buses.open(schemas=True)
    await bus.publish(CHANGES[1:2])
    ((key, value, _),) = await buses.raw(1)
    key_msg, value_msg = orjson.loads(key or b""), orjson.loads(value or b"")
    topic = buses.topic
    assert key_msg == {"schema": {"type": "struct", "optional": False, "name": f"{topic}.Key",
                                  "fields": [{"type": "int64", "optional": False, "field": "id"}]},
                       "payload": {"id": 2}}
    assert value_msg["payload"] == _expected(buses.prefix, tombstones=False)[1][1]
    schema = value_msg["schema"]
    assert (schema["type"], schema["name"]) == ("struct", f"{topic}.Envelope")
    assert [f["field"] for f in schema["fields"]] == [
        "before", "after", "source", "op", "ts_ms", "ts_us", "ts_ns", "transaction"]
    after = schema["fields"][1]
    assert after["name"] == f"{topic}.Value"
    assert after["fields"] == [
        {"type": "int64", "optional": False, "field": "id"},
        {"type": "string", "optional": True, "field": "name"},
        {"type": "string", "optional": True, "field": "price"},
        {"type": "string", "optional": True, "field": "seen"},
    ]
    assert schema["fields"][2]["name"] == "io.debezium.connector.postgresql.Source"


@pytest.mark.parametrize("schemas", [False, True], ids=["schemaless", "schemas"])
async def test_tidegates_consumers_read_back_the_very_changes_published(
        buses: DebeziumBuses, schemas: bool) -> None:
    # Given changes including one whose unchanged TOAST column PostgreSQL did not send
    toast = _change(Op.UPDATE, Version(600, 0), after={"id": 3, "name": "shelf"}, unchanged=("body",))
    changes = [*CHANGES, toast, _change(Op.INSERT, Version(700, 0), after={"id": 4, "name": "x"},
                                        entity_type="stock.items")]
    bus = await buses.open(schemas=schemas)
    await bus.publish(changes)
    # When a tidegate consumer reads the bus
    got: list[Change] = []
    async with bus.subscribe("g", "c1", ["products", "stock.items"]) as sub:
        async def all_arrived() -> bool:
            batch = await sub.fetch(100, timeout_s=0.2)
            await sub.ack(batch)
            got.extend(d.change for d in batch)
            return len(got) >= len(changes)

        await eventually(all_arrived, "every change delivered", timeout_s=20)
    # Then it has every change exactly as published (tombstones are not changes), checksums too
    assert sorted(got, key=lambda c: c.version) == changes
    assert [c.checksum for c in sorted(got, key=lambda c: c.version)] == [c.checksum for c in changes]
    assert bus.malformed == 0


async def test_tombstones_can_be_turned_off(request: pytest.FixtureRequest) -> None:
    buses = DebeziumBuses("kafka", request.getfixturevalue("kafka_broker").bus_url)
    try:
        bus = await buses.open(tombstones=False)
        await bus.publish(CHANGES)
        assert _decoded(await buses.raw(7)) == _expected(buses.prefix, tombstones=False)
    finally:
        await buses.aclose()


def test_the_memory_bus_refuses_the_debezium_format() -> None:
    with pytest.raises(ConfigError, match="memory://"):
        bus_for("memory://?format=debezium")


def test_an_unknown_format_is_refused_naming_the_setting() -> None:
    with pytest.raises(ConfigError, match="format"):
        bus_for("kafka://127.0.0.1:9092?format=avro")


# ---------------------------------------------------------------------- the PostgreSQL source

PG_TABLE = """
CREATE TABLE gadgets (id integer PRIMARY KEY, name text NOT NULL, price numeric(10, 2),
                      seen timestamptz);
ALTER TABLE gadgets REPLICA IDENTITY FULL;
INSERT INTO gadgets VALUES (1, 'lamp', 12.5, '2026-03-04 05:06:07.890123+00');
"""


async def test_the_postgresql_source_publishes_debeziums_events(
        pg_dsn: str, request: pytest.FixtureRequest) -> None:
    # Given a table with REPLICA IDENTITY FULL and one row, synced over a debezium-format Kafka bus
    from support.sync import in_one_transaction, pg_url, running
    from tidegate.app.sync import open_sync
    from tidegate.config import SyncConfig, TidegateConfig

    in_one_transaction(pg_dsn, PG_TABLE)
    suffix = uuid.uuid4().hex[:8]
    buses = DebeziumBuses("kafka", request.getfixturevalue("kafka_broker").bus_url)
    buses.prefix = f"t{suffix}"
    sync = SyncConfig(source_url=pg_url(pg_dsn), bus_url=f"{buses.url}&format=debezium",
                      tables=("gadgets",), slot=f"s_{suffix}", publication=f"p_{suffix}",
                      prefix=buses.prefix, heartbeat_s=None)
    config = TidegateConfig.load(queue_url="sqlite:///unused.db").model_copy(update={"sync": sync})
    async with open_sync(config) as pipeline, running(pipeline):
        await eventually(lambda: pipeline.cache.get("gadgets", "1"), "the snapshot is cached")
        # When a row is inserted, updated and deleted
        in_one_transaction(pg_dsn, "INSERT INTO gadgets VALUES (2, 'desk', 99, NULL)")
        in_one_transaction(pg_dsn, "UPDATE gadgets SET price = 120.5 WHERE id = 2")
        in_one_transaction(pg_dsn, "DELETE FROM gadgets WHERE id = 2")
        buses.topic_name = f"{buses.prefix}.public.gadgets"
        raw = await buses.raw(5)
    # Then the topic holds Debezium's events: read, create, update with the old row, delete, tombstone
    events = _decoded(raw)
    lamp = {"id": 1, "name": "lamp", "price": "12.50", "seen": "2026-03-04T05:06:07.890123Z"}
    desk = {"id": 2, "name": "desk", "price": "99.00", "seen": None}
    desk2 = {**desk, "price": "120.50"}
    assert [(k, v and (v["op"], v["before"], v["after"])) for k, v in events] == [
        ({"id": 1}, ("r", None, lamp)),
        ({"id": 2}, ("c", None, desk)),
        ({"id": 2}, ("u", desk, desk2)),
        ({"id": 2}, ("d", desk2, None)),
        ({"id": 2}, None),
    ]
    database = urlsplit(pg_url(pg_dsn)).path.strip("/")
    for _key, value in events[:4]:
        assert value is not None
        source = value["source"]
        assert {k: source[k] for k in ("connector", "name", "db", "schema", "table", "version")} == {
            "connector": "postgresql", "name": buses.prefix, "db": database, "schema": "public",
            "table": "gadgets", "version": tidegate.__version__}
        assert source["snapshot"] == ("true" if value["op"] == "r" else "false")
        assert isinstance(source["lsn"], int) and source["lsn"] > 0
        assert source["ts_ms"] == source["ts_us"] // 1000
        assert value["transaction"] is None
    lsns = [value["source"]["lsn"] for _, value in events[1:4] if value is not None]
    assert lsns == sorted(lsns) and len(set(lsns)) == 3  # three transactions, in commit order
    assert all(isinstance(value["source"]["txId"], int) for _, value in events[1:4] if value)
