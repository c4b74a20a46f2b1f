"""`tidegate up`: one process serving the OpenAI-compatible API on the embedded queue with the
simulated provider, reachable with the admin key it made at its first start and keeps (its
lifecycle as a real process: test_admin_keys.py)."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from pathlib import Path

import httpx
import openai

from support.waiting import eventually
from tidegate.app.up import UP_TENANT, UpInfo, UpSettings, run_up, with_simulator_limits
from tidegate.config import SyncConfig, TidegateConfig
from tidegate.coord.tenants import Tenant, tenant_store_for
from tidegate.demo.embedded import embedded_sync_config
from tidegate.jobs import Priority
from tidegate.simulator.catalogue import with_simulator
from tidegate.simulator.settings import SimulatorSettings


async def test_up_serves_the_sdk_with_the_admin_key_it_created(tmp_path: Path) -> None:
    config = TidegateConfig(queue_url=f"sqlite:///{tmp_path}/tidegate.db",
                            sync=SyncConfig(source_url=f"sqlite:///{tmp_path}/shop.db"))
    stop = asyncio.Event()
    ready: asyncio.Future[UpInfo] = asyncio.get_running_loop().create_future()
    running = asyncio.create_task(run_up(embedded_sync_config(config), UpSettings(port=0),
                                         on_ready=ready.set_result, stop=stop))
    try:
        info = await asyncio.wait_for(asyncio.shield(ready), 20)
        assert info.simulator_url is not None  # no provider configured → the simulator
        client = openai.AsyncOpenAI(base_url=info.api_url, api_key=info.admin_key, max_retries=0)
        answer = await client.chat.completions.create(
            model="auto", messages=[{"role": "user", "content": "hello"}])
        assert answer.choices[0].message.content
        # Keys exist now, so a request without one is refused
        async with httpx.AsyncClient() as http:
            refused = await http.get(f"{info.api_url}/models")
            dashboard = await http.get(info.dashboard_url.replace("/dashboard", "/healthz"))
        assert refused.status_code == 401
        assert dashboard.status_code == 200
        await client.close()
    finally:
        stop.set()
        await asyncio.wait_for(running, 30)


async def _start(config: TidegateConfig) -> tuple[asyncio.Task[None], asyncio.Event, UpInfo]:
    stop = asyncio.Event()
    ready: asyncio.Future[UpInfo] = asyncio.get_running_loop().create_future()
    running = asyncio.create_task(run_up(embedded_sync_config(config), UpSettings(port=0),
                                         on_ready=ready.set_result, stop=stop))
    info = await asyncio.wait_for(asyncio.shield(ready), 20)
    return running, stop, info


async def _status(info: UpInfo, api_key: str | None) -> int:
    async with httpx.AsyncClient() as http:
        answer = await http.get(f"{info.api_url}/models", headers={"Authorization": f"Bearer {api_key}"})
    return answer.status_code


async def test_each_start_serves_with_the_admin_key_of_the_first(tmp_path: Path) -> None:
    config = TidegateConfig(queue_url=f"sqlite:///{tmp_path}/tidegate.db",
                            sync=SyncConfig(source_url=f"sqlite:///{tmp_path}/shop.db"))
    # Given a first start, and admin keys created by hand beside it (for its tenant and another)
    running, stop, first = await _start(config)
    try:
        async with tenant_store_for(config.queue_url) as store:
            await store.put_tenant(Tenant(name="ops", admin=True, max_priority=Priority.CRITICAL))
            _, by_hand = await store.create_key("ops")
            _, up_by_hand = await store.create_key(UP_TENANT)
        assert first.admin_key_origin == "created" and first.admin_key is not None
        assert await _status(first, first.admin_key) == 200
    finally:
        stop.set()
        await asyncio.wait_for(running, 30)

    # When up starts again on the same queue
    running, stop, second = await _start(config)
    try:
        # Then it serves with the same key, and the hand-made ones still work
        assert (second.admin_key_origin, second.admin_key) == ("kept", first.admin_key)
        for key in (first.admin_key, by_hand, up_by_hand):
            assert await _status(second, key) == 200
    finally:
        stop.set()
        await asyncio.wait_for(running, 30)

    async with tenant_store_for(config.queue_url) as store:
        keys = await store.list_keys(UP_TENANT)
    assert [key.revoked_at for key in keys] == [None, None]  # nothing was revoked


def test_the_worker_paces_under_the_limits_the_simulator_enforces() -> None:
    simulator = SimulatorSettings(window_s=10.0, models={"gpt-4.1": {"rpm": 5, "tpm": 900}})
    config = with_simulator_limits(with_simulator(TidegateConfig(queue_url="sqlite:///unused.db"),
                                                  "http://127.0.0.1:1/v1"), simulator)

    found = config.find_model("gpt-4.1")
    other = config.find_model("deepseek-v3.2")
    assert found is not None and other is not None
    assert (found[1].rpm, found[1].tpm, found[1].rate_window_s) == (5, 900, 10.0)
    assert (other[1].rpm, other[1].tpm) == (None, None)  # the simulator limits it by nothing


async def test_up_runs_the_change_flow_on_the_demo_shop(tmp_path: Path) -> None:
    # Given up on a shop that does not exist yet: it creates and seeds the demo shop
    shop = tmp_path / "shop.db"
    config = TidegateConfig(queue_url=f"sqlite:///{tmp_path}/tidegate.db",
                            sync=SyncConfig(source_url=f"sqlite:///{shop}"))
    running, stop, info = await _start(config)
    try:
        assert info.change_source == f"sqlite:///{shop}" and shop.is_file()
        with contextlib.closing(sqlite3.connect(shop)) as conn:
            products = conn.execute("SELECT count(*) FROM products").fetchone()[0]
        # The snapshot's products are new to the cache: each gets one embedding job
        await _until_metric(info, 'tidegate_sync_refresh_jobs_total{entity_type="products"}', products)
        # When one product is renamed and another repriced, in one transaction
        with contextlib.closing(sqlite3.connect(shop)) as conn, conn:
            first, second = [row[0] for row in conn.execute("SELECT id FROM products ORDER BY rowid LIMIT 2")]
            conn.execute("UPDATE products SET name = 'Renamed lamp' WHERE id = ?", (first,))
            conn.execute("UPDATE products SET price = price + 1 WHERE id = ?", (second,))
        # Then both changes reach the cache, and only the rename asks for a new embedding
        await _until_metric(info, 'tidegate_sync_events_total{entity_type="products",op="update"}', 2)
        assert await _metric(info, 'tidegate_sync_refresh_jobs_total{entity_type="products"}') == products + 1
        # ... which the worker sends to the (simulated) provider like any other job
        async with httpx.AsyncClient() as http:
            root = str(info.simulator_url).removesuffix("/v1")

            async def embedded() -> bool:
                stats = (await http.get(f"{root}/_sim/stats")).json()
                received = stats["models"].get("text-embedding-3-small", {}).get("received", 0)
                return bool(received >= products + 1)

            await eventually(embedded, "the worker sent every embedding job", timeout_s=60)
    finally:
        stop.set()
        await asyncio.wait_for(running, 30)


async def _metric(info: UpInfo, sample: str) -> float:
    async with httpx.AsyncClient() as http:
        text = (await http.get(info.metrics_url)).text
    for line in text.splitlines():
        if line.startswith(sample + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


async def _until_metric(info: UpInfo, sample: str, value: float) -> None:
    async def reached() -> bool:
        return await _metric(info, sample) >= value

    await eventually(reached, f"{sample} reaches {value}", timeout_s=30)
