"""The provider side: the pooled client of an OpenAI-compatible upstream, and the simulated
provider that the demo, the tests and the benchmarks call instead of a real one."""

from tidegate.providers.client import (
    StreamChunk,
    StreamSummary,
    UpstreamClient,
    UpstreamResponse,
    UpstreamStream,
    Usage,
)
from tidegate.providers.ratelimit import RateLimitInfo, parse_duration_s, parse_retry_after
from tidegate.providers.sim_settings import ModelBehaviour, SimulatorSettings
from tidegate.providers.simulator import InjectedFault, Simulator

__all__ = [
    "InjectedFault",
    "ModelBehaviour",
    "RateLimitInfo",
    "Simulator",
    "SimulatorSettings",
    "StreamChunk",
    "StreamSummary",
    "UpstreamClient",
    "UpstreamResponse",
    "UpstreamStream",
    "Usage",
    "parse_duration_s",
    "parse_retry_after",
]
