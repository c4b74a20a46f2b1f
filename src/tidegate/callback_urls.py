"""What a result callback may target, and how it is signed: the rules the gateway checks at
intake and the workers apply when they send (tidegate.dispatch.callbacks).

Signature (the Stripe scheme): header `X-Tidegate-Signature: t=<unix seconds>,v1=<hex>` where
hex = HMAC-SHA256(secret, f"{t}.{body}"); the receiver recomputes it and rejects old timestamps,
so a captured callback cannot be replayed later. Targets that resolve to loopback, private,
link-local or otherwise non-public addresses are refused unless configured.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import ipaddress
import socket
import time
from urllib.parse import urlsplit

from tidegate.errors import CallbackRefused

__all__ = ["SIGNATURE_HEADER", "check_callback_url", "is_public_address", "sign", "verify"]

SIGNATURE_HEADER = "X-Tidegate-Signature"


def sign(secret: bytes, body: bytes, timestamp: int) -> str:
    """The signature header value for `body` sent at `timestamp`."""
    digest = hmac.new(secret, f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={timestamp},v1={digest}"


def verify(secret: bytes, body: bytes, header: str, *, tolerance_s: float = 300.0) -> bool:
    """True when `header` is a valid signature of `body` made within `tolerance_s` of now."""
    try:
        fields = dict(part.split("=", 1) for part in header.split(","))
        timestamp = int(fields["t"])
        expected = sign(secret, body, timestamp)
    except (KeyError, ValueError):
        return False
    fresh = abs(time.time() - timestamp) <= tolerance_s
    return fresh and hmac.compare_digest(expected, header)


def is_public_address(address: str) -> bool:
    """False for loopback, private, link-local, reserved, multicast and unspecified addresses."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_global and not ip.is_multicast


async def check_callback_url(url: str, *, allow_private: bool) -> None:
    """Refuse a callback URL that is not http(s) or (unless `allow_private`) resolves to a
    non-public address."""
    try:
        parts = urlsplit(url)
        host, port = parts.hostname, parts.port  # .port raises on a port out of range
    except ValueError as exc:
        raise CallbackRefused(f"callback_url is not a valid URL: {exc}") from None
    if parts.scheme not in ("http", "https") or not host:
        raise CallbackRefused(f"callback_url must be an http(s) URL, got {url!r}")
    if allow_private:
        return
    loop = asyncio.get_running_loop()
    try:
        infos = await loop.getaddrinfo(host, port or 443, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:
        raise CallbackRefused(f"callback host {host!r} does not resolve: {exc}") from exc
    for info in infos:
        address = str(info[4][0])
        if not is_public_address(address):
            raise CallbackRefused(f"callback host {host!r} resolves to the non-public address {address}")
