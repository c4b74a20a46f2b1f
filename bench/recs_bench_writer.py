"""The writer of the recommendations freshness benchmark: a process of its own that inserts
interactions into the shop's `interactions` table through psycopg2, one row per transaction (a
click is committed on its own), at a fixed rate (open loop).

    python -m bench.recs_bench_writer --dsn DSN --products 10000 --users 20000 --rate 1000 --duration-s 45

Users, items and kinds are drawn as `bench.recs_bench_data.Shop` draws them (the same shop the
database was seeded with). Open loop: interaction i is due at start + i / rate; a writer that
falls behind writes at once (never skips) and reports how late it was. It prints one JSON line
at the end (`bench.sync_writer.WriterResult`: `changes` counts interactions); `run_writer` is
the parent side.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import resource
import sys
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import psycopg2  # type: ignore[import-untyped]

from bench.common import BenchmarkError, percentile
from bench.recs_bench_data import Shop, user_id
from bench.sync_writer import WriterResult

REPO_ROOT = Path(__file__).resolve().parent.parent
INSERT = ("INSERT INTO interactions (user_id, product_id, kind, quantity, created_at) "
          "VALUES (%s, %s, %s, %s, now() AT TIME ZONE 'UTC')")


def write(dsn: str, shop: Shop, *, rate_per_s: float, duration_s: float, seed: int) -> WriterResult:
    """Insert interactions at `rate_per_s` for `duration_s`."""
    rng = np.random.default_rng(seed)
    planned = max(1, int(rate_per_s * duration_s))
    draws = [(user_id(user), shop.products[item].item_id, kind.value, 1 if kind.value == "view" else
              int(rng.integers(1, 4))) for user, item, kind in shop.draw(planned, rng)]
    conn = psycopg2.connect(dsn)
    conn.autocommit = True  # each INSERT is its own transaction, as a shop commits a click
    try:
        with conn.cursor() as cur:
            return _loop(cur, draws, rate_per_s)
    finally:
        conn.close()


def _loop(cur: Any, draws: Sequence[tuple[str, str, str, int]], rate_per_s: float) -> WriterResult:
    kinds: Counter[str] = Counter()
    late_s: list[float] = []
    cpu_before = _cpu_s()
    start_mono, started = time.monotonic(), time.time()
    for written, row in enumerate(draws):
        due = start_mono + written / rate_per_s
        now = time.monotonic()
        if due > now:
            time.sleep(due - now)
            late_s.append(0.0)
        else:
            late_s.append(now - due)
        cur.execute(INSERT, row)
        kinds[row[2]] += 1
    ended = time.time()
    return WriterResult(changes=len(draws), transactions=len(draws), ops=dict(kinds), started=started,
                        ended=ended, late_p99_ms=percentile(late_s, 0.99), late_max_ms=max(late_s) * 1000,
                        cpu_s=_cpu_s() - cpu_before)


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def run_writer(dsn: str, log_path: Path, *, products: int, users: int, rate_per_s: float,
                     duration_s: float, seed: int) -> WriterResult:
    """Run the writer in a process of its own and return what it committed."""
    argv = [sys.executable, "-m", "bench.recs_bench_writer", "--dsn", dsn, "--products", str(products),
            "--users", str(users), "--rate", str(rate_per_s), "--duration-s", str(duration_s),
            "--seed", str(seed)]
    with log_path.open("ab") as log:
        process = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=log,
            cwd=REPO_ROOT)
        out, _ = await process.communicate()
    if process.returncode != 0 or not out.strip():
        log_text = await asyncio.to_thread(log_path.read_text, errors="replace")
        raise BenchmarkError(f"the writer exited with {process.returncode}; the end of its log:\n"
                             f"{log_text[-2000:]}")
    return WriterResult.from_json(json.loads(out.decode().strip().splitlines()[-1]))


def main(argv: Sequence[str] | None = None) -> int:
    """The writer process."""
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dsn", required=True, help="libpq DSN of the shop's database")
    parser.add_argument("--products", type=int, required=True, help="the shop's catalogue size")
    parser.add_argument("--users", type=int, required=True, help="the shop's user count")
    parser.add_argument("--rate", type=float, required=True, help="interactions per second (open loop)")
    parser.add_argument("--duration-s", type=float, required=True, help="how long to write")
    parser.add_argument("--seed", type=int, default=1, help="the draws' random seed")
    args = parser.parse_args(argv)
    shop = Shop(args.products, args.users)
    result = write(args.dsn, shop, rate_per_s=args.rate, duration_s=args.duration_s, seed=args.seed)
    print(json.dumps(dataclasses.asdict(result)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
