"""Asynchronous jobs over plain HTTP: enqueue, poll, long-poll, cancel, idempotency, tenant
isolation and the synchronous call's timeout, on both queue backends."""

from __future__ import annotations

from decimal import Decimal

from conftest import QueueFactory
from support.gateway import CHAT, open_gateway
from tidegate.config import CallbackConfig
from tidegate.jobs import JobState, Priority


async def test_a_job_is_accepted_then_long_polled_to_its_result(queue_factory: QueueFactory) -> None:
    async with open_gateway(queue_factory) as gw:
        accepted = await gw.http.post("/v1/jobs", headers=gw.auth("acme"), json={
            "kind": "chat", "priority": "low", "timeout_s": 60,
            "body": {**CHAT, "model": "deepseek-v3.2", "stream": True}})
        assert accepted.status_code == 202
        [job_id] = accepted.json()["ids"]

        polled = await gw.http.get(f"/v1/jobs/{job_id}", params={"wait": 10}, headers=gw.auth("acme"))

        assert polled.status_code == 200
        view = polled.json()
        assert (view["state"], view["priority"], view["kind"], view["tenant"]) == (
            "succeeded", "low", "chat", "acme")
        assert view["model"] == "deepseek-v3.2"
        assert view["usage"]["total_tokens"] > 0
        assert Decimal(view["cost_usd"]) > 0
        assert {"queue_wait_ms", "upstream_latency_ms"} <= set(view["timings"])
        assert view["result"]["response"]["choices"][0]["message"]["content"]
        assert view["deadline"] is not None and view["errors"] == []
        job = await gw.queue.get(job_id)
        assert job is not None and "stream" not in job.payload["body"]  # nobody listens to its chunks


async def test_a_batch_is_enqueued_whole_and_an_idempotency_key_repeats_it(
    queue_factory: QueueFactory,
) -> None:
    async with open_gateway(queue_factory, worker=False) as gw:
        batch = {"jobs": [
            {"kind": "embeddings", "body": {"model": "auto", "input": "red shoes"}},
            {"kind": "chat", "body": CHAT, "priority": 1},
            {"kind": "embeddings", "body": {"model": "auto", "input": "blue kettle", "priority": "bulk"}},
        ]}
        first = await gw.http.post("/v1/jobs", json=batch,
                                   headers={**gw.auth("acme"), "Idempotency-Key": "import-7"})
        again = await gw.http.post("/v1/jobs", json=batch,
                                   headers={**gw.auth("acme"), "Idempotency-Key": "import-7"})
        # The same key from another tenant is another tenant's request
        other = await gw.http.post("/v1/jobs", json=batch,
                                   headers={**gw.auth("globex"), "Idempotency-Key": "import-7"})

        assert first.status_code == again.status_code == other.status_code == 202
        ids = first.json()["ids"]
        assert len(set(ids)) == 3 and again.json()["ids"] == ids
        assert not set(other.json()["ids"]) & set(ids)
        assert await gw.depth() == 6
        jobs = [await gw.queue.get(job_id) for job_id in ids]
        assert [job.priority for job in jobs if job] == [Priority.NORMAL, Priority.HIGH, Priority.BULK]


async def test_a_synchronous_call_that_waits_too_long_answers_504_with_the_job_id(
    queue_factory: QueueFactory,
) -> None:
    async with open_gateway(queue_factory, worker=False) as gw:
        answer = await gw.http.post("/v1/chat/completions", json=CHAT,
                                    headers={**gw.auth("acme"), "X-Tidegate-Timeout": "0.2"})

        assert answer.status_code == 504
        job_id = answer.json()["error"]["job_id"]
        assert answer.headers["X-Tidegate-Job-Id"] == job_id
        polled = await gw.http.get(f"/v1/jobs/{job_id}", headers=gw.auth("acme"))
        assert polled.json()["state"] == "queued"  # it goes on: a worker may still serve it


async def test_a_job_is_cancelled_once(queue_factory: QueueFactory) -> None:
    async with open_gateway(queue_factory, worker=False) as gw:
        [job_id] = (await gw.http.post("/v1/jobs", json={"kind": "chat", "body": CHAT},
                                       headers=gw.auth("acme"))).json()["ids"]

        cancelled = await gw.http.delete(f"/v1/jobs/{job_id}", headers=gw.auth("acme"))
        again = await gw.http.delete(f"/v1/jobs/{job_id}", headers=gw.auth("acme"))
        view = await gw.http.get(f"/v1/jobs/{job_id}", params={"wait": 5}, headers=gw.auth("acme"))

        assert cancelled.json() == {"id": job_id, "cancelled": True, "state": "cancelled"}
        assert again.status_code == 200 and again.json()["cancelled"] is False
        assert view.json()["state"] == "cancelled"


async def test_a_tenant_never_sees_or_cancels_another_tenants_job(queue_factory: QueueFactory) -> None:
    async with open_gateway(queue_factory, worker=False) as gw:
        [job_id] = (await gw.http.post("/v1/jobs", json={"kind": "chat", "body": CHAT},
                                       headers=gw.auth("acme"))).json()["ids"]

        seen = await gw.http.get(f"/v1/jobs/{job_id}", headers=gw.auth("globex"))
        cancelled = await gw.http.delete(f"/v1/jobs/{job_id}", headers=gw.auth("globex"))
        unknown = await gw.http.get("/v1/jobs/no-such-job", headers=gw.auth("globex"))
        by_admin = await gw.http.get(f"/v1/jobs/{job_id}", headers=gw.auth("ops"))

        assert seen.status_code == cancelled.status_code == unknown.status_code == 404
        # The same answer as for an unknown id, except for the id itself: nothing to probe
        assert seen.json()["error"]["code"] == unknown.json()["error"]["code"] == "job_not_found"
        job = await gw.queue.get(job_id)
        assert job is not None and job.state is JobState.QUEUED
        assert by_admin.status_code == 200


async def test_a_callback_url_to_a_private_address_is_refused_and_nothing_is_queued(
    queue_factory: QueueFactory,
) -> None:
    async with open_gateway(queue_factory, worker=False) as gw:
        refused = [
            await gw.http.post("/v1/jobs", headers=gw.auth("acme"), json={
                "kind": "chat", "body": CHAT, "callback_url": url})
            for url in ("http://127.0.0.1:9/hook", "http://10.1.2.3/hook", "file:///etc/passwd")
        ]
        batch = await gw.http.post("/v1/jobs", headers=gw.auth("acme"), json={"jobs": [
            {"kind": "chat", "body": CHAT},
            {"kind": "chat", "body": CHAT, "callback_url": "http://[::1]/hook"}]})

        assert [answer.status_code for answer in refused] == [400, 400, 400]
        assert all(answer.json()["error"]["code"] == "callback_refused" for answer in refused)
        assert batch.status_code == 400
        assert await gw.depth() == 0


async def test_a_private_callback_url_is_accepted_when_the_config_allows_it(
    queue_factory: QueueFactory,
) -> None:
    allow_private = {"callbacks": CallbackConfig(allow_private=True)}
    async with open_gateway(queue_factory, worker=False, config_update=allow_private) as gw:
        accepted = await gw.http.post("/v1/jobs", headers=gw.auth("acme"), json={
            "kind": "chat", "body": CHAT, "callback_url": "http://127.0.0.1:9/hook"})

        assert accepted.status_code == 202
        job = await gw.queue.get(accepted.json()["ids"][0])
        assert job is not None and job.callback_url == "http://127.0.0.1:9/hook"
