"""`tidegate queue …`: inspect and manage a queue (depths, dead letters, redrive)."""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from tidegate.cli._common import DEFAULT_QUEUE_URL, QueueUrl, run_with

if TYPE_CHECKING:
    from tidegate.queue import Queue

__all__ = ["queue_app"]

queue_app = typer.Typer(help="Inspect and manage a queue.", no_args_is_help=True)


def _queue(url: str) -> Queue:
    from tidegate._sqlite import ensure_sqlite_folder
    from tidegate.queue import Queue

    ensure_sqlite_folder(url)
    # A one-shot command has no business running background upkeep on a shared queue.
    return Queue.from_url(url, maintenance_interval_s=None)


@queue_app.command("stats")
def queue_stats(queue: QueueUrl = DEFAULT_QUEUE_URL) -> None:
    """Depth, oldest wait and in-flight jobs per priority level; the succeeded jobs still kept,
    the dead letters and the delayed jobs."""
    stats = run_with(partial(_queue, queue), lambda q: q.stats())
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
    # Succeeded jobs are counted while kept (finished_ttl_s; answered calls answered_ttl_s).
    console.print(f"succeeded (kept): {stats.succeeded:,}   dead: {stats.dead:,}   "
                  f"delayed: {stats.delayed:,}", highlight=False)


@queue_app.command("dlq")
def queue_dlq(
    queue: QueueUrl = DEFAULT_QUEUE_URL,
    limit: Annotated[int, typer.Option(min=1, help="Most dead letters to list.")] = 20,
) -> None:
    """List dead letters, most recent first."""
    dead = run_with(partial(_queue, queue), lambda q: q.dead_letters(limit=limit))
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
    count = run_with(partial(_queue, queue), lambda q: q.redrive(None if all_ else ids))
    typer.echo(f"Redrove {count} job{'s' if count != 1 else ''}.")
