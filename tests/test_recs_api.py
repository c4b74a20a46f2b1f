"""The recommendations API on a real gateway (uvicorn on loopback), with the recommender's state in
memory and on Redis: recommendations that follow posted interactions, cold starts, filters, the
batch, health, bad input answered 400 naming what is wrong, and 503 without a recommender. Two
gateways on one Redis serve the same recommendations. And end to end through `tidegate up`: a click
written to the shop's database changes that user's recommendations.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import tempfile
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from support.gateway import add_tenants, serving
from support.redis_keys import delete_keys
from support.waiting import eventually
from tidegate.app.gateway import open_gateway_state
from tidegate.app.up import UpInfo, UpSettings, run_up
from tidegate.config import SyncConfig, TidegateConfig
from tidegate.demo.embedded import embedded_sync_config
from tidegate.gateway.core.state import GatewayState
from tidegate.recs import Interaction, InteractionKind, Item, Recommender

STATES = ["memory", "redis"]

CATALOGUE = [
    Item("mug-red", "Red enamel mug", categories=("kitchen",), price=6.5, stock=20),
    Item("mug-blue", "Blue enamel mug", categories=("kitchen",), price=6.0, stock=20),
    Item("mug-tall", "Tall enamel mug", categories=("kitchen",), price=8.0, stock=20),
    Item("teapot", "Enamel teapot", categories=("kitchen",), price=18.0, stock=5),
    Item("pot-clay", "Clay garden pot", categories=("garden",), price=4.0, stock=50),
    Item("pot-zinc", "Zinc garden planter", categories=("garden",), price=12.0, stock=50),
    Item("lantern", "Heart lantern", categories=("lighting",), price=3.0, stock=0),  # out of stock
    Item("candle", "Vanilla candle", categories=("lighting",), price=2.0),  # stock unknown: in stock
]


@dataclass
class Api:
    """A gateway serving recommendations, and a client with an ordinary tenant's key."""

    state: GatewayState
    http: httpx.AsyncClient
    url: str
    keys: dict[str, str]

    @property
    def recommender(self) -> Recommender:
        assert self.state.recommender is not None
        return self.state.recommender

    async def recommend(self, user: str, **params: Any) -> dict[str, Any]:
        answer = await self.http.get(f"/v1/recommendations/{user}", params=params)
        assert answer.status_code == 200, answer.text
        body: dict[str, Any] = answer.json()
        return body

    async def ids(self, user: str, **params: Any) -> list[str]:
        return [item["item_id"] for item in (await self.recommend(user, **params))["items"]]

    async def interact(self, user: str, body: Any) -> dict[str, Any]:
        answer = await self.http.post(f"/v1/profiles/{user}/interactions", json=body)
        assert answer.status_code == 200, answer.text
        recorded: dict[str, Any] = answer.json()
        return recorded


def _recs_url(kind: str, request: pytest.FixtureRequest) -> str:
    return "memory://" if kind == "memory" else str(request.getfixturevalue("redis_server"))


@contextlib.asynccontextmanager
async def recs_gateway(tmp: Path, recs_url: str | None, prefix: str) -> AsyncIterator[Api]:
    """A gateway (SQLite queue, tenants with keys) whose recommender keeps its state at
    `recs_url` under `prefix` (None: no recommender)."""
    config = TidegateConfig(queue_url=f"sqlite:///{tmp / 'queue.db'}", sync=SyncConfig(prefix=prefix))
    async with open_gateway_state(config, recs_url=recs_url) as state:
        keys = await add_tenants(state.tenants)
        async with serving(state) as url, httpx.AsyncClient(
                base_url=url, timeout=20.0, headers={"Authorization": f"Bearer {keys['acme']}"}) as http:
            yield Api(state, http, url, keys)


@pytest.fixture(params=STATES)
async def api(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Api]:
    """The API over a seeded catalogue, its state in memory or on Redis (a prefix of its own)."""
    url = _recs_url(request.param, request)
    prefix = f"t{uuid.uuid4().hex[:12]}"
    try:
        async with recs_gateway(tmp_path, url, prefix) as gateway:
            for item in CATALOGUE:
                await gateway.recommender.upsert_item(item)
            yield gateway
    finally:
        if request.param == "redis":
            await delete_keys(url, f"*{prefix}*")


# ---------------------------------------------------------------------- serving


async def test_posted_interactions_change_the_users_recommendations(api: Api) -> None:
    # Given a user nobody has seen: a cold start, and nothing trends yet
    before = await api.recommend("ada", n=5)
    assert before["cold_start"] is True and before["items"] == []

    # When the user views a mug, puts it in the cart and buys it
    recorded = await api.interact("ada", [{"item_id": "mug-red", "kind": "view"},
                                          {"item_id": "mug-red", "kind": "add_to_cart", "quantity": 2},
                                          {"item_id": "mug-red", "kind": "purchase", "quantity": 2}])
    assert recorded == {"user_id": "ada", "recorded": 3}

    # Then their recommendations are personal: other enamel kitchen items first, never what they
    # bought, and never what is out of stock
    after = await api.recommend("ada", n=5, explain="true")
    ids = [item["item_id"] for item in after["items"]]
    assert after["cold_start"] is False
    assert ids[0] in {"mug-blue", "mug-tall", "teapot"}
    assert "mug-red" not in ids and "lantern" not in ids
    assert all(item["reason"] for item in after["items"])
    assert "Red enamel mug" in after["items"][0]["reason"]
    assert set(after["items"][0]["signals"]) == {"profile", "co_occurrence", "trending"}


async def test_items_bought_together_are_recommended_with_that_reason(api: Api) -> None:
    # Given shoppers who buy the teapot with the clay pot
    for shopper in ("s1", "s2", "s3"):
        await api.interact(shopper, [{"item_id": "teapot", "kind": "purchase"},
                                     {"item_id": "pot-clay", "kind": "purchase"}])

    # When someone looks at the teapot
    await api.interact("ben", {"item_id": "teapot", "kind": "view"})

    # Then the clay pot is recommended, bought together with it, above the other garden item
    items = (await api.recommend("ben", n=10, explain="true"))["items"]
    ranks = {item["item_id"]: rank for rank, item in enumerate(items)}
    clay = items[ranks["pot-clay"]]
    assert clay["reason"] == "bought together with Enamel teapot"
    assert clay["signals"]["co_occurrence"] == 1.0
    assert ranks["pot-clay"] < ranks.get("pot-zinc", len(items))


async def test_a_cold_start_gets_what_trends_in_its_context_never_an_error(api: Api) -> None:
    await api.interact("s1", [{"item_id": "pot-zinc", "kind": "purchase"},
                              {"item_id": "mug-blue", "kind": "view"}])
    await api.interact("s2", {"item_id": "pot-zinc", "kind": "view"})

    anywhere = await api.recommend("newcomer", n=3, explain="true")
    in_garden = await api.recommend("newcomer", n=3, context="pot-clay")
    kitchen = await api.recommend("newcomer", category="kitchen")

    assert anywhere["cold_start"] is True
    assert [item["item_id"] for item in anywhere["items"]] == ["pot-zinc", "mug-blue"]
    assert anywhere["items"][0]["reason"] == "trending in garden"
    assert in_garden["items"][0]["item_id"] == "pot-zinc"
    assert [item["item_id"] for item in kitchen["items"]] == ["mug-blue"]


async def test_filters_hold(api: Api) -> None:
    await api.interact("ada", [{"item_id": item.item_id, "kind": "view"} for item in CATALOGUE])
    await api.interact("cleo", {"item_id": "mug-blue", "kind": "view"})
    prices = {item.item_id: item.price for item in CATALOGUE}

    cheap = await api.ids("cleo", n=20, max_price=6.5)
    middle = await api.ids("cleo", n=20, min_price=5, max_price=12)
    kitchen_or_garden = await api.ids("cleo", n=20, category=["kitchen", "garden"])
    everything = await api.ids("cleo", n=20)

    assert cheap and all(prices[i] is not None and prices[i] <= 6.5 for i in cheap)  # type: ignore[operator]
    assert middle and all(5 <= prices[i] <= 12 for i in middle)  # type: ignore[operator]
    assert set(kitchen_or_garden) == {"mug-red", "mug-blue", "mug-tall", "teapot", "pot-clay", "pot-zinc"}
    assert "lantern" not in everything and "candle" in everything  # unknown stock counts as in stock
    assert "mug-blue" in everything  # viewed, not bought: still recommended


async def test_n_and_diversity_shape_the_list(api: Api) -> None:
    await api.interact("ada", [{"item_id": item.item_id, "kind": "view"} for item in CATALOGUE])
    await api.interact("dev", {"item_id": "mug-red", "kind": "purchase"})

    three = await api.ids("dev", n=3)
    diverse = await api.ids("dev", n=3, diversity=1)

    assert len(three) == 3 and len(diverse) == 3
    assert len({i.split("-")[0] for i in diverse}) >= len({i.split("-")[0] for i in three})


async def test_a_batch_answers_each_query_in_order(api: Api) -> None:
    await api.interact("ada", {"item_id": "mug-red", "kind": "purchase"})
    await api.interact("s1", {"item_id": "pot-clay", "kind": "view"})

    answer = await api.http.post("/v1/recommendations:batch", json={"queries": [
        {"user_id": "ada", "n": 2, "explain": True},
        {"user_id": "stranger", "n": 1, "categories": ["garden"]},
        {"user_id": "ada", "n": 4, "max_price": 7},
    ]})

    assert answer.status_code == 200, answer.text
    results = answer.json()["results"]
    assert [r["user_id"] for r in results] == ["ada", "stranger", "ada"]
    assert [len(r["items"]) for r in results] == [2, 1, len(results[2]["items"])]
    assert results[0]["cold_start"] is False and all(i["reason"] for i in results[0]["items"])
    assert results[1]["cold_start"] is True and results[1]["items"][0]["item_id"] == "pot-clay"
    assert all(i["reason"] is None for i in results[2]["items"])
    assert results[0]["items"] == (await api.recommend("ada", n=2, explain="true"))["items"]


async def test_health_reports_the_models_size_and_freshness(api: Api) -> None:
    before = (await api.http.get("/v1/health")).json()
    await api.interact("ada", {"item_id": "mug-red", "kind": "view"})
    after = (await api.http.get("/v1/health")).json()

    assert before["items"] == len(CATALOGUE) and before["users"] == 0
    assert before["last_update_at"] is None and before["seconds_since_update"] is None
    assert after["status"] == "ok" and after["users"] == 1
    assert 0 <= after["seconds_since_update"] < 3600
    assert datetime.fromisoformat(after["last_update_at"]) <= datetime.now(UTC)
    assert after["commit_to_updated"] is None  # no change flow runs in this gateway's process


async def test_interactions_at_given_times_are_decayed_from_then(api: Api) -> None:
    long_ago = (datetime.now(UTC) - timedelta(days=30)).isoformat()
    await api.interact("eve", [{"item_id": "pot-clay", "kind": "purchase", "at": long_ago},
                               {"item_id": "mug-red", "kind": "view"}])

    # The month-old purchase (worth 5 views then) weighs far less than today's view: kitchen first
    top = await api.ids("eve", n=2)
    assert top[0] in {"mug-red", "mug-blue", "mug-tall", "teapot"}


# ---------------------------------------------------------------------- bad input


NOW_PLUS_HOUR = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
GET = "/v1/recommendations/u"
BATCH = "/v1/recommendations:batch"
POST = "/v1/profiles/u/interactions"
VIEW = {"item_id": "a", "kind": "view"}


def bad(method: str, path: str, body: Any, message: str, param: str, name: str) -> Any:
    """A request answered 400 whose message contains `message` and whose param is `param`."""
    return pytest.param(method, path, body, message, param, id=name)


BAD = [
    bad("GET", f"{GET}?colour=red", None, "unknown query parameter(s): colour", "colour", "unknown-filter"),
    bad("GET", f"{GET}?n=0", None, "greater than or equal to 1", "query.n", "n-zero"),
    bad("GET", f"{GET}?n=101", None, "less than or equal to 100", "query.n", "n-too-large"),
    bad("GET", f"{GET}?n=ten", None, "valid integer", "query.n", "n-not-a-number"),
    bad("GET", f"{GET}?min_price=9&max_price=3", None, "min_price 9 is above max_price 3", "min_price",
        "min-above-max"),
    bad("GET", f"{GET}?max_price=-1", None, "greater than or equal to 0", "query.max_price",
        "negative-price"),
    bad("GET", f"{GET}?min_price=inf", None, "finite number", "query.min_price", "infinite-price"),
    bad("GET", f"{GET}?diversity=2", None, "less than or equal to 1", "query.diversity", "diversity-over-1"),
    bad("GET", f"{GET}?category=", None, "at least 1 character", "query.category.0", "empty-category"),
    bad("POST", BATCH, {"queries": [{"user_id": "u"}] * 101}, "at most 100 items", "queries",
        "batch-over-100"),
    bad("POST", BATCH, {"queries": []}, "at least 1 item", "queries", "batch-empty"),
    bad("POST", BATCH, {"queries": [{"user_id": "u"}, {"user_id": "v", "n": 0}]}, "queries.1.n",
        "queries.1.n", "batch-bad-n"),
    bad("POST", BATCH, {"queries": [{"user_id": "u", "min_price": 3, "max_price": 1}]},
        "queries.0: min_price 3 is above max_price 1", "queries.0.min_price", "batch-min-above-max"),
    bad("POST", BATCH, {"queries": [{"user_id": "u", "colour": "red"}]},
        "queries.0.colour: Extra inputs are not permitted", "queries.0.colour", "batch-unknown-field"),
    bad("POST", f"{BATCH}?x=1", {"queries": [{"user_id": "u"}]}, "unknown query parameter(s): x", "x",
        "batch-unknown-parameter"),
    bad("POST", POST, {**VIEW, "kind": "like"},
        "interaction.kind: Input should be 'view', 'add_to_cart' or 'purchase'", "interaction.kind",
        "unknown-kind"),
    bad("POST", POST, {"kind": "view"}, "interaction.item_id: Field required", "interaction.item_id",
        "no-item"),
    bad("POST", POST, [VIEW, {**VIEW, "quantity": 0}], "interactions.1.quantity", "interactions.1.quantity",
        "bad-quantity-in-list"),
    bad("POST", POST, {**VIEW, "at": "yesterday"}, "interaction.at", "interaction.at", "bad-time"),
    bad("POST", POST, {**VIEW, "at": "2026-01-01T12:00:00"}, "timezone", "interaction.at", "naive-time"),
    bad("POST", POST, [{**VIEW, "at": NOW_PLUS_HOUR}], "ahead of the gateway's clock", "interactions.0.at",
        "future-time"),
    bad("POST", POST, [], "at least 1 item", "interactions", "no-interactions"),
    bad("POST", POST, [VIEW] * 1001, "at most 1000 items", "interactions", "too-many"),
    bad("POST", POST, {**VIEW, "weight": 9}, "interaction.weight: Extra inputs are not permitted",
        "interaction.weight", "unknown-field"),
    bad("POST", POST, {**VIEW, "item_id": 7}, "valid string", "interaction.item_id", "number-as-id"),
    bad("GET", "/v1/health?verbose=1", None, "this operation takes none", "verbose", "health-parameter"),
]


@pytest.mark.parametrize(("method", "path", "body", "message", "param"), BAD)
async def test_bad_input_is_refused_with_400_naming_what_is_wrong(
    api: Api, method: str, path: str, body: Any, message: str, param: str
) -> None:
    answer = await api.http.request(method, path, json=body)

    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert message in error["message"], error
    assert error["param"] == param, error
    assert (await api.http.get("/v1/health")).json()["users"] == 0  # nothing was recorded


async def test_all_or_nothing_a_list_with_one_bad_interaction_records_none(api: Api) -> None:
    answer = await api.http.post("/v1/profiles/ada/interactions", json=[
        {"item_id": "mug-red", "kind": "purchase"}, {"item_id": "mug-blue", "kind": "wish"}])

    assert answer.status_code == 400
    assert (await api.recommend("ada"))["cold_start"] is True


async def test_a_key_is_required(api: Api) -> None:
    async with httpx.AsyncClient(base_url=api.url) as anonymous:
        answer = await anonymous.get("/v1/recommendations/ada")
        wrong = await anonymous.get("/v1/health", headers={"Authorization": "Bearer sk-nope"})
        probing = await anonymous.get("/v1/recommendations/ada?colour=red")  # the key is checked first

    assert (answer.status_code, wrong.status_code, probing.status_code) == (401, 401, 401)
    # Any tenant's key serves, admin or not
    admin = await api.http.get("/v1/health", headers={"Authorization": f"Bearer {api.keys['ops']}"})
    assert admin.status_code == 200


async def test_without_a_recommender_the_routes_answer_503_saying_so(tmp_path: Path) -> None:
    async with recs_gateway(tmp_path, None, "unused") as gateway:
        answers = [
            await gateway.http.get("/v1/recommendations/ada"),
            await gateway.http.post("/v1/recommendations:batch", json={"queries": [{"user_id": "ada"}]}),
            await gateway.http.post("/v1/profiles/ada/interactions", json={"item_id": "a", "kind": "view"}),
            await gateway.http.get("/v1/health"),
        ]

    for answer in answers:
        assert answer.status_code == 503, answer.text
        error = answer.json()["error"]
        assert error["code"] == "recommender_not_configured"
        assert "not configured on this gateway" in error["message"]


async def test_two_gateways_on_one_redis_serve_the_same_recommendations(redis_server: str) -> None:
    url = redis_server
    prefix = f"t{uuid.uuid4().hex[:12]}"
    with tempfile.TemporaryDirectory() as one, tempfile.TemporaryDirectory() as two:
        try:
            async with recs_gateway(Path(one), url, prefix) as first, \
                    recs_gateway(Path(two), url, prefix) as second:
                for item in CATALOGUE:
                    await first.recommender.upsert_item(item)
                # An interaction posted to one gateway...
                await first.interact("ada", {"item_id": "mug-red", "kind": "purchase"})
                await second.interact("s1", [{"item_id": "teapot", "kind": "purchase"},
                                             {"item_id": "mug-red", "kind": "purchase"}])

                # ... shows in the other's answers: both serve the same state
                mine = await first.recommend("ada", n=5, explain="true")
                theirs = await second.recommend("ada", n=5, explain="true")
                assert mine["items"] == theirs["items"] and mine["cold_start"] is False
                assert (await second.http.get("/v1/health")).json()["users"] == 2
        finally:
            await delete_keys(url, f"*{prefix}*")


# ---------------------------------------------------------------------- end to end through up


async def test_a_click_in_the_database_changes_that_users_recommendations(tmp_path: Path) -> None:
    shop = tmp_path / "shop.db"
    config = TidegateConfig(queue_url=f"sqlite:///{tmp_path}/tidegate.db",
                            sync=SyncConfig(source_url=f"sqlite:///{shop}"))
    stop = asyncio.Event()
    ready: asyncio.Future[UpInfo] = asyncio.get_running_loop().create_future()
    running = asyncio.create_task(run_up(embedded_sync_config(config), UpSettings(port=0),
                                         on_ready=ready.set_result, stop=stop))
    try:
        info = await asyncio.wait_for(asyncio.shield(ready), 30)
        async with httpx.AsyncClient(base_url=info.api_url.removesuffix("/v1"), timeout=20.0,
                                     headers={"Authorization": f"Bearer {info.admin_key}"}) as http:
            with contextlib.closing(sqlite3.connect(shop)) as conn:
                products = conn.execute("SELECT count(*) FROM products").fetchone()[0]
                clicked = conn.execute("SELECT id FROM products ORDER BY rowid LIMIT 1").fetchone()[0]

            async def caught_up() -> bool:
                health = (await http.get("/v1/health")).json()
                return bool(health["items"] == products and health["users"] > 0)

            # Given the change flow has fed the shop's catalogue and history to the recommender
            await eventually(caught_up, "the recommender holds the shop's catalogue", timeout_s=60)
            user = f"new-{uuid.uuid4().hex[:8]}"
            before = (await http.get(f"/v1/recommendations/{user}", params={"explain": "true"})).json()
            assert before["cold_start"] is True

            # When the user clicks a product, written to the shop's database
            with contextlib.closing(sqlite3.connect(shop)) as conn, conn:
                conn.execute("INSERT INTO interactions (user_id, product_id, kind, quantity, created_at) "
                             "VALUES (?, ?, 'view', 1, strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))",
                             (user, clicked))

            # Then that user's recommendations follow it: personal now, from a profile of the click
            async def personal() -> bool:
                answer = (await http.get(f"/v1/recommendations/{user}", params={"explain": "true"})).json()
                return answer["cold_start"] is False

            await eventually(personal, "the click reaches the user's recommendations", timeout_s=30)
            after = (await http.get(f"/v1/recommendations/{user}", params={"explain": "true"})).json()
            assert after["items"] and any(item["signals"]["profile"] > 0 for item in after["items"])
            assert after["items"] != before["items"]
            # ... and the change flow measured its commit → recommendation-updated latency
            health = (await http.get("/v1/health")).json()
            assert health["commit_to_updated"]["count"] >= 1
            assert health["commit_to_updated"]["p99_ms"] is not None
    finally:
        stop.set()
        await asyncio.wait_for(running, 30)


# ---------------------------------------------------------------------- tenants


def _as(api: Api, tenant: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {api.keys[tenant]}"}


async def _cold(api: Api, tenant: str, user: str) -> bool:
    answer = await api.http.get(f"/v1/recommendations/{user}", headers=_as(api, tenant))
    assert answer.status_code == 200, answer.text
    assert answer.json()["user_id"] == user
    cold: bool = answer.json()["cold_start"]
    return cold


async def test_a_tenants_profiles_are_its_own(api: Api) -> None:
    # Given acme's user "ada", who bought a mug
    await api.interact("ada", {"item_id": "mug-red", "kind": "purchase"})

    # Then acme sees her profile; another tenant's "ada", and the database's, are someone else
    assert await _cold(api, "acme", "ada") is False
    assert await _cold(api, "globex", "ada") is True
    assert await _cold(api, "ops", "ada") is True
    batch = await api.http.post("/v1/recommendations:batch", json={"queries": [{"user_id": "ada"}]},
                                headers=_as(api, "globex"))
    assert batch.json()["results"][0]["cold_start"] is True
    # And what globex writes for its "ada" leaves acme's ada as she was
    written = await api.http.post("/v1/profiles/ada/interactions", headers=_as(api, "globex"),
                                  json={"item_id": "teapot", "kind": "purchase"})
    assert written.status_code == 200, written.text
    assert "teapot" in await api.ids("ada", n=10)  # acme's ada never bought it: still a candidate


async def test_the_change_flows_profiles_are_the_operators(api: Api) -> None:
    # Given a profile built from the database, as the change flow's sink records it (no tenant)
    await api.recommender.record([Interaction(user_id="17850", item_id="mug-red",
                                              kind=InteractionKind.PURCHASE, at=datetime.now(UTC))])

    # Then an admin tenant reads it under the database's user id; an ordinary tenant cannot
    assert await _cold(api, "ops", "17850") is False
    assert await _cold(api, "acme", "17850") is True


async def test_recording_interactions_counts_against_the_tenants_rate_limit(api: Api) -> None:
    # Given a tenant allowed one request per minute
    headers = _as(api, "slow")
    first = await api.http.post("/v1/profiles/ada/interactions", headers=headers,
                                json={"item_id": "mug-red", "kind": "view"})

    second = await api.http.post("/v1/profiles/ada/interactions", headers=headers,
                                 json={"item_id": "mug-red", "kind": "purchase"})

    assert first.status_code == 200, first.text
    assert second.status_code == 429, second.text
    assert second.json()["error"]["code"] == "rate_limit_exceeded"
    assert int(second.headers["Retry-After"]) >= 1


async def test_a_user_id_with_a_control_character_is_refused(api: Api) -> None:
    answers = [
        await api.http.get("/v1/recommendations/ops%1Fada"),
        await api.http.post("/v1/profiles/ops%1Fada/interactions",
                            json={"item_id": "mug-red", "kind": "view"}),
        await api.http.post("/v1/recommendations:batch", json={"queries": [{"user_id": "ops\u001fada"}]}),
    ]

    for answer in answers:
        assert answer.status_code == 400, answer.text
        assert answer.json()["error"]["code"] == "invalid_request"
