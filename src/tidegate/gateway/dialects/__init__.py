"""The API shapes the gateway speaks (see `base`): OpenAI's, the first, and Anthropic's Messages."""

from tidegate.gateway.dialects.anthropic import ANTHROPIC, AnthropicDialect
from tidegate.gateway.dialects.base import Dialect, StreamRenderer
from tidegate.gateway.dialects.openai import OPENAI, OpenAIDialect

__all__ = ["ANTHROPIC", "OPENAI", "AnthropicDialect", "Dialect", "OpenAIDialect", "StreamRenderer"]
