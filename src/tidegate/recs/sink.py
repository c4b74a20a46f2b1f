"""`RecsSink`: the change flow's sink that keeps the recommender in step with the database.

For each batch the entity cache applied (stale changes are skipped: the cache already holds that
version or a newer one, so the recommender has seen it):

- a product inserted or updated becomes an `Item` (its categories from a JSON text column, its
  vector from the `embeddings` column when that holds one) and is upserted; a product out of
  stock stays known but is never recommended while out of stock. A change that leaves the
  product's text as it was (a price or stock change) keeps the vector the recommender holds, so
  it never undoes the embedding an AI refresh job brought (`swap_vector`, see
  tidegate.recs.refresh_watch);
- a product deleted, or the products table truncated, is removed;
- an interaction inserted becomes an `Interaction`; the batch's interactions are recorded in one
  call, after the batch's product changes (so an interaction finds the product it names).

Table and column names are a `RecsMapping` (the demo shop's by default, see
tidegate.sync.shop.SHOP_SCHEMA). A row the sink cannot read (an unknown interaction kind, a bad
timestamp, a price that is no number) is logged with its entity id and counted, never raised:
one bad row must not stop the change flow. Errors of the recommender's store are raised, so the
pipeline stops and is restarted without confirming the batch.

Each applied change's commit → recommendation-updated time goes into the monitor's histogram
`tidegate_recs_commit_to_updated_seconds`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation

import orjson

from tidegate.recs.engine import Recommender
from tidegate.recs.model import Interaction, InteractionKind, Item
from tidegate.recs.monitor import RecsMonitor
from tidegate.sync.changes import MAX_ORDINAL, Change, Op
from tidegate.sync.contracts import ApplyOutcome, ApplyResult
from tidegate.sync.values import JsonValue, Row, canonical_json, normalise_timestamp

__all__ = [
    "MalformedRow",
    "RecsMapping",
    "RecsSink",
    "interaction_from_row",
    "item_from_row",
]

log = logging.getLogger("tidegate.recs")


@dataclass(frozen=True, slots=True)
class RecsMapping:
    """Which tables and columns hold products and interactions. The defaults are the demo
    shop's; a column set to None is not read (the field keeps its default)."""

    products: str = "products"  # entity type (PostgreSQL: the table, without `public.`)
    product_name: str | None = "name"
    product_description: str | None = "description"
    product_categories: str | None = "categories"  # a JSON array of strings, or a plain string
    product_price: str | None = "price"
    product_stock: str | None = "stock"
    product_vector: str | None = "embeddings"  # a JSON array of numbers
    interactions: str = "interactions"
    interaction_user: str = "user_id"
    interaction_item: str = "product_id"
    interaction_kind: str = "kind"  # view, add_to_cart or purchase
    interaction_quantity: str | None = "quantity"
    interaction_time: str | None = "created_at"  # NULL or no column: the commit time


class MalformedRow(ValueError):
    """A row the sink cannot turn into an item or an interaction; the message says why."""


# -- mapping rows ---------------------------------------------------------------------------

_KINDS = {kind.value: kind for kind in InteractionKind}


def _text_id(value: JsonValue, what: str) -> str:
    """An id as text: strings as they are, numbers in their canonical JSON form (as the cache's
    entity ids are), anything else refused."""
    if isinstance(value, str) and value:
        return value
    if isinstance(value, int | float | Decimal) and not isinstance(value, bool):
        return canonical_json(value).decode()
    raise MalformedRow(f"{what} {value!r} is not an id")


def _number(value: JsonValue, what: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool):
        raise MalformedRow(f"{what} {value!r} is not a number")
    try:
        number = float(Decimal(value) if isinstance(value, str) else value)
    except (InvalidOperation, TypeError, ValueError):
        raise MalformedRow(f"{what} {value!r} is not a number") from None
    if not math.isfinite(number) or number < 0:
        raise MalformedRow(f"{what} {value!r} is not a finite number >= 0")
    return number


def _whole(value: JsonValue, what: str) -> int | None:
    number = _number(value, what)
    if number is None:
        return None
    if number != int(number):
        raise MalformedRow(f"{what} {value!r} is not a whole number")
    return int(number)


def _json(value: JsonValue, what: str) -> JsonValue:
    if not isinstance(value, str):
        return value
    try:
        return orjson.loads(value)
    except orjson.JSONDecodeError as exc:
        raise MalformedRow(f"{what} is not JSON ({exc})") from None


def _categories(value: JsonValue) -> tuple[str, ...]:
    if value is None or value == "":
        return ()
    if isinstance(value, str) and not value.lstrip().startswith("["):
        return (value.strip(),)  # one plain category
    parsed = _json(value, "categories")
    if not isinstance(parsed, list) or not all(isinstance(c, str) for c in parsed):
        raise MalformedRow(f"categories {value!r} is not a list of strings")
    return tuple(dict.fromkeys(c.strip() for c in parsed if c.strip()))


def _vector(value: JsonValue) -> tuple[float, ...] | None:
    if value is None or value == "":
        return None
    parsed = _json(value, "the vector")
    if not isinstance(parsed, list) or not parsed or not all(
            isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x) for x in parsed):
        raise MalformedRow("the vector is not a non-empty list of finite numbers")
    return tuple(float(x) for x in parsed)


def _text(row: Row, column: str | None) -> str:
    value = row.get(column) if column else None
    return "" if value is None else str(value)


def item_from_row(item_id: str, row: Row, mapping: RecsMapping = RecsMapping()) -> tuple[Item, list[str]]:
    """The item a product row describes, and the problems of optional columns that were left out
    (unreadable categories or vector: the item is still good without them). A price or stock
    that is no number raises MalformedRow."""
    problems: list[str] = []
    price = _number(row.get(mapping.product_price), "price") if mapping.product_price else None
    stock = _whole(row.get(mapping.product_stock), "stock") if mapping.product_stock else None
    categories: tuple[str, ...] = ()
    if mapping.product_categories:
        try:
            categories = _categories(row.get(mapping.product_categories))
        except MalformedRow as exc:
            problems.append(str(exc))
    vector = None
    if mapping.product_vector:
        try:
            vector = _vector(row.get(mapping.product_vector))
        except MalformedRow as exc:
            problems.append(str(exc))
    item = Item(item_id=item_id, name=_text(row, mapping.product_name),
                description=_text(row, mapping.product_description), categories=categories,
                price=price, stock=stock, vector=vector)
    return item, problems


def interaction_from_row(row: Row, commit_time: datetime,
                         mapping: RecsMapping = RecsMapping()) -> Interaction:
    """The interaction an interactions row records; MalformedRow says why it cannot be read. A
    row without a time is taken to have happened at its commit."""
    user_id = _text_id(row.get(mapping.interaction_user), "user id")
    item_id = _text_id(row.get(mapping.interaction_item), "item id")
    raw_kind = row.get(mapping.interaction_kind)
    kind = _KINDS.get(raw_kind) if isinstance(raw_kind, str) else None
    if kind is None:
        raise MalformedRow(f"unknown interaction kind {raw_kind!r} (known: {', '.join(_KINDS)})")
    quantity = 1
    if mapping.interaction_quantity:
        raw_quantity = row.get(mapping.interaction_quantity)
        # An int column's value as it comes is the common case; anything else is checked in full.
        given = raw_quantity if type(raw_quantity) is int else _whole(raw_quantity, "quantity")
        if given is not None:
            if given < 1:
                raise MalformedRow(f"quantity {given} is not >= 1")
            quantity = given
    at = commit_time
    raw_time = row.get(mapping.interaction_time) if mapping.interaction_time else None
    if isinstance(raw_time, datetime) and raw_time.tzinfo is not None:
        # What the PostgreSQL source sends: normalise_timestamp's round trip through text would
        # give the same instant in UTC, at several times the cost.
        at = raw_time if raw_time.tzinfo is UTC else raw_time.astimezone(UTC)
    elif raw_time is not None:
        try:
            at = datetime.fromisoformat(normalise_timestamp(raw_time))
        except ValueError as exc:  # InvalidChange is a ValueError
            raise MalformedRow(f"bad timestamp: {exc}") from None
    return Interaction(user_id=user_id, item_id=item_id, kind=kind, at=at, quantity=quantity)


# -- the sink -------------------------------------------------------------------------------


def _streamed(change: Change) -> bool:
    """Whether the change came from the source's stream. A snapshot row's commit time is when
    the snapshot read it, so its freshness means nothing (SQLite's snapshot rows and a re-read
    table's carry the highest ordinal; PostgreSQL's snapshot rows carry no capture time)."""
    return change.captured_at > 0 and change.version.ordinal != MAX_ORDINAL


class RecsSink:
    """Feeds applied product and interaction changes to a recommender (a change-flow `Sink`)."""

    name = "recs"

    def __init__(self, recommender: Recommender, *, mapping: RecsMapping | None = None,
                 monitor: RecsMonitor | None = None) -> None:
        self.recommender = recommender
        self.mapping = mapping or RecsMapping()
        self.monitor = monitor or RecsMonitor()
        self.applied = 0  # changes applied to the recommender since start
        self.malformed = 0  # rows skipped as unreadable since start
        # Product writes one at a time: a vector swap must not fall between a change reading an
        # item's current vector and writing the item back.
        self._products_lock = asyncio.Lock()

    async def apply(self, results: Sequence[ApplyResult]) -> None:
        """Apply the batch's product changes in order, then record its interactions in one call."""
        interactions: list[tuple[Change, Interaction]] = []
        for result in results:
            change = result.change
            if result.outcome is not ApplyOutcome.APPLIED:
                continue
            if change.entity_type == self.mapping.products:
                async with self._products_lock:
                    await self._product(result)
            elif change.entity_type == self.mapping.interactions:
                found = self._interaction(change)
                if found is not None:
                    interactions.append((change, found))
        if interactions:
            await self._record(interactions)

    async def swap_vector(self, item_id: str, vector: tuple[float, ...],
                          current_row: Callable[[], Awaitable[Row | None]]) -> str:
        """Upsert the product as `current_row` reads it now (read under the products lock, so no
        change of the product falls in between) with `vector`, an embedding a refresh job
        computed for its text. Returns "swapped", or why not: "deleted" (no row any more) or
        "malformed" (the row cannot be read; logged)."""
        async with self._products_lock:
            row = await current_row()
            if row is None:
                return "deleted"
            try:
                item, _ = item_from_row(item_id, row, self.mapping)
            except MalformedRow as exc:
                log.warning("%s %s: the row cannot be read (%s); its vector is not swapped",
                            self.mapping.products, item_id, exc)
                return "malformed"
            await self.recommender.upsert_item(dataclasses.replace(item, vector=vector))
        return "swapped"

    def _same_text(self, before: Row | None, after: Row) -> bool:
        if before is None:
            return False
        mapping = self.mapping
        columns = (mapping.product_name, mapping.product_description, mapping.product_categories)
        return all(before.get(c) == after.get(c) for c in columns if c)

    async def _product(self, result: ApplyResult) -> None:
        change = result.change
        products = self.mapping.products
        if change.op is Op.TRUNCATE:
            for item_id in await self._catalogue():
                await self.recommender.remove_item(item_id)
            self._measured(change)
            return
        if change.op is Op.DELETE:
            await self.recommender.remove_item(change.entity_id)
            self._measured(change)
            return
        try:
            item, problems = item_from_row(change.entity_id, change.after or {}, self.mapping)
        except MalformedRow as exc:
            self._malformed(change, str(exc))
            return
        for problem in problems:
            log.warning("%s %s: %s; the item is kept without it", products, change.entity_id, problem)
        previous = result.previous if result.previous is not None else change.before
        if item.vector is None and self._same_text(previous, change.after or {}):
            current = await self.recommender.item(item.item_id)
            if current is not None and current.vector is not None:
                item = dataclasses.replace(item, vector=current.vector)
        try:
            await self.recommender.upsert_item(item)
        except ValueError as exc:
            if item.vector is None:
                self._malformed(change, f"refused by the recommender: {exc}")
                return
            log.warning("%s %s: vector refused by the recommender (%s); the item is kept without it",
                        products, change.entity_id, exc)
            await self.recommender.upsert_item(dataclasses.replace(item, vector=None))
        self._measured(change)

    async def _catalogue(self) -> list[str]:
        """Every item the recommender's store holds (its change log, read from the start)."""
        store, version, found = self.recommender.store, 0, []
        while True:
            page = await store.items_since(version, 1000)
            found += [item_id for item_id, item in page.changes if item is not None]
            version = page.version
            if page.complete:
                return found

    def _interaction(self, change: Change) -> Interaction | None:
        if change.op is not Op.INSERT:
            # An interaction is an event: later edits or deletes of its row do not undo it.
            self.monitor.changes_of(change.entity_type, "ignored").inc()
            return None
        try:
            return interaction_from_row(change.after or {}, change.commit_time, self.mapping)
        except MalformedRow as exc:
            self._malformed(change, str(exc))
            return None

    async def _record(self, batch: list[tuple[Change, Interaction]]) -> None:
        try:
            await self.recommender.record([interaction for _, interaction in batch])
        except ValueError:
            # The recommender refused something the mapping let through: find which one, so the
            # others are still recorded and the culprit is named.
            kept = []
            for change, interaction in batch:
                try:
                    await self.recommender.record([interaction])
                except ValueError as exc:
                    self._malformed(change, f"refused by the recommender: {exc}")
                else:
                    kept.append((change, interaction))
            batch = kept
        now = time.time()
        activity = self.monitor.activity
        streamed = []
        for change, interaction in batch:
            activity.add(interaction.user_id)
            if _streamed(change):
                streamed.append(now - change.commit_time.timestamp())
        if batch:
            # One entity type per batch of interactions: the metrics' children are looked up once.
            entity_type = batch[0][0].entity_type
            self.applied += len(batch)
            self.monitor.changes_of(entity_type, "applied").inc(len(batch))
            observe = self.monitor.commit_to_updated_of(entity_type).observe
            for age_s in streamed:
                observe(max(0.0, age_s))
        self.monitor.interactions.labels("change_flow").inc(len(batch))

    def _measured(self, change: Change) -> None:
        self.applied += 1
        self.monitor.changes_of(change.entity_type, "applied").inc()
        if _streamed(change):
            age_s = max(0.0, time.time() - change.commit_time.timestamp())
            self.monitor.commit_to_updated_of(change.entity_type).observe(age_s)

    def _malformed(self, change: Change, reason: str) -> None:
        self.malformed += 1
        self.monitor.changes_of(change.entity_type, "malformed").inc()
        log.warning("%s %s (version %s) skipped by the recommender: %s", change.entity_type,
                    change.entity_id, change.version, reason)
