"""`tidegate gateway` stopped with a call still open: it stops accepting, gives the call its
grace, answers it then with a 503 in the API's own shape naming the job, and exits 0 — never
waiting on a call that will not end (here, one whose job no worker takes). The job stays queued
for a worker to serve later."""

from __future__ import annotations

import asyncio
import re
import signal
import time
from pathlib import Path

import httpx
import pytest

from support.faults import MARGIN_S, tidegate
from support.waiting import eventually
from tidegate.queue import Queue


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=lambda sig: sig.name)
async def test_a_stopped_gateway_answers_a_call_that_outlives_its_grace_with_503(
    tmp_path: Path, sig: signal.Signals
) -> None:
    url = f"sqlite:///{tmp_path}/queue.db"
    grace_s = 1
    # The simulated provider's models offered, at a URL nothing calls: no worker runs.
    async with tidegate("gateway", "--queue", url, "--port", "0", "--grace-s", str(grace_s),
                        "--simulator-url", "http://127.0.0.1:9/v1") as gateway:
        await gateway.printed("Uvicorn running on")
        port = re.search(r"Uvicorn running on http://127\.0\.0\.1:(\d+)", gateway.output)
        assert port, gateway.output
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port.group(1)}", timeout=60) as http:
            # Given a synchronous call waiting for a job no worker will take
            call = asyncio.create_task(http.post("/v1/chat/completions", json={
                "model": "auto", "messages": [{"role": "user", "content": "hello"}]}))
            async with Queue.from_url(url, maintenance_interval_s=None) as queue:
                await eventually(queue.stats, "the call's job is queued", until=lambda stats: stats.depth > 0)
            # When the gateway is stopped
            stopped = time.monotonic()
            gateway.send(sig)
            status = await gateway.exited(grace_s + MARGIN_S)
            took_s = time.monotonic() - stopped
            answer = await call
    # Then the call was answered before the grace ran out, in the API's shape: the job goes on
    assert answer.status_code == 503, answer.text
    error = answer.json()["error"]
    assert error["code"] == "gateway_shutting_down" and error["job_id"]
    assert answer.headers["Retry-After"] == "1"
    assert status == 0, gateway.output
    assert took_s < grace_s + MARGIN_S
    async with Queue.from_url(url, maintenance_interval_s=None) as queue:
        stats = await queue.stats()
    assert stats.depth == 1 and stats.in_flight == 0  # the job waits for a worker

