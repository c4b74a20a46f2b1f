"""How the demo looks: the live view (redrawn with rich.live while it runs) and the final summary,
tables and a paragraph that reads them in plain words."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from rich import box
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from tidegate.demo_stats import DemoSummary, GroupRow, Snapshot
from tidegate.jobs import Priority
from tidegate.queue.base import redact_url

__all__ = ["LiveView", "reading", "render_summary", "snapshot_view"]

_STYLE = {
    Priority.CRITICAL: "bold red",
    Priority.HIGH: "yellow",
    Priority.NORMAL: "green",
    Priority.LOW: "cyan",
    Priority.BULK: "blue",
}


_TIMES = ("wait\np50", "wait\np99", "latency\np50", "latency\np99")


# ---------------------------------------------------------------------- live


class LiveView:
    """The live view on a console; `update` redraws it with a new snapshot. Does nothing when
    `enabled` is False, so a caller need not care whether it is shown."""

    def __init__(self, console: Console, *, enabled: bool = True) -> None:
        self.console = console
        self.enabled = enabled
        self._live: Live | None = None

    @contextmanager
    def showing(self) -> Iterator[LiveView]:
        """Show the view for the block; the last frame stays on screen."""
        if not self.enabled:
            yield self
            return
        # Redrawn on each update (several times a second), not on rich's own timer.
        with Live(Text("starting the simulated provider and the worker..."), console=self.console,
                  auto_refresh=False, transient=False) as live:
            self._live = live
            try:
                yield self
            finally:
                self._live = None

    def update(self, snapshot: Snapshot) -> None:
        """Redraw with `snapshot`."""
        if self._live is not None:
            self._live.update(snapshot_view(snapshot), refresh=True)


def snapshot_view(snapshot: Snapshot) -> RenderableType:
    """One frame of the live view."""
    table = _table(None, "priority", "done", "queued", "jobs/s", *_TIMES, "retries", "dead")
    for row in snapshot.rows:
        table.add_row(
            Text(row.priority.name.lower(), style=_STYLE[row.priority]),
            f"{row.done:,}", f"{row.queued:,}", f"{row.per_s:,.0f}",
            _ms(row.wait_p50_ms), _ms(row.wait_p99_ms), _ms(row.latency_p50_ms),
            _ms(row.latency_p99_ms), f"{row.retries:,}", f"{row.dead:,}",
        )
    return Group(_headline(snapshot), table, _spend(snapshot), _footer(snapshot))


def _table(title: str | None, *columns: str) -> Table:
    # Narrow enough for an 80-column terminal.
    table = Table(title=title, title_justify="left", title_style="bold", box=box.SIMPLE_HEAD,
                  padding=(0, 1), pad_edge=False, show_edge=False, collapse_padding=True)
    table.add_column(columns[0], no_wrap=True)
    for column in columns[1:]:
        table.add_column(column, justify="right", no_wrap=True)
    return table


def _headline(snapshot: Snapshot) -> Text:
    text = Text.assemble(("tidegate demo", "bold"), f"  {snapshot.elapsed_s:5.1f} s  ")
    if snapshot.phase in ("drain", "batch"):
        text.append(snapshot.phase, style="bold")
        text.append(": no new jobs")
    else:
        over = snapshot.arrival_per_s > snapshot.served_per_s * 1.1
        text.append(snapshot.phase, style="bold magenta" if over else "bold")
        text.append(f": {snapshot.arrival_per_s:,.0f} jobs/s arriving")
    text.append(f", {snapshot.served_per_s:,.0f}/s served\n")
    text.append(f"queued {snapshot.backlog:,}", style="bold" if snapshot.backlog else "")
    text.append(f"   in flight {sum(row.running for row in snapshot.rows):,}"
                f"   parked (paced or retrying) {snapshot.delayed:,}")
    # Waits above count jobs once claimed; the backlog's own wait shows here while it grows.
    oldest = [f"{row.priority.name.lower()} {_ms(row.oldest_wait_ms)}"
              for row in snapshot.rows if row.queued]
    if oldest:
        text.append(f"\noldest queued job, waiting: {', '.join(oldest)}")
    return text


def _spend(snapshot: Snapshot) -> Table:
    table = _table(None, "model", "answered", "spend USD")
    spend = sorted(snapshot.spend_by_model.items(), key=lambda item: -item[1])
    for model, usd in spend:
        table.add_row(model, f"{snapshot.answered_by_model.get(model, 0):,}", f"{usd:.4f}")
    table.add_section()
    table.add_row("all", f"{sum(snapshot.answered_by_model.values()):,}",
                  f"{sum(usd for _, usd in spend):.4f}")
    return table


def _footer(snapshot: Snapshot) -> Text:
    budget = snapshot.budget
    text = Text(f"pacing: jobs parked {snapshot.paced:,} times under a model's requests-per-minute "
                f"limit   429s from the provider: {snapshot.throttled:,}\n")
    text.append(f"budget: {budget.tenant} has spent ${budget.spent_usd:.4f} of "
                f"${budget.limit_usd:.4f} today; ")
    text.append(f"{budget.stepped_down:,} of its jobs stepped down to cheaper models",
                style="bold" if budget.stepped_down else "")
    if budget.refused:
        text.append(f", {budget.refused:,} refused")
    return text


# ---------------------------------------------------------------------- the summary


def render_summary(summary: DemoSummary, console: Console) -> None:
    """Print the final tables, the reading and where to look next."""
    levels = _table("By priority", "priority", "jobs", "dead", "retries", *_TIMES, "cost USD")
    for row in summary.by_priority:
        levels.add_row(Text(row.label, style=_STYLE[Priority.parse(row.label)]), f"{row.count:,}",
                       f"{row.dead:,}", f"{row.retries:,}", *_times(row), f"{row.cost_usd:.4f}")
    console.print(levels)
    console.print()
    models = _table("By model", "model", "jobs", *_TIMES, "cost USD")
    for row in summary.by_model:
        models.add_row(row.label, f"{row.count:,}", *_times(row), f"{row.cost_usd:.4f}")
    models.add_section()
    models.add_row("all", f"{summary.jobs:,}", "", "", "", "", f"{summary.total_cost_usd:.4f}")
    console.print(models)
    console.print()
    console.print(f"{summary.jobs:,} jobs in {summary.elapsed_s:.1f} s "
                  f"({summary.throughput_per_s:,.0f} jobs/s), one worker of {summary.concurrency} "
                  f"concurrent calls, peak backlog {summary.peak_backlog:,}. Wait: from claimable to "
                  "claimed; latency: the provider call.", highlight=False)
    console.print()
    console.print(reading(summary), highlight=False)
    console.print()
    console.print(f"Look inside: tidegate queue stats --queue {redact_url(summary.url)}  "
                  "(and queue dlq, queue redrive)", highlight=False)


def _times(row: GroupRow) -> tuple[str, str, str, str]:
    return (_ms(row.wait_p50_ms), _ms(row.wait_p99_ms), _ms(row.latency_p50_ms),
            _ms(row.latency_p99_ms))


def reading(summary: DemoSummary) -> str:
    """The summary in plain words: one paragraph."""
    critical, bulk = summary.level(Priority.CRITICAL), summary.level(Priority.BULK)
    load = ("arrivals ran well over what the worker could serve for part of the run"
            if summary.timed else f"all {summary.jobs:,} jobs arrived at once")
    sentences = [
        f"While {load}, up to {summary.peak_backlog:,} jobs waited in the queue, yet critical "
        f"jobs waited {_ms(critical.wait_p99_ms)} at p99 while bulk jobs waited "
        f"{_ms(bulk.wait_p99_ms)}: the queue hands out the highest priority first, so the backlog "
        "piled up at the bottom.",
        _latency_sentence(summary),
        _failure_sentence(summary),
        _money_sentence(summary),
    ]
    return " ".join(sentence for sentence in sentences if sentence)


def _latency_sentence(summary: DemoSummary) -> str:
    answered = [row for row in summary.by_model if row.latency_p50_ms is not None]
    if not answered:
        return ""
    fastest = min(answered, key=lambda row: row.latency_p50_ms or 0.0)
    slowest = max(answered, key=lambda row: row.latency_p50_ms or 0.0)
    return (f"Upstream latency is the provider's own and depends on the model, not the priority "
            f"(p50 from {_ms(fastest.latency_p50_ms)} for {fastest.label} to "
            f"{_ms(slowest.latency_p50_ms)} for {slowest.label}).")


def _failure_sentence(summary: DemoSummary) -> str:
    errors = "503s and 429s" if summary.throttled else "503s"
    parts = [f"{_count(summary.retries(), 'attempt')} failed (the provider's {errors}) and "
             f"{'was' if summary.retries() == 1 else 'were'} retried"]
    if summary.paced:
        parts.append(f"jobs were parked {_count(summary.paced, 'time')} rather than sent past a "
                     "model's requests-per-minute limit")
    parts.append(f"the provider answered 429 {_count(summary.throttled, 'time')}" if summary.throttled
                 else "pacing kept the provider from ever answering 429")
    sentence = "; ".join(parts) + "."
    causes = [(summary.dead("refused"), "the provider refused as invalid, dead at once since no "
                                        "retry can fix that"),
              (summary.dead("budget"), "refused once their tenant's budget was spent"),
              (summary.dead("other"), "out of attempts")]
    dead = [f"{_count(count, 'request')} {why}" for count, why in causes if count]
    if dead:
        sentence += f" In the dead-letter queue: {'; '.join(dead)}."
    return sentence[0].upper() + sentence[1:]


def _money_sentence(summary: DemoSummary) -> str:
    budget = summary.budget
    top = summary.by_model[0] if summary.by_model else None
    share = (f", {top.cost_usd / summary.total_cost_usd:.0%} of it on {top.label}"
             if top is not None and summary.total_cost_usd > 0 else "")
    sentence = f"The run cost ${summary.total_cost_usd:.4f}{share}."
    if budget.stepped_down:
        sentence += (f" {budget.tenant.capitalize()}'s daily budget of ${budget.limit_usd:.4f} "
                     f"ran low, so {budget.stepped_down:,} of its jobs went to cheaper models "
                     "instead of the ones their priority would get")
        sentence += (f"; then it ran out, and {budget.refused:,} more were refused (critical jobs "
                     "never are)." if budget.refused else ".")
    return sentence


def _count(n: int, noun: str) -> str:
    return f"{n:,} {noun}{'' if n == 1 else 's'}"


def _ms(value: float | None) -> str:
    if value is None:
        return "-"
    if value >= 10_000:
        return f"{value / 1000:,.1f} s"
    if value >= 1000:
        return f"{value / 1000:.2f} s"
    return f"{value:,.0f} ms" if value >= 10 else f"{value:.1f} ms"
