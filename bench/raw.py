"""The limit: what redis-py and this redis-server do with no queue logic at all.

- round trip: sequential PING, the cost of one await on the server.
- single: LPUSH then RPOP, sequentially, per item: the two round trips that an enqueue followed
  by a claim needs at the very least (no lease, no record, no ack).
- batched: a pipeline of `batch` LPUSH, then a pipeline of `batch` RPOP: one command per item,
  two round trips per batch, the ceiling for per-job commands through this client.
"""

from __future__ import annotations

import time
import uuid

import redis.asyncio as aioredis

from bench.common import BATCHED, ROUND_TRIP, SINGLE, Result, check_count, percentile

SYSTEM = "raw redis-py"


async def raw_round_trips(url: str, count: int) -> Result:
    """Sequential PINGs per second, with their p50/p99."""
    client = aioredis.Redis.from_url(url)
    try:
        for _ in range(100):  # connect and warm the path
            await client.ping()
        samples: list[float] = []
        started = time.perf_counter()
        for _ in range(count):
            before = time.perf_counter()
            await client.ping()
            samples.append(time.perf_counter() - before)
        seconds = time.perf_counter() - started
    finally:
        await client.aclose()
    return Result(SYSTEM, ROUND_TRIP, count, seconds, percentile(samples, 0.5), percentile(samples, 0.99))


async def raw_single(url: str, count: int) -> Result:
    """LPUSH + RPOP per item, sequentially; latency is of the pair (compare enqueue→claim)."""
    client = aioredis.Redis.from_url(url)
    key = f"bench-raw-{uuid.uuid4().hex[:8]}"
    try:
        for i in range(100):
            await client.lpush(key, i)
            await client.rpop(key)
        samples: list[float] = []
        popped = set()
        started = time.perf_counter()
        for i in range(count):
            before = time.perf_counter()
            await client.lpush(key, i)
            item = await client.rpop(key)
            samples.append(time.perf_counter() - before)
            popped.add(item)
        seconds = time.perf_counter() - started
    finally:
        await client.delete(key)
        await client.aclose()
    check_count(SYSTEM, SINGLE, "distinct items popped", count, len(popped - {None}))
    return Result(SYSTEM, SINGLE, count, seconds, percentile(samples, 0.5), percentile(samples, 0.99))


async def raw_batched(url: str, count: int, batch: int) -> Result:
    """Pipelined LPUSH of a batch, then pipelined RPOP of it; items per second."""
    client = aioredis.Redis.from_url(url)
    key = f"bench-raw-{uuid.uuid4().hex[:8]}"
    try:
        await _push_pop(client, key, range(batch))  # warm-up
        popped: set[bytes] = set()
        started = time.perf_counter()
        for start in range(0, count, batch):
            popped.update(await _push_pop(client, key, range(start, min(start + batch, count))))
        seconds = time.perf_counter() - started
    finally:
        await client.delete(key)
        await client.aclose()
    check_count(SYSTEM, BATCHED, "distinct items popped", count, len(popped))
    return Result(SYSTEM, BATCHED, count, seconds)


async def _push_pop(client: aioredis.Redis, key: str, items: range) -> list[bytes]:
    async with client.pipeline(transaction=False) as pipe:
        for i in items:
            pipe.lpush(key, i)
        await pipe.execute()
    async with client.pipeline(transaction=False) as pipe:
        for _ in items:
            pipe.rpop(key)
        return [item for item in await pipe.execute() if item is not None]
