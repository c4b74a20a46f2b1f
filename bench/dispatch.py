"""Dispatch under load: the seed's scenario (1,000 virtual users, 10,000 requests/minute, then 300 %
overload) through the queue and a worker against the simulated provider, with priorities and
without (FIFO).

    .venv/bin/python -m bench.dispatch                  # full: ~4 minutes on 2 cores
    .venv/bin/python -m bench.dispatch --quick          # ~40 s
    .venv/bin/python -m bench.dispatch --queue redis    # private redis-server on a free port
    .venv/bin/python -m bench.dispatch --sim inproc     # simulator on the benchmark's own loop
    .venv/bin/python -m bench.dispatch --modes cost --no-ceiling   # the cost scenario alone, ~90 s
    .venv/bin/python -m bench.dispatch --ceiling-only   # the dispatch ceiling alone, ~15 s

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

from bench.dispatch_cli import main

if __name__ == "__main__":
    sys.exit(main(description=__doc__))
