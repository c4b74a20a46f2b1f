"""Which HTTP client for the provider hot path: aiohttp vs httpx, against the simulated provider.

    .venv/bin/python -m bench.http_client             # 5 rounds of 20,000 requests per client
    .venv/bin/python -m bench.http_client --quick     # a smoke run, a few seconds
    .venv/bin/python -m bench.http_client --requests 50000 --concurrency 128 --rounds 3

`tidegate simulate` runs in its own process (zero latency, no limits, no faults), so the client
process measures only client work. Each client keeps one pooled session and the same number of
requests in flight, posting the same small chat body and reading the whole answer. Rounds run
every client in turn, so drift of the machine spreads over all of them; the table shows each
client's median round. Besides throughput and latency it reports the client process's CPU time
per request, which stays a fair comparison even when the one-process simulator is the ceiling.

Rows: raw aiohttp.ClientSession, raw httpx.AsyncClient, and tidegate's UpstreamClient (aiohttp
plus classification, usage and rate-limit parsing) to show what the wrapper costs.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import shutil
import statistics
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from bench.common import BenchmarkError, command_line, percentile
from tidegate.testing import ProviderConfig, UpstreamClient

MODEL = "deepseek-v3.2"
BODY: dict[str, Any] = {"model": MODEL, "max_tokens": 8,
                        "messages": [{"role": "user", "content": "Say hello in five words."}]}
PAYLOAD = orjson.dumps(BODY)
HEADERS = {"Content-Type": "application/json", "Authorization": "Bearer sk-bench"}
START_TIMEOUT_S = 30.0

Send = Callable[[], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class Run:
    """One client's measured run."""

    client: str
    requests: int
    seconds: float
    cpu_s: float
    p50_ms: float
    p99_ms: float

    @property
    def rate(self) -> float:
        """Requests per second."""
        return self.requests / self.seconds

    @property
    def cpu_us_per_request(self) -> float:
        """Client-process CPU per request, in microseconds."""
        return self.cpu_s / self.requests * 1e6


# ---------------------------------------------------------------------------- the simulator


@asynccontextmanager
async def simulator_process() -> AsyncIterator[str]:
    """`tidegate simulate` on a free loopback port in a process of its own; yields its base URL."""
    binary = Path(sys.executable).with_name("tidegate")
    command = [str(binary)] if binary.exists() else [shutil.which("tidegate") or "tidegate"]
    proc = await asyncio.create_subprocess_exec(
        *command, "simulate", "--port", "0", "--seed", "1",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None
        line = await asyncio.wait_for(proc.stdout.readline(), START_TIMEOUT_S)
        if " on http" not in line.decode():
            raise BenchmarkError(f"tidegate simulate did not start: {line!r}")
        yield line.decode().split(" on ", 1)[1].strip()
    finally:
        if proc.returncode is None:
            proc.terminate()
        await proc.wait()


# ---------------------------------------------------------------------------- clients


@asynccontextmanager
async def aiohttp_sender(base_url: str, concurrency: int) -> AsyncIterator[Send]:
    """Raw aiohttp: one ClientSession with a pool of `concurrency` connections."""
    url = base_url + "/chat/completions"
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector, headers=HEADERS) as session:

        async def send() -> None:
            async with session.post(url, data=PAYLOAD) as response:
                body = await response.read()
                if response.status != 200:
                    raise BenchmarkError(f"aiohttp: HTTP {response.status}: {body[:200]!r}")
                orjson.loads(body)

        yield send


@asynccontextmanager
async def httpx_sender(base_url: str, concurrency: int) -> AsyncIterator[Send]:
    """Raw httpx: one AsyncClient with a pool of `concurrency` keep-alive connections."""
    try:
        import httpx
    except ImportError as exc:
        raise BenchmarkError("httpx is not installed: pip install -e '.[bench]'") from exc
    url = base_url + "/chat/completions"
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(limits=limits, headers=HEADERS, timeout=30.0) as client:

        async def send() -> None:
            response = await client.post(url, content=PAYLOAD)
            if response.status_code != 200:
                raise BenchmarkError(f"httpx: HTTP {response.status_code}: {response.content[:200]!r}")
            orjson.loads(response.content)

        yield send


@asynccontextmanager
async def tidegate_sender(base_url: str, concurrency: int) -> AsyncIterator[Send]:
    """tidegate's UpstreamClient (aiohttp inside), with its pool sized to `concurrency`."""
    provider = ProviderConfig(name="simulated", base_url=base_url, timeout_s=30.0)
    async with UpstreamClient(provider, max_connections=concurrency) as client:

        async def send() -> None:
            await client.chat(BODY)

        yield send


Sender = Callable[[str, int], Any]  # (base_url, concurrency) -> async context manager of Send


def senders() -> dict[str, Sender]:
    """Every client measured, named with its version."""
    try:
        httpx_version = metadata.version("httpx")
    except metadata.PackageNotFoundError as exc:
        raise BenchmarkError("httpx is not installed: pip install -e '.[bench]'") from exc
    return {
        f"aiohttp {metadata.version('aiohttp')} (ClientSession)": aiohttp_sender,
        f"httpx {httpx_version} (AsyncClient)": httpx_sender,
        "tidegate UpstreamClient (aiohttp)": tidegate_sender,
    }


async def measure(name: str, send: Send, requests: int, concurrency: int) -> Run:
    """`requests` calls with `concurrency` in flight; latency of each, wall and CPU time."""
    for _ in range(concurrency * 4):  # open the pool and warm the path
        await send()
    samples: list[float] = []
    per_worker, extra = divmod(requests, concurrency)

    async def worker(count: int) -> None:
        for _ in range(count):
            before = time.perf_counter()
            await send()
            samples.append(time.perf_counter() - before)

    cpu_before, started = time.process_time(), time.perf_counter()
    await asyncio.gather(*(worker(per_worker + (i < extra)) for i in range(concurrency)))
    seconds, cpu_s = time.perf_counter() - started, time.process_time() - cpu_before
    if len(samples) != requests:
        raise BenchmarkError(f"{name}: {len(samples)} answers for {requests} requests")
    return Run(name, requests, seconds, cpu_s, percentile(samples, 0.5), percentile(samples, 0.99))


# ---------------------------------------------------------------------------- report


def markdown(runs: list[Run]) -> str:
    """The median run of each client as a markdown table, fastest first."""
    fastest = max(run.rate for run in runs)
    lines = ["| client | requests | req/s | vs fastest | p50 ms | p99 ms | client CPU µs/req |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for run in sorted(runs, key=lambda r: -r.rate):
        lines.append(f"| {run.client} | {run.requests:,} | {run.rate:,.0f} | {run.rate / fastest:.2f}x | "
                     f"{run.p50_ms:.2f} | {run.p99_ms:.2f} | {run.cpu_us_per_request:,.0f} |")
    return "\n".join(lines)


def facts(args: argparse.Namespace) -> str:
    """The machine and the versions, for the record."""
    load = " ".join(f"{x:.2f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "n/a"
    return (f"Python {platform.python_version()} on {platform.system()} {platform.machine()}, "
            f"{os.cpu_count()} CPUs, load average before: {load}; {args.rounds} rounds of "
            f"{args.requests:,} requests per client, {args.concurrency} in flight; the simulator in "
            "its own process, zero latency.")


async def main(args: argparse.Namespace) -> int:
    """Run every client in rounds and print the table of median runs."""
    clients = senders()
    header = facts(args)
    rounds: dict[str, list[Run]] = {name: [] for name in clients}
    async with simulator_process() as base_url:
        for number in range(1, args.rounds + 1):
            for name, sender in clients.items():
                async with sender(base_url, args.concurrency) as send:
                    run = await measure(name, send, args.requests, args.concurrency)
                rounds[name].append(run)
                print(f"round {number}: {name}: {run.rate:,.0f} req/s, p50 {run.p50_ms:.2f} ms, "
                      f"p99 {run.p99_ms:.2f} ms, {run.cpu_us_per_request:,.0f} µs CPU/req", file=sys.stderr)
    medians = []
    for runs in rounds.values():
        rate = statistics.median_low([r.rate for r in runs])
        medians.append(next(r for r in runs if r.rate == rate))
    print(f"Command: `{command_line('bench.http_client', sys.argv[1:])}`\n")
    print(header + "\n")
    print(markdown(medians))
    return 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=20_000, help="requests per client per round")
    parser.add_argument("--concurrency", type=int, default=64, help="requests in flight")
    parser.add_argument("--rounds", type=int, default=5, help="rounds (each runs every client once)")
    parser.add_argument("--quick", action="store_true", help="2 rounds of 2,000 requests")
    args = parser.parse_args(argv)
    if args.quick:
        args.requests, args.rounds = 2_000, 2
    if args.requests < args.concurrency or args.concurrency < 1 or args.rounds < 1:
        parser.error("need --concurrency >= 1, --requests >= --concurrency and --rounds >= 1")
    return args


if __name__ == "__main__":
    try:
        sys.exit(asyncio.run(main(parse_args())))
    except BenchmarkError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(1)
