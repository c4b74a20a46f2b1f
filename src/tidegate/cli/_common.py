"""What every command group shares: a TidegateError ends the command with a one-line message and
exit status 2 instead of a traceback."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import typer
from rich.console import Console
from rich.markup import escape

from tidegate.errors import TidegateError

__all__ = ["ERROR_EXIT", "errors_as_exit", "run"]

ERROR_EXIT = 2

T = TypeVar("T")


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
        return asyncio.run(main)
