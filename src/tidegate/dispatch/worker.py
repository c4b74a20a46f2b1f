"""The worker: claims AI jobs, routes them, paces them under the providers' limits, reserves
budget, calls the provider and settles the job, its cost and its callback.

Rules it keeps (DESIGN.md, "Dispatch"):
- It claims only as many jobs as it has free slots, and renews their leases while calls run.
- It never sleeps long while holding a slot: a pacing wait above `pace_wait_max_s`, a spent
  budget or a 429's Retry-After parks the job in the queue as a delayed job instead.
- Every job ends in a final state or goes back to the queue; on shutdown in-flight calls get a
  grace period and the rest are released at once.
- A job that can wait (BULK with a distant deadline, where the provider has a `batch` section)
  goes to the provider's own batch API instead of a live call (tidegate.dispatch.provider_batches).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from tidegate._shutdown import CLOSE_BOUND_S, bounded, cancel_bounded
from tidegate.ai import AIRequest, AIResult, StreamPart, Timings
from tidegate.config import ModelConfig, TidegateConfig
from tidegate.config import WorkerSettings as WorkerSettings  # its home before it was a section
from tidegate.coord.budget import (
    BUDGET_EXHAUSTED,
    BudgetExhausted,
    BudgetLedger,
    RefusedCall,
    budget_outcome,
)
from tidegate.coord.limiter import AdaptiveConcurrency, RateLimiter
from tidegate.coord.relay import ChunkRelay
from tidegate.costs import (
    cost_micros,
    estimate_input_tokens,
    estimate_output_tokens,
    micros_to_usd,
)
from tidegate.dispatch import failures
from tidegate.dispatch.callbacks import CallbackSender
from tidegate.dispatch.health import ModelHealth
from tidegate.dispatch.metrics import DispatchMetrics
from tidegate.dispatch.provider_batches import Found, ProviderBatches
from tidegate.dispatch.provider_batches.clients import batch_client
from tidegate.dispatch.provider_batches.collection import BatchServices
from tidegate.dispatch.provider_batches.store import ProviderBatchStore
from tidegate.dispatch.router import RouteDecision, Router, RoutingError
from tidegate.dispatch.spending import Hold, Spending, cheaper_route, estimated_micros
from tidegate.dispatch.tiers import answered_with_tier, priced, tier_of, with_tier
from tidegate.dispatch.traces import answered, charged, model_call, processing
from tidegate.dispatch.turnstile import PriorityTurnstile
from tidegate.errors import InvalidJob, LeaseLost, PayloadFormatError, QueueUnavailable, TidegateError
from tidegate.jobs import Job, JobFailure, JobState, Priority
from tidegate.providers.adapters import Answer, PartSink, ProviderAdapter, adapter_for
from tidegate.providers.client import UpstreamClient, UpstreamError
from tidegate.providers.ratelimit import RateLimitInfo
from tidegate.queue import Queue
from tidegate.tracing import NOOP_SPAN, Span

if TYPE_CHECKING:  # the worker only reads tenants; the store belongs to the gateway layer
    from tidegate.coord.tenants import TenantStore

log = logging.getLogger("tidegate.worker")

QUEUE_RETRY_S = 1.0  # pause before claiming again after the queue failed to answer
# How long a job whose payload a newer release wrote waits before a worker looks at it again: a
# newer worker of a rolling upgrade serves it meanwhile; this one must neither fail nor misread it.
NEWER_PAYLOAD_DEFER_S = 60.0
PARK_S = 0.05  # shortest park, and the re-check interval while a model's slots are all taken


@dataclass(slots=True)
class _Relayed:
    """How many chunks of an attempt reached the relay (and so, perhaps, the client)."""

    chunks: int = 0


@dataclass(slots=True)
class _Call:
    """What a job's attempt holds while it runs, so every exit path can give it back."""

    job: Job
    queue_wait_ms: float = 0.0
    key: str = ""
    reservation: Hold | None = None
    holds_model_slot: bool = False
    service_tier: str | None = None  # the tier the call is sent with (tidegate.dispatch.tiers)
    claimed_ns: int = 0  # when the job was claimed (ns since the epoch), where its queue wait ends
    span: Span = NOOP_SPAN  # its `worker.process` span (tidegate.dispatch.traces)


@dataclass(frozen=True, slots=True)
class WorkerParts:
    """What a worker works with, opened by its composition root and closed by it after the
    worker: `tidegate.app.components.open_worker_parts` opens them for a config and a queue. A
    worker opens none of them itself."""

    queue: Queue
    # One opened pool per configured provider, by provider name.
    upstreams: Mapping[str, UpstreamClient]
    limiter: RateLimiter  # paces calls under the providers' limits (keys "provider/model")
    # Spend per tenant and model (None: spend is not recorded, so no budget may be configured).
    ledger: BudgetLedger | None = None
    # What was sent to providers' own batch APIs: needed when a provider has a `batch` section.
    provider_batches: ProviderBatchStore | None = None
    relay: ChunkRelay | None = None  # None: results are not streamed to a gateway
    tenants: TenantStore | None = None  # None: only the configured budgets apply
    callbacks: CallbackSender | None = None  # None: results are not sent to callback URLs


def _check_parts(parts: WorkerParts, config: TidegateConfig) -> None:
    """A ValueError naming what a worker of `config` needs and was not given: a part missing
    here would fail every job that needs it, long after the start."""
    missing = [provider.name for provider in config.providers if provider.name not in parts.upstreams]
    if missing:
        raise ValueError(f"no upstream client for provider(s) {', '.join(missing)}")
    if config.budgets.limited and parts.ledger is None:
        raise ValueError("a budget is configured: the worker needs a budget ledger")
    if parts.provider_batches is None and any(p.batch is not None for p in config.providers):
        raise ValueError("a provider has a `batch` section: the worker needs a provider-batch store")


class Worker:
    """Turns queued AI jobs into provider calls. Use as an async context manager, then `run()`."""

    def __init__(
        self,
        parts: WorkerParts,
        config: TidegateConfig,
        settings: WorkerSettings | None = None,
        *,
        metrics: DispatchMetrics | None = None,
    ) -> None:
        _check_parts(parts, config)
        self.queue = parts.queue
        self.config = config
        self.settings = settings or config.worker
        self.worker_id = self.settings.worker_id or f"worker-{uuid.uuid4().hex[:8]}"
        self.metrics = metrics or DispatchMetrics()
        self.router = Router(config)
        self._parts = parts
        self._limiter = parts.limiter
        self._spending = Spending(config.budgets, parts.ledger, parts.tenants)
        self._callbacks = parts.callbacks
        self._relay = parts.relay
        self._concurrency = AdaptiveConcurrency()
        self._turnstiles: dict[str, PriorityTurnstile] = {}  # per provider/model key
        self._health = ModelHealth(config.routing.fallback_after_failures, self.settings.model_cooldown_s)
        # Per provider, over its pooled client.
        self._adapters: dict[str, ProviderAdapter] = {
            provider.name: adapter_for(parts.upstreams[provider.name], provider.api)
            for provider in config.providers}
        self._provider_batches: ProviderBatches | None = None  # set when a provider has a `batch` section
        self._active: dict[str, tuple[asyncio.Task[None], _Call]] = {}
        self._slot_freed = asyncio.Event()
        served = self.settings.priorities or tuple(int(level) for level in Priority)
        urgent = tuple(level for level in served if level <= self.settings.urgent_level)
        # A reserve only means something when the worker serves levels on both sides of it.
        self._reserve = self.settings.reserved_slots() if urgent and len(urgent) < len(served) else 0
        self._urgent_levels = urgent
        # Set when the slots free beyond the reserve are as many as the reserve: lower levels
        # are topped up that many at a time, not at every freed slot (a claim woken per slot
        # cost a tenth of the worker's CPU at its ceiling, BENCHMARKS.md).
        self._room_beyond_reserve = asyncio.Event()
        self._stopping = asyncio.Event()
        self._forced = asyncio.Event()
        self._grace_s = self.settings.shutdown_grace_s
        self._stack = contextlib.AsyncExitStack()

    # ------------------------------------------------------------------ lifecycle

    async def __aenter__(self) -> Worker:
        store = self._parts.provider_batches
        if store is not None and any(provider.batch is not None for provider in self.config.providers):
            self._start_provider_batches(store)
        return self

    def _start_provider_batches(self, store: ProviderBatchStore) -> None:
        providers = {p.name: p for p in self.config.providers if p.batch is not None}
        services = BatchServices(
            providers, {name: batch_client(self._adapters[name].client) for name in providers},
            self.queue, store, self._spending, self.metrics, self.worker_id)
        batches = self._provider_batches = ProviderBatches(
            services, lease_s=self.settings.lease_s,
            succeeded=lambda job, result: self._callback(job, JobState.SUCCEEDED, result=result))
        # Its jobs still gathered go back to the queue on exit, before the parts close.
        self._stack.push_async_callback(batches.close)

    async def __aexit__(self, *exc_info: object) -> None:
        await self._stack.aclose()

    def request_stop(self, *, grace_s: float | None = None) -> None:
        """Stop claiming; `run()` then gives in-flight calls `grace_s` (default: the settings'
        `shutdown_grace_s`) to finish, releases the rest with their attempts given back, and
        returns."""
        if grace_s is not None:
            self._grace_s = max(grace_s, 0.0)
        self._stopping.set()
        self._slot_freed.set()  # a loop waiting for a free slot must see the stop too
        self._room_beyond_reserve.set()  # and one waiting in a claim of the urgent levels only

    def force_stop(self) -> None:
        """Stop claiming and release in-flight jobs now, whatever is left of the grace."""
        self._forced.set()
        self.request_stop()

    @property
    def in_flight(self) -> int:
        """Jobs this worker holds now."""
        return len(self._active)

    def _free_slots(self) -> int:
        """Slots free now: `concurrency` and the urgent reserve on top of it, less those held."""
        return self.settings.concurrency + self._reserve - len(self._active)

    async def run(self) -> None:
        """Claim and process until a stop is requested, then drain gracefully."""
        heartbeat = asyncio.create_task(self._renew_leases())
        try:
            while not self._stopping.is_set():
                free = self._free_slots()
                if free <= 0:
                    self._slot_freed.clear()
                    await self._slot_freed.wait()
                    continue
                # With only the reserve free, claim urgent work alone, and stop waiting for it
                # once slots free for every level (woken, never cancelled: a claim cancelled
                # while jobs are being leased to it could strand them until their lease ran out).
                # Any other claim is woken by a stop, so a stop ends its wait at once.
                self._room_beyond_reserve.clear()
                urgent_only = free <= self._reserve
                try:
                    # Bounded: a claim that outlives its own wait by this much is stuck on a
                    # backend that stopped answering, and would hold a stop forever.
                    async with asyncio.timeout(self.settings.claim_wait_s + CLOSE_BOUND_S):
                        jobs = await self.queue.claim(
                            self.worker_id,
                            priorities=self._urgent_levels if urgent_only else self.settings.priorities,
                            limit=free if urgent_only else free - self._reserve,
                            lease_s=self.settings.lease_s,
                            timeout_s=self.settings.claim_wait_s,
                            wake=self._room_beyond_reserve if urgent_only else self._stopping,
                        )
                except (QueueUnavailable, TimeoutError) as exc:
                    # A restarting Redis or a locked disk must not end the worker: wait, retry.
                    log.warning("claim failed, retrying in %.0fs: %s", QUEUE_RETRY_S, exc or "timed out")
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._stopping.wait(), QUEUE_RETRY_S)
                    continue
                if self._stopping.is_set():
                    # Claimed while the stop came: back at once, not held through the grace.
                    await self._release_unstarted(jobs)
                    break
                for job in jobs:
                    self._start(job)
        finally:
            await self._drain()
            await cancel_bounded(heartbeat, "the lease renewals' stop")

    def _start(self, job: Job) -> None:
        claimed_ns = time.time_ns()
        waited_s = 0.0 if job.ready_at is None else max(claimed_ns / 1e9 - job.ready_at.timestamp(), 0.0)
        call = _Call(job, queue_wait_ms=waited_s * 1000, claimed_ns=claimed_ns)
        self.metrics.queue_wait.labels(job.priority.name.lower()).observe(waited_s)
        task = asyncio.create_task(self._process(call), name=f"job-{job.id}")
        self._active[job.id] = (task, call)

        def done(_: asyncio.Task[None]) -> None:
            self._active.pop(job.id, None)
            self._slot_freed.set()
            if self._free_slots() >= 2 * self._reserve:
                self._room_beyond_reserve.set()

        task.add_done_callback(done)

    async def _drain(self) -> None:
        """Let in-flight calls finish within the grace period (cut short by `force_stop`);
        then cancel the rest, each giving its job back with the attempt uncounted. The give-backs
        are bounded too: a job whose release cannot reach the queue stays leased until its lease
        expires, and the next claim recovers it."""
        tasks = [task for task, _ in self._active.values()]
        if not tasks:
            return
        if self._grace_s > 0:
            log.info("draining %d in-flight calls (grace %.1fs)", len(tasks), self._grace_s)
            finished = asyncio.ensure_future(asyncio.wait(tasks))
            forced = asyncio.ensure_future(self._forced.wait())
            await asyncio.wait([finished, forced], timeout=self._grace_s, return_when=asyncio.FIRST_COMPLETED)
            finished.cancel()
            forced.cancel()
        pending = [task for task in tasks if not task.done()]
        if not pending:
            return
        log.info("releasing %d calls still in flight after the grace", len(pending))
        for task in pending:
            task.cancel()
        _, stuck = await asyncio.wait(pending, timeout=CLOSE_BOUND_S)
        if stuck:
            log.warning("%d jobs could not be released within %.1fs; their leases expire and a later "
                        "claim recovers them", len(stuck), CLOSE_BOUND_S)

    async def _release_unstarted(self, jobs: list[Job]) -> None:
        for job in jobs:
            with contextlib.suppress(LeaseLost, TidegateError):
                await bounded(self.queue.release(job), f"the release of job {job.id}")

    async def _renew_leases(self) -> None:
        interval_s = self.settings.lease_s / 3
        while True:
            await asyncio.sleep(interval_s)
            for job_id, (task, call) in list(self._active.items()):
                try:
                    await self.queue.heartbeat(call.job, self.settings.lease_s)
                except LeaseLost as exc:
                    # Cancelled by its owner or recovered elsewhere: the call is no longer wanted.
                    log.info("job %s: lease lost (%s); stopping its call", job_id, exc)
                    task.cancel()
                except TidegateError as exc:
                    log.warning("job %s: lease renewal failed: %s", job_id, exc)

    # ------------------------------------------------------------------ one job

    async def _process(self, call: _Call) -> None:
        job = call.job
        with processing(job, call.claimed_ns) as call.span:
            await self._attempt_settled(call)

    async def _attempt_settled(self, call: _Call) -> None:
        """One attempt, whose every ending settles the job or gives it back."""
        job = call.job
        try:
            await self._attempt(call)
        except asyncio.CancelledError:
            await self._give_back(call)
            raise
        except Exception as exc:  # a bug must not strand the job: fail it, the queue retries
            log.exception("job %s: unexpected error", job.id)
            error = f"internal error: {type(exc).__name__}: {exc}"
            try:
                await self._settle_failure(call, error, retry=True,
                                           failure=failures.internal_error(error, job.attempts))
            except Exception:
                # The queue itself is failing; the job's lease runs out and upkeep recovers it.
                log.exception("job %s: could not record the failure", job.id)
        finally:
            self._release_model_slot(call)

    async def _attempt(self, call: _Call) -> None:
        job = call.job
        try:
            request = AIRequest.from_payload(job.payload)
        except PayloadFormatError as exc:
            self.metrics.deferred.labels("newer_payload").inc()
            log.warning("job %s: %s; released for %.0f s, for a newer worker", job.id, exc,
                        NEWER_PAYLOAD_DEFER_S)
            await self.queue.release(job, delay_s=NEWER_PAYLOAD_DEFER_S, reason=str(exc))
            return
        except InvalidJob as exc:
            error = f"invalid AI job: {exc}"
            await self._settle_failure(call, error, retry=False, failure=failures.invalid_job(error))
            return
        batches = self._provider_batches
        found = Found.LIVE if batches is None else await batches.collect(job, request, call.queue_wait_ms)
        if found is Found.SERVED:
            return
        estimated_input = estimate_input_tokens(request.body)
        fraction_left = await self._spending.fraction_left(job.tenant)
        failing = self._health.failing()
        try:
            try:
                route = self._route(request, job, estimated_input, fraction_left, failing)
            except RoutingError:
                if not failing:
                    raise
                # Every candidate is cooling down after failures: try the tier's best again
                # rather than dead-letter a job that a healthy provider could still serve.
                route = self._route(request, job, estimated_input, fraction_left, frozenset())
        except RoutingError as exc:
            await self._settle_failure(call, str(exc), retry=False, failure=failures.routing_refused(exc))
            return
        if found is Found.NOTHING and batches is not None and await batches.gather(job, request, route):
            return
        reserved = await self._reserve_budget(call, route, request)
        if reserved is None:
            return
        route = reserved
        call.service_tier = tier_of(request, route.provider, job.priority)
        request = with_tier(request, call.service_tier)
        call.key = f"{route.provider.name}/{route.model.name}"
        if not await self._pace(call, route.model, request, estimated_input):
            return
        await self._call_upstream(call, route, request)

    def _route(
        self, request: AIRequest, job: Job, estimated_input: int, fraction_left: float | None,
        exclude: frozenset[str],
    ) -> RouteDecision:
        return self.router.route(
            kind=request.kind,
            requested_model=request.requested_model,
            priority=job.priority,
            estimated_input_tokens=estimated_input,
            budget_fraction_left=fraction_left,
            allowed_models=request.allowed_models,
            exclude=exclude,
        )

    async def _reserve_budget(
        self, call: _Call, route: RouteDecision, request: AIRequest
    ) -> RouteDecision | None:
        """Reserve the job's estimated cost before the call. When the budget has no room, the
        job never waits mutely: in `step_down` mode the cheapest model is tried first; then
        `budget_outcome` ends it dead or defers it, with its reason recorded. Returns the route
        to call, or None when the job was settled or deferred."""
        if self._spending.ledger is None:
            return route
        job = call.job
        limits = await self._spending.limits(job.tenant)
        amount = self._estimate(route, request, job)
        try:
            call.reservation = await self._spending.reserve(job, amount, limits)
            return route
        except BudgetExhausted as exc:
            refusal = exc
        if self.config.budgets.on_exhausted == "step_down":
            cheaper = self._cheaper_route(request, job, route)
            if cheaper is not None:
                amount = self._estimate(cheaper, request, job)
                try:
                    call.reservation = await self._spending.reserve(job, amount, limits)
                    self.metrics.budget_refusals.labels("stepped_down", BUDGET_EXHAUSTED).inc()
                    return cheaper
                except BudgetExhausted as exc:
                    refusal = exc
        await self._on_budget_refusal(call, refusal, amount)
        return None

    @staticmethod
    def _estimate(route: RouteDecision, request: AIRequest, job: Job) -> int:
        """The most the call can cost on `route`, at the prices of the tier it would be sent with."""
        return estimated_micros(route, request, job.priority)

    def _cheaper_route(self, request: AIRequest, job: Job, route: RouteDecision) -> RouteDecision | None:
        """The cheapest model that may serve an `auto` chat job, if it is not the one refused."""
        return cheaper_route(self.router, request, route, self._health.failing())

    async def _on_budget_refusal(self, call: _Call, refusal: BudgetExhausted, amount: int) -> None:
        budgets, job = self.config.budgets, call.job
        # A job whose caller waits is ended now, whatever the mode: its caller gets 429 at once.
        refused = RefusedCall(amount, job.tenant, job.created_at, job.deadline, job.caller_waits)
        outcome = budget_outcome(refusal, refused, budgets, datetime.now(UTC))
        self.metrics.budget_refusals.labels(
            "deferred" if outcome.action == "defer" else "dead", outcome.reason).inc()
        if outcome.action == "defer":
            self.metrics.deferred.labels(outcome.reason).inc()
            log.info("job %s: %s", job.id, outcome.message)
            await self.queue.release(job, delay_s=outcome.defer_s, reason=outcome.message)
            return
        await self._settle_failure(call, outcome.message, retry=False,
                                   failure=failures.budget_refused(outcome.reason, outcome.message))

    async def _pace(self, call: _Call, model: ModelConfig, request: AIRequest, estimated_input: int) -> bool:
        """Wait briefly, most urgent job first, for the model's concurrency and rate limits; or
        park the job in the queue when the wait would be long."""
        tokens = estimated_input + estimate_output_tokens(request.body)
        give_up = time.monotonic() + self.settings.pace_wait_max_s
        turnstile = self._turnstiles.setdefault(call.key, PriorityTurnstile())
        if not await turnstile.acquire(int(call.job.priority), give_up - time.monotonic()):
            await self._park(call, PARK_S)
            return False
        try:
            while True:
                wait_s = PARK_S
                if not call.holds_model_slot:
                    call.holds_model_slot = self._concurrency.try_acquire(call.key, model.max_concurrency)
                if call.holds_model_slot:
                    wait_s = await self._limiter.acquire(
                        call.key, tokens=tokens, rpm=model.rpm, tpm=model.tpm, period_s=model.rate_window_s
                    )
                    if wait_s <= 0:
                        return True
                if time.monotonic() + wait_s > give_up:
                    await self._park(call, max(wait_s, PARK_S))
                    return False
                await asyncio.sleep(wait_s)
        finally:
            turnstile.release()

    async def _park(self, call: _Call, delay_s: float) -> None:
        """Back to the queue as a delayed job, its attempt uncounted: nothing held meanwhile."""
        self.metrics.deferred.labels("rate_limit").inc()
        await self._release_budget(call)
        self._release_model_slot(call)
        await self.queue.release(call.job, delay_s=delay_s)

    async def _call_upstream(self, call: _Call, route: RouteDecision, request: AIRequest) -> None:
        model = route.model
        adapter = self._adapters[route.provider.name]
        # Without a relay there is nobody to stream to: the adapter stores the whole answer instead.
        streaming = self._relay is not None and adapter.streams(request)
        self.metrics.in_flight.labels(model.name).inc()
        relayed = _Relayed()
        try:
            with model_call(route, request) as span:
                if streaming:
                    answer = await adapter.stream(request, model.name, self._relaying(call.job, relayed))
                    await self._end_stream(call.job.id)
                else:
                    answer = await adapter.complete(request, model.name)
                answered(span, answer.response, answer.usage)
        except UpstreamError as exc:
            if relayed.chunks:
                # The client already holds part of an answer; a retry would send it a second
                # one, so the error ends its stream and the job.
                await self._end_stream(call.job.id, error=str(exc))
                error = f"{model.name}: {exc} (after {relayed.chunks} chunks)"
                await self._settle_failure(call, error, retry=False, model=model.name,
                                           failure=failures.stream_cut(error, model.name))
                return
            await self._on_upstream_error(call, route, exc)
            return
        finally:
            self.metrics.in_flight.labels(model.name).dec()
        await self._on_success(call, route, answer)

    def _relaying(self, job: Job, relayed: _Relayed) -> PartSink:
        """Relays each chunk of the job's stream as it arrives, counting them."""
        relay = self._relay
        assert relay is not None

        async def publish(part: StreamPart) -> None:
            await relay.publish(job.id, part.raw)
            relayed.chunks += 1

        return publish

    async def _end_stream(self, job_id: str, *, error: str | None = None) -> None:
        assert self._relay is not None
        if error is not None:
            await self._relay.publish(job_id, StreamPart.failure(error).raw)
        await self._relay.finish(job_id)

    async def _on_success(self, call: _Call, route: RouteDecision, answer: Answer) -> None:
        job, model = call.job, route.model
        usage = answer.usage
        response, billed = answered_with_tier(answer.response, call.service_tier)
        spent = cost_micros(priced(model, route.provider, billed), usage)
        spent_usd = micros_to_usd(spent)
        charged(call.span, spent, str(spent_usd), route, billed if call.service_tier else None)
        reservation, call.reservation = call.reservation, None
        await self._observe_rate_limits(call.key, answer.rate_limit)
        self._concurrency.on_success(call.key)
        self.metrics.concurrency_limit.labels(model.name).set(self._concurrency.limit(call.key))
        self._health.success(model.name)
        result = AIResult(
            response, model=model.name, provider=route.provider.name, route=route.reason, usage=usage,
            cost_micros=spent, cost_usd=str(spent_usd),
            timings=Timings(call.queue_wait_ms, answer.latency_ms, answer.ttft_ms),
            attempts=job.attempts, worker_id=self.worker_id,
        ).to_json()
        priority = job.priority.name.lower()
        self.metrics.upstream_latency.labels(priority, model.name).observe(answer.latency_ms / 1000)
        self.metrics.tokens.labels(model.name, "input").inc(usage.input_tokens)
        self.metrics.tokens.labels(model.name, "output").inc(usage.output_tokens)
        self.metrics.cost_usd.labels(model.name, job.tenant).inc(float(spent_usd))
        # The spend and the result are written together (one transaction on SQLite): the call
        # has happened, so neither waits for the other, and a failure of one undoes nothing.
        settled, completed = await asyncio.gather(
            self._spending.settle(reservation, spent), self.queue.complete(job, result),
            return_exceptions=True)
        if isinstance(settled, BaseException):
            if not isinstance(settled, Exception):
                raise settled
            log.error("job %s: its spend of %s USD could not be recorded: %s", job.id, spent_usd, settled)
        if isinstance(completed, LeaseLost):
            # Cancelled or recovered while the call ran; its spend stays recorded.
            log.warning("job %s: result discarded, lease lost: %s", job.id, completed)
            self.metrics.jobs.labels("lease_lost", priority, model.name).inc()
            return
        if isinstance(completed, BaseException):
            raise completed
        self.metrics.jobs.labels("succeeded", priority, model.name).inc()
        self._callback(job, JobState.SUCCEEDED, result=result)

    async def _on_upstream_error(self, call: _Call, route: RouteDecision, exc: UpstreamError) -> None:
        model = route.model.name
        await self._release_budget(call)
        message = f"{model}: {exc}"
        # Kept only if this attempt was the job's last (see Queue.fail).
        exhausted = failures.retries_exhausted(message, call.job.attempts, model=model,
                                               upstream_status=exc.status)
        if exc.kind == "rate_limited":
            pause_s = exc.retry_after_s if exc.retry_after_s is not None else 1.0
            self.metrics.throttled.labels(model).inc()
            await self._limiter.pause(call.key, pause_s)
            self.metrics.paused_until.labels(model).set(time.time() + pause_s)
            self._concurrency.on_throttled(call.key)
            self.metrics.concurrency_limit.labels(model).set(self._concurrency.limit(call.key))
            # The whole wait is spent in the queue, not in this worker's slot.
            await self._settle_failure(call, message, retry=True, retry_in_s=pause_s, model=model,
                                       failure=exhausted)
        elif exc.retryable:
            self._health.failure(model)
            await self._settle_failure(call, message, retry=True, model=model, failure=exhausted)
        else:
            await self._settle_failure(call, message, retry=False, model=model,
                                       failure=failures.upstream_refused(exc, model))

    # ------------------------------------------------------------------ settling

    async def _settle_failure(
        self, call: _Call, error: str, *, retry: bool, failure: JobFailure, retry_in_s: float | None = None,
        model: str = "",
    ) -> None:
        """Record the attempt's failure: `error` for the job's history, and `failure`, what a
        caller is answered should the job be dead now."""
        job = call.job
        call.span.fail(failure["code"], error)
        await self._release_budget(call)
        try:
            state = await self.queue.fail(job, error, retry_in_s, retry=retry, failure=failure)
        except LeaseLost as exc:
            log.warning("job %s: failure not recorded, lease lost: %s", job.id, exc)
            return
        outcome = "dead" if state is JobState.DEAD else "retried"
        self.metrics.jobs.labels(outcome, job.priority.name.lower(), model or "none").inc()
        if state is JobState.DEAD:
            self._callback(job, JobState.DEAD, error=error, failure=failure)

    async def _give_back(self, call: _Call) -> None:
        """A cancelled attempt (shutdown, lost lease): undo its reservation, return the job."""
        await asyncio.shield(self._release_budget(call))
        with contextlib.suppress(LeaseLost, TidegateError):
            await asyncio.shield(self.queue.release(call.job))

    async def _release_budget(self, call: _Call) -> None:
        reservation, call.reservation = call.reservation, None
        await self._spending.release(reservation)

    def _release_model_slot(self, call: _Call) -> None:
        if call.holds_model_slot:
            call.holds_model_slot = False
            self._concurrency.release(call.key)

    async def _observe_rate_limits(self, key: str, info: RateLimitInfo) -> None:
        await self._limiter.observe(
            key,
            remaining_requests=info.remaining_requests,
            remaining_tokens=info.remaining_tokens,
            reset_requests_s=info.reset_requests_s,
            reset_tokens_s=info.reset_tokens_s,
        )

    def _callback(self, job: Job, state: JobState, *, result: Any = None, error: str | None = None,
                  failure: JobFailure | None = None) -> None:
        if job.callback_url is None or self._callbacks is None:
            return
        document: dict[str, Any] = {"id": job.id, "state": state.value, "tenant": job.tenant,
                                    "priority": job.priority.name.lower()}
        if result is not None:
            document["result"] = result
        if error is not None:
            document["error"] = error
        if failure is not None:
            document["failure"] = failure
        self._callbacks.send_later(job.callback_url, document)

def parse_priorities(text: str) -> tuple[int, ...]:
    """`"0-1"`, `"critical,high"` or `"2"` → levels."""
    levels: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        if "-" in part and not part.startswith("-"):
            low, high = (Priority.parse(side) for side in part.split("-", 1))
            levels.update(range(min(low, high), max(low, high) + 1))
        elif part:
            levels.add(int(Priority.parse(part)))
    if not levels:
        raise InvalidJob(f"no priorities in {text!r}")
    return tuple(sorted(levels))


