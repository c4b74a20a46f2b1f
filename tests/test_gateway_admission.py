"""What the gateway refuses before anything is queued: malformed input, priorities and models a
tenant is not entitled to, a full queue, a tenant over its rate; on both queue backends."""

from __future__ import annotations

from typing import Any

from conftest import QueueFactory
from support.gateway import CHAT, open_gateway
from tidegate.gateway.core.settings import GatewaySettings
from tidegate.jobs import Priority

SMALL = GatewaySettings(max_body_bytes=4096, max_messages=3, max_batch=2)
JSON = {"Content-Type": "application/json"}
EMBED = '{"kind": "embeddings", "body": {"model": "auto", "input": "a"}}'  # a right job
HI = '{"model": "auto", "messages": [{"role": "user", "content": "hi"}]'  # a right chat body, unclosed


async def test_malformed_requests_get_a_clear_4xx_and_queue_nothing(queue_factory: QueueFactory) -> None:
    one = {"role": "user", "content": "hi"}
    cases: list[tuple[str, str, dict[str, Any], int, str]] = [
        # (path, raw body, extra headers, status, words of the message)
        ("/v1/chat/completions", "{not json", JSON, 400, "not valid JSON"),
        ("/v1/chat/completions", "[1, 2]", JSON, 400, "must be a JSON object"),
        ("/v1/chat/completions", "", JSON, 400, "body is required"),
        ("/v1/chat/completions", '{"messages": "hi"}', JSON, 400, "messages"),
        ("/v1/chat/completions", '{"messages": []}', JSON, 400, "messages"),
        ("/v1/chat/completions", '{"messages": [{"content": "hi"}]}', JSON, 400, "messages.0.role"),
        ("/v1/chat/completions", HI + ', "max_tokens": "9"}',
         JSON, 400, "max_tokens"),
        ("/v1/chat/completions", HI + ', "stream": "yes"}',
         JSON, 400, "stream"),
        ("/v1/chat/completions", HI + ', "priority": "asap"}',
         JSON, 400, "invalid priority"),
        ("/v1/chat/completions", HI + "}",
         {**JSON, "X-Priority": "7"}, 400, "invalid priority"),
        ("/v1/chat/completions", HI + "}",
         {**JSON, "X-Tidegate-Timeout": "soon"}, 400, "X-Tidegate-Timeout"),
        ("/v1/chat/completions", HI + "}",
         {**JSON, "Idempotency-Key": "k" * 300}, 400, "Idempotency-Key"),
        ("/v1/chat/completions",
         '{"model": "auto", "messages": [' + ", ".join([str(one).replace("'", '"')] * 4) + "]}",
         JSON, 400, "over the limit of 3"),
        ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "' + "x" * 5000 + '"}]}',
         JSON, 413, "over the limit of 4096 bytes"),
        ("/v1/chat/completions", '{"model": "text-embedding-3-small", "messages": [{"role": "user"}]}',
         JSON, 400, "serves embeddings"),
        # (the refusal names the first field refused: with a model, the empty input)
        ("/v1/embeddings", '{"model": "auto", "input": []}', JSON, 400, "input"),
        ("/v1/embeddings", '{"input": 5}', JSON, 400, "input"),
        ("/v1/jobs", '{"kind": "fax", "body": {}}', JSON, 400, "kind"),
        ("/v1/jobs", '{"kind": "chat", "body": {"messages": "hi"}}', JSON, 400, "body.messages"),
        ("/v1/jobs", '{"kind": "chat", "body": {"messages": [{"role": "user"}]}, "colour": 1}', JSON, 400,
         "colour"),
        ("/v1/jobs", '{"kind": "chat", "body": {"messages": [{"role": "user"}]}, "timeout_s": -1}', JSON,
         400, "timeout_s"),
        ("/v1/jobs", '{"jobs": []}', JSON, 400, "jobs"),
        ("/v1/jobs", '{"jobs": [' + ", ".join([EMBED] * 3) + "]}",
         JSON, 400, "over the limit of 2"),
        ("/v1/jobs", '{"jobs": [' + EMBED + ', ' + EMBED[:-1] + ', "priority": "now"}]}',
         JSON, 400, "invalid priority"),
    ]
    async with open_gateway(queue_factory, worker=False, settings=SMALL) as gw:
        for path, body, headers, status, words in cases:
            answer = await gw.http.post(path, content=body.encode(), headers={**gw.auth("acme"), **headers})

            assert answer.status_code == status, (path, body[:80], answer.text)
            error = answer.json()["error"]
            assert words in error["message"], (body[:80], error)
            assert error["type"] and error["code"]

        assert await gw.depth() == 0


async def test_a_tenant_asking_above_its_priority_is_refused_not_downgraded(
    queue_factory: QueueFactory,
) -> None:
    async with open_gateway(queue_factory, worker=False) as gw:
        bulk = gw.auth("bulkco")
        refused = [
            await gw.http.post("/v1/chat/completions", json=CHAT, headers={**bulk, "X-Priority": "critical"}),
            await gw.http.post("/v1/chat/completions", json={**CHAT, "priority": 3}, headers=bulk),
            await gw.http.post("/v1/jobs", json={"kind": "chat", "body": CHAT, "priority": "normal"},
                               headers=bulk),
            await gw.http.post("/v1/jobs", json={"kind": "chat", "body": CHAT},
                               headers={**bulk, "X-Priority": "0"}),
        ]
        assert [answer.status_code for answer in refused] == [403] * 4
        assert all(answer.json()["error"]["code"] == "priority_not_allowed" for answer in refused)
        assert await gw.depth() == 0

        # Its own level, and its default, are fine
        accepted = await gw.http.post("/v1/jobs", headers=bulk, json={"jobs": [
            {"kind": "chat", "body": CHAT}, {"kind": "chat", "body": CHAT, "priority": "bulk"}]})
        assert accepted.status_code == 202
        jobs = [await gw.queue.get(job_id) for job_id in accepted.json()["ids"]]
        assert [job.priority for job in jobs if job] == [Priority.BULK, Priority.BULK]


async def test_a_tenants_allowed_models_are_enforced_here_and_passed_to_the_worker(
    queue_factory: QueueFactory,
) -> None:
    async with open_gateway(queue_factory, worker=False) as gw:
        refused = await gw.http.post("/v1/chat/completions", json={**CHAT, "model": "gpt-4.1"},
                                     headers=gw.auth("narrow"))
        accepted = await gw.http.post("/v1/jobs", json={"kind": "chat", "body": {**CHAT, "model": "auto"}},
                                      headers=gw.auth("narrow"))
        unrestricted = await gw.http.post("/v1/jobs", json={"kind": "chat", "body": CHAT},
                                          headers=gw.auth("acme"))

        assert refused.status_code == 403 and refused.json()["error"]["code"] == "model_not_allowed"
        narrow_job = await gw.queue.get(accepted.json()["ids"][0])
        acme_job = await gw.queue.get(unrestricted.json()["ids"][0])
        assert narrow_job is not None and narrow_job.payload["allowed_models"] == ["deepseek-v3.2"]
        assert acme_job is not None and "allowed_models" not in acme_job.payload


async def test_a_full_priority_level_answers_429_with_retry_after(queue_factory: QueueFactory) -> None:
    async with open_gateway(queue_factory, worker=False,
                            queue_settings={"max_depth": {int(Priority.BULK): 1}}) as gw:
        bulk = gw.auth("bulkco")
        first = await gw.http.post("/v1/jobs", json={"kind": "chat", "body": CHAT}, headers=bulk)
        full = await gw.http.post("/v1/jobs", json={"kind": "chat", "body": CHAT}, headers=bulk)
        full_sync = await gw.http.post("/v1/chat/completions", json=CHAT, headers=bulk)
        other_level = await gw.http.post("/v1/jobs", json={"kind": "chat", "body": CHAT},
                                         headers=gw.auth("acme"))

        assert first.status_code == 202 and other_level.status_code == 202
        for answer in (full, full_sync):
            assert answer.status_code == 429
            assert int(answer.headers["Retry-After"]) >= 1
            assert answer.json()["error"]["code"] == "queue_full"
        assert await gw.depth() == 2


async def test_a_tenant_over_its_requests_per_minute_gets_429(queue_factory: QueueFactory) -> None:
    async with open_gateway(queue_factory, worker=False) as gw:
        first = await gw.http.post("/v1/jobs", json={"kind": "chat", "body": CHAT}, headers=gw.auth("slow"))
        second = await gw.http.post("/v1/jobs", json={"kind": "chat", "body": CHAT}, headers=gw.auth("slow"))
        polling = await gw.http.get(f"/v1/jobs/{first.json()['ids'][0]}", headers=gw.auth("slow"))
        others = await gw.http.post("/v1/jobs", json={"kind": "chat", "body": CHAT}, headers=gw.auth("acme"))

        assert first.status_code == 202
        assert second.status_code == 429
        assert 1 <= int(second.headers["Retry-After"]) <= 60
        assert polling.status_code == 200  # reading is not metered
        assert others.status_code == 202  # the limit is the tenant's own
        assert await gw.depth() == 2


async def test_requests_without_a_valid_key_are_refused(queue_factory: QueueFactory) -> None:
    async with open_gateway(queue_factory, worker=False) as gw:
        missing = await gw.http.post("/v1/chat/completions", json=CHAT)
        wrong = await gw.http.post("/v1/chat/completions", json=CHAT,
                                   headers={"Authorization": "Bearer tg_0123456789ab_" + "x" * 43})
        malformed = await gw.http.get("/v1/models", headers={"Authorization": "Basic abc"})
        revoked_key = gw.keys["acme"]
        [key] = await gw.state.tenants.list_keys("acme")
        await gw.state.tenants.revoke_key(key.key_id)
        revoked = await gw.http.get("/v1/models", headers={"Authorization": f"Bearer {revoked_key}"})

        assert [a.status_code for a in (missing, wrong, malformed, revoked)] == [401] * 4
        assert missing.json()["error"]["code"] == "missing_api_key"
        assert wrong.json()["error"]["code"] == "invalid_api_key"
        assert await gw.depth() == 0
