"""Plumbing shared by the rate limiters and budget ledgers: which backend a queue URL means, a
Redis client with its Lua scripts (lua/*.lua next to this module) and driver errors translated
into DispatchUnavailable at the boundary.

A lost connection (a Redis restart) heals by itself: the pool replaces a connection the server
closed before lending it, and redis-py loads a script again when the restarted server answers
NOSCRIPT. A call that may be sent twice (`retry=True`: reads, admissions, pauses, settles) is
retried with backoff on a lost or refused connection for up to `tidegate._redis.RETRY_WITHIN_S`
before DispatchUnavailable; one that must not (a reservation) surfaces at once."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from functools import cache
from importlib import resources
from typing import Any, Literal
from urllib.parse import urlsplit

from tidegate._redis import (
    RETRY_WITHIN_S,
    Outage,
    call_with_reconnect,
    connection_options,
)
from tidegate._urls import redact_url
from tidegate.errors import ConfigError, DispatchClosed, DispatchUnavailable, MissingDependency

Backend = Literal["redis", "sqlite"]
REDIS_SCHEMES = ("redis", "rediss", "unix")
MAX_CONNECTIONS = 32  # a worker's limiter or ledger calls are short; more would only queue in Redis
POOL_TIMEOUT_S = 30.0


def backend_of(queue_url: str) -> Backend:
    """The store a queue URL implies: the same Redis, or the same SQLite file."""
    scheme = urlsplit(queue_url).scheme
    if scheme in REDIS_SCHEMES:
        return "redis"
    if scheme == "sqlite":
        return "sqlite"
    raise ConfigError(
        f"unsupported queue URL {redact_url(queue_url)!r}: use sqlite:///path/to/file.db or redis://host:port/db"
    )


def without_query(url: str) -> str:
    """The URL without `?options`: those are the queue's settings, not the connection's."""
    return urlsplit(url)._replace(query="").geturl()


@cache
def script_source(name: str) -> str:
    """The text of lua/<name>.lua."""
    return (resources.files("tidegate.dispatch") / "lua" / f"{name}.lua").read_text()


class RedisStore:
    """One Redis client and the scripts registered on it. Connects lazily on first use, so it can
    be built outside the event loop; after `close()` every call raises DispatchClosed."""

    def __init__(self, url: str, scripts: Iterable[str], *, what: str) -> None:
        try:
            import redis.asyncio as aioredis
            from redis.exceptions import RedisError
        except ImportError as exc:  # pragma: no cover - exercised only without the extra
            raise MissingDependency(
                f"the Redis {what} needs redis-py: pip install 'tidegate[redis]'"
            ) from exc
        self.url = url
        self._what = what
        self._errors: type[Exception] = RedisError
        pool = aioredis.BlockingConnectionPool.from_url(
            url, max_connections=MAX_CONNECTIONS, timeout=POOL_TIMEOUT_S, **connection_options()
        )
        # from_pool hands the pool to the client, so aclose() also closes its connections.
        self._redis: Any = aioredis.Redis.from_pool(pool)
        self._scripts = {name: self._redis.register_script(script_source(name)) for name in scripts}
        self._outage = Outage(what.replace(" ", "_"), url)
        self._closed = False

    def check_open(self) -> None:
        """Raise DispatchClosed once closed."""
        if self._closed:
            raise DispatchClosed(f"this {self._what} was closed; create a new one")

    async def script(self, name: str, keys: list[str], args: list[Any], *, retry: bool = False) -> Any:
        """Run one registered script (EVALSHA, loading it on NOSCRIPT); `retry` when running it
        twice is harmless."""
        return await self._run(lambda: self._scripts[name](keys=keys, args=args),
                               f"{self._what} script {name}", retry)

    async def command(self, *args: Any, retry: bool = False) -> Any:
        """Run one plain Redis command; `retry` when sending it twice is harmless."""
        return await self._run(lambda: self._redis.execute_command(*args), self._what, retry)

    async def _run(self, call: Callable[[], Awaitable[Any]], doing: str, retry: bool) -> Any:
        self.check_open()
        try:
            return await call_with_reconnect(call, self._outage, within_s=RETRY_WITHIN_S if retry else 0.0)
        except self._errors as exc:
            raise DispatchUnavailable(f"{doing} on {redact_url(self.url)}: {exc}") from exc

    async def close(self) -> None:
        """Release the connections. Idempotent."""
        if not self._closed:
            self._closed = True
            await self._redis.aclose()
