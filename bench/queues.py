"""Queue throughput and latency: tidegate (SQLite, Redis) vs SAQ, arq and RQ vs raw Redis.

    .venv/bin/python -m bench.queues           # the full run, ~2-4 minutes on 2 cores
    .venv/bin/python -m bench.queues --quick   # a smoke run, ~15 seconds
    .venv/bin/python -m bench.queues --only tidegate-redis,saq,raw

Everything runs against a private redis-server started here (free port, temporary folder, no
persistence) and stopped at the end. Systems are measured in rounds (each round runs every
system once, in turn) so that drift of the machine spreads over all of them; the table shows the
median round. Every run verifies that each job it enqueued was processed exactly once, and fails
otherwise: a fast figure for lost work is no figure.
"""

from __future__ import annotations

import sys

from bench.cli import main

if __name__ == "__main__":
    sys.exit(main(description=__doc__))
