"""What a tenant is and how its keys are listed: the data the tenant store keeps."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from decimal import Decimal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field

from tidegate.jobs import Priority

__all__ = ["ADMIN_TENANT", "NO_KEY_LIMITS", "ApiKeyInfo", "KeyLimits", "Tenant"]

ADMIN_TENANT = "admin"


class Tenant(BaseModel):
    """What a tenant may do. `max_priority` is the most urgent level it may ask for: a tenant
    with HIGH may use HIGH..BULK, and a request for CRITICAL is refused (403), not downgraded."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$")
    max_priority: Priority = Priority.HIGH
    default_priority: Priority = Priority.NORMAL
    rpm: int | None = Field(None, gt=0)  # requests per minute over all its keys; None = no limit
    daily_budget_usd: Decimal | None = Field(None, ge=0)
    allowed_models: tuple[str, ...] | None = None  # None = every configured model
    admin: bool = False  # may call the admin API

    def may_use(self, priority: Priority) -> bool:
        """Whether this tenant may ask for `priority`."""
        return priority >= self.max_priority


class KeyLimits(BaseModel):
    """What one API key may do inside its tenant's limits: each is checked beside the tenant's
    own, so the stricter wins. None leaves it to the tenant."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    rpm: int | None = Field(None, gt=0)  # requests per minute of this key, metered as the tenant's
    allowed_models: tuple[str, ...] | None = None  # within the tenant's; None = the tenant's
    max_priority: Priority | None = None  # the most urgent level; the less urgent of the two wins
    expires_at: AwareDatetime | None = None  # the key answers 401 `expired_api_key` from then on

    def narrow(self, tenant: Tenant) -> Tenant:
        """`tenant` as a caller with this key may act: the less urgent highest priority (the
        default lowered to it), only the models both allow."""
        changes: dict[str, object] = {}
        if self.max_priority is not None and self.max_priority > tenant.max_priority:
            changes["max_priority"] = self.max_priority
            changes["default_priority"] = max(tenant.default_priority, self.max_priority)
        if self.allowed_models is not None:
            changes["allowed_models"] = (self.allowed_models if tenant.allowed_models is None else
                                         tuple(m for m in self.allowed_models if m in tenant.allowed_models))
        return tenant.model_copy(update=changes) if changes else tenant

    def changed(self, changes: Mapping[str, object]) -> KeyLimits:
        """These limits with the fields `changes` names set (None: back to the tenant's), checked
        as new limits are."""
        return KeyLimits.model_validate({**self.model_dump(), **changes})

    def expired(self, now: datetime) -> bool:
        """Whether the key has expired at `now`."""
        return self.expires_at is not None and now >= self.expires_at


NO_KEY_LIMITS = KeyLimits()


class ApiKeyInfo(BaseModel):
    """A key as listed: never its secret."""

    model_config = ConfigDict(frozen=True)

    key_id: str
    tenant: str
    created_at: datetime
    revoked_at: datetime | None = None
    limits: KeyLimits = NO_KEY_LIMITS
