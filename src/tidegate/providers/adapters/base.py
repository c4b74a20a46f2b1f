"""The seam between the worker and one upstream's API: a provider adapter.

The worker knows only AI jobs (`tidegate.ai.AIRequest`) and what a call gave back (`Answer`,
from which it builds the job's `AIResult`); an adapter knows how one upstream API is called: the
path, the body and the headers of the request, and how its answer and its stream read. It does so
over the provider's pooled `UpstreamClient`, which the worker opens and closes.

A new upstream API (Anthropic Messages, say) is one module with one `ProviderAdapter` subclass,
registered in `tidegate.providers.adapters.ADAPTERS`. It implements:

- `complete(request, model)`: call the upstream once and return the `Answer`, its `response` in
  the job result's form (an OpenAI-compatible document, see `tidegate.ai`), converted if the
  upstream speaks another;
- `stream(request, model, on_part)`: call with streaming, hand each chunk to `on_part` as a
  `StreamPart` in the relay's form as it arrives, and return the whole answer at the end;
- `streams(request)`, if its rule of which requests stream differs from "a chat (or a legacy
  completion) that asked to".

Failures leave as `UpstreamError` (tidegate.errors), whose `kind` and `retryable` tell the worker
what to do.
"""

from __future__ import annotations

import abc
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from tidegate.ai import AIRequest, StreamPart, Usage
from tidegate.providers.client import UpstreamClient
from tidegate.providers.ratelimit import RateLimitInfo

__all__ = ["Answer", "PartSink", "ProviderAdapter"]

PartSink = Callable[[StreamPart], Awaitable[None]]
"""Takes each chunk of a stream as it arrives (the worker relays it to the gateway)."""


@dataclass(frozen=True, slots=True)
class Answer:
    """What one successful upstream call gave: the answer in the job result's form, the tokens it
    used, how long it took (`ttft_ms` for streams: to the first content) and the provider's
    rate-limit headers."""

    response: dict[str, Any]
    usage: Usage
    latency_ms: float
    rate_limit: RateLimitInfo
    ttft_ms: float | None = None


class ProviderAdapter(abc.ABC):
    """Calls one upstream API for AI jobs (see the module's docstring for what a subclass does)."""

    def __init__(self, client: UpstreamClient) -> None:
        self.client = client

    def streams(self, request: AIRequest) -> bool:
        """Whether this request is answered by `stream` when someone listens to its chunks."""
        return request.kind in ("chat", "completion") and request.stream

    @abc.abstractmethod
    async def complete(self, request: AIRequest, model: str) -> Answer:
        """Call `model` for the whole answer at once."""

    @abc.abstractmethod
    async def stream(self, request: AIRequest, model: str, on_part: PartSink) -> Answer:
        """Call `model` streaming: each chunk goes to `on_part` as it arrives; the whole answer is
        returned at the end."""
