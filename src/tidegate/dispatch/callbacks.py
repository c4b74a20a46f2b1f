"""Result callbacks: a signed POST of a finished job to its `callback_url`.

Signature (the Stripe scheme): header `X-Tidegate-Signature: t=<unix seconds>,v1=<hex>` where
hex = HMAC-SHA256(secret, f"{t}.{body}"); the receiver recomputes it and rejects old timestamps,
so a captured callback cannot be replayed later. Targets that resolve to loopback, private,
link-local or otherwise non-public addresses are refused unless configured, and the check runs
again when connecting, so a DNS answer that changes in between (rebinding) is refused too.
"""

from __future__ import annotations

import asyncio
import logging
import random
import socket
import time
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import orjson
from aiohttp.abc import AbstractResolver, ResolveResult

from tidegate.callback_urls import SIGNATURE_HEADER, check_callback_url, is_public_address, sign
from tidegate.config import CallbackConfig
from tidegate.errors import CallbackRefused

log = logging.getLogger("tidegate.callbacks")

class _PublicOnlyResolver(AbstractResolver):
    """Resolves like the default resolver, then refuses any non-public answer."""

    def __init__(self) -> None:
        self._inner = aiohttp.ThreadedResolver()

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        answers = await self._inner.resolve(host, port, family)
        for answer in answers:
            if not is_public_address(answer["host"]):
                raise CallbackRefused(
                    f"callback host {host!r} resolves to the non-public address {answer['host']}"
                )
        return answers

    async def close(self) -> None:
        await self._inner.close()


class CallbackSender:
    """Delivers signed callbacks with retries; an async context manager owning one HTTP session."""

    def __init__(self, config: CallbackConfig, secret: bytes) -> None:
        self.config = config
        self._secret = secret
        self._session: aiohttp.ClientSession | None = None
        self._tasks: set[asyncio.Task[bool]] = set()

    async def __aenter__(self) -> CallbackSender:
        resolver = None if self.config.allow_private else _PublicOnlyResolver()
        connector = aiohttp.TCPConnector(resolver=resolver, limit=64)
        self._session = aiohttp.ClientSession(
            connector=connector, timeout=aiohttp.ClientTimeout(total=self.config.timeout_s)
        )
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=self.config.timeout_s)
        for task in self._tasks:
            task.cancel()
        if self._session is not None:
            await self._session.close()

    async def check_url(self, url: str) -> None:
        """Refuse a callback URL that is not http(s) or resolves to a non-public address."""
        await check_callback_url(url, allow_private=self.config.allow_private)

    def send_later(self, url: str, document: dict[str, Any]) -> None:
        """Deliver in the background (with retries) without holding the caller."""
        task = asyncio.create_task(self.send(url, document))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def send(self, url: str, document: dict[str, Any]) -> bool:
        """POST `document` signed; retry with backoff and full jitter. True when delivered."""
        assert self._session is not None, "use CallbackSender as an async context manager"
        try:
            # aiohttp skips the resolver for IP literals, so those are checked here; host names
            # are checked again by the resolver when connecting.
            await self.check_url(url)
        except CallbackRefused as exc:
            log.warning("callback refused: %s", exc)
            return False
        body = orjson.dumps(document)
        reason = "not attempted"
        for attempt in range(1, self.config.max_attempts + 1):
            headers = {
                "Content-Type": "application/json",
                SIGNATURE_HEADER: sign(self._secret, body, int(time.time())),
            }
            try:
                async with self._session.post(url, data=body, headers=headers) as response:
                    if response.status < 300:
                        return True
                    reason = f"HTTP {response.status}"
                    if 400 <= response.status < 500 and response.status not in (408, 409, 429):
                        log.warning("callback to %s refused with %s; not retrying", _origin(url), reason)
                        return False
            except CallbackRefused as exc:
                log.warning("callback refused: %s", exc)
                return False
            except (aiohttp.ClientError, TimeoutError) as exc:
                reason = type(exc).__name__
            if attempt < self.config.max_attempts:
                await asyncio.sleep(random.uniform(0, min(30.0, 0.5 * 2 ** attempt)))
        log.warning(
            "callback to %s failed after %d attempts (%s)", _origin(url), self.config.max_attempts, reason
        )
        return False


def _origin(url: str) -> str:
    # Query strings may carry tokens: log only scheme, host and path.
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.hostname}{parts.path}"
