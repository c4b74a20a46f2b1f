"""The batch client of a provider, by its `api`: OpenAI's Files + Batch or Anthropic's Message
Batches, both a `BatchClient` over the provider's pooled UpstreamClient."""

from __future__ import annotations

from tidegate.providers.anthropic_batches import AnthropicBatchClient
from tidegate.providers.batch_api import BatchClient, ProviderBatchClient
from tidegate.providers.client import UpstreamClient

__all__ = ["batch_client"]


def batch_client(client: UpstreamClient) -> BatchClient:
    """The batch client that speaks the API of `client`'s provider."""
    if client.provider.api == "anthropic":
        return AnthropicBatchClient(client)
    return ProviderBatchClient(client)
