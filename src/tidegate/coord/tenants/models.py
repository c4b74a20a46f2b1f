"""What a tenant is and how its keys are listed: the data the tenant store keeps."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal

from pydantic import BaseModel, ConfigDict, Field

from tidegate.jobs import Priority

__all__ = ["ADMIN_TENANT", "ApiKeyInfo", "Tenant"]

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


class ApiKeyInfo(BaseModel):
    """A key as listed: never its secret."""

    model_config = ConfigDict(frozen=True)

    key_id: str
    tenant: str
    created_at: datetime
    revoked_at: datetime | None = None
