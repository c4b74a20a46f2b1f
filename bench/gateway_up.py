"""`tidegate up` for the gateway benchmark: the same wiring (`tidegate.app.up.run_up`: SQLite queue,
one worker and the gateway in one process) with the admin key printed as one JSON line that the
benchmark reads, instead of the table `tidegate up` prints for people, and without the change
flow.

    python -m bench.gateway_up --config tidegate.toml --concurrency 256

Serves until SIGINT or SIGTERM, like `tidegate up`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys

from tidegate.testing import TidegateConfig, UpInfo, UpSettings, ensure_sqlite_folder, run_loop, run_up

READY_PREFIX = "tidegate up ready: "


def _ready(info: UpInfo) -> None:
    print(READY_PREFIX + json.dumps({"api_url": info.api_url, "admin_key": info.admin_key}), flush=True)


def main(argv: list[str] | None = None) -> int:
    """Run until stopped; the exit status is 0 after a graceful stop."""
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True, help="the tidegate.toml to read")
    parser.add_argument("--concurrency", type=int, default=32, help="the worker's calls in flight")
    args = parser.parse_args(argv)
    # As `tidegate up` does: warnings only, so no line is written per request.
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    os.environ["TIDEGATE_CONFIG"] = args.config
    config = TidegateConfig.load()
    ensure_sqlite_folder(config.queue_url)
    # The change flow (demo shop → cache → recommender) is off: it has its own benchmark
    # (bench/sync.py), and its start-up snapshot and refresh jobs would share this process's
    # CPU and the queue with the requests measured here.
    settings = UpSettings(host="127.0.0.1", port=0, concurrency=args.concurrency, change_flow=False)
    with contextlib.suppress(KeyboardInterrupt):
        run_loop(run_up(config, settings, on_ready=_ready))
    return 0


if __name__ == "__main__":
    sys.exit(main())
