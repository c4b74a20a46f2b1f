"""`tidegate config …`: check a configuration file and the environment before a process reads them.

`tidegate config check [FILE]` loads the settings exactly as every process does (the file, the
TIDEGATE_* variables over it), then prints the effective settings as TOML, each value marked with
where it came from and every secret redacted. A mistake exits 2 with one line per error, naming
the setting's path (`gateway.port: …`), so it can be fixed before a deployment fails at start.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Mapping
from decimal import Decimal
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, NoReturn

import typer
from rich.console import Console
from rich.markup import escape

from tidegate.cli._common import ERROR_EXIT

if TYPE_CHECKING:
    from pydantic import BaseModel, ValidationError

    from tidegate.config import TidegateConfig

__all__ = ["config_app", "settings_toml"]

config_app = typer.Typer(help="Check the configuration (tidegate.toml and TIDEGATE_* variables).",
                         no_args_is_help=True)

REDACTED = "***"
# A TOML key that needs no quotes.
_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")
# The recommender's settings refuse a value with a ConfigError of their own (its callers catch
# that), whose message names the setting without its section.
_RECS_ERROR = re.compile(r"recommender setting ([\w.]+): ")

# A setting whose value is never repeated in an error message.
_SECRET_NAME = re.compile(r"(key|secret|password|token)[^.]*$", re.IGNORECASE)
# pydantic-settings names the top-level field whose variable it could not parse.
_ENV_FIELD = re.compile(r'field "(\w+)"')

Sources = Mapping[str, str]
"""A setting's dotted path → where its value came from ("env" or "file")."""


@config_app.command("check")
def check(
    file: Annotated[Path | None, typer.Argument(
        help="The file to check; default: $TIDEGATE_CONFIG, else ./tidegate.toml (if any).",
        show_default=False)] = None,
) -> None:
    """Validate a configuration file and the TIDEGATE_* variables; print the effective settings."""
    path = file if file is not None else Path(os.environ.get("TIDEGATE_CONFIG", "tidegate.toml"))
    if file is not None and not file.is_file():
        _fail([f"{file}: no such file"])
    config, errors = load_checked(path)
    if config is None:
        _fail(errors)
    source = str(path) if path.is_file() else f"no file ({path} not found): defaults"
    sources = {**_file_sources(path), **_env_sources()}
    typer.echo(f"# tidegate config check: valid. Read from {source} and TIDEGATE_* variables.")
    typer.echo("# The effective settings, secrets redacted; a trailing comment marks a value from the "
               "environment or the file.")
    for line in settings_toml(config, sources):
        typer.echo(line)
    for warning in _warnings(config):
        Console(stderr=True).print(f"[bold yellow]warning:[/] {escape(warning)}", highlight=False,
                                   soft_wrap=True)


def load_checked(path: Path) -> tuple[TidegateConfig | None, list[str]]:
    """The settings from `path` and the environment, through the loader every process uses, or
    None and one line per error, each naming the setting's dotted path."""
    import tomllib

    from pydantic import ValidationError
    from pydantic_settings import SettingsError

    from tidegate.config import RecsSettings, TidegateConfig
    from tidegate.errors import ConfigError

    before = os.environ.get("TIDEGATE_CONFIG")
    os.environ["TIDEGATE_CONFIG"] = str(path)  # what the loader reads, as load_config sets it
    try:
        return TidegateConfig(), []
    except ValidationError as exc:
        return None, validation_errors(exc)
    except tomllib.TOMLDecodeError as exc:
        return None, [f"{path}: not valid TOML: {exc}"]
    except SettingsError as exc:  # a variable whose value is not the JSON its setting needs
        return None, [environment_error(exc)]
    except ConfigError as exc:
        # Only [recs] raises its own error, which ends the validation: check the other sections
        # with the recommender's defaults in its place, to report their errors too.
        recs = [_RECS_ERROR.sub(r"recs.\1: ", part) for part in str(exc).split("; ")]
        try:
            TidegateConfig(recs=RecsSettings())
        except ValidationError as others:
            return None, [*recs, *validation_errors(others)]
        return None, recs
    finally:  # a check changes nothing of the process that ran it (a test's, say)
        if before is None:
            del os.environ["TIDEGATE_CONFIG"]
        else:
            os.environ["TIDEGATE_CONFIG"] = before


def validation_errors(exc: ValidationError) -> list[str]:
    """One line per error of `exc`: `section.name: message, not <input>`."""
    lines = []
    for error in exc.errors():
        place = ".".join(str(part) for part in error["loc"]) or "(top level)"
        if error["type"] == "extra_forbidden":
            lines.append(f"{place}: no such setting (see tidegate.example.toml)")
            continue
        # A table's input is left out: its message says what is wrong, and it may hold a URL; so
        # is a secret's (an admin key with a typo is still nearly the key).
        shown = (isinstance(error["input"], str | int | float | Decimal) and error["type"] != "missing"
                 and _SECRET_NAME.search(place) is None)
        given = f", not {_shown(error['input'])}" if shown else ""
        lines.append(f"{place}: {error['msg']}{given}")
    return lines


def environment_error(exc: Exception) -> str:
    """A variable the loader could not parse (a list or table is given as JSON), named."""
    field = _ENV_FIELD.search(str(exc))
    prefix = f"TIDEGATE_{field.group(1).upper()}" if field else "TIDEGATE_"
    names = sorted(name for name in os.environ if name.upper().startswith(prefix))
    reason = f": {exc.__cause__}" if exc.__cause__ else ""
    return f"environment: {' or '.join(names) or prefix + '*'} is not valid JSON{reason}"


def _shown(value: object) -> str:
    text = redact_text(value) if isinstance(value, str) else str(value)
    return text if len(text) <= 60 else text[:57] + "..."


def redact_text(value: str) -> str:
    """A string as it may be printed: a URL's password replaced."""
    from tidegate._urls import redact_url

    return repr(redact_url(value)) if "://" in value else repr(value)


def _fail(errors: list[str]) -> NoReturn:
    console = Console(stderr=True)
    for error in errors:
        console.print(f"[bold red]error:[/] {escape(error)}", highlight=False, soft_wrap=True)
    raise typer.Exit(ERROR_EXIT)


# ------------------------------------------------------------------------------- the TOML print


def settings_toml(settings: BaseModel, sources: Sources | None = None) -> Iterator[str]:
    """`settings` as TOML lines: its own values first, then one table per section (an array of
    tables for a list of sections), a value that is not set as a comment. A SecretStr and a URL's
    password are redacted; `sources` adds where a value came from as a trailing comment."""
    yield from _table(settings, "", sources or {}, header=None)


def _table(model: BaseModel, path: str, sources: Sources, header: str | None) -> Iterator[str]:
    from pydantic import BaseModel

    if header is not None:
        yield ""
        yield header
    nested: list[tuple[str, object]] = []
    for name in type(model).model_fields:
        value = getattr(model, name)
        place = f"{path}.{name}" if path else name
        if isinstance(value, BaseModel) or _models_only(value):
            nested.append((name, value))
        elif value is None:
            yield f"# {name} is not set"
        else:
            origin = _origin(place, sources)
            yield f"{name} = {toml_value(value)}" + (f"  # {origin}" if origin else "")
    for name, value in nested:
        place = f"{path}.{name}" if path else name
        if isinstance(value, BaseModel):
            yield from _table(value, place, sources, header=f"[{place}]")
        elif isinstance(value, Mapping):
            for key, item in value.items():
                yield from _table(item, f"{place}.{_key(str(key))}", sources,
                                  header=f"[{place}.{_key(str(key))}]")
        else:
            for item in value:  # type: ignore[attr-defined]  # a tuple of models (_models_only)
                yield from _table(item, place, sources, header=f"[[{place}]]")


def _models_only(value: object) -> bool:
    # A list or table of sections (providers, their models) is printed as tables; an empty one
    # as a plain `[]` or `{}`.
    from pydantic import BaseModel

    items = list(value.values()) if isinstance(value, Mapping) else value if isinstance(value, tuple) else ()
    return bool(items) and all(isinstance(item, BaseModel) for item in items)


def _origin(place: str, sources: Sources) -> str:
    # A value in a list of tables (a provider's) counts as given where the whole list was.
    parts = place.split(".")
    for end in range(len(parts), 0, -1):
        found = sources.get(".".join(parts[:end]))
        if found:
            return found
    return ""


def toml_value(value: object) -> str:
    """One value as TOML, secrets redacted: strings quoted, decimals as strings (the file's own
    spelling of money), levels by name, lists as arrays, mappings as inline tables."""
    from pydantic import SecretBytes, SecretStr

    if isinstance(value, SecretStr | SecretBytes):
        return f'"{REDACTED}"'
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, Enum):
        return _string(value.name.lower())
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, Decimal):
        return _string(str(value))
    if isinstance(value, str):
        from tidegate._urls import redact_url

        return _string(redact_url(value) if "://" in value else value)
    if isinstance(value, Mapping):
        inner = ", ".join(f"{_key(str(key))} = {toml_value(item)}" for key, item in value.items())
        return f"{{ {inner} }}" if inner else "{}"
    if isinstance(value, tuple | list | set | frozenset):
        return "[" + ", ".join(toml_value(item) for item in value) + "]"
    return _string(str(value))


def _string(text: str) -> str:
    # JSON's string escapes are TOML's basic-string escapes.
    import json

    return json.dumps(text, ensure_ascii=False)


def _key(key: str) -> str:
    return key if _BARE_KEY.match(key) else _string(key)


# ---------------------------------------------------------------------------- where values came from


def _file_sources(path: Path) -> dict[str, str]:
    import tomllib

    if not path.is_file():
        return {}
    with path.open("rb") as handle:
        return dict.fromkeys(_paths(tomllib.load(handle)), "file")


def _env_sources() -> dict[str, str]:
    """The settings the environment gives, by path, as the loader's own sources read them: every
    source of TidegateConfig but the file (TIDEGATE_* nested, and the short spellings such as
    TIDEGATE_GATEWAY_PORT or TIDEGATE_ADMIN_KEY that sources of its own read)."""
    from pydantic_settings import (
        DotEnvSettingsSource,
        EnvSettingsSource,
        InitSettingsSource,
        SecretsSettingsSource,
        TomlConfigSettingsSource,
    )

    from tidegate.config import TidegateConfig

    sources = TidegateConfig.settings_customise_sources(
        TidegateConfig, InitSettingsSource(TidegateConfig, init_kwargs={}), EnvSettingsSource(TidegateConfig),
        DotEnvSettingsSource(TidegateConfig), SecretsSettingsSource(TidegateConfig))
    found: dict[str, str] = {}
    for source in sources:
        if not isinstance(source, InitSettingsSource | TomlConfigSettingsSource):
            found.update(dict.fromkeys(_paths(source()), "env"))
    return found


def _paths(data: Mapping[str, object], prefix: str = "") -> Iterator[str]:
    # Only the values, not their tables: a `[sync]` table in the file does not make every
    # setting of the section the file's.
    for key, value in data.items():
        place = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            yield from _paths(value, f"{place}.")
        else:
            yield place


# ---------------------------------------------------------------------------- warnings


def _warnings(config: TidegateConfig) -> Iterator[str]:
    """What is valid but will not work as it stands: a provider's key variable that is unset."""
    for index, provider in enumerate(config.providers):
        if provider.api_key_env is not None and not os.environ.get(provider.api_key_env):
            yield (f"providers.{index}.api_key_env: {provider.api_key_env} is not set in this environment "
                   f"(provider {provider.name!r} will be called without a key)")

