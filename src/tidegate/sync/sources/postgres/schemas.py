"""The PostgreSQL source's schema watch: a table whose columns changed while no one wrote to it
brings no Relation message, so the catalog is compared with the shapes the stream knows every
`schema_check_s`, and a difference is announced in the WAL for the stream to act on (a backfill,
or the removal of a dropped table's rows; see tidegate.sync.backfill)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

from tidegate.errors import SourceError
from tidegate.sync.backfill import SCHEMA_PREFIX, Shape, schema_message, shapes_of_catalog
from tidegate.sync.sources.postgres import catalog as pg_catalog
from tidegate.sync.sources.postgres.settings import PostgresSourceSettings, catalog_errors
from tidegate.sync.sources.postgres.stream import TransactionAssembler

__all__ = ["SchemaWatch"]

logger = logging.getLogger(__name__)


class SchemaWatch:
    """Compares the configured tables' catalog shapes with the stream's (see the module doc)."""

    def __init__(self, connect: Callable[[], Any], where: str, settings: PostgresSourceSettings) -> None:
        self._connect = connect
        self._where = where
        self.settings = settings

    async def run(self, assembler: TransactionAssembler) -> None:
        """Compare the catalog with the shapes `assembler` knows, every `schema_check_s`, until
        cancelled."""
        interval = self.settings.schema_check_s
        if interval is None:
            return
        pending: dict[str, Shape | None] = {}
        announced: dict[str, Shape | None] = {}
        while True:
            try:
                await asyncio.to_thread(self._check, assembler, pending, announced)
            except SourceError as exc:
                logger.warning("cannot compare the tables' schemas with the catalog: %s", exc)
            except Exception:  # the stream goes on; a check that fails is said, not swallowed
                logger.exception("comparing the tables' schemas with the catalog failed")
            await asyncio.sleep(interval)

    def _check(self, assembler: TransactionAssembler, pending: dict[str, Shape | None],
                       announced: dict[str, Shape | None]) -> None:
        """A table whose catalog shape differs from the stream's for two checks in a row (a
        write to it brings a Relation message meanwhile, so most changes never get here) is
        announced with a schema message in the WAL; the stream turns it into a backfill, or for
        a dropped table into the removal of its rows. A re-created table is published again."""
        missing = object()
        with contextlib.closing(self._connect()) as conn, conn.cursor() as cur, \
                catalog_errors(f"comparing schemas at {self._where}"):
            for name, shape in shapes_of_catalog(cur, self.settings.tables).items():
                entity_type = pg_catalog.entity_type_of_name(name)
                if assembler.shapes.get(entity_type, missing) == shape:
                    pending.pop(entity_type, None)
                    announced.pop(entity_type, None)
                    continue
                if pending.get(entity_type, missing) != shape:
                    pending[entity_type] = shape
                    continue
                if announced.get(entity_type, missing) == shape:
                    continue
                if shape is not None:
                    (table,) = pg_catalog.inspect_tables(cur, [name])
                    assembler.follow(table)
                    pg_catalog.ensure_publication(cur, self.settings.publication_name, [table])
                else:
                    logger.warning("configured table %s was dropped: its cached rows are removed; "
                                   "it is followed again if it is created again", name)
                cur.execute("SELECT pg_logical_emit_message(true, %s, %s)",
                            (SCHEMA_PREFIX, schema_message(entity_type, shape)))
                announced[entity_type] = shape
