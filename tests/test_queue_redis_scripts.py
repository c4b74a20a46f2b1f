"""The Redis queue's scripts carry exactly the keys they name: each script's `-- KEYS:` line
gives the KEYS a call sends (every one under the queue's hash tag) and the table `K` the script
reads them from, and reading a key the script did not name fails instead of touching a nil key."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from tidegate._redis import key_prefix
from tidegate.queue import _lua
from tidegate.queue.redis import _SCRIPTS
from tidegate.queue.settings import QueueSettings

KNOWN = {"jobs", "payloads", "results", "idem", "seq", "deadlines", "aging", "turns", "finished", "answered",
         "dead", "due", "ready", "leased", "signal", "waiting", "delayed"}  # lua/_common.lua's list
PREFIX = key_prefix("scripts")


@pytest.fixture
async def client(redis_server: str) -> AsyncIterator[Any]:
    redis = aioredis.Redis.from_url(redis_server)
    try:
        yield redis
    finally:
        await redis.aclose()


def script(body: str) -> _lua.QueueScript:
    return _lua.compose(body, PREFIX, QueueSettings(name="scripts"), PREFIX + "done")


@pytest.mark.parametrize("name", _SCRIPTS)
def test_every_script_sends_known_keys_of_its_queue_once(name: str) -> None:
    built = _lua.queue_script(name, PREFIX, QueueSettings(name="scripts"), PREFIX + "done")
    assert built.keys, f"{name} sends no keys"
    assert len(set(built.keys)) == len(built.keys)
    for key in built.keys:
        assert key.startswith("tidegate:{scripts}:")  # one hash tag: one Redis Cluster slot
        assert key.removeprefix(PREFIX).split(":")[0] in KNOWN


def test_the_single_job_path_sends_only_what_it_touches() -> None:
    settings = QueueSettings(name="scripts")
    complete = _lua.queue_script("complete", PREFIX, settings, PREFIX + "done")
    assert [key.removeprefix(PREFIX) for key in complete.keys] == [
        "jobs", "results", "finished", "answered", *(f"leased:{level}" for level in range(5))]
    for name in ("enqueue", "claim"):
        sent = {key.removeprefix(PREFIX) for key in _lua.queue_script(name, PREFIX, settings, "").keys}
        assert "results" not in sent  # neither reads nor writes results
        assert len(sent) < 35


async def test_a_script_reads_its_keys_by_name(client: Any) -> None:
    built = script("-- KEYS: jobs ready:0..4\n-- ARGV: none.\nreturn {K.jobs, K.ready[0], K.ready[4]}")
    assert await client.eval(built.source, len(built.keys), *built.keys) == [
        f"{PREFIX}jobs".encode(), f"{PREFIX}ready:0".encode(), f"{PREFIX}ready:4".encode()]


@pytest.mark.parametrize(("body", "missing"), [
    ("return redis.call('ZCARD', K.dead)", "key dead"),
    ("return redis.call('ZCARD', K.ready[5])", "ready level 5"),
    ("return load(K, 'x')", "key jobs"),  # a helper reaches only the keys it is given
])
async def test_a_key_the_script_did_not_name_fails_loudly(client: Any, body: str, missing: str) -> None:
    built = script(f"-- KEYS: finished ready:0..4\n-- ARGV: none.\n{body}")
    with pytest.raises(ResponseError, match=f"{missing} is not among its KEYS"):
        await client.eval(built.source, len(built.keys), *built.keys)


@pytest.mark.parametrize("header", [
    "-- KEYS: jobs\nreturn 1",  # no ARGV line ends the list
    "-- KEYS: jobs ready:0..3\n-- ARGV: none.",  # families are the five levels
    "-- ARGV: none.",  # no KEYS line at all
])
def test_a_malformed_keys_line_is_refused(header: str) -> None:
    with pytest.raises(ValueError, match="queue script"):
        _lua.key_names(header)


def test_settings_are_constants_of_the_script() -> None:
    settings = QueueSettings(name="scripts", tenant_round_robin=True, aging_interval_s=1.5,
                             max_depth={2: 10})
    source = _lua.compose("-- KEYS: jobs\n-- ARGV: none.\nreturn 1", PREFIX, settings, "a'b").source
    assert "local ROUND_ROBIN = true" in source
    assert "local AGING_MS = 1500" in source
    assert "local DONE_CHANNEL = 'a\\39b'" in source
    assert "[2] = 10" in source
