"""Traces of a request's way through tidegate: the gateway's server span, the wait in the queue,
the worker's processing, the model call and the provider's HTTP request, one trace per request.

The rest of tidegate speaks to `tracer()` only. Tracing is off by default, and off costs next to
nothing: `tracer()` is then `NOOP`, whose spans are one shared object that does nothing, and
OpenTelemetry is never imported (tidegate._otel holds everything that needs it). A process turns
tracing on with `configured(config.tracing)` around the life of its gateway or worker.

The trace context crosses the queue inside the job (`AIRequest.trace`): `carrier()` gives the
current context as W3C Trace Context fields (`traceparent`, `tracestate`), and a span started
with `parent=carrier` continues that trace in another process.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, ClassVar, Final, Literal

from tidegate.errors import ConfigError

if TYPE_CHECKING:
    from tidegate.config import TracingSettings

__all__ = [
    "NOOP",
    "NOOP_SPAN",
    "NOTHING",
    "Attributes",
    "Carrier",
    "Span",
    "SpanKind",
    "Tracing",
    "carrier_of",
    "configured",
    "install",
    "installed",
    "tracer",
]

Carrier = dict[str, str]
"""A trace context as W3C Trace Context fields: `traceparent`, and `tracestate` when there is one."""
AttributeValue = str | bool | int | float
Attributes = Mapping[str, AttributeValue]
SpanKind = Literal["internal", "server", "client"]
CARRIER_FIELDS: Final = frozenset({"traceparent", "tracestate"})


class Span:
    """A span being recorded; this base records nothing (tracing off)."""

    __slots__ = ()

    def set_attributes(self, attributes: Attributes) -> None:
        """Add or replace attributes."""

    def update_name(self, name: str) -> None:
        """Rename the span (a server span learns its route after routing)."""

    def fail(self, error_type: str, message: str = "") -> None:
        """Mark the span failed: status ERROR, and `error.type` as the semantic conventions say."""

    def end(self, end_ns: int | None = None) -> None:
        """End the span (now, or at `end_ns`, nanoseconds since the epoch)."""


NOOP_SPAN: Final = Span()
NOTHING: Final[AbstractContextManager[Span]] = contextlib.nullcontext(NOOP_SPAN)
"""The block of a span not made (reusable): what span-making helpers return when tracing is off."""


class Tracing:
    """Makes spans; this base makes none (tracing off). See tidegate._otel for the real one."""

    enabled: ClassVar[bool] = False

    def span(self, name: str, *, kind: SpanKind = "internal", attributes: Attributes | None = None,
             parent: Carrier | None = None, start_ns: int | None = None) -> AbstractContextManager[Span]:
        """A span that is the current one inside the block, the child of the current span (or of
        `parent`, a carrier from another process); an exception leaving the block fails it."""
        return NOTHING

    def start(self, name: str, *, kind: SpanKind = "internal", attributes: Attributes | None = None,
              parent: Carrier | None = None) -> Span:
        """A span that is not made current: its owner ends it (a stream read over many calls)."""
        return NOOP_SPAN

    def record(self, name: str, *, start_ns: int, end_ns: int, attributes: Attributes | None = None,
               parent: Carrier | None = None) -> None:
        """A span whose times are known already (the queue wait, measured from the job's times)."""

    def annotate(self, attributes: Attributes) -> None:
        """Add attributes to the current span, if there is one."""

    def carrier(self) -> Carrier | None:
        """The current trace context, to cross a process boundary; None without one."""
        return None

    def shutdown(self) -> None:
        """Export what is still buffered and stop."""


NOOP: Final = Tracing()
_current: Tracing = NOOP


def tracer() -> Tracing:
    """The process's tracing (NOOP unless `configure` or `install` turned it on)."""
    return _current


def install(tracing: Tracing) -> Tracing:
    """Make `tracing` the process's; returns the one it replaces (tests put it back)."""
    global _current
    previous, _current = _current, tracing
    return previous


@contextlib.contextmanager
def configured(settings: TracingSettings) -> Iterator[Tracing]:
    """Tracing as `settings` say for the block, a process's life: on, it exports with OTLP and
    is shut down at the end (the last spans exported); off, the process's tracing is left as it
    is (NOOP, unless a test installed its own)."""
    if not settings.enabled:
        yield tracer()
        return
    try:
        from tidegate._otel import otlp_tracing
    except ImportError as exc:
        raise ConfigError(f"tracing is enabled but OpenTelemetry is not installed ({exc.name}): "
                          "pip install 'tidegate[otel]'") from None
    tracing = otlp_tracing(settings)
    with installed(tracing):
        try:
            yield tracing
        finally:
            tracing.shutdown()


def carrier_of(value: object) -> Carrier | None:
    """A carrier read from a job (or None when it holds none that could be one)."""
    if not isinstance(value, dict) or not isinstance(value.get("traceparent"), str):
        return None
    return {key: text for key, text in value.items() if key in CARRIER_FIELDS and isinstance(text, str)}


@contextlib.contextmanager
def installed(tracing: Tracing) -> Iterator[Tracing]:
    """`tracing` as the process's inside the block, the previous one after it."""
    previous = install(tracing)
    try:
        yield tracing
    finally:
        install(previous)
