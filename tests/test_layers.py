"""Imports point down the layer list of `support/layers.py`, no module is part of an import cycle,
and the README's Layout section shows the same layers in the same order.

The imports are read from the source with `ast` (see support/import_graph.py), so a lazy import
inside a function counts and one under `if TYPE_CHECKING:` does not.
"""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import networkx as nx

from support.import_graph import Import, modules_of, runtime_imports
from support.layers import LAYERS, SIDEWAYS

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "tidegate"

LAYER_OF = {name: number for number, layer in enumerate(LAYERS, start=1) for name in layer}
IMPORTS = runtime_imports(PACKAGE)


def _name_in_layers(module: str) -> str:
    """The name the layer list files a module under: the first part below `tidegate`."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _is_package(name: str) -> bool:
    return (PACKAGE / name).is_dir()


def _describe(arrow: Import) -> str:
    source, target = _name_in_layers(arrow.source), _name_in_layers(arrow.target)
    return (
        f"{arrow.where(PACKAGE)}: {arrow.source} imports {arrow.target} "
        f"(layer {LAYER_OF[source]} {source} -> layer {LAYER_OF[target]} {target})"
    )


def _is_wrong(arrow: Import) -> bool:
    """An arrow up the list, or between two names of one layer of which one is a package."""
    source, target = _name_in_layers(arrow.source), _name_in_layers(arrow.target)
    if LAYER_OF[source] != LAYER_OF[target]:
        return LAYER_OF[source] < LAYER_OF[target]
    sideways = source != target and (_is_package(source) or _is_package(target))
    return sideways and (source, target) not in SIDEWAYS


def test_every_module_belongs_to_a_layer() -> None:
    names = {_name_in_layers(module) for module in modules_of(PACKAGE)}
    listed = [name for layer in LAYERS for name in layer]

    assert len(listed) == len(set(listed)), "a name is listed in two layers"
    assert sorted(names - set(listed)) == [], "modules or packages missing from tests/support/layers.py"
    assert sorted(set(listed) - names) == [], "tests/support/layers.py lists names that do not exist"


def test_imports_point_down_the_layer_list() -> None:
    # An implicit arrow (to the package of a module named) is in the same layer as its module's.
    wrong = [_describe(arrow) for arrow in IMPORTS if not arrow.implicit and _is_wrong(arrow)]

    assert wrong == [], "imports up the layer list or sideways (support/layers.py):\n" + "\n".join(wrong)


DEVELOPMENT_TOOLS = ("simulator", "demo")


def test_the_product_never_imports_its_development_tools() -> None:
    # The product is every name below the composition roots (app); the simulator sits there too,
    # above the gateway, as a tool the roots inject and the product never calls by name.
    product = {name for layer in LAYERS[:LAYER_OF["app"] - 1] for name in layer} - set(DEVELOPMENT_TOOLS)
    wrong = [_describe(arrow) for arrow in IMPORTS if _name_in_layers(arrow.source) in product
             and _name_in_layers(arrow.target) in DEVELOPMENT_TOOLS]

    assert product and "gateway" in product and "simulator" not in product
    assert wrong == [], "product modules importing a development tool:\n" + "\n".join(wrong)


def _package_of(module: str) -> str:
    return module if (PACKAGE.parent / module.replace(".", "/")).is_dir() else module.rpartition(".")[0]


def _forms_cycles(arrow: Import) -> bool:
    """Whether an arrow belongs to the graph cycles are looked for in: every import that runs when
    its module is imported, and every lazy one that leaves the importer's package. A lazy import
    of a module inside the importer's own package is a factory choosing its backend (STYLE.md 2:
    `Queue.from_url` imports the backend it names): it runs only when called, after both modules
    are loaded, and the backend importing its base for the contract is the arrow that matters."""
    return not arrow.lazy or not arrow.target.startswith(_package_of(arrow.source) + ".")


def test_no_module_is_part_of_an_import_cycle() -> None:
    graph = nx.DiGraph([(arrow.source, arrow.target) for arrow in IMPORTS if _forms_cycles(arrow)])
    cycles = [frozenset(c) for c in nx.strongly_connected_components(graph) if len(c) > 1]

    def arrows_in(cycle: frozenset[str]) -> str:
        inside = [arrow for arrow in IMPORTS
                  if _forms_cycles(arrow) and arrow.source in cycle and arrow.target in cycle]
        return "\n".join(f"  {arrow.where(PACKAGE)}: {arrow.source} imports {arrow.target}"
                         for arrow in inside)

    assert cycles == [], "import cycles:\n" + "\n".join(f"{sorted(c)}\n{arrows_in(c)}" for c in cycles)


def test_an_import_under_type_checking_or_inside_a_function_is_read_as_such(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("from pkg.low import x\n")
    (package / "low.py").write_text("x = 1\n")
    (package / "typed.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    import pkg.high\nelse:\n    import pkg.low\n"
    )
    (package / "lazy.py").write_text("def f():\n    from .sub import leaf\n")
    (package / "sub" / "__init__.py").write_text("from . import leaf\n")
    (package / "sub" / "leaf.py").write_text("from pkg import low\n")
    (package / "high.py").write_text("")

    arrows = {(arrow.source, arrow.target) for arrow in runtime_imports(package)}

    assert arrows == {
        ("pkg", "pkg.low"),
        ("pkg.typed", "pkg.low"),  # the `else:` of `if TYPE_CHECKING:` runs
        ("pkg.lazy", "pkg.sub.leaf"),
        ("pkg.lazy", "pkg.sub"),  # importing pkg.sub.leaf runs pkg/sub/__init__.py
        ("pkg.sub", "pkg.sub.leaf"),  # the re-export, and no arrow back from leaf to its package
        ("pkg.sub.leaf", "pkg.low"),
    }


def test_a_lazy_import_of_a_backend_in_its_own_package_forms_no_cycle_and_others_do() -> None:
    def arrow(source: str, target: str, *, lazy: bool) -> Import:
        return Import(source, target, PACKAGE / "x.py", 1, lazy=lazy)

    assert not _forms_cycles(arrow("tidegate.queue.base", "tidegate.queue.redis", lazy=True))
    assert not _forms_cycles(arrow("tidegate.sync.verify", "tidegate.sync.sources.sqlite.verify", lazy=True))
    assert _forms_cycles(arrow("tidegate.queue.base", "tidegate.queue.redis", lazy=False))
    assert _forms_cycles(arrow("tidegate.sync.verify", "tidegate.app.sync", lazy=True))


def test_an_arrow_up_is_wrong_and_one_down_or_between_core_modules_is_not() -> None:
    def arrow(source: str, target: str) -> Import:
        return Import(source, target, PACKAGE / "x.py", 1)

    assert _is_wrong(arrow("tidegate.queue.base", "tidegate.gateway.app"))
    assert _is_wrong(arrow("tidegate.errors", "tidegate.queue"))
    assert not _is_wrong(arrow("tidegate.gateway.app", "tidegate.queue.base"))
    assert not _is_wrong(arrow("tidegate.costs", "tidegate.config"))  # two modules of the core
    assert not _is_wrong(arrow("tidegate.sync.pipeline", "tidegate.sync.buses.base"))


def _layout_layers(readme: str) -> list[tuple[int, list[str]]]:
    """The rows of the layer table in README.md's Layout section: each number with its names.

    A row is a number, then names (`errors.py`, `queue/`), then free text; a line that starts
    with a name goes on with the row above it."""
    assert "\n## Layout\n" in readme, "README.md has no Layout section"
    section = readme.split("\n## Layout\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```text\n(.*?)```", section, flags=re.DOTALL)
    tables = [block for block in blocks if block.lstrip().startswith("layer")]
    assert len(tables) == 1, "README.md's Layout section needs one ```text block that starts with `layer`"
    rows: list[tuple[int, list[str]]] = []
    for line in tables[0].splitlines()[1:]:
        words = line.split()
        if words and words[0].isdigit():
            rows.append((int(words.pop(0)), []))
        names = itertools.takewhile(lambda word: word.endswith((".py", "/")), words)
        if rows:
            rows[-1][1].extend(name.removesuffix(".py").removesuffix("/") for name in names)
    return rows


def test_the_readme_draws_the_layers_in_order() -> None:
    rows = _layout_layers((ROOT / "README.md").read_text())

    assert sorted(rows) == [(number, list(layer)) for number, layer in enumerate(LAYERS, start=1)]
