"""Removing what a test wrote to the session's redis-server.

The server lives for the whole session; dropping each test's keys keeps its memory flat. Every
test names its keys with a random queue name or prefix, so a pattern that contains it cannot
touch another test's keys."""

from __future__ import annotations

import asyncio


def delete_keys_now(url: str, match: str, *also: str) -> None:
    """Delete every key that matches the glob `match` (`*t1a2b*`, `{prefix:*`), and the keys in
    `also` (for synchronous fixtures)."""
    import redis

    with redis.Redis.from_url(url) as client:
        keys: list[bytes | str] = list(client.scan_iter(match=match, count=1_000))
        keys.extend(also)
        if keys:
            client.unlink(*keys)


async def delete_keys(url: str, match: str, *also: str) -> None:
    """`delete_keys_now` without blocking the event loop."""
    await asyncio.to_thread(delete_keys_now, url, match, *also)
