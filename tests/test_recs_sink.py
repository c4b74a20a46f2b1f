"""The recommender's change-flow sink: product and interaction rows become items and interactions,
deletes and stock-outs leave the recommendations, unreadable rows are counted and skipped, and an
embedding refresh job's result swaps the item's vector (end to end through the queue, a worker and
the simulated provider).

Changes go through a real memory entity cache first, as in the pipeline, so the sink sees the
cache's outcomes (applied or stale) and previous rows.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from support.dispatch import running_worker, sim_config, wait_final
from support.waiting import eventually
from tidegate.config import RefreshRule
from tidegate.jobs import Job, JobState, Priority
from tidegate.queue import Queue
from tidegate.recs import Interaction, InteractionKind, Item, Recommender, RecQuery, recs_store_for
from tidegate.recs.monitor import RecsMonitor
from tidegate.recs.refresh_watch import RefreshWatcher
from tidegate.recs.sink import MalformedRow, RecsMapping, RecsSink, interaction_from_row, item_from_row
from tidegate.recs.vectors import item_vector
from tidegate.simulator.server import Simulator
from tidegate.simulator.settings import SimulatorSettings
from tidegate.sync.cache import cache_for
from tidegate.sync.changes import Change, Op, Version
from tidegate.sync.contracts import ApplyResult, EntityCache
from tidegate.sync.refresh import RefreshSink
from tidegate.sync.sources.sqlite.source import SNAPSHOT_ORDINAL

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def product(ident: str, name: str, *, price: Any = 4.5, stock: Any = 10, categories: Any = '["kitchen"]',
            description: str = "", embeddings: Any = None) -> dict[str, Any]:
    """A products row as the demo shop's capture sends it."""
    return {"id": ident, "name": name, "description": description or f"{name}.", "price": price,
            "stock": stock, "categories": categories, "embeddings": embeddings,
            "updated_at": "2026-03-01T12:00:00.000000Z"}


def interaction(row_id: int, user: str, item: str, kind: str = "view", *, quantity: Any = 1,
                at: Any = "2026-03-01T12:00:00.000000Z") -> dict[str, Any]:
    return {"id": row_id, "user_id": user, "product_id": item, "kind": kind, "quantity": quantity,
            "created_at": at}


class Changes:
    """Changes with increasing versions, as one source would produce them."""

    def __init__(self) -> None:
        self.lsn = 0

    def _next(self) -> Version:
        self.lsn += 1
        return Version(self.lsn, 0)

    def row(self, table: str, op: Op, row: dict[str, Any], *, snapshot: bool = False) -> Change:
        version = Version(self.lsn, SNAPSHOT_ORDINAL) if snapshot else self._next()
        deleted = op is Op.DELETE
        return Change.of_row(entity_type=table, op=op, key_columns=("id",), version=version,
                             commit_time=datetime.now(UTC), captured_at=time.time(),
                             after=None if deleted else row, before=row if deleted else None)

    def truncate(self, table: str) -> Change:
        return Change.of_row(entity_type=table, op=Op.TRUNCATE, key_columns=("id",), version=self._next(),
                             commit_time=datetime.now(UTC), captured_at=time.time())


class CountingRecommender(Recommender):
    """The real recommender, counting its `record` calls (to show a batch is one call)."""

    record_calls = 0

    async def record(self, interactions: Sequence[Interaction]) -> None:
        self.record_calls += 1
        await super().record(interactions)


@dataclass
class Feed:
    """A memory cache, a recommender on a memory store and the sink, fed like the pipeline does."""

    cache: EntityCache
    recommender: CountingRecommender
    sink: RecsSink
    changes: Changes

    async def apply(self, *changes: Change) -> list[ApplyResult]:
        results = await self.cache.apply(list(changes))
        await self.sink.apply(results)
        return results

    async def ids(self, user: str = "nobody", **query: Any) -> list[str]:
        result = await self.recommender.recommend(RecQuery(user_id=user, n=20, **query))
        return [r.item_id for r in result.items]


def sample(feed: Feed, name: str, **labels: str) -> float:
    """A sample of the sink's metrics, as /metrics exports it (0 when never counted)."""
    return feed.sink.monitor.registry.get_sample_value(name, labels) or 0.0


@pytest.fixture
async def feed() -> AsyncIterator[Feed]:
    async with cache_for("memory://") as cache, recs_store_for("memory://") as store:
        recommender = CountingRecommender(store, clock=lambda: datetime.now(UTC))
        yield Feed(cache, recommender, RecsSink(recommender, monitor=RecsMonitor()), Changes())


async def _catalogue(feed: Feed) -> None:
    """Three products and enough views that all three trend (a cold start then lists them)."""
    c = feed.changes
    await feed.apply(c.row("products", Op.INSERT, product("A", "Red mug")),
                     c.row("products", Op.INSERT, product("B", "Blue mug")),
                     c.row("products", Op.INSERT, product("C", "Garden pot", categories='["garden"]')))
    now = datetime.now(UTC).isoformat()
    await feed.apply(*(c.row("interactions", Op.INSERT, interaction(n, f"u{n}", item, at=now))
                       for n, item in enumerate("AABBC")))


# ---------------------------------------------------------------------- mapping rows


def test_a_product_row_becomes_an_item() -> None:
    row = product("85123A", "Heart lantern", price="2.55", stock=3, categories='["lighting", "love"]',
                  embeddings="[0.5, -1, 2]")

    item, problems = item_from_row("85123A", row)

    assert problems == []
    assert item == Item(item_id="85123A", name="Heart lantern", description="Heart lantern.",
                        categories=("lighting", "love"), price=2.55, stock=3, vector=(0.5, -1.0, 2.0))


def test_unreadable_optional_columns_are_left_out_and_named() -> None:
    row = product("X", "Lamp", categories="[not json", embeddings='["a"]')

    item, problems = item_from_row("X", row)

    assert (item.categories, item.vector, item.price) == ((), None, 4.5)
    assert len(problems) == 2
    assert "categories is not JSON" in problems[0] and "vector" in problems[1]


@pytest.mark.parametrize(("column", "value", "message"), [
    ("price", "cheap", "price 'cheap' is not a number"),
    ("price", -1, "not a finite number >= 0"),
    ("stock", 2.5, "stock 2.5 is not a whole number"),
    ("stock", True, "stock True is not a number"),
])
def test_a_product_with_an_unreadable_price_or_stock_is_malformed(
    column: str, value: Any, message: str
) -> None:
    with pytest.raises(MalformedRow, match=message):
        item_from_row("X", {**product("X", "Lamp"), column: value})


def test_other_table_and_column_names_are_a_mapping() -> None:
    mapping = RecsMapping(products="catalog.items", product_name="title", product_description=None,
                          product_categories="tag", product_stock=None, product_vector=None,
                          interaction_item="sku", interaction_time=None)

    item, _ = item_from_row("7", {"title": "Kettle", "tag": "kitchen", "price": 12}, mapping)
    found = interaction_from_row({"user_id": 42, "sku": 7, "kind": "purchase", "quantity": 2}, T0, mapping)

    assert item == Item(item_id="7", name="Kettle", categories=("kitchen",), price=12.0)
    assert found == Interaction(user_id="42", item_id="7", kind=InteractionKind.PURCHASE, at=T0, quantity=2)


def test_an_interaction_row_becomes_an_interaction() -> None:
    found = interaction_from_row(interaction(1, "17850", "85123A", "add_to_cart", quantity=3,
                                             at="2026-03-01T13:30:00.000000Z"), T0)
    untimed = interaction_from_row({**interaction(2, "17850", "85123A"), "created_at": None}, T0)

    assert found == Interaction("17850", "85123A", InteractionKind.ADD_TO_CART,
                                datetime(2026, 3, 1, 13, 30, tzinfo=UTC), 3)
    assert untimed.at == T0  # no time: it happened at its commit


@pytest.mark.parametrize(("field", "value", "message"), [
    ("kind", "like", "unknown interaction kind 'like'"),
    ("kind", None, "unknown interaction kind None"),
    ("created_at", "yesterday", "bad timestamp"),
    ("quantity", 0, "quantity 0 is not >= 1"),
    ("user_id", None, "user id None is not an id"),
    ("product_id", "", "item id '' is not an id"),
])
def test_an_unreadable_interaction_is_malformed(field: str, value: Any, message: str) -> None:
    with pytest.raises(MalformedRow, match=message):
        interaction_from_row({**interaction(1, "u", "A"), field: value}, T0)


# ---------------------------------------------------------------------- the sink


async def test_products_become_recommendable_items(feed: Feed) -> None:
    await _catalogue(feed)

    stored = await feed.recommender.item("A")
    assert stored is not None
    assert (stored.name, stored.categories, stored.price) == ("Red mug", ("kitchen",), 4.5)
    assert set(await feed.ids()) == {"A", "B", "C"}  # a cold start lists what trends
    assert feed.sink.applied == 8 and feed.sink.malformed == 0


async def test_a_product_out_of_stock_is_not_recommended_until_restocked(feed: Feed) -> None:
    await _catalogue(feed)
    c = feed.changes

    await feed.apply(c.row("products", Op.UPDATE, product("A", "Red mug", stock=0)))
    assert "A" not in await feed.ids()

    await feed.apply(c.row("products", Op.UPDATE, product("A", "Red mug", stock=5)))
    assert "A" in await feed.ids()


async def test_deleted_and_truncated_products_leave_the_recommendations(feed: Feed) -> None:
    await _catalogue(feed)
    c = feed.changes

    await feed.apply(c.row("products", Op.DELETE, product("B", "Blue mug")))
    assert await feed.recommender.item("B") is None
    assert set(await feed.ids()) == {"A", "C"}

    await feed.apply(c.truncate("products"))
    assert await feed.ids() == []
    assert [await feed.recommender.item(i) for i in "AC"] == [None, None]


async def test_a_batch_of_interactions_is_recorded_in_one_call_after_its_products(feed: Feed) -> None:
    c = feed.changes
    now = datetime.now(UTC).isoformat()

    # One batch: the interactions come first, the product they name after them
    await feed.apply(c.row("interactions", Op.INSERT, interaction(1, "u1", "N", "purchase", at=now)),
                     c.row("interactions", Op.INSERT, interaction(2, "u2", "N", "view", at=now)),
                     c.row("products", Op.INSERT, product("N", "New lamp", categories='["lighting"]')),
                     c.row("products", Op.INSERT, product("M", "Other lamp", categories='["lighting"]')))

    assert feed.recommender.record_calls == 1
    # The product was known when they were recorded: it trends, in its category too
    assert (await feed.ids(categories=("lighting",)))[0] == "N"
    assert feed.sink.monitor.activity.most_active() in {"u1", "u2"}


async def test_stale_changes_and_interaction_edits_are_not_applied_again(feed: Feed) -> None:
    await _catalogue(feed)
    c = feed.changes
    click = c.row("interactions", Op.INSERT, interaction(99, "u9", "A"))
    await feed.apply(click)
    calls = feed.recommender.record_calls

    results = await feed.apply(click)  # a replay: the cache holds this version already
    await feed.apply(c.row("interactions", Op.UPDATE, {**interaction(99, "u9", "A"), "quantity": 5}))

    assert results[0].outcome.value == "stale"
    assert feed.recommender.record_calls == calls
    assert sample(feed, "tidegate_recs_changes_total", entity_type="interactions", outcome="ignored") == 1


async def test_a_malformed_row_is_counted_and_the_rest_of_the_batch_applied(
    feed: Feed, caplog: pytest.LogCaptureFixture
) -> None:
    c = feed.changes
    now = datetime.now(UTC).isoformat()

    await feed.apply(c.row("products", Op.INSERT, product("A", "Red mug")),
                     c.row("products", Op.INSERT, product("Z", "Broken", price="n/a")),
                     c.row("interactions", Op.INSERT, interaction(1, "u1", "A", "like", at=now)),
                     c.row("interactions", Op.INSERT, interaction(2, "u1", "A", "view", at="soon")),
                     c.row("interactions", Op.INSERT, interaction(3, "u2", "A", "purchase", at=now)))

    assert feed.sink.malformed == 3
    assert sample(feed, "tidegate_recs_changes_total", entity_type="products", outcome="malformed") == 1
    assert sample(feed, "tidegate_recs_changes_total", entity_type="interactions", outcome="malformed") == 2
    assert await feed.recommender.item("Z") is None and await feed.recommender.item("A") is not None
    assert (await feed.recommender.health())["users"] == 1  # u2's purchase was recorded
    logged = " ".join(r.getMessage() for r in caplog.records)
    assert "products Z" in logged and "price 'n/a' is not a number" in logged
    assert "unknown interaction kind 'like'" in logged and "bad timestamp" in logged


async def test_commit_to_updated_is_measured_for_streamed_changes_only(feed: Feed) -> None:
    c = feed.changes

    await feed.apply(c.row("products", Op.INSERT, product("S", "Snapshot mug"), snapshot=True))
    assert feed.sink.monitor.freshness().count == 0  # a snapshot row's commit time means nothing

    await feed.apply(c.row("products", Op.INSERT, product("A", "Red mug")),
                     c.row("interactions", Op.INSERT, interaction(1, "u1", "A")))
    freshness = feed.sink.monitor.freshness()
    assert freshness.count == 2
    assert freshness.p50_ms is not None and freshness.p99_ms is not None
    assert 0 <= freshness.p50_ms <= freshness.p99_ms


async def test_a_price_change_keeps_the_swapped_vector_and_a_text_change_does_not(feed: Feed) -> None:
    c = feed.changes
    await feed.apply(c.row("products", Op.INSERT, product("A", "Red mug")))
    hashed = (await feed.recommender.item("A")).vector  # type: ignore[union-attr]
    embedding = tuple(float((-1) ** k * k) for k in range(1, 9))
    swapped_as = await feed.sink.swap_vector("A", embedding, lambda: feed.cache.get_entity("products", "A"))
    assert swapped_as == "swapped"
    swapped = (await feed.recommender.item("A")).vector  # type: ignore[union-attr]
    expected = tuple(float(x) for x in item_vector(Item("A", vector=embedding), 64).astype("float32"))
    assert swapped == expected != hashed

    await feed.apply(c.row("products", Op.UPDATE, product("A", "Red mug", price=3.99, stock=2)))
    kept = await feed.recommender.item("A")
    assert kept is not None and (kept.vector, kept.price, kept.stock) == (swapped, 3.99, 2)

    await feed.apply(c.row("products", Op.UPDATE, product("A", "Red enamel mug", price=3.99)))
    assert (await feed.recommender.item("A")).vector not in (swapped, hashed)  # type: ignore[union-attr]


# ---------------------------------------------------------------------- the embedding swap


@dataclass
class RefreshFlow:
    """The refresh rule's queue and sink, the watcher, and every (change, job id) it was handed."""

    queue: Queue
    watcher: RefreshWatcher
    refresh: RefreshSink
    enqueued: list[tuple[Change, str]]

    async def jobs(self, item_id: str) -> list[Job]:
        """The product's refresh jobs once final, in the order they were enqueued."""
        ids = [job_id for change, job_id in self.enqueued if change.entity_id == item_id]
        return await wait_final(self.queue, ids)


@contextlib.asynccontextmanager
async def refresh_flow(tmp_path: Path, feed: Feed) -> AsyncIterator[RefreshFlow]:
    """The demo shop's refresh rule on a SQLite queue, a worker calling the simulator, and the
    watcher handed the rule's jobs."""
    sim = Simulator(SimulatorSettings(seed=5, window_s=1.0))
    async with contextlib.AsyncExitStack() as stack:
        base_url = await stack.enter_async_context(sim.running())
        queue = await stack.enter_async_context(Queue.from_url(f"sqlite:///{tmp_path / 'queue.db'}"))
        config = sim_config(base_url, queue_url=f"sqlite:///{tmp_path / 'queue.db'}")
        await stack.enter_async_context(running_worker(queue, config))

        async def current_row(item_id: str) -> dict[str, Any] | None:
            return await feed.cache.get_entity("products", item_id)

        watcher = await stack.enter_async_context(RefreshWatcher(queue, feed.sink, current_row, wait_s=1.0))
        enqueued: list[tuple[Change, str]] = []

        def listener(pairs: Sequence[tuple[Change, str]]) -> None:
            enqueued.extend(pairs)
            watcher.enqueued(pairs)

        rule = RefreshRule(entity_type="products", columns=("name", "description"),
                           text="{name}\n{description}", priority=Priority.LOW)
        refresh = RefreshSink(queue, [rule], embedding_model=config.routing.embedding_model,
                              on_enqueued=listener)
        yield RefreshFlow(queue, watcher, refresh, enqueued)


async def _through(feed: Feed, flow: RefreshFlow, *changes: Change) -> None:
    """As the pipeline applies a batch: the cache, the refresh rule, then the recommender."""
    results = await feed.cache.apply(list(changes))
    await flow.refresh.apply(results)
    await feed.sink.apply(results)


def _projected(embedding: Sequence[float]) -> tuple[float, ...]:
    """What the recommender holds for an item with this embedding."""
    return tuple(float(x) for x in item_vector(Item("x", vector=tuple(embedding)), 64).astype("float32"))


def _embedding(job: Job) -> list[float]:
    assert job.state is JobState.SUCCEEDED, job
    embedding: list[float] = job.result["response"]["data"][0]["embedding"]
    return embedding


async def test_a_succeeded_embedding_job_swaps_the_item_vector(tmp_path: Path, feed: Feed) -> None:
    async with refresh_flow(tmp_path, feed) as flow:
        c = feed.changes
        # Given a new product: the recommender hashes its text meanwhile, the rule asks for an embedding
        await _through(feed, flow, c.row("products", Op.INSERT, product("A", "Red mug")))
        hashed = (await feed.recommender.item("A")).vector  # type: ignore[union-attr]
        text_only = Item("A", "Red mug", "Red mug.", ("kitchen",))
        assert hashed == tuple(float(x) for x in item_vector(text_only, 64).astype("float32"))

        # When the worker has run the job, the item's vector is the job's embedding
        [job] = await flow.jobs("A")
        await eventually(lambda: flow.watcher.swapped == 1, "the vector is swapped", timeout_s=20)
        stored = await feed.recommender.item("A")
        assert stored is not None and stored.vector == _projected(_embedding(job)) != hashed
        assert sample(feed, "tidegate_recs_vector_swaps_total") == 1

        # And a price change later keeps it
        await _through(feed, flow, c.row("products", Op.UPDATE, product("A", "Red mug", price=9.0)))
        after = await feed.recommender.item("A")
        assert after is not None and (after.vector, after.price) == (stored.vector, 9.0)
        assert flow.watcher.pending == 0


async def test_an_older_embedding_never_replaces_a_newer_one_nor_revives_a_deleted_product(
    tmp_path: Path, feed: Feed
) -> None:
    async with refresh_flow(tmp_path, feed) as flow:
        c = feed.changes
        # Given two renames of A in a row and a product B deleted right after its insert
        await _through(feed, flow, c.row("products", Op.INSERT, product("A", "Mug")),
                       c.row("products", Op.INSERT, product("B", "Pot")))
        await _through(feed, flow, c.row("products", Op.UPDATE, product("A", "Tall mug")),
                       c.row("products", Op.DELETE, product("B", "Pot")))
        await _through(feed, flow, c.row("products", Op.UPDATE, product("A", "Tall blue mug")))

        # When every job has run
        jobs = await flow.jobs("A")
        assert len(jobs) == 3 and len(await flow.jobs("B")) == 1
        await eventually(lambda: flow.watcher.pending == 0, "every refresh job is settled", timeout_s=20)

        # Then A holds the embedding of its last text only, and B stays deleted
        stored = await feed.recommender.item("A")
        assert stored is not None and stored.name == "Tall blue mug"
        assert stored.vector == _projected(_embedding(jobs[-1]))
        assert await feed.recommender.item("B") is None
        assert sample(feed, "tidegate_recs_refresh_dropped_total", reason="superseded") == 2
        assert sample(feed, "tidegate_recs_refresh_dropped_total", reason="deleted") == 1
        assert flow.watcher.swapped == 1
