"""The long-running commands: `tidegate simulate`, `worker`, `gateway` and `up`. Each hands its
options to a composition root in `tidegate.app` (or the simulator), imported when it runs."""

from __future__ import annotations

import contextlib
import logging
from typing import TYPE_CHECKING, Annotated, Any

import typer

from tidegate.cli._common import DEFAULT_QUEUE_URL, QueueUrl, errors_as_exit, load_config, log_to_stderr, run
from tidegate.errors import TidegateError

if TYPE_CHECKING:
    from rich.console import Console

    from tidegate.app.up import UpInfo
    from tidegate.config import TidegateConfig

__all__ = ["gateway", "simulate", "up", "worker"]


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

    from tidegate._eventloop import run as run_loop
    from tidegate.simulator.server import serve
    from tidegate.simulator.settings import SimulatorSettings

    behaviour = {"latency_ms": latency_ms, "latency_p99_ms": latency_p99_ms, "rpm": rpm, "tpm": tpm,
                 "error_rate": error_rate}
    overrides: dict[str, Any] = {
        name: value
        for name, value in {"seed": seed, "window_s": window_s, "retry_after_format": retry_after_format,
                            "defaults": {k: v for k, v in behaviour.items() if v is not None}}.items()
        if value is not None
    }
    with errors_as_exit():
        if api_key_env is not None:
            key = os.environ.get(api_key_env)
            if not key:
                raise TidegateError(f"the environment variable {api_key_env} is not set")
            overrides["require_api_key"] = key
        settings = SimulatorSettings.load(Path(config) if config else None, overrides)

        def ready(url: str) -> None:
            typer.echo(f"Simulated provider listening on {url}")  # one line: scripts read the URL
            typer.echo(f"Models: {', '.join(settings.served_models())}. Press Ctrl-C to stop.")

        run_loop(serve(settings, host=host, port=port, allow_remote=allow_remote, on_ready=ready))
    typer.echo("Simulator stopped.")


def worker(
    queue: QueueUrl = DEFAULT_QUEUE_URL,
    priorities: Annotated[str | None, typer.Option(
        help="Levels to serve: a range '0-1', names 'critical,high', or one level "
        "(default: the config's worker.priorities, else all).")] = None,
    concurrency: Annotated[int | None, typer.Option(
        min=1, help="Calls in flight at most (default: the config's worker.concurrency, else 16).")] = None,
    lease_s: Annotated[float | None, typer.Option(
        min=1, help="Lease per claimed job, renewed while it runs (default: the config's worker.lease_s, "
        "else 30).")] = None,
    grace_s: Annotated[float | None, typer.Option(
        min=0, help="On SIGTERM/SIGINT, how long in-flight calls may finish before the rest are "
        "released (default: the config's worker.shutdown_grace_s, else 30).")] = None,
    config: Annotated[str | None, typer.Option("--config", "-c", envvar="TIDEGATE_CONFIG",
                                               help="The tidegate.toml to read.")] = None,
    simulator_url: Annotated[str | None, typer.Option(
        help="Use the simulated provider at this base URL when no provider is configured.")] = None,
    worker_id: Annotated[str | None, typer.Option(help="Name in leases and logs.")] = None,
) -> None:
    """Claim AI jobs and call the providers, until SIGTERM or SIGINT (then drain gracefully)."""
    from tidegate._sqlite import ensure_sqlite_folder
    from tidegate.app.worker import run_worker
    from tidegate.dispatch.worker import parse_priorities

    log_to_stderr(logging.INFO)
    with errors_as_exit():
        ensure_sqlite_folder(queue)
        settings = load_config(config, queue_url=queue)
        settings = _with_simulator(settings, simulator_url)
        # Flags left out fall back to the [worker] section (file, TIDEGATE_WORKER__*), then the defaults.
        worker_settings = settings.worker.given(
            worker_id=worker_id, priorities=priorities and parse_priorities(priorities),
            concurrency=concurrency, lease_s=lease_s, shutdown_grace_s=grace_s,
        )
    run(run_worker(settings, worker_settings))


def gateway(
    queue: QueueUrl = DEFAULT_QUEUE_URL,
    host: Annotated[str | None, typer.Option(
        help="Address to bind (default: the config's gateway.host, else 127.0.0.1). Anything but loopback "
        "needs an API key to exist (see `tidegate keys create`).")] = None,
    port: Annotated[int | None, typer.Option("--port", "-p", min=0, max=65535, help="Port to listen on "
                                             "(default: the config's gateway.port, else 8080).")] = None,
    config: Annotated[str | None, typer.Option("--config", "-c", envvar="TIDEGATE_CONFIG",
                                               help="The tidegate.toml to read (providers, models, "
                                               "callbacks).")] = None,
    timeout_s: Annotated[float | None, typer.Option(
        "--timeout-s", min=0.001, help="How long a chat or embeddings call waits for its result before "
        "answering 504 with the job id.")] = None,
    max_body_bytes: Annotated[int | None, typer.Option(min=1, help="Largest request body.")] = None,
    max_messages: Annotated[int | None, typer.Option(
        min=1, help="Most messages in one chat request.")] = None,
    max_batch: Annotated[int | None, typer.Option(min=1, help="Most jobs in one POST /v1/jobs.")] = None,
    grace_s: Annotated[float, typer.Option(min=0, help="On SIGTERM/SIGINT, how long open requests may "
                                           "finish before their connections are cut.")] = 30.0,
    processes: Annotated[int | None, typer.Option(
        min=1, help="Gateway processes sharing the port, one per core (default: the config's "
        "gateway.processes, else 1); above 1 needs a fixed --port.")] = None,
    simulator_url: Annotated[str | None, typer.Option(
        help="Offer the simulated provider's models (at this base URL, where the workers call it) "
        "when no provider is configured.")] = None,
) -> None:
    """Serve the HTTP API (OpenAI-compatible, jobs, admin, metrics) until SIGTERM or SIGINT.

    Bound to loopback with no tenant or key in the store, requests without a key are served as a
    built-in local tenant; once a key exists a valid key is required. Point any number of gateways
    and workers at one Redis queue to scale out. Without a configured provider (or
    --simulator-url) every AI call is refused with 503."""
    from tidegate._sqlite import ensure_sqlite_folder
    from tidegate.app.gateway import serve_gateway
    from tidegate.app.gateway_processes import serve_gateways
    from tidegate.app.ports import bind_port

    log_to_stderr(logging.INFO)
    with errors_as_exit():
        ensure_sqlite_folder(queue)
        settings = _with_simulator(load_config(config, queue_url=queue), simulator_url)
        # Flags left out fall back to the [gateway] section (file, TIDEGATE_GATEWAY__* or
        # TIDEGATE_GATEWAY_* variables), then the defaults.
        gateway_settings = settings.gateway.given(
            host=host, port=port, request_timeout_s=timeout_s, max_body_bytes=max_body_bytes,
            max_messages=max_messages, max_batch=max_batch, processes=processes)
        if gateway_settings.processes > 1:
            # A busy port is one line here, before any gateway process starts (each then binds
            # it with SO_REUSEPORT, which this plain bind would not have shared).
            bind_port(gateway_settings.host, gateway_settings.port).close()
            status = serve_gateways(settings, gateway_settings, processes=gateway_settings.processes,
                                    grace_s=grace_s)
            raise typer.Exit(status)
    run(serve_gateway(settings, gateway_settings, grace_s=grace_s))


def _with_simulator(settings: TidegateConfig, simulator_url: str | None) -> TidegateConfig:
    """`settings` with the simulated provider at `simulator_url` when no provider is configured
    and a URL is given; else as they are."""
    if settings.providers or simulator_url is None:
        return settings
    from tidegate.simulator.catalogue import with_simulator

    return with_simulator(settings, simulator_url)


def up(
    host: Annotated[str | None, typer.Option(
        help="Address to bind; anything but loopback needs an API key (default: the config's up.host, else "
        "127.0.0.1).")] = None,
    port: Annotated[int | None, typer.Option(
        min=0, max=65535,
        help="Gateway port (0: any free port; default: the config's up.port, else 8080).")] = None,
    concurrency: Annotated[int | None, typer.Option(
        min=1, help="The worker's calls in flight (default: the config's up.concurrency, else 32).")] = None,
    config: Annotated[str | None, typer.Option("--config", "-c", envvar="TIDEGATE_CONFIG",
                                               help="The tidegate.toml to read.")] = None,
    change_flow: Annotated[bool | None, typer.Option(
        "--change-flow/--no-change-flow",
        help="Run the change flow (the demo shop by default; default: the config's up.change_flow, "
        "else on).")] = None,
    shop_data: Annotated[str | None, typer.Option(
        help="Seed a new demo shop from this copy of the UCI Online Retail data (online_retail.csv.gz).")]
    = None,
    grace_s: Annotated[float | None, typer.Option(
        min=0, help="On SIGTERM/SIGINT, how long open requests and in-flight calls may finish before "
        "the rest are released (default: the config's up.shutdown_grace_s, else 30).")] = None,
) -> None:
    """Run everything in one process: the embedded queue, a worker, the gateway and dashboard,
    the change flow on the demo shop (SQLite, `.tidegate/shop.db`), and the simulated provider
    when no provider is configured. Stop with Ctrl-C."""
    from rich.console import Console

    from tidegate._sqlite import ensure_sqlite_folder
    from tidegate.app.ports import bind_port

    log_to_stderr(logging.WARNING)
    console = Console()
    with errors_as_exit():
        settings = load_config(config)
        up_settings = settings.up.given(host=host, port=port, concurrency=concurrency,
                                        change_flow=change_flow, shutdown_grace_s=grace_s)
        # The port first, even before the heavier imports: a start that cannot serve (another
        # `up` holds the port) changes nothing, neither the data folder nor any key, and says so
        # in one line at once.
        sock = bind_port(up_settings.host, up_settings.port)
        ensure_sqlite_folder(settings.queue_url)
    from tidegate.app.up import run_up
    from tidegate.demo.embedded import embedded_sync_config

    with contextlib.suppress(KeyboardInterrupt):
        if up_settings.change_flow:
            settings = embedded_sync_config(settings, shop_data=shop_data)
        run(run_up(settings, up_settings, sock=sock, on_ready=lambda info: _show_up(console, info)))
    console.print("Stopped.")


def _show_up(console: Console, info: UpInfo) -> None:
    """What `tidegate up` prints once everything listens."""
    from rich.table import Table

    from tidegate._urls import redact_url

    table = Table(show_header=False, box=None)
    table.add_row("API (OpenAI base_url)", info.api_url)
    table.add_row("Dashboard", info.dashboard_url)
    table.add_row("Metrics", info.metrics_url)
    # Printed to a terminal and often to a log: a URL's password never is.
    table.add_row("Queue", redact_url(info.queue_url))
    table.add_row("Change flow", redact_url(info.change_source) if info.change_source else "off")
    table.add_row("Provider", (info.simulator_url and f"simulated, {info.simulator_url}")
                  or "as configured")
    console.print(table)
    _show_admin_key(console, info)
    console.print("Press Ctrl-C to stop.")


def _show_admin_key(console: Console, info: UpInfo) -> None:
    """The admin key in full only when this start made it; else where it is, by its id (a
    secret is printed once, never at every start into a log)."""
    from rich.markup import escape

    where = escape(str(info.admin_key_file))
    if info.admin_key_origin == "created" and info.admin_key is not None:
        console.print(f"Admin API key (made now, kept for later starts in {where}; "
                      "`tidegate keys rotate-admin` replaces it):", highlight=False, soft_wrap=True)
        # On a line of its own and never folded, so it can be copied whole.
        console.print(info.admin_key, soft_wrap=True, highlight=False, markup=False)
    elif info.admin_key_origin == "given":
        console.print(f"Admin API key: the one TIDEGATE_ADMIN_KEY gives (key id {info.admin_key_id}).",
                      highlight=False, soft_wrap=True)
    elif info.admin_key is not None:
        console.print(f"Admin API key: the one made before, in {where} (key id {info.admin_key_id}).",
                      highlight=False, soft_wrap=True)
    else:
        console.print(f"Admin API key: the one TIDEGATE_ADMIN_KEY gave before (key id {info.admin_key_id}).",
                      highlight=False, soft_wrap=True)
