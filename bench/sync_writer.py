"""The writer of the change-flow benchmark: a process of its own that commits small mixed
transactions into `products` through psycopg2, at a fixed rate (open loop) or as fast as it can.

    python -m bench.sync_writer --dsn DSN --rate 2000 --duration-s 60
    python -m bench.sync_writer --dsn DSN --changes 200000            # as fast as it can

Each transaction holds 2 to 6 changes (4 on average), each an INSERT (25 %), an UPDATE (50 %)
or a DELETE (25 %) of one row, sent as one multi-statement query: one round trip, one implicit
transaction. Every statement touches exactly one row (the writer is the table's only writer and
keeps its live ids), so the count of changes it reports is the count the slot carries. Open
loop: transaction i is due when the changes before it, at `rate` per second, have been
written; when the writer falls behind, it writes at once (never skips) and reports how late.

It prints one JSON line at the end: changes, transactions, the counts per operation, wall times
and lateness. The parent side, `run_writer`, starts it and reads that line.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import random
import resource
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg2  # type: ignore[import-untyped]

from bench.common import BenchmarkError, percentile

REPO_ROOT = Path(__file__).resolve().parent.parent

SIZES = (2, 3, 4, 5, 6)  # changes per transaction, uniformly: 4 on average
TAGS = ("new", "sale", "eco", "gift", "bulk", "limited", "local", "premium")
MIN_LIVE_ROWS = 100  # below this the writer only inserts, so updates and deletes find rows


@dataclass(frozen=True, slots=True)
class WriterResult:
    """What one writer run committed, and how closely it kept its schedule."""

    changes: int
    transactions: int
    ops: dict[str, int]
    started: float  # wall clock (time.time) of the first transaction's start
    ended: float  # wall clock after the last commit
    late_p99_ms: float | None  # open loop only: how late transactions started
    late_max_ms: float | None
    cpu_s: float  # the writer process's own CPU

    @property
    def seconds(self) -> float:
        """Wall time from the first transaction to the last commit."""
        return self.ended - self.started

    @property
    def rate(self) -> float:
        """Changes committed per second."""
        return self.changes / self.seconds if self.seconds > 0 else 0.0

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> WriterResult:
        """The JSON line the writer printed."""
        return cls(**raw)


class Workload:
    """The mixed statements, drawn from a seeded generator over the table's live ids."""

    def __init__(self, live_ids: list[int], next_id: int, seed: int) -> None:
        self._random = random.Random(seed)
        self._live = live_ids
        self._index = {row_id: i for i, row_id in enumerate(live_ids)}
        self._next_id = next_id
        self.ops = {"insert": 0, "update": 0, "delete": 0}

    def transaction(self, cursor: Any) -> tuple[bytes, int]:
        """One transaction's statements as one query, and its number of changes."""
        size = self._random.choice(SIZES)
        return b";".join(self._statement(cursor) for _ in range(size)), size

    def _statement(self, cursor: Any) -> bytes:
        draw = self._random.random()
        if draw < 0.25 or len(self._live) < MIN_LIVE_ROWS:
            return self._insert(cursor)
        if draw < 0.75:
            return self._update(cursor)
        return self._delete(cursor)

    def _insert(self, cursor: Any) -> bytes:
        row_id, self._next_id = self._next_id, self._next_id + 1
        self._index[row_id] = len(self._live)
        self._live.append(row_id)
        self.ops["insert"] += 1
        return bytes(cursor.mogrify(
            "INSERT INTO products (id, name, price, stock, tags, updated_at) "
            "VALUES (%s, %s, %s, %s, %s, now())",
            (row_id, f"product {row_id}", self._price(), self._random.randrange(500), self._tags())))

    def _update(self, cursor: Any) -> bytes:
        row_id = self._live[self._random.randrange(len(self._live))]
        self.ops["update"] += 1
        if self._random.random() < 0.2:
            return bytes(cursor.mogrify(
                "UPDATE products SET name = %s, tags = %s, updated_at = now() WHERE id = %s",
                (f"product {row_id} rev {self.ops['update']}", self._tags(), row_id)))
        return bytes(cursor.mogrify(
            "UPDATE products SET price = %s, stock = %s, updated_at = now() WHERE id = %s",
            (self._price(), self._random.randrange(500), row_id)))

    def _delete(self, cursor: Any) -> bytes:
        position = self._random.randrange(len(self._live))
        row_id = self._live[position]
        # Swap-remove keeps the pick O(1): the last id takes the deleted one's place.
        last = self._live.pop()
        if last != row_id:
            self._live[position] = last
            self._index[last] = position
        del self._index[row_id]
        self.ops["delete"] += 1
        return bytes(cursor.mogrify("DELETE FROM products WHERE id = %s", (row_id,)))

    def _price(self) -> Decimal:
        return Decimal(self._random.randrange(100, 100_000)) / 100

    def _tags(self) -> list[str]:
        return self._random.sample(TAGS, self._random.randint(1, 3))


def write(dsn: str, *, rate_per_s: float | None, duration_s: float | None, changes: int | None,
          seed: int) -> WriterResult:
    """Write until `duration_s` passed or `changes` were committed (whichever is given)."""
    conn = psycopg2.connect(dsn)
    conn.autocommit = True  # each multi-statement query is then one implicit transaction
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT id FROM products ORDER BY id")
            live = [int(row[0]) for row in cur.fetchall()]
            workload = Workload(live, (max(live) if live else 0) + 1, seed)
            return _loop(cur, workload, rate_per_s, duration_s, changes)
    finally:
        conn.close()


def _loop(cur: Any, workload: Workload, rate_per_s: float | None, duration_s: float | None,
          changes: int | None) -> WriterResult:
    written = transactions = 0
    late_s: list[float] = []
    cpu_before = _cpu_s()
    start_mono, started = time.monotonic(), time.time()
    end_mono = start_mono + duration_s if duration_s is not None else None
    while True:
        if changes is not None and written >= changes:
            break
        now = time.monotonic()
        if rate_per_s is not None:
            due = start_mono + written / rate_per_s
            if end_mono is not None and due >= end_mono:
                break
            if due > now:
                time.sleep(due - now)
            else:
                late_s.append(now - due)
        elif end_mono is not None and now >= end_mono:
            break
        query, size = workload.transaction(cur)
        cur.execute(query)
        written += size
        transactions += 1
    ended = time.time()
    # A transaction on time counts as 0 late: the percentiles are over every transaction.
    late_s.extend([0.0] * (transactions - len(late_s)))
    timed = rate_per_s is not None and transactions > 0
    return WriterResult(
        changes=written, transactions=transactions, ops=dict(workload.ops), started=started,
        ended=ended, late_p99_ms=percentile(late_s, 0.99) if timed else None,
        late_max_ms=max(late_s) * 1000 if timed else None, cpu_s=_cpu_s() - cpu_before)


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def run_writer(dsn: str, log_path: Path, *, rate_per_s: float | None = None,
                     duration_s: float | None = None, changes: int | None = None,
                     seed: int = 1) -> WriterResult:
    """Run the writer in a process of its own and return what it committed."""
    args = ["--dsn", dsn, "--seed", str(seed)]
    if rate_per_s is not None:
        args += ["--rate", str(rate_per_s)]
    if duration_s is not None:
        args += ["--duration-s", str(duration_s)]
    if changes is not None:
        args += ["--changes", str(changes)]
    return WriterResult.from_json(await run_module("bench.sync_writer", args, log_path, "the writer"))


async def run_module(module: str, args: Sequence[str], log_path: Path, what: str) -> dict[str, Any]:
    """Run `python -m module args` from the repository root, its stderr appended to `log_path`,
    and return the JSON object it printed last on stdout."""
    with log_path.open("ab") as log:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", module, *args, stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=log, cwd=REPO_ROOT)
        out, _ = await process.communicate()
    if process.returncode != 0 or not out.strip():
        log_text = await asyncio.to_thread(log_path.read_text, errors="replace")
        raise BenchmarkError(f"{what} exited with {process.returncode}; the end of its log:\n"
                             f"{log_text[-2000:]}")
    answer: dict[str, Any] = json.loads(out.decode().strip().splitlines()[-1])
    return answer


def main(argv: Sequence[str] | None = None) -> int:
    """The writer process."""
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dsn", required=True, help="libpq DSN of the database holding products")
    parser.add_argument("--rate", type=float,
                        help="changes per second (open loop); default: as fast as it can")
    parser.add_argument("--duration-s", type=float, help="stop after this long")
    parser.add_argument("--changes", type=int, help="stop after this many changes")
    parser.add_argument("--seed", type=int, default=1, help="the workload's random seed")
    args = parser.parse_args(argv)
    if args.duration_s is None and args.changes is None:
        parser.error("give --duration-s or --changes")
    result = write(args.dsn, rate_per_s=args.rate, duration_s=args.duration_s, changes=args.changes,
                   seed=args.seed)
    print(json.dumps(dataclasses.asdict(result)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
