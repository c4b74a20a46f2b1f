"""The admin key of `tidegate up`: made once, kept across restarts, replaced only when asked.

The key belongs to the tenant `UP_TENANT` (an admin tenant `up` creates) and is stored like any
key, as a digest in the tenant store. Its plaintext is printed when it is made, and written to
the key file (`admin_key_path`: `<queue file>.admin-key` beside the SQLite queue, so
`.tidegate/tidegate.admin-key` by default) with mode 0600, for the operator to read later —
as Jenkins keeps its initial admin password in its home, and Airflow's standalone mode its
admin password. Whoever may read the data folder reads every prompt and answer in the queue
anyway; the file adds no reader.

At each start (`ensure_admin_key`):

- with a key given (`[up] admin_key`, TIDEGATE_ADMIN_KEY or TIDEGATE_UP__ADMIN_KEY), that key is
  the admin key: it is stored hashed (once), the admin key it replaces is revoked, and the file
  records only its id — a secret the operator keeps elsewhere is not copied to disk;
- else the key in the file is kept while it still authenticates, and nothing is revoked;
- else (first start, the file gone, or its key revoked) a new key is made and written there.

`rotate_admin_key` (`tidegate keys rotate-admin`) makes a new key, writes it to the file and
revokes the one it replaces. No start revokes anything else: keys made by hand for UP_TENANT
(`tidegate keys create tidegate-up`) or for any other tenant stay valid.
"""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from tidegate._sqlite import sqlite_file
from tidegate.coord._store import backend_of, queue_name_of
from tidegate.coord.tenants import ApiKeyInfo, Tenant, TenantStore, parse_api_key
from tidegate.errors import ConfigError, Conflict, InvalidInput
from tidegate.jobs import Priority

__all__ = ["ADMIN_KEY_SETTING", "UP_TENANT", "AdminKey", "Origin", "admin_key_path", "ensure_admin_key",
           "rotate_admin_key"]

UP_TENANT = "tidegate-up"  # the admin tenant whose key `up` makes and keeps
ADMIN_KEY_SETTING = "TIDEGATE_ADMIN_KEY"  # named in errors: the spelling operators use
FILE_SUFFIX = ".admin-key"
_DATA_FOLDER = Path(".tidegate")  # `up`'s folder when the queue is not a file (Redis)
_KEY_ID = re.compile(r"[0-9a-f]{12}")
_FILE_MODE = 0o600

Origin = Literal["created", "kept", "given"]


@dataclass(frozen=True, slots=True)
class AdminKey:
    """The admin key a start serves with: its id; the full key when this process knows it
    (made now, read from the file, or given) — None only for a key given at an earlier start
    and not given now; where it came from; and the file that records it."""

    key_id: str
    api_key: str | None
    origin: Origin
    path: Path


def admin_key_path(queue_url: str) -> Path:
    """The file that records the admin key of the tenant store at `queue_url`: beside a SQLite
    queue's file (one per file, so `up` and the demo keep theirs apart), else in `.tidegate/`
    under the queue's name."""
    path = sqlite_file(queue_url) if backend_of(queue_url) == "sqlite" else None
    if path is not None and path.name:
        return path.with_name(path.stem + FILE_SUFFIX)
    return _DATA_FOLDER / f"{backend_of(queue_url)}-{queue_name_of(queue_url)}{FILE_SUFFIX}"


async def ensure_admin_key(tenants: TenantStore, path: Path, given: str | None = None) -> AdminKey:
    """The admin key for this start, made, kept or given as the module docstring says; UP_TENANT
    is created first when missing. A given key that is malformed, names another key or was
    revoked is a ConfigError naming the setting."""
    await _ensure_tenant(tenants)
    recorded = _read(path)
    if given is not None:
        return await _given(tenants, path, given, recorded)
    if recorded is not None and await _still_valid(tenants, *recorded):
        return AdminKey(recorded[0], recorded[1], "kept", path)
    info, api_key = await tenants.create_key(UP_TENANT)
    _write(path, api_key)
    return AdminKey(info.key_id, api_key, "created", path)


async def rotate_admin_key(tenants: TenantStore, path: Path) -> tuple[ApiKeyInfo, str, str | None]:
    """A new admin key, written to `path`, and the id of the one it replaced, revoked (None when
    there was none): the new key, the file, then the revocation, so that a stop in between
    leaves a working key behind."""
    await _ensure_tenant(tenants)
    recorded = _read(path)
    info, api_key = await tenants.create_key(UP_TENANT)
    _write(path, api_key)
    replaced = None
    if recorded is not None and recorded[0] != info.key_id:
        replaced = recorded[0]
        await tenants.revoke_key(replaced)
    return info, api_key, replaced


async def _ensure_tenant(tenants: TenantStore) -> None:
    # Created once; a tenant an operator changed since (limits, models) is left as it is.
    if await tenants.get_tenant(UP_TENANT) is None:
        await tenants.put_tenant(Tenant(name=UP_TENANT, admin=True, max_priority=Priority.CRITICAL,
                                        default_priority=Priority.NORMAL))


async def _given(tenants: TenantStore, path: Path, api_key: str,
                 recorded: tuple[str, str | None] | None) -> AdminKey:
    try:
        info = await tenants.add_key(UP_TENANT, api_key)
    except (InvalidInput, Conflict) as exc:
        raise ConfigError(f"{ADMIN_KEY_SETTING} (up.admin_key): {exc}; give a key that `tidegate keys "
                          "rotate-admin` printed, or leave it unset and `up` makes one") from None
    if recorded is not None and recorded[0] != info.key_id:
        await tenants.revoke_key(recorded[0])  # the admin key the given one replaces
    if recorded != (info.key_id, None):
        _write(path, info.key_id)  # the id only: the secret stays where the operator keeps it
    return AdminKey(info.key_id, api_key, "given", path)


async def _still_valid(tenants: TenantStore, key_id: str, api_key: str | None) -> bool:
    if api_key is not None:
        tenant = await tenants.authenticate(api_key)
        return tenant is not None and tenant.name == UP_TENANT
    # Only the id is recorded (the key was given at an earlier start): valid while not revoked.
    return any(key.key_id == key_id and key.revoked_at is None for key in await tenants.list_keys(UP_TENANT))


def _read(path: Path) -> tuple[str, str | None] | None:
    """(key id, full key or None) of the recorded admin key; None when there is no file."""
    try:
        text = path.read_text().strip()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ConfigError(f"cannot read the admin key file {path}: {exc.strerror or exc}") from None
    parsed = parse_api_key(text)
    if parsed is not None:
        return parsed[0], text
    if _KEY_ID.fullmatch(text):
        return text, None
    raise ConfigError(f"{path} does not hold an admin key (one tidegate key, or key id, on one line): "
                      "remove it, and the next start makes a new key")


def _write(path: Path, text: str) -> None:
    """Replace `path` with `text` in one step, readable by this user only: written to a new file
    created with mode 0600, then renamed over the old one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as file:  # mkstemp creates it 0600 already
            os.fchmod(file.fileno(), _FILE_MODE)
            file.write(text + "\n")
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
