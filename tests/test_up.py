"""`tidegate up`: one process serving the OpenAI-compatible API on the embedded queue with the
simulated provider, reachable with the admin key it printed."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import openai

from tidegate.config import TidegateConfig
from tidegate.up import UpInfo, UpSettings, run_up


async def test_up_serves_the_sdk_with_the_admin_key_it_created(tmp_path: Path) -> None:
    config = TidegateConfig(queue_url=f"sqlite:///{tmp_path}/tidegate.db")
    stop = asyncio.Event()
    ready: asyncio.Future[UpInfo] = asyncio.get_running_loop().create_future()
    running = asyncio.create_task(run_up(config, UpSettings(port=0), on_ready=ready.set_result, stop=stop))
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
