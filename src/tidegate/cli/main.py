"""The `tidegate` command line: the Typer app and its command groups, one module each.

Every group imports what its commands need (FastAPI, uvicorn, numpy, the demo, the composition
roots) inside those commands, so `tidegate --help` or `tidegate queue stats` does not pay for
the gateway's or the demo's imports.

Errors that tidegate raises on purpose (the TidegateError tree) are printed as one line and exit
with status 2; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

from typing import Annotated

import typer

from tidegate import __version__
from tidegate.cli import config, demo, migrate, queue, serve, sync, tenants

__all__ = ["app"]

app = typer.Typer(
    help="tidegate: a durable priority queue for AI API traffic.",
    no_args_is_help=True,
    add_completion=False,
    # Click's plain help: the same on every Typer release, flags shown as flags (`--all`,
    # `--live / --no-live`). Typer's rich panels name every flag's type (`<bool>`, even --help's)
    # and pad empty columns.
    rich_markup_mode=None,
    # Up to 100 columns where the terminal has them (Click's default stops at 80), so each
    # command's summary in `tidegate --help` is whole.
    context_settings={"max_content_width": 100},
)


def _print_version(value: bool | None) -> None:
    """Print the version and stop: eager, so it runs before any command or required option."""
    if value:
        typer.echo(f"tidegate {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    _version: Annotated[
        bool | None,
        typer.Option("--version", callback=_print_version, is_eager=True,
                     help="Print the installed version and exit."),
    ] = None,
) -> None:
    """tidegate: a durable priority queue for AI API traffic."""


@app.command()
def version() -> None:
    """Print the installed version (the same as `tidegate --version`)."""
    _print_version(True)


# Registered in the order `tidegate --help` lists them.
app.command()(demo.demo)
app.command()(serve.simulate)
app.command()(serve.worker)
app.command()(serve.gateway)
app.command()(serve.up)
app.add_typer(queue.queue_app, name="queue")
app.add_typer(tenants.tenants_app, name="tenants")
app.add_typer(tenants.keys_app, name="keys")
app.add_typer(sync.sync_app, name="sync")
app.command()(migrate.migrate)
app.add_typer(config.config_app, name="config")
