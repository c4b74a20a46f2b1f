"""The serving side of the recommendations benchmark, in a process of its own: one recommender over
the synthetic shop (`bench.recs_bench_data`), timed in process, then served by the gateway.

    python -m bench.recs_bench_gateway --store-url memory:// --products 50000 --history 100000 --queries 1000

1. seed: the catalogue and a history of interactions go into the store (memory://, or a Redis
   store under `--prefix`), as the change flow would feed them;
2. in process: `Recommender.recommend(RecQuery(user, n=10))` one call at a time, after a
   warm-up, for users with a history (drawn by activity, as traffic comes) and for users never
   seen (cold starts); printed as one JSON line `{"event": "inprocess", ...}`;
3. HTTP: the gateway app (`tidegate.gateway.app.create_app`, SQLite queue and tenants in a
   temporary folder, this recommender) served by uvicorn on a free loopback port; one JSON line
   `{"event": "ready", "url": ..., "key": ..., "personal": [...], "cold": [...]}` gives the parent
   the address, an admin tenant's key (the shop's backend, reading the database's users) and
   the same users to ask for. It serves until its stdin closes.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import resource
import socket
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import uvicorn

from bench.common import percentile
from bench.recs_bench_data import Shop, seed, user_id
from tidegate.testing import (
    Given,
    Recommender,
    RecQuery,
    SyncConfig,
    Tenant,
    TidegateConfig,
    create_app,
    open_gateway_state,
    recs_store_for,
)

WARMUP_QUERIES = 50
KINDS = ("personal", "cold")


def queries(shop: Shop, count: int, rng: np.random.Generator, known: set[str]) -> dict[str, list[str]]:
    """Users to ask for: with a history (drawn by activity), and never seen."""
    personal = [u for u in (user_id(i) for i in shop.draw_users(4 * count, rng)) if u in known][:count]
    return {"personal": personal, "cold": [f"cold-{n}" for n in range(count)]}


def quantiles(samples_s: Sequence[float]) -> dict[str, float | int]:
    """Count, p50, p99, max and mean in ms."""
    return {"count": len(samples_s), "p50_ms": percentile(samples_s, 0.5),
            "p99_ms": percentile(samples_s, 0.99), "max_ms": max(samples_s) * 1000,
            "mean_ms": sum(samples_s) / len(samples_s) * 1000}


async def _in_process(recommender: Recommender, users: dict[str, list[str]]) -> dict[str, Any]:
    for user in users["personal"][:WARMUP_QUERIES]:
        await recommender.recommend(RecQuery(user, n=10))
    figures: dict[str, Any] = {}
    for kind in KINDS:
        samples, returned = [], 0
        for user in users[kind]:
            started = time.perf_counter()
            result = await recommender.recommend(RecQuery(user, n=10))
            samples.append(time.perf_counter() - started)
            returned += len(result.items)
        figures[kind] = {**quantiles(samples), "items_per_answer": returned / max(len(samples), 1)}
    return figures


class _Server(uvicorn.Server):
    """uvicorn without its signal handlers: the parent stops this process by closing stdin."""

    @contextlib.contextmanager
    def capture_signals(self) -> Any:
        yield


async def _serve(recommender: Recommender, folder: Path, users: dict[str, list[str]]) -> None:
    config = TidegateConfig(queue_url=f"sqlite:///{folder / 'queue.db'}", sync=SyncConfig())
    async with open_gateway_state(config, given=Given(recommender=recommender)) as state:
        # An admin tenant reads the database's users (an ordinary tenant's are its own, prefixed).
        await state.tenants.put_tenant(Tenant(name="shop", admin=True))
        _, key = await state.tenants.create_key("shop")
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        server = _Server(uvicorn.Config(create_app(state), lifespan="off", log_level="warning", ws="none"))
        task = asyncio.create_task(server.serve(sockets=[sock]))
        try:
            while not server.started:
                if task.done():
                    task.result()
                await asyncio.sleep(0.01)
            _emit({"event": "ready", "url": f"http://127.0.0.1:{sock.getsockname()[1]}", "key": key, **users})
            await _stdin_closed()
        finally:
            server.should_exit = True
            await task
            sock.close()


async def _stdin_closed() -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while await reader.read(4096):
        pass


def _emit(message: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


async def run(args: argparse.Namespace) -> None:
    """Seed, time in process, serve."""
    shop = Shop(args.products, args.users)
    rng = np.random.default_rng(args.seed)
    history = shop.history(args.history, rng)
    async with recs_store_for(args.store_url, prefix=args.prefix) as store:
        recommender = Recommender(store)
        started = time.perf_counter()
        await seed(recommender, shop.products, history)
        seeded_s = time.perf_counter() - started
        users = queries(shop, args.queries, rng, {i.user_id for i in history})
        health = await recommender.health()
        figures = await _in_process(recommender, users)
        _emit({"event": "inprocess", "seed_s": seeded_s, "items": health["items"], "users": health["users"],
               "cpu_s": _cpu_s(), **figures})
        with tempfile.TemporaryDirectory(prefix="tidegate-bench-recs-") as folder:
            await _serve(recommender, Path(folder), users)


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main(argv: Sequence[str] | None = None) -> int:
    """The serving process."""
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--store-url", required=True, help="memory:// or redis://host:port/db")
    parser.add_argument("--prefix", default="benchrecs", help="the Redis store's key prefix")
    parser.add_argument("--products", type=int, default=50_000)
    parser.add_argument("--users", type=int, default=20_000)
    parser.add_argument("--history", type=int, default=100_000, help="interactions recorded before timing")
    parser.add_argument("--queries", type=int, default=1000, help="queries of each kind")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    asyncio.run(run(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
