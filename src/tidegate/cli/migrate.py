"""`tidegate migrate --check|--apply`: the format of every store the configuration names, against
the formats this code writes, and the migrations that bring older ones forward."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from tidegate._eventloop import run as run_loop
from tidegate.cli._common import errors_as_exit, load_config

__all__ = ["migrate"]

PENDING_EXIT = 1  # a migration is pending, or a store is newer than the code


def migrate(
    check: Annotated[bool, typer.Option("--check", help="Report the formats only.")] = False,
    apply: Annotated[bool, typer.Option("--apply", help="Run the pending migrations, and report.")] = False,
    config: Annotated[str | None, typer.Option("--config", "-c", envvar="TIDEGATE_CONFIG",
                                               help="The tidegate.toml to read.")] = None,
) -> None:
    """Check or apply the storage migrations of the configured queue URL and change-flow cache.

    Exits 1 when a migration is pending (--check) or a store is newer than this tidegate, 0 when
    every store is in the code's format."""
    if check == apply:
        raise typer.BadParameter("give exactly one of --check and --apply")
    from tidegate.app.storage import store_formats
    from tidegate.errors import StoreFormatError

    with errors_as_exit():
        loaded = load_config(config)
    console = Console(highlight=False, soft_wrap=True)
    with errors_as_exit():  # anything else (unreachable, bad config) exits with ERROR_EXIT
        try:
            reports = run_loop(store_formats(loaded, apply=apply))
        except StoreFormatError as exc:  # a SQLite file whose layout is newer than the code
            console.print(escape(str(exc)))
            raise typer.Exit(PENDING_EXIT) from None
    for report in reports:
        console.print(escape(report.line()))
    if any(report.needs_action for report in reports):
        raise typer.Exit(PENDING_EXIT)
