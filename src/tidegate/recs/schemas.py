"""Request and response models of the recommendations API, for validation and for the OpenAPI
document. Types are strict, as in the rest of the gateway: a string where a number belongs is
refused, not coerced, and an unknown field is named in a 400."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Discriminator, Field, Tag

from tidegate.recs.model import RecsSettings

__all__ = [
    "ID_MAX_LENGTH",
    "MAX_BATCH",
    "MAX_CATEGORIES",
    "MAX_INTERACTIONS",
    "MAX_N",
    "USER_ID_PATTERN",
    "Category",
    "FreshnessView",
    "HealthView",
    "InteractionIn",
    "InteractionsAccepted",
    "InteractionsRequest",
    "RecommendationView",
    "RecommendationsBatch",
    "RecommendationsBatchResult",
    "RecommendationsQuery",
    "RecommendationsView",
]

MAX_N = RecsSettings().max_n  # the most items one query may ask for (documented bound)
MAX_BATCH = 100  # users in one POST /v1/recommendations:batch
MAX_INTERACTIONS = 1_000  # interactions in one POST /v1/profiles/{user_id}/interactions
MAX_CATEGORIES = 20  # category filters in one query
ID_MAX_LENGTH = 256  # user, item and category ids
# A user id has no control characters: the API keeps a tenant's users apart with one (api.py).
USER_ID_PATTERN = r"^[^\x00-\x1f\x7f]+$"

ItemId = Annotated[str, Field(min_length=1, max_length=ID_MAX_LENGTH, examples=["85123A"])]
Category = Annotated[str, Field(min_length=1, max_length=ID_MAX_LENGTH, examples=["kitchen"])]
Price = Annotated[float, Field(ge=0, allow_inf_nan=False, examples=[2.5])]


class RecommendationsQuery(BaseModel):
    """One user's query of a batch: the fields of GET /v1/recommendations/{user_id}."""

    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra={"examples": [{
        "user_id": "17850", "n": 5, "categories": ["kitchen"], "max_price": 10, "explain": True}]})

    user_id: str = Field(min_length=1, max_length=ID_MAX_LENGTH, pattern=USER_ID_PATTERN, examples=["17850"])
    n: int = Field(10, ge=1, le=MAX_N, description="How many items (1 to the recommender's max_n).")
    context: ItemId | None = Field(None, description=(
        "An item the user is looking at: its neighbours become candidates, and on a cold start "
        "its category frames the trending."))
    categories: list[Category] = Field(default_factory=list, max_length=MAX_CATEGORIES, description=(
        "Only items in one of these categories."))
    min_price: Price | None = None
    max_price: Price | None = None
    explain: bool = Field(False, description="Give each item a short reason.")
    diversity: float = Field(0.0, ge=0, le=1, allow_inf_nan=False, description=(
        "0: pure score order; up to 1: items like those above them are pushed down."))


class RecommendationsBatch(BaseModel):
    """Several users' queries, answered in the order given."""

    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra={"examples": [{
        "queries": [{"user_id": "17850", "n": 3}, {"user_id": "13047", "n": 3, "explain": True}]}]})

    queries: list[RecommendationsQuery] = Field(min_length=1, max_length=MAX_BATCH)


class RecommendationView(BaseModel):
    """One recommended item."""

    item_id: str
    score: float = Field(description="The blended score (higher first); see tidegate.recs.score.")
    signals: dict[str, float] = Field(description=(
        "The normalised signals behind the score: profile, co_occurrence, trending, and repeat "
        "(the user's own purchases, when they are not excluded)."))
    reason: str | None = Field(None, description=(
        "With explain=true: 'bought together with X', 'similar to Y you viewed', 'trending in audio'."))


class RecommendationsView(BaseModel):
    """A user's recommendations."""

    model_config = ConfigDict(json_schema_extra={"examples": [{
        "user_id": "17850", "cold_start": False, "generated_at": "2026-01-01T12:00:00Z",
        "items": [{"item_id": "85123A", "score": 0.82, "signals": {"profile": 0.9, "co_occurrence": 0.7},
                   "reason": "bought together with White Hanging Heart T-Light Holder"}]}]})

    user_id: str
    items: list[RecommendationView]
    cold_start: bool = Field(description="The user has no history: the items are trending (in context).")
    generated_at: datetime


class RecommendationsBatchResult(BaseModel):
    """The answers of a batch, in the order of its queries."""

    results: list[RecommendationsView]


class InteractionIn(BaseModel):
    """One thing the user did with an item."""

    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra={"examples": [{
        "item_id": "85123A", "kind": "add_to_cart", "quantity": 2, "at": "2026-01-01T12:00:00Z"}]})

    item_id: ItemId
    kind: Literal["view", "add_to_cart", "purchase"] = Field(description=(
        "What the user did; purchase weighs most, then add_to_cart, then view."))
    # Lax: JSON has no datetime type, so the ISO 8601 string is parsed; a zone is required.
    at: AwareDatetime | None = Field(None, strict=False, description=(
        "When it happened, ISO 8601 with a time zone (default: now). At most five minutes ahead "
        "of the gateway's clock."))
    quantity: int = Field(1, ge=1, le=1_000_000)


def _one_or_many(value: Any) -> str:
    return "interactions" if isinstance(value, list) else "interaction"


# Tagged so that a validation error names one branch, as "interaction.kind" or
# "interactions.3.at", rather than listing what both branches of the union thought of it.
InteractionsRequest = Annotated[
    Annotated[InteractionIn, Tag("interaction")]
    | Annotated[list[InteractionIn], Field(min_length=1, max_length=MAX_INTERACTIONS), Tag("interactions")],
    Discriminator(_one_or_many),
]
"""The body of POST /v1/profiles/{user_id}/interactions: one interaction or a list of them."""


class InteractionsAccepted(BaseModel):
    """How many interactions were recorded (all of them, or none on an error)."""

    user_id: str
    recorded: int


class FreshnessView(BaseModel):
    """Commit → recommendation updated, over the changes the change flow in this process
    applied (p50/p99 estimated from the histogram's buckets)."""

    p50_ms: float | None
    p99_ms: float | None
    count: int


class HealthView(BaseModel):
    """The recommender's model and how fresh it is."""

    model_config = ConfigDict(json_schema_extra={"examples": [{
        "status": "ok", "items": 4070, "users": 4372, "last_update_at": "2026-01-01T12:00:00Z",
        "seconds_since_update": 0.4, "most_active_user": "17850",
        "commit_to_updated": {"p50_ms": 3.1, "p99_ms": 18.0, "count": 5120}}]})

    status: str = Field(description="ok")
    items: int | None = Field(None, description="Items known to the recommender")
    users: int | None = Field(None, description="Users with a profile")
    last_update_at: datetime | None = Field(None, description="When the model last changed")
    seconds_since_update: float | None = None
    most_active_user: str | None = Field(None, description=(
        "The user with the most interactions this process has seen lately (None when it has seen none)."))
    commit_to_updated: FreshnessView | None = Field(None, description=(
        "Freshness of the change flow running in this process (None when none runs here)."))
    details: dict[str, Any] = Field(default_factory=dict, description=(
        "Anything else the recommender reports about itself."))
