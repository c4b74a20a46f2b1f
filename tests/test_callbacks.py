"""Callbacks: signed deliveries that a receiver can verify, and refusal of non-public targets."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import orjson
import pytest
from aiohttp import web

from tidegate.callback_urls import SIGNATURE_HEADER, is_public_address, sign, verify
from tidegate.config import CallbackConfig
from tidegate.dispatch.callbacks import CallbackSender
from tidegate.errors import CallbackRefused

SECRET = b"whsec-test-0123456789"


def test_a_signature_verifies_and_a_tampered_body_or_old_timestamp_does_not() -> None:
    body = b'{"id":"j1","state":"succeeded"}'
    header = sign(SECRET, body, int(time.time()))
    assert verify(SECRET, body, header)
    assert not verify(SECRET, body + b" ", header)
    assert not verify(b"another secret", body, header)
    assert not verify(SECRET, body, sign(SECRET, body, int(time.time()) - 3600))
    assert not verify(SECRET, body, "garbage")


@pytest.mark.parametrize(
    ("address", "public"),
    [
        ("127.0.0.1", False), ("10.1.2.3", False), ("172.16.0.9", False), ("192.168.1.1", False),
        ("169.254.169.254", False), ("0.0.0.0", False), ("::1", False), ("fe80::1", False),
        ("fd00::1", False), ("::ffff:127.0.0.1", False), ("224.0.0.1", False),
        ("8.8.8.8", True), ("2606:4700:4700::1111", True),
    ],
)
def test_only_global_unicast_addresses_are_public(address: str, public: bool) -> None:
    assert is_public_address(address) is public


@pytest.mark.parametrize(
    "url",
    ["http://127.0.0.1:9/hook", "http://localhost/hook", "http://[::1]/hook", "http://10.0.0.8/x",
     "http://169.254.169.254/latest/meta-data", "ftp://example.com/x", "not a url"],
)
async def test_non_public_or_non_http_callback_urls_are_refused(url: str) -> None:
    async with CallbackSender(CallbackConfig(), SECRET) as sender:
        with pytest.raises(CallbackRefused):
            await sender.check_url(url)


@pytest.fixture
async def receiver() -> AsyncIterator[tuple[str, list[tuple[bytes, str]]]]:
    received: list[tuple[bytes, str]] = []
    attempts = {"n": 0}

    async def hook(request: web.Request) -> web.Response:
        attempts["n"] += 1
        if attempts["n"] == 1:  # the first delivery fails: the sender must retry
            return web.Response(status=503)
        received.append((await request.read(), request.headers[SIGNATURE_HEADER]))
        return web.Response(status=204)

    app = web.Application()
    app.router.add_post("/hook", hook)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}/hook", received
    finally:
        await runner.cleanup()


async def test_a_delivery_is_retried_and_its_signature_verifies(
    receiver: tuple[str, list[tuple[bytes, str]]],
) -> None:
    url, received = receiver
    config = CallbackConfig(allow_private=True, max_attempts=3)
    async with CallbackSender(config, SECRET) as sender:
        assert await sender.send(url, {"id": "j1", "state": "succeeded", "result": {"n": 1}})
    [(body, header)] = received
    assert verify(SECRET, body, header)
    assert orjson.loads(body)["id"] == "j1"


async def test_a_loopback_receiver_is_refused_at_connect_time_when_private_targets_are_off(
    receiver: tuple[str, list[tuple[bytes, str]]],
) -> None:
    url, received = receiver
    async with CallbackSender(CallbackConfig(max_attempts=2), SECRET) as sender:
        assert not await sender.send(url, {"id": "j1"})
    assert received == []


@pytest.mark.parametrize(
    "url", ["http://[::1", "http://a:99999/", "http://a..b/", f"http://{'x' * 300}.com/"]
)
async def test_malformed_callback_urls_are_refused_not_crashed_on(url: str) -> None:
    async with CallbackSender(CallbackConfig(), SECRET) as sender:
        with pytest.raises(CallbackRefused):
            await sender.check_url(url)
