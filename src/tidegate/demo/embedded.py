"""The change flow `tidegate up` runs on embedded defaults: the demo shop in
`.tidegate/shop.db` (created and seeded on first start), the in-process bus and a memory cache,
and one AI refresh rule — a product whose name or description changes gets a new embedding,
requested at LOW priority through the queue."""

from __future__ import annotations

import logging
from pathlib import Path
from urllib.parse import urlsplit

from tidegate._sqlite import sqlite_path
from tidegate.config import RefreshRule, TidegateConfig
from tidegate.demo.shop import SHOP_TABLES, create_shop
from tidegate.jobs import Priority

__all__ = ["DEMO_SHOP_REFRESH", "embedded_sync_config"]

log = logging.getLogger("tidegate.sync")

DEMO_SHOP_REFRESH = RefreshRule(entity_type="products", columns=("name", "description"),
                                text="{name}\n{description}", priority=Priority.LOW)


def embedded_sync_config(config: TidegateConfig, *, shop_data: str | Path | None = None) -> TidegateConfig:
    """`config` ready for `tidegate up`'s change flow. A SQLite source that does not exist yet
    becomes the demo shop, seeded from `shop_data` (a copy of the UCI Online Retail data) when
    given, else from a generated catalogue; for the shop's tables without a configured refresh
    rule, the demo shop's rule is added. PostgreSQL sources are used as they are."""
    sync = config.sync
    parts = urlsplit(sync.source_url)
    if parts.scheme != "sqlite":
        return config
    path = Path(sqlite_path(sync.source_url))
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        seeded = create_shop(path, data=shop_data)
        log.info("created the demo shop %s: %d products, %d users, %d interactions (%s)", path,
                 seeded.products, seeded.users, seeded.interactions, seeded.origin)
    if sync.refresh or tuple(sync.tables) != SHOP_TABLES:
        return config
    return config.model_copy(update={"sync": sync.model_copy(update={"refresh": (DEMO_SHOP_REFRESH,)})})
