"""OpenTelemetry traces: one request through a real gateway, queue and worker makes one trace,
gateway → queue wait → worker → model call → provider HTTP call, with the GenAI semantic
conventions' attributes; off, nothing of it runs and OpenTelemetry is not even imported."""

from __future__ import annotations

import ast
import contextlib
import subprocess
import sys
import threading
from collections.abc import Iterator, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar

import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from conftest import QueueFactory
from support.gateway import open_gateway, with_legacy_models
from support.waiting import eventually
from tidegate._otel import OtelTracing
from tidegate.ai import AIRequest
from tidegate.config import TracingSettings
from tidegate.contract import decode
from tidegate.errors import InvalidJob
from tidegate.simulator.server import InjectedFault
from tidegate.tracing import NOOP, configured, installed, tracer

pytestmark = pytest.mark.sqlite_only  # the trace crosses the queue in the job: alike on every backend

HELLO: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Say hello"}]
CALLER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_PARENT = f"00-{CALLER_TRACE}-00f067aa0ba902b7-01"


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    """Spans finished while the test runs, kept in memory."""
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    with installed(OtelTracing(provider)):
        yield memory
    provider.shutdown()


async def finished(exporter: InMemorySpanExporter, name: str, count: int = 1) -> list[ReadableSpan]:
    """The finished spans, once `count` named `name` are among them (the worker ends its spans
    after the job's result is stored, so perhaps after the caller has its answer)."""
    return await eventually(lambda: list(exporter.get_finished_spans()), f"{count} spans {name!r} finished",
                            until=lambda spans: sum(span.name == name for span in spans) >= count,
                            describe=lambda spans: repr([span.name for span in spans]))


def one(spans: Sequence[ReadableSpan], name: str) -> ReadableSpan:
    """The one span named `name`."""
    named = [span for span in spans if span.name == name]
    assert len(named) == 1, f"{len(named)} spans named {name!r} among {[span.name for span in spans]}"
    return named[0]


def child_of(span: ReadableSpan, parent: ReadableSpan) -> bool:
    """Whether `span` is a direct child of `parent`, in the same trace."""
    assert span.parent is not None and span.context is not None and parent.context is not None
    return bool(span.parent.span_id == parent.context.span_id
                and span.context.trace_id == parent.context.trace_id)


def check_tree(spans: Sequence[ReadableSpan], job_id: str, model: str, tokens: dict[str, int]) -> None:
    """The span tree of one chat request and the attributes the semantic conventions name."""
    server = one(spans, "POST /v1/chat/completions")
    wait, process = one(spans, "queue.wait"), one(spans, "worker.process")
    call, http = one(spans, f"chat {model}"), one(spans, "POST")
    assert server.kind is SpanKind.SERVER and call.kind is SpanKind.CLIENT and http.kind is SpanKind.CLIENT
    assert child_of(wait, server) and child_of(process, server)
    assert child_of(call, process) and child_of(http, call)
    assert len({span.context.trace_id for span in spans if span.context is not None}) == 1

    assert server.attributes is not None and server.attributes["http.route"] == "/v1/chat/completions"
    assert server.attributes["http.response.status_code"] == 200
    assert server.attributes["tidegate.job_id"] == job_id
    assert wait.start_time is not None and wait.end_time is not None and process.start_time is not None
    # The queue keeps a job's times in whole milliseconds, so the wait may start up to 1 ms
    # before the request that enqueued it did.
    assert server.start_time is not None and server.start_time - 1_000_000 < wait.start_time
    assert wait.start_time <= wait.end_time
    assert wait.end_time <= process.start_time
    assert process.attributes is not None
    assert {key: process.attributes[key] for key in ("tidegate.job_id", "tidegate.tenant",
                                                      "tidegate.priority", "tidegate.attempt")} == {
        "tidegate.job_id": job_id, "tidegate.tenant": "acme", "tidegate.priority": "normal",
        "tidegate.attempt": 1}
    assert float(str(process.attributes["tidegate.cost_usd"])) > 0
    assert call.attributes is not None
    assert {key: call.attributes[key] for key in ("gen_ai.operation.name", "gen_ai.provider.name",
                                                   "gen_ai.request.model", "gen_ai.response.model")} == {
        "gen_ai.operation.name": "chat", "gen_ai.provider.name": "sim", "gen_ai.request.model": model,
        "gen_ai.response.model": model}
    assert call.attributes["gen_ai.usage.input_tokens"] == tokens["prompt_tokens"] > 0
    assert call.attributes["gen_ai.usage.output_tokens"] == tokens["completion_tokens"] > 0
    assert http.attributes is not None and http.attributes["http.response.status_code"] == 200
    assert str(http.attributes["url.full"]).endswith("/chat/completions")


async def test_a_chat_request_makes_one_trace_from_gateway_to_provider(
    queue_factory: QueueFactory, exporter: InMemorySpanExporter,
) -> None:
    async with open_gateway(queue_factory) as gw, gw.openai("acme") as client:
        raw = await client.chat.completions.with_raw_response.create(model="gpt-4.1", messages=HELLO)
        job_id = raw.headers["X-Tidegate-Job-Id"]
        spans = await finished(exporter, "worker.process")

        job = await gw.queue.get(job_id)
        assert job is not None and job.payload["trace"]["traceparent"].startswith("00-")
        check_tree(spans, job_id, "gpt-4.1", job.result["usage"])


async def test_a_streamed_request_makes_the_same_tree_in_the_callers_trace(
    queue_factory: QueueFactory, exporter: InMemorySpanExporter,
) -> None:
    async with open_gateway(queue_factory) as gw, gw.openai("acme") as client:
        raw = await client.chat.completions.with_raw_response.create(
            model="gpt-4.1", messages=HELLO, stream=True, extra_headers={"traceparent": CALLER_PARENT})
        chunks = [chunk async for chunk in raw.parse()]
        job_id = raw.headers["X-Tidegate-Job-Id"]
        spans = await finished(exporter, "worker.process")

        assert chunks
        job = await gw.queue.get(job_id)
        assert job is not None
        check_tree(spans, job_id, "gpt-4.1", job.result["usage"])
        server = one(spans, "POST /v1/chat/completions")
        assert server.context is not None and f"{server.context.trace_id:032x}" == CALLER_TRACE


async def test_a_streamed_call_of_another_endpoint_names_its_own_url(
    queue_factory: QueueFactory, exporter: InMemorySpanExporter,
) -> None:
    async with open_gateway(queue_factory, configure=with_legacy_models) as gw, gw.openai("acme") as client:
        stream = await client.completions.create(model="gpt-3.5-turbo-instruct", prompt="Say hello",
                                                 max_tokens=4, stream=True)
        assert [chunk async for chunk in stream]
        spans = await finished(exporter, "worker.process")

        http = one(spans, "POST")
        assert http.attributes is not None and str(http.attributes["url.full"]).endswith("/v1/completions")
        assert http.attributes["http.response.status_code"] == 200


async def test_a_failed_call_marks_its_spans_failed(
    queue_factory: QueueFactory, exporter: InMemorySpanExporter,
) -> None:
    async with open_gateway(queue_factory) as gw, gw.openai("acme") as client:
        gw.sim.inject("gpt-4.1", InjectedFault("status", status=400))
        with pytest.raises(openai.BadRequestError):
            await client.chat.completions.create(model="gpt-4.1", messages=HELLO)
        spans = await finished(exporter, "worker.process")

        process, http = one(spans, "worker.process"), one(spans, "POST")
        assert not process.status.is_ok and process.attributes is not None
        assert process.attributes["error.type"] == "upstream_client_error"  # the job's failure code
        assert not http.status.is_ok and http.attributes is not None
        assert http.attributes["http.response.status_code"] == 400


async def test_tracing_off_makes_no_span_and_puts_no_trace_in_the_job(queue_factory: QueueFactory) -> None:
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))  # made, never installed: tracing is off
    assert tracer() is NOOP
    async with open_gateway(queue_factory) as gw, gw.openai("acme") as client:
        raw = await client.chat.completions.with_raw_response.create(model="gpt-4.1", messages=HELLO)

        job = await gw.queue.get(raw.headers["X-Tidegate-Job-Id"])
        assert job is not None and "trace" not in job.payload
    assert memory.get_finished_spans() == ()
    provider.shutdown()


_OFF = """
import sys
import {modules}
from tidegate.config import TidegateConfig
from tidegate.tracing import configured
with configured(TidegateConfig().tracing) as tracing:
    with tracing.span("nothing") as span:
        span.set_attributes({{"a": 1}})
    assert not tracing.enabled and tracing.carrier() is None
print(sorted(name for name in sys.modules if name.startswith(("opentelemetry", "tidegate._otel"))))
"""


def loaded_off(*modules: str) -> list[str]:
    """What of OpenTelemetry a fresh process imports with `modules`, tracing off (this process has
    imported it for the other tests)."""
    script = _OFF.format(modules=", ".join(modules))
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    found: list[str] = ast.literal_eval(done.stdout.strip())
    return found


def test_tracing_off_never_imports_opentelemetry() -> None:
    # A worker process imports nothing of it.
    assert loaded_off("tidegate.app.worker", "tidegate.dispatch.worker", "tidegate.providers.client") == []
    # FastAPI (>= 0.16x) imports the OpenTelemetry API itself, for its own instrumentation, which
    # the gateway turns off; the SDK, the exporter and tidegate's use of them stay out.
    gateway = loaded_off("tidegate.app.up", "tidegate.app.gateway", "tidegate.gateway.app",
                         "tidegate.cli.main")
    assert not [name for name in gateway if name.startswith(("opentelemetry.sdk", "opentelemetry.exporter",
                                                             "tidegate._otel"))], gateway


class _Collector(BaseHTTPRequestHandler):
    """An OTLP/HTTP receiver: keeps each export request's body."""

    received: ClassVar[list[bytes]] = []

    def do_POST(self) -> None:  # http.server's naming
        self.received.append(self.rfile.read(int(self.headers["Content-Length"])))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        """Quiet."""


@contextlib.contextmanager
def collector() -> Iterator[str]:
    """An OTLP/HTTP receiver on a free loopback port, in a thread; yields its traces URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Collector)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1/traces"
    finally:
        server.shutdown()
        server.server_close()


def test_configured_tracing_exports_with_otlp_over_http_and_is_removed_after() -> None:
    _Collector.received.clear()
    with collector() as url:
        settings = TracingSettings(enabled=True, otlp_endpoint=url, service_name="tidegate-test")
        with configured(settings) as tracing:
            assert tracer() is tracing and tracing.enabled
            with tracing.span("worker.process", attributes={"tidegate.job_id": "j1"}):
                pass
        assert tracer() is NOOP  # and shut down: the span was flushed on the way out

    exported = ExportTraceServiceRequest()
    exported.ParseFromString(b"".join(_Collector.received))
    [resource] = exported.resource_spans
    assert {attr.key: attr.value.string_value for attr in resource.resource.attributes}["service.name"] == (
        "tidegate-test")
    assert [span.name for scope in resource.scope_spans for span in scope.spans] == ["worker.process"]


def test_the_trace_crosses_the_queue_in_the_job_payload() -> None:
    body = {"model": "auto", "messages": [{"role": "user", "content": "hi"}]}
    trace = {"traceparent": CALLER_PARENT, "tracestate": "a=b"}
    request = AIRequest("chat", decode("chat", body), trace=trace)

    assert AIRequest.from_payload(request.to_payload()) == request
    assert "trace" not in AIRequest.of("chat", body).to_payload()
    with pytest.raises(InvalidJob, match="trace"):
        AIRequest.from_payload({"kind": "chat", "body": body, "trace": {"traceparent": 1}})
    with pytest.raises(InvalidJob, match="unknown"):
        AIRequest.from_payload({"kind": "chat", "body": body, "traces": {}})
