"""What a gateway holds while it runs: the queue, the tenant store, the shared limiter, budget
ledger and chunk relay, the recommender, its metrics and settings. `create_app` takes one, so
tests (and `tidegate up`, which shares a queue and relay with in-process workers) can build the
app around components of their own."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final
from urllib.parse import parse_qsl, urlsplit

from prometheus_client import CollectorRegistry

from tidegate.callback_urls import check_callback_url
from tidegate.config import ModelConfig, TidegateConfig, default_models
from tidegate.coord.budget import BudgetLedger, budget_ledger_for
from tidegate.coord.limiter import RateLimiter, rate_limiter_for
from tidegate.coord.relay import ChunkRelay, relay_for
from tidegate.coord.tenants import TenantStore, tenant_store_for
from tidegate.errors import CallbackRefused
from tidegate.gateway.metrics import GatewayMetrics, RecentResults
from tidegate.gateway.settings import BODY_ENVELOPE_BYTES, GatewaySettings, is_loopback_host
from tidegate.jobs import Job
from tidegate.queue import Queue

if TYPE_CHECKING:
    from tidegate.recs.engine import Recommender
    from tidegate.recs.monitor import RecsMonitor

__all__ = ["FROM_CONFIG", "GatewayState"]


class _FromConfig:
    def __repr__(self) -> str:
        return "FROM_CONFIG"


FROM_CONFIG: Final = _FromConfig()
"""`recs_url` not given: the change flow's cache when it is shared (Redis), else no recommender."""
_SHARED_SCHEMES = ("redis", "rediss", "unix")
DRAIN_ANSWER_S = 0.5  # how long before the drain's cut waiting calls are answered


@dataclass(eq=False)
class GatewayState:
    """The components one gateway serves from. Build it with `GatewayState.open(...)`."""

    config: TidegateConfig
    settings: GatewaySettings
    queue: Queue
    tenants: TenantStore
    limiter: RateLimiter  # per-tenant RPM, keys "tenant:<name>"
    ledger: BudgetLedger  # spend today, as the workers record it
    relay: ChunkRelay  # streamed chunks, published by workers
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
    _credentials_seen: bool = field(default=False, init=False)
    _drain_deadline: float | None = field(default=None, init=False)  # time.monotonic()
    _draining: asyncio.Event = field(default_factory=asyncio.Event, init=False)

    def __post_init__(self) -> None:
        self.recent = RecentResults(self.settings.stats_window)
        # Without configured providers the workers serve the price table through the simulator
        # (TidegateConfig.with_simulator), so that is what the gateway offers too.
        served = [model for provider in self.config.providers for model in provider.models]
        self.models = {}
        for model in served or default_models():
            self.models.setdefault(model.name, model)  # the first provider serving a name wins

    @classmethod
    @contextlib.asynccontextmanager
    async def open(
        cls,
        config: TidegateConfig,
        *,
        settings: GatewaySettings | None = None,
        queue: Queue | None = None,
        tenants: TenantStore | None = None,
        limiter: RateLimiter | None = None,
        ledger: BudgetLedger | None = None,
        relay: ChunkRelay | None = None,
        metrics: GatewayMetrics | None = None,
        extra_registries: Sequence[CollectorRegistry] = (),
        recommender: Recommender | None = None,
        recs_url: str | _FromConfig | None = FROM_CONFIG,
        recs_monitor: RecsMonitor | None = None,
    ) -> AsyncIterator[GatewayState]:
        """Open what was not given, from `config.queue_url`; close on exit only what it opened.

        A relay must be shared with the workers: on SQLite (in-process MemoryRelay) pass the
        workers' relay, or streamed chunks never reach this gateway.

        The recommender, when not given, is opened on the store at `recs_url` (None: none). By
        default that is the change flow's cache (`sync.cache_url`, with its prefix) when it is on
        Redis, where the change flow's sink and every gateway share it; a memory cache lives in
        another process's memory, so a gateway on its own serves no recommendations."""
        url = config.queue_url
        async with contextlib.AsyncExitStack() as stack:
            if queue is None:
                queue = await stack.enter_async_context(Queue.from_url(url))
            if tenants is None:
                tenants = await stack.enter_async_context(tenant_store_for(url))
            if limiter is None:
                # Named after the queue, so gateways of one queue share their tenants' counts and
                # gateways of another queue on the same Redis do not.
                limiter = await stack.enter_async_context(rate_limiter_for(url, _queue_name(url)))
            if ledger is None:
                # The workers' own ledger (default name): spend today is what they recorded.
                ledger = budget_ledger_for(url)
                stack.push_async_callback(ledger.close)
            if relay is None:
                relay = relay_for(url)
                stack.push_async_callback(relay.close)
            if recommender is None:
                store_url = _recs_url(config, recs_url)
                if store_url is not None:
                    from tidegate.recs.engine import Recommender
                    from tidegate.recs.store.base import recs_store_for

                    store = await stack.enter_async_context(
                        recs_store_for(store_url, prefix=config.sync.prefix))
                    recommender = Recommender(store, config.recs)
            yield cls(config=config, settings=settings or config.gateway, queue=queue,
                      tenants=tenants, limiter=limiter, ledger=ledger, relay=relay,
                      metrics=metrics or GatewayMetrics(), extra_registries=tuple(extra_registries),
                      recommender=recommender, recs_monitor=recs_monitor)

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
        return self._draining.is_set()

    def begin_drain(self, grace_s: float) -> None:
        """The server stops accepting and cuts open calls after `grace_s`: calls waiting for a
        job answer before then (see `wait_job`), in the API's own error shape, rather than be
        cut without an answer."""
        self._drain_deadline = time.monotonic() + max(grace_s - DRAIN_ANSWER_S, 0.0)
        self._draining.set()

    async def wait_job(self, job_id: str, timeout_s: float) -> Job:
        """`queue.wait`, returned early (the job as it is then) when a drain leaves less time."""
        waiting = asyncio.ensure_future(self.queue.wait(job_id, timeout_s))
        draining = asyncio.ensure_future(self._draining.wait())
        try:
            await asyncio.wait([waiting, draining], return_when=asyncio.FIRST_COMPLETED)
            if not waiting.done() and self._drain_deadline is not None:
                await asyncio.wait([waiting], timeout=max(self._drain_deadline - time.monotonic(), 0.0))
            if waiting.done():
                return waiting.result()
        finally:
            draining.cancel()
            waiting.cancel()
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
        return (
            self.settings.allow_unauthenticated_local
            and is_loopback_host(self.settings.host)
            and not await self.credentials_exist()
        )

    async def check_callback_url(self, url: str) -> None:
        """Raise CallbackRefused for a URL the workers would refuse to call: not http(s), or a
        non-public address unless the config allows private targets."""
        # The workers' own check, so the gateway refuses exactly what a worker would.
        try:
            await check_callback_url(url, allow_private=self.config.callbacks.allow_private)
        except ValueError as exc:  # urlsplit: a bad port or IPv6 host; idna: a host it cannot encode
            raise CallbackRefused(f"callback_url {url!r} is not a valid URL: {exc}") from None


def _recs_url(config: TidegateConfig, given: str | _FromConfig | None) -> str | None:
    if not isinstance(given, _FromConfig):
        return given
    cache_url = config.sync.cache_url
    return cache_url if urlsplit(cache_url).scheme in _SHARED_SCHEMES else None


def _queue_name(url: str) -> str:
    return dict(parse_qsl(urlsplit(url).query)).get("name", "default")
