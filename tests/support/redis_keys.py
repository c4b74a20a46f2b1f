"""Removing what a test wrote to the session's redis-server.

The server lives for the whole session; dropping each test's keys keeps its memory flat. Every
test names its keys with a random queue name or prefix, so a pattern that contains it cannot
touch another test's keys."""

from __future__ import annotations


async def delete_keys(url: str, match: str, *also: str) -> None:
    """Delete every key that matches the glob `match` (`*t1a2b*`, `{prefix:*`), and the keys in
    `also`."""
    import redis.asyncio as aioredis

    client = aioredis.Redis.from_url(url)
    try:
        keys: list[bytes | str] = [key async for key in client.scan_iter(match=match, count=1_000)]
        keys.extend(also)
        if keys:
            await client.unlink(*keys)
    finally:
        await client.aclose()
