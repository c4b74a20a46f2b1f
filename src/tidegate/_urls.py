"""URLs in messages and logs: a password never printed."""

from __future__ import annotations

from urllib.parse import urlsplit

__all__ = ["redact_url", "without_query"]


def redact_url(url: str) -> str:
    """The URL with any password replaced by ***, for messages and logs."""
    parts = urlsplit(url)
    if parts.password:
        netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
        return parts._replace(netloc=netloc).geturl()
    return url


def without_query(url: str) -> str:
    """The URL without `?options` (a queue's or bus's settings, not the connection's), otherwise
    as written: a rebuilt URL would lose the `//` of `unix:///path`, which redis-py refuses."""
    return url.partition("?")[0]
