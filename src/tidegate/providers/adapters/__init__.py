"""Provider adapters: how each upstream API is called for AI jobs (see `base`)."""

from __future__ import annotations

from collections.abc import Mapping

from tidegate.providers.adapters.base import Answer, PartSink, ProviderAdapter
from tidegate.providers.adapters.openai import OpenAIAdapter
from tidegate.providers.client import UpstreamClient

__all__ = ["ADAPTERS", "Answer", "OpenAIAdapter", "PartSink", "ProviderAdapter", "adapter_for"]

ADAPTERS: Mapping[str, type[ProviderAdapter]] = {"openai": OpenAIAdapter}
"""The adapter of each upstream API, by name."""


def adapter_for(client: UpstreamClient, api: str = "openai") -> ProviderAdapter:
    """The adapter that calls `api` over `client`."""
    return ADAPTERS[api](client)
