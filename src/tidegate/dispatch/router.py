"""Which model serves a job: by the model asked for, the job's priority tier, its estimated size
and the budget left today.

- Embeddings go to `routing.embedding_model` unless the request names an embeddings model. They
  never fall back to another model: vectors of different models do not mix in one index.
- Legacy completions and moderations go only to a model of their own kind (a provider offers the
  endpoint by serving one): the one named, else the first configured; no fallback either.
- A named chat model is used as named when it is configured and the tenant may use it; it is
  never swapped (not for failures, size or budget): the caller chose it. Its context window is
  not checked either, since the size estimate errs high on purpose and the provider decides.
- `auto` (or no model) walks the tier named after the priority (`routing.tiers`), best first,
  over the models the tenant may use: when the tenant may use none of the tier's models, its own
  allowed chat models take the tier's place, cheapest first (a tenant allowed only gpt-4.1 is
  served by it at every priority), and a tenant that may use no configured chat model at all is
  refused (`model_not_allowed`). Models that are failing (`exclude`) or whose context window is
  smaller than the estimated input are dropped; a long input (>= `long_context_tokens`) tries
  `long_context_model` first; with little budget left (< `low_budget_fraction`) the cheapest
  remaining model by output price goes first, searching all chat models when none of the tier's
  is left. The rest, in order, are the fallbacks.

The gateway routes an `auto` request once at the door with the same rules (no budget, no failing
models: those only add candidates), so what no model may ever serve is refused before it is
queued; a job the worker still cannot route (its configuration changed since) ends dead.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from decimal import Decimal

from tidegate.ai import KINDS, Kind
from tidegate.config import ModelConfig, ProviderConfig, TidegateConfig
from tidegate.errors import RoutingError
from tidegate.jobs import Priority

__all__ = ["AUTO", "RouteDecision", "Router", "RoutingError"]

AUTO = "auto"


@dataclass(frozen=True, slots=True)
class RouteDecision:
    """The model chosen for a job, why, and what to try next if it keeps failing."""

    provider: ProviderConfig
    model: ModelConfig
    reason: str  # short and human: "tier critical", "tier normal, long context", ...
    fallbacks: tuple[str, ...]  # model names, in order


class Router:
    """Routes jobs by the rules in the module docstring. Pure and cheap: no I/O, safe to share."""

    def __init__(self, config: TidegateConfig) -> None:
        self.config = config
        self.routing = config.routing
        # The first provider serving a name wins, as in TidegateConfig.find_model.
        self._served: dict[str, tuple[ProviderConfig, ModelConfig]] = {}
        for provider in config.providers:
            for model in provider.models:
                self._served.setdefault(model.name, (provider, model))
        self._chat_models = tuple(name for name, (_, m) in self._served.items() if m.kind == "chat")

    def route(
        self,
        *,
        kind: Kind,
        requested_model: str | None,
        priority: Priority,
        estimated_input_tokens: int,
        budget_fraction_left: float | None = None,
        allowed_models: frozenset[str] | None = None,
        exclude: frozenset[str] = frozenset(),
    ) -> RouteDecision:
        """Choose the model for one job; RoutingError when none may serve it."""
        if kind not in KINDS:
            raise RoutingError(f"cannot route request kind {kind!r}: use one of {', '.join(KINDS)}",
                               refusal="invalid_request")
        explicit = requested_model not in (None, "", AUTO)
        if explicit:
            assert requested_model is not None
            return self._named(requested_model, kind, allowed_models, "requested")
        if kind == "embeddings":
            return self._named(self.routing.embedding_model, kind, allowed_models, "embedding model")
        if kind != "chat":
            return self._named(self._first_of(kind, allowed_models), kind, allowed_models,
                               f"first {kind} model")
        return self._auto(Priority.parse(priority), estimated_input_tokens, budget_fraction_left,
                          allowed_models, exclude)

    def cheapest(
        self, *, estimated_input_tokens: int, allowed_models: frozenset[str] | None = None,
        exclude: frozenset[str] = frozenset(),
    ) -> RouteDecision | None:
        """The cheapest chat model (by output, then input price) that may serve an `auto` job of
        this size, for the `step_down` budget mode when the routed model did not fit the budget
        left; None when there is none."""
        ranked = [name for name in self._eligible(self._chat_models, estimated_input_tokens, allowed_models)
                  if name not in exclude]
        if not ranked:
            return None
        provider, model = self._served[min(ranked, key=self._price)]
        return RouteDecision(provider, model, "budget exhausted: stepped down to the cheapest model", ())

    # ------------------------------------------------------------------ one named model

    def _first_of(self, kind: Kind, allowed: frozenset[str] | None) -> str:
        """The first configured model of `kind` the tenant may use, else the first of all (which
        `_named` then refuses as not allowed)."""
        served = [name for name, (_, model) in self._served.items() if model.kind == kind]
        if not served:
            raise RoutingError(f"no configured provider serves {kind} requests", refusal="model_not_found")
        return next((name for name in served if allowed is None or name in allowed), served[0])

    def _named(self, name: str, kind: Kind, allowed: frozenset[str] | None, reason: str) -> RouteDecision:
        served = self._served.get(name)
        if served is None:
            known = ", ".join(self._served) or "none"
            raise RoutingError(
                f"model {name!r} is unknown: no configured provider serves it (known: {known})",
                refusal="model_not_found",
            )
        provider, model = served
        if model.kind != kind:
            raise RoutingError(f"model {name!r} serves {model.kind} requests, not {kind}",
                               refusal="wrong_model_kind")
        if allowed is not None and name not in allowed:
            raise RoutingError(f"model {name!r} is not allowed for this tenant", refusal="model_not_allowed")
        return RouteDecision(provider, model, reason, ())

    # ------------------------------------------------------------------ auto

    def _auto(
        self,
        priority: Priority,
        estimated: int,
        budget_fraction_left: float | None,
        allowed: frozenset[str] | None,
        exclude: frozenset[str],
    ) -> RouteDecision:
        tier_name = priority.name.lower()
        tier = self.routing.tiers.get(tier_name)
        reasons = [f"tier {tier_name}" if tier is not None else f"no tier {tier_name}: any chat model"]
        preferred = list(tier) if tier is not None else list(self._chat_models)
        if allowed is not None and not self._eligible(preferred, 0, allowed):
            # The tier is written for every tenant; one entitled to none of its models is served
            # by the models it may use rather than refused at some priorities and not others.
            preferred = self._allowed_chat_models(allowed)
            reasons = [f"tier {tier_name} has no model the tenant may use: its own, cheapest first"]
        long_model = self.routing.long_context_model
        if long_model is not None and estimated >= self.routing.long_context_tokens:
            preferred = [long_model, *(name for name in preferred if name != long_model)]
            reasons.append("long context")

        ranked = self._eligible(preferred, estimated, allowed)
        low_budget = (budget_fraction_left is not None
                      and budget_fraction_left < self.routing.low_budget_fraction)
        if low_budget:
            if not [name for name in ranked if name not in exclude]:
                ranked = self._eligible(self._chat_models, estimated, allowed)
                reasons.append("budget low: stepped down beyond the tier")
            else:
                reasons.append("budget low: stepped down")
            ranked.sort(key=self._price)  # stable: equal prices keep their tier order

        usable = [name for name in ranked if name not in exclude]
        if not usable:
            raise RoutingError(self._why_nothing(tier_name, preferred, estimated, allowed, exclude))
        failed_ahead = ranked[: ranked.index(usable[0])]
        if failed_ahead:
            reasons.append(f"fallback after {', '.join(failed_ahead)} failed")
        provider, model = self._served[usable[0]]
        return RouteDecision(provider, model, ", ".join(reasons), tuple(usable[1:]))

    def _allowed_chat_models(self, allowed: frozenset[str]) -> list[str]:
        """The configured chat models among `allowed`, cheapest first; RoutingError
        `model_not_allowed` when there is none."""
        usable = sorted((name for name in self._chat_models if name in allowed), key=self._price)
        if not usable:
            named = ", ".join(sorted(allowed)) or "none"
            raise RoutingError(
                f"no chat model may serve this tenant: none of the models it may use ({named}) is a "
                f"chat model this gateway serves (chat models: {', '.join(self._chat_models) or 'none'})",
                refusal="model_not_allowed",
            )
        return usable

    def _eligible(self, names: Iterable[str], estimated: int, allowed: frozenset[str] | None) -> list[str]:
        """Configured chat models among `names`, allowed and large enough, in order, once each."""
        out: list[str] = []
        for name in names:
            served = self._served.get(name)
            if served is None or name in out:
                continue
            model = served[1]
            fits = model.context_tokens >= estimated
            if model.kind == "chat" and (allowed is None or name in allowed) and fits:
                out.append(name)
        return out

    def _price(self, name: str) -> tuple[Decimal, Decimal]:
        model = self._served[name][1]
        return (model.output_usd_per_1m, model.input_usd_per_1m)

    def _why_nothing(
        self,
        tier_name: str,
        preferred: list[str],
        estimated: int,
        allowed: frozenset[str] | None,
        exclude: frozenset[str],
    ) -> str:
        reasons = []
        for name in dict.fromkeys(preferred):
            served = self._served.get(name)
            if served is None:
                reasons.append(f"{name} is not configured")
            elif served[1].kind != "chat":
                reasons.append(f"{name} is not a chat model")
            elif allowed is not None and name not in allowed:
                reasons.append(f"{name} is not allowed")
            elif served[1].context_tokens < estimated:
                reasons.append(f"{name} holds {served[1].context_tokens} tokens")
            elif name in exclude:
                reasons.append(f"{name} is failing")
        detail = "; ".join(reasons) or "the tier is empty"
        return f"no model can serve a {tier_name} chat request of ~{estimated} input tokens: {detail}"
