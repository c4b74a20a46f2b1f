"""GET /dashboard in a real headless Chromium (Debian's `chromium`, driven by Playwright): the page
fills its tables from the admin API with the numbers the API gives, redrives a dead letter with a
click, and asks for an admin key when the gateway is not in embedded mode. Its recommendations
panel shows a user's top items with their reasons and the change flow's commit → updated
latency, and follows an interaction as soon as it is recorded. Its provider-batches panel lists
what the worker sent to the simulator's own batch API, with its jobs' progress.

The gateway runs as in `tidegate up`: one process with a worker and the simulated provider. The
browser tests run on SQLite and on Redis, where the API's numbers come from another backend's
stats, ledger and dead-letter queue. The worker serves critical, high and normal only, so low and
bulk jobs stay queued and the page has depths to show.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.async_api import Browser, Page, async_playwright, expect

from conftest import QueueFactory
from support.dispatch import queue_url_of, running_worker, sim_config
from support.gateway import CHAT, Gateway, add_tenants, serving
from support.provider_batches import bulk_jobs, gateway_sending_batches, waiting_in_a_batch
from support.waiting import eventually
from tidegate.app.components import Given
from tidegate.app.gateway import open_gateway_state
from tidegate.config import BudgetConfig
from tidegate.coord.relay import relay_for
from tidegate.dispatch.metrics import DispatchMetrics
from tidegate.dispatch.worker import WorkerSettings
from tidegate.jobs import JobState, Priority
from tidegate.recs.monitor import RecsMonitor
from tidegate.recs.sink import RecsSink
from tidegate.simulator.server import InjectedFault, Simulator
from tidegate.simulator.settings import SimulatorSettings
from tidegate.sync.cache import cache_for
from tidegate.sync.changes import Change, Op, Version

CHROMIUM = Path("/usr/bin/chromium")
# No sandbox: tests may run as root in a container, where Chromium's sandbox cannot start. The rest
# keeps Chromium from reaching for the network (there is none) and from doing work the test does
# not need.
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
SERVED = (Priority.CRITICAL, Priority.HIGH, Priority.NORMAL)
PRIORITY_NAMES = ["critical", "high", "normal", "low", "bulk"]
UI_TIMEOUT_MS = 10_000

# Only the browser tests need it; how the page is served is tested without one.
needs_chromium = pytest.mark.skipif(
    not CHROMIUM.exists(),
    reason="Debian's chromium is not installed at /usr/bin/chromium (`make test` installs it: "
    "`apt-get install chromium`)",
)


# ---------------------------------------------------------------------- fixtures


@contextlib.asynccontextmanager
async def gateway_with_worker(
    factory: QueueFactory, *, tenants: bool, budgets: BudgetConfig
) -> AsyncIterator[Gateway]:
    """A gateway on the factory's queue with the simulator and an in-process worker for SERVED
    priorities, whose DispatchMetrics the gateway reads, as under `tidegate up`."""
    fast = {"maintenance_interval_s": 0.2, "retry_base_s": 0.02, "retry_max_s": 0.05}
    sim = Simulator(SimulatorSettings(seed=3, window_s=1.0))
    async with contextlib.AsyncExitStack() as stack:
        sim_url = await stack.enter_async_context(sim.running())
        config = sim_config(sim_url, queue_url=queue_url_of(factory), budgets=budgets)
        relay = relay_for(config.queue_url)
        stack.push_async_callback(relay.close)
        # On SQLite the relay lives in process memory, so the worker must publish on the gateway's;
        # on Redis the worker has its own, as a worker process would.
        worker_relay = relay if factory.backend == "sqlite" else relay_for(config.queue_url)
        if worker_relay is not relay:
            stack.push_async_callback(worker_relay.close)
        metrics = DispatchMetrics()
        state = await stack.enter_async_context(open_gateway_state(
            config, given=Given(queue=await factory.open(**fast), relay=relay),
            extra_registries=[metrics.registry]))
        keys = await add_tenants(state.tenants) if tenants else {}
        await stack.enter_async_context(running_worker(
            await factory.open(**fast), config,
            WorkerSettings(priorities=tuple(int(p) for p in SERVED), concurrency=8, lease_s=5.0,
                           claim_wait_s=0.1),
            relay=worker_relay, metrics=metrics, tenants=state.tenants))
        url = await stack.enter_async_context(serving(state))
        http = await stack.enter_async_context(httpx.AsyncClient(base_url=url, timeout=20.0))
        yield Gateway(state, url, http, sim, keys, metrics)


@pytest.fixture
async def browser() -> AsyncIterator[Browser]:
    """Headless Debian Chromium. Playwright's own browser downloads are never used."""
    async with async_playwright() as playwright:
        chromium = await playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            yield chromium
        finally:
            await chromium.close()


@dataclass
class Opened:
    """A page, the script errors it raised and the requests it made (URL, Authorization)."""

    page: Page
    errors: list[str] = field(default_factory=list)
    requests: list[tuple[str, str | None]] = field(default_factory=list)


async def open_page(browser: Browser, url: str) -> Opened:
    """`url` in a new 1280x800 page, watched from before its first request."""
    opened = Opened(await browser.new_page(viewport={"width": 1280, "height": 800}))
    opened.page.set_default_timeout(UI_TIMEOUT_MS)
    opened.page.on("pageerror", lambda exc: opened.errors.append(str(exc)))
    opened.page.on("request", lambda r: opened.requests.append((r.url, r.headers.get("authorization"))))
    await opened.page.goto(url)
    return opened


# ---------------------------------------------------------------------- traffic


async def chat(gw: Gateway, priority: str, model: str, headers: dict[str, str] | None = None) -> None:
    """One synchronous completion: the gateway hands out the result, so its stats count it."""
    answer = await gw.http.post("/v1/chat/completions", headers={**(headers or {}), "X-Priority": priority},
                                json={**CHAT, "model": model})
    assert answer.status_code == 200, answer.text


async def enqueue(gw: Gateway, priority: str, model: str = "deepseek-v3.2",
                  headers: dict[str, str] | None = None) -> str:
    """One asynchronous job; returns its id."""
    answer = await gw.http.post("/v1/jobs", headers=headers, json={
        "kind": "chat", "priority": priority, "body": {**CHAT, "model": model}})
    assert answer.status_code == 202, answer.text
    ids: list[str] = answer.json()["ids"]
    return ids[0]


async def until_dead(gw: Gateway, job_ids: list[str]) -> None:
    """Until every job is in the dead-letter queue."""
    jobs = await asyncio.gather(*(gw.queue.wait(job_id, 10) for job_id in job_ids))
    assert [job.state for job in jobs] == [JobState.DEAD] * len(job_ids)


# ---------------------------------------------------------------------- reading the page


async def cell(page: Page, row: str, col: str) -> str:
    """The visible text of one table cell."""
    return (await page.locator(f'{row} td[data-col="{col}"]').inner_text()).strip()


_DURATION = re.compile(r"^(?P<value>\d+(?:\.(?P<decimals>\d+))?) (?P<unit>ms|s)$")


def assert_shows_ms(text: str, expected_ms: float | None) -> None:
    """The page shows `expected_ms`, rounded as displayed (e.g. "12 ms", "3.4 ms", "1.25 s")."""
    if expected_ms is None:
        assert text == "—"
        return
    match = _DURATION.match(text)
    assert match is not None, f"not a duration: {text!r}"
    scale = 1000.0 if match["unit"] == "s" else 1.0
    half_step = 0.5 * 10 ** -len(match["decimals"] or "") * scale
    assert abs(float(match["value"]) * scale - expected_ms) <= half_step + 1e-9, (text, expected_ms)


def usd_text(amount: str | Decimal) -> str:
    """How the page writes money: four decimals."""
    return f"${Decimal(amount).quantize(Decimal('0.0001'))}"


async def admin_json(gw: Gateway, path: str, headers: dict[str, str] | None = None) -> Any:
    """The API's JSON answer to GET `path`, which must succeed."""
    answer = await gw.http.get(path, headers=headers)
    assert answer.status_code == 200, answer.text
    return answer.json()


# ---------------------------------------------------------------------- tests


@pytest.mark.sqlite_only  # how the page is served does not depend on the backend
async def test_the_page_is_served_self_contained_and_outside_the_api_schema(
    queue_factory: QueueFactory,
) -> None:
    async with gateway_with_worker(queue_factory, tenants=True, budgets=BudgetConfig()) as gw:
        page = await gw.http.get("/dashboard")  # no key: the page holds no data, the API does
        script = await gw.http.get("/dashboard/dashboard.js")
        style = await gw.http.get("/dashboard/dashboard.css")
        other = await gw.http.get("/dashboard/dashboard.py")
        schema = (await gw.http.get("/openapi.json")).json()

        assert page.status_code == script.status_code == style.status_code == 200
        assert page.headers["content-type"].startswith("text/html")
        assert script.headers["content-type"].startswith("text/javascript")
        assert style.headers["content-type"].startswith("text/css")
        assert other.status_code == 404
        policy = page.headers["content-security-policy"]
        assert "default-src 'none'" in policy and "connect-src 'self'" in policy
        assert "frame-ancestors 'none'" in policy
        # Nothing is loaded from elsewhere: the machine running it may have no internet. (The SVG
        # namespace is a name, never fetched.)
        for text in (page.text, script.text, style.text):
            text = text.replace("http://www.w3.org/2000/svg", "")
            assert "http://" not in text and "https://" not in text
        assert not any(path.startswith("/dashboard") for path in schema["paths"])


@needs_chromium
async def test_the_dashboard_shows_the_queue_and_redrives_a_dead_letter(
    queue_factory: QueueFactory, tmp_path: Path, browser: Browser
) -> None:
    budgets = BudgetConfig(default_tenant_daily_usd=Decimal("1.00"), global_daily_usd=Decimal("5.00"))
    async with gateway_with_worker(queue_factory, tenants=False, budgets=budgets) as gw:
        # Given succeeded jobs at three priorities, a 429 on gpt-4.1 (retried, then served),
        # two dead letters (a 400 from the provider) and low and bulk jobs no worker takes
        gw.sim.inject("gpt-4.1", InjectedFault("status", status=429, times=1))
        gw.sim.inject("claude-sonnet-4.5", InjectedFault("status", status=400, message="bad input", times=2))
        await asyncio.gather(
            *(chat(gw, "critical", "deepseek-v3.2") for _ in range(2)),
            *(chat(gw, "high", "gemini-2.5-flash") for _ in range(3)),
            *(chat(gw, "normal", "deepseek-v3.2") for _ in range(3)),
            chat(gw, "normal", "gpt-4.1"),
        )
        dead = [await enqueue(gw, priority, "claude-sonnet-4.5") for priority in ("high", "critical")]
        await until_dead(gw, dead)
        for priority, count in (("low", 2), ("bulk", 3)):
            for _ in range(count):
                await enqueue(gw, priority)

        # When the page is opened (embedded mode: no key asked)
        opened = await open_page(browser, f"{gw.url}/dashboard")
        page = opened.page
        await expect(page.locator("#levels tbody tr")).to_have_count(5)
        await expect(page.locator("#dlq tbody tr")).to_have_count(2)
        stats = await admin_json(gw, "/v1/stats")
        listed = (await admin_json(gw, "/v1/dlq"))["data"]

        # Then each priority row shows the API's numbers
        assert await page.locator("#login").is_hidden()
        assert await page.locator("#mode").inner_text() == "embedded mode"
        for name in PRIORITY_NAMES:
            row = f'#levels tr[data-priority="{name}"]'
            level = stats["levels"][name]
            assert await cell(page, row, "depth") == str(level["depth"]), name
            assert await cell(page, row, "in-flight") == str(level["in_flight"]), name
            assert_shows_ms(await cell(page, row, "wait-p50"), level["queue_wait_ms"]["p50"])
            assert_shows_ms(await cell(page, row, "wait-p99"), level["queue_wait_ms"]["p99"])
            assert await cell(page, row, "jobs-seen") == str(level["queue_wait_ms"]["count"]), name
        counts = {name: stats["levels"][name]["queue_wait_ms"]["count"] for name in PRIORITY_NAMES}
        assert counts == {"critical": 2, "high": 3, "normal": 4, "low": 0, "bulk": 0}
        assert (stats["levels"]["low"]["depth"], stats["levels"]["bulk"]["depth"]) == (2, 3)
        assert await page.locator("#kpi-depth").inner_text() == "5"
        assert await page.locator("#kpi-dead").inner_text() == "2"

        # ... the models' 429s, outcomes and spend, and the tenant's spend against its budget
        by_model = stats["dispatch_by_model"]
        assert by_model["gpt-4.1"]["throttled_429"] == 1
        for model, view in by_model.items():
            row = f'#models tr[data-model="{model}"]'
            limit = view.get("concurrency_limit")  # shown as "in flight / limit" once known
            expected = f"{view['in_flight']} / {limit}" if limit else str(view["in_flight"])
            assert await cell(page, row, "in-flight") == expected, model
            assert await cell(page, row, "throttled") == str(view["throttled_429"]), model
            assert await cell(page, row, "succeeded") == str(view["jobs"].get("succeeded", 0)), model
        for model, usd in stats["spend_today_by_model_usd"].items():
            assert await cell(page, f'#models tr[data-model="{model}"]', "spend") == usd_text(usd)
        local = stats["budgets_today"]["local"]
        assert Decimal(local["daily_budget_usd"]) == Decimal("1.00") and Decimal(local["spent_usd"]) > 0
        assert await cell(page, '#tenants tr[data-tenant="local"]', "spent") == usd_text(local["spent_usd"])
        assert await cell(page, '#tenants tr[data-tenant="local"]', "budget") == "$1.0000"
        assert await cell(page, '#tenants tr[data-tenant="*"]', "budget") == "$5.0000"

        # ... and the dead letters as the API lists them
        assert sorted(view["id"] for view in listed) == sorted(dead)
        for view in listed:
            row = f'#dlq tr[data-job-id="{view["id"]}"]'
            assert await cell(page, row, "priority") == view["priority"]
            assert await cell(page, row, "tenant") == "local"
            assert await cell(page, row, "attempts") == f'{view["attempts"]} / {view["max_attempts"]}'
            assert await cell(page, row, "last-error") == view["last_error"]
            assert "bad input" in view["last_error"]
        assert re.fullmatch(r"updated \d+ s ago", await page.locator("#updated").inner_text())
        await page.screenshot(path=tmp_path / "dashboard.png", full_page=True)
        assert (tmp_path / "dashboard.png").stat().st_size > 10_000

        # When one dead letter is redriven with its button
        redriven = dead[0]
        await page.locator(f'#dlq tr[data-job-id="{redriven}"] button').click()

        # Then it leaves the table and the dead-letter queue, and (the fault used up) succeeds
        await expect(page.locator(f'#dlq tr[data-job-id="{redriven}"]')).to_have_count(0)
        await expect(page.locator("#dlq tbody tr")).to_have_count(1)
        remaining = (await admin_json(gw, "/v1/dlq"))["data"]
        assert [view["id"] for view in remaining] == [dead[1]]
        assert (await gw.queue.wait(redriven, 10)).state is JobState.SUCCEEDED

        # When "Redrive all" is clicked, then confirmed with a second click
        await page.click("#redrive-all")
        await expect(page.locator("#redrive-all")).to_have_text("Confirm: redrive 1")
        await page.click("#redrive-all")

        # Then the table empties, as the dead-letter queue does
        await expect(page.locator("#dlq-empty")).to_be_visible()
        assert (await admin_json(gw, "/v1/dlq"))["data"] == []
        assert (await gw.queue.wait(dead[1], 10)).state is JobState.SUCCEEDED

        # When the gateway can no longer answer, the banner says so and the last data stays
        await gw.queue.close()
        await expect(page.locator("#banner")).to_contain_text("Polling failed: HTTP 503")
        await expect(page.locator("#status-dot")).to_have_class(re.compile(r"\berror\b"))
        assert await page.locator("#main").is_visible()
        assert opened.errors == []


@needs_chromium
async def test_without_embedded_mode_the_page_asks_for_an_admin_key(
    queue_factory: QueueFactory, browser: Browser
) -> None:
    budgets = BudgetConfig(tenant_daily_usd={"globex": Decimal("0")}, on_exhausted="reject")
    async with gateway_with_worker(queue_factory, tenants=True, budgets=budgets) as gw:
        # Given a served job and one refused by a budget of 0, on a gateway with tenants and keys
        await chat(gw, "high", "deepseek-v3.2", headers=gw.auth("acme"))
        refused = await enqueue(gw, "normal", headers=gw.auth("globex"))
        await until_dead(gw, [refused])

        # When the page is opened, it asks for a key and shows no data
        opened = await open_page(browser, f"{gw.url}/dashboard")
        page = opened.page
        await expect(page.locator("#login")).to_be_visible()
        assert await page.locator("#main").is_hidden()
        assert await page.locator("#banner").is_hidden()

        # A wrong key and a tenant's (not an admin's) key are refused with the error banner
        for key, reason in (("sk-wrong", "The key was refused"),
                            (gw.keys["acme"], "may not use the admin API")):
            await page.fill("#key-input", key)
            await page.click("#key-submit")
            await expect(page.locator("#banner")).to_contain_text(reason)
            await expect(page.locator("#login")).to_be_visible()
            assert await page.locator("#main").is_hidden()

        # The admin key shows the data, and the banner goes
        await page.fill("#key-input", gw.keys["ops"])
        await page.click("#key-submit")
        await expect(page.locator(f'#dlq tr[data-job-id="{refused}"]')).to_have_count(1)
        await expect(page.locator("#banner")).to_be_hidden()
        await expect(page.locator("#levels tbody tr")).to_have_count(5)
        row = f'#dlq tr[data-job-id="{refused}"]'
        assert await cell(page, row, "tenant") == "globex"
        assert "daily budget" in await cell(page, row, "last-error")
        stats = await admin_json(gw, "/v1/stats", headers=gw.auth("ops"))
        assert await cell(page, '#tenants tr[data-tenant="globex"]', "budget") == "$0.0000"
        acme = stats["budgets_today"]["acme"]
        assert await cell(page, '#tenants tr[data-tenant="acme"]', "spent") == usd_text(acme["spent_usd"])
        assert await page.locator("#mode").inner_text() == "admin key"

        # The key lives in the tab's sessionStorage and travels in a header, never in a URL
        assert await page.evaluate("sessionStorage.getItem('tidegate.adminKey')") == gw.keys["ops"]
        api_calls = [(url, auth) for url, auth in opened.requests if "/v1/" in url]
        assert api_calls and all(gw.keys["ops"] not in url for url, _ in opened.requests)
        assert f"Bearer {gw.keys['ops']}" in {auth for _, auth in api_calls}
        assert opened.errors == []


@needs_chromium
@pytest.mark.sqlite_only  # the key is the page's own business, whatever the queue's backend
async def test_the_page_opens_with_the_key_in_its_address_and_takes_it_out(
    queue_factory: QueueFactory, browser: Browser
) -> None:
    async with gateway_with_worker(queue_factory, tenants=True, budgets=BudgetConfig()) as gw:
        key = gw.keys["ops"]
        assert key.startswith("tg_")

        # When the page is opened with the admin key in its fragment
        opened = await open_page(browser, f"{gw.url}/dashboard#key={key}")
        page = opened.page

        # Then it shows the data without asking, as with a typed key, and no address holds the key:
        # not the one in the address bar, nor any request's (a fragment is never sent)
        await expect(page.locator("#levels tbody tr")).to_have_count(5)
        assert await page.locator("#login").is_hidden()
        assert await page.locator("#mode").inner_text() == "admin key"
        assert page.url == f"{gw.url}/dashboard"
        assert await page.evaluate("sessionStorage.getItem('tidegate.adminKey')") == key
        assert all(key not in url for url, _ in opened.requests)
        assert f"Bearer {key}" in {auth for url, auth in opened.requests if "/v1/" in url}
        assert opened.errors == []


@needs_chromium
@pytest.mark.sqlite_only
async def test_a_wrong_key_in_the_address_asks_for_one_and_a_pasted_key_is_taken(
    queue_factory: QueueFactory, browser: Browser
) -> None:
    async with gateway_with_worker(queue_factory, tenants=True, budgets=BudgetConfig()) as gw:
        # When the page is opened with a key the gateway refuses
        opened = await open_page(browser, f"{gw.url}/dashboard#key=tg_000000000000_wrong")
        page = opened.page

        # Then it says so and asks for the key, whose field shows what a tidegate key looks like
        await expect(page.locator("#banner")).to_contain_text("The key was refused")
        await expect(page.locator("#login")).to_be_visible()
        assert await page.get_attribute("#key-input", "placeholder") == "tg_…"
        assert "#" not in page.url

        # When the right key is then given in the address of the open page (no reload)
        await page.evaluate(f"window.location.hash = 'key={gw.keys['ops']}'")

        # Then the data shows and the address is clean again
        await expect(page.locator("#levels tbody tr")).to_have_count(5)
        await expect(page.locator("#login")).to_be_hidden()
        assert "#" not in page.url
        assert opened.errors == []


# ---------------------------------------------------------------------- recommendations


SHOP = [("mug-red", "Red enamel mug", "kitchen", 6.5), ("mug-blue", "Blue enamel mug", "kitchen", 6.0),
        ("mug-tall", "Tall enamel mug", "kitchen", 8.0), ("teapot", "Enamel teapot", "kitchen", 18.0),
        ("pot-clay", "Clay garden pot", "garden", 4.0), ("pot-zinc", "Zinc garden planter", "garden", 12.0),
        ("candle", "Vanilla candle", "lighting", 2.0)]
CLICKS = [("ada", "mug-red", "purchase"), ("ada", "teapot", "view"), ("ada", "pot-clay", "purchase"),
          ("ben", "candle", "view")]


async def _through_the_change_flow(sink: RecsSink) -> None:
    """The shop's products and a few interactions, as committed changes through a memory entity
    cache into the recommender's sink (which measures their commit → updated latency)."""
    changes = []
    for lsn, (ident, name, category, price) in enumerate(SHOP, start=1):
        changes.append(Change.of_row(
            entity_type="products", op=Op.INSERT, key_columns=("id",), version=Version(lsn, 0),
            commit_time=datetime.now(UTC), captured_at=time.time(),
            after={"id": ident, "name": name, "description": f"{name}.", "price": price, "stock": 10,
                   "categories": f'["{category}"]', "embeddings": None}))
    for number, (user, item, kind) in enumerate(CLICKS, start=100):
        changes.append(Change.of_row(
            entity_type="interactions", op=Op.INSERT, key_columns=("id",), version=Version(number, 0),
            commit_time=datetime.now(UTC), captured_at=time.time(),
            after={"id": number, "user_id": user, "product_id": item, "kind": kind, "quantity": 1,
                   "created_at": datetime.now(UTC).isoformat()}))
    async with cache_for("memory://") as cache:
        await sink.apply(await cache.apply(changes))


def _pair(text: str) -> tuple[str, str]:
    """The two durations of a "p50 / p99" tile; "2.7 / 4.5 ms" shares its unit."""
    left, _, right = text.partition(" / ")
    if right.endswith(" ms") and not left.endswith("s"):
        left += " ms"
    return left, right


async def _listed(page: Page) -> list[str]:
    return [text.strip() for text in await page.locator('#recs-list td[data-col="item"]').all_inner_texts()]


@needs_chromium
@pytest.mark.sqlite_only  # the panel reads the recommendations API, whatever the queue's backend
async def test_the_recommendations_panel_follows_a_users_interactions(
    queue_factory: QueueFactory, browser: Browser
) -> None:
    monitor = RecsMonitor()
    async with open_gateway_state(sim_config("http://127.0.0.1:9/v1", queue_url=queue_url_of(queue_factory)),
                                 given=Given(queue=await queue_factory.open()), recs_url="memory://",
                                 recs_monitor=monitor) as state, \
            serving(state) as url, httpx.AsyncClient(base_url=url, timeout=20.0) as http:
        # Given a shop fed through the change flow: ada is the most active user
        assert state.recommender is not None
        await _through_the_change_flow(RecsSink(state.recommender, monitor=monitor))
        health = (await http.get("/v1/health")).json()
        assert health["most_active_user"] == "ada" and health["commit_to_updated"]["count"] == 11

        async def top(user: str) -> list[str]:
            answer = await http.get(f"/v1/recommendations/{user}", params={"n": 10, "explain": "true"})
            assert answer.status_code == 200, answer.text
            return [item["item_id"] for item in answer.json()["items"]]

        # When the dashboard is opened
        opened = await open_page(browser, f"{url}/dashboard")
        page = opened.page

        # Then the panel shows the most active user's top items, with reasons, and the latency
        await expect(page.locator("#recs-user")).to_have_value("ada")
        ada = await top("ada")
        await expect(page.locator('#recs-list td[data-col="item"]')).to_have_text(ada)
        reasons = await page.locator('#recs-list td[data-col="reason"]').all_inner_texts()
        assert len(reasons) == len(ada) and all(reason.strip() not in ("", "—") for reason in reasons)
        assert "mug-red" not in ada and "pot-clay" not in ada  # bought: never recommended again
        p50, p99 = health["commit_to_updated"]["p50_ms"], health["commit_to_updated"]["p99_ms"]
        shown_p50, shown_p99 = _pair(await page.locator("#recs-latency").inner_text())
        assert_shows_ms(shown_p50, p50)
        assert_shows_ms(shown_p99, p99)
        assert await page.locator("#recs-size").inner_text() == "7 / 2"

        # When another user is chosen in the text box
        await page.fill("#recs-user", "ben")
        await page.click("#recs-show")
        ben = await top("ben")
        await expect(page.locator('#recs-list td[data-col="item"]')).to_have_text(ben)
        await expect(page.locator("#recs-status")).to_contain_text("for user ben")

        # And that user buys their top item through the API
        bought = ben[0]
        answer = await http.post("/v1/profiles/ben/interactions",
                                 json={"item_id": bought, "kind": "purchase"})
        assert answer.status_code == 200, answer.text

        # Then the list changes on its own: the item bought leaves it, the rest follow the API
        after = await top("ben")
        assert after != ben and bought not in after
        await expect(page.locator('#recs-list td[data-col="item"]')).to_have_text(after)
        assert bought not in await _listed(page)
        assert opened.errors == []


@needs_chromium
@pytest.mark.sqlite_only
async def test_the_recommendations_panel_says_when_the_gateway_has_no_recommender(
    queue_factory: QueueFactory, browser: Browser
) -> None:
    async with gateway_with_worker(queue_factory, tenants=False, budgets=BudgetConfig()) as gw:
        opened = await open_page(browser, f"{gw.url}/dashboard")

        await expect(opened.page.locator("#recs-status")).to_contain_text("not available on this gateway")
        await expect(opened.page.locator("#levels tbody tr")).to_have_count(5)  # the rest is unaffected
        assert await opened.page.locator("#recs-list tbody tr").count() == 0
        assert opened.errors == []


# ---------------------------------------------------------------------- batches


async def create_batch(gw: Gateway, lines: int, priority: str | None = None) -> dict[str, Any]:
    """A chat batch of `lines` requests, uploaded and created through the HTTP API."""
    content = "".join(
        f'{{"custom_id": "r{n}", "method": "POST", "url": "/v1/chat/completions", '
        f'"body": {{"model": "deepseek-v3.2", "messages": [{{"role": "user", "content": "hi {n}"}}]}}}}\n'
        for n in range(lines))
    uploaded = await gw.http.post("/v1/files", data={"purpose": "batch"},
                                  files={"file": ("batch.jsonl", content.encode())})
    assert uploaded.status_code == 200, uploaded.text
    body: dict[str, Any] = {"input_file_id": uploaded.json()["id"], "endpoint": "/v1/chat/completions",
                            "completion_window": "24h"}
    if priority is not None:
        body["priority"] = priority
    created = await gw.http.post("/v1/batches", json=body)
    assert created.status_code == 200, created.text
    batch: dict[str, Any] = created.json()
    return batch


@needs_chromium
@pytest.mark.sqlite_only  # the panel reads the Batch API, whatever the queue's backend
async def test_the_batches_panel_lists_batches_with_their_status_and_counts(
    queue_factory: QueueFactory, browser: Browser
) -> None:
    async with gateway_with_worker(queue_factory, tenants=False, budgets=BudgetConfig()) as gw:
        # Given a batch at bulk, which no worker here serves, and one at high, which completes
        waiting = await create_batch(gw, 3)
        served = await create_batch(gw, 2, priority="high")
        await eventually(lambda: admin_json(gw, f"/v1/batches/{served['id']}"), "the high batch completes",
                         until=lambda batch: batch["status"] == "completed")

        # When the page is opened
        opened = await open_page(browser, f"{gw.url}/dashboard")
        page = opened.page
        await expect(page.locator("#batches tbody tr")).to_have_count(2)
        done = f'#batches tr[data-batch-id="{served["id"]}"]'
        await expect(page.locator(f'{done} td[data-col="status"]')).to_have_text("completed")

        # Then each row shows the API's status, priority and counts
        for batch in (await admin_json(gw, "/v1/batches"))["data"]:
            row = f'#batches tr[data-batch-id="{batch["id"]}"]'
            assert await cell(page, row, "status") == batch["status"]
            assert await cell(page, row, "priority") == batch["priority"]
            for col in ("completed", "failed", "total"):
                assert await cell(page, row, col) == str(batch["request_counts"][col])
        row = f'#batches tr[data-batch-id="{waiting["id"]}"]'
        assert (await cell(page, row, "status"), await cell(page, row, "priority")) == ("in_progress", "bulk")
        assert await cell(page, row, "total") == "3"
        assert await cell(page, done, "completed") == "2"
        assert await page.locator("#batches-empty").is_hidden()
        assert opened.errors == []


# ---------------------------------------------------------------------- provider batches


@needs_chromium
async def test_the_provider_batches_panel_lists_a_provider_batch_with_its_counts(
    queue_factory: QueueFactory, browser: Browser
) -> None:
    async with gateway_sending_batches(queue_factory, batch_latency_s=1.5, tenants=False) as gw:
        # Given BULK jobs with a two days' deadline in a provider batch, one of them cancelled
        ids = await bulk_jobs(gw.queue, 3)
        await waiting_in_a_batch(gw.queue, ids)
        assert await gw.queue.cancel(ids[0])
        jobs = await asyncio.gather(*(gw.queue.wait(job_id, 20) for job_id in ids))
        assert [job.state for job in jobs] == [JobState.CANCELLED, JobState.SUCCEEDED, JobState.SUCCEEDED]
        [batch] = (await admin_json(gw, "/v1/admin/provider-batches"))["data"]

        # When the page is opened
        opened = await open_page(browser, f"{gw.url}/dashboard")
        page = opened.page
        row = f'#provider-batches tr[data-provider-batch-id="{batch["id"]}"]'
        await expect(page.locator("#provider-batches tbody tr")).to_have_count(1)

        # Then its row shows the batch and what became of its jobs, as the API counts them
        assert (await cell(page, row, "provider"), await cell(page, row, "model")) == ("sim", batch["model"])
        assert await page.locator(f'{row} td[data-col="batch"]').get_attribute("title") == batch["batch_id"]
        assert batch["progress"] == {"sampled": 3, "waiting": 0, "collected": 2, "served_live": 0,
                                     "cancelled": 1, "other": 0}
        assert await cell(page, row, "lines") == "3"
        for col in ("waiting", "collected", "served_live", "cancelled"):
            assert await cell(page, row, col) == str(batch["progress"][col])
        assert await page.locator("#provider-batches-empty").is_hidden()
        assert opened.errors == []


@needs_chromium
@pytest.mark.sqlite_only  # no store is read
async def test_the_provider_batches_panel_says_when_no_provider_has_a_batch_section(
    queue_factory: QueueFactory, browser: Browser
) -> None:
    async with gateway_with_worker(queue_factory, tenants=False, budgets=BudgetConfig()) as gw:
        opened = await open_page(browser, f"{gw.url}/dashboard")

        page = opened.page
        await expect(page.locator("#provider-batches-empty")).to_contain_text("No provider has a batch")
        assert await page.locator("#provider-batches tbody tr").count() == 0
        assert opened.errors == []
