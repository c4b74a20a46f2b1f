"""Storage format versions: every store tidegate writes says which format it is in, is migrated
forward when opened, and is refused — never misread — when it is newer than this code.

A store declares a `StoreFormat` next to its schema: its name, the format this code writes, and
the ordered migrations that bring an older one to it (format 0 is "no version at all", what
0.1.0 wrote). Opening the store runs `open_sqlite_store` or `open_redis_store`, which read the
store's version, refuse a newer one (`StoreFormatError`, naming both versions), run the pending
migrations and write the new version — all in one transaction (SQLite) or one script (Redis).

Where the versions live:

- SQLite: the queue's file holds the queue and the coordination stores together, so one
  `PRAGMA user_version` cannot version each of them. It versions the file's layout instead
  (`SQLITE_LAYOUT`: 1 = "a tidegate file whose stores' formats are in the table
  `tidegate_store_formats`"), and that table holds one row (store, version) per store. A file
  tidegate does not own (the change source's database, whose `user_version` is its
  application's) keeps the table only.
- Redis: one hash per keyspace (`…:formats`, under the keyspace's hash tag), one field per store
  kept there, changed by one script (`_REDIS_LUA`) that compares and stamps atomically.

A store with no version yet is new when it holds nothing (stamped current at once) and format 0
when it holds data (its tables exist, its probe keys exist). `migrating("check")` (the
`[storage] migrate = "check"` setting) makes opening refuse pending migrations instead of running
them, for operators who run `tidegate migrate --apply` themselves.
"""

from __future__ import annotations

import contextlib
import re
import sqlite3
from collections.abc import Callable, Iterator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from tidegate.errors import StoreFormatError

if TYPE_CHECKING:
    from tidegate._redis import RedisClient

__all__ = [
    "FORMATS_TABLE",
    "SQLITE_LAYOUT",
    "FormatCheck",
    "FormatReport",
    "MigrateMode",
    "Migration",
    "RedisStore",
    "StoreFormat",
    "inspect_sqlite_store",
    "migrate_mode",
    "migrating",
    "open_redis_store",
    "open_sqlite_store",
]

MigrateMode = Literal["auto", "check"]
"""auto: pending migrations run when a store opens; check: a store with pending ones is refused."""
Outcome = Literal["current", "stamped", "migrated", "pending", "newer"]
"""What opening (or looking at) a store found: already current; new and stamped current; migrated;
migrations pending (not run: `check`, or only looked at); newer than this code (refused)."""

SQLITE_LAYOUT = 1
FORMATS_TABLE = "tidegate_store_formats"
_CREATE_TABLE = (f"CREATE TABLE IF NOT EXISTS {FORMATS_TABLE} "
                 "(store TEXT PRIMARY KEY, version INTEGER NOT NULL) WITHOUT ROWID")
_TABLE_NAME = re.compile(r"CREATE\s+TABLE\s+IF\s+NOT\s+EXISTS\s+(\w+)", re.IGNORECASE)

# The mode stores built in this context open with: captured when a store is built (a store opens
# later, on a thread of its own or at first use), so the composition root sets it around building.
_MODE: ContextVar[MigrateMode] = ContextVar("tidegate_migrate_mode", default="auto")


def migrate_mode() -> MigrateMode:
    """The migrate mode of stores built now (see `migrating`)."""
    return _MODE.get()


@contextlib.contextmanager
def migrating(mode: MigrateMode) -> Iterator[None]:
    """Stores built inside this block open with `mode` (the default is "auto")."""
    token = _MODE.set(mode)
    try:
        yield
    finally:
        _MODE.reset(token)


@dataclass(frozen=True, slots=True)
class Migration:
    """One step forward, to format `to`. `sqlite` changes a SQLite store inside the opening
    transaction; None means the step only records the version (the layout did not change)."""

    to: int
    what: str
    sqlite: Callable[[sqlite3.Connection], None] | None = None


@dataclass(frozen=True, slots=True)
class StoreFormat:
    """A store's format: its `store` name (a row of the formats table, a field of a keyspace's
    formats hash), the `version` this code writes, and the migrations to it, one per version
    from 1 up, in order."""

    store: str
    version: int
    migrations: tuple[Migration, ...] = field(default=())

    def __post_init__(self) -> None:
        if [step.to for step in self.migrations] != list(range(1, self.version + 1)):
            raise ValueError(f"store {self.store!r}: one migration to each format 1..{self.version}")

    @classmethod
    def initial(cls, store: str) -> StoreFormat:
        """Format 1 of a store whose layout is still 0.1.0's: its one migration records it."""
        return cls(store, 1, (Migration(1, f"record the {store} store's format (0.1.0's layout)"),))

    def steps_from(self, found: int) -> tuple[Migration, ...]:
        """The migrations that bring format `found` to this code's."""
        return self.migrations[found:]


@dataclass(frozen=True, slots=True)
class FormatReport:
    """What opening or inspecting one store found: its format before (None: a new store, holding
    nothing) and the code's, and what was done (`outcome`)."""

    store: str
    where: str
    found: int | None
    code: int
    outcome: Outcome
    done: tuple[str, ...] = ()  # the migrations run, by their `what`

    @property
    def needs_action(self) -> bool:
        """Whether an operator must act: migrations pending, or a store newer than the code."""
        return self.outcome in ("pending", "newer")

    def line(self) -> str:
        """One line for `tidegate migrate`: the store, where, its format and the code's."""
        found = "new" if self.found is None else f"format {self.found}"
        text = f"{self.store} at {self.where}: {found}, code format {self.code}: {self.outcome}"
        return text + "".join(f"\n  ran: {step}" for step in self.done)


def newer_error(fmt: StoreFormat, where: str, found: int) -> StoreFormatError:
    """A store newer than this code: refused with both versions and what to do."""
    return StoreFormatError(
        f"the {fmt.store} store at {where} is in format {found}, newer than this tidegate reads "
        f"(format {fmt.version}): upgrade tidegate to a release that reads format {found}; "
        "nothing in the store was changed",
        store=fmt.store, where=where, found=found, readable=fmt.version)


def pending_error(fmt: StoreFormat, where: str, found: int) -> StoreFormatError:
    """A store with migrations pending under `migrate = "check"`."""
    return StoreFormatError(
        f"the {fmt.store} store at {where} is in format {found} and this tidegate writes format "
        f"{fmt.version}: run `tidegate migrate --apply` (or set [storage] migrate = \"auto\")",
        store=fmt.store, where=where, found=found, readable=fmt.version)


# -- SQLite ----------------------------------------------------------------------------------


def schema_statements(schema: str) -> list[str]:
    """The statements of a schema script, so they can run inside one transaction (Python's
    `executescript` commits first)."""
    statements: list[str] = []
    pending = ""
    for piece in schema.split(";"):
        pending += piece + ";"
        if sqlite3.complete_statement(pending):
            if pending.strip(" \n\t;"):
                statements.append(pending)
            pending = ""
    if pending.strip(" \n\t;"):
        statements.append(pending)
    return statements


def _sqlite_found(conn: sqlite3.Connection, fmt: StoreFormat, schema: str, where: str, *,
                  owns_file: bool) -> int | None:
    """The store's format (None: new), refusing a file whose layout is newer than this code's."""
    if owns_file:
        layout = int(conn.execute("PRAGMA user_version").fetchone()[0])
        if layout > SQLITE_LAYOUT:
            raise StoreFormatError(
                f"the SQLite file at {where} has tidegate file layout {layout}, newer than this "
                f"tidegate reads (layout {SQLITE_LAYOUT}): upgrade tidegate to a release that reads "
                f"layout {layout}; nothing in the file was changed",
                store="file", where=where, found=layout, readable=SQLITE_LAYOUT)
    tables = {str(row[0]) for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    if FORMATS_TABLE in tables:
        row = conn.execute(f"SELECT version FROM {FORMATS_TABLE} WHERE store = ?", (fmt.store,)).fetchone()
        if row is not None:
            return int(row[0])
    own = set(_TABLE_NAME.findall(schema))
    return 0 if own & tables else None  # tables without a version: written before versions


def inspect_sqlite_store(conn: sqlite3.Connection, fmt: StoreFormat, schema: str, *, where: str,
                         owns_file: bool = True) -> FormatReport:
    """What opening the store would find, changing nothing."""
    found = _sqlite_found(conn, fmt, schema, where, owns_file=owns_file)
    return FormatReport(fmt.store, where, found, fmt.version, _outcome(fmt, found, run=False))


def open_sqlite_store(conn: sqlite3.Connection, fmt: StoreFormat, schema: str, *, where: str,
                      mode: MigrateMode, owns_file: bool = True) -> FormatReport:
    """In ONE `BEGIN IMMEDIATE` transaction on `conn` (autocommit mode): refuse a newer store,
    run the pending migrations (or refuse them under "check"), create what `schema` creates, and
    record the store's format (and, in a file tidegate owns, its layout). Concurrent openers of
    one file take turns on the write lock, so each sees what the one before it wrote."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        found = _sqlite_found(conn, fmt, schema, where, owns_file=owns_file)
        outcome = _outcome(fmt, found, run=mode == "auto")
        if outcome == "newer":
            assert found is not None
            raise newer_error(fmt, where, found)
        if outcome == "pending":
            assert found is not None
            raise pending_error(fmt, where, found)
        done: list[str] = []
        for step in () if found is None else fmt.steps_from(found):
            if step.sqlite is not None:
                step.sqlite(conn)
            done.append(step.what)
        for statement in schema_statements(schema):
            conn.execute(statement)
        if outcome != "current":
            conn.execute(_CREATE_TABLE)
            conn.execute(f"INSERT INTO {FORMATS_TABLE} (store, version) VALUES (?, ?) "
                         "ON CONFLICT (store) DO UPDATE SET version = excluded.version",
                         (fmt.store, fmt.version))
            if owns_file:
                conn.execute(f"PRAGMA user_version = {SQLITE_LAYOUT}")
    except BaseException:
        with contextlib.suppress(sqlite3.Error):
            conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")
    return FormatReport(fmt.store, where, found, fmt.version, outcome, tuple(done))


def _outcome(fmt: StoreFormat, found: int | None, *, run: bool) -> Outcome:
    if found is None:
        return "stamped"
    if found > fmt.version:
        return "newer"
    if found == fmt.version:
        return "current"
    return "migrated" if run else "pending"


# -- Redis -----------------------------------------------------------------------------------

# KEYS: the keyspace's formats hash. ARGV: store, code's version, whether the keyspace holds data
# (1/0), what to do ("auto": migrate, "check": refuse pending, "look": change nothing).
# Returns {found (-1: new), outcome}. Every migration up to this code's formats only records the
# version (no layout changed since 0.1.0); a migration that changes keys gets a script of its own,
# whose keys carry the keyspace's hash tag like this hash.
_REDIS_LUA = """
local raw = redis.call('HGET', KEYS[1], ARGV[1])
local code = tonumber(ARGV[2])
local found = -1
if raw then found = tonumber(raw) elseif ARGV[3] == '1' then found = 0 end
if found > code then return {found, 'newer'} end
if found == code then return {found, 'current'} end
if ARGV[4] == 'look' or (found >= 0 and ARGV[4] == 'check') then
  return {found, found < 0 and 'stamped' or 'pending'}
end
redis.call('HSET', KEYS[1], ARGV[1], code)
return {found, found < 0 and 'stamped' or 'migrated'}
"""


async def open_redis_store(client: RedisClient, fmt: StoreFormat, key: str, probes: Sequence[str], *,
                           mode: MigrateMode | Literal["look"]) -> FormatReport:
    """Check and stamp the store's field of the formats hash `key` in one script; the keyspace
    holds data when any of `probes` exists (keys every store with data has, read first: a store
    of 0.1.0 has no version). A newer store is refused, and so are pending migrations under
    "check"; "look" only reports what it found."""
    from tidegate._urls import redact_url

    where = f"{redact_url(client.url)} ({key})"

    async def exists() -> bool:
        for probe in probes:  # one by one: on a cluster they may live on different nodes
            if await client.command("EXISTS", probe, retry=True):
                return True
        return False

    # Only a store with no version needs the probe; stamping twice is harmless, so both are retried.
    raw = await client.command("HGET", key, fmt.store, retry=True)
    has_data = raw is None and await exists()
    script: Any = client.client.register_script(_REDIS_LUA)
    reply = await client.run(lambda: script(keys=[key], args=[fmt.store, fmt.version, int(has_data), mode]),
                             retry=True, doing=f"checking the {fmt.store} store's format")
    found_raw, outcome_raw = reply
    found = None if int(found_raw) < 0 else int(found_raw)
    outcome: Outcome = outcome_raw.decode() if isinstance(outcome_raw, bytes) else str(outcome_raw)  # type: ignore[assignment]
    if mode != "look":
        if outcome == "newer" and found is not None:
            raise newer_error(fmt, where, found)
        if outcome == "pending" and found is not None:
            raise pending_error(fmt, where, found)
    ran = fmt.steps_from(found) if outcome == "migrated" and found is not None else ()
    done = tuple(step.what for step in ran)
    return FormatReport(fmt.store, where, found, fmt.version, outcome, done)


@dataclass(frozen=True, slots=True)
class RedisStore:
    """Where a Redis store keeps its format: the field `fmt.store` of the keyspace's formats hash
    `key`, and the `probes`, keys that exist whenever the store holds data."""

    fmt: StoreFormat
    key: str
    probes: tuple[str, ...]

    async def open(self, client: RedisClient, *, mode: MigrateMode | Literal["look"]) -> FormatReport:
        """Check (and unless looking, migrate and stamp) the store on `client`."""
        return await open_redis_store(client, self.fmt, self.key, self.probes, mode=mode)


class FormatCheck:
    """A Redis store's format check, run before the store's first call: the coordination stores
    open without I/O (their clients connect on first use). Concurrent first calls may both run it
    (it is harmless twice); one that fails (unreachable, refused) leaves it to the next call, so a
    refused store refuses every call. The migrate mode is the one the store was built in."""

    def __init__(self, store: RedisStore) -> None:
        self.store = store
        self.mode = migrate_mode()
        self._done = False

    async def ready(self, client: RedisClient) -> None:
        """Return once the store is known to be in this code's format."""
        if not self._done:
            await self.store.open(client, mode=self.mode)
            self._done = True
