"""tidegate.example.toml: it loads through the real settings loader as the defaults, its commented
examples are valid settings too, and every field of the settings appears in it, so a setting
added later without an example fails here with its path."""

from __future__ import annotations

import re
import types
import typing
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import BaseModel

from tidegate.config import TidegateConfig

EXAMPLE = Path(__file__).resolve().parent.parent / "tidegate.example.toml"

# `[section]`, `[[section]]`, `# [section]` or `# [[section]]`.
HEADER = re.compile(r"^#?\s*\[\[?([a-z0-9_.]+)\]\]?\s*(?:#.*)?$")
# `key = …` or `# key = …` (a setting left unset or an example).
KEY = re.compile(r"^#?\s*([a-z_][a-z0-9_]*) = ")
# Only the commented-out settings and their section headers, not the prose around them.
COMMENTED = re.compile(r"^#\s?(\[\[?[a-z0-9_.]+\]\]?|[a-z_][a-z0-9_]* = .*)$")
ANY_KEY = "*"  # a table's own key (a tier's name in tier_prices), any name


def _clear_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for name in list(os.environ):
        if name.upper().startswith("TIDEGATE_"):
            monkeypatch.delenv(name)


def _load(path: Path, monkeypatch: pytest.MonkeyPatch) -> TidegateConfig:
    _clear_environment(monkeypatch)
    monkeypatch.setenv("TIDEGATE_CONFIG", str(path))
    return TidegateConfig.load()


def _without_consumer(config: TidegateConfig) -> dict[str, object]:
    # The pipeline's consumer name defaults to this host and process, so it differs per load.
    return config.model_dump(exclude={"sync": {"pipeline": {"consumer"}}})


def written_settings(text: str) -> set[str]:
    """The dotted paths of every key in `text`, set or commented out, under its section."""
    section = ""
    paths = set()
    for line in text.splitlines():
        stripped = line.strip()
        if header := HEADER.match(stripped):
            section = header.group(1)
        elif key := KEY.match(stripped):
            paths.add(f"{section}.{key.group(1)}" if section else key.group(1))
    return paths


def _models_in(annotation: object) -> Iterator[tuple[type[BaseModel], bool]]:
    """The settings models a field's type holds, each with whether it sits under a table's own
    key (`dict[str, Model]`): `Model`, `Model | None`, `tuple[Model, ...]`, `dict[str, Model]`."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        yield annotation, False
        return
    origin = typing.get_origin(annotation)
    arguments = typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType, tuple):
        for argument in arguments:
            yield from _models_in(argument)
    elif origin is dict and arguments:
        for model, _ in _models_in(arguments[1]):
            yield model, True


def settings_fields(model: type[BaseModel], prefix: str = "") -> Iterator[str]:
    """Every field of `model` as a dotted path, its settings models walked recursively: a
    field holding a model is a section, whose own fields are listed, not the section itself."""
    for name, field in model.model_fields.items():
        path = f"{prefix}{name}"
        nested = list(_models_in(field.annotation))
        if not nested:
            yield path
        for inner, keyed in nested:
            yield from settings_fields(inner, f"{path}.{ANY_KEY}." if keyed else f"{path}.")


def _is_written(path: str, written: set[str]) -> bool:
    pattern = re.compile(r"\.".join("[A-Za-z0-9_]+" if part == ANY_KEY else re.escape(part)
                                    for part in path.split(".")) + "$")
    return any(pattern.match(key) for key in written)


def test_the_example_loads_as_the_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    config = _load(EXAMPLE, monkeypatch)

    assert _without_consumer(config) == _without_consumer(TidegateConfig.model_construct())


def test_every_commented_example_is_a_valid_setting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given the example with every commented-out setting and header set (its prose dropped)
    lines = []
    for line in EXAMPLE.read_text().splitlines():
        commented = COMMENTED.match(line.strip())
        lines.append(commented.group(1) if commented else line)
    uncommented = tmp_path / "every-setting.toml"
    uncommented.write_text("\n".join(lines) + "\n")

    config = _load(uncommented, monkeypatch)

    # Then each example took its place, in the sections it documents
    assert [provider.name for provider in config.providers] == ["openai", "anthropic"]
    openai = config.providers[0]
    assert openai.batch is not None and openai.models[0].tier_prices["flex"].input_usd_per_1m > 0
    assert config.budgets.global_daily_usd is not None
    assert config.sync.refresh and config.gateway.max_body_bytes is not None


def test_every_setting_appears_in_the_example() -> None:
    written = written_settings(EXAMPLE.read_text())

    missing = [path for path in settings_fields(TidegateConfig) if not _is_written(path, written)]

    assert not missing, f"settings without a line in tidegate.example.toml: {', '.join(missing)}"


def test_the_walk_finds_fields_of_nested_and_listed_sections() -> None:
    # The check above is only as good as the walk: it must reach into lists and optional tables.
    fields = set(settings_fields(TidegateConfig))

    assert {"gateway.port", "sync.pipeline.batch_size", "providers.models.rpm",
            "providers.batch.discount", "providers.models.tier_prices.*.input_usd_per_1m",
            "sync.refresh.entity_type"} <= fields
    assert "gateway" not in fields and "providers" not in fields
    assert not _is_written("gateway.no_such_setting", written_settings(EXAMPLE.read_text()))
