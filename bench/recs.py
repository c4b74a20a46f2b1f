"""Recommendations: freshness under a stream of interactions, serving latency, and memory per user.

    .venv/bin/python -m bench.recs                  # about 6 minutes on 2 cores
    .venv/bin/python -m bench.recs --quick          # a smoke run, about 1.5 minutes
    .venv/bin/python -m bench.recs --parts fresh --stores memory --gc freeze --duration-s 60
    .venv/bin/python -m bench.recs --parts serve --stores memory --queries 3000
    .venv/bin/python -m bench.recs --markdown bench/results/recs.md --json bench/results/recs.json

The issue's targets: an interaction committed in PostgreSQL shows in that user's recommendations
within 100 ms at p99 at 1,000 interactions/s; n=10 served in under 20 ms at p99 over 50,000
items; and the memory per million users of profile state, stated. Each is measured with the
recommender's state in memory (`tidegate up`'s default) and on Redis (shared by every gateway).
Every server is private to the run: a PostgreSQL cluster (wal_level=logical, fsync off, on a free
port) and a redis-server.

1. Freshness (bench/recs_bench_fresh.py, bench/recs_bench_probe.py). A fresh database holds the
   demo shop's tables (products, users, interactions; its columns in PostgreSQL types) with a
   catalogue of 10,000 products, 20,000 users and 50,000 past interactions, which the change
   flow takes with its snapshot. The change flow runs as `tidegate up` wires it (`open_sync`,
   memory bus, `RecsSink` from `open_recommendations`, the entity cache and the recommender on
   the same URL), with a recorder sink after the RecsSink. A writer process inserts interactions
   at 1,000/s, one per transaction, for 30 s (8 s with --quick). Measured: every interaction's
   commit → recommender updated (the sink side, PostgreSQL's commit timestamp against the time
   the RecsSink had recorded it), and, for 10 probes per second, commit → the first
   `recommend()` answer that shows it: a purchase whose item leaves the buyer's list, or a new
   user whose first view ends their cold start; and the full garbage collections of the
   process meanwhile. Each store runs twice: with Python's collector as it is, and with
   `gc.freeze()` once the snapshot is loaded (`--gc`).
2. Serving (bench/recs_bench_serve.py, bench/recs_bench_gateway.py). In a process of its own:
   50,000 items and 100,000 past interactions of 20,000 users recorded, then
   `recommend(RecQuery(user, n=10))` one call at a time for 1,000 users with a history (drawn by
   activity) and 1,000 never seen; then the same users through the gateway
   (`GET /v1/recommendations/{user}?n=10`, a tenant's key, uvicorn on loopback), one request
   at a time from this process.
3. Memory (bench/recs_bench_memory.py). 50,000 typical users (mean 8 interactions) and 10,000
   users with a full recent list, recorded straight into each store; bytes per user and per
   million users (memory: the objects the store's user table holds; Redis: `used_memory`).
"""

from __future__ import annotations

import sys

from bench.recs_bench_cli import main

if __name__ == "__main__":
    sys.exit(main(description=__doc__))
