import redis
from conftest import QueueFactory

def test_ping(redis_server: str) -> None:
    with redis.Redis.from_url(redis_server) as c:
        assert c.ping()
        print(redis_server, c.info("server")["tcp_port"])
    assert not redis_server.endswith(":6379/0")

async def test_factory_shape(queue_factory: QueueFactory) -> None:
    assert queue_factory.backend in ("sqlite", "redis")
    print(queue_factory.url, queue_factory.queue_name)

import pytest

@pytest.mark.redis_only
async def test_only_redis(queue_factory: QueueFactory) -> None:
    assert queue_factory.backend == "redis"

@pytest.mark.sqlite_only
async def test_only_sqlite(queue_factory: QueueFactory) -> None:
    assert queue_factory.backend == "sqlite"
