"""Real `tidegate` processes for the fault tests (support.processes runs them): the source
tree's `python -m tidegate`, in the repository unless told otherwise, and what `tidegate up`
prints when it is ready."""

from __future__ import annotations

import contextlib
import os
import re
from dataclasses import dataclass
from pathlib import Path

from support.processes import PYTHON_M_TIDEGATE, Process

ROOT = Path(__file__).resolve().parents[2]
MARGIN_S = 5.0  # what a stop may take beyond its grace: interpreter exit, closing pools, a busy machine


def tidegate(*args: str, cwd: Path | None = None) -> contextlib.AbstractAsyncContextManager[Process]:
    """`python -m tidegate ARGS...`, killed on leaving the block if it still runs."""
    env = {**os.environ, "COLUMNS": "200", "PYTHONUNBUFFERED": "1"}
    return Process.start(*PYTHON_M_TIDEGATE, *args, cwd=cwd or ROOT, env=env)


def provider_config(folder: Path, base_url: str, extra: str = "") -> Path:
    """A tidegate.toml whose one provider is the simulator at `base_url`."""
    path = folder / "tidegate.toml"
    path.write_text(f"""
[[providers]]
name = "sim"
base_url = "{base_url}"

[[providers.models]]
name = "deepseek-v3.2"
input_usd_per_1m = "0.28"
output_usd_per_1m = "0.42"
max_concurrency = 256
{extra}
""")
    return path


@dataclass
class Up:
    """What a running `tidegate up` printed: where to reach it."""

    api_url: str
    sim_url: str  # the simulator's root (its /_sim/ control endpoints)
    admin_key: str


async def up_ready(up: Process) -> Up:
    """Once `tidegate up` has printed its table: where it listens and its admin key."""
    await up.printed("Press Ctrl-C to stop.", timeout_s=60)
    text = "".join(up.stdout)
    api = re.search(r"API \(OpenAI base_url\)\s+(\S+)", text)
    sim = re.search(r"simulated, (\S+)/v1", text)
    key = re.search(r"^(tg_\S+)$", text, re.MULTILINE)
    assert api and sim and key, text
    return Up(api.group(1), sim.group(1), key.group(1))
