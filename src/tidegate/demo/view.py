"""How the demo looks: where to look while it runs, the live view (redrawn with rich.live on a
terminal, a progress line now and then otherwise), and the final summary: tables and a paragraph
that reads them in plain words."""

from __future__ import annotations

from collections.abc import Mapping

from rich import box
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from tidegate.app.up import UpInfo
from tidegate.demo.load import PHASES
from tidegate.demo.recs import RecsReading
from tidegate.demo.stats import DemoSummary, GatewayReading, GroupRow, Snapshot
from tidegate.jobs import Priority

__all__ = ["LiveView", "reading", "recs_reading", "render_ready", "render_summary", "snapshot_view"]

PROGRESS_EVERY_S = 10.0  # without a terminal: one progress line this often

_STYLE = {
    Priority.CRITICAL: "bold red",
    Priority.HIGH: "yellow",
    Priority.NORMAL: "green",
    Priority.LOW: "cyan",
    Priority.BULK: "blue",
}
_TIMES = ("wait\np50", "wait\np99", "e2e\np50", "e2e\np99")
MAX_MESSAGE_CHARS = 160  # of an error message quoted in the summary


def render_ready(info: UpInfo, console: Console) -> None:
    """Where everything listens, and the admin key to open the dashboard with."""
    table = Table(show_header=False, box=None, padding=(0, 1))
    table.add_row("Dashboard", info.dashboard_url)
    table.add_row("API (OpenAI base_url)", info.api_url)
    table.add_row("Provider", f"simulated, {info.simulator_url}")
    console.print(table)
    console.print("Admin API key (paste it into the dashboard; valid until the next demo):",
                  highlight=False)
    # On a line of its own and never folded, so it can be copied whole.
    console.print(info.admin_key, soft_wrap=True, highlight=False, markup=False)
    if info.admin_key:
        # The key in the URL's fragment, which the browser never sends: the page keeps it and
        # takes it out of the address bar.
        console.print("Or open the dashboard with it:", highlight=False)
        console.print(f"{info.dashboard_url}#key={info.admin_key}", soft_wrap=True, highlight=False,
                      markup=False)
    console.print()


# ---------------------------------------------------------------------- live


class LiveView:
    """The live view on a console; `update` redraws it with a new snapshot. When not `enabled`
    (no terminal), `update` prints one progress line every PROGRESS_EVERY_S instead."""

    def __init__(self, console: Console, *, enabled: bool = True) -> None:
        self.console = console
        self.enabled = enabled
        self._live: Live | None = None
        self._next_progress_s = PROGRESS_EVERY_S

    def start(self) -> None:
        """Start redrawing (a no-op when not enabled)."""
        if self.enabled and self._live is None:
            # Redrawn on each update, not on rich's own timer; the last frame stays on screen.
            self._live = Live(Text("starting the load..."), console=self.console, auto_refresh=False,
                              transient=False)
            self._live.start()

    def stop(self) -> None:
        """Stop redrawing."""
        if self._live is not None:
            self._live.stop()
            self._live = None

    def update(self, snapshot: Snapshot) -> None:
        """Redraw with `snapshot`, or print a progress line when one is due."""
        if self._live is not None:
            self._live.update(snapshot_view(snapshot), refresh=True)
        elif not self.enabled and snapshot.elapsed_s >= self._next_progress_s:
            self._next_progress_s += PROGRESS_EVERY_S
            self.console.print(_progress(snapshot), highlight=False)


def _progress(snapshot: Snapshot) -> str:
    sent = sum(row.sent for row in snapshot.rows)
    done = sum(row.done for row in snapshot.rows)
    return (f"{snapshot.elapsed_s:5.1f} s  {snapshot.phase}: {sent:,} sent, {done:,} with an outcome, "
            f"{sum(row.queued for row in snapshot.rows):,} in the queue")


def snapshot_view(snapshot: Snapshot) -> RenderableType:
    """One frame of the live view."""
    table = _table(None, "priority", "sent", "done", "queued", *_TIMES, "errors")
    for live in snapshot.rows:
        row = live.row
        table.add_row(
            Text(live.priority.name.lower(), style=_STYLE[live.priority]),
            f"{live.sent:,}", f"{live.done:,}", f"{live.queued:,}", *_times(row), _errors(row.errors),
        )
    parts: list[RenderableType] = [_headline(snapshot), table, _models(snapshot.models),
                                   _footer(snapshot.gateway)]
    if snapshot.recs is not None:
        parts.append(_recs(snapshot.recs))
    return Group(*parts)


def _table(title: str | None, *columns: str) -> Table:
    # Narrow enough for an 80-column terminal; only the errors column may wrap.
    table = Table(title=title, title_justify="left", title_style="bold", box=box.SIMPLE_HEAD,
                  padding=(0, 1), pad_edge=False, show_edge=False, collapse_padding=True)
    table.add_column(columns[0], no_wrap=True)
    for column in columns[1:]:
        table.add_column(column, justify="right", no_wrap=column != "errors")
    return table


def _headline(snapshot: Snapshot) -> Text:
    text = Text.assemble(("tidegate demo", "bold"), f"  {snapshot.elapsed_s:5.1f} s  ")
    if snapshot.phase == "drain":
        text.append("drain", style="bold")
        text.append(": no new requests")
    else:
        over = snapshot.arrival_per_s > snapshot.capacity_per_s
        text.append(snapshot.phase, style="bold magenta" if over else "bold")
        text.append(f": {snapshot.arrival_per_s:,.0f} requests/s arriving")
    text.append(f" (capacity about {snapshot.capacity_per_s:,.0f}/s), "
                f"{snapshot.answered_per_s:,.0f}/s answered\n")
    gateway = snapshot.gateway
    queued = sum(gateway.depth.values())
    text.append(f"queue: {queued:,} waiting", style="bold" if queued else "")
    text.append(f", {gateway.in_flight:,} in flight, {gateway.delayed:,} parked (paced or retrying)"
                f"   requests without an answer yet: {snapshot.outstanding:,}")
    return text


def _models(models: tuple[GroupRow, ...]) -> Table:
    table = _table(None, "model", "answered", "cost USD")
    for row in models:
        table.add_row(row.label, f"{row.answered:,}", f"{row.cost_usd:.4f}")
    table.add_section()
    table.add_row("all", f"{sum(row.answered for row in models):,}",
                  f"{sum(row.cost_usd for row in models):.4f}")
    return table


def _recs(recs: RecsReading) -> RenderableType:
    text = Text("\n")
    text.append("recommendations", style="bold")
    text.append(f": commit → updated p50 {_ms(recs.p50_ms)}, p99 {_ms(recs.p99_ms)} over "
                f"{recs.measured:,} changes; {_count(recs.items)} items, {_count(recs.users)} users; "
                f"shop writes {sum(recs.shop_writes.values()):,}")
    if recs.user is None:
        text.append("\nno demo user: the shop has no interactions yet")
        return text
    state = "cold start: trending" if recs.cold_start else f"changed {recs.changes:,} times"
    text.append(f"\nuser {recs.user}'s top items ({state})")
    if recs.error:
        text.append(f"  (last read failed: {recs.error[:MAX_MESSAGE_CHARS]})", style="red")
    table = Table(box=box.SIMPLE_HEAD, padding=(0, 1), pad_edge=False, show_edge=False, collapse_padding=True)
    table.add_column("#", justify="right", no_wrap=True)
    table.add_column("item", no_wrap=True)
    table.add_column("why")
    for rank, item in enumerate(recs.top, start=1):
        table.add_row(str(rank), f"{item.name} ({item.item_id})", item.reason or "-")
    return Group(text, table) if recs.top else text


def _count(value: int | None) -> str:
    return "-" if value is None else f"{value:,}"


def _footer(gateway: GatewayReading) -> Text:
    text = Text(f"provider: {gateway.retried:,} failed attempts retried by the worker, "
                f"{gateway.throttled:,} answered 429")
    if gateway.budget is not None:
        budget = gateway.budget
        text.append(f"\nbudget: {budget.tenant} has spent ${budget.spent_usd:.4f} of "
                    f"${budget.limit_usd:.4f} today")
    return text


# ---------------------------------------------------------------------- the summary


def render_summary(summary: DemoSummary, console: Console) -> None:
    """Print the final tables, the accounting, the reading and where to look next."""
    levels = _table("By priority", "priority", "sent", "ok", *_TIMES, "errors", "cost USD")
    for row in summary.by_priority:
        priority = Priority.parse(row.label)
        levels.add_row(Text(row.label, style=_STYLE[priority]), f"{summary.sent.get(priority, 0):,}",
                       f"{row.answered:,}", *_times(row), _errors(row.errors), f"{row.cost_usd:.4f}")
    levels.add_section()
    levels.add_row("all", f"{summary.total_sent:,}", f"{summary.answered:,}", "", "", "", "",
                   _errors(summary.errors), f"{summary.total_cost_usd:.4f}")
    console.print(levels)
    console.print()
    models = _table("By model", "model", "answered", *_TIMES, "cost USD")
    for row in summary.by_model:
        models.add_row(row.label, f"{row.answered:,}", *_times(row), f"{row.cost_usd:.4f}")
    console.print(models)
    console.print()
    console.print(accounting(summary), highlight=False)
    console.print()
    console.print(reading(summary), highlight=False)
    console.print()
    if summary.recs is not None:
        console.print(recs_reading(summary.recs), highlight=False)
        console.print()
    console.print(f"Wait: in the queue, from the X-Tidegate-Queue-Wait-Ms header or the job's result. "
                  f"e2e: request to answer as the client saw it (async jobs: accepted to finished). "
                  f"Look inside: tidegate queue stats --queue {summary.queue_url}  (and queue dlq)",
                  highlight=False)


def accounting(summary: DemoSummary) -> str:
    """Every request sent and its outcome, in one sentence: nothing lost, or what was."""
    modes = summary.sent_by_mode
    parts = [f"{modes.get('sync', 0):,} calls", f"{modes.get('stream', 0):,} streamed",
             f"{modes.get('async', 0):,} async jobs in {summary.batches:,} batches"]
    text = (f"Sent {summary.total_sent:,} requests ({', '.join(parts)}) in {summary.load_s:.1f} s; "
            f"after {summary.elapsed_s:.1f} s ")
    errors = summary.errors
    refused = "; ".join(f"{count:,} {result} ({_example(summary, result)})"
                        for result, count in errors.items())
    if summary.lost == 0:
        text += (f"every one has a final outcome: {summary.answered:,} answered, "
                 f"{sum(errors.values()):,} errors{': ' + refused if refused else ''}. Nothing lost.")
    else:
        text += (f"{len(summary.outcomes):,} have a final outcome and {summary.lost:,} DO NOT "
                 f"({summary.answered:,} answered, {sum(errors.values()):,} errors).")
    return text


def _example(summary: DemoSummary, result: str) -> str:
    """The first error message of `result`, for a reader to see what it was."""
    message = next((o.error for o in summary.outcomes if o.result == result and o.error), None)
    if message is None:
        return "no message"
    return message if len(message) <= MAX_MESSAGE_CHARS else message[:MAX_MESSAGE_CHARS - 3] + "..."


def reading(summary: DemoSummary) -> str:
    """The summary in plain words: one paragraph."""
    critical, bulk = summary.level(Priority.CRITICAL), summary.level(Priority.BULK)
    peak = summary.rate_per_s * max(factor for _, factor, _ in PHASES)
    sentences = [
        f"Requests arrived at up to {peak:,.0f}/s against a capacity of about "
        f"{summary.capacity_per_s:,.0f}/s, and up to {summary.peak_backlog:,} jobs waited in the "
        f"queue; yet critical requests waited {_ms(critical.wait_p99_ms)} at p99 while bulk jobs "
        f"waited {_ms(bulk.wait_p99_ms)}: the queue serves the highest priority first, so the "
        "backlog piled up at the bottom.",
        _provider_sentence(summary.gateway),
        _money_sentence(summary),
    ]
    return " ".join(sentence for sentence in sentences if sentence)


_WRITES = {"interaction": "interactions", "demo_user": "clicks of the demo user", "price": "price changes",
           "stock": "restocks", "new_product": "new products", "new_user": "new users",
           "delete_product": "deleted products"}


def recs_reading(recs: RecsReading) -> str:
    """The change flow and the recommender in plain words: what the shop wrote, how fast it
    reached the recommendations, and the demo user's list."""
    writes = recs.shop_writes
    kinds = ", ".join(f"{writes[kind]:,} {label}" for kind, label in _WRITES.items() if writes.get(kind))
    text = (f"The shop's database took {sum(writes.values()):,} writes ({kinds or 'none'}); the change flow "
            f"carried each to the recommender, from the commit to the recommendations updated in "
            f"{_ms(recs.p50_ms)} at p50 and {_ms(recs.p99_ms)} at p99 over {recs.measured:,} changes "
            f"({_count(recs.items)} items, {_count(recs.users)} users).")
    if recs.user is None:
        return text + " The shop had no interactions, so no demo user was followed."
    top = "; ".join(f"{item.name} [{item.item_id}], {item.reason or 'no reason'}"
                    for item in recs.top) or "nothing yet"
    text += (f" User {recs.user}'s top list changed {recs.changes:,} times as it and others clicked, carted "
             f"and bought; it ends with: {top}.")
    if recs.error:
        text += f" (The last read failed: {recs.error[:MAX_MESSAGE_CHARS]}.)"
    return text


def _provider_sentence(gateway: GatewayReading) -> str:
    attempts = f"{gateway.retried:,} provider attempt{'' if gateway.retried == 1 else 's'}"
    sentence = (f"{attempts} failed (503s{' and 429s' if gateway.throttled else ''}) and "
                f"{'was' if gateway.retried == 1 else 'were'} retried by the worker: the callers saw "
                "only a little more latency")
    if not gateway.throttled:
        sentence += ", and pacing under each model's request limit kept the provider from ever answering 429"
    return sentence + "."


def _money_sentence(summary: DemoSummary) -> str:
    top = summary.by_model[0] if summary.by_model else None
    share = (f", {top.cost_usd / summary.total_cost_usd:.0%} of it on {top.label}"
             if top is not None and summary.total_cost_usd > 0 else "")
    sentence = f"The run cost ${summary.total_cost_usd:.4f}{share}."
    budget = summary.gateway.budget
    if budget is not None:
        refused = sum(1 for o in summary.outcomes if o.tenant == budget.tenant and o.result == "429")
        sentence += (f" {budget.tenant.capitalize()} spent ${budget.spent_usd:.4f} of its daily "
                     f"budget of ${budget.limit_usd:.4f}")
        sentence += (f"; once it was spent, {refused:,} of its requests were refused (429)."
                     if refused else ".")
    return sentence


def _times(row: GroupRow) -> tuple[str, str, str, str]:
    return _ms(row.wait_p50_ms), _ms(row.wait_p99_ms), _ms(row.e2e_p50_ms), _ms(row.e2e_p99_ms)


def _errors(errors: Mapping[str, int]) -> str:
    return " ".join(f"{result}:{count:,}" for result, count in errors.items()) or "-"


def _ms(value: float | None) -> str:
    if value is None:
        return "-"
    if value >= 10_000:
        return f"{value / 1000:,.1f} s"
    if value >= 1000:
        return f"{value / 1000:.2f} s"
    return f"{value:,.0f} ms" if value >= 10 else f"{value:.1f} ms"
