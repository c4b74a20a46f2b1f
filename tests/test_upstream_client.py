"""The upstream client against the simulated provider over loopback: answers, streams, usage,
rate-limit headers, and every kind of failure classified the way the dispatcher relies on."""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import pytest

from tidegate.config import ProviderConfig
from tidegate.errors import ClientClosed, ConfigError, UpstreamError
from tidegate.providers import (
    RateLimitInfo,
    UpstreamClient,
    parse_duration_s,
    parse_retry_after,
)
from tidegate.simulator import InjectedFault, Simulator, SimulatorSettings

CHAT_MODEL = "gpt-4.1"
EMBEDDING_MODEL = "text-embedding-3-small"
KEY_ENV = "TIDEGATE_TEST_UPSTREAM_KEY"
SECRET_KEY = "sk-tidegate-test-DO-NOT-LEAK-9f3c1a"


def _chat(content: str = "Say something short.", **extra: Any) -> dict[str, Any]:
    return {"model": CHAT_MODEL, "messages": [{"role": "user", "content": content}], **extra}


def _provider(base_url: str, *, timeout_s: float = 5.0, api_key_env: str | None = None) -> ProviderConfig:
    return ProviderConfig(name="sim", base_url=base_url, timeout_s=timeout_s, api_key_env=api_key_env)


@pytest.fixture
def simulator() -> Simulator:
    """A seeded simulator; tests reconfigure it (or inject faults) for what they check."""
    return Simulator(SimulatorSettings(seed=11, hang_s=5.0))


@pytest.fixture
async def base_url(simulator: Simulator) -> AsyncIterator[str]:
    async with simulator.running() as url:
        yield url


@pytest.fixture
async def client(base_url: str) -> AsyncIterator[UpstreamClient]:
    async with UpstreamClient(_provider(base_url)) as upstream:
        yield upstream


async def _failure(client: UpstreamClient, body: dict[str, Any] | None = None) -> UpstreamError:
    with pytest.raises(UpstreamError) as caught:
        await client.chat(body or _chat())
    return caught.value


# ---------------------------------------------------------------------------- answers


async def test_chat_returns_the_body_usage_and_latency(client: UpstreamClient) -> None:
    response = await client.chat(_chat(max_tokens=7))

    assert response.status == 200
    assert response.body["object"] == "chat.completion"
    assert response.body["choices"][0]["message"]["role"] == "assistant"
    assert response.usage.output_tokens <= 7
    assert response.usage.input_tokens > 0
    assert response.usage.total_tokens == response.usage.input_tokens + response.usage.output_tokens
    assert response.latency_ms > 0
    assert response.headers["CONTENT-TYPE"].startswith("application/json")  # case-insensitive


async def test_embeddings_return_one_vector_per_input_and_usage(client: UpstreamClient) -> None:
    response = await client.embeddings({"model": EMBEDDING_MODEL, "input": ["red shoes", "blue hat"]})

    vectors = [item["embedding"] for item in response.body["data"]]
    assert [len(v) for v in vectors] == [256, 256]
    assert response.usage.input_tokens == response.usage.total_tokens > 0
    assert response.usage.output_tokens == 0


async def test_a_stream_arrives_chunk_by_chunk_with_a_summary_at_the_end(
    simulator: Simulator, client: UpstreamClient
) -> None:
    # Given a model that takes 40 ms per token and answers exactly 8 tokens
    simulator.configure({"models": {CHAT_MODEL: {"inter_token_ms": 40, "completion_tokens": 500}}})
    arrivals: list[float] = []
    texts: list[str] = []

    # When the stream is read
    async with client.chat_stream(_chat(max_tokens=8)) as stream:
        assert stream.summary is None
        async for chunk in stream:
            if chunk.text:
                arrivals.append(time.perf_counter())
                texts.append(chunk.text)

    # Then the first token was in hand long before the last was even generated (7 x 40 ms later)
    assert len(arrivals) == 8
    assert arrivals[-1] - arrivals[0] > 0.15
    summary = stream.summary
    assert summary is not None
    assert summary.usage.output_tokens == 8
    assert summary.usage.total_tokens == summary.usage.input_tokens + 8
    assert summary.text == "".join(texts) and len(summary.text.split()) == 8
    assert summary.finish_reason == "length"
    assert summary.ttft_ms is not None and summary.ttft_ms < summary.latency_ms
    assert summary.chunks >= 10  # role, 8 tokens, finish, usage


async def test_a_stream_can_be_read_without_a_with_block(client: UpstreamClient) -> None:
    stream = client.chat_stream(_chat(max_tokens=3))
    chunks = [chunk async for chunk in stream]

    assert chunks[-1].data["usage"]["completion_tokens"] == 3  # the include_usage chunk
    assert stream.summary is not None and stream.summary.usage.output_tokens == 3


async def test_leaving_a_stream_early_releases_it_quietly(
    simulator: Simulator, client: UpstreamClient, caplog: pytest.LogCaptureFixture
) -> None:
    simulator.configure({"models": {CHAT_MODEL: {"inter_token_ms": 20, "completion_tokens": 500}}})
    caplog.set_level(logging.DEBUG)

    async with client.chat_stream(_chat(max_tokens=10)) as stream:
        async for chunk in stream:
            if chunk.text:
                break
    # A window for the simulator to notice the client has gone: what is asserted is that nothing
    # is logged above INFO meanwhile, and an absence has no event to wait for.
    await asyncio.sleep(0.05)

    assert stream.summary is None  # [DONE] was never read
    assert (await client.chat(_chat())).status == 200
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


async def test_chat_ignores_a_stream_flag_left_in_the_body(client: UpstreamClient) -> None:
    response = await client.chat(_chat(stream=True, stream_options={"include_usage": True}))

    assert response.body["object"] == "chat.completion"


# ---------------------------------------------------------------------------- rate limits


async def test_rate_limit_headers_are_parsed_on_success(simulator: Simulator, client: UpstreamClient) -> None:
    simulator.configure({"window_s": 30, "models": {CHAT_MODEL: {"rpm": 10, "tpm": 10_000}}})

    response = await client.chat(_chat())

    info = response.rate_limit
    assert (info.limit_requests, info.remaining_requests) == (10, 9)
    assert info.limit_tokens == 10_000
    assert info.remaining_tokens == 10_000 - response.usage.total_tokens
    assert info.reset_requests_s is not None and 29 < info.reset_requests_s <= 30


async def test_429_with_retry_after_seconds(simulator: Simulator, client: UpstreamClient) -> None:
    simulator.configure({"window_s": 1, "models": {CHAT_MODEL: {"rpm": 1}}})
    await client.chat(_chat())

    error = await _failure(client)

    assert (error.kind, error.status, error.retryable) == ("rate_limited", 429, True)
    assert error.retry_after_s == 1.0  # whole seconds, rounded up from what is left of the window
    assert error.rate_limit is not None and error.rate_limit.remaining_requests == 0
    assert "Rate limit reached" in str(error)


async def test_429_with_retry_after_as_an_http_date(simulator: Simulator, client: UpstreamClient) -> None:
    simulator.configure({"window_s": 3, "retry_after_format": "http-date",
                         "models": {CHAT_MODEL: {"rpm": 1}}})
    await client.chat(_chat())

    error = await _failure(client)

    assert error.kind == "rate_limited"
    assert error.retry_after_s is not None and 0 < error.retry_after_s <= 4.0


async def test_429_without_retry_after_waits_for_the_rate_limit_reset(
    simulator: Simulator, client: UpstreamClient
) -> None:
    simulator.configure({"window_s": 20, "models": {CHAT_MODEL: {"rpm": 100}}})
    simulator.inject(CHAT_MODEL, InjectedFault("status", status=429, message="slow down"))

    error = await _failure(client)

    assert error.kind == "rate_limited" and error.retryable
    assert error.rate_limit is not None and error.rate_limit.reset_requests_s is not None
    assert error.retry_after_s == error.rate_limit.reset_requests_s


async def test_a_stream_refused_with_429_fails_before_the_first_chunk(
    simulator: Simulator, client: UpstreamClient
) -> None:
    simulator.configure({"window_s": 5, "models": {CHAT_MODEL: {"rpm": 1}}})
    await client.chat(_chat())

    stream = client.chat_stream(_chat())
    with pytest.raises(UpstreamError) as caught:
        async for _ in stream:
            pytest.fail("no chunk expected")
    with pytest.raises(ClientClosed):  # a failed stream is not sent again
        await anext(stream)

    assert caught.value.kind == "rate_limited"
    assert caught.value.retry_after_s is not None


# ---------------------------------------------------------------------------- failures


@pytest.mark.parametrize(
    ("fault", "kind", "status"),
    [
        (InjectedFault("error"), "server", 500),
        (InjectedFault("unavailable"), "server", 503),
        (InjectedFault("status", status=408), "server", 408),
        (InjectedFault("status", status=409), "server", 409),
        (InjectedFault("status", status=502), "server", 502),
        (InjectedFault("timeout"), "timeout", None),
        (InjectedFault("reset"), "connection", None),
        (InjectedFault("malformed"), "malformed", 200),
    ],
    ids=lambda value: value.fault if isinstance(value, InjectedFault) else None,
)
async def test_each_fault_is_classified_as_retryable(
    simulator: Simulator, base_url: str, fault: InjectedFault, kind: str, status: int | None
) -> None:
    simulator.inject(CHAT_MODEL, fault)

    async with UpstreamClient(_provider(base_url, timeout_s=0.3)) as client:
        error = await _failure(client)
        # The client stays usable after any failure: the pool replaces what broke.
        assert (await client.chat(_chat())).status == 200

    assert (error.kind, error.status, error.retryable) == (kind, status, True)


@pytest.mark.parametrize("fault", ["reset", "malformed"])
async def test_a_stream_cut_half_way_fails_after_its_first_chunks(
    simulator: Simulator, client: UpstreamClient, fault: str
) -> None:
    simulator.inject(CHAT_MODEL, InjectedFault(fault))  # type: ignore[arg-type]
    received = 0

    with pytest.raises(UpstreamError) as caught:
        async for chunk in client.chat_stream(_chat(max_tokens=20)):
            received += bool(chunk.text)

    assert received > 0
    assert caught.value.retryable
    assert caught.value.kind == ("connection" if fault == "reset" else "malformed")


async def test_a_refused_connection_is_a_retryable_connection_error() -> None:
    with socket.socket() as sock:  # a port that nothing listens on once this socket is closed
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]

    async with UpstreamClient(_provider(f"http://127.0.0.1:{port}/v1")) as client:
        error = await _failure(client)

    assert (error.kind, error.status, error.retryable) == ("connection", None, True)


@pytest.mark.parametrize(
    ("case", "status", "provider_says"),
    [
        ("bad request", 400, "Missing required parameter: 'messages'"),
        ("unknown model", 404, "The model `no-such-model` does not exist"),
        ("unprocessable", 422, "input is not processable by this model"),
        ("forbidden", 403, "this project may not use that model"),
    ],
)
async def test_client_errors_are_not_retryable_and_carry_the_providers_message(
    simulator: Simulator, client: UpstreamClient, case: str, status: int, provider_says: str
) -> None:
    body = _chat()
    if case == "bad request":
        del body["messages"]
    elif case == "unknown model":
        body["model"] = "no-such-model"
    else:
        simulator.inject(CHAT_MODEL, InjectedFault("status", status=status, message=provider_says))

    error = await _failure(client, body)

    assert (error.kind, error.status, error.retryable) == ("client", status, False)
    assert provider_says in str(error)
    assert error.retry_after_s is None


async def test_a_long_provider_message_is_truncated(simulator: Simulator, client: UpstreamClient) -> None:
    simulator.inject(CHAT_MODEL, InjectedFault("status", status=400, message="why " * 1000))

    error = await _failure(client)

    assert len(str(error)) < 700
    assert str(error).endswith("…")


# ---------------------------------------------------------------------------- the API key


async def test_the_api_key_never_appears_in_errors_reprs_or_logs(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, simulator: Simulator, base_url: str
) -> None:
    # Given a client holding a distinctive key that the provider refuses, and a provider that
    # quotes the key back in an error message
    monkeypatch.setenv(KEY_ENV, SECRET_KEY)
    simulator.configure({"require_api_key": "sk-the-right-one"})
    caplog.set_level(logging.DEBUG)
    errors: list[UpstreamError] = []
    async with UpstreamClient(_provider(base_url, api_key_env=KEY_ENV)) as client:
        # When it is refused, and when the provider echoes the key
        errors.append(await _failure(client))
        simulator.configure({"require_api_key": SECRET_KEY})
        assert (await client.chat(_chat())).status == 200  # the key really was sent
        simulator.inject(CHAT_MODEL, InjectedFault("status", status=400, message=f"Bad key: {SECRET_KEY}!"))
        errors.append(await _failure(client))
        client_repr = repr(client)

    # Then the key shows nowhere
    assert errors[0].status == 401 and errors[0].kind == "client"
    assert "Bad key: [api key]!" in str(errors[1])
    for text in [*(str(e) for e in errors), *(repr(e) for e in errors), client_repr, caplog.text]:
        assert SECRET_KEY not in text
    assert caplog.records, "the failures should have been logged (at debug level)"


async def test_a_key_variable_that_is_not_set_fails_at_open(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(KEY_ENV, raising=False)
    client = UpstreamClient(_provider("http://127.0.0.1:9/v1", api_key_env=KEY_ENV))

    with pytest.raises(ConfigError, match=KEY_ENV):
        await client.open()
    await client.close()


# ---------------------------------------------------------------------------- lifecycle


async def test_a_client_works_only_between_open_and_close(base_url: str) -> None:
    client = UpstreamClient(_provider(base_url))
    with pytest.raises(ClientClosed, match="not opened"):
        await client.chat(_chat())

    async with client:
        assert (await client.chat(_chat())).status == 200

    with pytest.raises(ClientClosed, match="closed"):
        await client.chat(_chat())
    with pytest.raises(ClientClosed):
        await client.open()  # reopening a closed client is an error
    with pytest.raises(ClientClosed):
        async for _ in client.chat_stream(_chat()):
            pass


def test_an_unusable_base_url_is_refused_up_front() -> None:
    with pytest.raises(ConfigError, match="http"):
        UpstreamClient(_provider("ftp://example.com/v1"))
    with pytest.raises(ConfigError):
        UpstreamClient(_provider("http://127.0.0.1/v1"), max_connections=0)


# ---------------------------------------------------------------------------- header parsing


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("1s", 1.0), ("6m0s", 360.0), ("20ms", 0.02), ("1m30.5s", 90.5), ("2h3m", 7380.0), ("30", 30.0),
     ("0.5", 0.5), (" 7 ", 7.0), ("", None), ("soon", None), ("-1s", None), ("nan", None), (None, None)],
)
def test_reset_durations_in_openai_format_and_plain_seconds(text: str | None, seconds: float | None) -> None:
    assert parse_duration_s(text) == (pytest.approx(seconds) if seconds is not None else None)


def test_retry_after_in_both_forms_is_never_negative() -> None:
    now = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)

    assert parse_retry_after("120", now) == 120.0
    assert parse_retry_after("1.5") == 1.5
    assert parse_retry_after("Sun, 01 Mar 2026 12:00:30 GMT", now) == 30.0
    assert parse_retry_after("Sun, 01 Mar 2026 11:59:00 GMT", now) == 0.0  # already past
    assert parse_retry_after("next tuesday", now) is None
    assert parse_retry_after("-5", now) is None
    assert parse_retry_after(None) is None


def test_rate_limit_headers_that_cannot_be_read_become_none() -> None:
    info = RateLimitInfo.from_headers({
        "x-ratelimit-limit-requests": "500",
        "x-ratelimit-remaining-requests": "many",
        "x-ratelimit-limit-tokens": "30000.0",
        "x-ratelimit-reset-tokens": "1m0.25s",
        "x-ratelimit-reset-requests": "whenever",
    })

    assert info == RateLimitInfo(limit_requests=500, limit_tokens=30_000, reset_tokens_s=60.25)
    assert info.known and not RateLimitInfo().known
    assert RateLimitInfo(remaining_tokens=0, reset_tokens_s=2.0, reset_requests_s=9.0).wait_hint_s() == 2.0
