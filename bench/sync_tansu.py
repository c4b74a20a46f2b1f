"""How the Kafka-protocol broker the change-flow benchmark runs on (Tansu, in memory) answers the
Kafka bus's consumer: the figures behind the Kafka lines of BENCHMARKS.md's change-flow section.

    .venv/bin/python -m bench.sync_tansu            # about 2 minutes
    .venv/bin/python -m bench.sync_tansu --quick    # shorter partitions, about 40 s

On a private broker (`bench/tansu_broker.py`), with aiokafka as the bus uses it:

1. **Wake-up**: a consumer waits in a fetch (`fetch_max_wait_ms`) on an empty partition; a
   change is produced at a random moment; how long after its publish was acknowledged does the
   consumer get it? Apache Kafka answers a waiting fetch as soon as data arrives; a broker that
   only looks again at points within the wait adds up to the wait. Also: the broker's CPU while
   one consumer waits on 6 empty partitions (the polls' own cost).
2. **Fetch cost against partition length**: one partition filled with one-record batches (what
   small publishes spread over 6 partitions make), then the time to fetch its newest record,
   and the broker's CPU while one consumer waits at its end with each `fetch_max_wait_ms`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from bench.sync_servers import TansuBroker, kafka_broker, tansu_version

WAITS_MS = (500, 100, 20, 5)
VALUE = b"v" * 300  # about one change's JSON
WAKE_SAMPLES = 30


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _quantile(samples: Sequence[float], fraction: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


async def _topic(boot: str, name: str, partitions: int) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=boot)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(name, partitions, 1)])
    finally:
        await admin.close()


async def _consumer(boot: str, wait_ms: int, tps: Sequence[TopicPartition], at: int) -> AIOKafkaConsumer:
    consumer = AIOKafkaConsumer(bootstrap_servers=boot, enable_auto_commit=False, fetch_max_wait_ms=wait_ms)
    await consumer.start()
    consumer.assign(list(tps))
    for tp in tps:
        consumer.seek(tp, at)
    return consumer


async def _idle_cpu(broker: TansuBroker, consumer: AIOKafkaConsumer, seconds: float) -> float:
    """The broker's CPU, in % of a core, while `consumer` waits for data that does not come."""
    used, started = _cpu_s(broker.proc.pid), time.monotonic()
    assert not await consumer.getmany(timeout_ms=int(seconds * 1000))
    return 100 * (_cpu_s(broker.proc.pid) - used) / (time.monotonic() - started)


async def wake_up(broker: TansuBroker, producer: AIOKafkaProducer, wait_ms: int) -> str:
    """Publish acknowledged → fetched, for a consumer waiting on 6 empty partitions."""
    boot, topic = broker.bootstrap_servers, f"wake{wait_ms}"
    await _topic(boot, topic, 6)
    tps = [TopicPartition(topic, p) for p in range(6)]
    consumer = await _consumer(boot, wait_ms, tps, 0)
    try:
        idle = await _idle_cpu(broker, consumer, 2.0)
        latencies = []
        for _ in range(WAKE_SAMPLES):
            await asyncio.sleep(random.uniform(0.0, wait_ms / 1000 + 0.01))
            await producer.send_and_wait(topic, VALUE, partition=random.randrange(6))
            acked = time.perf_counter()
            assert await consumer.getmany(timeout_ms=10_000)
            latencies.append((time.perf_counter() - acked) * 1000)
    finally:
        await consumer.stop()
    return (f"| {wait_ms} | {_quantile(latencies, 0.5):.1f} | {_quantile(latencies, 0.9):.1f} | "
            f"{max(latencies):.1f} | {idle:.1f} % |")


async def fetch_cost(broker: TansuBroker, producer: AIOKafkaProducer, lengths: Sequence[int]) -> list[str]:
    """Fetch of the newest record, and the idle broker CPU per wait, as one partition grows."""
    boot, topic = broker.bootstrap_servers, "long"
    await _topic(boot, topic, 1)
    tp, written, rows = TopicPartition(topic, 0), 0, []
    for length in lengths:
        while written < length:  # one record per batch: each send waits for its acknowledgement
            await producer.send_and_wait(topic, VALUE, partition=0)
            written += 1
        consumer = await _consumer(boot, 100, [tp], written - 1)
        times = []
        try:
            for _ in range(5):
                consumer.seek(tp, written - 1)
                started = time.perf_counter()
                assert await consumer.getmany(timeout_ms=10_000, max_records=1)
                times.append((time.perf_counter() - started) * 1000)
        finally:
            await consumer.stop()
        idle = []
        for wait_ms in WAITS_MS:
            waiting = await _consumer(boot, wait_ms, [tp], written)
            try:
                idle.append(await _idle_cpu(broker, waiting, 2.0))
            finally:
                await waiting.stop()
        rows.append(f"| {length:,} | {min(times):.1f} | {_quantile(times, 0.5):.1f} | "
                    + " | ".join(f"{cpu:.0f} %" for cpu in idle) + " |")
    return rows


async def run(quick: bool) -> None:
    """Both measurements on one private broker; markdown tables on stdout."""
    lengths = (1_000, 5_000, 10_000) if quick else (1_000, 5_000, 10_000, 20_000, 40_000)
    with kafka_broker() as broker:
        producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap_servers, acks="all")
        await producer.start()
        try:
            print(f"{tansu_version()}, aiokafka consumer and producer (acks=all)\n")
            print("**Wake-up: publish acknowledged → fetched by a consumer waiting on 6 empty partitions**\n")
            print("| fetch_max_wait_ms | p50 ms | p90 ms | max ms | broker CPU, consumer idle |")
            print("|---:|---:|---:|---:|---:|")
            for wait_ms in WAITS_MS:
                print(await wake_up(broker, producer, wait_ms), flush=True)
            print("\n**Fetch cost against partition length (one-record batches)**\n")
            print("| batches in the partition | fetch newest, min ms | median ms | "
                  + " | ".join(f"broker CPU idle, wait {w} ms" for w in WAITS_MS) + " |")
            print("|" + "---:|" * (3 + len(WAITS_MS)))
            for row in await fetch_cost(broker, producer, lengths):
                print(row, flush=True)
        finally:
            await producer.stop()


def main(argv: Sequence[str] | None = None) -> int:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="partitions up to 10,000 batches")
    args = parser.parse_args(argv)
    asyncio.run(run(args.quick))
    return 0


if __name__ == "__main__":
    sys.exit(main())
