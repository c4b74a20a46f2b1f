"""The dispatcher: workers claim jobs from the queue, route each to a configured model, call the
provider within the rate limits and budgets, and settle the job with its result."""

from tidegate.dispatch.router import AUTO, RouteDecision, Router
from tidegate.dispatch.worker import Worker, WorkerSettings

__all__ = ["AUTO", "RouteDecision", "Router", "Worker", "WorkerSettings"]
