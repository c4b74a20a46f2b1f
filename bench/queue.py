"""Queue throughput and latency: tidegate (SQLite, Redis) vs SAQ, arq and RQ vs raw Redis.

    .venv/bin/python bench/queue.py            # the full run, ~2-4 minutes on 2 cores
    .venv/bin/python bench/queue.py --quick    # a smoke run, ~15 seconds
    .venv/bin/python bench/queue.py --only tidegate-redis,saq,raw

Everything runs against a private redis-server started here (free port, temporary folder, no
persistence) and stopped at the end. Systems are measured in rounds (each round runs every
system once, in turn) so that drift of the machine spreads over all of them; the table shows the
median round. Every run verifies that each job it enqueued was processed exactly once, and fails
otherwise: a fast figure for lost work is no figure.
"""

from __future__ import annotations

import sys
from pathlib import Path

# Run as `python bench/queue.py`, Python puts bench/ first on sys.path, where this very file
# would shadow the standard library's `queue` (redis-py imports it). Put the repository root
# there instead, so the helpers import as the `bench` package.
_BENCH_DIR = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _BENCH_DIR]
sys.path.insert(0, str(_BENCH_DIR.parent))

if __name__ == "__main__":
    from bench.cli import main  # only now: it imports redis-py, which imports `queue`

    sys.exit(main(description=__doc__))
