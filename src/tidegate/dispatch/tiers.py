"""Service tiers: which `service_tier` a job's call is sent with, and at which tier's prices it is
reserved and charged.

The caller's own `service_tier` (a field of the OpenAI body) always wins and goes upstream as
given. A job whose caller named none gets the tier the routed provider's policy maps its priority
to (`ProviderConfig.service_tiers`: CRITICAL → priority, BULK → flex, say); with no policy, the
body goes unchanged and the provider bills its default tier. OpenAI's legacy completions and
moderations take no tier: the policy never adds one to them. Budget reservations price the tier
sent (`auto`: the default prices); the settled cost prices the tier the provider's answer names,
since the provider may serve `auto`, or a flex call under load, at another tier than asked.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from tidegate import contract
from tidegate.ai import AIRequest
from tidegate.config import ModelConfig, ProviderConfig
from tidegate.costs import at_tier, billed_tier, scaled
from tidegate.jobs import Priority

__all__ = ["answered_with_tier", "batch_priced", "priced", "tier_of", "with_tier"]

FIELD = "service_tier"


def tier_of(request: AIRequest, provider: ProviderConfig, priority: Priority) -> str | None:
    """The tier to send: the caller's, else the provider's policy for `priority`, else none."""
    chosen = contract.requested_tier(request.body)
    if chosen is not None:
        return chosen
    return provider.tier_for(priority) if request.kind in ("chat", "embeddings") else None


def with_tier(request: AIRequest, tier: str | None) -> AIRequest:
    """`request` with `tier` in its body (unchanged when it already says so, or there is none)."""
    if tier is None or contract.requested_tier(request.body) == tier:
        return request
    return replace(request, body=contract.with_tier(request.body, tier))


def priced(model: ModelConfig, provider: ProviderConfig, tier: str | None) -> ModelConfig:
    """`model` with its prices at `tier` on `provider`."""
    return at_tier(model, tier, provider.tier_price_factors)


def batch_priced(model: ModelConfig, provider: ProviderConfig) -> ModelConfig:
    """`model` at the prices of `provider`'s own batch API: the default prices, the cached-input
    and cache-write ones included, times its batch `discount` (the model itself when the provider
    has no batch section)."""
    return model if provider.batch is None else scaled(model, provider.batch.discount)


def answered_with_tier(response: dict[str, Any], sent: str | None) -> tuple[dict[str, Any], str]:
    """The answer and the tier it is billed at. An answer to a call sent with a tier names the
    tier it ran at: the provider's own word when it gave one, else the tier billed."""
    billed = billed_tier(sent, response.get(FIELD))
    if sent is None or isinstance(response.get(FIELD), str):
        return response, billed
    return {**response, FIELD: billed}, billed
