"""Tenants and their API keys: who may call the gateway, at which priorities, how fast, with
which models and within which daily budget (`Tenant`), and what each of its keys may do inside
that (`KeyLimits`), kept in the queue's backend by a
`TenantStore` (`tenant_store_for(queue_url)`: the SQLite file or the Redis server).

An API key reads `tg_<key id>_<secret>`. Only a SHA-256 digest of the secret is stored: the
secret is 32 random bytes, so a fast hash is as strong as a slow one here, and checking a key
costs one hash and one constant-time comparison. The key id is public and names the key in
listings and revocation.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tidegate.coord._store import imported_when_named
from tidegate.coord.tenants.base import (
    DEFAULT_AUTH_CACHE_S,
    Caller,
    TenantStore,
    parse_api_key,
    tenant_store_for,
)
from tidegate.coord.tenants.models import ADMIN_TENANT, NO_KEY_LIMITS, ApiKeyInfo, KeyLimits, Tenant
from tidegate.coord.tenants.sqlite import SqliteTenantStore

if TYPE_CHECKING:
    from tidegate.coord.tenants.redis import RedisTenantStore

__all__ = [
    "ADMIN_TENANT",
    "DEFAULT_AUTH_CACHE_S",
    "NO_KEY_LIMITS",
    "ApiKeyInfo",
    "Caller",
    "KeyLimits",
    "RedisTenantStore",
    "SqliteTenantStore",
    "Tenant",
    "TenantStore",
    "parse_api_key",
    "tenant_store_for",
]

__getattr__ = imported_when_named(__name__, {"RedisTenantStore": "tidegate.coord.tenants.redis"})
