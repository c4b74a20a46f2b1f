"""Whether a request that only its own API can carry may be taken: when every provider that may
serve it speaks that API natively (`ProviderConfig.speaks`), its job is sent to one of them as it
is (tidegate.providers.adapters.native); otherwise the fields with no chat translation are
refused with a 400, as before. Asked by the live routes (/v1/responses, /v1/messages) and by a
batch's `/v1/responses` lines (tidegate.gateway.batches.lines), so a line is taken or refused
exactly as the route would take or refuse its body.

"May serve": the providers of the model named, or, for `auto`, every provider with a chat model
(routing may fall back along a tier to any of them). A job that still reaches a provider that
does not speak its API (the configuration changed since it was queued) fails with
`native_api_required` rather than lose what it asked for.
"""

from __future__ import annotations

from tidegate.ai import AUTO, OriginApi
from tidegate.gateway.core.state import GatewayState

__all__ = ["served_natively"]


def served_natively(state: GatewayState, api: OriginApi, model: str | None) -> bool:
    """Whether every provider that may serve `model` (None or "auto": routed) speaks `api`."""
    providers = state.config.providers
    if model in (None, "", AUTO):
        candidates = [provider for provider in providers
                      if any(served.kind == "chat" for served in provider.models)]
    else:
        candidates = [provider for provider in providers
                      if any(served.name == model for served in provider.models)]
    return bool(candidates) and all(provider.speaks(api) for provider in candidates)
