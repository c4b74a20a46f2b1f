"""Who is calling: API keys, the built-in local tenant of embedded mode, admin rights and the
per-tenant and per-key request rates.

A key may carry limits of its own inside its tenant's (`KeyLimits`): the caller's tenant is the
stored one narrowed by them (the less urgent highest priority, only the models both allow), an
expired key answers 401 `expired_api_key`, and a request that creates work is metered against the
key's rpm before the tenant's (so a key refused spends nothing of its tenant's rate).

Keys come as `Authorization: Bearer <key>` (OpenAI's SDKs) or `x-api-key: <key>` (Anthropic's),
on any route, and are checked by the TenantStore. Embedded mode:
while the gateway is bound to loopback, `allow_unauthenticated_local` is on and the store holds
no tenant and no key, every request is served as LOCAL_TENANT (max priority CRITICAL, no limits,
admin) whatever key it carries, so an SDK that insists on some api_key works out of the box. Once
any tenant or key exists, or on a non-loopback bind, a valid key is required.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated

from fastapi import Depends, Request

from tidegate.coord.tenants import ADMIN_TENANT, Caller, Tenant
from tidegate.gateway.core.errors import ApiError, retry_after_header
from tidegate.gateway.core.state import GatewayState
from tidegate.jobs import Priority

__all__ = [
    "LOCAL_TENANT",
    "AdminDep",
    "MeteredTenantDep",
    "StateDep",
    "TenantDep",
    "admin_tenant",
    "caller_key",
    "current_tenant",
    "gateway_state",
    "is_admin",
    "metered_tenant",
]

LOCAL_TENANT = Tenant(name="local", max_priority=Priority.CRITICAL, default_priority=Priority.NORMAL,
                      admin=True)


async def gateway_state(request: Request) -> GatewayState:
    """The GatewayState the app was built around. Async on purpose: FastAPI runs a plain `def`
    dependency on its thread pool, a thread hop on every request for a dictionary look-up."""
    state: GatewayState = request.app.state.gateway
    return state


StateDep = Annotated[GatewayState, Depends(gateway_state)]


def _api_key(request: Request) -> str | None:
    """The key the request carries: its Bearer token, else its x-api-key. A malformed
    Authorization header is refused even when an x-api-key comes with it."""
    header = request.headers.get("authorization")
    if header is None:
        key = request.headers.get("x-api-key", "").strip()
        return key or None
    scheme, _, token = header.strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise ApiError(401, "malformed Authorization header: use 'Authorization: Bearer <api key>'",
                       code="invalid_api_key")
    return token.strip()


async def current_tenant(request: Request, state: StateDep) -> Tenant:
    """The caller's tenant: from its API key, or LOCAL_TENANT in embedded mode (see the module
    docstring). 401 without a valid key otherwise."""
    if await state.serves_without_keys():
        return LOCAL_TENANT
    token = _api_key(request)
    if token is None:
        raise ApiError(401, "an API key is required: send 'Authorization: Bearer <api key>' or "
                       "'x-api-key: <api key>'", code="missing_api_key")
    caller = await state.tenants.authenticate_key(token)
    if caller is None:
        raise ApiError(401, "invalid API key", code="invalid_api_key")
    if caller.limits.expired(datetime.now(UTC)):
        raise ApiError(401, f"API key {caller.key_id} expired at {caller.limits.expires_at}",
                       code="expired_api_key")
    request.state.tidegate_caller = caller
    return caller.limits.narrow(caller.tenant)


def caller_key(request: Request) -> Caller | None:
    """The key the request was authenticated with (by `current_tenant`), with its limits; None
    for the local tenant of embedded mode."""
    caller: Caller | None = getattr(request.state, "tidegate_caller", None)
    return caller


TenantDep = Annotated[Tenant, Depends(current_tenant)]


def is_admin(tenant: Tenant) -> bool:
    """Whether the tenant may call the admin API."""
    return tenant.admin or tenant.name == ADMIN_TENANT


async def admin_tenant(tenant: TenantDep) -> Tenant:
    """The caller's tenant if it is an admin; 403 otherwise."""
    if not is_admin(tenant):
        raise ApiError(403, f"tenant {tenant.name!r} may not use the admin API", code="admin_only")
    return tenant


AdminDep = Annotated[Tenant, Depends(admin_tenant)]


async def metered_tenant(request: Request, tenant: TenantDep, state: StateDep) -> Tenant:
    """The caller's tenant, counted against its key's and then its own requests-per-minute limit
    (429 with Retry-After when over). Only requests that create work are metered: polling is
    free."""
    caller = caller_key(request)
    if caller is not None and caller.limits.rpm is not None:
        await _meter(state, f"key:{caller.key_id}", caller.limits.rpm, f"API key {caller.key_id}")
    if tenant.rpm is not None:
        await _meter(state, f"tenant:{tenant.name}", tenant.rpm, f"tenant {tenant.name!r}")
    return tenant


async def _meter(state: GatewayState, bucket: str, rpm: int, who: str) -> None:
    wait_s = await state.limiter.acquire(bucket, tokens=0, rpm=rpm, tpm=None)
    if wait_s > 0:
        raise ApiError(429, f"{who} is over its limit of {rpm} requests per minute; retry in {wait_s:.1f}s",
                       code="rate_limit_exceeded", headers=retry_after_header(wait_s))


MeteredTenantDep = Annotated[Tenant, Depends(metered_tenant)]
