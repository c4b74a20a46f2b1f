"""The HTTP gateway: an OpenAI-compatible API in front of the queue, jobs, admin, metrics and the
dashboard."""
