"""The worker's spans of a job (tidegate.tracing), in the trace of the request that enqueued it:

- `queue.wait`: from the job's ready time (its creation, or the end of its delay) to its claim,
  recorded at the claim with those times;
- `worker.process`: one attempt, with tidegate's attributes (tenant, priority, job id, attempt,
  route, and its cost once it is settled);
- `{operation} {model}` (`chat gpt-4.1`): the model call, with the GenAI semantic conventions'
  attributes; the provider's HTTP request is its child (tidegate.providers.client).

Each helper returns at once when tracing is off, before building any attribute.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any

from tidegate.ai import AIRequest, Usage
from tidegate.contract import requested_tier
from tidegate.dispatch.router import RouteDecision
from tidegate.jobs import Job
from tidegate.tracing import NOTHING, Span, carrier_of, tracer

__all__ = ["answered", "charged", "model_call", "processing"]


def processing(job: Job, claimed_ns: int) -> AbstractContextManager[Span]:
    """Record the job's queue wait, then a `worker.process` span for its attempt."""
    tracing = tracer()
    if not tracing.enabled:
        return NOTHING
    parent = carrier_of(job.payload.get("trace"))
    attributes: dict[str, Any] = {"tidegate.job_id": job.id, "tidegate.tenant": job.tenant,
                  "tidegate.priority": job.priority.name.lower(), "tidegate.attempt": job.attempts}
    if job.ready_at is not None:
        ready_ns = int(job.ready_at.timestamp() * 1_000_000_000)
        tracing.record("queue.wait", start_ns=min(ready_ns, claimed_ns), end_ns=claimed_ns,
                       attributes=attributes, parent=parent)
    return tracing.span("worker.process", attributes=attributes, parent=parent)


def model_call(route: RouteDecision, request: AIRequest) -> AbstractContextManager[Span]:
    """The span of the model call (a GenAI client span), the current one while it runs."""
    tracing = tracer()
    if not tracing.enabled:
        return NOTHING
    operation = request.kind
    attributes: dict[str, Any] = {
        "gen_ai.operation.name": operation, "gen_ai.provider.name": route.provider.name,
        "gen_ai.system": route.provider.name, "gen_ai.request.model": route.model.name,
        "tidegate.route": route.reason,
    }
    tier = requested_tier(request.body)
    if tier is not None:
        attributes["openai.request.service_tier"] = tier
    for field, name in (("max_tokens", "gen_ai.request.max_tokens"),
                        ("max_completion_tokens", "gen_ai.request.max_tokens"),
                        ("temperature", "gen_ai.request.temperature")):
        value = getattr(request.body, field, None)  # the fields of the kinds that have them
        if value is not None:
            attributes[name] = value
    return tracing.span(f"{operation} {route.model.name}", kind="client", attributes=attributes)


def answered(span: Span, response: dict[str, Any], usage: Usage) -> None:
    """What the model call answered, on its span."""
    if not tracer().enabled:
        return
    attributes: dict[str, Any] = {"gen_ai.usage.input_tokens": usage.input_tokens,
                                  "gen_ai.usage.output_tokens": usage.output_tokens}
    for field, name in (("model", "gen_ai.response.model"), ("id", "gen_ai.response.id"),
                        ("service_tier", "openai.response.service_tier")):
        value = response.get(field)
        if isinstance(value, str):
            attributes[name] = value
    span.set_attributes(attributes)


def charged(span: Span, cost_micros: int, cost_usd: str, route: RouteDecision, tier: str | None) -> None:
    """The attempt's outcome on its `worker.process` span: what it cost, on which model."""
    if not tracer().enabled:
        return
    attributes: dict[str, Any] = {"tidegate.cost_usd": cost_usd, "tidegate.cost_micros": cost_micros,
                                  "tidegate.model": route.model.name,
                                  "tidegate.provider": route.provider.name}
    if tier is not None:
        attributes["tidegate.service_tier"] = tier
    span.set_attributes(attributes)
