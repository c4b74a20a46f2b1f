"""What tools outside the package may rely on beyond `from tidegate import …`: the benchmarks in
bench/, and users' own tests that run tidegate's parts in their process.

Everything else under `tidegate` is internal. These names are internal too, in the sense that
they may change between releases (the CHANGELOG says when), but each is here on purpose, with
the reason a tool needs it, and is the one way tools reach it: a part that moves inside the
package moves here in one line, and no tool reaches past this list (tests/test_testing_surface.py
checks bench/).

A name is imported from its home when first read (`from tidegate.testing import Simulator`
imports the simulator and nothing else), so a tool's process holds only the parts it uses, as
the product's own process would, and a name whose home needs an extra (`OtelTracing` needs
`tidegate[otel]`) costs nothing until read.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# What mypy checks tools against: each import is one name of SURFACE, exported as such
# (pyproject.toml's mypy override for this module; tests/test_testing_surface.py matches them).
if TYPE_CHECKING:
    from tidegate._eventloop import run as run_loop
    from tidegate._eventloop import server_gc
    from tidegate._otel import OtelTracing
    from tidegate._redis import lua_source
    from tidegate._sqlite import ensure_sqlite_folder
    from tidegate.ai import AIRequest, Timings, Usage, result_of
    from tidegate.app.components import Given, open_worker_parts
    from tidegate.app.gateway import open_gateway_state
    from tidegate.app.recs import open_recommendations
    from tidegate.app.sync import open_sync
    from tidegate.app.up import UpInfo, UpSettings, run_up
    from tidegate.config import (
        ModelConfig,
        PipelineSettings,
        ProviderBatchConfig,
        ProviderConfig,
        RoutingConfig,
        SyncConfig,
        TidegateConfig,
        WorkerSettings,
    )
    from tidegate.contract import decode as decode_request
    from tidegate.contract import to_body as request_body
    from tidegate.coord.limiter import rate_limiter_for
    from tidegate.coord.tenants import Tenant, tenant_store_for
    from tidegate.costs import micros_to_usd
    from tidegate.demo.shop import categories_of
    from tidegate.dispatch import traces as worker_traces
    from tidegate.dispatch.metrics import DispatchMetrics
    from tidegate.dispatch.router import RouteDecision
    from tidegate.dispatch.worker import Worker
    from tidegate.gateway.app import create_app
    from tidegate.gateway.openai.schemas import ChatCompletionRequest
    from tidegate.providers.client import UpstreamClient
    from tidegate.providers.client import _answered as http_answered
    from tidegate.recs import (
        Interaction,
        InteractionKind,
        Item,
        Recommender,
        RecQuery,
        RecResult,
        RecsSettings,
        RecsStore,
        recs_store_for,
    )
    from tidegate.recs.store import redis as recs_redis_store
    from tidegate.recs.store.base import UserEvent, UserParams
    from tidegate.recs.vectors import item_vector
    from tidegate.simulator.catalogue import default_models
    from tidegate.simulator.server import Simulator
    from tidegate.simulator.settings import ModelBehaviour, SimulatorSettings
    from tidegate.sync.cache import cache_for
    from tidegate.sync.contracts import EntityCache
    from tidegate.sync.values import canonical, checksum
    from tidegate.sync.verify import VerifySettings, row_source_for, verify
    from tidegate.tracing import NOOP, Tracing, installed, tracer


# Each name: where it lives (`module:attribute`, or a module) and why a tool outside the package
# may rely on it.
SURFACE: dict[str, tuple[str, str]] = {
    # Settings, built in code rather than read from a tidegate.toml.
    "TidegateConfig": ("tidegate.config:TidegateConfig", "the settings every process is built from"),
    "ModelConfig": ("tidegate.config:ModelConfig", "a model and its prices, for a provider built in code"),
    "ProviderConfig": ("tidegate.config:ProviderConfig",
                       "a provider, to point a config or a client at a simulator"),
    "ProviderBatchConfig": ("tidegate.config:ProviderBatchConfig", "a provider's batch API, for BULK work"),
    "RoutingConfig": ("tidegate.config:RoutingConfig", "the tiers that route each priority to models"),
    "WorkerSettings": ("tidegate.config:WorkerSettings", "a worker's concurrency, pacing and retries"),
    "SyncConfig": ("tidegate.config:SyncConfig", "the change flow's source, bus, cache and tables"),
    "PipelineSettings": ("tidegate.config:PipelineSettings", "the change flow's batching"),
    "default_models": ("tidegate.simulator.catalogue:default_models",
                       "the shipped price table, the models the simulator serves"),
    # The simulated provider: what to run against instead of a paid API.
    "Simulator": ("tidegate.simulator.server:Simulator",
                  "the simulated provider, served from the tool's own loop"),
    "SimulatorSettings": ("tidegate.simulator.settings:SimulatorSettings",
                          "the simulator's models, latency, limits and faults"),
    "ModelBehaviour": ("tidegate.simulator.settings:ModelBehaviour",
                       "one simulated model's latency and limits"),
    # Processes, wired as the command line wires them, in the tool's own event loop.
    "run_up": ("tidegate.app.up:run_up", "`tidegate up` (gateway, worker, simulator) in the tool's loop"),
    "UpSettings": ("tidegate.app.up:UpSettings", "what `run_up` starts: the options of `tidegate up`"),
    "UpInfo": ("tidegate.app.up:UpInfo", "where a started `run_up` listens, handed to its `on_ready`"),
    "open_worker_parts": ("tidegate.app.components:open_worker_parts",
                          "a worker's parts (upstream pools, limiter, ledger, ...) opened for a queue"),
    "Given": ("tidegate.app.components:Given", "parts a tool opened itself and hands to the ones it opens"),
    "open_gateway_state": ("tidegate.app.gateway:open_gateway_state",
                           "the gateway's parts, opened as `tidegate gateway` opens them"),
    "create_app": ("tidegate.gateway.app:create_app",
                   "the gateway's ASGI app over those parts, to serve or call"),
    "open_sync": ("tidegate.app.sync:open_sync", "the change flow, wired as `tidegate sync` wires it"),
    "open_recommendations": ("tidegate.app.recs:open_recommendations",
                             "the recommender and its sink, as `tidegate up` wires them"),
    "run_loop": ("tidegate._eventloop:run",
                 "run a coroutine on the loop and collector tidegate's processes use"),
    "server_gc": ("tidegate._eventloop:server_gc",
                  "the collector settings of tidegate's processes, for a measured one"),
    "ensure_sqlite_folder": ("tidegate._sqlite:ensure_sqlite_folder",
                             "make a sqlite:// URL's folder, as the processes do"),
    # The worker and what it is made of.
    "Worker": ("tidegate.dispatch.worker:Worker", "a worker over a queue, in the tool's loop"),
    "DispatchMetrics": ("tidegate.dispatch.metrics:DispatchMetrics",
                        "a worker's counters, to read what it did"),
    "rate_limiter_for": ("tidegate.coord.limiter:rate_limiter_for",
                         "the rate limiter workers share, opened from a URL"),
    "Tenant": ("tidegate.coord.tenants:Tenant", "a tenant: its keys, priorities and limits"),
    "tenant_store_for": ("tidegate.coord.tenants:tenant_store_for", "the tenant store, opened from a URL"),
    "AIRequest": ("tidegate.ai:AIRequest", "an AI call as the queue carries it"),
    "Usage": ("tidegate.ai:Usage", "the tokens an answer used"),
    "Timings": ("tidegate.ai:Timings", "where a job's time went (queue wait, provider)"),
    "result_of": ("tidegate.ai:result_of", "a finished job's answer, usage and timings"),
    "micros_to_usd": ("tidegate.costs:micros_to_usd", "a cost counted in micro-dollars, in dollars"),
    "ChatCompletionRequest": ("tidegate.gateway.openai.schemas:ChatCompletionRequest",
                              "a chat request as the OpenAPI document describes it (pydantic)"),
    "decode_request": ("tidegate.contract:decode", "a request body decoded as the door decodes it"),
    "request_body": ("tidegate.contract:to_body", "a decoded request as the provider is sent it"),
    "UpstreamClient": ("tidegate.providers.client:UpstreamClient",
                       "the client the worker calls providers with"),
    "RouteDecision": ("tidegate.dispatch.router:RouteDecision", "the provider and model a job is routed to"),
    # Tracing: the calls one job makes into tidegate.tracing, to time them.
    "NOOP": ("tidegate.tracing:NOOP", "tracing off, the default"),
    "Tracing": ("tidegate.tracing:Tracing", "what a tracing backend implements"),
    "installed": ("tidegate.tracing:installed", "a tracing backend installed for a block"),
    "tracer": ("tidegate.tracing:tracer", "the tracing backend installed now"),
    "OtelTracing": ("tidegate._otel:OtelTracing",
                    "tracing with the OpenTelemetry SDK (needs tidegate[otel])"),
    "worker_traces": ("tidegate.dispatch.traces", "the spans a worker opens for one job (a module)"),
    "http_answered": ("tidegate.providers.client:_answered",
                      "the upstream client's record of a status on its span"),
    # The change flow.
    "cache_for": ("tidegate.sync.cache:cache_for", "the entity cache, opened from a URL"),
    "EntityCache": ("tidegate.sync.contracts:EntityCache", "what an entity cache implements"),
    "canonical": ("tidegate.sync.values:canonical", "a row as the change flow stores it"),
    "checksum": ("tidegate.sync.values:checksum",
                 "a canonical row's checksum, as `sync verify` compares them"),
    "VerifySettings": ("tidegate.sync.verify:VerifySettings",
                       "what `tidegate sync verify` checks, and how fast"),
    "row_source_for": ("tidegate.sync.verify:row_source_for", "the source rows `tidegate sync verify` reads"),
    "verify": ("tidegate.sync.verify:verify", "`tidegate sync verify`, in the tool's loop"),
    # Recommendations.
    "Recommender": ("tidegate.recs:Recommender", "the recommender over a store"),
    "RecsSettings": ("tidegate.recs:RecsSettings", "the recommender's weights, decay and sizes"),
    "RecsStore": ("tidegate.recs:RecsStore", "what a recommendation store implements"),
    "recs_store_for": ("tidegate.recs:recs_store_for", "a recommendation store, opened from a URL"),
    "Item": ("tidegate.recs:Item", "a catalogue item"),
    "Interaction": ("tidegate.recs:Interaction", "a user's interaction with an item"),
    "InteractionKind": ("tidegate.recs:InteractionKind", "the kinds of interaction (view, cart, purchase…)"),
    "RecQuery": ("tidegate.recs:RecQuery", "a recommendation request"),
    "RecResult": ("tidegate.recs:RecResult", "a recommendation answer"),
    "UserEvent": ("tidegate.recs.store.base:UserEvent", "one event of a user's profile, as a store keeps it"),
    "UserParams": ("tidegate.recs.store.base:UserParams", "the profile settings a store applies"),
    "item_vector": ("tidegate.recs.vectors:item_vector", "an item's vector, as the recommender computes it"),
    "lua_source": ("tidegate._redis:lua_source", "the text of a Redis script the package ships"),
    "recs_redis_store": ("tidegate.recs.store.redis",
                         "the Redis store's module, to swap its scripts (needs tidegate[redis])"),
    "categories_of": ("tidegate.demo.shop:categories_of", "the demo shop's categories of a product name"),
}

__all__ = ["SURFACE", *SURFACE]  # one list of the names: the table's


def _home_of(name: str) -> Any:
    """The object `name` stands for, imported from its home."""
    target, _reason = SURFACE[name]
    module_name, _, attribute = target.partition(":")
    module = importlib.import_module(module_name)
    return getattr(module, attribute) if attribute else module


if not TYPE_CHECKING:  # mypy reads the imports above; at run time a name is imported when read

    def __getattr__(name: str) -> Any:
        if name not in SURFACE:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        value = _home_of(name)
        globals()[name] = value  # read once: later reads find it here
        return value

    def __dir__() -> list[str]:
        return sorted(set(globals()) | set(SURFACE))
