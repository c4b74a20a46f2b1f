"""Tenants and keys as the admin API shows them."""

from __future__ import annotations

from tidegate.coord.tenants import ApiKeyInfo, Tenant
from tidegate.gateway.admin.schemas import KeyView, TenantView

__all__ = ["key_view", "tenant_view"]


def tenant_view(tenant: Tenant) -> TenantView:
    """A tenant with its priorities by name."""
    return TenantView(
        name=tenant.name,
        max_priority=tenant.max_priority.name.lower(),
        default_priority=tenant.default_priority.name.lower(),
        rpm=tenant.rpm,
        daily_budget_usd=tenant.daily_budget_usd,
        allowed_models=None if tenant.allowed_models is None else list(tenant.allowed_models),
        admin=tenant.admin,
    )



def key_view(info: ApiKeyInfo) -> KeyView:
    """A key's listing."""
    return KeyView(key_id=info.key_id, tenant=info.tenant, created_at=info.created_at,
                   revoked_at=info.revoked_at)
