"""Tenants and their API keys: who may call the gateway, at which priorities, how fast, with
which models and within which daily budget.

An API key reads `tg_<key id>_<secret>`. Only a SHA-256 digest of the secret is stored: the
secret is 32 random bytes, so a fast hash is as strong as a slow one here, and checking a key
costs one hash and one constant-time comparison. The key id is public and names the key in
listings and revocation.
"""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from typing import Protocol, Self

from pydantic import BaseModel, ConfigDict, Field

from tidegate.jobs import Priority

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


class TenantStore(Protocol):
    """Tenants and hashed keys, kept in the queue's backend so every gateway replica shares them."""

    async def put_tenant(self, tenant: Tenant) -> None:
        """Create or replace a tenant."""
        ...

    async def get_tenant(self, name: str) -> Tenant | None:
        """The tenant, or None."""
        ...

    async def list_tenants(self) -> list[Tenant]:
        """Every tenant, by name."""
        ...

    async def create_key(self, tenant: str) -> tuple[ApiKeyInfo, str]:
        """A new key for an existing tenant: its listing and the full key, shown only now.
        Raises TenantNotFound for an unknown tenant."""
        ...

    async def authenticate(self, api_key: str) -> Tenant | None:
        """The tenant of a valid, unrevoked key; None for anything else (never says why).
        An implementation may remember a valid key briefly (tenant_store: `auth_cache_s`, 1 s by
        default): a revocation or tenant change made through another store object then takes
        effect on this one within that time."""
        ...

    async def revoke_key(self, key_id: str) -> bool:
        """Revoke a key; False when there is no such unrevoked key."""
        ...

    async def list_keys(self, tenant: str | None = None) -> list[ApiKeyInfo]:
        """Keys (all, or one tenant's), newest first."""
        ...

    async def close(self) -> None:
        """Release connections."""
        ...

    async def __aenter__(self) -> Self: ...

    async def __aexit__(self, *exc_info: object) -> None: ...
