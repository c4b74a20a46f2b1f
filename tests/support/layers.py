"""The layers of tidegate, from the bottom up: the one place the order is written down (data the
layer test reads, so it lives with the tests, not in the product).

Each layer is a tuple of names under `tidegate`: a module (`errors` is `tidegate/errors.py`) or a
package (`queue` is `tidegate/queue/` and everything in it). `__init__` is `tidegate/__init__.py`,
the public facade `from tidegate import …` reads, which re-exports the core's types and the queue;
`__main__` is `python -m tidegate`.

The rule: a runtime import points DOWN this list, never up. Within one layer, plain modules may
import each other (the core's modules are peers), but a package imports no other name of its own
layer unless the pair is in `SIDEWAYS`. Imports under `if TYPE_CHECKING:` do not count, since
they never run. No module takes part in an import cycle, inside a package or across packages;
a factory's lazy import of the backend it picks, inside its own package (`Queue.from_url`
importing `queue/redis.py`, which imports `queue/base.py`), runs only when called and is not
counted as one.
tests/test_layers.py reads every module's imports and enforces all of it; README.md's Layout
section draws the same list.

One home per feature: a feature's modules, its store included, live in one package, placed in
the layer of its highest part, so that every import still points down. OpenAI's Files and Batch
APIs are a surface of the gateway, and their store is read by the gateway alone (the composition
roots open it), so all of it is `gateway/batches/`, the store in `gateway/batches/store/`; `coord`
keeps only the state the gateway and the workers share. Provider batches (BULK jobs sent to a
provider's own batch API) are the workers': submission, collection, upkeep, their store and the
providers' batch clients are `dispatch/provider_batches/`; the gateway reads that store (down a
layer) for its one admin route, which stays with the gateway's admin surface because it is HTTP.
Inside the gateway, one package per surface (`openai/`, `responses/`, `anthropic/`, `batches/`,
`admin/`) holds its routes, schemas and dialect, and `gateway/core/` what they share, the dialect
seam included; the core imports no surface's routes. A surface imports the core and, where it
builds on another (a batch's lines are OpenAI and Responses requests; the Messages routes wait as
the OpenAI ones do), that one's modules, never in a cycle.

The product never imports its development tools: the simulator and the demo sit above every
product layer, so nothing below `app` may import them (tests/test_layers.py says so by name).
"""

from __future__ import annotations

__all__ = ["LAYERS", "SIDEWAYS"]

LAYERS: tuple[tuple[str, ...], ...] = (
    # 1. core: the job and AI-call types, errors, settings and the helpers every family shares
    (
        "errors",
        "jobs",
        "contract",
        "ai",
        "costs",
        "config",
        "callback_urls",
        "_urls",
        "_lifecycle",
        "_redis",
        "_sqlite",
        "_formats",
        "_eventloop",
        "_shutdown",
        "_group_commit",
        "_labels",
        "tracing",
        "_otel",
    ),
    ("queue",),  # 2. the durable priority queue
    ("__init__",),  # 3. the public facade: `from tidegate import Queue, Job, …`
    ("coord",),  # 4. tenants and keys, rate limiter, budget ledger, relay
    ("providers",),  # 5. the upstream client and its adapters
    ("dispatch",),  # 6. workers: route, pace, budget, retry, dead-letter
    ("sync",),  # 7. the change flow
    ("recs",),  # 8. recommendations fed by the change flow
    ("gateway",),  # 9. the HTTP API
    # 10. the simulated provider: a development tool above the whole product, which knows
    # nothing of it; the composition roots that start one (app, demo, cli) inject its config.
    ("simulator",),
    ("app",),  # 11. composition roots: open the parts of a process and wire them
    ("demo",),  # 12. `tidegate demo` and its shop
    ("testing",),  # 13. what tools outside the package may rely on (bench/, users' own tests)
    ("cli",),  # 14. the command line
    ("__main__",),  # 15. `python -m tidegate`
)

# Pairs (importer, imported) of packages in one layer that may import each other. None today:
# every package has a layer of its own.
SIDEWAYS: frozenset[tuple[str, str]] = frozenset()
