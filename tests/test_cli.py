"""The command line and the demo behind `make demo`."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tidegate import FINAL_STATES, JobState, Priority, Queue, __version__
from tidegate.cli import app
from tidegate.demo import DemoSettings, DemoSummary, run_demo

runner = CliRunner()

# A small, fast demo: one batch enqueued at once (an instant backlog), the simulator's latencies
# cut to a twentieth, and more 503s than the real demo so that every run retries some calls.
FAST = DemoSettings(jobs=300, latency_scale=0.05, error_rate=0.05, refresh_s=0.05)


def _url(tmp_path: Path, name: str = "demo.db") -> str:
    return f"sqlite:///{tmp_path / name}"


@pytest.fixture(scope="module")
def fast_demo(tmp_path_factory: pytest.TempPathFactory) -> DemoSummary:
    """One fast demo run, shared by the tests that read its summary."""
    url = _url(tmp_path_factory.mktemp("demo"))
    return asyncio.run(run_demo(url, FAST))


def test_demo_ends_every_job_in_a_final_state(fast_demo: DemoSummary) -> None:
    assert fast_demo.jobs == 300
    assert len({record.id for record in fast_demo.records}) == 300
    assert all(record.state in FINAL_STATES for record in fast_demo.records)
    assert sum(row.count for row in fast_demo.by_priority) == 300
    assert sum(row.count for row in fast_demo.by_model) == 300


async def test_demo_leaves_nothing_unfinished_in_the_queue(fast_demo: DemoSummary) -> None:
    async with Queue.from_url(fast_demo.url, maintenance_interval_s=None) as queue:
        stats = await queue.stats()

    assert stats.depth == stats.in_flight == stats.delayed == 0


def test_demo_critical_jobs_wait_less_than_bulk_jobs_under_the_backlog(fast_demo: DemoSummary) -> None:
    critical, bulk = fast_demo.level(Priority.CRITICAL), fast_demo.level(Priority.BULK)

    assert fast_demo.peak_backlog >= 100  # the batch arrived at once: a backlog formed
    assert critical.succeeded and bulk.succeeded
    assert critical.wait_p99_ms is not None and bulk.wait_p99_ms is not None
    assert critical.wait_p99_ms < bulk.wait_p99_ms


def test_demo_costs_are_positive_and_add_up(fast_demo: DemoSummary) -> None:
    answered = [record for record in fast_demo.records if record.state is JobState.SUCCEEDED]

    assert fast_demo.total_cost_usd > 0
    assert all(record.cost_micros > 0 for record in answered)
    # Exact Decimal sums: per model and per level, the parts make the whole.
    assert sum(row.cost_usd for row in fast_demo.by_model) == fast_demo.total_cost_usd
    assert sum(row.cost_usd for row in fast_demo.by_priority) == fast_demo.total_cost_usd
    assert {row.label for row in fast_demo.by_model} >= {"claude-sonnet-4.5", "text-embedding-3-small"}


def test_demo_retries_failed_calls_and_dead_letters_invalid_requests(fast_demo: DemoSummary) -> None:
    dead = [record for record in fast_demo.records if record.state is JobState.DEAD]

    assert fast_demo.retries() >= 1
    assert any("temperature" in (record.error or "") for record in dead)
    assert all(record.model is None and record.cost_micros == 0 for record in dead)


def test_demo_command_prints_every_priority(tmp_path: Path) -> None:
    result = runner.invoke(app, ["demo", "--queue", _url(tmp_path), "--jobs", "200", "--no-live"])

    assert result.exit_code == 0, result.output
    for priority in Priority:
        assert priority.name.lower() in result.output
    assert "critical jobs waited" in result.output
    assert "text-embedding-3-small" in result.output


def test_demo_refuses_a_queue_that_is_not_empty(tmp_path: Path) -> None:
    url = _url(tmp_path)

    async def enqueue_one() -> None:
        async with Queue.from_url(url, maintenance_interval_s=None) as queue:
            await queue.enqueue({"someone": "else"})

    asyncio.run(enqueue_one())
    result = runner.invoke(app, ["demo", "--queue", url, "--jobs", "10", "--no-live"])

    assert result.exit_code == 2
    assert "needs an empty queue" in result.output
    assert "Traceback" not in result.output


def test_queue_commands_after_a_demo(tmp_path: Path) -> None:
    url = _url(tmp_path)
    demo = runner.invoke(app, ["demo", "--queue", url, "--jobs", "200", "--no-live"])
    assert demo.exit_code == 0, demo.output

    stats = runner.invoke(app, ["queue", "stats", "--queue", url])
    # Wide enough that rich does not fold the error text across lines.
    dlq = runner.invoke(app, ["queue", "dlq", "--queue", url], env={"COLUMNS": "300"})
    redrive = runner.invoke(app, ["queue", "redrive", "--all", "--queue", url])
    after = runner.invoke(app, ["queue", "dlq", "--queue", url])

    assert stats.exit_code == 0, stats.output
    for priority in Priority:
        assert priority.name.lower() in stats.output
    assert dlq.exit_code == 0, dlq.output
    # The demo's invalid request: refused by the provider with a 400, dead at once.
    assert "Invalid 'temperature'" in dlq.output
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
