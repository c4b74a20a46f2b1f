"""`tidegate.testing` is the one way tools outside the package reach past `from tidegate import …`:
bench/ imports nothing else of tidegate, and each name of the surface says where it lives and why
it is there, reads as the object at that home, and is imported only when read.
"""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

import tidegate
import tidegate.testing

ROOT = Path(__file__).resolve().parents[1]
SURFACES = {"tidegate", "tidegate.testing"}


def _tidegate_imports(path: Path) -> list[tuple[int, str, str | None]]:
    """Each import of tidegate in a file, wherever it stands: (line, module, name or None)."""
    found: list[tuple[int, str, str | None]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name, None) for alias in node.names
                      if alias.name.split(".")[0] == "tidegate"]
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "tidegate":
            found += [(node.lineno, node.module, alias.name) for alias in node.names]
    return found


def test_bench_imports_tidegate_and_tidegate_testing_only() -> None:
    beyond = []
    for path in sorted((ROOT / "bench").rglob("*.py")):
        for line, module, name in _tidegate_imports(path):
            public = module in SURFACES and (module != "tidegate" or name in (None, *tidegate.__all__))
            if not public:
                what = f"{module} import {name}" if name else module
                beyond.append(f"{path.relative_to(ROOT)}:{line}: {what}")

    assert beyond == [], "bench/ reaches past tidegate and tidegate.testing:\n" + "\n".join(beyond)


def test_the_check_sees_lazy_and_aliased_imports(tmp_path: Path) -> None:
    source = tmp_path / "tool.py"
    source.write_text("import tidegate.queue.base as base\n\n\n"
                      "def f():\n    from tidegate._redis import lua_source\n")

    found = _tidegate_imports(source)

    assert found == [(1, "tidegate.queue.base", None), (5, "tidegate._redis", "lua_source")]


def test_every_name_has_a_home_and_a_one_line_reason() -> None:
    surface = tidegate.testing.SURFACE

    assert sorted(tidegate.testing.__all__) == sorted([*surface, "SURFACE"])
    for name, (home, reason) in surface.items():
        assert home.startswith("tidegate.") and home.split(":")[0] not in SURFACES, name
        assert reason and "\n" not in reason and len(reason) <= 80, name


@pytest.mark.parametrize("name", sorted(tidegate.testing.SURFACE))
def test_a_name_reads_as_the_object_at_its_home(name: str) -> None:
    module_name, _, attribute = tidegate.testing.SURFACE[name][0].partition(":")
    module = importlib.import_module(module_name)

    assert getattr(tidegate.testing, name) is (getattr(module, attribute) if attribute else module)


def test_mypy_reads_each_name_from_its_home() -> None:
    """The imports under `if TYPE_CHECKING:` (what mypy checks tools against) are the homes the
    names are read from at run time, one for one."""
    tree = ast.parse(Path(tidegate.testing.__file__).read_text())
    block = next(node for node in tree.body if isinstance(node, ast.If)
                 and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING")
    typed = {alias.asname or alias.name: f"{node.module}:{alias.name}"
             for node in block.body if isinstance(node, ast.ImportFrom) for alias in node.names}
    homes = {name: home if ":" in home else "{}:{}".format(*home.rsplit(".", 1))
             for name, (home, _reason) in tidegate.testing.SURFACE.items()}

    assert typed == homes


def test_a_name_is_imported_only_when_read() -> None:
    """A tool's process holds the parts it uses, as the product's own process would."""
    code = ("import sys\nfrom tidegate.testing import Simulator\n"
            "print(sorted(m for m in ('tidegate.app.up', 'tidegate.gateway.app', 'tidegate.sync.verify',"
            " 'tidegate._otel') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)

    assert done.stdout.strip() == "[]"


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'Nothing'"):
        _ = tidegate.testing.Nothing  # type: ignore[attr-defined]
