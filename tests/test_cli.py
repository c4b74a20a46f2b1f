"""The command line (the demo behind `make demo` is tested in test_demo.py)."""

from __future__ import annotations

import asyncio
import importlib.metadata
import re
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from tidegate import JobState, Priority, Queue, __version__
from tidegate.cli.main import app

runner = CliRunner()


def _url(tmp_path: Path, name: str = "queue.db") -> str:
    return f"sqlite:///{tmp_path / name}"


async def _fill(url: str) -> None:
    """A job waiting at every level, one dead letter and two succeeded jobs."""
    async with Queue.from_url(url, maintenance_interval_s=None) as queue:
        await queue.enqueue({"bad": True}, priority="critical", max_attempts=1)
        [job] = await queue.claim("cli-test", limit=1)
        assert await queue.fail(job, "upstream answered HTTP 400: Invalid 'temperature'") is JobState.DEAD
        for n in range(2):
            await queue.enqueue({"good": n}, priority="high")
            [job] = await queue.claim("cli-test", limit=1)
            await queue.complete(job, {"ok": True})
        for priority in Priority:
            await queue.enqueue({"n": int(priority)}, priority=priority)


def test_queue_commands(tmp_path: Path) -> None:
    url = _url(tmp_path)
    asyncio.run(_fill(url))

    stats = runner.invoke(app, ["queue", "stats", "--queue", url])
    # Wide enough that rich does not fold the error text across lines.
    dlq = runner.invoke(app, ["queue", "dlq", "--queue", url], env={"COLUMNS": "300"})
    redrive = runner.invoke(app, ["queue", "redrive", "--all", "--queue", url])
    after = runner.invoke(app, ["queue", "dlq", "--queue", url])

    assert stats.exit_code == 0, stats.output
    for priority in Priority:
        assert priority.name.lower() in stats.output
    assert "succeeded (kept): 2   dead: 1   delayed: 0" in stats.output
    assert dlq.exit_code == 0, dlq.output
    assert "Invalid 'temperature'" in dlq.output
    assert redrive.exit_code == 0, redrive.output
    assert redrive.output.startswith("Redrove 1 job")
    assert "No dead letters." in after.output


def test_redrive_needs_ids_or_all(tmp_path: Path) -> None:
    neither = runner.invoke(app, ["queue", "redrive", "--queue", _url(tmp_path)])
    both = runner.invoke(app, ["queue", "redrive", "--all", "abc", "--queue", _url(tmp_path)])

    assert neither.exit_code == 2
    assert both.exit_code == 2


def test_tidegate_errors_are_one_line_and_exit_2() -> None:
    result = runner.invoke(app, ["queue", "stats", "--queue", "ftp://example.invalid/q"])

    assert result.exit_code == 2
    assert "error: unsupported queue URL" in result.output
    assert "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1


@pytest.mark.parametrize("args", [["--version"], ["version"], ["--version", "queue", "stats"]])
def test_version(args: list[str]) -> None:
    # `--version` is eager: it answers before a command (and its required options) is looked at.
    result = runner.invoke(app, args)

    assert result.exit_code == 0, result.output
    assert result.output == f"tidegate {__version__}\n"


def test_version_is_the_packages_metadata() -> None:
    # One source: the wheel's metadata is read from tidegate/__init__.py at build time, so the
    # installed distribution and the module agree (and the version is semantic, 0.x.y).
    assert importlib.metadata.version("tidegate") == __version__
    assert re.fullmatch(r"0\.\d+\.\d+", __version__), __version__


def test_up_never_prints_a_urls_password() -> None:
    from io import StringIO

    from rich.console import Console

    from tidegate.app.up import UpInfo
    from tidegate.cli.serve import _show_up

    out = StringIO()
    info = UpInfo(api_url="http://127.0.0.1:1/v1", dashboard_url="http://127.0.0.1:1/",
                  metrics_url="http://127.0.0.1:1/metrics", simulator_url=None, admin_key="tg-admin",
                  queue_url="redis://:s3cret@127.0.0.1:6399/0",
                  change_source="postgresql://shop:hunter2@127.0.0.1:5499/shop")
    _show_up(Console(file=out, width=200), info)
    printed = out.getvalue()
    assert "s3cret" not in printed and "hunter2" not in printed
    assert "redis://:***@127.0.0.1:6399/0" in printed
    assert "postgresql://shop:***@127.0.0.1:5499/shop" in printed


def _command_paths() -> list[list[str]]:
    """Every command and group of `tidegate`, as the arguments that reach it."""
    import typer

    # Duck-typed: Typer releases differ in whose Click classes they build on (their own copy or
    # the installed package).
    def walk(command: Any, path: list[str]) -> list[list[str]]:
        found = [path]
        if hasattr(command, "list_commands"):
            context = command.context_class(command)
            for name in command.list_commands(context):
                found += walk(command.get_command(context, name), [*path, name])
        return found

    return walk(typer.main.get_command(app), [])


@pytest.mark.parametrize("path", _command_paths(), ids=lambda path: " ".join(path) or "tidegate")
def test_every_commands_help_shows_flags_as_flags_and_no_stray_space(path: list[str]) -> None:
    result = runner.invoke(app, [*path, "--help"], env={"COLUMNS": "100"})

    assert result.exit_code == 0, result.output
    assert result.output.startswith("Usage: ")
    # A flag takes no value: no `<bool>` (Typer's rich help gives every flag one, --help's too)
    assert "<bool>" not in result.output
    # No space before punctuation, as a markup-swallowed "[default: …]" in a help text leaves
    assert not re.search(r"\S [.,;:)](\s|$)", result.output), result.output
    assert "--help  " in result.output or "--help\n" in result.output
