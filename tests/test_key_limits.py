"""A key's own limits inside its tenant's, through the admin API and at the door, on every queue
backend: a setting given is applied or refused with 400, never dropped; the stricter of the
key's and the tenant's wins; a key over its rpm answers 429 with Retry-After while its tenant's
other keys are served; an expired key answers 401."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from conftest import QueueFactory
from support.gateway import CHAT, Gateway, open_gateway

NO_LIMITS = {"rpm": None, "allowed_models": None, "max_priority": None, "expires_at": None}


async def _new_key(gw: Gateway, tenant: str, limits: dict[str, object] | None = None) -> tuple[str, str]:
    """A new key of `tenant` made through the admin API: (key id, key)."""
    created = await gw.http.post(f"/v1/admin/tenants/{tenant}/keys", headers=gw.auth("ops"), json=limits)
    assert created.status_code == 201, created.text
    return created.json()["key_id"], created.json()["api_key"]


def _as(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def test_a_keys_settings_are_applied_or_refused_never_dropped(queue_factory: QueueFactory) -> None:
    async with open_gateway(queue_factory, worker=False) as gw:
        ops = gw.auth("ops")
        limits = {"rpm": 3, "allowed_models": ["deepseek-v3.2"], "max_priority": "low",
                  "expires_at": "2031-01-31T00:00:00Z"}
        key_id, _ = await _new_key(gw, "acme", limits)
        plain_id, _ = await _new_key(gw, "acme")
        before = (await gw.http.get("/v1/admin/keys", headers=ops)).json()

        shown = (await gw.http.get(f"/v1/admin/keys/{key_id}", headers=ops)).json()
        assert shown["limits"] == {**limits, "expires_at": "2031-01-31T00:00:00Z"}
        assert (await gw.http.get(f"/v1/admin/keys/{plain_id}", headers=ops)).json()["limits"] == NO_LIMITS
        for body in ({"tpm": 5}, {"rpm": 0}, {"rpm": "3"}, {"max_priority": "urgent"},
                     {"expires_at": "2031-01-31T00:00:00"}, {"allowed_models": [""]}):
            refused = await gw.http.post("/v1/admin/tenants/acme/keys", headers=ops, json=body)
            assert refused.status_code == 400, (body, refused.text)
            assert refused.json()["error"]["code"], body
        assert (await gw.http.get("/v1/admin/keys", headers=ops)).json() == before  # nothing made

        changed = await gw.http.patch(f"/v1/admin/keys/{key_id}", headers=ops,
                                      json={"rpm": 30, "expires_at": None})
        assert changed.status_code == 200, changed.text
        assert changed.json()["limits"] == {**limits, "rpm": 30, "expires_at": None}
        refused = await gw.http.patch(f"/v1/admin/keys/{key_id}", headers=ops, json={"tpm": 5})
        assert refused.status_code == 400 and refused.json()["error"]["code"]
        unknown = await gw.http.patch("/v1/admin/keys/0123456789ab", headers=ops, json={"rpm": 1})
        assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "key_not_found"
        assert (await gw.http.get(f"/v1/admin/keys/{key_id}", headers=ops)).json()["limits"]["rpm"] == 30


async def test_a_key_over_its_rpm_is_refused_while_its_tenants_other_keys_are_served(
        queue_factory: QueueFactory) -> None:
    async with open_gateway(queue_factory) as gw:
        # 20 a minute: a burst of 2 (a tenth, as every rpm in tidegate), then one each 3 s.
        _, limited = await _new_key(gw, "acme", {"rpm": 20})
        _, other = await _new_key(gw, "acme")

        answers = [await gw.http.post("/v1/chat/completions", json=CHAT, headers=_as(limited))
                   for _ in range(3)]
        served = await gw.http.post("/v1/chat/completions", json=CHAT, headers=_as(other))

        assert [answer.status_code for answer in answers] == [200, 200, 429]
        error = answers[2].json()["error"]
        assert error["code"] == "rate_limit_exceeded" and "API key" in error["message"]
        assert float(answers[2].headers["Retry-After"]) > 0
        assert served.status_code == 200


async def test_a_key_narrows_its_tenants_models_and_priorities(queue_factory: QueueFactory) -> None:
    async with open_gateway(queue_factory) as gw:
        _, key = await _new_key(gw, "acme", {"allowed_models": ["deepseek-v3.2"], "max_priority": "low"})

        models = (await gw.http.get("/v1/models", headers=_as(key))).json()
        allowed = await gw.http.post("/v1/chat/completions", headers=_as(key),
                                     json={**CHAT, "model": "deepseek-v3.2"})
        other_model = await gw.http.post("/v1/chat/completions", headers=_as(key),
                                         json={**CHAT, "model": "gpt-4.1"})
        urgent = await gw.http.post("/v1/chat/completions", headers={**_as(key), "X-Priority": "normal"},
                                    json={**CHAT, "model": "deepseek-v3.2"})
        as_tenant = await gw.http.post("/v1/chat/completions", json={**CHAT, "model": "gpt-4.1"},
                                       headers={**gw.auth("acme"), "X-Priority": "high"})

        assert [model["id"] for model in models["data"]] == ["deepseek-v3.2"]
        assert allowed.status_code == 200
        assert other_model.status_code == 403 and other_model.json()["error"]["code"] == "model_not_allowed"
        assert urgent.status_code == 403 and urgent.json()["error"]["code"] == "priority_not_allowed"
        assert as_tenant.status_code == 200  # the tenant's other key keeps the tenant's limits


async def test_an_expired_key_answers_401_expired_api_key(queue_factory: QueueFactory) -> None:
    async with open_gateway(queue_factory, worker=False) as gw:
        key_id, key = await _new_key(gw, "acme")
        assert (await gw.http.get("/v1/models", headers=_as(key))).status_code == 200

        past = (datetime.now(UTC) - timedelta(seconds=1)).isoformat()
        changed = await gw.http.patch(f"/v1/admin/keys/{key_id}", headers=gw.auth("ops"),
                                      json={"expires_at": past})
        expired = await gw.http.get("/v1/models", headers=_as(key))

        assert changed.status_code == 200
        assert expired.status_code == 401 and expired.json()["error"]["code"] == "expired_api_key"
        assert (await gw.http.get("/v1/models", headers=gw.auth("acme"))).status_code == 200
