"""Opening a Redis client with Lua scripts registered on it, as the entity cache and the
recommendation store do: a bounded blocking pool, one PING to fail early, and a driver error on
connect translated into the caller's own error with the URL's credentials left out."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from tidegate.errors import TidegateError
from tidegate.queue.base import redact_url

__all__ = ["open_scripted_client"]


async def open_scripted_client(
    url: str,
    scripts: Iterable[tuple[str, str]],
    *,
    max_connections: int,
    unavailable: type[TidegateError],
    what: str,
) -> tuple[Any, dict[str, Any]]:
    """A connected client and its registered scripts (name → script) for `scripts`, pairs of
    (name, Lua source). Raises `unavailable` naming `what` when the server cannot be reached."""
    import redis.asyncio as aioredis
    from redis.exceptions import RedisError

    pool = aioredis.BlockingConnectionPool.from_url(
        url, max_connections=max_connections, timeout=30, socket_connect_timeout=10
    )
    # from_pool hands the pool to the client, so aclose() also closes its connections.
    client = aioredis.Redis.from_pool(pool)
    registered = {name: client.register_script(source) for name, source in scripts}
    try:
        await client.ping()
    except (RedisError, OSError) as exc:
        await client.aclose()
        raise unavailable(f"cannot reach {what} at {redact_url(url)}: {exc}") from exc
    return client, registered
