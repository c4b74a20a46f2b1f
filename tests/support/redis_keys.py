"""Reaching what a test wrote to the session's redis-server or Redis Cluster, and removing it.

The servers live for the whole session; dropping each test's keys keeps their memory flat. Every
test names its keys with a random queue name or prefix, so a pattern that contains it cannot
touch another test's keys.

`redis_client(url)` opens an asyncio redis-py client for a tidegate Redis URL, a cluster client
for `redis+cluster://` (its SCAN walks every master).
`redis_url_of(request, backend)` is the session server of a Redis backend id, so that a suite
parametrized over backends runs on the redis-server and on the Redis Cluster alike."""

from __future__ import annotations

import asyncio
from typing import Any
from urllib.parse import urlsplit

import pytest

from tidegate._redis import CLUSTER_SCHEMES

REDIS_BACKENDS = ("redis", "redis-cluster")  # backend ids of the suites' parametrizations
# Backend id → the session fixture that serves it (see tests/conftest.py).
SERVER_FIXTURES = {"redis": "redis_server", "redis-cluster": "redis_cluster_url"}


def redis_url_of(request: pytest.FixtureRequest, backend: str) -> str:
    """The URL of the session's server for a Redis backend id, requested lazily so that a run
    without that backend starts no server."""
    url: str = request.getfixturevalue(SERVER_FIXTURES[backend])
    return url


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
    """A synchronous redis-py client for a one-server `url`."""
    import redis

    return redis.Redis.from_url(url, **options)


def _owners(url: str, keys: tuple[str, ...]) -> dict[str, list[str]]:
    """The URL of every master of the cluster `url` names (of the server itself otherwise), each
    with those of `keys` it serves."""
    driver_url, cluster = _driver_url(url)
    if not cluster:
        return {url: list(keys)}
    parts = urlsplit(driver_url)
    with sync_redis_client(driver_url, decode_responses=True) as seed:
        ranges = [(start, end, parts._replace(netloc=f"{master[0] or parts.hostname}:{master[1]}").geturl())
                  for start, end, master, *_ in seed.execute_command("CLUSTER SLOTS")]
        slots = {key: int(seed.execute_command("CLUSTER KEYSLOT", key)) for key in keys}
    owners: dict[str, list[str]] = {master: [] for _, _, master in ranges}
    for key, slot in slots.items():
        owners[next(master for start, end, master in ranges if start <= slot <= end)].append(key)
    return owners


def delete_keys_now(url: str, match: str, *also: str) -> None:
    """Delete every key that matches the glob `match` (`*t1a2b*`, `{prefix:*`), and the keys in
    `also` (for synchronous fixtures). On a cluster, each master is scanned for its own keys."""
    for master, own in _owners(url, also).items():
        with sync_redis_client(master) as client:
            keys: list[bytes | str] = [*client.scan_iter(match=match, count=1_000), *own]
            # One UNLINK per key: a cluster refuses a multi-key command whose keys span slots.
            with client.pipeline(transaction=False) as pipe:
                for key in keys:
                    pipe.unlink(key)
                pipe.execute()


async def delete_keys(url: str, match: str, *also: str) -> None:
    """`delete_keys_now` without blocking the event loop."""
    await asyncio.to_thread(delete_keys_now, url, match, *also)
