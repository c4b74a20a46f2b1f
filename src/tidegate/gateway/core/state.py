"""What a gateway holds while it runs: the queue, the tenant store, the shared limiter, budget
ledger, chunk relay, batch store and provider-batch store, the recommender, its metrics and
settings. `create_app` takes one, so tests (and `tidegate up`, which shares a queue and relay with
in-process workers) can build the app around components of their own."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry

from tidegate.callback_urls import check_callback_url
from tidegate.config import ModelConfig, TidegateConfig
from tidegate.coord.budget import BudgetLedger
from tidegate.coord.limiter import RateLimiter
from tidegate.coord.relay import ChunkRelay
from tidegate.coord.tenants import TenantStore
from tidegate.dispatch.provider_batches.store import ProviderBatchStore
from tidegate.dispatch.router import Router
from tidegate.errors import CallbackRefused
from tidegate.gateway.batches.store import BatchStore
from tidegate.gateway.core.metrics import GatewayMetrics, RecentResults
from tidegate.gateway.core.settings import BODY_ENVELOPE_BYTES, GatewaySettings, is_loopback_host
from tidegate.jobs import Job
from tidegate.queue import Queue

if TYPE_CHECKING:
    from tidegate.recs.engine import Recommender
    from tidegate.recs.monitor import RecsMonitor

__all__ = ["GatewayState"]

DRAIN_ANSWER_S = 0.5  # how long before the drain's cut waiting calls are answered


@dataclass(eq=False)
class GatewayState:
    """The components one gateway serves from, already opened: whoever opened them closes them
    (`tidegate.app.gateway.open_gateway_state` opens them from a config)."""

    config: TidegateConfig
    settings: GatewaySettings
    queue: Queue
    tenants: TenantStore
    limiter: RateLimiter  # per-tenant RPM, keys "tenant:<name>"
    ledger: BudgetLedger  # spend today, as the workers record it
    relay: ChunkRelay  # streamed chunks, published by workers
    batches: BatchStore  # the Files and Batch APIs' files and batches
    # What the workers sent to providers' own batch APIs (None: no provider has a `batch` section).
    provider_batches: ProviderBatchStore | None = None
    metrics: GatewayMetrics = field(default_factory=GatewayMetrics)
    # Registries exported by /metrics besides the gateway's own (e.g. DispatchMetrics of
    # workers running in the same process).
    extra_registries: tuple[CollectorRegistry, ...] = ()
    # What /v1/recommendations serves from (None: those routes answer 503), and the metrics of a
    # change flow feeding it in this process (`tidegate up`), which /v1/health reports.
    recommender: Recommender | None = None
    recs_monitor: RecsMonitor | None = None
    recent: RecentResults = field(init=False)
    models: dict[str, ModelConfig] = field(init=False)
    # Routes `model: "auto"` at the door as the workers will (tidegate.gateway.core.intake).
    router: Router = field(init=False)
    _credentials_seen: bool = field(default=False, init=False)
    _may_serve_without_keys: bool = field(default=False, init=False)
    _drain_deadline: float | None = field(default=None, init=False)  # time.monotonic()
    _waits: set[asyncio.Timeout] = field(default_factory=set, init=False)  # of calls in wait_job

    def __post_init__(self) -> None:
        self.recent = RecentResults(self.settings.stats_window)
        # Read on every request, and the settings hold for the state's life.
        self._may_serve_without_keys = (
            self.settings.allow_unauthenticated_local and is_loopback_host(self.settings.host))
        # What the configured providers serve, nothing else: without a provider the gateway
        # offers no model and refuses every AI call (tidegate.gateway.intake). A process that
        # runs with the simulator gives its provider in the config (tidegate.simulator.catalogue).
        self.models = {}
        for provider in self.config.providers:
            for model in provider.models:
                self.models.setdefault(model.name, model)  # the first provider serving a name wins
        self.router = Router(self.config)

    def offers(self, kind: str) -> bool:
        """Whether a configured model serves jobs of `kind`: a provider offers OpenAI's legacy
        completions and moderations only by serving a model of theirs."""
        return any(model.kind == kind for model in self.models.values())

    @property
    def max_body_bytes(self) -> int:
        """The largest request body read: the configured limit, never above what the queue
        accepts as one job plus the request's own fields (BODY_ENVELOPE_BYTES)."""
        queue_limit = self.queue.settings.max_payload_bytes + BODY_ENVELOPE_BYTES
        configured = self.settings.max_body_bytes
        return queue_limit if configured is None else min(configured, queue_limit)

    @property
    def draining(self) -> bool:
        """True once the server stopped accepting (`begin_drain`)."""
        return self._drain_deadline is not None

    def begin_drain(self, grace_s: float) -> None:
        """The server stops accepting and cuts open calls after `grace_s`: calls waiting for a
        job answer before then (see `wait_job`), in the API's own error shape, rather than be
        cut without an answer."""
        self._drain_deadline = time.monotonic() + max(grace_s - DRAIN_ANSWER_S, 0.0)
        cut = self._drain_cut()
        for scope in self._waits:
            scope.reschedule(cut)

    def _drain_cut(self) -> float | None:
        """When, on the event loop's clock, a drain answers the calls still waiting (None: no
        drain)."""
        if self._drain_deadline is None:
            return None
        return asyncio.get_running_loop().time() + max(self._drain_deadline - time.monotonic(), 0.0)

    async def wait_job(self, job_id: str, timeout_s: float) -> Job:
        """`queue.wait`, returned early (the job as it is then) when a drain leaves less time."""
        scope = asyncio.timeout_at(self._drain_cut())  # moved forward by begin_drain
        self._waits.add(scope)
        try:
            async with scope:
                return await self.queue.wait(job_id, timeout_s)
        except TimeoutError:
            if not scope.expired():
                raise
        finally:
            self._waits.discard(scope)
        job = await self.queue.get(job_id)
        assert job is not None  # waited for, so it existed; retention keeps it for a day
        return job

    @property
    def registries(self) -> tuple[CollectorRegistry, ...]:
        """Every registry /metrics exports (the process's Redis reconnections among them)."""
        from tidegate._redis import RECONNECT_REGISTRY

        return (self.metrics.registry, *self.extra_registries, RECONNECT_REGISTRY)

    async def credentials_exist(self) -> bool:
        """Whether the tenant store holds any tenant or key. Once true it stays true for this
        process: a gateway never falls back to serving without keys."""
        if not self._credentials_seen:
            self._credentials_seen = bool(await self.tenants.list_tenants()) or bool(
                await self.tenants.list_keys()
            )
        return self._credentials_seen

    async def serves_without_keys(self) -> bool:
        """Embedded mode: loopback bind, local access allowed, and no tenant or key exists."""
        return self._may_serve_without_keys and not await self.credentials_exist()

    async def check_callback_url(self, url: str) -> None:
        """Raise CallbackRefused for a URL the workers would refuse to call: not http(s), or a
        non-public address unless the config allows private targets."""
        # The workers' own check, so the gateway refuses exactly what a worker would.
        try:
            await check_callback_url(url, allow_private=self.config.callbacks.allow_private)
        except ValueError as exc:  # urlsplit: a bad port or IPv6 host; idna: a host it cannot encode
            raise CallbackRefused(f"callback_url {url!r} is not a valid URL: {exc}") from None
