"""`debezium://`: an existing Debezium deployment feeds the cache. Events written as Debezium's
PostgreSQL connector writes them (no tidegate headers; schemaless and with JsonConverter's
schemas) go onto the session's Tansu broker, the sync consumes them, and the cache ends with
every column of every row as the table would hold them; replayed and late events never
overwrite newer ones."""

from __future__ import annotations

import uuid
from typing import Any
from urllib.parse import urlsplit

import orjson
import pytest

from support.sync import running
from support.waiting import eventually
from tidegate.app.sync import open_sync
from tidegate.config import SyncConfig, TidegateConfig
from tidegate.errors import ConfigError
from tidegate.sync.changes import Version

pytestmark = pytest.mark.timeout(60)

BASE_US = 1_772_600_767_000_000


def _event(prefix: str, op: str, lsn: int, *, before: Any = None, after: Any = None,
           txid: int = 700) -> dict[str, Any]:
    """An event as Debezium 2.7's PostgreSQL connector writes it (JsonConverter, schemaless)."""
    ts_us = BASE_US + lsn
    return {
        "before": before, "after": after,
        "source": {"version": "2.7.3.Final", "connector": "postgresql", "name": prefix,
                   "ts_ms": ts_us // 1000, "snapshot": "true" if op == "r" else "false",
                   "db": "shop", "sequence": f'["{lsn - 8}","{lsn}"]', "ts_us": ts_us,
                   "ts_ns": ts_us * 1000, "schema": "public", "table": "items", "txId": txid,
                   "lsn": lsn, "xmin": None},
        "transaction": None, "op": op, "ts_ms": ts_us // 1000 + 5, "ts_us": ts_us + 5000,
        "ts_ns": (ts_us + 5000) * 1000,
    }


def _with_schema(key: dict[str, Any], value: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Key and value as JsonConverter writes them with schemas.enable=true (schemas abridged to
    what a consumer needs: they are not read)."""
    return ({"schema": {"type": "struct", "name": "k", "optional": False,
                        "fields": [{"type": "int32", "optional": False, "field": "id"}]}, "payload": key},
            {"schema": {"type": "struct", "name": "Envelope", "optional": False, "fields": []},
             "payload": value})


def _row(id_: int, name: str, price: str) -> dict[str, Any]:
    return {"id": id_, "name": name, "price": price}


def _messages(prefix: str) -> list[tuple[dict[str, Any] | None, dict[str, Any] | None]]:
    """(key, value) in the order Debezium would write them, then replays; None is a tombstone."""
    old_1 = _event(prefix, "u", 2100, before=None, after=_row(1, "lamp", "2.00"))
    create_3 = _event(prefix, "c", 2000, after=_row(3, "shelf", "30.00"))
    return [
        ({"id": 1}, _event(prefix, "r", 1000, after=_row(1, "lamp", "1.00"), txid=600)),
        ({"id": 2}, _event(prefix, "r", 1000, after=_row(2, "desk", "99.00"), txid=600)),
        ({"id": 3}, create_3),
        ({"id": 1}, old_1),
        # the key of 2 changes to 20: a delete of the old key, its tombstone, a create of the new
        ({"id": 2}, _event(prefix, "d", 2200, before=_row(2, "desk", "99.00"))),
        ({"id": 2}, None),
        ({"id": 20}, _event(prefix, "c", 2200, after=_row(20, "desk", "99.00"))),
        ({"id": 3}, _event(prefix, "d", 2300, before={"id": 3, "name": None, "price": None})),
        ({"id": 3}, None),
        ({"id": 1}, _event(prefix, "u", 2400, before=_row(1, "lamp", "2.00"),
                           after=_row(1, "big lamp", "2.50"))),
        ({"id": 20}, _event(prefix, "u", 2500, after=_row(20, "oak desk", "120.00"))),
        # replays (a restarted connector re-sends from its last offset) after the newer events
        ({"id": 1}, old_1),
        ({"id": 3}, create_3),
    ]


EXPECTED = {"1": _row(1, "big lamp", "2.50"), "20": _row(20, "oak desk", "120.00")}
EXPECTED_VERSIONS = {"1": Version(2400, 0), "20": Version(2500, 0), "2": Version(2200, 0),
                     "3": Version(2300, 0)}


async def _produce(bootstrap: str, topic: str,
                   messages: list[tuple[dict[str, Any] | None, dict[str, Any] | None]]) -> None:
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=False)
    await producer.start()
    try:
        for index, (key, value) in enumerate(messages):
            if index % 2 and key is not None and value is not None:  # every other one with schemas
                key, value = _with_schema(key, value)
            await producer.send_and_wait(topic, key=orjson.dumps(key),
                                         value=None if value is None else orjson.dumps(value))
    finally:
        await producer.stop()


async def test_debeziums_events_reach_the_cache_exactly(request: pytest.FixtureRequest) -> None:
    # Given a sync fed by Debezium's topics (prefix = Debezium's topic.prefix)
    bus_url = request.getfixturevalue("kafka_broker").bus_url
    prefix = f"dbz{uuid.uuid4().hex[:8]}"
    sync = SyncConfig(source_url="debezium://", bus_url=f"{bus_url}&format=debezium&partitions=3",
                      tables=("items",), prefix=prefix)
    config = TidegateConfig.load(queue_url="sqlite:///unused.db").model_copy(update={"sync": sync})
    async with open_sync(config) as pipeline, running(pipeline):
        # When Debezium writes inserts, updates, deletes with tombstones, a key change and replays
        await _produce(urlsplit(bus_url).netloc, f"{prefix}.public.items", _messages(prefix))

        # Then every row of the cache is the table's, column by column, with the newest version
        async def cached() -> dict[str, Any]:
            return {e.entity_id: (e.data, e.version) async for e in pipeline.cache.scan("items")}

        want = {k: (row, EXPECTED_VERSIONS[k]) for k, row in EXPECTED.items()}
        await eventually(cached, "the cache holds the table's rows", until=lambda got: got == want,
                         timeout_s=30)
        await eventually(lambda: pipeline.applied_changes >= 11, "every event applied")
        for entity_id in ("2", "3"):
            entry = await pipeline.cache.get("items", entity_id)
            assert entry is not None and entry.deleted and entry.version == EXPECTED_VERSIONS[entity_id]
        assert await cached() == want  # the replays, applied after, changed nothing
    assert pipeline.bus.malformed == 0  # type: ignore[attr-defined]  # tombstones are not malformed


async def test_debezium_source_needs_a_debezium_format_kafka_bus() -> None:
    sync = SyncConfig(source_url="debezium://", bus_url="memory://", tables=("items",))
    config = TidegateConfig.load(queue_url="sqlite:///unused.db").model_copy(update={"sync": sync})
    with pytest.raises(ConfigError, match=r"kafka://host:port\?format=debezium"):
        async with open_sync(config):
            pass
