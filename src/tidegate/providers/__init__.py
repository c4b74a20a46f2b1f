"""The provider side: the pooled client of an upstream and its rate-limit headers, and the
adapters that call each upstream API for AI jobs (`tidegate.providers.adapters`)."""

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
