"""Every RedisClient packs its commands with hiredis: the bytes on the wire are the ones redis-py's
own asyncio connection would send, and what it refuses is refused the same way."""

from __future__ import annotations

from typing import Any

import pytest
from redis.asyncio.connection import Connection
from redis.exceptions import DataError

from tidegate._redis import RedisClient
from tidegate.errors import QueueUnavailable

CASES: list[tuple[Any, ...]] = [
    ("EVALSHA", "a" * 40, 2, "tidegate:{q}:jobs", b"tidegate:{q}:leased:0", "worker", 30_000),
    ("SET", "k", 1.5, 10**20, -3, 0.1, 1e20, float("inf"), "é"),
    ("HSET", b"h", memoryview(b"view"), bytearray(b"buffer")),
    ("SCRIPT LOAD", "return 1"),  # a name of two words goes out as two arguments
    (b"CONFIG GET", "maxmemory"),
]


def client_connection(url: str = "redis://127.0.0.1:1/0") -> Any:
    client = RedisClient(url, what="test", unavailable=QueueUnavailable, max_connections=2)
    return client.client.connection_pool.connection_class()


@pytest.mark.parametrize("args", CASES)
def test_packed_bytes_match_redis_py(args: tuple[Any, ...]) -> None:
    assert b"".join(client_connection().pack_command(*args)) == b"".join(Connection().pack_command(*args))


@pytest.mark.parametrize("bad", [None, True, object()])
def test_an_argument_redis_py_refuses_is_a_data_error(bad: object) -> None:
    with pytest.raises(DataError):
        client_connection().pack_command("SET", "k", bad)


def test_the_url_still_chooses_the_connection_kind() -> None:
    from redis.asyncio.connection import SSLConnection, UnixDomainSocketConnection

    assert isinstance(client_connection("rediss://127.0.0.1:1/0"), SSLConnection)
    assert isinstance(client_connection("unix:///tmp/none.sock"), UnixDomainSocketConnection)


@pytest.mark.parametrize(("url", "kind"), [("redis+cluster://127.0.0.1:1/0", "Connection"),
                                           ("rediss+cluster://127.0.0.1:1/0", "SSLConnection")])
def test_a_cluster_url_opens_a_cluster_client_whose_nodes_pack_with_hiredis(url: str, kind: str) -> None:
    from redis.asyncio import connection
    from redis.asyncio.cluster import ClusterNode, RedisCluster

    client = RedisClient(url, what="test", unavailable=QueueUnavailable).client
    assert isinstance(client, RedisCluster)
    # The seed node, and every node the client discovers later, build their connections so.
    for connection_class in (client.startup_nodes[0].connection_class,
                             ClusterNode("127.0.0.1", 2, **client.connection_kwargs).connection_class):
        assert issubclass(connection_class, getattr(connection, kind))
        assert connection_class.__name__ == f"Hiredis{kind}"
        assert b"".join(connection_class(host="127.0.0.1").pack_command(*CASES[0])) == \
            b"".join(Connection().pack_command(*CASES[0]))
