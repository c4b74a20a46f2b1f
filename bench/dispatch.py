"""Dispatch under load: the seed's scenario (1,000 virtual users, 10,000 requests/minute, then 300 %
overload) through the queue and a worker against the simulated provider, with priorities and
without (FIFO).

    .venv/bin/python bench/dispatch.py                  # full: ~4 minutes on 2 cores
    .venv/bin/python bench/dispatch.py --quick          # ~40 s
    .venv/bin/python bench/dispatch.py --queue redis    # private redis-server on a free port
    .venv/bin/python bench/dispatch.py --sim inproc     # simulator on the benchmark's own loop
    .venv/bin/python bench/dispatch.py --modes cost --no-ceiling   # the cost scenario alone, ~90 s
    .venv/bin/python bench/dispatch.py --ceiling-only   # the dispatch ceiling alone, ~15 s

Each run (priority, then FIFO, with the same seeded arrivals) sends the nominal phase, then the
overload phase, then lets the backlog drain for at most --drain-s and cancels the rest; every
request it enqueued must then be in a final state, or the benchmark fails. It prints markdown:
per-class throughput, queue wait and end-to-end latency per phase, priority vs FIFO, queue depth
over time, a dispatch ceiling with no rate limit, and verdicts against the targets and the
seed's figures. This is a benchmark, not a test: figures depend on the machine.

The cost scenario (`--modes cost`, bench/dispatch_cost.py) sends the same seeded mix three times,
with BULK deadlines 48 h away: every job on the premium model, tidegate's priority tiers, and the
tiers with the provider's own batch API for BULK; it reports each run's cost from the jobs' own
`cost_usd` and the CRITICAL and HIGH latency beside it.

The simulator runs in a subprocess by default. In the rate-limited phases both placements give
the same figures within noise (the simulator needs about a tenth of a core there), but at the
dispatch ceiling an in-process simulator shares the measured process's one core (GIL) with
tidegate and roughly halves the ceiling: the subprocess is the more faithful of the two.
"""

from __future__ import annotations

import sys
from pathlib import Path

# Run as `python bench/dispatch.py`, Python puts bench/ first on sys.path, where bench/queue.py
# would shadow the standard library's `queue` (asyncio's executors and redis-py import it). Put
# the repository root there instead, so the helpers import as the `bench` package.
_BENCH_DIR = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _BENCH_DIR]
sys.path.insert(0, str(_BENCH_DIR.parent))

if __name__ == "__main__":
    from bench.dispatch_cli import main  # only now: its imports pull in `queue`

    sys.exit(main(description=__doc__))
