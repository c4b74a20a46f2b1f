"""`tidegate tenants …` and `tidegate keys …`: who may call the gateway, within which limits, and
with which API keys."""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Annotated, NoReturn

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from tidegate.cli._common import DEFAULT_QUEUE_URL, QueueUrl, errors_as_exit, run_with
from tidegate.errors import TidegateError

if TYPE_CHECKING:
    from tidegate.coord.tenants import ApiKeyInfo, KeyLimits, Tenant, TenantStore

__all__ = ["keys_app", "tenants_app"]

tenants_app = typer.Typer(help="Tenants: who may call the gateway, and within which limits.",
                          no_args_is_help=True)
keys_app = typer.Typer(help="Tenants' API keys (only a digest of each secret is stored).",
                       no_args_is_help=True)


def _tenant_store(url: str) -> TenantStore:
    from tidegate._sqlite import ensure_sqlite_folder
    from tidegate.coord.tenants import tenant_store_for

    ensure_sqlite_folder(url)
    # A one-shot command authenticates nothing: no cache to keep.
    return tenant_store_for(url, auth_cache_s=0)


def _tenant_from_options(name: str, *, max_priority: str, default_priority: str, rpm: int | None,
                         daily_budget_usd: str | None, models: str | None, admin: bool) -> Tenant:
    """The Tenant the `tenants put` options describe; BadParameter names what is wrong."""
    from decimal import Decimal, InvalidOperation

    from pydantic import ValidationError

    from tidegate.coord.tenants import Tenant
    from tidegate.jobs import Priority

    budget: Decimal | None = None
    if daily_budget_usd is not None:
        try:
            budget = Decimal(daily_budget_usd)
        except InvalidOperation:
            raise typer.BadParameter(f"not an amount in USD: {daily_budget_usd!r}",
                                     param_hint="--daily-budget-usd") from None
    allowed: tuple[str, ...] | None = None
    if models is not None:
        allowed = tuple(model.strip() for model in models.split(",") if model.strip())
        if not allowed:
            raise typer.BadParameter("name at least one model, or leave --models out to allow all",
                                     param_hint="--models")
    try:
        tenant = Tenant(name=name, max_priority=Priority.parse(max_priority),
                        default_priority=Priority.parse(default_priority), rpm=rpm,
                        daily_budget_usd=budget, allowed_models=allowed, admin=admin)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(part) for part in error['loc'])}: {error['msg']}"
                             for error in exc.errors())
        raise typer.BadParameter(problems) from None
    if not tenant.may_use(tenant.default_priority):
        # Every request that names no priority would be refused.
        raise typer.BadParameter(
            f"default priority {tenant.default_priority.name.lower()} is more urgent than max "
            f"priority {tenant.max_priority.name.lower()}", param_hint="--default-priority")
    return tenant


@tenants_app.command("put")
def tenants_put(
    name: Annotated[str, typer.Argument(help="Tenant name: letters, digits, '_', '.', '-'.")],
    queue: QueueUrl = DEFAULT_QUEUE_URL,
    max_priority: Annotated[str, typer.Option(
        help="The most urgent priority it may ask for (a more urgent request is refused).")] = "high",
    default_priority: Annotated[str, typer.Option(
        help="The priority of its requests that name none.")] = "normal",
    rpm: Annotated[int | None, typer.Option(
        min=1, help="Requests per minute over all its keys (default: no limit).")] = None,
    daily_budget_usd: Annotated[str | None, typer.Option(
        help="Daily spend limit in USD, e.g. 10 or 2.50 (default: no limit).")] = None,
    models: Annotated[str | None, typer.Option(
        help="Comma-separated models it may use (default: every configured model).")] = None,
    admin: Annotated[bool, typer.Option("--admin", help="May call the admin API.")] = False,
) -> None:
    """Create or replace a tenant: settings left out take their defaults, not their old values."""
    with errors_as_exit():
        tenant = _tenant_from_options(name, max_priority=max_priority, default_priority=default_priority,
                                      rpm=rpm, daily_budget_usd=daily_budget_usd, models=models,
                                      admin=admin)
    run_with(partial(_tenant_store, queue), lambda store: store.put_tenant(tenant))
    typer.echo(f"Saved tenant {tenant.name}.")


@tenants_app.command("list")
def tenants_list(queue: QueueUrl = DEFAULT_QUEUE_URL) -> None:
    """Every tenant and its limits."""
    tenants = run_with(partial(_tenant_store, queue), lambda store: store.list_tenants())
    console = Console()
    if not tenants:
        console.print("No tenants.")
        return
    table = Table(title="Tenants")
    table.add_column("name", no_wrap=True)
    for column in ("max priority", "default priority"):
        table.add_column(column)
    for column in ("rpm", "daily budget (USD)"):
        table.add_column(column, justify="right")
    table.add_column("models", overflow="fold")
    table.add_column("admin")
    for tenant in tenants:
        table.add_row(
            escape(tenant.name), tenant.max_priority.name.lower(), tenant.default_priority.name.lower(),
            "no limit" if tenant.rpm is None else f"{tenant.rpm:,}",
            "no limit" if tenant.daily_budget_usd is None else f"{tenant.daily_budget_usd:,}",
            "all" if tenant.allowed_models is None else escape(", ".join(tenant.allowed_models)),
            "yes" if tenant.admin else "",
        )
    console.print(table)


@tenants_app.command("show")
def tenants_show(
    name: Annotated[str, typer.Argument(help="The tenant to show.")],
    queue: QueueUrl = DEFAULT_QUEUE_URL,
) -> None:
    """A tenant's limits and its API keys (ids and dates, never secrets)."""

    async def read(store: TenantStore) -> tuple[Tenant | None, list[ApiKeyInfo]]:
        return await store.get_tenant(name), await store.list_keys(name)

    tenant, keys = run_with(partial(_tenant_store, queue), read)
    if tenant is None:
        _no_such_tenant(name)
    console = Console()
    limits = Table(title=f"Tenant {escape(tenant.name)}", show_header=False)
    limits.add_column("setting")
    limits.add_column("value", overflow="fold")
    for setting, value in _tenant_rows(tenant):
        limits.add_row(setting, escape(value))
    console.print(limits)
    if not keys:
        console.print("No keys (tidegate keys create NAME makes one).", highlight=False)
        return
    table = Table(title="API keys")
    table.add_column("key id", no_wrap=True)
    for column in ("created (UTC)", "revoked (UTC)"):
        table.add_column(column)
    for key in keys:
        revoked = key.revoked_at.strftime("%Y-%m-%d %H:%M:%S") if key.revoked_at else ""
        table.add_row(key.key_id, key.created_at.strftime("%Y-%m-%d %H:%M:%S"), revoked)
    console.print(table)


def _tenant_rows(tenant: Tenant) -> list[tuple[str, str]]:
    """A tenant's settings as `tenants list` words them."""
    return [
        ("max priority", tenant.max_priority.name.lower()),
        ("default priority", tenant.default_priority.name.lower()),
        ("rpm", "no limit" if tenant.rpm is None else f"{tenant.rpm:,}"),
        ("daily budget (USD)",
         "no limit" if tenant.daily_budget_usd is None else f"{tenant.daily_budget_usd:,}"),
        ("models", "all" if tenant.allowed_models is None else ", ".join(tenant.allowed_models)),
        ("admin", "yes" if tenant.admin else "no"),
    ]


@tenants_app.command("delete")
def tenants_delete(
    name: Annotated[str, typer.Argument(help="The tenant to delete.")],
    queue: QueueUrl = DEFAULT_QUEUE_URL,
    yes: Annotated[bool, typer.Option(
        "--yes", help="Delete without asking (needed without a terminal).")] = False,
) -> None:
    """Delete a tenant and revoke all its API keys: its callers are refused from then on (within
    the gateways' authentication cache time, 1 s). Its keys stay revoked if the name is reused."""
    if run_with(partial(_tenant_store, queue), lambda store: store.get_tenant(name)) is None:
        _no_such_tenant(name)  # before asking: there is nothing to confirm
    if not yes and not typer.confirm(f"Delete tenant {name} and revoke all its keys?", default=False):
        Console(stderr=True).print("Nothing deleted.", highlight=False)
        raise typer.Exit(1)
    revoked = run_with(partial(_tenant_store, queue), lambda store: store.delete_tenant(name))
    if revoked is None:
        _no_such_tenant(name)
    typer.echo(f"Deleted tenant {name}; revoked {len(revoked)} key{'s' if len(revoked) != 1 else ''}"
               + (f" ({', '.join(revoked)})." if revoked else "."))


def _no_such_tenant(name: str) -> NoReturn:
    with errors_as_exit():
        raise TidegateError(f"no tenant named {name!r} (tidegate tenants list shows them)")
    raise AssertionError("unreachable: errors_as_exit exits")


KeyRpm = Annotated[int | None, typer.Option(
    "--rpm", min=1, help="Requests per minute of this key, inside its tenant's.")]
KeyModels = Annotated[str | None, typer.Option(
    "--models", help="Comma-separated models this key may use, among its tenant's.")]
KeyMaxPriority = Annotated[str | None, typer.Option(
    "--max-priority", help="The most urgent priority this key may ask for (the less urgent of "
    "the key's and the tenant's wins).")]
KeyExpiresAt = Annotated[str | None, typer.Option(
    "--expires-at", help="When the key stops working: ISO 8601 with a zone, e.g. 2027-01-31T00:00:00Z.")]
_LIMIT_OPTIONS = {"rpm": "--rpm", "allowed_models": "--models", "max_priority": "--max-priority",
                  "expires_at": "--expires-at"}


def _limit_changes(*, rpm: int | None, models: str | None, max_priority: str | None,
                   expires_at: str | None) -> dict[str, object]:
    """The key limits the options give, by KeyLimits field; BadParameter names what is wrong."""
    from datetime import datetime

    from tidegate.errors import InvalidPriority
    from tidegate.jobs import Priority

    changes: dict[str, object] = {}
    if rpm is not None:
        changes["rpm"] = rpm
    if models is not None:
        allowed = tuple(model.strip() for model in models.split(",") if model.strip())
        if not allowed:
            raise typer.BadParameter("name at least one model", param_hint="--models")
        changes["allowed_models"] = allowed
    if max_priority is not None:
        try:
            changes["max_priority"] = Priority.parse(max_priority)
        except InvalidPriority as exc:
            raise typer.BadParameter(str(exc), param_hint="--max-priority") from None
    if expires_at is not None:
        try:
            moment = datetime.fromisoformat(expires_at)
        except ValueError:
            moment = None
        if moment is None or moment.tzinfo is None:
            raise typer.BadParameter(f"not an ISO 8601 time with a zone: {expires_at!r}",
                                     param_hint="--expires-at")
        changes["expires_at"] = moment
    return changes


@keys_app.command("create")
def keys_create(
    tenant: Annotated[str, typer.Argument(help="The tenant the key acts for.")],
    queue: QueueUrl = DEFAULT_QUEUE_URL,
    rpm: KeyRpm = None,
    models: KeyModels = None,
    max_priority: KeyMaxPriority = None,
    expires_at: KeyExpiresAt = None,
) -> None:
    """Create an API key, with limits of its own inside its tenant's, and print it: the only time
    the full key is shown."""
    from tidegate.coord.tenants import NO_KEY_LIMITS

    with errors_as_exit():
        limits = NO_KEY_LIMITS.changed(_limit_changes(rpm=rpm, models=models, max_priority=max_priority,
                                                      expires_at=expires_at))
    info, api_key = run_with(partial(_tenant_store, queue), lambda store: store.create_key(tenant, limits))
    Console(stderr=True).print(
        f"Created key [bold]{info.key_id}[/] for tenant {escape(info.tenant)}. "
        "[yellow]Copy it now: it is not shown again[/] (only a digest is stored).",
        highlight=False, soft_wrap=True,
    )
    typer.echo(api_key)  # alone on stdout, unwrapped, so `KEY=$(tidegate keys create …)` works


@keys_app.command("update")
def keys_update(
    key_id: Annotated[str, typer.Argument(help="The key's id (the 12 characters after 'tg_').")],
    queue: QueueUrl = DEFAULT_QUEUE_URL,
    rpm: KeyRpm = None,
    models: KeyModels = None,
    max_priority: KeyMaxPriority = None,
    expires_at: KeyExpiresAt = None,
    clear: Annotated[str | None, typer.Option(
        help="Comma-separated limits to give back to the tenant: rpm, models, max-priority, "
        "expires-at.")] = None,
) -> None:
    """Change a key's own limits: those given are set, those cleared go back to the tenant's,
    the rest are kept. Gateways apply it within their authentication cache time (1 s)."""
    with errors_as_exit():
        changes = _limit_changes(rpm=rpm, models=models, max_priority=max_priority, expires_at=expires_at)
        by_option = {option.removeprefix("--"): field for field, option in _LIMIT_OPTIONS.items()}
        cleared = [name.strip() for name in (clear or "").split(",") if name.strip()]
        unknown = [name for name in cleared if name not in by_option]
        if unknown:
            raise typer.BadParameter(f"not a key limit: {', '.join(unknown)} (use {', '.join(by_option)})",
                                     param_hint="--clear")
        fields = [by_option[name] for name in cleared]
        both = sorted(set(fields) & set(changes))
        if both:
            raise typer.BadParameter(f"both set and cleared: {', '.join(_LIMIT_OPTIONS[f] for f in both)}")
        if not changes and not fields:
            raise typer.BadParameter("give a limit to set or --clear")
    info = run_with(partial(_tenant_store, queue), lambda store: store.change_key_limits(
        key_id, lambda limits: limits.changed({**changes, **dict.fromkeys(fields)})))
    if info is None:
        with errors_as_exit():
            raise TidegateError(f"no active key with id {key_id!r} (unknown or revoked)")
    typer.echo(f"Changed key {key_id}: {_limits_text(info.limits) or 'none of its own'}.")


def _limits_text(limits: KeyLimits) -> str:
    """A key's own limits in a few words ('' when it has none)."""
    parts = []
    if limits.rpm is not None:
        parts.append(f"rpm {limits.rpm}")
    if limits.allowed_models is not None:
        parts.append("models " + ",".join(limits.allowed_models))
    if limits.max_priority is not None:
        parts.append(f"max priority {limits.max_priority.name.lower()}")
    if limits.expires_at is not None:
        parts.append(f"expires {limits.expires_at.isoformat()}")
    return "; ".join(parts)


@keys_app.command("list")
def keys_list(
    queue: QueueUrl = DEFAULT_QUEUE_URL,
    tenant: Annotated[str | None, typer.Option(help="Only this tenant's keys.")] = None,
) -> None:
    """API keys, newest first: ids, tenants and dates (never secrets)."""
    keys = run_with(partial(_tenant_store, queue), lambda store: store.list_keys(tenant))
    console = Console()
    if not keys:
        console.print("No keys.")
        return
    table = Table(title="API keys")
    table.add_column("key id", no_wrap=True)  # copied into `keys revoke`: keep it whole
    for column in ("tenant", "created (UTC)", "revoked (UTC)", "limits"):
        table.add_column(column)
    for key in keys:
        revoked = key.revoked_at.strftime("%Y-%m-%d %H:%M:%S") if key.revoked_at else ""
        table.add_row(key.key_id, escape(key.tenant), key.created_at.strftime("%Y-%m-%d %H:%M:%S"),
                      revoked, escape(_limits_text(key.limits)))
    console.print(table)


@keys_app.command("revoke")
def keys_revoke(
    key_id: Annotated[str, typer.Argument(help="The key's id (the 12 characters after 'tg_').")],
    queue: QueueUrl = DEFAULT_QUEUE_URL,
) -> None:
    """Revoke an API key. Gateways refuse it within their authentication cache time (1 s)."""
    if not run_with(partial(_tenant_store, queue), lambda store: store.revoke_key(key_id)):
        with errors_as_exit():
            raise TidegateError(f"no active key with id {key_id!r} (unknown or already revoked)")
    typer.echo(f"Revoked key {key_id}.")


@keys_app.command("rotate-admin")
def keys_rotate_admin(queue: QueueUrl = DEFAULT_QUEUE_URL) -> None:
    """Replace the admin key of `tidegate up`: make a new one, keep it in the key file beside the
    queue (mode 0600) and print it, then revoke the one it replaces. A running `up` takes the new
    key at once and refuses the old within 1 s; no other key is touched."""
    from tidegate.app.admin_key import ADMIN_KEY_SETTING, admin_key_path, rotate_admin_key
    from tidegate.cli._common import load_config

    with errors_as_exit():
        if load_config(None).up.admin_key is not None:
            # `up` would store the given key again at its next start, and find it revoked.
            raise TidegateError(f"the admin key is given by {ADMIN_KEY_SETTING} (up.admin_key): change that "
                                "setting and restart `tidegate up` instead")
        path = admin_key_path(queue)
    info, api_key, replaced = run_with(partial(_tenant_store, queue),
                                       lambda store: rotate_admin_key(store, path))
    revoked = f"; revoked key {replaced}" if replaced else ""
    Console(stderr=True).print(
        f"New admin key [bold]{info.key_id}[/] for tenant {escape(info.tenant)}, kept in "
        f"{escape(str(path))}{revoked}.", highlight=False, soft_wrap=True)
    typer.echo(api_key)  # alone on stdout, unwrapped, so `KEY=$(tidegate keys rotate-admin)` works
