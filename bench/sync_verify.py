"""What `tidegate sync verify` costs: rows checked per second and CPU, on a synced table.

    .venv/bin/python -m bench.sync_verify                 # 100,000 rows, memory and Redis caches
    .venv/bin/python -m bench.sync_verify --rows 20000 --caches redis

A private PostgreSQL cluster and redis-server (the test suite's starters); one database with the
change-flow benchmark's `products` table (`bench/sync_servers.py`). Per cache: the pipeline takes
its initial snapshot into the cache and stops, then verify runs unthrottled over the correct
cache, in this process: wall time, rows/s, this process's CPU (decode, checksums, cache reads)
and the PostgreSQL server's CPU (its whole process tree) over the pass.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time

from bench.servers import private_redis
from bench.sync_cpu import tree_cpu_s
from bench.sync_servers import create_database, postgres, postmaster_pid
from tidegate.testing import (
    EntityCache,
    SyncConfig,
    TidegateConfig,
    VerifySettings,
    cache_for,
    open_sync,
    row_source_for,
    verify,
)


async def _snapshot(sync: SyncConfig, cache: EntityCache, rows: int) -> None:
    config = TidegateConfig.load(queue_url="sqlite:///unused.db").model_copy(update={"sync": sync})
    async with open_sync(config, cache=cache) as pipeline:
        stop = asyncio.Event()
        task = asyncio.create_task(pipeline.run(stop))
        deadline = time.monotonic() + 600
        while not await _snapshot_done(sync, cache):
            if time.monotonic() > deadline or task.done():
                raise RuntimeError("the snapshot did not reach the cache")
            await asyncio.sleep(0.2)
        stop.set()
        await task


async def _snapshot_done(sync: SyncConfig, cache: EntityCache) -> bool:
    checkpoint = await cache.get_checkpoint(f"pg:{sync.slot}")
    return isinstance(checkpoint, dict) and bool(checkpoint.get("snapshot_done"))


async def _measure(sync: SyncConfig, cache_url: str, rows: int, pg_pid: int) -> dict[str, float]:
    async with cache_for(cache_url, prefix=sync.prefix) as cache:
        await _snapshot(sync, cache, rows)
        async with row_source_for(sync, cache) as source:
            cpu, pg_cpu, started = time.process_time(), tree_cpu_s(pg_pid), time.perf_counter()
            report = await verify(source, cache, VerifySettings(max_rows_per_s=None))
            wall = time.perf_counter() - started
            cpu, pg_cpu = time.process_time() - cpu, tree_cpu_s(pg_pid) - pg_cpu
    checked = report.tables["products"].checked
    if checked != rows or not report.ok:
        raise RuntimeError(f"verify checked {checked} of {rows} rows, ok={report.ok}")
    return {"rows": checked, "wall_s": wall, "rows_per_s": checked / wall, "cpu_s": cpu,
            "cpu_us_per_row": cpu / checked * 1e6, "pg_cpu_s": pg_cpu}


async def _run(rows: int, caches: list[str]) -> None:
    with postgres() as server, private_redis() as redis:
        database = create_database(server, seed_rows=rows)
        pg_pid = postmaster_pid(server)
        print("| cache | rows | wall s | rows/s | verify CPU s | CPU µs/row | PostgreSQL CPU s |")
        print("|---|---:|---:|---:|---:|---:|---:|")
        for kind in caches:
            url = "memory://" if kind == "memory" else redis.url
            sync = SyncConfig(source_url=database.url, cache_url=url, tables=("products",),
                              slot=f"{database.slot}_{kind}", publication=database.publication,
                              prefix=f"verify-{database.suffix}-{kind}")
            result = await _measure(sync, url, rows, pg_pid)
            print(f"| {kind} | {result['rows']:,.0f} | {result['wall_s']:.2f} | "
                  f"{result['rows_per_s']:,.0f} | {result['cpu_s']:.2f} | "
                  f"{result['cpu_us_per_row']:.1f} | {result['pg_cpu_s']:.2f} |")


def main() -> None:
    """Parse the options and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--caches", default="memory,redis", help="comma-separated: memory, redis")
    args = parser.parse_args()
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_run(args.rows, [c for c in args.caches.split(",") if c]))


if __name__ == "__main__":
    main()
