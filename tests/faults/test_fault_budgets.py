"""Budgets under `tidegate up` (the default `defer` mode), through its HTTP API and the official
SDK: a job that cannot fit the whole daily budget ends dead with its reason in bounded time, and
a tenant with a $0 budget is told so at once — a 429 naming the budget, not a 504 after the
full timeout."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import openai

from support.faults import tidegate, up_ready
from support.waiting import eventually

BOUND_S = 10.0  # the gateway's own wait is 60 s: an answer within this came from the budget


async def _tenant_key(
    http: httpx.AsyncClient, api_url: str, admin_key: str, name: str, budget_usd: str
) -> str:
    admin = {"Authorization": f"Bearer {admin_key}"}
    put = await http.put(f"{api_url}/admin/tenants/{name}", headers=admin,
                         json={"daily_budget_usd": budget_usd, "max_priority": "high"})
    assert put.status_code == 200, put.text
    created = await http.post(f"{api_url}/admin/tenants/{name}/keys", headers=admin)
    assert created.status_code == 201, created.text
    return str(created.json()["api_key"])


async def test_budget_refusals_end_with_their_reason_in_bounded_time(tmp_path: Path) -> None:
    async with tidegate("up", "--port", "0", "--no-change-flow", cwd=tmp_path) as process, \
            httpx.AsyncClient(timeout=30) as http:
        up = await up_ready(process)
        broke = await _tenant_key(http, up.api_url, up.admin_key, "broke", "0")
        small = await _tenant_key(http, up.api_url, up.admin_key, "small", "0.01")

        # A $0 tenant's synchronous call: a 429 naming the budget, the SDK not retrying it
        client = openai.AsyncOpenAI(base_url=up.api_url, api_key=broke)
        started = time.monotonic()
        try:
            await client.chat.completions.create(
                model="auto", messages=[{"role": "user", "content": "hello"}])
            raise AssertionError("a $0 budget served a call")
        except openai.RateLimitError as exc:
            refused = exc
        finally:
            await client.close()
        assert time.monotonic() - started < BOUND_S
        assert refused.code == "budget_exceeds_limit"
        assert "budget" in refused.message
        assert refused.response.headers["x-should-retry"] == "false"

        # A job estimated above the whole $0.01 budget: dead with its reason, not deferred forever
        submitted = await http.post(
            f"{up.api_url}/jobs", headers={"Authorization": f"Bearer {small}"},
            json={"kind": "chat", "body": {"model": "gpt-4.1", "max_tokens": 100_000,
                                           "messages": [{"role": "user", "content": "a long essay"}]}})
        assert submitted.status_code == 202, submitted.text
        [job_id] = submitted.json()["ids"]
        auth = {"Authorization": f"Bearer {small}"}

        async def job_view() -> dict[str, Any]:
            return dict((await http.get(f"{up.api_url}/jobs/{job_id}", headers=auth)).json())

        view = await eventually(job_view, "the job leaves the queue", timeout_s=BOUND_S, every_s=0.05,
                                until=lambda view: view["state"] not in ("queued", "leased"))
    assert view["state"] == "dead", view
    assert view["failure"]["code"] == "budget_exceeds_limit"
    assert "whole tenant 'small' daily budget" in view["last_error"]
    assert view["attempts"] == 1 and view["retry_at"] is None
