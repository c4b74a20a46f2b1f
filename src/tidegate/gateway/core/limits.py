"""The bounds of what the gateway accepts, in one place: the request models, the query parameters
and the OpenAPI document are all built from these constants, so the document states exactly what
the code refuses. A request body's bounds are the typed contract's (tidegate.contract), re-exported.

Where OpenAI's API has a bound the gateway takes it (a client written against OpenAI never meets a
stricter one); elsewhere a bound keeps a value inside what the queue and its backends can store
and read back (SQLite and Redis integers are 64-bit: 2**63 answered a 500 before).
"""

from __future__ import annotations

from typing import Final

# A request body's bounds are the typed contract's, which the door decodes with.
from tidegate.contract import (
    MAX_CHOICES,
    MAX_EMBEDDING_DIMENSIONS,
    MAX_EMBEDDING_INPUTS,
    MAX_INPUT_TOKENS,
    MAX_METADATA_KEYS,
    MAX_OUTPUT_TOKENS,
    MAX_STOPS,
    MAX_TOP_LOGPROBS,
)

__all__ = [
    "MAX_BUDGET_USD",
    "MAX_CHOICES",
    "MAX_EMBEDDING_DIMENSIONS",
    "MAX_EMBEDDING_INPUTS",
    "MAX_INPUT_TOKENS",
    "MAX_METADATA_KEYS",
    "MAX_NAME_CHARS",
    "MAX_OFFSET",
    "MAX_OUTPUT_TOKENS",
    "MAX_PAGE",
    "MAX_RPM",
    "MAX_STOPS",
    "MAX_TOP_LOGPROBS",
]

MAX_NAME_CHARS: Final = 256  # a model name in a tenant's allowed_models
MAX_PAGE: Final = 1_000  # items in one page of a list (`limit`)
MAX_OFFSET: Final = 1_000_000_000  # the farthest `offset` of a list: far beyond any retention
MAX_RPM: Final = 1_000_000_000  # a tenant's requests-per-minute limit
MAX_BUDGET_USD: Final = 1_000_000_000  # a tenant's daily budget
