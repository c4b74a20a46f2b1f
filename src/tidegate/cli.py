"""The `tidegate` command line: the demo, queue inspection, workers and the simulated provider.

Errors that tidegate raises on purpose (the TidegateError tree) are printed as one line and exit
with status 2; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Iterator
from contextlib import contextmanager
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from tidegate import __version__
from tidegate.demo import DEFAULT_JOBS, ensure_sqlite_folder, render_summary, run_demo
from tidegate.errors import TidegateError
from tidegate.jobs import Job
from tidegate.queue import Queue, QueueStats

__all__ = ["DEFAULT_QUEUE_URL", "app"]

DEFAULT_QUEUE_URL = "sqlite:///.tidegate/tidegate.db"
ERROR_EXIT = 2

T = TypeVar("T")

app = typer.Typer(
    help="tidegate: a durable priority queue for AI API traffic.",
    no_args_is_help=True,
    add_completion=False,
)
queue_app = typer.Typer(help="Inspect and manage a queue.", no_args_is_help=True)
app.add_typer(queue_app, name="queue")

QueueUrl = Annotated[
    str,
    typer.Option("--queue", "-q", envvar="TIDEGATE_QUEUE_URL", show_default=True,
                 help="Queue URL: sqlite:///path/to/file.db or redis://host:port/db."),
]


@contextmanager
def _errors_as_exit() -> Iterator[None]:
    """Turn a TidegateError into a one-line message and exit status 2."""
    try:
        yield
    except TidegateError as exc:
        # Some messages embed a multi-line report (pydantic's); one line reads better in a shell.
        message = "; ".join(line.strip() for line in str(exc).splitlines() if line.strip())
        Console(stderr=True).print(f"[bold red]error:[/] {escape(message)}", highlight=False,
                                   soft_wrap=True)
        raise typer.Exit(ERROR_EXIT) from None


def _run(main: Coroutine[Any, Any, T]) -> T:
    with _errors_as_exit():
        return asyncio.run(main)


def _queue(url: str) -> Queue:
    ensure_sqlite_folder(url)
    # A one-shot command has no business running background upkeep on a shared queue.
    return Queue.from_url(url, maintenance_interval_s=None)


@app.command()
def version() -> None:
    """Print the installed version."""
    typer.echo(f"tidegate {__version__}")


@app.command()
def demo(
    queue: Annotated[
        str | None,
        typer.Option("--queue", "-q", help="Queue URL (must be empty); default: a fresh "
                     ".tidegate/demo.db."),
    ] = None,
    jobs: Annotated[int, typer.Option("--jobs", "-n", min=1, max=100_000,
                                      help="Jobs in the first batch.")] = DEFAULT_JOBS,
) -> None:
    """Enqueue a mixed-priority batch, drain it with concurrent workers, show the served order."""
    console = Console()
    summary = _run(run_demo(queue, jobs=jobs, progress=console.print))
    console.print()
    render_summary(summary, console)


@queue_app.command("stats")
def queue_stats(queue: QueueUrl = DEFAULT_QUEUE_URL) -> None:
    """Depth, oldest wait and in-flight jobs per priority level."""

    async def main() -> QueueStats:
        async with _queue(queue) as q:
            return await q.stats()

    stats = _run(main())
    table = Table(title=f"Queue {escape(queue)}")
    table.add_column("priority")
    table.add_column("waiting", justify="right")
    table.add_column("oldest wait", justify="right")
    table.add_column("in flight", justify="right")
    for priority, level in sorted(stats.levels.items()):
        table.add_row(priority.name.lower(), f"{level.depth:,}", f"{level.oldest_wait_s:,.1f} s",
                      f"{level.in_flight:,}")
    table.add_section()
    table.add_row("all", f"{stats.depth:,}", "", f"{stats.in_flight:,}")
    console = Console()
    console.print(table)
    console.print(f"delayed: {stats.delayed:,}   dead: {stats.dead:,}")


@queue_app.command("dlq")
def queue_dlq(
    queue: QueueUrl = DEFAULT_QUEUE_URL,
    limit: Annotated[int, typer.Option(min=1, help="Most dead letters to list.")] = 20,
) -> None:
    """List dead letters, most recent first."""

    async def main() -> list[Job]:
        async with _queue(queue) as q:
            return await q.dead_letters(limit=limit)

    dead = _run(main())
    console = Console()
    if not dead:
        console.print("No dead letters.")
        return
    table = Table(title=f"Dead letters in {escape(queue)}")
    table.add_column("id", no_wrap=True)  # ids are copied into `queue redrive`: keep them whole
    for column in ("priority", "tenant", "attempts", "finished (UTC)", "last error"):
        table.add_column(column, overflow="fold")
    for job in dead:
        finished = job.finished_at.strftime("%Y-%m-%d %H:%M:%S") if job.finished_at else ""
        table.add_row(job.id, job.priority.name.lower(), escape(job.tenant), str(job.attempts),
                      finished, escape(job.last_error or ""))
    console.print(table)


@queue_app.command("redrive")
def queue_redrive(
    ids: Annotated[list[str] | None, typer.Argument(help="Dead job ids to put back.")] = None,
    queue: QueueUrl = DEFAULT_QUEUE_URL,
    all_: Annotated[bool, typer.Option("--all", help="Redrive every dead letter.")] = False,
) -> None:
    """Put dead jobs back in the queue at their own priority, with fresh attempts."""
    if all_ == bool(ids):
        raise typer.BadParameter("give dead job ids or --all (not both)")

    async def main() -> int:
        async with _queue(queue) as q:
            return await q.redrive(None if all_ else ids)

    count = _run(main())
    typer.echo(f"Redrove {count} job{'s' if count != 1 else ''}.")


@app.command()
def simulate(
    port: Annotated[int, typer.Option("--port", "-p", min=0, max=65535,
                                      help="Port to listen on (0: any free port).")] = 8900,
    host: Annotated[str, typer.Option(help="Address to bind: loopback unless --allow-remote.")] = "127.0.0.1",
    config: Annotated[str | None, typer.Option("--config", "-c",
                                               help="TOML file of simulator settings.")] = None,
    seed: Annotated[int | None, typer.Option(help="Seed of the random generators.")] = None,
    latency_ms: Annotated[float | None, typer.Option(min=0, help="Median answer latency.")] = None,
    latency_p99_ms: Annotated[float | None, typer.Option(min=0, help="p99 answer latency.")] = None,
    rpm: Annotated[int | None, typer.Option(min=1, help="Requests per window, per model.")] = None,
    tpm: Annotated[int | None, typer.Option(min=1, help="Tokens per window, per model.")] = None,
    window_s: Annotated[float | None, typer.Option(help="Rate-limit window in seconds.")] = None,
    error_rate: Annotated[float | None, typer.Option(min=0, max=1, help="Share of HTTP 500s.")] = None,
    retry_after_format: Annotated[str | None, typer.Option(
        help="Retry-After as 'seconds' or 'http-date'.")] = None,
    api_key_env: Annotated[str | None, typer.Option(
        help="Require 'Authorization: Bearer <key>' with the key in this environment variable.")] = None,
    allow_remote: Annotated[bool, typer.Option(
        help="Allow a non-loopback --host (the /_sim/ control endpoints are then not served).")] = False,
) -> None:
    """Run a simulated OpenAI-compatible provider until Ctrl-C. Flags override --config for
    every model without a setting of its own."""
    import os
    from pathlib import Path

    from tidegate.providers.sim_settings import SimulatorSettings
    from tidegate.providers.simulator import serve

    behaviour = {"latency_ms": latency_ms, "latency_p99_ms": latency_p99_ms, "rpm": rpm, "tpm": tpm,
                 "error_rate": error_rate}
    overrides: dict[str, Any] = {
        name: value
        for name, value in {"seed": seed, "window_s": window_s, "retry_after_format": retry_after_format,
                            "defaults": {k: v for k, v in behaviour.items() if v is not None}}.items()
        if value is not None
    }
    with _errors_as_exit():
        if api_key_env is not None:
            key = os.environ.get(api_key_env)
            if not key:
                raise TidegateError(f"the environment variable {api_key_env} is not set")
            overrides["require_api_key"] = key
        settings = SimulatorSettings.load(Path(config) if config else None, overrides)

        def ready(url: str) -> None:
            typer.echo(f"Simulated provider listening on {url}")  # one line: scripts read the URL
            typer.echo(f"Models: {', '.join(settings.served_models())}. Press Ctrl-C to stop.")

        asyncio.run(serve(settings, host=host, port=port, allow_remote=allow_remote, on_ready=ready))
    typer.echo("Simulator stopped.")


@app.command()
def worker(
    queue: QueueUrl = DEFAULT_QUEUE_URL,
    priorities: Annotated[str, typer.Option(
        help="Levels to serve: a range '0-1', names 'critical,high', or one level.")] = "0-4",
    concurrency: Annotated[int, typer.Option(min=1, help="Calls in flight at most.")] = 16,
    lease_s: Annotated[float, typer.Option(
        min=1, help="Lease per claimed job, renewed while it runs.")] = 30.0,
    grace_s: Annotated[float, typer.Option(min=0, help="On SIGTERM/SIGINT, how long in-flight calls "
                                           "may finish before the rest are released.")] = 30.0,
    config: Annotated[str | None, typer.Option("--config", "-c", envvar="TIDEGATE_CONFIG",
                                               help="The tidegate.toml to read.")] = None,
    simulator_url: Annotated[str | None, typer.Option(
        help="Use the simulated provider at this base URL when no provider is configured.")] = None,
    worker_id: Annotated[str | None, typer.Option(help="Name in leases and logs.")] = None,
) -> None:
    """Claim AI jobs and call the providers, until SIGTERM or SIGINT (then drain gracefully)."""
    import logging
    import os

    from tidegate.config import TidegateConfig
    from tidegate.dispatch.run import run_worker
    from tidegate.dispatch.worker import WorkerSettings, parse_priorities

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    with _errors_as_exit():
        if config is not None:
            os.environ["TIDEGATE_CONFIG"] = config
        ensure_sqlite_folder(queue)
        settings = TidegateConfig.load(queue_url=queue)
        if not settings.providers and simulator_url is not None:
            settings = settings.with_simulator(simulator_url)
        worker_settings = WorkerSettings(
            worker_id=worker_id, priorities=parse_priorities(priorities), concurrency=concurrency,
            lease_s=lease_s, shutdown_grace_s=grace_s,
        )
    _run(run_worker(settings, worker_settings))
