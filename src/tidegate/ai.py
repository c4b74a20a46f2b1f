"""The payload of an AI job: what the gateway enqueues and a worker sends upstream.

    {"kind": "chat" | "embeddings",
     "body": {...},                      # the OpenAI-compatible request body, as the client sent it
     "allowed_models": ["gpt-4.1", ...]} # optional: the tenant's entitlement, set by the gateway
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from tidegate.errors import InvalidJob

Kind = Literal["chat", "embeddings"]
AUTO = "auto"


@dataclass(frozen=True, slots=True)
class AIRequest:
    """A validated AI job payload."""

    kind: Kind
    body: dict[str, Any]
    allowed_models: frozenset[str] | None = None

    @property
    def requested_model(self) -> str | None:
        """The model the caller named, or None for routing (`"auto"` or absent)."""
        model = self.body.get("model")
        return None if model in (None, "", AUTO) else str(model)

    @property
    def stream(self) -> bool:
        """Whether the caller asked for server-sent events."""
        return bool(self.body.get("stream"))

    def to_payload(self) -> dict[str, Any]:
        """The job payload for this request."""
        payload: dict[str, Any] = {"kind": self.kind, "body": self.body}
        if self.allowed_models is not None:
            payload["allowed_models"] = sorted(self.allowed_models)
        return payload

    @classmethod
    def from_payload(cls, payload: Mapping[str, Any]) -> AIRequest:
        """Parse a job payload; anything malformed is an InvalidJob naming the field."""
        unknown = set(payload) - {"kind", "body", "allowed_models"}
        if unknown:
            raise InvalidJob(f"unknown AI job field(s): {', '.join(sorted(unknown))}")
        kind = payload.get("kind")
        if kind not in ("chat", "embeddings"):
            raise InvalidJob(f"AI job kind must be 'chat' or 'embeddings', got {kind!r}")
        body = payload.get("body")
        if not isinstance(body, dict):
            raise InvalidJob("AI job body must be a JSON object")
        if kind == "chat" and not isinstance(body.get("messages"), list):
            raise InvalidJob("a chat request needs 'messages' (a list)")
        if kind == "embeddings" and not isinstance(body.get("input"), str | list):
            raise InvalidJob("an embeddings request needs 'input' (a string or a list)")
        allowed = payload.get("allowed_models")
        if allowed is not None and not (
            isinstance(allowed, list) and all(isinstance(name, str) for name in allowed)
        ):
            raise InvalidJob("allowed_models must be a list of model names")
        return cls(kind=kind, body=body, allowed_models=None if allowed is None else frozenset(allowed))
