"""Reaching what a test wrote to the session's redis-server or Redis Cluster, and removing it.

The servers live for the whole session; dropping each test's keys keeps their memory flat. Every
test names its keys with a random queue name or prefix, so a pattern that contains it cannot
touch another test's keys.

`redis_client(url)` and `sync_redis_client(url)` open a plain redis-py client for a tidegate
Redis URL, a cluster client for `redis+cluster://` (its SCAN walks every master)."""

from __future__ import annotations

import asyncio
from typing import Any
from urllib.parse import urlsplit

from tidegate._redis import CLUSTER_SCHEMES


def _driver_url(url: str) -> tuple[str, bool]:
    """The URL redis-py reads, and whether it is a cluster's."""
    parts = urlsplit(url)
    if parts.scheme in CLUSTER_SCHEMES:
        return parts._replace(scheme=CLUSTER_SCHEMES[parts.scheme]).geturl(), True
    return url, False


def redis_client(url: str, **options: Any) -> Any:
    """An asyncio redis-py client for `url` (a RedisCluster for a cluster's URL); close it."""
    driver_url, cluster = _driver_url(url)
    if cluster:
        from redis.asyncio.cluster import RedisCluster

        return RedisCluster.from_url(driver_url, **options)
    import redis.asyncio as aioredis

    return aioredis.Redis.from_url(driver_url, **options)


def sync_redis_client(url: str, **options: Any) -> Any:
    """A synchronous redis-py client for `url` (a RedisCluster for a cluster's URL)."""
    driver_url, cluster = _driver_url(url)
    if cluster:
        from redis.cluster import RedisCluster

        return RedisCluster.from_url(driver_url, **options)
    import redis

    return redis.Redis.from_url(driver_url, **options)


def delete_keys_now(url: str, match: str, *also: str) -> None:
    """Delete every key that matches the glob `match` (`*t1a2b*`, `{prefix:*`), and the keys in
    `also` (for synchronous fixtures)."""
    with sync_redis_client(url) as client:
        keys: list[bytes | str] = list(client.scan_iter(match=match, count=1_000))
        keys.extend(also)
        # One UNLINK per key: a cluster refuses a multi-key command whose keys span slots.
        with client.pipeline(transaction=False) as pipe:
            for key in keys:
                pipe.unlink(key)
            pipe.execute()


async def delete_keys(url: str, match: str, *also: str) -> None:
    """`delete_keys_now` without blocking the event loop."""
    await asyncio.to_thread(delete_keys_now, url, match, *also)
