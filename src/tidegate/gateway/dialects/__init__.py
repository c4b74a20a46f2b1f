"""The API shapes the gateway speaks (see `base`): OpenAI's chat completions and embeddings, and
OpenAI's Responses API over the same chat jobs."""

from tidegate.gateway.dialects.base import Dialect, StreamRenderer
from tidegate.gateway.dialects.openai import OPENAI, OpenAIDialect
from tidegate.gateway.dialects.responses import RESPONSES, ResponsesDialect

__all__ = ["OPENAI", "RESPONSES", "Dialect", "OpenAIDialect", "ResponsesDialect", "StreamRenderer"]
