"""Provider adapters: how each upstream API is called for AI jobs (see `base`): OpenAI-compatible
ones and Anthropic's Messages API."""

from __future__ import annotations

from collections.abc import Mapping

from tidegate.providers.adapters.anthropic import AnthropicAdapter
from tidegate.providers.adapters.base import Answer, PartSink, ProviderAdapter
from tidegate.providers.adapters.openai import OpenAIAdapter
from tidegate.providers.client import UpstreamClient

__all__ = ["ADAPTERS", "Answer", "AnthropicAdapter", "OpenAIAdapter", "PartSink", "ProviderAdapter",
           "adapter_for"]

ADAPTERS: Mapping[str, type[ProviderAdapter]] = {"openai": OpenAIAdapter, "anthropic": AnthropicAdapter}
"""The adapter of each upstream API, by name."""


def adapter_for(client: UpstreamClient, api: str = "openai") -> ProviderAdapter:
    """The adapter that calls `api` over `client`."""
    return ADAPTERS[api](client)
