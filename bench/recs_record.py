"""The recorder's cost alone: `Recommender.record` fed the freshness benchmark's shop in batches,
with its state on a private redis-server (or in memory), and the CPU each side spends.

    .venv/bin/python -m bench.recs_record                       # Redis, batches of 20
    .venv/bin/python -m bench.recs_record --batch 5 --interactions 12000
    .venv/bin/python -m bench.recs_record --store memory

The catalogue (10,000 products) and a history (50,000 interactions over a day) are recorded
first, then `--interactions` more at 3,000/s event times in batches of `--batch`, one
`record()` call a batch awaited in turn (as the change flow's sink does). Printed: µs of CPU per
interaction of this process and of redis-server, and redis-server's INFO commandstats over the
measured part (µs of server time per interaction; a script's figure includes the commands it
calls, which are also listed on their own).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import time
from datetime import UTC, datetime, timedelta

import numpy as np
import redis.asyncio as aioredis

from bench.recs_bench_data import Shop, seed
from bench.servers import private_redis
from bench.sync_cpu import process_cpu_s
from tidegate.testing import Interaction, Recommender, lua_source, recs_store_for

RATE_PER_S = 3000.0


async def commandstats(url: str) -> dict[str, tuple[int, float]]:
    """calls and µs per command so far."""
    client = aioredis.from_url(url)
    try:
        info = await client.info("commandstats")
    finally:
        await client.aclose()
    return {name.removeprefix("cmdstat_"): (int(v["calls"]), float(v["usec"])) for name, v in info.items()}


async def measure(args: argparse.Namespace, url: str, redis_pid: int | None) -> None:
    """Seed, then record the measured interactions and print what they cost."""
    shop = Shop(args.products, args.users)
    rng = np.random.default_rng(11)
    store = recs_store_for(url, prefix=f"benchrecord{time.time_ns()}")
    async with store:
        recommender = Recommender(store)
        now = datetime.now(UTC)
        history = shop.history(args.history, rng, end=now - timedelta(minutes=5))
        await seed(recommender, shop.products, history)
        step = timedelta(seconds=1 / RATE_PER_S)
        start = now - timedelta(seconds=args.interactions / RATE_PER_S)
        measured = [Interaction(f"user-{user}", shop.products[item].item_id, kind, start + n * step)
                    for n, (user, item, kind) in enumerate(shop.draw(args.interactions, rng))]
        before = await commandstats(url) if redis_pid else {}
        if redis_pid and args.scripts:
            await _slowlog(url, on=True)
        own, server = time.process_time(), process_cpu_s(redis_pid) if redis_pid else 0.0
        wall = time.perf_counter()
        for begin in range(0, len(measured), args.batch):
            await recommender.record(measured[begin:begin + args.batch])
        wall = time.perf_counter() - wall
        own, server = time.process_time() - own, (process_cpu_s(redis_pid) - server) if redis_pid else 0.0
        count = len(measured)
        print(f"{url.split(':')[0]}, batches of {args.batch}: {count:,} interactions in {wall:.2f} s "
              f"({count / wall:,.0f}/s one batch at a time); CPU µs/interaction: process "
              f"{own / count * 1e6:.1f}, redis-server {server / count * 1e6:.1f}")
        if redis_pid and args.scripts:
            for name, (calls, usec) in (await _slowlog(url, on=False)).items():
                print(f"  script {name:16s} {usec / count:7.1f} µs/interaction  {calls} calls  "
                      f"{usec / calls:8.1f} µs/call")
        if redis_pid:
            after = await commandstats(url)
            used = {name: (calls - before.get(name, (0, 0.0))[0], usec - before.get(name, (0, 0.0))[1])
                    for name, (calls, usec) in after.items()}
            for name, (calls, usec) in sorted(used.items(), key=lambda kv: -kv[1][1])[:10]:
                if calls:
                    print(f"  {name:18s} {usec / count:7.1f} µs/interaction  "
                          f"{calls / count:6.2f} calls/interaction {usec / calls:8.1f} µs/call")


async def _slowlog(url: str, *, on: bool) -> dict[str, tuple[int, float]]:
    """Turn the slow log on for every command (on), or read it and turn it off: server time per
    script (EVALSHA by the SHA1 of each of the store's scripts), its calls' time included."""
    client = aioredis.from_url(url)
    try:
        if on:
            await client.config_set("slowlog-max-len", 1_000_000)
            await client.config_set("slowlog-log-slower-than", 0)
            await client.slowlog_reset()
            return {}
        entries = await client.slowlog_get(1_000_000)
        await client.config_set("slowlog-log-slower-than", 10_000)
    finally:
        await client.aclose()
    names = {hashlib.sha1(lua_source("tidegate.recs.store", name).encode()).hexdigest(): name
             for name in ("record", "log_add", "note", "item_put")}
    used: dict[str, tuple[int, float]] = {}
    for entry in entries:
        command = entry["command"]
        words = (command.decode(errors="replace") if isinstance(command, bytes) else command).split(" ")
        if words[0].lower() != "evalsha":
            continue
        name = names.get(words[1], words[1][:8])
        if name == "log_add":
            name += ":trending" if "trending" in words[3] else ":neighbours"
        calls, usec = used.get(name, (0, 0.0))
        used[name] = (calls + 1, usec + entry["duration"])
    return dict(sorted(used.items(), key=lambda kv: -kv[1][1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--store", choices=("redis", "memory"), default="redis")
    parser.add_argument("--batch", type=int, default=20, help="interactions per record() call")
    parser.add_argument("--interactions", type=int, default=30_000, help="measured interactions")
    parser.add_argument("--history", type=int, default=50_000, help="interactions recorded before")
    parser.add_argument("--scripts", action="store_true",
                        help="server time per script, from the slow log (which adds its own cost)")
    parser.add_argument("--products", type=int, default=10_000)
    parser.add_argument("--users", type=int, default=20_000)
    args = parser.parse_args()
    if args.store == "memory":
        asyncio.run(measure(args, "memory://", None))
        return
    with private_redis() as server:
        asyncio.run(measure(args, server.url, server.pid))


if __name__ == "__main__":
    main()
