"""The demo shop database the embedded change flow watches, and a write load for it.

`create_shop` makes three tables, `products`, `users` and `interactions`, and seeds them
deterministically: from the UCI Online Retail data set when a readable copy is given (stock codes
with their descriptions and prices, customers with their countries, and their purchases), else
from a small generated catalogue. Online Retail: Chen, D. (2015), UCI Machine Learning
Repository, https://doi.org/10.24432/C5BW33, CC BY 4.0.

`ShopLoad` writes what a shop's database sees: mostly interactions (a purchase also takes the
stock down, in the same transaction), some price and stock changes, now and then a new product,
a new user or a deleted product.

Timestamps are written as UTC ISO 8601 with a "Z", so the shop needs no source zone.
"""

from __future__ import annotations

import asyncio
import csv
import gzip
import logging
import random
import re
import sqlite3
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from zoneinfo import ZoneInfo

import orjson

from tidegate._sqlite import connect, immediate

__all__ = [
    "SHOP_SCHEMA",
    "SHOP_TABLES",
    "LoadMix",
    "ShopLoad",
    "ShopSeed",
    "categories_of",
    "create_shop",
]

log = logging.getLogger("tidegate.demo.shop")

SHOP_TABLES = ("products", "users", "interactions")

SHOP_SCHEMA = """
CREATE TABLE IF NOT EXISTS products (
    id TEXT PRIMARY KEY,            -- the stock code
    name TEXT NOT NULL,
    description TEXT NOT NULL,
    price NUMERIC NOT NULL,
    stock INTEGER NOT NULL,
    categories TEXT NOT NULL,       -- JSON array of strings
    embeddings TEXT NULL,           -- JSON array of floats, filled by AI refresh jobs
    updated_at TIMESTAMP NOT NULL
);
CREATE TABLE IF NOT EXISTS users (
    id TEXT PRIMARY KEY,            -- the customer id
    name TEXT NOT NULL,
    country TEXT NOT NULL,
    created_at TIMESTAMP NOT NULL
);
CREATE TABLE IF NOT EXISTS interactions (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    user_id TEXT NOT NULL,
    product_id TEXT NOT NULL,
    kind TEXT NOT NULL CHECK (kind IN ('view', 'add_to_cart', 'purchase')),
    quantity INTEGER NOT NULL DEFAULT 1,
    created_at TIMESTAMP NOT NULL
);
CREATE INDEX IF NOT EXISTS interactions_user ON interactions(user_id, created_at);
"""

# The retailer's invoice times are UK local time.
_RETAIL_ZONE = ZoneInfo("Europe/London")
# Real products have five-digit stock codes (a letter may follow); POST, DOT, M, BANK CHARGES…
# are postage, fees and adjustments.
_STOCK_CODE = re.compile(r"^\d{5}[A-Z]{0,2}$")

# Words of a description → a category; a product falls in every category one of its words names.
_CATEGORY_WORDS: dict[str, tuple[str, ...]] = {
    "christmas": ("CHRISTMAS", "XMAS", "ADVENT", "BAUBLE", "SANTA", "REINDEER", "SNOWFLAKE", "NATIVITY"),
    "kitchen": ("MUG", "CUP", "CUPS", "TEA", "TEACUP", "PLATE", "PLATES", "BOWL", "JAR", "CAKE", "BAKING",
                "LUNCH", "BOTTLE", "NAPKINS", "TRAY", "COOKIE", "CUTTERS", "SPOON", "TEAPOT", "CAKESTAND",
                "RECIPE", "JUG", "APRON", "CUTLERY"),
    "lighting": ("CANDLE", "CANDLES", "T-LIGHT", "LANTERN", "LIGHT", "LIGHTS", "NIGHTLIGHT", "LAMP"),
    "stationery": ("CARD", "CARDS", "WRAP", "PAPER", "RIBBON", "RIBBONS", "TAG", "TAGS", "ENVELOPE",
                   "NOTEBOOK", "JOURNAL", "PEN", "PENCILS", "STICKERS", "TISSUES", "CALENDAR"),
    "home decor": ("FRAME", "CLOCK", "MIRROR", "SIGN", "CUSHION", "DOORMAT", "HOOK", "HOOKS", "HANGER",
                   "DECORATION", "ORNAMENT", "WREATH", "GARLAND", "VASE", "DOORSTOP", "PLAQUE"),
    "kids": ("TOY", "TOYS", "GAME", "DOLL", "DOLLY", "CHILDREN", "CHILDRENS", "CHILDS", "KIDS",
             "SPACEBOY", "PUZZLE", "CRAYONS", "BABY", "PLAYHOUSE", "TEDDY"),
    "garden": ("GARDEN", "PLANT", "PLANTER", "FLOWER", "FLOWERS", "WATERING", "BIRD", "POT", "POTS"),
    "jewellery": ("NECKLACE", "EARRINGS", "BRACELET", "RING", "BROOCH", "JEWELLERY", "DIAMANTE"),
    "bags": ("BAG", "BAGS", "TOTE", "SHOPPER", "PURSE", "HANDBAG", "BACKPACK"),
    "storage": ("BOX", "BOXES", "TIN", "TINS", "BASKET", "DRAWER", "STORAGE", "CASE", "CRATE"),
    "party": ("PARTY", "BIRTHDAY", "BUNTING", "BALLOON", "BALLOONS", "CONFETTI"),
    "vintage": ("VINTAGE", "RETRO", "ANTIQUE", "REGENCY", "VICTORIAN", "BAROQUE"),
    "love": ("HEART", "HEARTS", "LOVE", "VALENTINE", "ROSE", "ROSES"),
}
_WORD_CATEGORY = {word: category for category, words in _CATEGORY_WORDS.items() for word in words}
_DEFAULT_CATEGORY = "gifts"

# The generated catalogue, when the data set is not at hand.
_ADJECTIVES = ("Vintage", "Red", "Pink", "Blue", "Ivory", "Regency", "Rustic", "Polkadot", "Retro", "Floral",
               "Glass", "Enamel", "Wooden", "Zinc", "Paper")
_NOUNS = ("Heart Lantern", "Cake Stand", "Tea Cup", "Lunch Bag", "Storage Tin", "Photo Frame", "Doormat",
          "Candle Holder", "Bunting", "Christmas Bauble", "Alarm Clock", "Garden Planter", "Necklace",
          "Notebook", "Toy Theatre")
_COUNTRIES = ("United Kingdom",) * 8 + ("Germany", "France", "EIRE", "Spain", "Netherlands", "Belgium")
_FIRST_NAMES = ("Ada", "Ben", "Cleo", "Dev", "Elif", "Finn", "Gus", "Hana", "Ivo", "Juno", "Kai", "Lena",
                "Milo", "Nia", "Otto", "Pia", "Quin", "Rosa", "Sami", "Tess")
_GENERATED_START = datetime(2024, 1, 1, tzinfo=UTC)

_INSERT_PRODUCT = "INSERT INTO products VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
_INSERT_USER = "INSERT INTO users VALUES (?, ?, ?, ?)"
_SKIPPED = "skipped"  # a write with nothing to act on (an empty catalogue, a taken id)
_KEPT_HEAD = 20  # the most popular products, which the load never deletes


def categories_of(description: str) -> list[str]:
    """The categories a product description's words name (sorted), or ["gifts"]."""
    words = re.findall(r"[A-Z][A-Z'-]*", description.upper())
    found = sorted({_WORD_CATEGORY[w] for w in words if w in _WORD_CATEGORY})
    return found or [_DEFAULT_CATEGORY]


def _iso(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass(frozen=True, slots=True)
class _Product:
    id: str
    name: str
    description: str
    price: float
    stock: int
    categories: list[str]
    updated_at: str

    def row(self) -> tuple[object, ...]:
        return (self.id, self.name, self.description, self.price, self.stock,
                orjson.dumps(self.categories).decode(), None, self.updated_at)


@dataclass(slots=True)
class _Seed:
    products: dict[str, _Product] = field(default_factory=dict)
    users: dict[str, tuple[str, str, str, str]] = field(default_factory=dict)  # id → users row
    interactions: list[tuple[str, str, str, int, str]] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class ShopSeed:
    """What `create_shop` wrote; all zero when the shop already had products."""

    products: int
    users: int
    interactions: int
    origin: str  # "online-retail", "generated" or "existing"


def create_shop(path: str | Path, *, products: int = 200, users: int = 100, interactions: int = 500,
                data: str | Path | None = None, seed: int = 7) -> ShopSeed:
    """Create the shop's tables in the SQLite file at `path` (WAL) and seed them, unless the shop
    already has products. `data` is a copy of `online_retail.csv.gz`: when it cannot be read,
    a warning says why and the generated catalogue (deterministic for `seed`) is used."""
    conn = connect(str(path), SHOP_SCHEMA)
    try:
        if conn.execute("SELECT EXISTS (SELECT 1 FROM products)").fetchone()[0]:
            return ShopSeed(0, 0, 0, "existing")
        rng = random.Random(seed)
        made, origin = None, "generated"
        if data is not None:
            try:
                made = _from_online_retail(Path(data), products, users, interactions, rng)
                origin = "online-retail"
            except (OSError, ValueError, KeyError, csv.Error, EOFError) as exc:
                log.warning("shop data %s cannot be read (%s): seeding a generated catalogue", data, exc)
        if made is None:
            made = _generated(products, users, interactions, rng)
        immediate(conn, lambda c: _insert(c, made))
        return ShopSeed(len(made.products), len(made.users), len(made.interactions), origin)
    finally:
        conn.close()


def _insert(conn: sqlite3.Connection, made: _Seed) -> None:
    conn.executemany(_INSERT_PRODUCT, [p.row() for p in made.products.values()])
    conn.executemany(_INSERT_USER, list(made.users.values()))
    conn.executemany("INSERT INTO interactions (user_id, product_id, kind, quantity, created_at) "
                     "VALUES (?, ?, ?, ?, ?)", made.interactions)


def _retail_lines(path: Path) -> Iterator[dict[str, str]]:
    with gzip.open(path, "rt", encoding="utf-8", newline="") as file:
        reader = csv.DictReader(file)
        missing = {"InvoiceNo", "StockCode", "Description", "Quantity", "InvoiceDate", "UnitPrice",
                   "CustomerID", "Country"} - set(reader.fieldnames or ())
        if missing:
            raise ValueError(f"not the Online Retail layout: no column(s) {', '.join(sorted(missing))}")
        yield from reader


def _from_online_retail(path: Path, products: int, users: int, interactions: int,
                        rng: random.Random) -> _Seed:
    """The first `products` stock codes and `users` customers of the data set, in file order,
    and the purchases among them."""
    made = _Seed()
    for line in _retail_lines(path):
        if (len(made.products) >= products and len(made.users) >= users
                and len(made.interactions) >= interactions):
            break
        code, description = line["StockCode"].strip().upper(), line["Description"].strip()
        quantity, price = int(line["Quantity"]), float(line["UnitPrice"])
        if line["InvoiceNo"].startswith("C") or quantity <= 0 or price <= 0 or not description:
            continue  # cancellations, returns and adjustments
        when = _iso(datetime.fromisoformat(line["InvoiceDate"]).replace(tzinfo=_RETAIL_ZONE))
        if _STOCK_CODE.match(code) and code not in made.products and len(made.products) < products:
            stock = rng.randint(0, 500)
            made.products[code] = _Product(code, description.title(), description.capitalize(),
                                           round(price, 2), stock, categories_of(description), when)
        customer = line["CustomerID"].strip()
        if customer:
            customer = str(int(float(customer)))
            if customer not in made.users and len(made.users) < users:
                made.users[customer] = (customer, f"Customer {customer}", line["Country"].strip(), when)
        if (code in made.products and customer in made.users and len(made.interactions) < interactions):
            made.interactions.append((customer, code, "purchase", quantity, when))
    if not made.products or not made.users:
        raise ValueError("no products or no customers found")
    return made


def _generated(products: int, users: int, interactions: int, rng: random.Random) -> _Seed:
    made = _Seed()
    moment = _GENERATED_START.timestamp()
    for number in range(products):
        name = f"{rng.choice(_ADJECTIVES)} {rng.choice(_NOUNS)}"
        code = f"{10000 + number:05d}"
        made.products[code] = _Product(code, name, f"{name.capitalize()}.", round(rng.uniform(0.4, 15.0), 2),
                                       rng.randint(0, 500), categories_of(name),
                                       _iso(datetime.fromtimestamp(moment + number * 60, UTC)))
    for number in range(users):
        ident = str(12000 + number)
        made.users[ident] = (ident, f"{rng.choice(_FIRST_NAMES)} {number}", rng.choice(_COUNTRIES),
                             _iso(datetime.fromtimestamp(moment + number * 600, UTC)))
    codes, idents = list(made.products), list(made.users)
    for number in range(interactions if codes and idents else 0):
        when = _iso(datetime.fromtimestamp(moment + 86_400 + number * 30, UTC))
        quantity = rng.randint(1, 12)
        made.interactions.append((rng.choice(idents), rng.choice(codes), "purchase", quantity, when))
    return made


# ---------------------------------------------------------------------- write load


@dataclass(frozen=True, slots=True)
class LoadMix:
    """The share of each kind of write (normalised to their sum)."""

    interaction: float = 0.86
    price: float = 0.05
    stock: float = 0.04
    new_product: float = 0.02
    new_user: float = 0.02
    delete_product: float = 0.01
    # Of the interactions: views, then adds to cart, then purchases.
    kinds: tuple[float, float, float] = (0.75, 0.17, 0.08)


class ShopLoad:
    """Writes a realistic mix to the shop at `path`, each write one transaction. Deterministic
    for a seed and a starting database (timestamps aside). Use `write(count)` from a thread of
    your own, or `run(rate_per_s, duration_s)` from the event loop."""

    def __init__(self, path: str | Path, *, seed: int = 11, mix: LoadMix | None = None) -> None:
        self.path = str(path)
        self.mix = mix or LoadMix()
        self.counts: Counter[str] = Counter()  # writes done, by LoadMix field ("skipped": nothing to act on)
        self.interaction_kinds: Counter[str] = Counter()  # interactions written: view, add_to_cart…
        self._rng = random.Random(seed)
        self._conn: sqlite3.Connection | None = None
        self._products: list[str] = []
        self._users: list[str] = []
        kinds = ("interaction", "price", "stock", "new_product", "new_user", "delete_product")
        self._writes: dict[str, Callable[[sqlite3.Connection], str]] = {
            kind: getattr(self, f"_{kind}") for kind in kinds}
        self._weights = [getattr(self.mix, kind) for kind in kinds]

    def close(self) -> None:
        """Close the connection (a later write opens a new one)."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def write(self, count: int) -> Counter[str]:
        """Perform `count` writes now; what was written, by kind (the LoadMix field names)."""
        conn = self._connection()
        done: Counter[str] = Counter()
        for _ in range(count):
            kind = self._rng.choices(list(self._writes), self._weights)[0]
            done[immediate(conn, self._writes[kind])] += 1
        self.counts.update(done)
        return done

    async def run(self, rate_per_s: float, duration_s: float,
                  stop: asyncio.Event | None = None) -> Counter[str]:
        """Perform `rate_per_s * duration_s` writes spread evenly over `duration_s`, on a worker
        thread, or fewer if `stop` is set first; what was written, by kind (the LoadMix field
        names). Writes that fall behind (a slow disk, a busy machine) are caught up, so the count
        holds and only the pace slips."""
        if rate_per_s <= 0 or duration_s < 0:
            raise ValueError("rate_per_s must be > 0 and duration_s >= 0")
        total = int(rate_per_s * duration_s)
        done: Counter[str] = Counter()
        written = 0
        started = time.monotonic()
        tick_s = min(0.02, 1.0 / rate_per_s)
        while written < total and not (stop is not None and stop.is_set()):
            due = min(total, int((time.monotonic() - started) * rate_per_s) + 1) - written
            if due > 0:
                done.update(await asyncio.to_thread(self.write, due))
                written += due
            if written < total:
                await asyncio.sleep(tick_s)
        return done

    # -- one write each ---------------------------------------------------------------------

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            self._conn = connect(self.path, "")
            self._products = [r[0] for r in self._conn.execute("SELECT id FROM products ORDER BY rowid")]
            self._users = [r[0] for r in self._conn.execute("SELECT id FROM users ORDER BY rowid")]
        return self._conn

    def _product(self) -> str | None:
        # Popularity falls with catalogue position (long tail): a few products get most traffic.
        if not self._products:
            return None
        rank = min(int(self._rng.paretovariate(1.2)) - 1, len(self._products) - 1)
        return self._products[rank] if self._rng.random() < 0.6 else self._rng.choice(self._products)

    def _interaction(self, conn: sqlite3.Connection) -> str:
        product = self._product()
        if product is None or not self._users:
            return _SKIPPED
        user = self._rng.choice(self._users)
        kind = self._rng.choices(("view", "add_to_cart", "purchase"), self.mix.kinds)[0]
        quantity = self._rng.randint(1, 6) if kind != "view" else 1
        now = _iso(datetime.now(UTC))
        conn.execute("INSERT INTO interactions (user_id, product_id, kind, quantity, created_at) "
                     "VALUES (?, ?, ?, ?, ?)", (user, product, kind, quantity, now))
        if kind == "purchase":
            conn.execute("UPDATE products SET stock = max(stock - ?, 0), updated_at = ? WHERE id = ?",
                         (quantity, now, product))
        self.interaction_kinds[kind] += 1
        return "interaction"

    def _price(self, conn: sqlite3.Connection) -> str:
        product = self._product()
        if product is None:
            return _SKIPPED
        factor = self._rng.uniform(0.85, 1.15)
        conn.execute("UPDATE products SET price = max(round(price * ?, 2), 0.01), updated_at = ? "
                     "WHERE id = ?", (factor, _iso(datetime.now(UTC)), product))
        return "price"

    def _stock(self, conn: sqlite3.Connection) -> str:
        product = self._product()
        if product is None:
            return _SKIPPED
        conn.execute("UPDATE products SET stock = stock + ?, updated_at = ? WHERE id = ?",
                     (self._rng.randint(10, 100), _iso(datetime.now(UTC)), product))
        return "stock"

    def _new_product(self, conn: sqlite3.Connection) -> str:
        name = f"{self._rng.choice(_ADJECTIVES)} {self._rng.choice(_NOUNS)}"
        code = f"N{self._rng.getrandbits(32):08X}"
        product = _Product(code, name, f"{name.capitalize()}, new this season.",
                           round(self._rng.uniform(0.4, 15.0), 2), self._rng.randint(10, 200),
                           categories_of(name), _iso(datetime.now(UTC)))
        if not conn.execute(f"{_INSERT_PRODUCT} ON CONFLICT (id) DO NOTHING", product.row()).rowcount:
            return _SKIPPED  # another writer with the same seed made it first
        self._products.append(code)
        return "new_product"

    def _new_user(self, conn: sqlite3.Connection) -> str:
        ident = f"W{self._rng.getrandbits(32):08X}"
        row = (ident, f"{self._rng.choice(_FIRST_NAMES)} {ident[-4:]}", self._rng.choice(_COUNTRIES),
               _iso(datetime.now(UTC)))
        if not conn.execute(f"{_INSERT_USER} ON CONFLICT (id) DO NOTHING", row).rowcount:
            return _SKIPPED
        self._users.append(ident)
        return "new_user"

    def _delete_product(self, conn: sqlite3.Connection) -> str:
        # Never the head of the catalogue, so the popular products stay and traffic keeps its shape.
        if len(self._products) <= _KEPT_HEAD:
            return _SKIPPED
        product = self._products.pop(self._rng.randrange(_KEPT_HEAD, len(self._products)))
        conn.execute("DELETE FROM products WHERE id = ?", (product,))
        return "delete_product"
