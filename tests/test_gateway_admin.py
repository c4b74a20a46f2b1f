"""The admin API, the operations endpoints, embedded mode without keys, the bind check and the
OpenAPI document, on both queue backends."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

import pytest
from typer.testing import CliRunner

from conftest import QueueFactory
from support.gateway import CHAT, add_tenants, open_gateway
from tidegate.app.gateway import check_bind
from tidegate.cli.main import app as cli
from tidegate.errors import ConfigError
from tidegate.gateway.core.settings import GatewaySettings
from tidegate.jobs import JobState
from tidegate.simulator.server import InjectedFault

ADMIN_ROUTES = [
    ("GET", "/v1/stats"), ("GET", "/v1/dlq"), ("POST", "/v1/dlq/redrive"), ("DELETE", "/v1/dlq"),
    ("GET", "/v1/admin/tenants"), ("GET", "/v1/admin/tenants/acme"), ("PUT", "/v1/admin/tenants/x"),
    ("POST", "/v1/admin/tenants/acme/keys"), ("GET", "/v1/admin/keys"), ("DELETE", "/v1/admin/keys/abc"),
    ("GET", "/v1/admin/provider-batches"),
]


async def test_the_admin_api_is_for_admin_tenants_only(queue_factory: QueueFactory) -> None:
    async with open_gateway(queue_factory, worker=False) as gw:
        for method, path in ADMIN_ROUTES:
            answer = await gw.http.request(method, path, headers=gw.auth("acme"), json={"all": True})

            assert answer.status_code == 403, (method, path)
            assert answer.json()["error"]["code"] == "admin_only"


async def test_stats_show_the_queue_and_recent_jobs(queue_factory: QueueFactory) -> None:
    async with open_gateway(queue_factory) as gw:
        for model in ("gpt-4.1", "deepseek-v3.2", "deepseek-v3.2"):
            answer = await gw.http.post("/v1/chat/completions", json={**CHAT, "model": model},
                                        headers=gw.auth("acme"))
            assert answer.status_code == 200

        stats = (await gw.http.get("/v1/stats", headers=gw.auth("ops"))).json()

        assert set(stats["levels"]) == {"critical", "high", "normal", "low", "bulk"}
        assert stats["throughput_last_minute"] == 3
        assert stats["queue_wait_ms"]["count"] == stats["upstream_latency_ms"]["count"] == 3
        assert stats["upstream_latency_ms"]["p50"] <= stats["upstream_latency_ms"]["p99"]
        assert set(stats["spend_today_by_model_usd"]) == {"gpt-4.1", "deepseek-v3.2"}
        assert all(Decimal(usd) > 0 for usd in stats["spend_today_by_model_usd"].values())
        assert stats["spend_today_usd"] == {}  # no budget configured: the workers keep no ledger


async def test_dead_letters_are_listed_redriven_and_purged(queue_factory: QueueFactory) -> None:
    async with open_gateway(queue_factory) as gw:
        ops = gw.auth("ops")
        # Given two jobs killed by a client error from the provider
        gw.sim.inject("gpt-4.1", InjectedFault("status", status=400, message="nope", times=2))
        ids = (await gw.http.post("/v1/jobs", headers=gw.auth("acme"), json={"jobs": [
            {"kind": "chat", "body": {**CHAT, "model": "gpt-4.1"}}] * 2})).json()["ids"]
        for job_id in ids:
            await gw.queue.wait(job_id, 10)

        listed = (await gw.http.get("/v1/dlq", params={"limit": 10}, headers=ops)).json()
        assert sorted(view["id"] for view in listed["data"]) == sorted(ids)
        assert "nope" in listed["data"][0]["last_error"]

        # When one is redriven and the other purged
        refused = await gw.http.post("/v1/dlq/redrive", json={}, headers=ops)
        redriven = await gw.http.post("/v1/dlq/redrive", json={"ids": [ids[0]]}, headers=ops)
        ambiguous = await gw.http.delete("/v1/dlq", params={"all": "true", "older_than_s": 1}, headers=ops)
        purged = await gw.http.delete("/v1/dlq", params={"ids": [ids[1]]}, headers=ops)

        # Then the first succeeds on its second life and the second is gone
        assert refused.status_code == ambiguous.status_code == 400
        assert redriven.json() == {"redriven": 1} and purged.json() == {"purged": 1}
        assert (await gw.queue.wait(ids[0], 10)).state is JobState.SUCCEEDED
        assert (await gw.http.get("/v1/dlq", headers=ops)).json()["data"] == []


async def test_tenants_and_keys_are_managed_through_the_admin_api(queue_factory: QueueFactory) -> None:
    async with open_gateway(queue_factory, worker=False) as gw:
        ops = gw.auth("ops")
        put = await gw.http.put("/v1/admin/tenants/initech", headers=ops, json={
            "max_priority": "normal", "default_priority": "low", "rpm": 60,
            "daily_budget_usd": "2.50", "allowed_models": ["deepseek-v3.2"]})
        bad = await gw.http.put("/v1/admin/tenants/initech", headers=ops,
                                json={"max_priority": "low", "default_priority": "high"})
        created = await gw.http.post("/v1/admin/tenants/initech/keys", headers=ops)
        no_tenant = await gw.http.post("/v1/admin/tenants/nobody/keys", headers=ops)

        assert put.status_code == 200 and put.json()["max_priority"] == "normal"
        assert bad.status_code == 400
        assert created.status_code == 201 and no_tenant.status_code == 404
        new_key = created.json()["api_key"]
        key_id = created.json()["key_id"]
        assert (await gw.http.get("/v1/admin/tenants/initech", headers=ops)).json()["rpm"] == 60
        names = [t["name"] for t in (await gw.http.get("/v1/admin/tenants", headers=ops)).json()]
        assert "initech" in names and "acme" in names
        listed = (await gw.http.get("/v1/admin/keys", params={"tenant": "initech"}, headers=ops)).json()
        assert [key["key_id"] for key in listed] == [key_id] and "api_key" not in listed[0]

        as_initech = {"Authorization": f"Bearer {new_key}"}
        models = (await gw.http.get("/v1/models", headers=as_initech)).json()
        assert [model["id"] for model in models["data"]] == ["deepseek-v3.2"]

        revoked = await gw.http.delete(f"/v1/admin/keys/{key_id}", headers=ops)
        again = await gw.http.delete(f"/v1/admin/keys/{key_id}", headers=ops)
        assert revoked.status_code == 204 and again.status_code == 404
        assert (await gw.http.get("/v1/models", headers=as_initech)).status_code == 401


async def test_metrics_health_and_readiness(queue_factory: QueueFactory) -> None:
    async with open_gateway(queue_factory) as gw:
        await gw.http.post("/v1/chat/completions", json=CHAT, headers=gw.auth("acme"))
        await gw.http.get("/v1/jobs/nope", headers=gw.auth("acme"))

        metrics = await gw.http.get("/metrics")
        health = await gw.http.get("/healthz")
        ready = await gw.http.get("/readyz")
        await gw.queue.close()  # the queue goes away under the gateway
        not_ready = await gw.http.get("/readyz")

        text = metrics.text
        assert metrics.headers["content-type"].startswith("text/plain")
        assert ('tidegate_gateway_requests_total{method="POST",route="/v1/chat/completions",status="200"} 1.0'
                in text)
        assert 'route="/v1/jobs/{job_id}",status="404"' in text
        assert "tidegate_gateway_request_seconds_bucket" in text
        assert 'tidegate_jobs_total{model="' in text  # the in-process worker's registry
        assert health.status_code == 200 and ready.status_code == 200
        assert not_ready.status_code == 503


async def test_embedded_mode_serves_without_a_key_until_one_exists(queue_factory: QueueFactory) -> None:
    async with open_gateway(queue_factory, worker=False, tenants=False) as gw:
        served = await gw.http.post("/v1/jobs", json={"kind": "chat", "body": CHAT, "priority": "critical"})
        with_any_key = await gw.http.get("/v1/stats", headers={"Authorization": "Bearer sk-anything"})
        assert served.status_code == 202 and with_any_key.status_code == 200
        job = await gw.queue.get(served.json()["ids"][0])
        assert job is not None and job.tenant == "local"

        await add_tenants(gw.state.tenants)

        assert (await gw.http.post("/v1/jobs", json={"kind": "chat", "body": CHAT})).status_code == 401


async def test_a_gateway_beyond_loopback_needs_a_key(queue_factory: QueueFactory) -> None:
    async with open_gateway(queue_factory, worker=False, tenants=False,
                            settings=GatewaySettings(host="0.0.0.0")) as gw:
        # Refused at start-up while no key exists, and never served without a key meanwhile
        with pytest.raises(ConfigError, match="without any API key"):
            await check_bind(gw.state)
        assert (await gw.http.get("/v1/models")).status_code == 401

        await add_tenants(gw.state.tenants)

        await check_bind(gw.state)


def test_the_gateway_command_refuses_a_public_bind_without_keys(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["gateway", "--queue", f"sqlite:///{tmp_path / 'q.db'}",
                                      "--host", "0.0.0.0", "--port", "0"])

    assert result.exit_code == 2
    assert "without any API key" in result.output


async def test_the_openapi_document_describes_the_api(queue_factory: QueueFactory) -> None:
    async with open_gateway(queue_factory, worker=False) as gw:
        spec = (await gw.http.get("/openapi.json")).json()

        paths = spec["paths"]
        for path in ("/v1/chat/completions", "/v1/embeddings", "/v1/models", "/v1/responses",
                     "/v1/responses/{response_id}", "/v1/responses/input_tokens", "/v1/responses/compact",
                     "/v1/messages",
                     "/v1/messages/count_tokens", "/v1/files",
                     "/v1/batches", "/v1/jobs", "/v1/jobs/{job_id}", "/v1/stats", "/v1/dlq",
                     "/v1/dlq/redrive", "/v1/admin/tenants/{name}/keys", "/v1/admin/provider-batches",
                     "/metrics", "/healthz", "/readyz"):
            assert path in paths, path
        chat = paths["/v1/chat/completions"]["post"]
        assert chat["tags"] == ["OpenAI-compatible"]
        assert {"400", "401", "403", "429", "504"} <= set(chat["responses"])
        assert "ErrorResponse" in spec["components"]["schemas"]
        headers = {parameter["name"] for parameter in chat["parameters"]}
        assert headers >= {"X-Priority", "X-Tidegate-Timeout", "Idempotency-Key"}
        assert "examples" in spec["components"]["schemas"]["ChatCompletionRequest"]
        tags = {tag["name"] for tag in spec["tags"]}
        assert tags == {"OpenAI-compatible", "Responses", "Anthropic Messages", "Files", "Batches", "Jobs",
                        "Recommendations", "Admin", "Operations"}
