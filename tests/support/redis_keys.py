"""Removing what a test wrote to the session's redis-server, by key prefix."""

from __future__ import annotations


async def delete_prefixed(url: str, prefix: str, *also: str) -> None:
    """Delete every key hash-tagged `{prefix:…` (and the keys in `also`)."""
    import redis.asyncio as aioredis

    client = aioredis.Redis.from_url(url)
    try:
        keys = [key async for key in client.scan_iter(match=f"{{{prefix}:*")]
        keys.extend(also)
        if keys:
            await client.delete(*keys)
    finally:
        await client.aclose()
