"""The `tidegate` command line: the demo, queue inspection, workers and the simulated provider.

Errors that tidegate raises on purpose (the TidegateError tree) are printed as one line and exit
with status 2; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import asyncio
import contextlib
from decimal import Decimal, InvalidOperation
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from tidegate import __version__
from tidegate.cli._common import errors_as_exit, run
from tidegate.cli.sync import sync_app
from tidegate.coord.tenants import ApiKeyInfo, Tenant, TenantStore, tenant_store_for
from tidegate.demo.run import ensure_sqlite_folder
from tidegate.errors import TidegateError
from tidegate.jobs import Job, Priority
from tidegate.queue import Queue, QueueStats

__all__ = ["DEFAULT_QUEUE_URL", "app"]

DEFAULT_QUEUE_URL = "sqlite:///.tidegate/tidegate.db"

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
    duration: Annotated[float, typer.Option("--duration", "-d", min=2, max=3600,
                                            help="Seconds the whole run takes: the load (its first "
                                            "80 %), then the drain.")] = 60.0,
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
    import logging

    from tidegate.demo.run import DemoInterrupted, DemoSettings, show_demo

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = DemoSettings(duration_s=duration, rate_per_s=rate, concurrency=concurrency, seed=seed)
    console = Console()
    try:
        run(show_demo(settings, console, live=live, port=port))
    except DemoInterrupted as stopped:
        console.print(f"Demo {stopped}.", highlight=False)
        raise typer.Exit(130) from None


@queue_app.command("stats")
def queue_stats(queue: QueueUrl = DEFAULT_QUEUE_URL) -> None:
    """Depth, oldest wait and in-flight jobs per priority level."""

    async def main() -> QueueStats:
        async with _queue(queue) as q:
            return await q.stats()

    stats = run(main())
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

    dead = run(main())
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

    count = run(main())
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

        asyncio.run(serve(settings, host=host, port=port, allow_remote=allow_remote, on_ready=ready))
    typer.echo("Simulator stopped.")


@app.command()
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
    import logging
    import os

    from tidegate.app.worker import run_worker
    from tidegate.config import TidegateConfig
    from tidegate.dispatch.worker import parse_priorities

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    with errors_as_exit():
        if config is not None:
            os.environ["TIDEGATE_CONFIG"] = config
        ensure_sqlite_folder(queue)
        settings = TidegateConfig.load(queue_url=queue)
        if not settings.providers and simulator_url is not None:
            settings = settings.with_simulator(simulator_url)
        # Flags left out fall back to the [worker] section (file, TIDEGATE_WORKER__*), then the defaults.
        worker_settings = settings.worker.given(
            worker_id=worker_id, priorities=priorities and parse_priorities(priorities),
            concurrency=concurrency, lease_s=lease_s, shutdown_grace_s=grace_s,
        )
    run(run_worker(settings, worker_settings))


@app.command()
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
) -> None:
    """Serve the HTTP API (OpenAI-compatible, jobs, admin, metrics) until SIGTERM or SIGINT.

    Bound to loopback with no tenant or key in the store, requests without a key are served as a
    built-in local tenant; once a key exists a valid key is required. Point any number of gateways
    and workers at one Redis queue to scale out."""
    import logging
    import os

    from tidegate.app.gateway import serve_gateway
    from tidegate.config import TidegateConfig

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    with errors_as_exit():
        if config is not None:
            os.environ["TIDEGATE_CONFIG"] = config
        ensure_sqlite_folder(queue)
        settings = TidegateConfig.load(queue_url=queue)
        # Flags left out fall back to the [gateway] section (file, TIDEGATE_GATEWAY__* or
        # TIDEGATE_GATEWAY_* variables), then the defaults.
        gateway_settings = settings.gateway.given(
            host=host, port=port, request_timeout_s=timeout_s, max_body_bytes=max_body_bytes,
            max_messages=max_messages, max_batch=max_batch)
    run(serve_gateway(settings, gateway_settings, grace_s=grace_s))


# ---------------------------------------------------------------------- tenants and API keys

tenants_app = typer.Typer(help="Tenants: who may call the gateway, and within which limits.",
                          no_args_is_help=True)
keys_app = typer.Typer(help="Tenants' API keys (only a digest of each secret is stored).",
                       no_args_is_help=True)
app.add_typer(tenants_app, name="tenants")
app.add_typer(keys_app, name="keys")


def _tenant_store(url: str) -> TenantStore:
    ensure_sqlite_folder(url)
    # A one-shot command authenticates nothing: no cache to keep.
    return tenant_store_for(url, auth_cache_s=0)


def _tenant_from_options(name: str, *, max_priority: str, default_priority: str, rpm: int | None,
                         daily_budget_usd: str | None, models: str | None, admin: bool) -> Tenant:
    """The Tenant the `tenants put` options describe; BadParameter names what is wrong."""
    from pydantic import ValidationError

    budget: Decimal | None = None
    if daily_budget_usd is not None:
        try:
            budget = Decimal(daily_budget_usd)
        except InvalidOperation:
            raise typer.BadParameter(f"not an amount in USD: {daily_budget_usd!r}",
                                     param_hint="--daily-budget-usd") from None
    allowed: tuple[str, ...] | None = None
    if models is not None:
        allowed = tuple(model.strip() for model in models.split(",") if model.strip())
        if not allowed:
            raise typer.BadParameter("name at least one model, or leave --models out to allow all",
                                     param_hint="--models")
    try:
        tenant = Tenant(name=name, max_priority=Priority.parse(max_priority),
                        default_priority=Priority.parse(default_priority), rpm=rpm,
                        daily_budget_usd=budget, allowed_models=allowed, admin=admin)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(part) for part in error['loc'])}: {error['msg']}"
                             for error in exc.errors())
        raise typer.BadParameter(problems) from None
    if not tenant.may_use(tenant.default_priority):
        # Every request that names no priority would be refused.
        raise typer.BadParameter(
            f"default priority {tenant.default_priority.name.lower()} is more urgent than max "
            f"priority {tenant.max_priority.name.lower()}", param_hint="--default-priority")
    return tenant


@tenants_app.command("put")
def tenants_put(
    name: Annotated[str, typer.Argument(help="Tenant name: letters, digits, '_', '.', '-'.")],
    queue: QueueUrl = DEFAULT_QUEUE_URL,
    max_priority: Annotated[str, typer.Option(
        help="The most urgent priority it may ask for (a more urgent request is refused).")] = "high",
    default_priority: Annotated[str, typer.Option(
        help="The priority of its requests that name none.")] = "normal",
    rpm: Annotated[int | None, typer.Option(
        min=1, help="Requests per minute over all its keys [default: no limit].")] = None,
    daily_budget_usd: Annotated[str | None, typer.Option(
        help="Daily spend limit in USD, e.g. 10 or 2.50 [default: no limit].")] = None,
    models: Annotated[str | None, typer.Option(
        help="Comma-separated models it may use [default: every configured model].")] = None,
    admin: Annotated[bool, typer.Option("--admin", help="May call the admin API.")] = False,
) -> None:
    """Create or replace a tenant: settings left out take their defaults, not their old values."""
    with errors_as_exit():
        tenant = _tenant_from_options(name, max_priority=max_priority, default_priority=default_priority,
                                      rpm=rpm, daily_budget_usd=daily_budget_usd, models=models,
                                      admin=admin)

    async def main() -> None:
        async with _tenant_store(queue) as store:
            await store.put_tenant(tenant)

    run(main())
    typer.echo(f"Saved tenant {tenant.name}.")


@tenants_app.command("list")
def tenants_list(queue: QueueUrl = DEFAULT_QUEUE_URL) -> None:
    """Every tenant and its limits."""

    async def main() -> list[Tenant]:
        async with _tenant_store(queue) as store:
            return await store.list_tenants()

    tenants = run(main())
    console = Console()
    if not tenants:
        console.print("No tenants.")
        return
    table = Table(title="Tenants")
    table.add_column("name", no_wrap=True)
    for column in ("max priority", "default priority"):
        table.add_column(column)
    for column in ("rpm", "daily budget (USD)"):
        table.add_column(column, justify="right")
    table.add_column("models", overflow="fold")
    table.add_column("admin")
    for tenant in tenants:
        table.add_row(
            escape(tenant.name), tenant.max_priority.name.lower(), tenant.default_priority.name.lower(),
            "no limit" if tenant.rpm is None else f"{tenant.rpm:,}",
            "no limit" if tenant.daily_budget_usd is None else f"{tenant.daily_budget_usd:,}",
            "all" if tenant.allowed_models is None else escape(", ".join(tenant.allowed_models)),
            "yes" if tenant.admin else "",
        )
    console.print(table)


@keys_app.command("create")
def keys_create(
    tenant: Annotated[str, typer.Argument(help="The tenant the key acts for.")],
    queue: QueueUrl = DEFAULT_QUEUE_URL,
) -> None:
    """Create an API key and print it: the only time the full key is shown."""

    async def main() -> tuple[ApiKeyInfo, str]:
        async with _tenant_store(queue) as store:
            return await store.create_key(tenant)

    info, api_key = run(main())
    Console(stderr=True).print(
        f"Created key [bold]{info.key_id}[/] for tenant {escape(info.tenant)}. "
        "[yellow]Copy it now: it is not shown again[/] (only a digest is stored).",
        highlight=False, soft_wrap=True,
    )
    typer.echo(api_key)  # alone on stdout, unwrapped, so `KEY=$(tidegate keys create …)` works


@keys_app.command("list")
def keys_list(
    queue: QueueUrl = DEFAULT_QUEUE_URL,
    tenant: Annotated[str | None, typer.Option(help="Only this tenant's keys.")] = None,
) -> None:
    """API keys, newest first: ids, tenants and dates (never secrets)."""

    async def main() -> list[ApiKeyInfo]:
        async with _tenant_store(queue) as store:
            return await store.list_keys(tenant)

    keys = run(main())
    console = Console()
    if not keys:
        console.print("No keys.")
        return
    table = Table(title="API keys")
    table.add_column("key id", no_wrap=True)  # copied into `keys revoke`: keep it whole
    for column in ("tenant", "created (UTC)", "revoked (UTC)"):
        table.add_column(column)
    for key in keys:
        revoked = key.revoked_at.strftime("%Y-%m-%d %H:%M:%S") if key.revoked_at else ""
        table.add_row(key.key_id, escape(key.tenant), key.created_at.strftime("%Y-%m-%d %H:%M:%S"),
                      revoked)
    console.print(table)


@keys_app.command("revoke")
def keys_revoke(
    key_id: Annotated[str, typer.Argument(help="The key's id (the 12 characters after 'tg_').")],
    queue: QueueUrl = DEFAULT_QUEUE_URL,
) -> None:
    """Revoke an API key. Gateways refuse it within their authentication cache time (1 s)."""

    async def main() -> None:
        async with _tenant_store(queue) as store:
            if not await store.revoke_key(key_id):
                raise TidegateError(f"no active key with id {key_id!r} (unknown or already revoked)")

    run(main())
    typer.echo(f"Revoked key {key_id}.")


@app.command()
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
    import logging
    import os

    from tidegate.app.up import UpInfo, run_up
    from tidegate.config import TidegateConfig
    from tidegate.demo.embedded import embedded_sync_config

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    console = Console()

    def ready(info: UpInfo) -> None:
        table = Table(show_header=False, box=None)
        table.add_row("API (OpenAI base_url)", info.api_url)
        table.add_row("Dashboard", info.dashboard_url)
        table.add_row("Metrics", info.metrics_url)
        table.add_row("Queue", info.queue_url)
        table.add_row("Change flow", info.change_source or "off")
        table.add_row("Provider", (info.simulator_url and f"simulated, {info.simulator_url}")
                      or "as configured")
        console.print(table)
        # On a line of its own and never folded, so it can be copied whole.
        console.print("Admin API key (shown once; the next start revokes it):", highlight=False)
        console.print(info.admin_key, soft_wrap=True, highlight=False, markup=False)
        console.print("Press Ctrl-C to stop.")

    with errors_as_exit():
        if config is not None:
            os.environ["TIDEGATE_CONFIG"] = config
        settings = TidegateConfig.load()
        ensure_sqlite_folder(settings.queue_url)
        up_settings = settings.up.given(host=host, port=port, concurrency=concurrency,
                                        change_flow=change_flow, shutdown_grace_s=grace_s)
    with contextlib.suppress(KeyboardInterrupt):
        if up_settings.change_flow:
            settings = embedded_sync_config(settings, shop_data=shop_data)
        run(run_up(settings, up_settings, on_ready=ready))
    console.print("Stopped.")



app.add_typer(sync_app, name="sync")
