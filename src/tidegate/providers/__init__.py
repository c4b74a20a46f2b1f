"""The provider side: the pooled client of an OpenAI-compatible upstream and its rate-limit headers."""

from tidegate.providers.client import (
    StreamChunk,
    StreamSummary,
    UpstreamClient,
    UpstreamResponse,
    UpstreamStream,
    Usage,
)
from tidegate.providers.ratelimit import RateLimitInfo, parse_duration_s, parse_retry_after

__all__ = [
    "RateLimitInfo",
    "StreamChunk",
    "StreamSummary",
    "UpstreamClient",
    "UpstreamResponse",
    "UpstreamStream",
    "Usage",
    "parse_duration_s",
    "parse_retry_after",
]
