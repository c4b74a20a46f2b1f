"""The admin key of `tidegate up` has a lifecycle: made at the first start, kept (hashed in the
tenant store, in plaintext in a 0600 file beside the queue) and reused at every later start,
replaced only by `tidegate keys rotate-admin` or a key given in TIDEGATE_ADMIN_KEY; no start
revokes any other key. A second `up` on a busy port changes nothing and says so in one line.

The lifecycle's rules run on every tenant-store backend; the commands run as real processes
(`python -m tidegate up` in a folder of their own, as an operator starts it)."""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import signal
import socket
import stat
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from support.dispatch import queue_url_of
from support.processes import PYTHON_M_TIDEGATE, Process
from support.waiting import eventually
from tidegate.app.admin_key import UP_TENANT, admin_key_path, ensure_admin_key, rotate_admin_key
from tidegate.app.ports import bind_port, port_owner
from tidegate.config import TidegateConfig
from tidegate.coord.tenants import Tenant, TenantStore, tenant_store_for
from tidegate.errors import ConfigError, Conflict, InvalidInput, TenantNotFound

ROOT = Path(__file__).resolve().parents[1]
START_TIMEOUT_S = 60.0  # a start on a busy shared machine; the suite's own timeout is the backstop
EXIT_TIMEOUT_S = 30.0  # a hang guard, not a speed check


def _new_key() -> str:
    """A well-formed key made outside tidegate, as an operator would for TIDEGATE_ADMIN_KEY."""
    return f"tg_{secrets.token_hex(6)}_{secrets.token_urlsafe(32)}"


@pytest.fixture
async def tenants(queue_factory: Any) -> AsyncIterator[TenantStore]:
    """The tenant store of the test's queue, on each backend; auth cache off so that each check
    reads the store."""
    async with tenant_store_for(queue_url_of(queue_factory), auth_cache_s=0) as store:
        yield store


# ---------------------------------------------------------------------- a key made elsewhere


async def test_add_key_stores_a_given_key_once_and_refuses_one_it_cannot_take(tenants: TenantStore) -> None:
    await tenants.put_tenant(Tenant(name="ops", admin=True))
    given = _new_key()

    added = await tenants.add_key("ops", given)
    again = await tenants.add_key("ops", given)

    authenticated = await tenants.authenticate(given)
    assert authenticated is not None and authenticated.name == "ops"
    assert again == added  # the same key twice is one key
    assert [key.key_id for key in await tenants.list_keys("ops")] == [added.key_id]
    key_id = added.key_id
    with pytest.raises(Conflict, match="names another key"):  # its id, another secret
        await tenants.add_key("ops", f"tg_{key_id}_{secrets.token_urlsafe(32)}")
    with pytest.raises(InvalidInput, match="not a tidegate API key"):
        await tenants.add_key("ops", "sk-not-ours")
    with pytest.raises(TenantNotFound):
        await tenants.add_key("nobody", _new_key())
    assert await tenants.revoke_key(key_id)
    with pytest.raises(Conflict, match="was revoked"):
        await tenants.add_key("ops", given)
    assert await tenants.authenticate(given) is None


# ---------------------------------------------------------------------- the lifecycle


async def test_the_admin_key_is_made_once_then_kept_and_no_start_revokes_another_key(
    tenants: TenantStore, tmp_path: Path,
) -> None:
    path = tmp_path / "queue.admin-key"

    # Given a first start: a key is made, kept in a file only this user may read
    first = await ensure_admin_key(tenants, path)
    assert first.origin == "created" and first.api_key is not None
    assert path.read_text() == first.api_key + "\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    # ... and an operator's own key for the same tenant
    _, by_hand = await tenants.create_key(UP_TENANT)

    # When up starts again, twice
    second = await ensure_admin_key(tenants, path)
    third = await ensure_admin_key(tenants, path)

    # Then it serves with the same key, and every key still works
    assert (second.origin, second.api_key) == ("kept", first.api_key)
    assert (third.origin, third.api_key) == ("kept", first.api_key)
    for key in (first.api_key, by_hand):
        assert await tenants.authenticate(key) is not None
    assert [key.revoked_at for key in await tenants.list_keys(UP_TENANT)] == [None, None]


async def test_rotate_admin_revokes_the_old_key_only(tenants: TenantStore, tmp_path: Path) -> None:
    path = tmp_path / "queue.admin-key"
    old = await ensure_admin_key(tenants, path)
    _, by_hand = await tenants.create_key(UP_TENANT)
    assert old.api_key is not None

    info, new, replaced = await rotate_admin_key(tenants, path)

    assert replaced == old.key_id and info.key_id != old.key_id
    assert await tenants.authenticate(old.api_key) is None
    assert await tenants.authenticate(new) is not None
    assert await tenants.authenticate(by_hand) is not None
    assert path.read_text() == new + "\n"
    # and the next start serves with the new one
    kept = await ensure_admin_key(tenants, path)
    assert (kept.origin, kept.api_key) == ("kept", new)


async def test_a_revoked_admin_key_is_replaced_at_the_next_start(
    tenants: TenantStore, tmp_path: Path,
) -> None:
    path = tmp_path / "queue.admin-key"
    old = await ensure_admin_key(tenants, path)
    assert await tenants.revoke_key(old.key_id)

    new = await ensure_admin_key(tenants, path)

    assert new.origin == "created" and new.api_key is not None and new.api_key != old.api_key
    assert await tenants.authenticate(new.api_key) is not None


async def test_a_given_admin_key_replaces_the_kept_one_and_is_not_written_to_disk(
    tenants: TenantStore, tmp_path: Path,
) -> None:
    path = tmp_path / "queue.admin-key"
    made = await ensure_admin_key(tenants, path)
    assert made.api_key is not None
    given = _new_key()

    # When a key is given: it is the admin key, the one made before is revoked
    first = await ensure_admin_key(tenants, path, given)
    again = await ensure_admin_key(tenants, path, given)

    assert (first.origin, first.api_key) == ("given", given)
    assert again == first
    assert await tenants.authenticate(given) is not None
    assert await tenants.authenticate(made.api_key) is None
    # The file records its id, never its secret
    assert path.read_text() == first.key_id + "\n"
    assert given.rsplit("_", 1)[1] not in path.read_text()

    # When another key is given, the first given one is revoked in turn
    other = _new_key()
    await ensure_admin_key(tenants, path, other)
    assert await tenants.authenticate(given) is None
    assert await tenants.authenticate(other) is not None

    # When none is given any more, the last one given stays the admin key (its secret unknown here)
    kept = await ensure_admin_key(tenants, path)
    assert (kept.origin, kept.api_key, kept.key_id) == ("kept", None, other[3:15])
    assert await tenants.authenticate(other) is not None


async def test_a_given_admin_key_that_cannot_serve_is_a_config_error_naming_the_variable(
    tenants: TenantStore, tmp_path: Path,
) -> None:
    path = tmp_path / "queue.admin-key"
    await ensure_admin_key(tenants, path)

    with pytest.raises(ConfigError, match=r"TIDEGATE_ADMIN_KEY .*not a tidegate API key"):
        await ensure_admin_key(tenants, path, "hunter2")
    revoked = _new_key()
    await ensure_admin_key(tenants, path, revoked)
    await rotate_admin_key(tenants, path)  # revokes it
    with pytest.raises(ConfigError, match=r"TIDEGATE_ADMIN_KEY .*was revoked"):
        await ensure_admin_key(tenants, path, revoked)


def test_the_key_file_sits_beside_the_queue_file_or_in_the_data_folder() -> None:
    assert admin_key_path("sqlite:///.tidegate/tidegate.db") == Path(".tidegate/tidegate.admin-key")
    assert admin_key_path("sqlite:////srv/tg/demo.db") == Path("/srv/tg/demo.admin-key")
    assert admin_key_path("redis://127.0.0.1:6379/0?name=shop") == Path(".tidegate/redis-shop.admin-key")


def test_tidegate_admin_key_sets_up_admin_key(monkeypatch: pytest.MonkeyPatch) -> None:
    given, nested = _new_key(), _new_key()
    monkeypatch.setenv("TIDEGATE_ADMIN_KEY", given)

    config = TidegateConfig.load()

    assert config.up.admin_key is not None and config.up.admin_key.get_secret_value() == given
    assert given not in repr(config) and given not in str(config.up)
    # The nested spelling wins over the short one
    monkeypatch.setenv("TIDEGATE_UP__ADMIN_KEY", nested)
    assert TidegateConfig.load().up.admin_key.get_secret_value() == nested  # type: ignore[union-attr]


# ---------------------------------------------------------------------- the port


def test_a_busy_port_is_one_line_naming_the_port_and_its_owner() -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]

        with pytest.raises(ConfigError) as refused:
            bind_port("127.0.0.1", port)

        owner = port_owner(port)
    message = str(refused.value)
    assert "\n" not in message
    assert f"port {port} is already in use by pid {os.getpid()} (" in message
    assert owner is not None and owner.startswith(f"pid {os.getpid()} (") and "python" in owner


# ---------------------------------------------------------------------- `tidegate up`, for real


class Started(Process):
    """A `python -m tidegate up` process and what it printed."""

    @property
    def printed_out(self) -> str:
        """What it printed on stdout: up's table and its new key (its log goes to stderr)."""
        return "".join(self.stdout)

    async def ready(self) -> tuple[str, int]:
        """Once up has printed its table: its API URL and port."""
        await self.printed("Press Ctrl-C to stop.", timeout_s=START_TIMEOUT_S)
        found = re.search(r"API \(OpenAI base_url\)\s+(http://127\.0\.0\.1:(\d+)/v1)", self.printed_out)
        assert found, self.output
        return found.group(1), int(found.group(2))

    def printed_key(self) -> str | None:
        found = re.search(r"^(tg_\S+)$", self.printed_out, re.MULTILINE)
        return found.group(1) if found else None

    async def stopped(self) -> int:
        """SIGTERM, then the exit status."""
        self.send(signal.SIGTERM)
        return await self.exited(EXIT_TIMEOUT_S)


def _env(**extra: str) -> dict[str, str]:
    env = {name: value for name, value in os.environ.items() if not name.startswith("TIDEGATE_")}
    return {**env, "COLUMNS": "300", "PYTHONUNBUFFERED": "1", **extra}


def _tidegate(folder: Path, *args: str,
              env: dict[str, str] | None = None) -> contextlib.AbstractAsyncContextManager[Started]:
    """`python -m tidegate ARGS` in `folder`, killed on leaving if it still runs."""
    return Started.start(*PYTHON_M_TIDEGATE, *args, cwd=folder, env=env or _env())


def _up(folder: Path, *args: str,
        env: dict[str, str] | None = None) -> contextlib.AbstractAsyncContextManager[Started]:
    return _tidegate(folder, "up", "--no-change-flow", "--grace-s", "2", *args, env=env)


async def _command(folder: Path, *args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    async with _tidegate(folder, *args, env=env) as done:
        status = await done.exited(EXIT_TIMEOUT_S)
    return status, "".join(done.stdout), "".join(done.stderr)


async def _status(api_url: str, api_key: str | None) -> int:
    async with httpx.AsyncClient(timeout=10) as http:
        answer = await http.get(f"{api_url}/models", headers={"Authorization": f"Bearer {api_key}"})
    return answer.status_code


async def _up_keys(folder: Path) -> list[tuple[str, bool]]:
    async with tenant_store_for(f"sqlite:///{folder}/.tidegate/tidegate.db") as store:
        return [(key.key_id, key.revoked_at is None) for key in await store.list_keys(UP_TENANT)]


async def test_a_second_up_on_a_busy_port_exits_2_at_once_and_the_first_keeps_its_key(tmp_path: Path) -> None:
    # Given up running, with its admin key
    async with _up(tmp_path, "--port", "0") as first:
        api_url, port = await first.ready()
        key = first.printed_key()
        assert key is not None and await _status(api_url, key) == 200
        keys_before = await _up_keys(tmp_path)
        key_file = (tmp_path / ".tidegate" / "tidegate.admin-key").read_text()

        # When a second up starts on its port, in the same folder
        status, out, err = await _command(tmp_path, "up", "--no-change-flow", "--port", str(port))

        # Then it exits 2 with one line naming the port and the process that holds it
        assert status == 2, out + err
        lines = err.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in out + err, out + err
        assert f"port {port} is already in use by pid {first.proc.pid} (" in lines[0]
        # ... having changed nothing: the first instance's key still answers, no key was made
        assert await _status(api_url, key) == 200
        assert await _up_keys(tmp_path) == keys_before
        assert (tmp_path / ".tidegate" / "tidegate.admin-key").read_text() == key_file
        assert await first.stopped() == 0


@pytest.mark.parametrize("processes", ["1", "2"])
async def test_a_gateway_on_a_busy_port_exits_2_with_one_line_and_opens_nothing(
    tmp_path: Path, processes: str,
) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]

        status, out, err = await _command(tmp_path, "gateway", "--queue", f"sqlite:///{tmp_path}/q.db",
                                          "--port", str(port), "--processes", processes)

    assert status == 2, out + err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in out + err, out + err
    assert f"port {port} is already in use by pid {os.getpid()} (" in lines[0]
    assert not (tmp_path / "q.db").exists()  # the port came first: no store was opened


async def test_the_admin_key_and_a_hand_made_one_survive_a_restart(tmp_path: Path) -> None:
    # Given up's first start, and a key an operator made for its tenant
    async with _up(tmp_path, "--port", "0") as first:
        api_url, _ = await first.ready()
        key = first.printed_key()
        status, by_hand, _ = await _command(tmp_path, "keys", "create", UP_TENANT)
        assert status == 0 and key is not None
        assert await first.stopped() == 0

    # When it starts again after SIGTERM
    async with _up(tmp_path, "--port", "0") as second:
        api_url, _ = await second.ready()

        # Then the same key answers, and so does the hand-made one; the key is not printed again
        assert await _status(api_url, key) == 200
        assert await _status(api_url, by_hand.strip()) == 200
        assert second.printed_key() is None and key not in second.printed_out
        assert f"key id {key[3:15]}" in second.printed_out
        assert await second.stopped() == 0


async def test_rotate_admin_replaces_the_key_of_a_running_up(tmp_path: Path) -> None:
    async with _up(tmp_path, "--port", "0") as running:
        api_url, _ = await running.ready()
        old = running.printed_key()
        assert old is not None

        status, out, err = await _command(tmp_path, "keys", "rotate-admin")

        assert status == 0, err
        new = out.strip()
        assert new != old and f"revoked key {old[3:15]}" in err
        assert await _status(api_url, new) == 200

        async def old_refused() -> bool:  # within the gateway's authentication cache time
            return await _status(api_url, old) == 401

        await eventually(old_refused, "the old admin key is refused", timeout_s=10)
        assert (tmp_path / ".tidegate" / "tidegate.admin-key").read_text() == new + "\n"
        assert await running.stopped() == 0


async def test_up_serves_with_the_key_tidegate_admin_key_gives(tmp_path: Path) -> None:
    given = _new_key()
    async with _up(tmp_path, "--port", "0", env=_env(TIDEGATE_ADMIN_KEY=given)) as running:
        api_url, _ = await running.ready()

        assert await _status(api_url, given) == 200
        assert await _status(api_url, _new_key()) == 401
        secret = given.rsplit("_", 1)[1]
        assert secret not in running.output  # never printed
        assert secret not in (tmp_path / ".tidegate" / "tidegate.admin-key").read_text()  # nor kept
        # While it is given, rotate-admin refuses: the next start would find the given key revoked
        status, _, err = await _command(tmp_path, "keys", "rotate-admin", env=_env(TIDEGATE_ADMIN_KEY=given))
        assert status == 2 and "TIDEGATE_ADMIN_KEY" in err
        assert await running.stopped() == 0
