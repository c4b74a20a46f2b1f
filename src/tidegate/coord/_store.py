"""What every coordination family shares: which backend a queue URL means, the queue's name and
file in it, and the lifecycle of a coordination object, which opens on first use."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any, Literal
from urllib.parse import parse_qsl, urlsplit

from tidegate._lifecycle import Lifecycle
from tidegate._redis import is_redis_url
from tidegate._sqlite import sqlite_path
from tidegate._urls import redact_url
from tidegate.errors import ConfigError

Backend = Literal["redis", "sqlite"]


def backend_of(queue_url: str) -> Backend:
    """The store a queue URL implies: the same Redis, or the same SQLite file."""
    if is_redis_url(queue_url):
        return "redis"
    if urlsplit(queue_url).scheme == "sqlite":
        return "sqlite"
    raise ConfigError(
        f"unsupported queue URL {redact_url(queue_url)!r}: use sqlite:///path/to/file.db, "
        "redis://host:port/db or redis+cluster://host:port"
    )


def queue_name_of(queue_url: str) -> str:
    """The queue's `?name=`, "default" without one: coordination state is kept under it, so
    queues sharing a server never share their tenants, limits or spend."""
    return dict(parse_qsl(urlsplit(queue_url).query)).get("name", "default")


def sqlite_path_of(queue_url: str) -> str:
    """The file of a `sqlite:///…` queue URL."""
    return sqlite_path(queue_url)


def imported_when_named(package: str, backends: Mapping[str, str]) -> Callable[[str], Any]:
    """A module `__getattr__` for a family's package that imports a backend (class name →
    module) only when its class is first named, so a SQLite install needs no redis-py."""

    def attribute(name: str) -> Any:
        if name in backends:
            return getattr(importlib.import_module(backends[name]), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return attribute


class OpensOnFirstUse(Lifecycle):
    """The one lifecycle (`tidegate._lifecycle`), opened by the first call that needs it: a
    coordination object is built where it is configured and handed to the gateway, the workers
    and the CLI, which use it without opening it first. Once closed it refuses use (and
    `async with`) with `unavailable_error`; make a new one.

    `_open` must not suspend (backends only build clients that connect on first use), so that
    concurrent first calls cannot open one object twice."""

    async def _ready(self) -> None:
        """Open now if not yet open; raise `unavailable_error` once closed."""
        if not self.is_open:
            await self.open()
