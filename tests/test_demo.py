"""The demo behind `make demo`: `tidegate up` plus a load generator through the HTTP API, and a
summary that accounts for every request it sent."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
from decimal import Decimal
from pathlib import Path

import pytest

from tidegate.demo.load import DENIED_MODEL
from tidegate.demo.run import DemoSettings, DemoSummary, run_demo
from tidegate.demo.stats import Snapshot
from tidegate.demo.view import accounting
from tidegate.jobs import Priority

# A short run: a few seconds of load at a small rate, the simulator's latencies cut to a fifth.
SHORT = DemoSettings(duration_s=4.0, rate_per_s=12.0, latency_scale=0.2, refresh_s=0.2)


@pytest.fixture(scope="module")
def short_demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[DemoSummary, list[Snapshot]]:
    """One short demo run in-process, shared by the tests that read its summary, with the live
    snapshots it produced."""
    snapshots: list[Snapshot] = []
    summary = asyncio.run(run_demo(SHORT, folder=tmp_path_factory.mktemp("demo"),
                                   on_snapshot=snapshots.append))
    return summary, snapshots


def test_every_request_sent_has_one_final_outcome(short_demo: tuple[DemoSummary, list[Snapshot]]) -> None:
    summary, _ = short_demo

    assert summary.total_sent > 0
    assert summary.lost == 0
    assert sorted(o.number for o in summary.outcomes) == list(range(1, summary.total_sent + 1))
    assert sum(summary.sent.values()) == sum(row.count for row in summary.by_priority)
    for priority in Priority:
        assert summary.sent.get(priority, 0) == summary.level(priority).count
    assert summary.answered + sum(summary.errors.values()) == summary.total_sent
    assert "Nothing lost." in accounting(summary)


def test_every_priority_is_sent_and_answered(short_demo: tuple[DemoSummary, list[Snapshot]]) -> None:
    summary, _ = short_demo

    for priority in Priority:
        row = summary.level(priority)
        assert row.answered >= 1, f"{priority.name} had no answered request"
        assert row.wait_p50_ms is not None and row.e2e_p50_ms is not None


def test_calls_streams_embeddings_and_async_jobs_are_answered(
    short_demo: tuple[DemoSummary, list[Snapshot]],
) -> None:
    summary, _ = short_demo
    answered = {o.mode for o in summary.outcomes if o.ok}
    models = {row.label for row in summary.by_model}

    assert answered == {"sync", "stream", "async"}
    assert summary.batches >= 1
    assert "text-embedding-3-small" in models
    assert "claude-sonnet-4.5" in models  # critical calls' tier


def test_a_model_the_tenant_may_not_use_is_refused_with_403(
    short_demo: tuple[DemoSummary, list[Snapshot]],
) -> None:
    summary, _ = short_demo
    refused = [o for o in summary.outcomes if o.result == "403"]

    assert refused
    assert all(o.tenant == "umbrella" and o.model is None and o.cost_usd == 0 for o in refused)
    assert all(f"model {DENIED_MODEL!r} is not allowed" in (o.error or "") for o in refused)
    assert summary.level(Priority.NORMAL).errors.get("403") == len(refused)


def test_costs_are_positive_and_add_up(short_demo: tuple[DemoSummary, list[Snapshot]]) -> None:
    summary, _ = short_demo

    assert all(o.cost_usd > 0 for o in summary.outcomes if o.ok)
    assert summary.total_cost_usd > 0
    assert sum((row.cost_usd for row in summary.by_model), Decimal(0)) == summary.total_cost_usd
    assert sum((row.cost_usd for row in summary.by_priority), Decimal(0)) == summary.total_cost_usd


def test_the_queue_numbers_come_from_the_gateway_and_end_empty(
    short_demo: tuple[DemoSummary, list[Snapshot]],
) -> None:
    summary, snapshots = short_demo

    assert snapshots, "no live snapshot was taken"
    assert set(Priority) == {row.priority for row in snapshots[-1].rows}
    assert snapshots[-1].outstanding == 0
    assert set(summary.gateway.depth) == set(Priority)
    assert sum(summary.gateway.depth.values()) == summary.gateway.in_flight == 0
    assert summary.gateway.budget is not None and summary.gateway.budget.tenant == "initech"
    assert summary.dashboard_url.startswith("http://127.0.0.1:")


def test_demo_command_runs_to_its_summary_and_exits_0(tmp_path: Path) -> None:
    # Given the shop `tidegate up` follows, in the same folder
    up_shop = tmp_path / ".tidegate" / "shop.db"
    up_shop.parent.mkdir()
    up_shop.write_bytes(b"the shop of tidegate up")
    # No terminal: the live view degrades to progress lines and the summary.
    env = {**os.environ, "COLUMNS": "200"}
    done = subprocess.run(
        [sys.executable, "-m", "tidegate", "demo", "--duration", "3", "--rate", "8", "--no-live"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180, check=False,
    )

    assert done.returncode == 0, done.stdout + done.stderr
    assert "Nothing lost." in done.stdout
    for priority in Priority:
        assert priority.name.lower() in done.stdout
    assert "/dashboard" in done.stdout
    assert "tg_" in done.stdout  # the admin key, to open the dashboard with
    assert re.search(r"/dashboard#key=tg_[0-9a-f]{12}_\S+", done.stdout)  # or a link that carries it
    assert (tmp_path / ".tidegate" / "demo.db").exists()
    assert "Traceback" not in done.stderr
    # The demo wrote to a shop of its own and left up's as it was
    assert (tmp_path / ".tidegate" / "demo-shop.db").exists()
    assert "demo-shop.db" in done.stdout
    assert up_shop.read_bytes() == b"the shop of tidegate up"
