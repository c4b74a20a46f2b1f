"""Serving latency of the recommendations, in process and through the gateway: the parent side of
`bench.recs_bench_gateway` (see its docstring for what the child does).

For each store the child seeds the shop and times `recommend()` in process; then this process
asks the gateway for the same users, one request at a time over one kept-alive connection
(aiohttp), `GET /v1/recommendations/{user}?n=10` with the key of an admin tenant (the shop's own
backend: an admin tenant reads the database's users, which the change flow feeds; an ordinary
tenant's users are its own, prefixed with its name). Every answer must be 200 with the user's id,
a cold start exactly for the users never seen; the HTTP time is from sending the request to the
whole body read.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from bench.common import BenchmarkError
from bench.recs_bench_gateway import KINDS, WARMUP_QUERIES, quantiles

REPO_ROOT = Path(__file__).resolve().parent.parent
SEED_TIMEOUT_S = 300.0
READY_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 20.0

Progress = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class ServePlan:
    """What each store serves."""

    products: int
    users: int
    history: int
    queries: int  # of each kind (personal, cold)


@dataclass(slots=True)
class ServeResult:
    """One store's figures: `inprocess[kind]` and `http[kind]` are quantiles in ms."""

    store: str
    seed_s: float = 0.0
    items: int = 0
    users: int = 0
    inprocess: dict[str, dict[str, float]] = field(default_factory=dict)
    http: dict[str, dict[str, float]] = field(default_factory=dict)
    http_rate: dict[str, float] = field(default_factory=dict)  # requests per second, one at a time


async def _line(process: asyncio.subprocess.Process, event: str, timeout_s: float,
                log_path: Path) -> dict[str, Any]:
    assert process.stdout is not None
    try:
        async with asyncio.timeout(timeout_s):
            while line := await process.stdout.readline():
                message: dict[str, Any] = json.loads(line)
                if message.get("event") == event:
                    return message
    except TimeoutError:
        pass
    log_text = await asyncio.to_thread(log_path.read_text, errors="replace")
    tail = log_text[-3000:]
    raise BenchmarkError(f"the serving process did not report {event!r} (exit status "
                         f"{process.returncode}); the end of its log:\n{tail}")


async def measure(store: str, store_url: str, prefix: str, plan: ServePlan, folder: Path,
                  progress: Progress) -> ServeResult:
    """Seed and time one store in the child, then time the same queries over HTTP."""
    log_path = folder / f"serve-{store}.log"
    argv = [sys.executable, "-m", "bench.recs_bench_gateway", "--store-url", store_url, "--prefix", prefix,
            "--products", str(plan.products), "--users", str(plan.users), "--history", str(plan.history),
            "--queries", str(plan.queries)]
    result = ServeResult(store)
    with log_path.open("ab") as log:
        process = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=log, cwd=REPO_ROOT)
    try:
        progress(f"serving, {store}: seeding {plan.products:,} items and {plan.history:,} interactions")
        figures = await _line(process, "inprocess", SEED_TIMEOUT_S, log_path)
        result.seed_s, result.items, result.users = figures["seed_s"], figures["items"], figures["users"]
        result.inprocess = {kind: figures[kind] for kind in KINDS}
        progress(f"serving, {store}: in process p99 {figures['personal']['p99_ms']:.1f} ms; over HTTP")
        ready = await _line(process, "ready", READY_TIMEOUT_S, log_path)
        await _http(result, ready)
    finally:
        if process.stdin is not None:
            process.stdin.close()
        try:
            await asyncio.wait_for(process.wait(), STOP_TIMEOUT_S)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()
    return result


async def _http(result: ServeResult, ready: dict[str, Any]) -> None:
    headers = {"Authorization": f"Bearer {ready['key']}"}
    connector = aiohttp.TCPConnector(limit=1)
    async with aiohttp.ClientSession(ready["url"], headers=headers, connector=connector,
                                     timeout=aiohttp.ClientTimeout(total=30)) as session:
        for user in ready["personal"][:WARMUP_QUERIES]:
            await _get(session, user)
        for kind in KINDS:
            samples = []
            started = time.perf_counter()
            for user in ready[kind]:
                before = time.perf_counter()
                cold = await _get(session, user)
                samples.append(time.perf_counter() - before)
                if cold != (kind == "cold"):
                    raise BenchmarkError(f"GET /v1/recommendations/{user} answered cold_start={cold} for a "
                                         f"user {'never seen' if kind == 'cold' else 'with a history'}")
            result.http_rate[kind] = len(samples) / (time.perf_counter() - started)
            result.http[kind] = quantiles(samples)


async def _get(session: aiohttp.ClientSession, user: str) -> bool:
    """Ask for the user's recommendations; whether the answer is a cold start."""
    async with session.get(f"/v1/recommendations/{user}", params={"n": "10"}) as response:
        body = await response.read()
        if response.status != 200:
            raise BenchmarkError(f"GET /v1/recommendations/{user} answered {response.status}: {body[:300]!r}")
    answer = json.loads(body)
    if answer.get("user_id") != user:
        raise BenchmarkError(f"GET /v1/recommendations/{user} answered for another user: {body[:300]!r}")
    return bool(answer.get("cold_start"))
