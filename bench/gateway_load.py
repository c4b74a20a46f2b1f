"""The gateway benchmark's load generator: open-loop (a fixed arrival rate) and closed-loop (a
fixed number of clients, as fast as answers come) chat completions against any OpenAI-compatible
base URL, timing each request.

It runs in the benchmark's own process, which does nothing else while a run lasts: the simulator
and every system measured run in processes of their own.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

from bench.common import percentile

MODEL = "deepseek-v3.2"
# Small answers: the simulator generates each completion word by word, and its CPU is not what
# is measured here.
BODY: dict[str, Any] = {"model": MODEL, "max_tokens": 8,
                        "messages": [{"role": "user", "content": "Say hello in five words."}]}
PAYLOAD = orjson.dumps(BODY)
REQUEST_TIMEOUT_S = 30.0
START_DELAY_S = 0.05  # the first arrival, after the schedule is set up
KEEPALIVE_S = 2.0


@dataclass(frozen=True, slots=True)
class Endpoint:
    """Where to send: the base URL (`http://host:port/v1`), the bearer key, if any, and any
    headers the system routes by (Portkey's provider and custom host)."""

    base_url: str
    api_key: str | None = None
    extra_headers: tuple[tuple[str, str], ...] = ()

    @property
    def url(self) -> str:
        """The chat completions URL."""
        return self.base_url.rstrip("/") + "/chat/completions"

    @property
    def headers(self) -> dict[str, str]:
        """Content type, authorization and the extra headers."""
        headers = {"Content-Type": "application/json", **dict(self.extra_headers)}
        if self.api_key is not None:
            headers["Authorization"] = f"Bearer {self.api_key}"
        return headers


@dataclass(slots=True)
class LoadRun:
    """What one run sent and got back. Latencies are of answered requests (HTTP 200 with a
    completion), in seconds; `late_s` is how far behind schedule each open-loop request left."""

    sent: int = 0
    latencies_s: list[float] = field(default_factory=list)
    late_s: list[float] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)
    seconds: float = 0.0  # wall time of the run (closed loop: the measured window)
    cpu_s: float = 0.0  # this process's CPU time over the run

    @property
    def ok(self) -> int:
        """Requests answered with a completion."""
        return len(self.latencies_s)

    @property
    def rate(self) -> float:
        """Answered requests per second."""
        return self.ok / self.seconds if self.seconds > 0 else 0.0

    def p(self, fraction: float) -> float | None:
        """A latency quantile in milliseconds, or None with no answer."""
        return percentile(self.latencies_s, fraction) if self.latencies_s else None

    def late_p99_ms(self) -> float | None:
        """How late the open-loop schedule ran at its p99, in milliseconds."""
        return percentile(self.late_s, 0.99) if self.late_s else None

    def error_text(self) -> str:
        """`0`, or `12 (HTTP 502: 10, timeout: 2)`."""
        total = sum(self.errors.values())
        if not total:
            return "0"
        kinds = ", ".join(f"{kind}: {n}" for kind, n in self.errors.most_common())
        return f"{total} ({kinds})"


@contextlib.asynccontextmanager
async def client_session(connections: int) -> AsyncIterator[aiohttp.ClientSession]:
    """One pooled session, as a real client keeps: connection set-up is not timed."""
    # Idle connections are closed before the servers' own keep-alive timeout (uvicorn: 5 s), so
    # a request is never sent on a connection the server is closing (between runs, say).
    connector = aiohttp.TCPConnector(limit=connections, limit_per_host=connections,
                                     keepalive_timeout=KEEPALIVE_S)
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        yield session


async def _one(session: aiohttp.ClientSession, endpoint: Endpoint, run: LoadRun) -> float | None:
    """Send one request; its latency in seconds if it was answered with a completion."""
    run.sent += 1
    started = time.perf_counter()
    try:
        async with session.post(endpoint.url, data=PAYLOAD, headers=endpoint.headers) as response:
            body = await response.read()
            elapsed = time.perf_counter() - started
            if response.status != 200:
                run.errors[f"HTTP {response.status}"] += 1
                return None
    except TimeoutError:
        run.errors["timeout"] += 1
        return None
    except aiohttp.ClientError as exc:
        run.errors[type(exc).__name__] += 1
        return None
    try:
        answer = orjson.loads(body)
    except orjson.JSONDecodeError:
        run.errors["not JSON"] += 1
        return None
    if not isinstance(answer, dict) or not answer.get("choices"):
        run.errors["no choices"] += 1
        return None
    return elapsed


async def open_loop(session: aiohttp.ClientSession, endpoint: Endpoint, rate_per_s: float,
                    duration_s: float) -> LoadRun:
    """Send `rate_per_s * duration_s` requests at evenly spaced times, whether or not earlier
    ones were answered (arrivals do not wait for the system), and time each one."""
    run = LoadRun()
    count = max(1, round(rate_per_s * duration_s))
    loop = asyncio.get_running_loop()
    start = loop.time() + START_DELAY_S

    async def timed(due: float) -> None:
        run.late_s.append(max(0.0, loop.time() - due))
        latency = await _one(session, endpoint, run)
        if latency is not None:
            run.latencies_s.append(latency)

    cpu_before, wall_before = time.process_time(), time.perf_counter()
    tasks: list[asyncio.Task[None]] = []
    for i in range(count):
        due = start + i / rate_per_s
        delay = due - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(timed(due)))
    await asyncio.gather(*tasks)
    run.seconds = time.perf_counter() - wall_before
    run.cpu_s = time.process_time() - cpu_before
    return run


async def closed_loop(session: aiohttp.ClientSession, endpoint: Endpoint, clients: int,
                      warmup_s: float, window_s: float, *,
                      on_window_start: Callable[[], None] | None = None,
                      on_window_end: Callable[[], None] | None = None) -> LoadRun:
    """`clients` loops that each send the next request as soon as the last was answered; counts
    the answers that arrive inside `window_s` after `warmup_s` (the sustained rate). The two
    callbacks run when the window opens and closes (to meter CPU over exactly that time)."""
    run = LoadRun()
    loop = asyncio.get_running_loop()
    window_start = loop.time() + warmup_s
    window_end = window_start + window_s

    async def client() -> None:
        while loop.time() < window_end:
            latency = await _one(session, endpoint, run)
            if latency is not None and window_start <= loop.time() <= window_end:
                run.latencies_s.append(latency)
            elif latency is None:
                await asyncio.sleep(0.01)  # an error answer must not turn into a busy loop

    tasks = [asyncio.create_task(client()) for _ in range(clients)]
    await asyncio.sleep(max(0.0, window_start - loop.time()))
    if on_window_start is not None:
        on_window_start()
    cpu_before = time.process_time()
    await asyncio.sleep(max(0.0, window_end - loop.time()))
    run.cpu_s = time.process_time() - cpu_before
    if on_window_end is not None:
        on_window_end()
    run.seconds = window_s
    await asyncio.gather(*tasks)
    return run


async def warm_up(session: aiohttp.ClientSession, endpoint: Endpoint, requests: int,
                  in_flight: int) -> LoadRun:
    """A few untimed requests: open connections, fill caches, take first-call costs."""
    run = LoadRun()
    semaphore = asyncio.Semaphore(in_flight)

    async def one() -> None:
        async with semaphore:
            await _one(session, endpoint, run)

    await asyncio.gather(*(one() for _ in range(requests)))
    return run
