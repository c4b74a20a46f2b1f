"""The public surface is what `__all__` says: nothing public is left out of it, nothing private in."""

from __future__ import annotations

import types

import pytest

import tidegate
import tidegate.providers
import tidegate.queue


def _public_names(module: types.ModuleType) -> set[str]:
    # Submodules become attributes of their package once imported; they are not exports.
    return {
        name
        for name, value in vars(module).items()
        if not name.startswith("_") and not isinstance(value, types.ModuleType)
    }


@pytest.mark.parametrize("module", [tidegate, tidegate.queue, tidegate.providers], ids=lambda m: m.__name__)
def test_all_lists_exactly_the_public_names(module: types.ModuleType) -> None:
    exported: list[str] = module.__all__

    assert len(exported) == len(set(exported)), "duplicate names in __all__"
    assert set(exported) == _public_names(module)


def test_exported_classes_and_functions_come_from_tidegate() -> None:
    for name in tidegate.__all__:
        member = getattr(tidegate, name)
        if isinstance(member, type | types.FunctionType):
            assert member.__module__.startswith("tidegate."), name
