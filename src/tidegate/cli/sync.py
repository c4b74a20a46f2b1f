"""`tidegate sync`: run the change flow, or show where it stands (`tidegate sync status`)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from typing import TYPE_CHECKING, Annotated, Any

import orjson
import typer
from rich.console import Console
from rich.table import Table

from tidegate.cli._common import errors_as_exit, load_config, log_to_stderr, run

if TYPE_CHECKING:
    from tidegate.config import TidegateConfig

__all__ = ["sync_app"]

sync_app = typer.Typer(
    help="The change flow: database changes → event bus → entity cache (and AI refresh jobs).",
    invoke_without_command=True,
)

ConfigFile = Annotated[str | None, typer.Option("--config", "-c", envvar="TIDEGATE_CONFIG",
                                                help="The tidegate.toml to read.")]
SourceUrl = Annotated[str | None, typer.Option(
    "--source", help="postgresql://user@host:port/db or sqlite:///shop.db (default: the config's).")]
BusUrl = Annotated[str | None, typer.Option(
    "--bus", help="memory://, redis://host:port/db, redis+cluster://host:port or kafka://host:port.")]
CacheUrl = Annotated[str | None, typer.Option(
    "--cache", help="memory://, redis://host:port/db or redis+cluster://host:port.")]
Tables = Annotated[str | None, typer.Option("--tables", help="Comma-separated tables to capture.")]


def _config(config: str | None, **overrides: Any) -> TidegateConfig:
    from tidegate.config import SyncConfig

    with errors_as_exit():
        loaded = load_config(config)
    given = {k: v for k, v in overrides.items() if v is not None}
    if isinstance(given.get("tables"), str):
        given["tables"] = tuple(t.strip() for t in given["tables"].split(",") if t.strip())
    sync = SyncConfig.model_validate({**loaded.sync.model_dump(), **given})
    return loaded.model_copy(update={"sync": sync})


@sync_app.callback()
def sync(
    ctx: typer.Context,
    source: SourceUrl = None,
    bus: BusUrl = None,
    cache: CacheUrl = None,
    tables: Tables = None,
    config: ConfigFile = None,
    metrics_port: Annotated[int | None, typer.Option(
        help="Serve Prometheus metrics on 127.0.0.1 at this port.")] = None,
    recommendations: Annotated[bool, typer.Option(
        help="Feed the recommender (state beside the cache; shared by gateways on a Redis cache).")] = True,
) -> None:
    """Capture changes until Ctrl-C/SIGTERM: creates the publication and replication slot when
    missing (PostgreSQL) or installs the outbox triggers (SQLite), takes the initial snapshot,
    then streams. Restarting resumes from the last position every sink applied."""
    if ctx.invoked_subcommand is not None:
        return
    log_to_stderr(logging.INFO)
    settings = _config(config, source_url=source, bus_url=bus, cache_url=cache, tables=tables)
    run(_sync_until_stopped(settings, metrics_port, recommendations))


async def _sync_until_stopped(config: TidegateConfig, metrics_port: int | None,
                              recommendations: bool) -> None:
    from tidegate.app.recs import open_recommendations
    from tidegate.app.sync import open_sync
    from tidegate.queue import Queue
    from tidegate.sync.cache import open_cache
    from tidegate.sync.contracts import Sink
    from tidegate.sync.metrics import SyncMetrics

    log = logging.getLogger("tidegate.sync")
    metrics = SyncMetrics()
    if metrics_port is not None:
        from prometheus_client import start_http_server

        from tidegate._redis import RECONNECTS

        metrics.registry.register(RECONNECTS)  # the bus's and the cache's Redis reconnections too
        start_http_server(metrics_port, addr="127.0.0.1", registry=metrics.registry)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    async with contextlib.AsyncExitStack() as stack:
        cache = await stack.enter_async_context(open_cache(config.sync))
        queue = None
        if config.sync.refresh:
            queue = await stack.enter_async_context(Queue.from_url(config.queue_url))
        sinks: list[Sink] = []
        on_refresh = None
        if recommendations:
            recs = await open_recommendations(stack, config, queue=queue, cache=cache,
                                              registry=metrics.registry)
            sinks.append(recs.sink)
            on_refresh = recs.watcher.enqueued if recs.watcher is not None else None
        pipeline = await stack.enter_async_context(open_sync(
            config, queue=queue, cache=cache, sinks=sinks, metrics=metrics, on_refresh=on_refresh))
        log.info("syncing %s from %s through %s into %s", ", ".join(pipeline.entity_types),
                 _redacted(config.sync.source_url), _redacted(config.sync.bus_url),
                 _redacted(config.sync.cache_url))
        reporter = asyncio.create_task(_report(pipeline, log, config.sync.source_url))
        try:
            await pipeline.run(stop)
        finally:
            reporter.cancel()
    log.info("stopped after applying %d change(s)", pipeline.applied_changes)


async def _report(pipeline: Any, log: logging.Logger, source_url: str) -> None:
    """A progress line every 10 s while changes flow, its position as `sync status` shows it."""
    from tidegate.sync.sources import position_text

    last, started = 0, time.monotonic()
    while True:
        await asyncio.sleep(10)
        if pipeline.applied_changes != last:
            rate = (pipeline.applied_changes - last) / 10
            last = pipeline.applied_changes
            log.info("applied %d change(s) (%.0f/s), confirmed position %s, up %.0f s",
                     last, rate, position_text(source_url, pipeline.last_confirmed),
                     time.monotonic() - started)


def _redacted(url: str) -> str:
    from tidegate._urls import redact_url

    return redact_url(url)


@sync_app.command("status")
def status(
    source: SourceUrl = None,
    cache: CacheUrl = None,
    tables: Tables = None,
    config: ConfigFile = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Where the change flow stands: slot position and lag (PostgreSQL) or outbox backlog
    (SQLite), and per table the rows in the source next to the entries in the cache (a shared
    cache such as Redis; a memory cache lives only inside its process, so it shows 0 here)."""
    from tidegate.app.sync import sync_status

    settings = _config(config, source_url=source, cache_url=cache, tables=tables)
    report = run(sync_status(settings.sync))
    if as_json:
        typer.echo(orjson.dumps(report, option=orjson.OPT_INDENT_2).decode())
        return
    console = Console()
    overview = Table(show_header=False, box=None, title="source")
    for key, value in report["source"].items():
        overview.add_row(key, str(value))
    console.print(overview)
    per_table = Table(title="tables")
    per_table.add_column("table")
    per_table.add_column("rows in source", justify="right")
    per_table.add_column("live in cache", justify="right")
    for entity_type, counts in report["tables"].items():
        per_table.add_row(entity_type, str(counts["source_rows"]), str(counts["cached"]))
    with contextlib.suppress(BrokenPipeError):
        console.print(per_table)
        console.print(f"last verify: {_last_verify(report.get('verify'))}", soft_wrap=True)


def _last_verify(last: Any) -> str:
    if not isinstance(last, dict):
        return "never"
    line = f"{last['finished_at']} {'ok' if last['ok'] else 'DRIFT'}, {last['checked']} row(s) checked"
    if last["drift"]:
        line += f", {last['drift']} wrong ({'repaired' if last['repair'] else 'not repaired'})"
    return line


@sync_app.command("verify")
def verify(
    source: SourceUrl = None,
    cache: CacheUrl = None,
    tables: Tables = None,
    config: ConfigFile = None,
    repair: Annotated[bool, typer.Option(
        help="Write drifted rows from the database into the cache.")] = False,
    batch_size: Annotated[int | None, typer.Option(
        min=1, max=10_000,
        help="Rows per read (default: the config's sync.verify.batch_size, else 1000).")] = None,
    max_rows_per_s: Annotated[float | None, typer.Option(
        min=0,
        help="Throttle (0: none; default: the config's sync.verify.max_rows_per_s, else 20000).")] = None,
    settle_timeout_s: Annotated[float | None, typer.Option(
        min=0.1, help="Longest wait for the sync to apply what a re-read saw (default: "
        "the config's sync.verify.settle_timeout_s, else 60).")] = None,
    metrics_file: Annotated[str | None, typer.Option(
        help="Write the drift gauges here (Prometheus text format, for a textfile collector).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Compare the cache with the database row by row by checksum and exit 1 on drift (missing,
    extra or differing rows; rows still changing after the re-checks count as unsettled).
    Rows that change during the pass are re-checked once the sync has applied them, not
    reported. With --repair, drifted rows are re-read from the database and written at a
    version later changes still replace; the exit status is then 0 once all are repaired."""
    from tidegate.sync.metrics import SyncMetrics
    from tidegate.sync.verify import KINDS, verify_sync

    settings = _config(config, source_url=source, cache_url=cache, tables=tables)
    # Flags left out fall back to the [sync.verify] section, then the defaults.
    with errors_as_exit():
        verify_settings = settings.sync.verify.given(
            batch_size=batch_size, settle_timeout_s=settle_timeout_s, repair=repair or None)
    if max_rows_per_s is not None:
        verify_settings = verify_settings.model_copy(update={"max_rows_per_s": max_rows_per_s or None})
    metrics = SyncMetrics()
    found = run(verify_sync(settings.sync, verify_settings, metrics))
    if metrics_file is not None:
        from prometheus_client import write_to_textfile

        write_to_textfile(metrics_file, metrics.registry)
    report = found.to_dict()
    if as_json:
        typer.echo(orjson.dumps(report, option=orjson.OPT_INDENT_2).decode())
    else:
        summary = Table(title=f"sync verify: {'ok' if found.ok else 'DRIFT'}")
        for column in ("table", "checked", *KINDS, "repaired"):
            summary.add_column(column, justify="left" if column == "table" else "right")
        for name, result in found.tables.items():
            summary.add_row(name, str(result.checked), *(str(getattr(result, k)) for k in KINDS),
                            str(result.repaired))
        with contextlib.suppress(BrokenPipeError):
            out = Console()
            out.print(summary)
            for name, result in found.tables.items():
                for kind, ids in result.examples.items():
                    out.print(f"{name} {kind}: {', '.join(ids)}", soft_wrap=True, markup=False,
                              highlight=False)
    raise typer.Exit(found.exit_code)
