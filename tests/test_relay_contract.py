"""The stream relay contract, run against the in-process and the Redis relay: chunks in order
from the first whatever the subscriber's arrival, one channel per job, the end of a stream, the
quiet timeout, the lifecycle; plus what only Redis does (streams hash-tagged and expiring, shared
by separate relay objects as separate processes would hold them). Redis runs as one server and as a
Redis Cluster."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator
from pathlib import Path

import pytest

from support.redis_keys import REDIS_BACKENDS, redis_client, redis_url_of
from tidegate.coord.relay import CHANNEL_TTL_S, ChunkRelay, MemoryRelay, RedisRelay, relay_for
from tidegate.errors import QueueUnavailable

BACKENDS = ["memory", *REDIS_BACKENDS]


@pytest.fixture(params=BACKENDS, ids=BACKENDS)
async def relay(request: pytest.FixtureRequest) -> AsyncIterator[ChunkRelay]:
    """A fresh relay of each kind; the Redis one under a random name (`redis_name`)."""
    chosen: ChunkRelay
    if request.param == "memory":
        chosen = MemoryRelay()
    else:
        chosen = RedisRelay(redis_url_of(request, request.param), request.getfixturevalue("redis_name"))
    yield chosen
    await chosen.close()


async def _read_all(relay: ChunkRelay, job_id: str, timeout_s: float = 5.0) -> list[bytes]:
    return [chunk async for chunk in relay.subscribe(job_id, timeout_s=timeout_s)]


def _reading_begins(relay: ChunkRelay) -> asyncio.Event:
    """Set when a subscription of `relay` begins reading (the test's hook on the backend's
    `_subscribe`, which runs once the relay is open): the subscriber is under way then."""
    began = asyncio.Event()
    subscribe = relay._subscribe

    async def reading(job_id: str, timeout_s: float) -> AsyncGenerator[bytes, None]:
        began.set()
        async with contextlib.aclosing(subscribe(job_id, timeout_s)) as chunks:
            async for chunk in chunks:
                yield chunk

    relay._subscribe = reading  # type: ignore[method-assign]
    return began


# ---------------------------------------------------------------------- contract, both relays


async def test_a_late_subscriber_reads_every_chunk_from_the_first(relay: ChunkRelay) -> None:
    for chunk in (b'{"n":1}', b'{"n":2}', b'{"n":3}'):
        await relay.publish("job", chunk)
    await relay.finish("job")

    assert await _read_all(relay, "job") == [b'{"n":1}', b'{"n":2}', b'{"n":3}']
    assert await _read_all(relay, "job") == [b'{"n":1}', b'{"n":2}', b'{"n":3}']  # and again


async def test_an_early_subscriber_gets_chunks_as_they_arrive(relay: ChunkRelay) -> None:
    began = _reading_begins(relay)
    chunks = relay.subscribe("job", timeout_s=5.0)
    first = asyncio.ensure_future(anext(chunks))
    await asyncio.wait_for(began.wait(), 5)  # the subscriber reads before anything is published

    await relay.publish("job", b"a")
    assert await asyncio.wait_for(first, 5) == b"a"  # it arrives before the next is published
    await relay.publish("job", b"b")
    await relay.finish("job")

    assert [chunk async for chunk in chunks] == [b"b"]


async def test_jobs_have_channels_of_their_own(relay: ChunkRelay) -> None:
    await relay.publish("one", b"1")
    await relay.publish("two", b"2")
    await relay.finish("two")
    await relay.publish("one", b"11")
    await relay.finish("one")

    assert await _read_all(relay, "one") == [b"1", b"11"]
    assert await _read_all(relay, "two") == [b"2"]


async def test_a_finished_stream_without_chunks_ends_at_once(relay: ChunkRelay) -> None:
    await relay.finish("job")

    assert await _read_all(relay, "job") == []


async def test_a_quiet_stream_times_out(relay: ChunkRelay) -> None:
    await relay.publish("job", b"first")

    chunks: list[bytes] = []
    with pytest.raises(TimeoutError):
        async for chunk in relay.subscribe("job", timeout_s=0.2):
            chunks.append(chunk)
    assert chunks == [b"first"]


async def test_a_subscriber_may_stop_early(relay: ChunkRelay) -> None:
    await relay.publish("job", b"a")
    await relay.publish("job", b"b")

    stream = relay.subscribe("job", timeout_s=5)
    assert await anext(stream) == b"a"
    await stream.aclose()  # type: ignore[attr-defined]

    await relay.finish("job")
    assert await _read_all(relay, "job") == [b"a", b"b"]


async def test_a_closed_relay_refuses_use(relay: ChunkRelay) -> None:
    async with relay:
        await relay.publish("job", b"a")

    await relay.close()  # idempotent
    with pytest.raises(QueueUnavailable, match="closed"):
        await relay.publish("job", b"b")
    with pytest.raises(QueueUnavailable, match="closed"):
        await relay.finish("job")
    with pytest.raises(QueueUnavailable, match="closed"):
        await _read_all(relay, "job")
    with pytest.raises(QueueUnavailable, match="closed"):
        async with relay:
            pass


# ---------------------------------------------------------------------- Redis only


@pytest.mark.redis_only
async def test_two_relays_on_one_server_share_the_stream(redis_url: str, redis_name: str) -> None:
    # A worker's relay publishes, a gateway's (another object, as in another process) reads
    async with RedisRelay(redis_url, redis_name) as worker, \
            RedisRelay(redis_url, redis_name) as gateway:
        reader = asyncio.create_task(_read_all(gateway, "job"))
        await worker.publish("job", b"x")
        await worker.finish("job")
        assert await asyncio.wait_for(reader, 5) == [b"x"]


@pytest.mark.redis_only
async def test_streams_are_hash_tagged_and_expire(redis_url: str, redis_name: str) -> None:
    async with RedisRelay(redis_url, redis_name) as relay:
        await relay.publish("job", b"x")
    client = redis_client(redis_url)
    try:
        keys = [key async for key in client.scan_iter(match=f"*{redis_name}*")]
        assert keys == [f"tidegate:{{{redis_name}}}:chunks:job".encode()]
        assert 0 < await client.ttl(keys[0]) <= CHANNEL_TTL_S
    finally:
        await client.aclose()


@pytest.mark.redis_only
async def test_an_unreachable_redis_is_reported_without_the_password() -> None:
    async with RedisRelay("redis://:hunter2@127.0.0.1:1/0") as relay:
        with pytest.raises(QueueUnavailable, match="stream relay") as raised:
            await relay.publish("job", b"x")
    assert "hunter2" not in str(raised.value)


def test_the_factory_follows_the_queue_url(tmp_path: Path) -> None:
    local = relay_for(f"sqlite:///{tmp_path / 'q.db'}")
    shared = relay_for("redis://127.0.0.1:1/0?name=jobs&max_batch=5")

    assert isinstance(local, MemoryRelay)
    assert isinstance(shared, RedisRelay)
    assert shared.url == "redis://127.0.0.1:1/0"
    cluster = relay_for("redis+cluster://127.0.0.1:1?name=jobs")
    assert isinstance(cluster, RedisRelay) and cluster.url == "redis+cluster://127.0.0.1:1"


async def test_the_memory_relay_forgets_a_finished_channel_after_its_ttl_and_keeps_an_open_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import tidegate.coord.relay.memory

    monkeypatch.setattr(tidegate.coord.relay.memory, "CHANNEL_TTL_S", 0.0)  # over as soon as finished
    async with MemoryRelay() as relay:
        # Given a finished channel and one still being written
        await relay.publish("ended", b"a")
        await relay.finish("ended")
        await relay.publish("open", b"b")
        # When the next chunk of any job arrives (the relay forgets old channels as it works)
        await relay.publish("later", b"c")
        # Then the finished channel is gone, and the open one keeps its chunks for its reader
        assert set(relay._channels) == {"open", "later"}
        assert relay._channels["open"].chunks == [b"b"]
