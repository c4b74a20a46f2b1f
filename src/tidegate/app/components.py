"""The one place a process opens its parts from configuration, once per role: the queue, the
tenant store, the budget ledger and the chunk relay for every role; for a gateway its per-tenant
rate limiter, the batch store and the provider-batch store; for a worker its upstream pools, its
pacing limiter and the callback sender (`open_worker_parts`); and as asked the entity cache and
the recommender. `tidegate up`, `tidegate gateway` and `tidegate worker` all open them here, each
with the roles it plays:

    async with Components.open(config, worker=True) as parts:
        worker = Worker(parts.for_worker(), config, settings)

Parts are opened in dependency order on one AsyncExitStack, so they close in the reverse order,
each close bounded (`tidegate._shutdown.CLOSE_BOUND_S`): a part that cannot close in time is
abandoned with a warning and the parts opened before it still close. A part given instead of
opened (`Given`: a test's queue, or a relay shared with in-process workers) is used as is and
left open.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Final

from tidegate._formats import migrating
from tidegate._shutdown import close_bounded, enter_bounded
from tidegate.config import TidegateConfig
from tidegate.coord import queue_name_of
from tidegate.coord.budget import BudgetLedger, budget_ledger_for
from tidegate.coord.limiter import RateLimiter, rate_limiter_for
from tidegate.coord.relay import ChunkRelay, relay_for
from tidegate.coord.tenants import TenantStore, tenant_store_for
from tidegate.dispatch.provider_batches.store import ProviderBatchStore, provider_batch_store_for
from tidegate.dispatch.worker import WorkerParts
from tidegate.gateway.batches.store import BatchStore, batch_store_for
from tidegate.providers.client import UpstreamClient
from tidegate.queue import Queue

if TYPE_CHECKING:
    from tidegate.dispatch.callbacks import CallbackSender
    from tidegate.recs.engine import Recommender
    from tidegate.sync.contracts import EntityCache

__all__ = ["NOTHING_GIVEN", "Components", "Given", "open_worker_parts"]


@dataclass(frozen=True, slots=True)
class Given:
    """Parts the caller opened and shares with what is opened here (a test's queue, a relay
    shared with in-process workers, one pacing limiter for several workers): used as they are,
    and left open."""

    queue: Queue | None = None
    tenants: TenantStore | None = None
    ledger: BudgetLedger | None = None
    relay: ChunkRelay | None = None
    limiter: RateLimiter | None = None  # a gateway's per-tenant RPM
    pacing: RateLimiter | None = None  # a worker's pacing under the providers' limits
    provider_batches: ProviderBatchStore | None = None
    callbacks: CallbackSender | None = None
    recommender: Recommender | None = None


NOTHING_GIVEN: Final = Given()
"""Every part opened here: what a process of its own gives."""


@dataclass(frozen=True, slots=True)
class Components:
    """The opened parts of one process. Build it with `Components.open(config, ...)`."""

    config: TidegateConfig
    queue: Queue
    tenants: TenantStore
    ledger: BudgetLedger  # spend per tenant and model, recorded by workers, read by gateways
    relay: ChunkRelay  # streamed chunks: workers publish, gateways subscribe
    limiter: RateLimiter | None = None  # the gateways' per-tenant RPM
    batches: BatchStore | None = None  # the gateways' files and batches (Files and Batch APIs)
    # What the workers sent to providers' own batch APIs; None when no provider has a `batch` section.
    provider_batches: ProviderBatchStore | None = None
    callbacks: CallbackSender | None = None  # None: no signing secret in the environment
    cache: EntityCache | None = None  # the change flow's entity cache
    recommender: Recommender | None = None
    worker_parts: WorkerParts | None = None  # opened for the worker role

    def for_worker(self) -> WorkerParts:
        """What a `Worker` of this process works with (opened with `worker=True`)."""
        if self.worker_parts is None:
            raise ValueError("a worker needs its parts: open the components with worker=True")
        return self.worker_parts

    @classmethod
    @contextlib.asynccontextmanager
    async def open(
        cls,
        config: TidegateConfig,
        *,
        worker: bool = False,
        gateway: bool = False,
        cache: bool = False,
        recs_url: str | None = None,
        given: Given = NOTHING_GIVEN,
    ) -> AsyncIterator[Components]:
        """Open on `config.queue_url` what `given` does not hold: the queue, tenants, ledger and
        relay always; for a `gateway` the rate limiter and the batch store; for a `worker` its
        parts (`open_worker_parts`) and the callback sender when the secret named by
        `config.callbacks.secret_env` is set; for either the provider-batch store when a provider
        of `config` has a `batch` section (it connects on first use); the entity cache of
        `config.sync` when `cache` is True; and a recommender on the store at `recs_url` (under
        `config.sync.prefix`, its settings `config.recs`). Close on exit only what was opened
        here."""
        url = config.queue_url
        async with contextlib.AsyncExitStack() as stack:
            # Every store built here opens in the configured migrate mode ([storage]).
            with migrating(config.storage.migrate):
                queue = given.queue
                if queue is None:
                    queue = await enter_bounded(stack, Queue.from_url(url), "the queue")
                tenants = given.tenants
                if tenants is None:
                    tenants = await enter_bounded(stack, tenant_store_for(url), "the tenant store")
                limiter = given.limiter
                if gateway and limiter is None:
                    # Named after the queue, so gateways of one queue share their tenants' counts and
                    # gateways of another queue on the same Redis do not.
                    limiter = await enter_bounded(stack, rate_limiter_for(url, queue_name_of(url)),
                                                  "the rate limiter")
                ledger = given.ledger
                if ledger is None:
                    # The default name: every worker and gateway of the queue reads and records one spend.
                    ledger = await enter_bounded(stack, budget_ledger_for(url), "the budget ledger")
                relay = given.relay
                if relay is None:
                    relay = relay_for(url)  # connects on first use: only a close to arrange
                    close_bounded(stack, relay.close, "the relay")
                files = (await enter_bounded(stack, batch_store_for(url), "the batch store")
                         if gateway else None)
                sent = given.provider_batches
                if sent is None and (worker or gateway) and _sends_batches(config):
                    sent = provider_batch_store_for(url)  # opens on first use: only a close to arrange
                    close_bounded(stack, sent.close, "the provider-batch store")
                sender = given.callbacks
                if worker and sender is None:
                    sender = await _open_callbacks(stack, config)
                worker_parts = None
                if worker:
                    shared = replace(given, tenants=tenants, ledger=ledger, relay=relay,
                                     provider_batches=sent, callbacks=sender)
                    worker_parts = await stack.enter_async_context(open_worker_parts(config, queue, shared))
                entity_cache = None
                # The change flow's parts are imported only by the processes that ask for them: a
                # worker or a gateway on its own never loads numpy or the cache backends.
                if cache:
                    from tidegate.sync.cache import open_cache

                    entity_cache = await enter_bounded(stack, open_cache(config.sync), "the entity cache")
                recommender = given.recommender
                if recommender is None and recs_url is not None:
                    from tidegate.app.recs import open_recommender

                    recommender = await open_recommender(stack, config, recs_url)
                parts = cls(config=config, queue=queue, tenants=tenants, ledger=ledger, relay=relay,
                            limiter=limiter, batches=files, provider_batches=sent, callbacks=sender,
                            cache=entity_cache, recommender=recommender, worker_parts=worker_parts)
            yield parts


@contextlib.asynccontextmanager
async def open_worker_parts(
    config: TidegateConfig, queue: Queue, given: Given = NOTHING_GIVEN
) -> AsyncIterator[WorkerParts]:
    """What a worker of `config` works with on `queue`, each part closed on exit after the
    worker: an upstream pool per provider, the pacing limiter (shared by every worker on a Redis
    server under the default name; in-process on SQLite), the budget ledger when a budget is
    configured, and the provider-batch store when a provider has a `batch` section, unless
    `given` holds them; and the relay, tenants and callback sender `given` holds (None: the
    worker streams nothing, applies only the configured budgets, sends no callbacks).

    The one way to build a worker's parts: `Components.open(config, worker=True)` calls it with
    the process's shared parts, tests and benchmarks with a queue of their own."""
    url = config.queue_url
    async with contextlib.AsyncExitStack() as stack:
        with migrating(config.storage.migrate):
            upstreams: dict[str, UpstreamClient] = {}
            for provider in config.providers:
                client = upstreams[provider.name] = UpstreamClient(provider)
                await client.open()
                close_bounded(stack, client.close, f"the upstream pool of {provider.name}")
            pacing = given.pacing
            if pacing is None:
                pacing = rate_limiter_for(url)  # connects on first use: only a close to arrange
                close_bounded(stack, pacing.close, "the worker's rate limiter")
            ledger = given.ledger
            if ledger is None and config.budgets.limited:
                ledger = budget_ledger_for(url)
                close_bounded(stack, ledger.close, "the worker's budget ledger")
            store = given.provider_batches
            if store is None and _sends_batches(config):
                store = provider_batch_store_for(url)
                close_bounded(stack, store.close, "the worker's provider-batch store")
            parts = WorkerParts(queue=queue, upstreams=upstreams, limiter=pacing, ledger=ledger,
                                provider_batches=store, relay=given.relay, tenants=given.tenants,
                                callbacks=given.callbacks)
        yield parts


def _sends_batches(config: TidegateConfig) -> bool:
    """Whether a provider of `config` has a `batch` section (jobs go to its own batch API)."""
    return any(provider.batch is not None for provider in config.providers)


async def _open_callbacks(stack: contextlib.AsyncExitStack, config: TidegateConfig) -> CallbackSender | None:
    """A callback sender signing with the configured secret, or None when it is not set."""
    secret = os.environ.get(config.callbacks.secret_env)
    if not secret:
        return None
    from tidegate.dispatch.callbacks import CallbackSender

    sender = CallbackSender(config.callbacks, secret.encode())
    return await enter_bounded(stack, sender, "the callback sender")
