"""One RQ `SimpleWorker` in its own process, for the benchmark: `python -m bench.rq_worker URL QUEUE`.

RQ's worker is synchronous, so it cannot share the benchmark's event loop the way SAQ's and arq's
do. It runs until SIGTERM (RQ's warm shutdown: the job in hand is finished first), then prints one
JSON line with what its jobs recorded, for the benchmark to check against what it enqueued.
"""

from __future__ import annotations

import json
import sys

import redis
from rq import Queue, SimpleWorker

from bench.peer_jobs import TALLY


def main(argv: list[str]) -> int:
    """Work the queue until told to stop; report the jobs run on stdout."""
    url, queue_name = argv
    connection = redis.Redis.from_url(url)
    TALLY.reset(0, with_event=False)
    worker = SimpleWorker([Queue(queue_name, connection=connection)], connection=connection)
    # WARNING, not RQ's default INFO: two log lines per job to a pipe would be measured too.
    worker.work(burst=False, logging_level="WARNING")
    print(json.dumps({"ran": TALLY.count, "distinct": len(TALLY.seen)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
