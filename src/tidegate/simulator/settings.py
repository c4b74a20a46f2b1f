"""Settings of the simulated provider: which models it serves and how each one behaves.

    seed = 7                      # the same seed and the same requests give the same answers
    window_s = 1.0                # rate limits count over this window (60 s by default)
    retry_after_format = "http-date"

    [defaults]                    # every model, unless overridden below
    latency_ms = 20
    latency_p99_ms = 120

    [models."gpt-4.1"]            # overrides for one model; a name not in the price table is
    rpm = 5                       # served as an extra model (kind = "embeddings" for vectors,
                                  # "completion" or "moderation" for the legacy endpoints)
    error_rate = 0.1

A provider batch (`/v1/batches`, see batches.py) ends `batch_latency_s` after it was created;
`batch_fault = "failed"` or `"expired"` makes every batch created meanwhile end so.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, model_validator

from tidegate.errors import ConfigError
from tidegate.simulator.catalogue import default_models, legacy_models

__all__ = ["BatchFault", "ModelBehaviour", "ModelKind", "RetryAfterFormat", "ServedModel",
           "SimulatorSettings"]

RetryAfterFormat = Literal["seconds", "http-date"]
BatchFault = Literal["failed", "expired"]
ModelKind = Literal["chat", "embeddings", "completion", "moderation"]

FAULT_RATES = ("error_rate", "unavailable_rate", "timeout_rate", "reset_rate", "malformed_rate")


class ModelBehaviour(BaseModel):
    """How the simulator answers for one model. Rates are probabilities per accepted request."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    # Delay before a non-streamed answer: lognormal with this median and p99; fixed at the median
    # when latency_p99_ms is None or not above it.
    latency_ms: float = Field(0.0, ge=0)
    latency_p99_ms: float | None = Field(None, ge=0)
    # Streams: delay before the first content chunk (None: a latency sample), then between tokens.
    ttft_ms: float | None = Field(None, ge=0)
    inter_token_ms: float = Field(0.0, ge=0)
    # Completion length in tokens: lognormal (median, p99), capped by the request's max_tokens
    # or, when it gives none, by max_completion_tokens.
    completion_tokens: int = Field(48, ge=1)
    completion_tokens_p99: int = Field(400, ge=1)
    max_completion_tokens: int = Field(1024, ge=1)
    # The model's own limits, counted over the simulator's window_s (per minute with the default
    # 60 s window): requests, and tokens (prompt + completion). None: unlimited.
    rpm: int | None = Field(None, gt=0)
    tpm: int | None = Field(None, gt=0)
    error_rate: float = Field(0.0, ge=0, le=1)  # HTTP 500
    unavailable_rate: float = Field(0.0, ge=0, le=1)  # HTTP 503
    timeout_rate: float = Field(0.0, ge=0, le=1)  # hold the request for hang_s, then 504
    reset_rate: float = Field(0.0, ge=0, le=1)  # abort the connection (mid-stream for streams)
    malformed_rate: float = Field(0.0, ge=0, le=1)  # 200 with a body that is not JSON
    embedding_dimensions: int = Field(256, ge=1, le=8192)

    @model_validator(mode="after")
    def _rates_fit(self) -> ModelBehaviour:
        if sum(getattr(self, name) for name in FAULT_RATES) > 1.0 + 1e-9:
            raise ValueError(f"the fault rates ({', '.join(FAULT_RATES)}) add up to more than 1")
        return self


@dataclass(frozen=True, slots=True)
class ServedModel:
    """A model the simulator serves, with its resolved behaviour."""

    name: str
    kind: ModelKind
    behaviour: ModelBehaviour


class SimulatorSettings(BaseModel):
    """Everything the simulator does; see the module docstring for the TOML form.

    `models` maps a model name to overrides of `defaults` (any ModelBehaviour field, plus `kind`);
    the models served are the price table's (`default_models()` of tidegate.simulator.catalogue),
    OpenAI's legacy completion and moderation models (`legacy_models()`) and every other name in
    `models`. With
    `price_table_limits`, the price table's rpm/tpm become the served models' limits unless
    overridden.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    seed: int = 0
    window_s: float = Field(60.0, gt=0)
    retry_after_format: RetryAfterFormat = "seconds"
    hang_s: float = Field(30.0, gt=0)  # how long a simulated timeout holds the request
    require_api_key: SecretStr | None = None  # answer 401 unless "Authorization: Bearer <this>"
    price_table_limits: bool = False
    defaults: ModelBehaviour = Field(default_factory=ModelBehaviour)
    models: dict[str, dict[str, Any]] = Field(default_factory=dict)
    stats_max_timestamps: int = Field(100_000, ge=0)  # accepted-request times kept per model
    # Provider batches: how long one takes from creation to its end, the fault that ends it
    # instead (None: it completes), and the bounds of an uploaded file (OpenAI's: 200 MB and
    # 50 000 requests; smaller here, as the simulator keeps its files in memory).
    batch_latency_s: float = Field(1.0, ge=0)
    batch_fault: BatchFault | None = None
    batch_max_file_bytes: int = Field(16 * 1024 * 1024, ge=1)
    batch_max_lines: int = Field(50_000, ge=1)

    @model_validator(mode="after")
    def _overrides_valid(self) -> SimulatorSettings:
        self.served_models()  # raises on an override that is not a valid behaviour
        return self

    def served_models(self) -> dict[str, ServedModel]:
        """Every model served, by name, with `defaults` and its overrides applied."""
        table = {model.name: model for model in (*default_models(), *legacy_models())}
        base = self.defaults.model_dump()
        served: dict[str, ServedModel] = {}
        for name in [*table, *(n for n in self.models if n not in table)]:
            overrides = dict(self.models.get(name, {}))
            priced = table.get(name)
            kind = overrides.pop("kind", priced.kind if priced else "chat")
            if kind not in get_args(ModelKind):
                raise ValueError(f"models.{name}.kind must be one of {', '.join(get_args(ModelKind))}, "
                                 f"not {kind!r}")
            fields = dict(base)
            if self.price_table_limits and priced is not None:
                fields.update(rpm=priced.rpm, tpm=priced.tpm)
            fields.update(overrides)
            try:
                behaviour = ModelBehaviour.model_validate(fields)
            except ValidationError as exc:
                raise ValueError(f"models.{name}: {exc}") from exc
            served[name] = ServedModel(name, kind, behaviour)
        return served

    def merged(self, patch: Mapping[str, Any]) -> SimulatorSettings:
        """These settings with `patch` merged in (nested tables merge key by key, so a patch
        `{"models": {"gpt-4.1": {"error_rate": 1}}}` leaves every other setting as it is)."""
        # Python mode keeps the SecretStr as it is; JSON mode would mask the key away.
        return SimulatorSettings.model_validate(_deep_merge(self.model_dump(), patch))

    @classmethod
    def from_toml(cls, path: Path) -> SimulatorSettings:
        """Read settings from a TOML file. Raises ConfigError naming the file and the problem."""
        try:
            with path.open("rb") as file:
                data = tomllib.load(file)
            return cls.model_validate(data)
        except (OSError, tomllib.TOMLDecodeError, ValidationError) as exc:
            raise ConfigError(f"simulator settings {path}: {exc}") from exc

    @classmethod
    def load(cls, path: Path | None = None, overrides: Mapping[str, Any] | None = None) -> SimulatorSettings:
        """Settings from a TOML file (or the defaults) with `overrides` merged in, as the command
        line does. Raises ConfigError when the result is invalid."""
        settings = cls.from_toml(path) if path is not None else cls()
        try:
            return settings.merged(overrides or {})
        except ValidationError as exc:
            raise ConfigError(f"simulator settings: {exc}") from exc

    def public_dict(self) -> dict[str, Any]:
        """The settings as JSON-ready data, the API key masked."""
        return self.model_dump(mode="json")


def _deep_merge(base: Mapping[str, Any], patch: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in patch.items():
        current = merged.get(key)
        if isinstance(value, Mapping) and isinstance(current, Mapping):
            merged[key] = _deep_merge(current, value)
        else:
            merged[key] = value
    return merged
