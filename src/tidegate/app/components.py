"""The one place a process opens its parts from configuration: the queue, the tenant store, the
budget ledger, the chunk relay, and as asked the rate limiter, the batch stores, the callback
sender, the entity cache and the recommender. `tidegate up`, `tidegate gateway` and `tidegate
worker` all open them here, each with the parts it needs:

    async with Components.open(config, callbacks=True) as parts:
        worker = Worker(parts.queue, config, settings, tenants=parts.tenants, ...)

Parts are opened in dependency order on one AsyncExitStack, so they close in the reverse order,
each close bounded (`tidegate._shutdown.CLOSE_BOUND_S`): a part that cannot close in time is
abandoned with a warning and the parts opened before it still close. A part given instead of
opened (tests, or a relay shared with in-process workers) is used as is and left open.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tidegate._formats import migrating
from tidegate._shutdown import close_bounded, enter_bounded
from tidegate.config import TidegateConfig
from tidegate.coord import queue_name_of
from tidegate.coord.budget import BudgetLedger, budget_ledger_for
from tidegate.coord.limiter import RateLimiter, rate_limiter_for
from tidegate.coord.relay import ChunkRelay, relay_for
from tidegate.coord.tenants import TenantStore, tenant_store_for
from tidegate.dispatch.provider_batches.store import ProviderBatchStore, provider_batch_store_for
from tidegate.gateway.batches.store import BatchStore, batch_store_for
from tidegate.queue import Queue

if TYPE_CHECKING:
    from tidegate.dispatch.callbacks import CallbackSender
    from tidegate.recs.engine import Recommender
    from tidegate.sync.contracts import EntityCache

__all__ = ["Components"]


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

    @classmethod
    @contextlib.asynccontextmanager
    async def open(
        cls,
        config: TidegateConfig,
        *,
        queue: Queue | None = None,
        tenants: TenantStore | None = None,
        ledger: BudgetLedger | None = None,
        relay: ChunkRelay | None = None,
        limiter: RateLimiter | bool = False,
        batches: bool = False,
        provider_batches: bool = False,
        callbacks: bool = False,
        cache: bool = False,
        recommender: Recommender | str | None = None,
    ) -> AsyncIterator[Components]:
        """Open on `config.queue_url` what was not given: the queue, tenants, ledger and relay
        always; the rate limiter when `limiter` is True; the batch store when `batches` is True;
        the provider-batch store when `provider_batches` is True and a provider of `config` has a
        `batch` section (it connects on first use); the callback sender when `callbacks` is
        True and the secret named by `config.callbacks.secret_env` is set; the entity cache of
        `config.sync` when `cache` is True; and a recommender on the store at `recommender` when
        that is a URL (under `config.sync.prefix`, its settings `config.recs`). Close on exit only
        what was opened here."""
        url = config.queue_url
        async with contextlib.AsyncExitStack() as stack:
            # Every store built here opens in the configured migrate mode ([storage]).
            with migrating(config.storage.migrate):
                if queue is None:
                    queue = await enter_bounded(stack, Queue.from_url(url), "the queue")
                if tenants is None:
                    tenants = await enter_bounded(stack, tenant_store_for(url), "the tenant store")
                rates = None if isinstance(limiter, bool) else limiter
                if limiter is True:
                    # Named after the queue, so gateways of one queue share their tenants' counts and
                    # gateways of another queue on the same Redis do not.
                    rates = await enter_bounded(stack, rate_limiter_for(url, queue_name_of(url)),
                                                "the rate limiter")
                if ledger is None:
                    # The default name: every worker and gateway of the queue reads and records one spend.
                    ledger = await enter_bounded(stack, budget_ledger_for(url), "the budget ledger")
                if relay is None:
                    relay = relay_for(url)  # connects on first use: only a close to arrange
                    close_bounded(stack, relay.close, "the relay")
                files = (await enter_bounded(stack, batch_store_for(url), "the batch store")
                         if batches else None)
                sent = None
                if provider_batches and any(provider.batch is not None for provider in config.providers):
                    sent = provider_batch_store_for(url)  # opens on first use: only a close to arrange
                    close_bounded(stack, sent.close, "the provider-batch store")
                sender = await _open_callbacks(stack, config) if callbacks else None
                entity_cache = None
                # The change flow's parts are imported only by the processes that ask for them: a
                # worker or a gateway on its own never loads numpy or the cache backends.
                if cache:
                    from tidegate.sync.cache import open_cache

                    entity_cache = await enter_bounded(stack, open_cache(config.sync), "the entity cache")
                if isinstance(recommender, str):
                    from tidegate.app.recs import open_recommender

                    recommender = await open_recommender(stack, config, recommender)
                parts = cls(config=config, queue=queue, tenants=tenants, ledger=ledger, relay=relay,
                            limiter=rates, batches=files, provider_batches=sent, callbacks=sender,
                            cache=entity_cache, recommender=recommender)
            yield parts


async def _open_callbacks(stack: contextlib.AsyncExitStack, config: TidegateConfig) -> CallbackSender | None:
    """A callback sender signing with the configured secret, or None when it is not set."""
    secret = os.environ.get(config.callbacks.secret_env)
    if not secret:
        return None
    from tidegate.dispatch.callbacks import CallbackSender

    sender = CallbackSender(config.callbacks, secret.encode())
    return await enter_bounded(stack, sender, "the callback sender")
