"""Tenants and keys as the admin API shows them."""

from __future__ import annotations

from tidegate.coord.tenants import ApiKeyInfo, KeyLimits, Tenant
from tidegate.gateway.admin.schemas import KeyLimitsBody, KeyLimitsView, KeyView, TenantView
from tidegate.jobs import Priority

__all__ = ["changed_limits", "key_view", "tenant_view"]


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
    limits = info.limits
    return KeyView(key_id=info.key_id, tenant=info.tenant, created_at=info.created_at,
                   revoked_at=info.revoked_at, limits=KeyLimitsView(
                       rpm=limits.rpm,
                       allowed_models=None if limits.allowed_models is None else list(limits.allowed_models),
                       max_priority=None if limits.max_priority is None else limits.max_priority.name.lower(),
                       expires_at=limits.expires_at))


def changed_limits(limits: KeyLimits, body: KeyLimitsBody) -> KeyLimits:
    """`limits` with the fields `body` gives (a null one back to the tenant's)."""
    changes: dict[str, object] = {}
    for field in body.model_fields_set:
        value = getattr(body, field)
        if value is not None and field == "max_priority":
            value = Priority.parse(value)
        elif value is not None and field == "allowed_models":
            value = tuple(value)
        changes[field] = value
    return limits.changed(changes)
