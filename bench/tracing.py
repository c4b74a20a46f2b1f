"""What tracing costs a chat job: the calls the gateway, the worker and the upstream client make
into tidegate.tracing for one job, timed in a loop, with tracing off (the default) and on (the
OpenTelemetry SDK, its spans batched to an exporter that drops them, so no network is timed).

    .venv/bin/python -m bench.tracing                  # about 10 seconds
    .venv/bin/python -m bench.tracing --jobs 50000

Each round is one job's share: the gateway's server span (on only: the middleware is not added
when off), the intake's carrier and annotation, the worker's queue-wait record, its
`worker.process` and `chat <model>` spans with their attributes, and the provider HTTP span:
five spans when on. The last row times one bare SDK span, for scale.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from decimal import Decimal

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

from tidegate import Job, JobState, Priority
from tidegate.testing import (
    NOOP,
    AIRequest,
    ModelConfig,
    OtelTracing,
    ProviderConfig,
    RouteDecision,
    Tracing,
    UpstreamClient,
    Usage,
    http_answered,
    installed,
    tracer,
    worker_traces,
)

MODEL = ModelConfig(name="gpt-4.1", input_usd_per_1m=Decimal("2"), output_usd_per_1m=Decimal("8"))
PROVIDER = ProviderConfig(name="openai", base_url="http://127.0.0.1:9/v1", models=(MODEL,))
ROUTE = RouteDecision(PROVIDER, MODEL, "tier normal", ())
REQUEST = AIRequest.of("chat", {"model": "auto", "messages": [{"role": "user", "content": "hi"}]})
RESPONSE = {"id": "chatcmpl-1", "model": "gpt-4.1", "choices": []}
USAGE = Usage(12, 30, 42)


class _Dropped(SpanExporter):
    """Takes the spans and drops them."""

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        """Nothing sent."""
        return SpanExportResult.SUCCESS


def one_job(client: UpstreamClient, job: Job) -> None:
    """The tracing calls of one chat job, in the order the gateway, worker and client make them."""
    tracing = tracer()
    server = tracing.span("POST", kind="server", attributes={"http.request.method": "POST"}) \
        if tracing.enabled else None
    if server is not None:
        server.__enter__()
    tracing.carrier()  # intake.draft_job
    if tracing.enabled:  # intake.submit
        tracing.annotate({"tidegate.job_id": job.id, "tidegate.tenant": job.tenant,
                          "tidegate.priority": "normal"})
    with worker_traces.processing(job, time.time_ns()) as process:
        with worker_traces.model_call(ROUTE, REQUEST) as call:
            with client._http_span(client._chat_url) as http:
                http_answered(http, 200)
            worker_traces.answered(call, RESPONSE, USAGE)
        worker_traces.charged(process, 84, "0.000084", ROUTE, None)
    if server is not None:
        server.__exit__(None, None, None)


def timed(rounds: int, client: UpstreamClient, job: Job) -> float:
    """CPU microseconds per job (the process's, the exporting thread's included): on a shared
    machine, wall time would count the other processes' turns too."""
    started = time.process_time()
    for _ in range(rounds):
        one_job(client, job)
    return (time.process_time() - started) / rounds * 1e6


def bare_span(rounds: int, provider: TracerProvider) -> float:
    """CPU microseconds of one SDK span with one attribute, for scale."""
    sdk = provider.get_tracer("bench")
    started = time.process_time()
    for _ in range(rounds):
        with sdk.start_as_current_span("span", attributes={"a": 1}):
            pass
    return (time.process_time() - started) / rounds * 1e6


def best_of(runs: int, measure: Callable[[], float]) -> float:
    """The least disturbed of `runs` measurements."""
    return min(measure() for _ in range(runs))


def main() -> None:
    """Print the table."""
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=20_000, help="jobs per measurement")
    parser.add_argument("--runs", type=int, default=5, help="measurements per row; the best is kept")
    options = parser.parse_args()
    client = UpstreamClient(PROVIDER)
    now = datetime.now(UTC)
    job = Job(id="j1", priority=Priority.NORMAL, payload=REQUEST.to_payload(), tenant="acme",
              state=JobState.LEASED, created_at=now, attempts=1, max_attempts=3, ready_at=now)
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(_Dropped(), max_queue_size=65_536))
    rows: list[tuple[str, Tracing]] = [("off (default)", NOOP),
                                       ("on (SDK, batched, dropped)", OtelTracing(provider))]
    print(f"{'tracing':<30} {'CPU µs per job':>15}")
    for label, tracing in rows:
        with installed(tracing):
            timed(1000, client, job)  # warm-up
            print(f"{label:<30} {best_of(options.runs, lambda: timed(options.jobs, client, job)):>15.2f}")
    scale = best_of(options.runs, lambda: bare_span(options.jobs, provider))
    print(f"{'(one bare SDK span, for scale)':<30} {scale:>15.2f}")
    provider.shutdown()


if __name__ == "__main__":
    main()
