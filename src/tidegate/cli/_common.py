"""What every command group shares: a TidegateError ends the command with a one-line message and
exit status 2 instead of a traceback; the queue URL option; reading the config; logging.

Kept light on purpose: every `tidegate …` start imports it, so what a command needs beyond
typer and rich is imported inside that command.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from contextlib import AbstractAsyncContextManager, contextmanager
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.markup import escape

from tidegate._eventloop import run as run_loop
from tidegate.errors import TidegateError

if TYPE_CHECKING:
    from tidegate.config import TidegateConfig

__all__ = ["DEFAULT_QUEUE_URL", "ERROR_EXIT", "QueueUrl", "errors_as_exit", "load_config", "log_to_stderr",
           "run", "run_with"]

ERROR_EXIT = 2
DEFAULT_QUEUE_URL = "sqlite:///.tidegate/tidegate.db"

QueueUrl = Annotated[
    str,
    typer.Option("--queue", "-q", envvar="TIDEGATE_QUEUE_URL", show_default=True,
                 help="Queue URL: sqlite:///path/to/file.db, redis://host:port/db or "
                      "redis+cluster://host:port (any node of a Redis Cluster)."),
]

T = TypeVar("T")
R = TypeVar("R")


@contextmanager
def errors_as_exit() -> Iterator[None]:
    """Turn a TidegateError into a one-line message and exit status 2."""
    try:
        yield
    except TidegateError as exc:
        # Some messages embed a multi-line report (pydantic's); one line reads better in a shell.
        message = "; ".join(line.strip() for line in str(exc).splitlines() if line.strip())
        Console(stderr=True).print(f"[bold red]error:[/] {escape(message)}", highlight=False,
                                   soft_wrap=True)
        raise typer.Exit(ERROR_EXIT) from None


def run(main: Coroutine[Any, Any, T]) -> T:
    """Run `main` to its end, its TidegateError as a one-line message."""
    with errors_as_exit():
        return run_loop(main)


def run_with(opener: Callable[[], AbstractAsyncContextManager[R]], call: Callable[[R], Awaitable[T]]) -> T:
    """Open what `opener` makes, await `call` on it and close it, like `run`: what a one-shot
    command does with a queue or a tenant store."""

    async def main() -> T:
        async with opener() as opened:  # made inside the event loop that uses it
            return await call(opened)

    return run(main())


def load_config(path: str | None, **overrides: Any) -> TidegateConfig:
    """The configuration from `path` (given: it also becomes TIDEGATE_CONFIG, so whatever reads
    the config later in this process reads the same file) and the environment, `overrides`
    winning."""
    from tidegate.config import TidegateConfig

    if path is not None:
        os.environ["TIDEGATE_CONFIG"] = path
    return TidegateConfig.load(**overrides)


def log_to_stderr(level: int) -> None:
    """Log records at `level` and above to stderr, one timestamped line each."""
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
