"""The public surface is what `__all__` says: nothing public is left out of it, nothing private in."""

from __future__ import annotations

import types

import pytest

import tidegate
import tidegate.dispatch
import tidegate.errors
import tidegate.providers
import tidegate.queue
import tidegate.recs
import tidegate.sync

PACKAGES = [tidegate, tidegate.queue, tidegate.providers, tidegate.sync, tidegate.recs, tidegate.dispatch]


def _public_names(module: types.ModuleType) -> set[str]:
    # Submodules become attributes of their package once imported; they are not exports.
    return {
        name
        for name, value in vars(module).items()
        if not name.startswith("_") and not isinstance(value, types.ModuleType)
    }


@pytest.mark.parametrize("module", PACKAGES, ids=lambda m: m.__name__)
def test_all_lists_exactly_the_public_names(module: types.ModuleType) -> None:
    exported: list[str] = module.__all__

    assert len(exported) == len(set(exported)), "duplicate names in __all__"
    assert set(exported) == _public_names(module)


@pytest.mark.parametrize("module", PACKAGES, ids=lambda m: m.__name__)
def test_exported_classes_and_functions_come_from_tidegate(module: types.ModuleType) -> None:
    for name in module.__all__:
        member = getattr(module, name)
        if isinstance(member, type | types.FunctionType):
            assert member.__module__.startswith("tidegate."), name


@pytest.mark.parametrize("parent", ["InvalidInput", "NotFound", "Conflict", "Unavailable", "Closed"])
def test_the_error_groups_are_exported_and_each_holds_leaves(parent: str) -> None:
    group = getattr(tidegate, parent)
    assert group is getattr(tidegate.errors, parent)
    assert group.__bases__ == (tidegate.TidegateError,)
    leaves = [cls for cls in vars(tidegate.errors).values()
              if isinstance(cls, type) and cls is not group and issubclass(cls, group)]
    assert len(leaves) >= 2, f"{parent} groups {leaves}"


def test_every_unavailable_and_closed_error_is_in_its_group() -> None:
    for name, cls in vars(tidegate.errors).items():
        if isinstance(cls, type) and cls.__module__ == "tidegate.errors":
            if name.endswith("Unavailable"):
                assert issubclass(cls, tidegate.Unavailable), name
            if name.endswith("Closed"):
                assert issubclass(cls, tidegate.Closed), name
