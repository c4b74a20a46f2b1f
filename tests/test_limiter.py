"""The rate limiter contract, run against the in-process and the Redis limiter (one server and a
Redis Cluster), plus what only Redis promises (one limit shared by instances and OS processes) and
the AIMD concurrency window.

Times are measured with real clocks over short periods (period_s=1.0). Admission times seen by a
client trail the limiter's decision by a scheduling or network delay that varies, so windows are
checked a little shorter than the period (JITTER_S): that cannot hide a limiter admitting even
one unit too many, which would show up a whole emission interval (50 ms here) early."""

from __future__ import annotations

import asyncio
import itertools
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from support.redis_keys import REDIS_BACKENDS, redis_client, redis_url_of
from support.waiting import eventually
from tidegate.coord.limiter import (
    DEFAULT_BURST_FRACTION,
    AdaptiveConcurrency,
    LocalRateLimiter,
    RateLimiter,
    RedisRateLimiter,
    burst_capacity,
    rate_limiter_for,
)
from tidegate.coord.limiter.redis import KnownPauses
from tidegate.errors import ConfigError, DispatchClosed, DispatchUnavailable

ROOT = Path(__file__).resolve().parent.parent
KEY = "sim/gpt-4.1"
PERIOD_S = 1.0
RPM = 20  # per PERIOD_S: one request every 50 ms
JITTER_S = 0.05


@pytest.fixture(params=["memory", *REDIS_BACKENDS])
async def limiter(request: pytest.FixtureRequest) -> AsyncIterator[RateLimiter]:
    """A fresh limiter of each kind; the Redis one under a random name (`redis_name`)."""
    chosen: RateLimiter
    if request.param == "memory":
        chosen = LocalRateLimiter()
    else:
        chosen = RedisRateLimiter(redis_url_of(request, request.param), request.getfixturevalue("redis_name"))
    yield chosen
    await chosen.close()


async def _drive(
    limiters: list[RateLimiter], *, duration_s: float, tokens: int = 1, rpm: int | None = RPM,
    tpm: int | None = None, callers: int = 4,
) -> list[float]:
    """Acquire from `callers` tasks per limiter as fast as allowed; the admission times."""
    admitted: list[float] = []
    end = time.monotonic() + duration_s

    async def caller(limiter: RateLimiter) -> None:
        while True:
            wait_s = await limiter.acquire(KEY, tokens=tokens, rpm=rpm, tpm=tpm, period_s=PERIOD_S)
            now = time.monotonic()
            if wait_s == 0:
                admitted.append(now)
            if now >= end:
                return
            if wait_s > 0:
                await asyncio.sleep(min(wait_s, end - now))

    await asyncio.gather(*(caller(limiter) for limiter in limiters for _ in range(callers)))
    return sorted(admitted)


def _most_in_window(times: list[float], window_s: float) -> int:
    """The largest number of times inside any half-open window [t, t + window_s)."""
    times, best, first = sorted(times), 0, 0
    for last, t in enumerate(times):
        while t - times[first] >= window_s:
            first += 1
        best = max(best, last - first + 1)
    return best


# ---------------------------------------------------------------------- contract, both limiters


async def test_requests_are_spread_and_no_window_exceeds_the_limit(limiter: RateLimiter) -> None:
    burst = burst_capacity(RPM, DEFAULT_BURST_FRACTION)
    admitted = await _drive([limiter], duration_s=2.5)

    # At most the limit plus the documented burst (capacity - 1) in any period-long window
    assert _most_in_window(admitted, PERIOD_S - JITTER_S) <= RPM + burst - 1
    # spread over the period: the first half-period holds half the limit plus the burst, not all
    assert _most_in_window(admitted, PERIOD_S / 2) <= RPM // 2 + burst
    # and the limiter does admit at the limit's rate, not less
    assert len(admitted) >= 0.8 * (burst + RPM * 2.5)


async def test_large_token_costs_are_paced_by_the_token_limit(limiter: RateLimiter) -> None:
    # Given 400-token requests against 1000 tokens per second: each is above the 100-token burst,
    # so it passes only into a full bucket and is paid back (0.4 s) before the next
    tpm, tokens = 1000, 400
    assert await limiter.acquire(KEY, tokens=tokens, rpm=None, tpm=tpm, period_s=PERIOD_S) == 0
    wait_s = await limiter.acquire(KEY, tokens=tokens, rpm=None, tpm=tpm, period_s=PERIOD_S)
    assert 0.3 < wait_s <= 0.4

    await asyncio.sleep(wait_s)
    admitted = await _drive([limiter], duration_s=1.3, tokens=tokens, rpm=None, tpm=tpm)

    gaps = [b - a for a, b in itertools.pairwise(admitted)]
    assert 3 <= len(admitted) <= 4
    assert min(gaps) >= tokens / tpm * PERIOD_S - JITTER_S
    # a period-long window holds at most the limit plus one request
    assert _most_in_window(admitted, PERIOD_S - JITTER_S) * tokens <= tpm + tokens


async def test_a_refused_request_charges_neither_limit(limiter: RateLimiter) -> None:
    # One request per 100 ms and 100 tokens per 100 ms, each with a burst of one such unit
    rpm, tpm = 10, 1000
    assert await limiter.acquire(KEY, tokens=100, rpm=rpm, tpm=tpm, period_s=PERIOD_S) == 0
    # When the token limit refuses (the request limit alone would have said wait too)
    assert await limiter.acquire(KEY, tokens=100, rpm=rpm, tpm=tpm, period_s=PERIOD_S) > 0
    state = await limiter.state(KEY)
    assert state.requests_available is not None and state.requests_available > -0.5

    # Then once both refill, the next request passes at once: the refusal took nothing
    await asyncio.sleep(0.12)
    assert await limiter.acquire(KEY, tokens=100, rpm=rpm, tpm=tpm, period_s=PERIOD_S) == 0


async def test_keys_are_limited_separately(limiter: RateLimiter) -> None:
    assert await limiter.acquire(KEY, tokens=0, rpm=1, tpm=None, period_s=PERIOD_S) == 0
    assert await limiter.acquire(KEY, tokens=0, rpm=1, tpm=None, period_s=PERIOD_S) > 0
    assert await limiter.acquire("sim/other", tokens=0, rpm=1, tpm=None, period_s=PERIOD_S) == 0


async def test_no_limits_admit_everything(limiter: RateLimiter) -> None:
    waits = [await limiter.acquire(KEY, tokens=10**6, rpm=None, tpm=None) for _ in range(50)]
    assert waits == [0.0] * 50


async def test_pause_blocks_every_caller_and_is_never_shortened(limiter: RateLimiter) -> None:
    await limiter.pause(KEY, 0.4)

    waits = await asyncio.gather(*(
        limiter.acquire(KEY, tokens=1, rpm=None, tpm=None) for _ in range(10)
    ))
    assert all(0.3 < wait <= 0.4 for wait in waits)
    assert await limiter.acquire("sim/other", tokens=1, rpm=None, tpm=None) == 0

    # A shorter pause does not shorten it; a longer one extends it
    await limiter.pause(KEY, 0.05)
    assert await limiter.acquire(KEY, tokens=1, rpm=None, tpm=None) > 0.3
    await limiter.pause(KEY, 0.6)
    assert await limiter.acquire(KEY, tokens=1, rpm=None, tpm=None) > 0.5
    state = await limiter.state(KEY)
    assert 0.5 < state.paused_for_s <= 0.6
    assert state.paused_until is not None

    await asyncio.sleep(0.62)
    assert await limiter.acquire(KEY, tokens=1, rpm=None, tpm=None) == 0
    assert (await limiter.state(KEY)).paused_until is None


async def test_observe_pauses_when_the_provider_reports_nothing_left(limiter: RateLimiter) -> None:
    # Budgets with something left, or no reset given, change nothing
    await limiter.observe(KEY, remaining_requests=5, remaining_tokens=900,
                          reset_requests_s=10.0, reset_tokens_s=10.0)
    await limiter.observe(KEY, remaining_requests=0, remaining_tokens=None,
                          reset_requests_s=None, reset_tokens_s=None)
    assert await limiter.acquire(KEY, tokens=1, rpm=None, tpm=None) == 0

    # Requests at 0: paused until their reset
    await limiter.observe(KEY, remaining_requests=0, remaining_tokens=900,
                          reset_requests_s=0.3, reset_tokens_s=10.0)
    assert 0.2 < await limiter.acquire(KEY, tokens=1, rpm=None, tpm=None) <= 0.3
    # Tokens at 0 with a later reset: the pause extends to it
    await limiter.observe(KEY, remaining_requests=3, remaining_tokens=0,
                          reset_requests_s=0.1, reset_tokens_s=0.5)
    assert 0.4 < await limiter.acquire(KEY, tokens=1, rpm=None, tpm=None) <= 0.5


async def test_state_reports_limits_and_levels(limiter: RateLimiter) -> None:
    empty = await limiter.state(KEY)
    assert (empty.paused_for_s, empty.requests_available, empty.tokens_available) == (0.0, None, None)

    await limiter.acquire(KEY, tokens=500, rpm=RPM, tpm=10_000, period_s=PERIOD_S)
    state = await limiter.state(KEY)
    assert (state.rpm, state.tpm, state.period_s) == (RPM, 10_000, PERIOD_S)
    assert state.requests_available is not None and state.tokens_available is not None
    assert burst_capacity(RPM) - 1 <= state.requests_available < burst_capacity(RPM)
    assert burst_capacity(10_000) - 500 <= state.tokens_available < burst_capacity(10_000)


async def test_invalid_arguments_are_refused(limiter: RateLimiter) -> None:
    with pytest.raises(ValueError, match="tokens"):
        await limiter.acquire(KEY, tokens=-1, rpm=1, tpm=None)
    with pytest.raises(ValueError, match="rpm"):
        await limiter.acquire(KEY, tokens=1, rpm=0, tpm=None)
    with pytest.raises(ValueError, match="period_s"):
        await limiter.acquire(KEY, tokens=1, rpm=1, tpm=None, period_s=0)


async def test_a_closed_limiter_refuses_use(limiter: RateLimiter) -> None:
    await limiter.close()
    await limiter.close()  # idempotent
    with pytest.raises(DispatchClosed):
        await limiter.acquire(KEY, tokens=1, rpm=1, tpm=None)


# ---------------------------------------------------------------------- Redis only


@pytest.mark.redis_only
async def test_two_instances_share_one_limit(redis_url: str, redis_name: str) -> None:
    # Two limiters on the same Redis, as two worker processes would hold
    async with RedisRateLimiter(redis_url, redis_name) as one, \
            RedisRateLimiter(redis_url, redis_name) as two:
        await two.pause(KEY, 0.2)
        assert await one.acquire(KEY, tokens=1, rpm=None, tpm=None) > 0.1  # the pause reaches both
        await asyncio.sleep(0.2)

        admitted = await _drive([one, two], duration_s=1.5, callers=3)

    assert _most_in_window(admitted, PERIOD_S - JITTER_S) <= RPM + burst_capacity(RPM) - 1
    assert len(admitted) >= 0.8 * (burst_capacity(RPM) + RPM * 1.5)


def _count_scripts(limiter: RedisRateLimiter) -> list[str]:
    """Record the script calls the limiter sends from now on."""
    sent: list[str] = []
    assert limiter._redis is not None
    script = limiter._redis.script

    async def counted(name: str, *args: object, **kwargs: object) -> object:
        sent.append(name)
        return await script(name, *args, **kwargs)  # type: ignore[arg-type]

    limiter._redis.script = counted  # type: ignore[method-assign]
    return sent


async def _known(limiter: RedisRateLimiter, key: str) -> None:
    """Acquire `key` (no limits) until its pause is known without a script call: the
    announcements are followed and the key has been read once since."""
    async def known() -> bool:
        await limiter.acquire(key, tokens=1, rpm=None, tpm=None)
        return limiter._pauses.wait_s(key) is not None

    await eventually(known, "the limiter follows the pause announcements", every_s=0.01)


async def test_a_key_without_limits_is_admitted_without_a_round_trip(redis_url: str, redis_name: str) -> None:
    async with RedisRateLimiter(redis_url, redis_name) as limiter:
        await _known(limiter, KEY)
        sent = _count_scripts(limiter)

        waits = [await limiter.acquire(KEY, tokens=1, rpm=None, tpm=None) for _ in range(20)]
        await limiter.acquire(KEY, tokens=1, rpm=RPM, tpm=None, period_s=PERIOD_S)

    assert waits == [0.0] * 20
    assert sent == ["acquire"]  # only the key with a limit went to Redis


async def test_a_pause_by_another_process_holds_a_known_key_once_announced(
    redis_url: str, redis_name: str
) -> None:
    async with RedisRateLimiter(redis_url, redis_name) as here, \
            RedisRateLimiter(redis_url, redis_name) as there:
        await _known(here, KEY)
        sent = _count_scripts(here)

        await there.pause(KEY, 5.0)

        await eventually(lambda: here.acquire(KEY, tokens=1, rpm=None, tpm=None),  # through Redis
                         "the pause reaches the other limiter", until=lambda wait_s: wait_s > 4.0,
                         every_s=0.005)
        assert sent == []  # learnt from the announcement, not read


@pytest.mark.redis_only
async def test_a_pause_made_while_the_announcements_are_cut_off_still_holds(
    redis_server: str, redis_name: str
) -> None:
    async with RedisRateLimiter(redis_server, redis_name) as here, \
            RedisRateLimiter(redis_server, redis_name) as there, redis_client(redis_server) as admin:
        await _known(here, KEY)
        generation = here._pauses.generation
        # The subscription's connection is cut (as a restart or a network fault would); once the
        # limiter has seen it go, a pause is made, perhaps before it has subscribed again.
        await admin.execute_command("CLIENT", "KILL", "TYPE", "pubsub")
        await eventually(lambda: here._pauses.wait_s(KEY) is None or here._pauses.generation > generation,
                         "the limiter has seen its subscription go", every_s=0.005)
        await there.pause(KEY, 5.0)

        assert await here.acquire(KEY, tokens=1, rpm=None, tpm=None) > 4.0


def test_known_pauses_trust_only_what_was_read_within_the_standing_subscription() -> None:
    pauses = KnownPauses()
    pauses.learn(KEY, 0.0, since=pauses.generation)
    assert pauses.wait_s(KEY) is None  # not following yet: nothing is known

    pauses.subscribed()
    since = pauses.generation
    pauses.learn(KEY, 0.0, since)
    assert pauses.wait_s(KEY) == 0.0
    pauses.paused(KEY, 2.0)
    assert 1.9 < (pauses.wait_s(KEY) or 0.0) <= 2.0
    pauses.paused(KEY, 0.5)  # a shorter pause never shortens it
    assert (pauses.wait_s(KEY) or 0.0) > 1.9

    pauses.lost()
    assert pauses.wait_s(KEY) is None  # announcements may be lost now
    pauses.subscribed()
    assert pauses.wait_s(KEY) is None  # read again within the new subscription first
    pauses.learn(KEY, 0.0, since)  # a read sent before the subscription stood again
    assert pauses.wait_s(KEY) is None


def _spawn(url: str, name: str, start_at: float, duration_s: float, out: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.support.limiter_process", url, name, KEY,
         str(RPM), str(PERIOD_S), repr(start_at), str(duration_s), str(out)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


@pytest.mark.redis_only
async def test_two_processes_never_exceed_the_limit_together(
    redis_server: str, redis_name: str, tmp_path: Path
) -> None:
    # Given two OS processes starting together on the same key
    start_at, duration_s = time.time() + 1.5, 1.5
    outputs = [tmp_path / f"admitted-{i}.txt" for i in range(2)]
    procs = [_spawn(redis_server, redis_name, start_at, duration_s, out) for out in outputs]
    for proc in procs:
        _, err = await asyncio.to_thread(proc.communicate, timeout=60)
        assert proc.returncode == 0, err

    # Then their admissions together respect the one limit, and both got some
    per_process = [[float(line) for line in out.read_text().split()] for out in outputs]
    combined = sorted(t for times in per_process for t in times)
    assert all(per_process), "each process should have been admitted some requests"
    assert _most_in_window(combined, PERIOD_S - JITTER_S) <= RPM + burst_capacity(RPM) - 1
    assert len(combined) <= burst_capacity(RPM) + RPM * duration_s + 1


@pytest.mark.redis_only
async def test_state_keys_expire(redis_url: str, redis_name: str) -> None:
    async with RedisRateLimiter(redis_url, redis_name) as limiter:
        await limiter.acquire(KEY, tokens=1, rpm=RPM, tpm=None, period_s=PERIOD_S)
    client = redis_client(redis_url)
    try:
        keys = [key async for key in client.scan_iter(match=f"tidegate:{{{redis_name}}}:rate:*")]
        assert keys == [f"tidegate:{{{redis_name}}}:rate:{KEY}".encode()]
        assert 0 < await client.pttl(keys[0]) <= 62_000
    finally:
        await client.aclose()


@pytest.mark.redis_only
async def test_an_unreachable_redis_is_reported() -> None:
    async with RedisRateLimiter("redis://127.0.0.1:1/0") as limiter:
        with pytest.raises(DispatchUnavailable, match="rate limiter"):
            await limiter.acquire(KEY, tokens=1, rpm=1, tpm=None)


async def test_the_factory_follows_the_queue_url(tmp_path: Path) -> None:
    local = rate_limiter_for(f"sqlite:///{tmp_path / 'q.db'}")
    shared = rate_limiter_for("redis://127.0.0.1:1/0?name=jobs", "jobs")
    try:
        assert isinstance(local, LocalRateLimiter)
        assert isinstance(shared, RedisRateLimiter) and shared.name == "jobs"
    finally:
        await local.close()
        await shared.close()
    with pytest.raises(ConfigError, match="unsupported queue URL"):
        rate_limiter_for("ftp://example.org/x")


# ---------------------------------------------------------------------- AIMD concurrency


def test_aimd_starts_at_the_model_ceiling_and_caps_slots() -> None:
    window = AdaptiveConcurrency()
    assert [window.try_acquire(KEY, 3) for _ in range(4)] == [True, True, True, False]
    assert window.in_flight(KEY) == 3
    window.release(KEY)
    assert window.try_acquire(KEY, 3)
    assert window.snapshot()[KEY].limit == 3 and window.snapshot()[KEY].max_limit == 3


def test_aimd_halves_on_throttle_and_grows_by_one_per_success() -> None:
    window = AdaptiveConcurrency()
    window.try_acquire(KEY, 16)
    window.on_throttled(KEY)
    assert window.limit(KEY) == 8
    window.on_throttled(KEY)
    window.on_throttled(KEY)
    window.on_throttled(KEY)
    window.on_throttled(KEY)
    assert window.limit(KEY) == 1  # never below one
    for _ in range(3):
        window.on_success(KEY)
    assert window.limit(KEY) == 4
    for _ in range(100):
        window.on_success(KEY)
    assert window.limit(KEY) == 16  # never above the ceiling


def test_aimd_refuses_new_slots_while_over_a_lowered_limit() -> None:
    window = AdaptiveConcurrency()
    assert all(window.try_acquire(KEY, 4) for _ in range(4))
    window.on_throttled(KEY)  # limit 2 with 4 in flight
    assert not window.try_acquire(KEY, 4)
    window.release(KEY)
    window.release(KEY)
    assert not window.try_acquire(KEY, 4)  # 2 in flight, limit 2
    window.release(KEY)
    assert window.try_acquire(KEY, 4)


def test_aimd_start_and_ceiling_changes() -> None:
    window = AdaptiveConcurrency(start=2)
    assert window.limit(KEY) == 2  # a configured start below the default ceiling
    window.try_acquire("sim/small", 1)
    assert window.limit("sim/small") == 1  # never above the model's ceiling
    window.try_acquire(KEY, 64)
    window.on_success(KEY)
    assert window.limit(KEY) == 3
    window.try_acquire(KEY, 2)  # the model's ceiling went down
    assert window.snapshot()[KEY].max_limit == 2 and window.limit(KEY) == 2


def test_aimd_release_without_acquire_is_a_bug() -> None:
    with pytest.raises(ValueError, match="without a matching try_acquire"):
        AdaptiveConcurrency().release(KEY)
