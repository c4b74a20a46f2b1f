"""What the gateway costs: latency it adds over calling the provider directly, and the sustained
end-to-end rate through gateway → queue → worker → provider, side by side with LiteLLM's proxy
and Portkey's gateway.

    .venv/bin/python -m bench.gateway                   # about 5 minutes on a quiet 2-core machine
    .venv/bin/python -m bench.gateway --quick           # a smoke run, about 2 minutes
    .venv/bin/python -m bench.gateway --systems up,redis --rates 100,200 --duration-s 15
    .venv/bin/python -m bench.gateway --systems up,redis,litellm   # without Portkey (no Node.js)
    .venv/bin/python -m bench.gateway --litellm-workers 2 --clients 256 --json bench/results/gw.json

Every part runs in a process of its own on loopback: the simulated provider (`tidegate simulate`,
a fixed answer time, no limits), each system, and the load generator (this process, which does
nothing else while a run lasts). The systems, one after the other, all on that one simulator:

- `up`: tidegate's embedded layout, gateway and worker in one process on the SQLite queue (the
  wiring of `tidegate up`);
- `redis`: `tidegate gateway` and `tidegate worker` as two processes on a private redis-server;
- `litellm`: LiteLLM's proxy (`litellm --config`, from the `bench` extra), its model pointed at
  the simulator, no database; reported as not run when it cannot be installed or started;
- `portkey`: Portkey's open-source gateway (`@portkey-ai/gateway`, one Node.js process, headless,
  listening on loopback only), which `make bench` installs with npm into bench/.peers; each
  request names its provider in headers (`x-portkey-provider: openai`, `x-portkey-custom-host:`
  the simulator). Reported as not run when Node.js or the package is missing; `--systems`
  without it leaves it out.

Added latency: at each offered rate (open loop: requests leave on a fixed schedule whether or not
earlier ones were answered) the same load goes straight to the simulator, then through the system;
added = through - direct at p50 and p99. A rate the system cannot keep up with ends its latency
runs. Sustained rate: a closed loop (N clients, each sending its next request when the last is
answered) counts answers over a window after a warm-up. Every answer must be a 200 with a
completion and must have reached the simulator (its request count is checked after each run).
The report then sets each system's figures side by side as ratios: to calling the simulator
directly, and to each tidegate layout.

The machine may be shared: each row shows the CPU that other processes took meanwhile, and a run
during which they took more than 20 % of a core is measured again (at most twice, within
--redo-budget-s of wall time) and the least disturbed attempt kept.
"""

from __future__ import annotations

import sys

from bench.gateway_cli import main

if __name__ == "__main__":
    sys.exit(main(description=__doc__))
