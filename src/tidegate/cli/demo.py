"""`tidegate demo`: the whole system under a mix of load, its numbers live and summarised."""

from __future__ import annotations

import logging
from typing import Annotated

import typer

from tidegate.cli._common import log_to_stderr, run

__all__ = ["demo"]


def demo(
    duration: Annotated[float, typer.Option("--duration", "-d", min=2, max=3600,
                                            help="Seconds the whole run takes: the load (its first "
                                            "80%), then the drain.")] = 60.0,
    rate: Annotated[float, typer.Option("--rate", "-r", min=0.5, max=2000,
                                        help="Mean requests per second sent during the load.")] = 40.0,
    concurrency: Annotated[int, typer.Option(min=1, max=1024,
                                             help="The worker's calls in flight.")] = 6,
    port: Annotated[int, typer.Option(min=0, max=65535,
                                      help="Gateway and dashboard port (0: any free port).")] = 0,
    live: Annotated[bool, typer.Option("--live/--no-live",
                                       help="Redraw the numbers while the demo runs.")] = True,
    seed: Annotated[int, typer.Option(help="Seed of the request mix and the simulator.")] = 7,
) -> None:
    """Run `tidegate up` (simulated provider, a fresh .tidegate/demo.db) and send it a mix of
    priorities through the HTTP API, over capacity for a while; show the numbers live, then
    summarise waits, latency, errors and spend per priority and per model."""
    from rich.console import Console

    from tidegate.demo.run import DemoInterrupted, DemoSettings, show_demo

    log_to_stderr(logging.WARNING)
    settings = DemoSettings(duration_s=duration, rate_per_s=rate, concurrency=concurrency, seed=seed)
    console = Console()
    try:
        run(show_demo(settings, console, live=live, port=port))
    except DemoInterrupted as stopped:
        console.print(f"Demo {stopped}.", highlight=False)
        raise typer.Exit(130) from None
