"""The documentation's code examples run, so they cannot rot.

Every ```python and ```sh / ```bash block in docs/ is executed, in page order, against one real
`tidegate up` (embedded SQLite queue, simulated provider) that a fixture starts in a folder of its
own on a free port. The examples are written for the reader's own `tidegate up`, so two things are
substituted, the way the docs tell the reader to set them:

- `127.0.0.1:8080`, the address `tidegate up` listens on by default, becomes the fixture's;
- the environment variable `TIDEGATE_KEY` holds an admin key (of a tenant made with
  `tidegate tenants put docs --admin` and `tidegate keys create docs`, as the docs show).

Python blocks run with this venv's interpreter and shell blocks with `bash -euo pipefail`, each
in the folder `up` runs in (so `tidegate queue stats` finds its `.tidegate/tidegate.db`) with this
venv's `bin/` first on PATH. curl is given a `.curlrc` (through CURL_HOME) that makes an HTTP
error fail the block, as a Python SDK would raise. A block not meant to run (one that starts a
server, needs Redis or PostgreSQL, or shows a fragment) has `<!-- no-run -->` on the line before
its fence; blocks in other languages (toml, text, console, json…) are never run.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import get_args

import httpx
import pytest
from pydantic import BaseModel

from support.waiting import eventually_sync
from tidegate.config import TidegateConfig
from tidegate.queue.settings import QueueSettings

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
BIN = Path(sys.executable).parent
NO_RUN = "<!-- no-run -->"
DEFAULT_ADDRESS = "127.0.0.1:8080"
# An answer of 400 or more makes curl exit non-zero (22), after printing the body; no progress meter.
CURLRC = "silent\nshow-error\nfail-with-body\n"
RUNNERS = {"python": "python", "py": "python", "sh": "bash", "bash": "bash", "shell": "bash"}
UP_START_TIMEOUT_S = 60.0
EXAMPLE_TIMEOUT_S = 120.0
FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})\s*(?P<lang>[\w+-]*)")


@dataclass(frozen=True, slots=True)
class Example:
    """One fenced code block of a page."""

    page: str  # relative to docs/
    line: int  # of the opening fence, 1-based
    lang: str
    code: str
    runs: bool

    @property
    def name(self) -> str:
        """`page.md:line`, the test's id."""
        return f"{self.page}:{self.line}"


def examples() -> list[Example]:
    """Every fenced block of every page under docs/, in page and line order."""
    found: list[Example] = []
    for path in sorted(DOCS.rglob("*.md")):
        found.extend(_blocks(path.relative_to(DOCS).as_posix(), path.read_text().splitlines()))
    return found


def _blocks(page: str, lines: list[str]) -> Iterator[Example]:
    index = 0
    while index < len(lines):
        opening = FENCE.match(lines[index])
        if opening is None:
            index += 1
            continue
        indent, fence, lang = opening["indent"], opening["fence"], opening["lang"].lower()
        body: list[str] = []
        end = index + 1
        while end < len(lines) and not lines[end].strip().startswith(fence):
            body.append(lines[end].removeprefix(indent))
            end += 1
        previous = next((line.strip() for line in reversed(lines[:index]) if line.strip()), "")
        yield Example(page, index + 1, lang, "\n".join(body) + "\n",
                      runs=lang in RUNNERS and previous != NO_RUN)
        index = end + 1


RUNNABLE = [example for example in examples() if example.runs]


@dataclass(frozen=True, slots=True)
class Up:
    """The `tidegate up` the examples talk to."""

    folder: Path
    address: str  # host:port
    key: str


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    folder = tmp_path_factory.mktemp("docs-up")
    env = _environment(folder)
    log = folder / "up.log"
    with log.open("wb") as out:
        process = subprocess.Popen([str(BIN / "tidegate"), "up", "--port", "0"], cwd=folder, env=env,
                                   stdout=out, stderr=subprocess.STDOUT)
    try:
        address = _wait_for_address(process, log)
        key = _admin_key(folder, env)
        yield Up(folder, address, key)
    finally:
        process.terminate()
        try:
            process.wait(timeout=45)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _environment(folder: Path) -> dict[str, str]:
    """This process's environment without any tidegate setting of the machine's, so the examples
    see `up`'s defaults; the venv's tools first on PATH."""
    env = {name: value for name, value in os.environ.items() if not name.startswith("TIDEGATE_")}
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    env["TIDEGATE_CONFIG"] = str(folder / "tidegate.toml")  # none there: the defaults
    env["NO_COLOR"] = "1"
    return env


def _wait_for_address(process: subprocess.Popen[bytes], log: Path) -> str:
    """The host:port `up` printed, once it answers /healthz there."""
    def answering() -> str | None:
        if process.poll() is not None:
            raise AssertionError(f"tidegate up exited with {process.returncode}:\n{log.read_text()}")
        found = re.search(r"http://(127\.0\.0\.1:\d+)/v1", log.read_text())
        if found:
            with httpx.Client() as http, contextlib.suppress(httpx.TransportError):
                if http.get(f"http://{found[1]}/healthz").status_code == 200:
                    return found[1]
        return None

    address = eventually_sync(answering, "tidegate up answers /healthz", timeout_s=UP_START_TIMEOUT_S,
                              every_s=0.1, describe=lambda _: log.read_text())
    assert address is not None
    return address


def _admin_key(folder: Path, env: dict[str, str]) -> str:
    """A key of a named admin tenant, made as docs/operations/admin-keys.md shows."""
    subprocess.run([str(BIN / "tidegate"), "tenants", "put", "docs", "--admin", "--max-priority", "critical"],
                   cwd=folder, env=env, check=True, capture_output=True)
    made = subprocess.run([str(BIN / "tidegate"), "keys", "create", "docs"],
                          cwd=folder, env=env, check=True, capture_output=True, text=True)
    return made.stdout.strip()


def test_the_docs_have_examples_that_run() -> None:
    pages = {example.page for example in RUNNABLE}
    assert len(RUNNABLE) >= 20, f"only {len(RUNNABLE)} runnable examples in docs/"
    assert {"getting-started/index.md", "api/openai.md", "api/anthropic.md", "api/jobs.md"} <= pages


def test_a_block_marked_no_run_is_not_run() -> None:
    page = ["Text.", "", NO_RUN, "```sh", "tidegate up", "```", "", "```sh", "tidegate queue stats", "```"]
    found = list(_blocks("x.md", page))
    assert [(block.line, block.runs) for block in found] == [(4, False), (8, True)]


def _hook(name: str) -> ModuleType:
    """A module of docs/hooks/, imported as MkDocs imports it (by path)."""
    spec = importlib.util.spec_from_file_location(f"docs_hook_{name}", DOCS / "hooks" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # as MkDocs does: its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _variables(model: type[BaseModel], prefix: str) -> Iterator[str]:
    """The environment variable of every setting a section (not an array of tables) holds."""
    for name, field in model.model_fields.items():
        variable = f"{prefix}{name.upper()}"
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            yield from _variables(annotation, variable + "__")
        elif not any(isinstance(arg, type) and issubclass(arg, BaseModel) for arg in get_args(annotation)):
            yield variable  # (an array of tables is set in the file, and listed without variables)


def test_the_configuration_reference_lists_every_setting_with_its_variable() -> None:
    page = _hook("config_reference").render()

    variables = list(_variables(TidegateConfig, "TIDEGATE_"))
    missing = [variable for variable in variables if f"`{variable}`" not in page]
    assert "`TIDEGATE_GATEWAY__PORT`" in page and "`TIDEGATE_SYNC__PIPELINE__BATCH_SIZE`" in page
    assert missing == []
    assert all(f"| `{name}` |" in page for name in QueueSettings.model_fields)  # the queue URL's options


@pytest.mark.parametrize("example", RUNNABLE, ids=[example.name for example in RUNNABLE])
def test_example_runs(example: Example, up: Up, tmp_path: Path) -> None:
    code = example.code.replace(DEFAULT_ADDRESS, up.address)
    script = tmp_path / ("example.py" if RUNNERS[example.lang] == "python" else "example.sh")
    script.write_text(code)
    command = [sys.executable, str(script)] if RUNNERS[example.lang] == "python" else \
        ["bash", "-euo", "pipefail", str(script)]
    curl_home = tmp_path / "curl"
    curl_home.mkdir()
    (curl_home / ".curlrc").write_text(CURLRC)
    env = {**_environment(up.folder), "TIDEGATE_KEY": up.key, "CURL_HOME": str(curl_home)}
    done = subprocess.run(command, cwd=up.folder, env=env, capture_output=True, text=True,
                          timeout=EXAMPLE_TIMEOUT_S)
    assert done.returncode == 0, (
        f"{example.name} exited {done.returncode}\n--- code\n{code}\n--- stdout\n{done.stdout}\n"
        f"--- stderr\n{done.stderr}")
