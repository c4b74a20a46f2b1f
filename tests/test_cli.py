"""The command line and the demo behind `make demo`."""

from __future__ import annotations

import asyncio
from pathlib import Path

from typer.testing import CliRunner

from tidegate import Priority, Queue, __version__
from tidegate.cli import app
from tidegate.demo import DemoSummary, run_demo

runner = CliRunner()


def _url(tmp_path: Path, name: str = "demo.db") -> str:
    return f"sqlite:///{tmp_path / name}"


def _positions(summary: DemoSummary, priority: Priority, *, late: bool) -> list[int]:
    return [job.position for job in summary.served if job.priority is priority and job.late is late]


def test_demo_command_reports_every_priority(tmp_path: Path) -> None:
    result = runner.invoke(app, ["demo", "--queue", _url(tmp_path), "--jobs", "200"])

    assert result.exit_code == 0, result.output
    for priority in Priority:
        assert priority.name.lower() in result.output
    assert "jobs/s" in result.output


async def test_demo_serves_the_first_critical_jobs_before_any_bulk_job(tmp_path: Path) -> None:
    summary = await run_demo(_url(tmp_path), jobs=200)

    critical = _positions(summary, Priority.CRITICAL, late=False)
    bulk = _positions(summary, Priority.BULK, late=False)
    assert critical and bulk
    assert max(critical) < min(bulk)
    # Strict priority over the whole first batch: levels are served one after the other.
    first_batch = [job for job in summary.served if not job.late]
    assert [job.priority for job in first_batch] == sorted(job.priority for job in first_batch)


async def test_demo_settles_every_job_once_and_late_critical_jobs_jump_the_backlog(
    tmp_path: Path,
) -> None:
    summary = await run_demo(_url(tmp_path), jobs=200)

    late = _positions(summary, Priority.CRITICAL, late=True)
    assert late
    assert len({job.n for job in summary.served}) == len(summary.served) == 200 + len(late)
    # Enqueued half way, they are served before the bulk jobs that were already waiting.
    assert max(late) < max(_positions(summary, Priority.BULK, late=False))
    assert {row.label for row in summary.rows} >= {p.name.lower() for p in Priority}
    assert sum(row.dead for row in summary.rows) >= 1  # the poison jobs end in the DLQ
    assert sum(row.retries for row in summary.rows) >= 1


def test_demo_refuses_a_queue_that_is_not_empty(tmp_path: Path) -> None:
    url = _url(tmp_path)

    async def enqueue_one() -> None:
        async with Queue.from_url(url, maintenance_interval_s=None) as queue:
            await queue.enqueue({"someone": "else"})

    asyncio.run(enqueue_one())
    result = runner.invoke(app, ["demo", "--queue", url, "--jobs", "10"])

    assert result.exit_code == 2
    assert "needs an empty queue" in result.output
    assert "Traceback" not in result.output


def test_queue_commands_after_a_demo(tmp_path: Path) -> None:
    url = _url(tmp_path)
    assert runner.invoke(app, ["demo", "--queue", url, "--jobs", "200"]).exit_code == 0

    stats = runner.invoke(app, ["queue", "stats", "--queue", url])
    # Wide enough that rich does not fold the error text across lines.
    dlq = runner.invoke(app, ["queue", "dlq", "--queue", url], env={"COLUMNS": "200"})
    redrive = runner.invoke(app, ["queue", "redrive", "--all", "--queue", url])
    after = runner.invoke(app, ["queue", "dlq", "--queue", url])

    assert stats.exit_code == 0, stats.output
    for priority in Priority:
        assert priority.name.lower() in stats.output
    assert dlq.exit_code == 0, dlq.output
    assert "simulated upstream 503" in dlq.output
    assert redrive.exit_code == 0, redrive.output
    assert redrive.output.startswith("Redrove ")
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


def test_version() -> None:
    result = runner.invoke(app, ["version"])

    assert result.exit_code == 0
    assert result.output.strip() == f"tidegate {__version__}"
