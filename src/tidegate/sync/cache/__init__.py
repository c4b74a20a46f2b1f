"""The versioned entity cache: `cache_for("memory://" | "redis://host:port/db")`.

Both backends implement `tidegate.sync.contracts.EntityCache` with the same semantics (see
`tidegate.sync.cache.base`); one contract suite runs against both.
"""

from __future__ import annotations

from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from tidegate._redis import is_redis_url
from tidegate._urls import redact_url
from tidegate.config import SyncConfig
from tidegate.errors import ConfigError
from tidegate.sync.cache.base import DEFAULT_TOMBSTONE_TTL_S, ZERO_VERSION, BaseEntityCache
from tidegate.sync.cache.memory import MemoryEntityCache

if TYPE_CHECKING:
    from tidegate.sync.contracts import EntityCache

__all__ = [
    "DEFAULT_TOMBSTONE_TTL_S",
    "ZERO_VERSION",
    "BaseEntityCache",
    "MemoryEntityCache",
    "cache_for",
    "open_cache",
]


def cache_for(
    url: str,
    *,
    prefix: str = "tidegate",
    tombstone_ttl_s: float | None = DEFAULT_TOMBSTONE_TTL_S,
    entry_ttl_s: float | None = None,
) -> BaseEntityCache:
    """The entity cache for `url`, not yet opened (use it with `async with`).

    - `memory://`: a cache of its own in this process (each call makes a separate one);
    - `redis://host:port/db` (also `rediss://`, `unix://`, or `redis+cluster://host:port` for a
      Redis Cluster): shared by every process using the same Redis and `prefix`; needs
      `pip install 'tidegate[redis]'`.

    `tombstone_ttl_s` is how long a delete is remembered, and so how late an older change may
    arrive without resurrecting the row (None: forever); `entry_ttl_s` expires live entries (None:
    never)."""
    scheme = urlsplit(url).scheme
    if scheme == "memory":
        return MemoryEntityCache(entry_ttl_s=entry_ttl_s, tombstone_ttl_s=tombstone_ttl_s)
    if is_redis_url(url):
        from tidegate.sync.cache.redis import RedisEntityCache

        return RedisEntityCache(url, prefix=prefix, entry_ttl_s=entry_ttl_s, tombstone_ttl_s=tombstone_ttl_s)
    raise ConfigError(
        f"unsupported entity cache URL {redact_url(url)!r}: use memory:// or redis://host:port/db"
    )


def open_cache(config: SyncConfig) -> BaseEntityCache:
    """The configured entity cache, not yet opened."""
    return cache_for(config.cache_url, prefix=config.prefix, tombstone_ttl_s=config.tombstone_ttl_s,
                     entry_ttl_s=config.entry_ttl_s)


if TYPE_CHECKING:

    def _implements_the_contract(cache: BaseEntityCache) -> EntityCache:
        # mypy proves here that every backend is an EntityCache.
        return cache
