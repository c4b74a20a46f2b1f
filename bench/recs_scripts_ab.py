"""The Redis store's Lua scripts against those of another revision, on identical work: two private
redis-servers, one running this tree's scripts and one the revision's, fed the same batches by
two `Recommender`s (alternating which goes first), and each server's CPU per interaction.

    .venv/bin/python -m bench.recs_scripts_ab --against main
    .venv/bin/python -m bench.recs_scripts_ab --against 8f86395 --batch 100 --interactions 20000

Both servers share the machine's load at the same moments, so the ratio holds where absolute
figures drift; the Python side is this tree's for both.
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np

from bench.recs_bench_data import Shop, seed
from bench.servers import RedisServer, private_redis
from bench.sync_cpu import process_cpu_s
from tidegate.testing import Interaction, Recommender, RecsStore, recs_redis_store, recs_store_for

RATE_PER_S = 3000.0
LUA = "src/tidegate/recs/store/lua"
ROOT = Path(__file__).resolve().parent.parent


async def _open_with_scripts_of(url: str, revision: str) -> RecsStore:
    """A store whose scripts are read from `revision` (git) instead of this tree."""
    def source(package: str, name: str, *, common: str | None = None) -> str:
        names = ([common] if common else []) + [name]
        return "\n".join(subprocess.run(["git", "-C", str(ROOT), "show", f"{revision}:{LUA}/{n}.lua"],
                                        capture_output=True, text=True, check=True).stdout for n in names)

    # The store reads its scripts when it opens: swap the reader for that moment only.
    original = getattr(recs_redis_store, "lua_source")  # noqa: B009 - not part of the module's API
    setattr(recs_redis_store, "lua_source", source)  # noqa: B010
    try:
        return await recs_store_for(url, prefix="ab").open()
    finally:
        setattr(recs_redis_store, "lua_source", original)  # noqa: B010


async def measure(args: argparse.Namespace, here: RedisServer, there: RedisServer) -> None:
    """Seed both stores alike, record the measured interactions into both, print each server's CPU."""
    stores = {"this tree": await recs_store_for(here.url, prefix="ab").open(),
              args.against: await _open_with_scripts_of(there.url, args.against)}
    pids = {"this tree": here.pid, args.against: there.pid}
    try:
        shop, rng = Shop(10_000, 20_000), np.random.default_rng(11)
        now = datetime.now(UTC)
        history = shop.history(args.history, rng, end=now - timedelta(minutes=5))
        recommenders = {name: Recommender(store) for name, store in stores.items()}
        for recommender in recommenders.values():
            await seed(recommender, shop.products, history)
        step = timedelta(seconds=1 / RATE_PER_S)
        start = now - args.interactions * step
        measured = [Interaction(f"user-{user}", shop.products[item].item_id, kind, start + n * step)
                    for n, (user, item, kind) in enumerate(shop.draw(args.interactions, rng))]
        before = {name: process_cpu_s(pid) for name, pid in pids.items()}
        names = list(recommenders)
        for number, begin in enumerate(range(0, len(measured), args.batch)):
            for name in names[::-1] if number % 2 else names:
                await recommenders[name].record(measured[begin:begin + args.batch])
        for name, pid in pids.items():
            used = process_cpu_s(pid) - before[name]
            print(f"batches of {args.batch}, scripts of {name}: redis-server "
                  f"{used / len(measured) * 1e6:.1f} µs CPU an interaction")
    finally:
        for store in stores.values():
            await store.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--against", default="main", help="git revision whose scripts to compare with")
    parser.add_argument("--batch", type=int, default=20, help="interactions per record() call")
    parser.add_argument("--interactions", type=int, default=10_000, help="measured interactions")
    parser.add_argument("--history", type=int, default=20_000, help="interactions recorded before")
    args = parser.parse_args()
    with private_redis() as here, private_redis() as there:
        asyncio.run(measure(args, here, there))


if __name__ == "__main__":
    main()
