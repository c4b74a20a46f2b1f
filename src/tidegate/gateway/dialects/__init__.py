"""The API shapes the gateway speaks (see `base`); OpenAI's is the first."""

from tidegate.gateway.dialects.base import Dialect, StreamRenderer
from tidegate.gateway.dialects.openai import OPENAI, OpenAIDialect

__all__ = ["OPENAI", "Dialect", "OpenAIDialect", "StreamRenderer"]
