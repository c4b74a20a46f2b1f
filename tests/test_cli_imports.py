"""Starting the command line stays cheap: `tidegate --help` and the light commands load neither
the web stack, numpy, the HTTP client, the demo nor the composition roots, which only the
commands that run them import."""

from __future__ import annotations

import subprocess
import sys

import pytest

HEAVY = ("fastapi", "starlette", "uvicorn", "numpy", "aiohttp", "tidegate.demo", "tidegate.app",
         "tidegate.gateway")

# Prints the heavy modules loaded after running what it is given, one per line.
_PROBE = """
import sys
{body}
heavy = {heavy!r}
print("\\n".join(sorted(m for m in sys.modules if any(m == h or m.startswith(h + ".") for h in heavy))))
"""


def _heavy_modules_after(body: str) -> list[str]:
    done = subprocess.run([sys.executable, "-c", _PROBE.format(body=body, heavy=HEAVY)],
                          capture_output=True, text=True, timeout=60, check=True)
    return done.stdout.split()


def test_importing_the_command_line_loads_no_heavy_module() -> None:
    assert _heavy_modules_after("import tidegate.cli.main") == []


@pytest.mark.parametrize("args", [["--help"], ["--version"], ["queue", "--help"], ["worker", "--help"],
                                  ["up", "--help"], ["sync", "status", "--help"]])
def test_help_loads_no_heavy_module(args: list[str]) -> None:
    # The help text goes elsewhere: stdout carries the probe's answer.
    body = f"""
import contextlib, io
from tidegate.cli.main import app
with contextlib.redirect_stdout(io.StringIO()):
    try:
        app({args!r}, prog_name="tidegate")
    except SystemExit as exit:
        assert exit.code == 0, exit.code
"""
    assert _heavy_modules_after(body) == []


def test_tidegate_help_exits_0() -> None:
    done = subprocess.run([sys.executable, "-m", "tidegate", "--help"], capture_output=True, text=True,
                          timeout=60)

    assert done.returncode == 0, done.stderr
    assert "Usage:" in done.stdout
    for group in ("queue", "tenants", "keys", "sync", "worker", "gateway", "up", "demo"):
        assert group in done.stdout
