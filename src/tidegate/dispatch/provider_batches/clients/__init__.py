"""The provider's side of provider batches: the batch client of a provider, by its `api`
(`batch_client`): OpenAI's Files + Batch (`openai`, which also holds the `BatchClient` contract
both speak) or Anthropic's Message Batches (`anthropic`), each over the provider's pooled
UpstreamClient."""

from __future__ import annotations

from tidegate.dispatch.provider_batches.clients.anthropic import AnthropicBatchClient
from tidegate.dispatch.provider_batches.clients.openai import BatchClient, ProviderBatchClient
from tidegate.providers.client import UpstreamClient

__all__ = ["batch_client"]


def batch_client(client: UpstreamClient) -> BatchClient:
    """The batch client that speaks the API of `client`'s provider."""
    if client.provider.api == "anthropic":
        return AnthropicBatchClient(client)
    return ProviderBatchClient(client)
