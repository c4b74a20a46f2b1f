"""Tracing with the OpenTelemetry SDK: the one module that imports OpenTelemetry, and only when
tracing is on (tidegate.tracing.configure imports it then).

tidegate keeps a TracerProvider of its own rather than the global one, so an application that
embeds tidegate and sets up its own OpenTelemetry is left alone, and tests can swap providers.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Final

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.trace import Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from tidegate.config import TracingSettings
from tidegate.tracing import Attributes, Carrier, Span, SpanKind, Tracing

__all__ = ["OtelTracing", "otlp_tracing"]

_KINDS: Final = {"internal": trace.SpanKind.INTERNAL, "server": trace.SpanKind.SERVER,
                 "client": trace.SpanKind.CLIENT}


class _OtelSpan(Span):
    """An SDK span behind tidegate's Span."""

    __slots__ = ("_span",)

    def __init__(self, span: trace.Span) -> None:
        self._span = span

    def set_attributes(self, attributes: Attributes) -> None:
        """Add or replace attributes."""
        self._span.set_attributes(attributes)

    def update_name(self, name: str) -> None:
        """Rename the span."""
        self._span.update_name(name)

    def fail(self, error_type: str, message: str = "") -> None:
        """Status ERROR with `error.type`."""
        self._span.set_attribute("error.type", error_type)
        self._span.set_status(Status(StatusCode.ERROR, message or None))

    def end(self, end_ns: int | None = None) -> None:
        """End the span."""
        self._span.end(end_ns)


class OtelTracing(Tracing):
    """Spans made by `provider` (its processors export them)."""

    enabled = True

    def __init__(self, provider: TracerProvider) -> None:
        self.provider = provider
        self._tracer = provider.get_tracer("tidegate")
        self._propagator = TraceContextTextMapPropagator()

    def _context(self, parent: Carrier | None) -> Context | None:
        return None if parent is None else self._propagator.extract(parent)

    @contextlib.contextmanager
    def span(self, name: str, *, kind: SpanKind = "internal", attributes: Attributes | None = None,
             parent: Carrier | None = None, start_ns: int | None = None) -> Iterator[Span]:
        """A current span for the block (see Tracing.span)."""
        with self._tracer.start_as_current_span(name, context=self._context(parent), kind=_KINDS[kind],
                                                attributes=attributes, start_time=start_ns) as span:
            yield _OtelSpan(span)

    def start(self, name: str, *, kind: SpanKind = "internal", attributes: Attributes | None = None,
              parent: Carrier | None = None) -> Span:
        """A span its owner ends."""
        return _OtelSpan(self._tracer.start_span(name, context=self._context(parent), kind=_KINDS[kind],
                                                 attributes=attributes))

    def record(self, name: str, *, start_ns: int, end_ns: int, attributes: Attributes | None = None,
               parent: Carrier | None = None) -> None:
        """A finished span with the times given."""
        span = self._tracer.start_span(name, context=self._context(parent), attributes=attributes,
                                       start_time=start_ns)
        span.end(max(end_ns, start_ns))

    def annotate(self, attributes: Attributes) -> None:
        """Attributes on the current span (none: nothing happens)."""
        trace.get_current_span().set_attributes(attributes)

    def carrier(self) -> Carrier | None:
        """The current context as traceparent/tracestate."""
        carrier: Carrier = {}
        self._propagator.inject(carrier)
        return carrier or None

    def shutdown(self) -> None:
        """Flush and stop the provider's processors."""
        self.provider.shutdown()


def otlp_tracing(settings: TracingSettings) -> OtelTracing:
    """Tracing exported in batches with OTLP over HTTP, as `settings` say (see TracingSettings)."""
    provider = TracerProvider(resource=Resource.create({"service.name": settings.service_name}),
                              sampler=ParentBased(TraceIdRatioBased(settings.sample_ratio)))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=settings.otlp_endpoint)))
    return OtelTracing(provider)
