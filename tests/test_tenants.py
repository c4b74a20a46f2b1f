"""The tenant store contract over SQLite and Redis (tenants, hashed API keys, authentication,
revocation, the authentication cache), and the `tidegate tenants` / `tidegate keys` commands."""

from __future__ import annotations

import asyncio
import hashlib
import re
import secrets
import sqlite3
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner, Result

from support.dispatch import queue_url_of
from support.redis_keys import REDIS_BACKENDS, redis_client
from tidegate.cli.main import app
from tidegate.coord.tenants import (
    NO_KEY_LIMITS,
    KeyLimits,
    RedisTenantStore,
    SqliteTenantStore,
    Tenant,
    TenantStore,
    parse_api_key,
    tenant_store_for,
)
from tidegate.errors import ConfigError, QueueClosed, TenantNotFound, TidegateError
from tidegate.jobs import Priority

KEY_FORMAT = re.compile(r"tg_[0-9a-f]{12}_[A-Za-z0-9_-]{43}")


class FakeClock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


class Stores:
    """Opens tenant stores on one test's queue storage, as separate gateway replicas would, and
    reads what they stored behind their back."""

    def __init__(self, factory: Any) -> None:
        self.backend: str = factory.backend
        self.url = queue_url_of(factory)
        self.name: str = factory.queue_name
        self._opened: list[TenantStore] = []

    def open(self, **options: Any) -> TenantStore:
        store = tenant_store_for(self.url, **options)
        self._opened.append(store)
        return store

    def open_with_clock(self, clock: FakeClock, auth_cache_s: float) -> TenantStore:
        store: TenantStore
        if self.backend in REDIS_BACKENDS:
            store = RedisTenantStore(self.url.split("?")[0], self.name, auth_cache_s=auth_cache_s,
                                     clock=clock)
        else:
            store = SqliteTenantStore(self._sqlite_path, self.name, auth_cache_s=auth_cache_s, clock=clock)
        self._opened.append(store)
        return store

    @property
    def _sqlite_path(self) -> str:
        return self.url.removeprefix("sqlite:///")

    async def stored_bytes(self) -> bytes:
        """Everything the store wrote, as the backend holds it."""
        if self.backend == "sqlite":
            # The tables' rows, and the raw files too: the WAL holds recent pages.
            with sqlite3.connect(self._sqlite_path) as conn:
                rows = [*conn.execute("SELECT * FROM tenants"), *conn.execute("SELECT * FROM api_keys")]
            files = [Path(self._sqlite_path + suffix) for suffix in ("", "-wal")]
            return repr(rows).encode() + b"".join(f.read_bytes() for f in files if f.exists())
        client = redis_client(self.url.split("?")[0])
        try:
            chunks: list[bytes | str] = []
            async for key in client.scan_iter(match=f"*{self.name}*"):
                for field, value in (await client.hgetall(key)).items():
                    chunks += [key, field, value]
            return b"\n".join(chunk if isinstance(chunk, bytes) else chunk.encode() for chunk in chunks)
        finally:
            await client.aclose()

    async def delete_tenant_behind_the_back(self, name: str) -> None:
        """No API deletes a tenant; an operator could, by hand."""
        if self.backend == "sqlite":
            with sqlite3.connect(self._sqlite_path) as conn:
                conn.execute("DELETE FROM tenants WHERE name = ?", (name,))
            return
        client = redis_client(self.url.split("?")[0])
        try:
            await client.hdel(f"tidegate:{{{self.name}}}:tenants", name)
        finally:
            await client.aclose()

    async def aclose(self) -> None:
        while self._opened:
            await self._opened.pop().close()


@pytest.fixture
async def stores(queue_factory: Any) -> AsyncIterator[Stores]:
    opened = Stores(queue_factory)
    try:
        yield opened
    finally:
        await opened.aclose()


@pytest.fixture
async def store(stores: Stores) -> TenantStore:
    return stores.open()


ACME = Tenant(name="acme", max_priority=Priority.HIGH, rpm=600, daily_budget_usd=Decimal("12.345"),
              allowed_models=("gpt-4o-mini", "text-embedding-3-small"))


# ---------------------------------------------------------------------- keys


async def test_a_created_key_authenticates_as_its_tenant(store: TenantStore) -> None:
    await store.put_tenant(ACME)

    info, api_key = await store.create_key("acme")

    assert KEY_FORMAT.fullmatch(api_key)
    assert api_key.startswith(f"tg_{info.key_id}_")
    assert info.tenant == "acme" and info.revoked_at is None
    assert info.created_at.tzinfo is not None
    assert await store.authenticate(api_key) == ACME


async def test_keys_are_distinct(store: TenantStore) -> None:
    await store.put_tenant(ACME)

    created = [await store.create_key("acme") for _ in range(5)]

    assert len({info.key_id for info, _ in created}) == len({key for _, key in created}) == 5


async def test_anything_but_a_valid_key_is_refused(store: TenantStore) -> None:
    await store.put_tenant(ACME)
    info, api_key = await store.create_key("acme")
    secret = api_key.removeprefix(f"tg_{info.key_id}_")
    other_secret = secrets.token_urlsafe(32)
    refused = [
        f"tg_{info.key_id}_{other_secret}",  # wrong secret
        f"tg_{info.key_id}_{secret[:-1]}",  # a truncated secret
        f"tg_{secrets.token_hex(6)}_{secret}",  # unknown id, right secret
        "", "tg_", "tg__", api_key + "x" * 200, f"Bearer {api_key}", api_key.upper(),
        f"sk_{info.key_id}_{secret}", f"tg_{info.key_id}{secret}", api_key + "\n", " " + api_key,
    ]

    for candidate in refused:
        assert await store.authenticate(candidate) is None, candidate
    assert await store.authenticate(api_key) == ACME  # and the real one still works


async def test_a_revoked_key_is_refused(store: TenantStore) -> None:
    await store.put_tenant(ACME)
    info, api_key = await store.create_key("acme")
    _, other_key = await store.create_key("acme")
    assert await store.authenticate(api_key) == ACME  # now cached, if the store caches

    assert await store.revoke_key(info.key_id) is True

    assert await store.authenticate(api_key) is None
    assert await store.authenticate(other_key) == ACME
    assert await store.revoke_key(info.key_id) is False  # not twice
    assert await store.revoke_key(secrets.token_hex(6)) is False  # no such key
    [listed] = [key for key in await store.list_keys() if key.key_id == info.key_id]
    assert listed.revoked_at is not None and listed.revoked_at >= listed.created_at


async def test_a_key_of_a_deleted_tenant_is_refused(stores: Stores) -> None:
    store = stores.open(auth_cache_s=0)
    await store.put_tenant(ACME)
    _, api_key = await store.create_key("acme")

    await stores.delete_tenant_behind_the_back("acme")

    assert await store.authenticate(api_key) is None


async def test_deleting_a_tenant_revokes_its_keys_for_good(stores: Stores) -> None:
    # Given a tenant with two keys (one already revoked) and another tenant with one
    store = stores.open(auth_cache_s=60)  # a cache, which the deletion must empty
    await store.put_tenant(ACME)
    await store.put_tenant(Tenant(name="globex"))
    first, first_key = await store.create_key("acme")
    second, second_key = await store.create_key("acme")
    _, other_key = await store.create_key("globex")
    await store.revoke_key(second.key_id)
    assert await store.authenticate(first_key) == ACME

    # When it is deleted
    revoked = await store.delete_tenant("acme")

    # Then its live key was revoked, and only the other tenant and its key remain
    assert revoked == [first.key_id]
    assert await store.get_tenant("acme") is None
    assert [tenant.name for tenant in await store.list_tenants()] == ["globex"]
    assert await store.authenticate(first_key) is None
    assert await store.authenticate(other_key) is not None
    assert all(key.revoked_at is not None for key in await store.list_keys("acme"))
    # ... its keys stay refused when the name is used again, also by another store
    await store.put_tenant(ACME)
    assert await stores.open(auth_cache_s=0).authenticate(first_key) is None
    assert await store.authenticate(second_key) is None
    # ... and an unknown tenant is no deletion
    assert await store.delete_tenant("nobody") is None


async def test_a_key_for_an_unknown_tenant_is_refused(store: TenantStore) -> None:
    with pytest.raises(TenantNotFound, match="nobody"):
        await store.create_key("nobody")

    assert isinstance(TenantNotFound("x"), TidegateError)
    assert await store.list_keys() == []


async def test_the_secret_is_never_stored(stores: Stores) -> None:
    store = stores.open()
    await store.put_tenant(ACME)
    info, api_key = await store.create_key("acme")
    secret = api_key.removeprefix(f"tg_{info.key_id}_")
    await store.revoke_key(info.key_id)  # the revocation rewrites the record: check that too

    stored = await stores.stored_bytes()

    assert info.key_id.encode() in stored  # the data is there to read...
    assert hashlib.sha256(secret.encode()).hexdigest().encode() in stored  # ...as a digest
    assert secret.encode() not in stored
    assert api_key.encode() not in stored


async def test_listed_keys_carry_no_secret_newest_first(store: TenantStore) -> None:
    await store.put_tenant(ACME)
    await store.put_tenant(Tenant(name="globex"))
    acme_keys = [await store.create_key("acme") for _ in range(3)]
    globex_info, globex_key = await store.create_key("globex")

    everything = await store.list_keys()
    acme_only = await store.list_keys("acme")

    assert [info.key_id for info in acme_only] == [info.key_id for info, _ in reversed(acme_keys)]
    assert {info.key_id for info in everything} == {info.key_id for info, _ in [*acme_keys,
                                                                               (globex_info, globex_key)]}
    assert [info.created_at for info in everything] == sorted(
        (info.created_at for info in everything), reverse=True)
    assert await store.list_keys("nobody") == []
    dumped = "".join(info.model_dump_json() + repr(info) for info in everything)
    for _, api_key in [*acme_keys, (globex_info, globex_key)]:
        assert api_key.split("_", 2)[2] not in dumped


# ---------------------------------------------------------------------- tenants


async def test_tenants_round_trip(store: TenantStore) -> None:
    admin = Tenant(name="ops", max_priority=Priority.CRITICAL, default_priority=Priority.HIGH, admin=True)
    await store.put_tenant(ACME)
    await store.put_tenant(admin)

    got = await store.get_tenant("acme")

    assert got == ACME
    assert got is not None and got.daily_budget_usd == Decimal("12.345")
    assert isinstance(got.daily_budget_usd, Decimal)
    assert got.allowed_models == ("gpt-4o-mini", "text-embedding-3-small")
    assert got.max_priority is Priority.HIGH
    assert await store.get_tenant("ops") == admin
    assert await store.get_tenant("nobody") is None
    assert await store.list_tenants() == [ACME, admin]


async def test_put_replaces_a_tenant_and_its_keys_see_the_change(store: TenantStore) -> None:
    await store.put_tenant(ACME)
    _, api_key = await store.create_key("acme")
    assert await store.authenticate(api_key) == ACME
    tighter = ACME.model_copy(update={"rpm": 10, "allowed_models": None})

    await store.put_tenant(tighter)

    assert await store.get_tenant("acme") == tighter
    assert await store.list_tenants() == [tighter]
    assert await store.authenticate(api_key) == tighter  # no stale cache on the same store


# ---------------------------------------------------------------------- a key's own limits

LIMITS = KeyLimits(rpm=3, allowed_models=("gpt-4o-mini",), max_priority=Priority.LOW,
                   expires_at=datetime(2027, 1, 31, tzinfo=UTC))


async def test_a_key_keeps_its_own_limits(stores: Stores) -> None:
    writer, reader = stores.open(), stores.open(auth_cache_s=0)
    await writer.put_tenant(ACME)

    info, api_key = await writer.create_key("acme", LIMITS)

    assert info.limits == LIMITS
    caller = await reader.authenticate_key(api_key)
    assert caller is not None
    assert (caller.tenant, caller.key_id, caller.limits) == (ACME, info.key_id, LIMITS)
    assert [key.limits for key in await reader.list_keys("acme")] == [LIMITS]
    assert (await reader.get_key(info.key_id)) == info
    _, plain = await writer.create_key("acme")
    plain_caller = await reader.authenticate_key(plain)
    assert plain_caller is not None and plain_caller.limits == NO_KEY_LIMITS


async def test_changing_a_keys_limits_applies_to_the_key_alone(stores: Stores) -> None:
    admin, gateway = stores.open(), stores.open()
    await admin.put_tenant(ACME)
    info, api_key = await admin.create_key("acme", LIMITS)
    other, other_key = await admin.create_key("acme")
    assert (await gateway.authenticate_key(api_key)) is not None  # now in its cache

    changed = await gateway.change_key_limits(
        info.key_id, lambda limits: limits.model_copy(update={"rpm": 30, "expires_at": None}))

    expected = LIMITS.model_copy(update={"rpm": 30, "expires_at": None})
    assert changed is not None and changed.limits == expected
    caller = await gateway.authenticate_key(api_key)  # changed through this store: at once
    assert caller is not None and caller.limits == expected
    untouched = await gateway.authenticate_key(other_key)
    assert untouched is not None and untouched.limits == NO_KEY_LIMITS
    assert (await admin.get_key(other.key_id)) == other


async def test_concurrent_limit_changes_all_apply(store: TenantStore) -> None:
    await store.put_tenant(ACME)
    info, _ = await store.create_key("acme")

    def add(model: str) -> Any:
        return lambda limits: limits.model_copy(
            update={"allowed_models": (*(limits.allowed_models or ()), model)})

    await asyncio.gather(*(store.change_key_limits(info.key_id, add(f"m{n}")) for n in range(8)))

    found = await store.get_key(info.key_id)
    assert found is not None and sorted(found.limits.allowed_models or ()) == [f"m{n}" for n in range(8)]


async def test_the_limits_of_a_revoked_or_unknown_key_are_not_changed(store: TenantStore) -> None:
    await store.put_tenant(ACME)
    info, _ = await store.create_key("acme")
    await store.revoke_key(info.key_id)

    assert await store.change_key_limits(info.key_id, lambda _: LIMITS) is None
    assert await store.change_key_limits("0123456789ab", lambda _: LIMITS) is None
    found = await store.get_key(info.key_id)
    assert found is not None and found.limits == NO_KEY_LIMITS and found.revoked_at is not None


def test_a_key_narrows_its_tenant_the_stricter_wins() -> None:
    assert NO_KEY_LIMITS.narrow(ACME) is ACME
    narrowed = KeyLimits(max_priority=Priority.LOW, allowed_models=("gpt-4o-mini", "gpt-4.1")).narrow(ACME)
    assert narrowed.max_priority == Priority.LOW and narrowed.default_priority == Priority.LOW
    assert narrowed.allowed_models == ("gpt-4o-mini",)  # gpt-4.1 is not the tenant's
    assert narrowed.rpm == ACME.rpm and narrowed.daily_budget_usd == ACME.daily_budget_usd
    # A key that asks for more urgency than its tenant has gets the tenant's.
    assert KeyLimits(max_priority=Priority.CRITICAL).narrow(ACME).max_priority == Priority.HIGH
    everything = Tenant(name="open")
    assert KeyLimits(allowed_models=("x",)).narrow(everything).allowed_models == ("x",)


# ---------------------------------------------------------------------- sharing, cache, lifecycle


async def test_two_stores_share_tenants_and_keys(stores: Stores) -> None:
    writer, reader = stores.open(), stores.open(auth_cache_s=0)
    await writer.put_tenant(ACME)

    info, api_key = await writer.create_key("acme")

    assert await reader.get_tenant("acme") == ACME
    assert await reader.authenticate(api_key) == ACME
    assert [key.key_id for key in await reader.list_keys()] == [info.key_id]
    assert await reader.revoke_key(info.key_id) is True
    assert await writer.authenticate(api_key) is None  # revoked through its own store: at once


async def test_a_revocation_elsewhere_takes_effect_within_the_cache_time(stores: Stores) -> None:
    clock = FakeClock()
    admin, gateway = stores.open(), stores.open_with_clock(clock, auth_cache_s=2.0)
    await admin.put_tenant(ACME)
    info, api_key = await admin.create_key("acme")
    assert await gateway.authenticate(api_key) == ACME

    await admin.revoke_key(info.key_id)

    clock.now += 1.0
    assert await gateway.authenticate(api_key) == ACME  # still remembered: the documented delay
    assert await gateway.authenticate(api_key[:-1] + ("A" if api_key[-1] != "A" else "B")) is None
    clock.now += 1.0
    assert await gateway.authenticate(api_key) is None


async def test_a_closed_store_refuses_use(stores: Stores) -> None:
    store = stores.open()
    async with store:
        await store.put_tenant(ACME)

    await store.close()  # idempotent
    with pytest.raises(QueueClosed):
        await store.get_tenant("acme")
    with pytest.raises(QueueClosed):
        await store.authenticate("tg_000000000000_" + "x" * 43)
    with pytest.raises(QueueClosed):
        async with store:
            pass


async def test_nothing_secret_in_reprs(tmp_path: Path) -> None:
    redis_store = RedisTenantStore("redis://:hunter2@127.0.0.1:1/0", "acme")  # lazy: no connection
    sqlite_store = SqliteTenantStore(str(tmp_path / "q.db"))
    try:
        assert "hunter2" not in repr(redis_store)
        assert "***" in repr(redis_store)
        assert "q.db" in repr(sqlite_store)
    finally:
        await redis_store.close()
        await sqlite_store.close()


def test_tenant_store_for_picks_the_backend_and_name(tmp_path: Path) -> None:
    redis_store = tenant_store_for("redis://127.0.0.1:1/0?name=jobs&max_batch=5")
    sqlite_store = tenant_store_for(f"sqlite:///{tmp_path / 'q.db'}")

    assert isinstance(redis_store, RedisTenantStore)
    assert redis_store.keys_key == "tidegate:{jobs}:keys"
    assert redis_store.tenants_key == "tidegate:{jobs}:tenants"
    assert isinstance(sqlite_store, SqliteTenantStore)
    assert sqlite_store.path == str(tmp_path / "q.db") and sqlite_store.name == "default"
    with pytest.raises(ConfigError):
        tenant_store_for("postgres://localhost/db")
    with pytest.raises(ConfigError):
        tenant_store_for("redis://127.0.0.1:1/0?name=a}b")
    asyncio.run(redis_store.close())
    asyncio.run(sqlite_store.close())


def test_parse_api_key() -> None:
    key = "tg_0123456789ab_" + "A" * 43

    assert parse_api_key(key) == ("0123456789ab", "A" * 43)
    assert parse_api_key("tg_0123456789AB_" + "A" * 43) is None  # ids are lowercase hex
    assert parse_api_key(None) is None
    assert parse_api_key(key + "=") is None


# ---------------------------------------------------------------------- the CLI

runner = CliRunner()


async def _cli(*args: str) -> Result:
    # The commands run their own event loop: give them a thread of their own.
    return await asyncio.to_thread(runner.invoke, app, list(args))


async def test_cli_creates_a_key_that_authenticates_and_revokes_it(stores: Stores) -> None:
    url = stores.url
    put = await _cli("tenants", "put", "acme", "--queue", url, "--max-priority", "critical",
                     "--default-priority", "high", "--rpm", "60", "--daily-budget-usd", "10.50",
                     "--models", "gpt-4o-mini, text-embedding-3-small", "--admin")
    assert put.exit_code == 0, put.output

    created = await _cli("keys", "create", "acme", "--queue", url)

    assert created.exit_code == 0, created.output
    api_key = created.stdout.strip()
    assert KEY_FORMAT.fullmatch(api_key)
    assert "not shown again" in created.stderr
    store = stores.open(auth_cache_s=0)
    assert await store.authenticate(api_key) == Tenant(
        name="acme", max_priority=Priority.CRITICAL, default_priority=Priority.HIGH, rpm=60,
        daily_budget_usd=Decimal("10.50"), allowed_models=("gpt-4o-mini", "text-embedding-3-small"),
        admin=True)

    key_id = api_key[3:15]
    listed = await _cli("keys", "list", "--queue", url, "--tenant", "acme")
    assert listed.exit_code == 0, listed.output
    assert key_id in listed.output
    assert api_key.split("_", 2)[2] not in listed.output

    revoked = await _cli("keys", "revoke", key_id, "--queue", url)
    assert revoked.exit_code == 0, revoked.output
    assert await store.authenticate(api_key) is None
    again = await _cli("keys", "revoke", key_id, "--queue", url)
    assert again.exit_code == 2
    assert "no active key" in again.output


async def test_cli_creates_and_changes_a_keys_own_limits(stores: Stores) -> None:
    url = stores.url
    assert (await _cli("tenants", "put", "acme", "--queue", url)).exit_code == 0

    created = await _cli("keys", "create", "acme", "--queue", url, "--rpm", "3", "--models", "a, b",
                         "--max-priority", "low", "--expires-at", "2031-01-31T00:00:00+00:00")
    assert created.exit_code == 0, created.output
    key_id = created.stdout.strip()[3:15]
    store = stores.open(auth_cache_s=0)
    found = await store.get_key(key_id)
    assert found is not None and found.limits == KeyLimits(
        rpm=3, allowed_models=("a", "b"), max_priority=Priority.LOW,
        expires_at=datetime(2031, 1, 31, tzinfo=UTC))
    listed = await asyncio.to_thread(runner.invoke, app, ["keys", "list", "--queue", url],
                                     env={"COLUMNS": "250"})  # one line per key
    assert "rpm 3; models a,b; max priority low; expires 2031-01-31T00:00:00+00:00" in listed.output

    changed = await _cli("keys", "update", key_id, "--queue", url, "--rpm", "30",
                         "--clear", "models,expires-at")
    assert changed.exit_code == 0, changed.output
    found = await store.get_key(key_id)
    assert found is not None and found.limits == KeyLimits(rpm=30, max_priority=Priority.LOW)

    for args in (("--expires-at", "2031-01-31"), ("--max-priority", "urgent"), ("--clear", "tpm"),
                 ("--rpm", "5", "--clear", "rpm"), ()):
        refused = await _cli("keys", "update", key_id, "--queue", url, *args)
        assert refused.exit_code == 2, (args, refused.output)
    unknown = await _cli("keys", "update", "0123456789ab", "--queue", url, "--rpm", "1")
    assert unknown.exit_code == 2 and "no active key" in unknown.output
    found = await store.get_key(key_id)
    assert found is not None and found.limits == KeyLimits(rpm=30, max_priority=Priority.LOW)


async def test_cli_lists_tenants(stores: Stores) -> None:
    for name in ("globex", "acme"):
        result = await _cli("tenants", "put", name, "--queue", stores.url)
        assert result.exit_code == 0, result.output

    listed = await _cli("tenants", "list", "--queue", stores.url)

    assert listed.exit_code == 0, listed.output
    assert listed.output.index("acme") < listed.output.index("globex")
    assert "high" in listed.output and "normal" in listed.output


async def test_cli_refuses_bad_input(stores: Stores) -> None:
    url = stores.url

    unknown = await _cli("keys", "create", "nobody", "--queue", url)
    bad_priority = await _cli("tenants", "put", "acme", "--queue", url, "--max-priority", "urgent")
    inverted = await _cli("tenants", "put", "acme", "--queue", url, "--max-priority", "low",
                          "--default-priority", "high")
    bad_budget = await _cli("tenants", "put", "acme", "--queue", url, "--daily-budget-usd", "ten")
    bad_name = await _cli("tenants", "put", "a b", "--queue", url)

    assert unknown.exit_code == 2 and "no tenant named 'nobody'" in unknown.output
    for result in (bad_priority, inverted, bad_budget, bad_name):
        assert result.exit_code == 2, result.output
    assert await stores.open().list_tenants() == []


async def test_cli_shows_a_tenant_with_its_keys(stores: Stores) -> None:
    url = stores.url
    put = await _cli("tenants", "put", "acme", "--queue", url, "--rpm", "60", "--models", "gpt-4.1")
    assert put.exit_code == 0, put.output
    created = await _cli("keys", "create", "acme", "--queue", url)
    key_id = created.stdout.strip()[3:15]

    shown = await _cli("tenants", "show", "acme", "--queue", url)
    unknown = await _cli("tenants", "show", "nobody", "--queue", url)

    assert shown.exit_code == 0, shown.output
    for text in ("Tenant acme", "max priority", "high", "60", "gpt-4.1", key_id):
        assert text in shown.output, text
    assert created.stdout.strip().split("_", 2)[2] not in shown.output  # never a secret
    assert unknown.exit_code == 2
    assert "no tenant named 'nobody'" in unknown.output and "Traceback" not in unknown.output


async def test_cli_deletes_a_tenant_and_revokes_its_keys_once_confirmed(stores: Stores) -> None:
    url = stores.url
    assert (await _cli("tenants", "put", "acme", "--queue", url)).exit_code == 0
    api_key = (await _cli("keys", "create", "acme", "--queue", url)).stdout.strip()
    store = stores.open(auth_cache_s=0)

    # Asked and not confirmed, nothing happens
    declined = await asyncio.to_thread(runner.invoke, app, ["tenants", "delete", "acme", "--queue", url],
                                       input="n\n")
    assert declined.exit_code == 1
    assert await store.authenticate(api_key) is not None

    deleted = await _cli("tenants", "delete", "acme", "--queue", url, "--yes")
    again = await _cli("tenants", "delete", "acme", "--queue", url, "--yes")

    assert deleted.exit_code == 0, deleted.output
    assert deleted.stdout.startswith(f"Deleted tenant acme; revoked 1 key ({api_key[3:15]}).")
    assert await store.get_tenant("acme") is None and await store.authenticate(api_key) is None
    assert again.exit_code == 2
    assert "no tenant named 'acme'" in again.output and "Traceback" not in again.output
