"""The API shapes the gateway speaks (see `base`): OpenAI's chat completions and embeddings,
OpenAI's Responses API over the same chat jobs, and Anthropic's Messages."""

from tidegate.gateway.dialects.anthropic import ANTHROPIC, AnthropicDialect
from tidegate.gateway.dialects.base import Dialect, StreamRenderer
from tidegate.gateway.dialects.openai import OPENAI, OpenAIDialect
from tidegate.gateway.dialects.responses import RESPONSES, ResponsesDialect

__all__ = ["ANTHROPIC", "OPENAI", "RESPONSES", "AnthropicDialect", "Dialect", "OpenAIDialect",
           "ResponsesDialect", "StreamRenderer"]
