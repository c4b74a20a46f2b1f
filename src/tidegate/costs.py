"""Money and token estimates for dispatch.

Money is integer micro-dollars (`*_micros`) everywhere inside tidegate; config prices are Decimal
USD per 1M tokens, and since 1 USD per 1M tokens is exactly 1 micro-dollar per token, a price
needs no conversion at all: `tokens * usd_per_1m` is already micros. Floats never touch money.

A call is billed by token kind, as the providers invoice it (`cost_micros`): input tokens at the
input price, those the provider's prompt cache served at the cached-input price, those written to
Anthropic's cache at the write price of their lifetime (5 minutes or 1 hour), and output tokens,
reasoning included, at the output price. A model that names no cached-input price bills cache
reads as plain input, which over-estimates them; one that names no write prices bills writes at
the input price times Anthropic's published multipliers (`CACHE_WRITE_5M_FACTOR`,
`CACHE_WRITE_1H_FACTOR`).

A model's prices depend on the service tier a call ran at (`at_tier`): its own prices for that
tier, else its default prices times the provider's factor for the tier, else the default prices.

Token estimates need no tokenizer download: they are character counts, deliberately a little
high (see `estimate_input_tokens`), because they are used to *reserve* budget and rate-limit
capacity before a call, and the reservation is settled to the provider's real usage afterwards.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import ROUND_CEILING, Decimal
from typing import Any, Final, get_args

import orjson
from msgspec import UNSET

from tidegate.ai import Usage
from tidegate.config import ModelConfig, PricedTier
from tidegate.contract import (
    ChatMessage,
    ChatRequest,
    CompletionRequest,
    EmbeddingsRequest,
    ModerationImage,
    ModerationRequest,
    ModerationText,
    RequestBody,
)

__all__ = [
    "CACHE_WRITE_1H_FACTOR",
    "CACHE_WRITE_5M_FACTOR",
    "CHARS_PER_TOKEN",
    "COMPLETION_DEFAULT_MAX_TOKENS",
    "DEFAULT_MAX_OUTPUT_TOKENS",
    "IMAGE_TOKENS",
    "MESSAGE_OVERHEAD_TOKENS",
    "REPLY_PRIMING_TOKENS",
    "Prices",
    "at_tier",
    "billed_tier",
    "cost_micros",
    "estimate_cost_micros",
    "estimate_input_tokens",
    "estimate_output_tokens",
    "micros_to_usd",
    "scaled",
    "usd_to_micros",
]

MICROS_PER_USD = 1_000_000

DEFAULT_MAX_OUTPUT_TOKENS = 1024
"""Output tokens assumed for a chat request that sets neither `max_tokens` nor
`max_completion_tokens`. Providers then allow up to the model's whole output window, so no bound
is exact; 1024 covers the large majority of chat replies, and the settle step replaces the
estimate with the real usage whichever way it errs."""

COMPLETION_DEFAULT_MAX_TOKENS = 16
"""Output tokens of a legacy completion that sets no `max_tokens`: the API's own default."""

CHARS_PER_TOKEN = 4  # OpenAI's rule of thumb for English text
MESSAGE_OVERHEAD_TOKENS = 4  # role and separators per chat message (OpenAI documents 3)
NAME_OVERHEAD_TOKENS = 1  # a message's `name` field costs its text plus one
REPLY_PRIMING_TOKENS = 3  # every reply is primed with <|start|>assistant<|message|>
IMAGE_TOKENS = 85  # a low-detail image; high-detail ones cost more and are settled afterwards


# ---------------------------------------------------------------------- money

CACHE_WRITE_5M_FACTOR: Final = Decimal("1.25")
"""A 5-minute cache write's price as a share of the input price, for a model that names none:
Anthropic's published multiplier (https://platform.claude.com/docs/en/about-claude/pricing)."""
CACHE_WRITE_1H_FACTOR: Final = Decimal("2")
"""A 1-hour cache write's price as a share of the input price (Anthropic's, as above)."""

_PRICE_FIELDS: Final = ("input_usd_per_1m", "output_usd_per_1m", "cached_input_usd_per_1m",
                        "cache_write_5m_usd_per_1m", "cache_write_1h_usd_per_1m")


@dataclass(frozen=True, slots=True)
class Prices:
    """A model's price of each kind of token, in USD per 1M tokens (which is micro-dollars per
    token), with the defaults of the prices it leaves unset filled in (see the module)."""

    input: Decimal
    cached_input: Decimal
    cache_write_5m: Decimal
    cache_write_1h: Decimal
    output: Decimal

    @classmethod
    def of(cls, model: ModelConfig) -> Prices:
        """`model`'s prices, each unset one at its default."""
        given = model.input_usd_per_1m

        def named(price: Decimal | None, default: Decimal) -> Decimal:
            return default if price is None else price

        return cls(given, named(model.cached_input_usd_per_1m, given),
                   named(model.cache_write_5m_usd_per_1m, given * CACHE_WRITE_5M_FACTOR),
                   named(model.cache_write_1h_usd_per_1m, given * CACHE_WRITE_1H_FACTOR),
                   model.output_usd_per_1m)


def cost_micros(model: ModelConfig, usage: Usage) -> int:
    """What a call that used `usage` costs in micro-dollars, by token kind (see the module),
    exactly, rounded up to a whole micro so that a sum of costs never falls below what the
    provider bills. Reasoning tokens are inside the output tokens, as both providers count
    them, and are not billed again."""
    counts = (usage.input_tokens, usage.output_tokens, usage.cached_input_tokens,
              usage.cache_write_5m_tokens, usage.cache_write_1h_tokens)
    if min(counts) < 0:
        raise ValueError(f"token counts must be >= 0, got {usage}")
    prices = Prices.of(model)
    # USD per 1M tokens == micros per token, so the prices multiply token counts directly.
    exact = (usage.uncached_input_tokens * prices.input
             + usage.cached_input_tokens * prices.cached_input
             + usage.cache_write_5m_tokens * prices.cache_write_5m
             + usage.cache_write_1h_tokens * prices.cache_write_1h
             + usage.output_tokens * prices.output)
    return math.ceil(exact)


def scaled(model: ModelConfig, factor: Decimal) -> ModelConfig:
    """`model` with every price it names times `factor` (a tier's or a provider batch's price
    factor); the prices it leaves unset follow the scaled input price, as they follow the input
    price."""
    named = {name: getattr(model, name) for name in _PRICE_FIELDS}
    update = {name: price * factor for name, price in named.items() if price is not None}
    return model.model_copy(update=update)


_PRICED_TIERS: Final[Mapping[str, PricedTier]] = {tier: tier for tier in get_args(PricedTier)}


def billed_tier(sent: str | None, answered: object) -> PricedTier:
    """The tier a call is billed at: the one the provider's answer names (its `service_tier`),
    else the one sent; `auto`, none, or a tier without a price of its own are the default."""
    for tier in (answered, sent):
        if isinstance(tier, str) and tier in _PRICED_TIERS:
            return _PRICED_TIERS[tier]
    return "default"


def at_tier(model: ModelConfig, tier: str | None,
            factors: Mapping[PricedTier, Decimal] | None = None) -> ModelConfig:
    """`model` priced at service tier `tier` (see the module's docstring); `factors` are the
    provider's `tier_price_factors`. The model itself at the default tier. A tier with prices of
    its own prices cache reads at its cached-input price (its input price when it names none)
    and cache writes at its input price times the write multipliers."""
    priced = billed_tier(tier, None)
    if priced == "default":
        return model
    own = model.tier_prices.get(priced)
    if own is not None:
        return model.model_copy(update={
            "input_usd_per_1m": own.input_usd_per_1m, "output_usd_per_1m": own.output_usd_per_1m,
            "cached_input_usd_per_1m": own.cached_input_usd_per_1m,
            "cache_write_5m_usd_per_1m": None, "cache_write_1h_usd_per_1m": None})
    factor = (factors or {}).get(priced)
    return model if factor is None else scaled(model, factor)


def usd_to_micros(usd: Decimal | int) -> int:
    """USD → integer micro-dollars; a fraction of a micro rounds up (towards +infinity).

    Floats are refused: 0.1 as a float is not 0.1, and money must add up exactly."""
    if isinstance(usd, bool) or not isinstance(usd, Decimal | int):
        raise TypeError(f"USD amounts must be Decimal or int, got {type(usd).__name__}")
    scaled = Decimal(usd).scaleb(6)
    return int(scaled.to_integral_value(rounding=ROUND_CEILING))


def micros_to_usd(micros: int) -> Decimal:
    """Integer micro-dollars → exact Decimal USD (e.g. 1_500 → Decimal("0.001500"))."""
    return Decimal(micros).scaleb(-6)


# ---------------------------------------------------------------------- token estimates


def estimate_input_tokens(body: RequestBody) -> int:
    """Estimate the prompt tokens of an OpenAI-compatible request body without a tokenizer.

    Text costs ceil(ASCII characters / 4) plus one token per non-ASCII character.

    - chat: for every message, its text + 4 (role and separators) + its `name` (+1) if any;
      `content` may be a string or a list of parts: text parts count as text, image parts a
      fixed 85 tokens each, any other part (audio, files) its JSON length as text. Tool calls
      in assistant messages and the request's `tools` / `functions` definitions count as their
      JSON text. Then + 3 for the reply priming.
    - embeddings: `input` may be a string, a list of strings, a token array (list of ints: its
      length) or a list of token arrays; so may a legacy completion's `prompt` (plus its
      `suffix`), and a moderation's `input` (whose multimodal items count as chat parts do).

    On English it overestimates slightly: current tokenizers average well above 4 characters per
    token on English prose, every string is rounded up on its own, and the per-message overhead
    is one more than OpenAI's documented 3. Erring high is what budgets need: the estimate is
    reserved before the call and settled to the real usage afterwards, so a high estimate only
    holds back a little headroom for the duration of one call, while a low one would let
    concurrent calls overspend a limit before their settlements arrive. Non-ASCII text counts a
    token per character for the same reason: CJK text runs about one token per character,
    where a plain length / 4 would under-count it four times over.
    """
    if isinstance(body, ChatRequest):
        return _chat_tokens(body)
    if isinstance(body, EmbeddingsRequest):
        return _embedding_tokens(body.input)
    if isinstance(body, ModerationRequest):
        return _embedding_tokens([_moderation_item(item) for item in body.input]
                                 if isinstance(body.input, list) else body.input)
    suffix_tokens = _text_tokens(body.suffix) if body.suffix is not None else 0
    return _embedding_tokens(body.prompt) + suffix_tokens


def estimate_output_tokens(body: RequestBody) -> int:
    """The most output tokens a request can bill: `max_completion_tokens` (or the older
    `max_tokens`; DEFAULT_MAX_OUTPUT_TOKENS when neither is set) times `n` replies. A legacy
    completion bills `max_tokens` (COMPLETION_DEFAULT_MAX_TOKENS unset) for `best_of` (or `n`)
    replies to each prompt. Embeddings and moderations produce none."""
    if isinstance(body, EmbeddingsRequest | ModerationRequest):
        return 0
    if isinstance(body, CompletionRequest):
        cap = body.max_tokens or COMPLETION_DEFAULT_MAX_TOKENS
        drawn = body.best_of or body.n or 1
        return cap * drawn * _prompt_count(body.prompt)
    limit = body.max_completion_tokens or body.max_tokens
    return (limit or DEFAULT_MAX_OUTPUT_TOKENS) * (body.n or 1)


def estimate_cost_micros(model: ModelConfig, body: RequestBody) -> int:
    """The budget to reserve before a call: the input estimate at input prices plus the most
    output the request can produce at output prices (see `estimate_output_tokens`)."""
    # The estimate assumes no prompt cache at work: no hit, which only errs high, and no write,
    # which a call that writes its prompt to Anthropic's cache (1.25 or 2 times the input price)
    # outgrows. The settlement replaces it with what the provider counted either way.
    prompt, output = estimate_input_tokens(body), estimate_output_tokens(body)
    return cost_micros(model, Usage(prompt, output, prompt + output))


def _text_tokens(text: str) -> int:
    if text.isascii():
        return -(-len(text) // CHARS_PER_TOKEN)
    non_ascii = sum(1 for char in text if not char.isascii())
    return -(-(len(text) - non_ascii) // CHARS_PER_TOKEN) + non_ascii


def _json_tokens(value: Any) -> int:
    # Structures the model reads as text (tool schemas, call arguments): their JSON is what it sees.
    return _text_tokens(orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS).decode())


def _chat_tokens(body: ChatRequest) -> int:
    total = REPLY_PRIMING_TOKENS + sum(_message_tokens(message) for message in body.messages)
    for field in ("tools", "functions"):  # carried through: the contract does not name them
        if body.extra.get(field):
            total += _json_tokens(body.extra[field])
    return total


def _message_tokens(message: ChatMessage) -> int:
    total = MESSAGE_OVERHEAD_TOKENS + _content_tokens(message.content)
    if isinstance(message.name, str) and message.name:
        total += _text_tokens(message.name) + NAME_OVERHEAD_TOKENS
    for calls in (message.tool_calls, message.function_call):
        if calls:
            total += _json_tokens(calls)
    return total


def _content_tokens(content: Any) -> int:
    if content is None or content is UNSET:
        return 0
    if isinstance(content, str):
        return _text_tokens(content)
    if isinstance(content, list):
        return sum(_part_tokens(part) for part in content)
    return _json_tokens(content)


def _part_tokens(part: Any) -> int:
    if isinstance(part, str):
        return _text_tokens(part)
    if not isinstance(part, Mapping):
        return _json_tokens(part)
    kind = part.get("type")
    if kind == "text" and isinstance(part.get("text"), str):
        return _text_tokens(part["text"])
    if kind in ("image_url", "image", "input_image"):
        return IMAGE_TOKENS
    if kind == "refusal" and isinstance(part.get("refusal"), str):
        return _text_tokens(part["refusal"])
    return _json_tokens(part)


def _embedding_tokens(value: Any) -> int:
    if isinstance(value, str):
        return _text_tokens(value)
    if not isinstance(value, list):
        return 0
    if all(isinstance(item, int) for item in value):
        return len(value)  # one token array: its length is exact
    return sum(_embedding_item_tokens(item) for item in value)


def _moderation_item(item: str | ModerationText | ModerationImage) -> object:
    """A moderation's input item as a chat part counts it: text as text, an image as an image."""
    if isinstance(item, ModerationText):
        return {"type": "text", "text": item.text}
    return {"type": "image_url"} if isinstance(item, ModerationImage) else item


def _embedding_item_tokens(item: Any) -> int:
    if isinstance(item, str):
        return _text_tokens(item)
    if isinstance(item, list):
        return len(item)
    if isinstance(item, int):
        return 1
    return _part_tokens(item)  # a moderation's multimodal item: text, or an image


def _prompt_count(prompt: Any) -> int:
    """How many prompts a legacy completion's `prompt` holds (each is answered on its own)."""
    if isinstance(prompt, list) and prompt and not all(isinstance(item, int) for item in prompt):
        return len(prompt)
    return 1
