"""The runtime import graph of a package, read from its source with `ast` (nothing is imported).

A node is a module's dotted name; a package is its `__init__.py` under the package's name. An
edge is an import that runs: at module level or inside a function (a lazy import is still an
arrow), but not under `if TYPE_CHECKING:`. `from a.b import c` points at the module `a.b.c` if
there is one, else at `a.b`.

Importing `a.b.c` also runs `a/__init__.py` and `a/b/__init__.py`. Those implicit edges count,
except to a package that contains the importer: that package is already being imported by the
time its own submodule runs, so the edge runs nothing. This is what lets a package's `__init__`
re-export its submodules without the re-export being a cycle.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Import:
    """One runtime import: `source` (a module) imports `target` (a module) at `path:line`;
    `implicit` when the statement names a module inside `target`, a package; `lazy` when the
    statement is inside a function, so it runs when called, not when `source` is imported."""

    source: str
    target: str
    path: Path
    line: int
    implicit: bool = False
    lazy: bool = False

    def where(self, root: Path) -> str:
        """`tidegate/x.py:12`: the import's place, relative to the directory above the package."""
        return f"{self.path.relative_to(root.parent)}:{self.line}"


def modules_of(package_dir: Path) -> dict[str, Path]:
    """Every module of the package in `package_dir`, by dotted name."""
    modules: dict[str, Path] = {}
    for path in sorted(package_dir.rglob("*.py")):
        parts = list(path.relative_to(package_dir.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def _is_type_checking(test: ast.expr) -> bool:
    # `if TYPE_CHECKING:` and `if typing.TYPE_CHECKING:`
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _runtime_import_nodes(
    node: ast.AST, lazy: bool = False
) -> Iterator[tuple[ast.Import | ast.ImportFrom, bool]]:
    """Every import statement in `node` that can run (all but those under `if TYPE_CHECKING:`),
    each with whether it is inside a function."""
    if isinstance(node, ast.Import | ast.ImportFrom):
        yield node, lazy
    elif isinstance(node, ast.If) and _is_type_checking(node.test):
        for statement in node.orelse:
            yield from _runtime_import_nodes(statement, lazy)
    else:
        inside = lazy or isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
        for child in ast.iter_child_nodes(node):
            yield from _runtime_import_nodes(child, inside)


def _base_of(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    """The absolute name `from … import` reads from, relative imports resolved."""
    if not node.level:
        return node.module or ""
    package = module.split(".") if is_package else module.split(".")[:-1]
    anchor = package[: len(package) - node.level + 1]
    return ".".join([*anchor, node.module] if node.module else anchor)


def _named_targets(
    node: ast.Import | ast.ImportFrom, module: str, path: Path, modules: dict[str, Path]
) -> set[str]:
    """The modules one import statement names, before the implicit packages above them."""
    if isinstance(node, ast.Import):
        return {alias.name for alias in node.names}
    base = _base_of(node, module, path.name == "__init__.py")
    return {f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names}


def _module_of(name: str, modules: dict[str, Path]) -> str:
    """The module a dotted name is in (`a.b.Name` is in `a.b`)."""
    while name not in modules and "." in name:
        name = name.rsplit(".", 1)[0]
    return name


def _packages_above(target: str, importer: str, modules: dict[str, Path]) -> list[str]:
    """The packages an import of `target` also runs, but for those that contain `importer`."""
    parts = target.split(".")
    above = [".".join(parts[:size]) for size in range(1, len(parts))]
    return [package for package in above
            if package in modules and not (importer == package or importer.startswith(package + "."))]


def runtime_imports(package_dir: Path) -> list[Import]:
    """Every runtime import from one module of the package to another, in source order, each
    once per statement."""
    modules = modules_of(package_dir)
    top = package_dir.name
    found: list[Import] = []
    for module, path in modules.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        for node, lazy in _runtime_import_nodes(tree):
            for named in sorted(_named_targets(node, module, path, modules)):
                if named.split(".")[0] != top:
                    continue
                target = _module_of(named, modules)
                if target != module:
                    found.append(Import(module, target, path, node.lineno, lazy=lazy))
                found += [Import(module, package, path, node.lineno, implicit=True, lazy=lazy)
                          for package in _packages_above(target, module, modules)]
    return list(dict.fromkeys(found))  # `from a.b import c, d` runs a/b/__init__.py once
