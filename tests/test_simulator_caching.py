"""The simulated provider's prompt cache, spoken to with the official SDKs: a repeated prompt prefix
is reported as cached the way OpenAI (automatic, in 128-token blocks from 1024 tokens on) and
Anthropic (`cache_control` breakpoints, writes by lifetime, then reads) report it, and it is
deterministic and forgotten on reset."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import anthropic
import pytest
from anthropic.types import MessageParam, TextBlockParam, Usage
from openai import AsyncOpenAI
from openai.types.chat import ChatCompletionMessageParam

from tidegate.simulator import Simulator, SimulatorSettings

OPENAI_MODEL = "gpt-4.1"
ANTHROPIC_MODEL = "claude-sonnet-4.5"
# 4096 characters: 1024 tokens of text, 1028 with the message's own 4 (the simulator's estimate).
LONG = ("tide " * 820)[:4096]
SHORT = "Name a colour."  # 4 tokens of text, 8 as a message


def system(text: str = LONG) -> ChatCompletionMessageParam:
    return {"role": "system", "content": text}


def user(text: str = SHORT) -> ChatCompletionMessageParam:
    return {"role": "user", "content": text}


def marked(text: str = LONG, ttl: str | None = None) -> list[TextBlockParam]:
    """A system prompt of one text block that ends a cache breakpoint (of any `ttl`, a wrong one
    included, to see it refused)."""
    control: dict[str, Any] = {"type": "ephemeral", **({"ttl": ttl} if ttl else {})}
    return [{"type": "text", "text": text, "cache_control": control}]  # type: ignore[typeddict-item]


def asking(text: str = SHORT) -> list[MessageParam]:
    return [{"role": "user", "content": text}]


def counts(usage: Usage) -> tuple[int, int, int, int]:
    """A Message's input tokens, cache reads, and cache writes for 5 minutes and for an hour."""
    lifetimes = usage.cache_creation
    assert lifetimes is not None
    written = lifetimes.ephemeral_5m_input_tokens, lifetimes.ephemeral_1h_input_tokens
    assert usage.cache_creation_input_tokens == sum(written)
    return usage.input_tokens, usage.cache_read_input_tokens or 0, *written


@pytest.fixture
def simulator() -> Simulator:
    return Simulator(SimulatorSettings(seed=5))


@pytest.fixture
async def clients(simulator: Simulator) -> AsyncIterator[tuple[AsyncOpenAI, anthropic.AsyncAnthropic]]:
    async with (simulator.running() as url,
                AsyncOpenAI(base_url=url, api_key="unused", max_retries=0) as openai_client,
                anthropic.AsyncAnthropic(base_url=url.removesuffix("/v1"), api_key="unused",
                                         max_retries=0) as anthropic_client):
        yield openai_client, anthropic_client


async def cached_tokens(client: AsyncOpenAI, messages: list[ChatCompletionMessageParam]) -> tuple[int, int]:
    """The prompt and cached tokens a chat completion reports."""
    completion = await client.chat.completions.create(model=OPENAI_MODEL, messages=messages)
    usage = completion.usage
    assert usage is not None and usage.prompt_tokens_details is not None
    return usage.prompt_tokens, usage.prompt_tokens_details.cached_tokens or 0


async def test_a_repeated_prefix_of_1024_tokens_or_more_is_reported_cached_in_128_token_blocks(
    clients: tuple[AsyncOpenAI, anthropic.AsyncAnthropic],
) -> None:
    client, _ = clients

    first = await cached_tokens(client, [system(), user()])
    again = await cached_tokens(client, [system(), user("Name a shape.")])
    longer = await cached_tokens(client, [system(), user(), {"role": "assistant", "content": "Red."},
                                          user("And another?")])

    # 3 (the reply's priming) + 1028 (system) + 8 (user): nothing cached the first time
    assert first == (1039, 0)
    # The system message was seen: its 1028 tokens, in whole blocks of 128
    assert again == (1039, 1024)
    # System and first question were seen: 1036 tokens, still 1024 in whole blocks
    assert longer[1] == 1024


async def test_a_prefix_below_1024_tokens_is_never_cached(
    clients: tuple[AsyncOpenAI, anthropic.AsyncAnthropic],
) -> None:
    client, _ = clients
    short_system = system(LONG[:4000])  # 1000 + 4 tokens

    await cached_tokens(client, [short_system, user()])
    assert await cached_tokens(client, [short_system, user()]) == (1015, 0)


async def test_responses_report_the_cache_in_their_input_details(
    clients: tuple[AsyncOpenAI, anthropic.AsyncAnthropic],
) -> None:
    client, _ = clients

    tokens = []
    for question in ("Name a colour.", "Name a shape."):
        response = await client.responses.create(model=OPENAI_MODEL, instructions=LONG, input=question)
        assert response.usage is not None
        tokens.append(response.usage.input_tokens_details.cached_tokens)

    assert tokens == [0, 1024]


async def test_an_anthropic_breakpoint_is_written_then_read(
    clients: tuple[AsyncOpenAI, anthropic.AsyncAnthropic],
) -> None:
    _, client = clients

    first = await client.messages.create(model=ANTHROPIC_MODEL, max_tokens=50, system=marked(),
                                         messages=asking())
    again = await client.messages.create(model=ANTHROPIC_MODEL, max_tokens=50, system=marked(),
                                         messages=asking("Name a shape."))

    # The 1028 tokens up to the breakpoint are written for 5 minutes, then read; the rest is input
    assert counts(first.usage) == (11, 0, 1028, 0)
    assert counts(again.usage) == (11, 1028, 0, 0)


async def test_an_anthropic_stream_counts_the_cache_in_its_start_and_its_delta(
    clients: tuple[AsyncOpenAI, anthropic.AsyncAnthropic],
) -> None:
    _, client = clients

    async with client.messages.stream(model=ANTHROPIC_MODEL, max_tokens=50, system=marked(ttl="1h"),
                                      messages=asking()) as stream:
        final = await stream.get_final_message()

    assert counts(final.usage) == (11, 0, 0, 1028)


async def test_a_breakpoint_later_in_the_conversation_reads_the_earlier_prefix_and_writes_the_rest(
    clients: tuple[AsyncOpenAI, anthropic.AsyncAnthropic],
) -> None:
    _, client = clients
    await client.messages.create(model=ANTHROPIC_MODEL, max_tokens=50, system=marked(), messages=asking())

    turns: list[MessageParam] = [
        {"role": "user", "content": SHORT}, {"role": "assistant", "content": "Red."},
        {"role": "user", "content": [{"type": "text", "text": "And a shape?",
                                      "cache_control": {"type": "ephemeral", "ttl": "1h"}}]}]
    later = await client.messages.create(model=ANTHROPIC_MODEL, max_tokens=50, system=marked(),
                                         messages=turns)

    # Read: the system prompt (1028). Written for an hour: the three turns up to the new breakpoint
    # (8 + 5 + 7). Input: the reply's priming (3).
    assert counts(later.usage) == (3, 1028, 0, 20)


async def test_a_cache_marker_of_an_unknown_kind_or_lifetime_or_too_many_is_refused(
    clients: tuple[AsyncOpenAI, anthropic.AsyncAnthropic],
) -> None:
    _, client = clients

    with pytest.raises(anthropic.BadRequestError, match="ttl"):
        await client.messages.create(model=ANTHROPIC_MODEL, max_tokens=50, system=marked(ttl="2h"),
                                     messages=asking())
    blocks = [block for _ in range(5) for block in marked("tide")]
    with pytest.raises(anthropic.BadRequestError, match="A maximum of 4 blocks"):
        await client.messages.create(model=ANTHROPIC_MODEL, max_tokens=50, system=blocks, messages=asking())


async def test_the_cache_is_deterministic_and_forgotten_on_reset(
    simulator: Simulator, clients: tuple[AsyncOpenAI, anthropic.AsyncAnthropic],
) -> None:
    client, _ = clients
    runs = []
    for _ in range(2):
        runs.append([await cached_tokens(client, [system(), user()]) for _ in range(3)])
        simulator.reset()

    assert runs[0] == runs[1] == [(1039, 0), (1039, 1024), (1039, 1024)]
