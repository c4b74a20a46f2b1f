"""The release as a user gets it: the wheel built from the sdist (as `make dist` builds it), not
the editable install the other tests import.

The wheel holds every file of the package (the dashboard's static files, the Lua scripts,
py.typed), and installed into a fresh venv with the locked dependencies of the `redis` extra it
answers `tidegate --version` and runs `tidegate up` on a Redis of the test's own: the queue, the
coordination stores, the entity cache and the recommender load their Lua scripts from the
installed wheel, the dashboard serves its page and assets from it, a chat completion goes through
the gateway with the official `openai` SDK, and SIGTERM stops it cleanly within its grace.

Building and installing take a few seconds with uv's cache warm; uv is tried offline first, and
asks the index only when its cache does not hold what the lock names.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import pytest
import redis

from support.own_redis import own_redis_server
from support.processes import Process
from tidegate import __version__

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "tidegate"
UV_TIMEOUT_S = 300  # a cold cache downloads the locked wheels
READY_TIMEOUT_S = 60
GRACE_S = 5
MARGIN_S = 10  # what a stop may take beyond its grace on a busy machine


def _uv() -> str:
    """The uv of the test's venv (the dev extra pins it), else one on PATH."""
    beside = Path(sys.executable).parent / "uv"
    found = str(beside) if beside.exists() else shutil.which("uv")
    if found is None:
        pytest.fail("uv is not installed: run `make venv` (the dev extra has it)", pytrace=False)
    return found


def _uv_env(**extra: str) -> dict[str, str]:
    # uv must never fetch a Python: the fresh venv uses the interpreter running the tests.
    env = {name: value for name, value in os.environ.items() if name != "VIRTUAL_ENV"}
    return {**env, "UV_PYTHON_DOWNLOADS": "never", **extra}


def _run_uv(*args: str, env: dict[str, str] | None = None) -> None:
    """`uv ARGS`, offline first (the cache usually holds everything the lock names), then online."""
    failures = []
    for network in (["--offline"], []):
        done = subprocess.run([_uv(), *args, *network], capture_output=True, text=True,
                              timeout=UV_TIMEOUT_S, env=env or _uv_env(), cwd=ROOT)
        if done.returncode == 0:
            return
        failures.append(f"$ uv {' '.join([*args, *network])}\n{done.stdout}{done.stderr}")
    pytest.fail("\n".join(failures), pytrace=False)


def _clean_env(**extra: str) -> dict[str, str]:
    """The environment of the installed commands: no tidegate settings, no path leading back to
    the source tree, nothing of the test's venv."""
    kept = {name: value for name, value in os.environ.items()
            if not name.startswith("TIDEGATE_") and name not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    return {**kept, "COLUMNS": "200", "PYTHONUNBUFFERED": "1", **extra}


@dataclass(frozen=True)
class Built:
    """What one build made: the sdist and the wheel built from it."""

    sdist: Path
    wheel: Path


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    """The sdist and the wheel, built once: the wheel from the sdist, as `python -m build` does, so
    a file the sdist leaves out is missing from the wheel too."""
    out = tmp_path_factory.mktemp("dist")
    _run_uv("build", "--quiet", "--out-dir", str(out), str(ROOT))
    [sdist] = out.glob("tidegate-*.tar.gz")
    [wheel] = out.glob("tidegate-*.whl")
    return Built(sdist, wheel)


@pytest.fixture(scope="module")
def venv(built: Built, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with the locked dependencies of the `redis` extra and the wheel (not
    editable, without dependencies of its own choosing)."""
    folder = tmp_path_factory.mktemp("wheel-venv") / "venv"
    python = str(folder / "bin" / "python")
    _run_uv("venv", "--quiet", "--python", sys.executable, str(folder))
    # uv.lock's exact versions, as `make venv` installs them; the project itself is left out so
    # that the wheel, and not the source tree, provides it.
    _run_uv("sync", "--quiet", "--project", str(ROOT), "--frozen", "--no-install-project", "--no-dev",
            "--extra", "redis", "--python", python, env=_uv_env(UV_PROJECT_ENVIRONMENT=str(folder)))
    _run_uv("pip", "install", "--quiet", "--no-deps", "--python", python, str(built.wheel))
    return folder


def _package_files() -> set[str]:
    """Every file of the source package, as the wheel names it (tidegate/...)."""
    return {path.relative_to(PACKAGE.parent).as_posix() for path in PACKAGE.rglob("*")
            if path.is_file() and "__pycache__" not in path.parts and path.suffix not in (".pyc", ".pyo")}


def test_the_wheel_holds_every_file_of_the_package_and_its_version(built: Built) -> None:
    with zipfile.ZipFile(built.wheel) as wheel:
        names = set(wheel.namelist())
        metadata = wheel.read(f"tidegate-{__version__}.dist-info/METADATA").decode()
        entry_points = wheel.read(f"tidegate-{__version__}.dist-info/entry_points.txt").decode()

    packaged = {name for name in names if not name.startswith(f"tidegate-{__version__}.dist-info/")}
    assert packaged == _package_files()
    for data in ("tidegate/py.typed", "tidegate/gateway/admin/static/dashboard.html",
                 "tidegate/queue/lua/claim.lua", "tidegate/sync/cache/lua/apply.lua"):
        assert data in packaged
    assert built.wheel.name == f"tidegate-{__version__}-py3-none-any.whl"
    assert f"\nVersion: {__version__}\n" in metadata
    assert "\nDescription-Content-Type: text/markdown\n" in metadata
    assert "tidegate = tidegate.cli.main:app" in entry_points


def test_the_sdist_holds_what_a_release_documents(built: Built) -> None:
    import tarfile

    with tarfile.open(built.sdist) as sdist:
        names = set(sdist.getnames())

    top = f"tidegate-{__version__}"
    for name in ("pyproject.toml", "README.md", "CHANGELOG.md", "uv.lock", "src/tidegate/__init__.py",
                 "src/tidegate/gateway/admin/static/dashboard.js"):
        assert f"{top}/{name}" in names


def test_twine_accepts_the_sdist_and_the_wheel(built: Built) -> None:
    # What `make dist` checks before a release is uploaded: the metadata and the README as the
    # package index renders it.
    done = subprocess.run([sys.executable, "-m", "twine", "check", "--strict", built.sdist, built.wheel],
                          capture_output=True, text=True, timeout=120)

    assert done.returncode == 0, done.stdout + done.stderr


def test_the_installed_wheel_says_its_version_and_is_not_the_source_tree(venv: Path, tmp_path: Path) -> None:
    version = subprocess.run([venv / "bin" / "tidegate", "--version"], capture_output=True, text=True,
                             timeout=60, env=_clean_env(), cwd=tmp_path)
    where = subprocess.run([venv / "bin" / "python", "-c", "import tidegate; print(tidegate.__file__)"],
                           capture_output=True, text=True, timeout=60, env=_clean_env(), cwd=tmp_path,
                           check=True)

    assert version.returncode == 0, version.stderr
    assert version.stdout == f"tidegate {__version__}\n"
    location = Path(where.stdout.strip()).resolve()
    assert location.is_relative_to(venv.resolve()), location
    assert not location.is_relative_to(ROOT), location


# ---------------------------------------------------------------------- tidegate up


class Running(Process):
    """A running `tidegate up` and what it printed so far."""

    async def ready(self) -> tuple[str, str, str]:
        """Once `up` has printed its table: its API URL, dashboard URL and admin key."""
        await self.printed("Press Ctrl-C to stop.", timeout_s=READY_TIMEOUT_S)
        text = "".join(self.stdout)
        api = re.search(r"API \(OpenAI base_url\)\s+(\S+)", text)
        dashboard = re.search(r"Dashboard\s+(\S+)", text)
        key = re.search(r"^(tg_\S+)$", text, re.MULTILINE)
        assert api and dashboard and key, text
        return api.group(1), dashboard.group(1), key.group(1)


def _up(venv: Path, folder: Path, env: dict[str, str]) -> contextlib.AbstractAsyncContextManager[Running]:
    """The venv's `tidegate up` on a free loopback port in `folder`; killed on leaving the block
    if it still runs."""
    return Running.start(venv / "bin" / "tidegate", "up", "--host", "127.0.0.1", "--port", "0",
                         "--grace-s", str(GRACE_S), cwd=folder, env=env)


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[str]:
    """A redis-server of this test's own (with a password), so `up`'s default store names meet
    no other test's keys."""
    with own_redis_server(tmp_path) as server:
        yield server.url


async def test_the_installed_wheel_runs_up_on_redis(venv: Path, built: Built, own_redis: str,
                                                    tmp_path: Path) -> None:
    # Given `tidegate up` from the fresh venv, in an empty folder, with its queue and stores, and
    # the change flow's entity cache and recommender, on Redis
    folder = tmp_path / "up"
    folder.mkdir()
    env = _clean_env(TIDEGATE_QUEUE_URL=own_redis, TIDEGATE_SYNC__CACHE_URL=own_redis)
    with zipfile.ZipFile(built.wheel) as wheel:
        packaged_js = wheel.read("tidegate/gateway/admin/static/dashboard.js")
    async with _up(venv, folder, env) as up, httpx.AsyncClient(timeout=30) as http:
        api_url, dashboard_url, admin_key = await up.ready()

        # When the dashboard and one of the assets its page names are fetched, and a chat
        # completion is made through the gateway with the official SDK
        page = await http.get(dashboard_url)
        asset = re.search(r'src="([^"]+\.js)"', page.text)
        assert asset, page.text
        script = await http.get(httpx.URL(dashboard_url).join(asset.group(1)))
        client = openai.AsyncOpenAI(base_url=api_url, api_key=admin_key, max_retries=0)
        answer = await client.chat.completions.with_raw_response.create(
            model="auto", messages=[{"role": "user", "content": "hello"}])
        await client.close()

        # And it is stopped as a service manager stops it
        stopped = time.monotonic()
        up.send(signal.SIGTERM)
        status = await up.exited(GRACE_S + MARGIN_S)
        took_s = time.monotonic() - stopped

    # Then the page and its script are the wheel's files
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "<title>tidegate dashboard</title>" in page.text
    assert script.status_code == 200 and script.content == packaged_js
    # And the call was answered by the simulated provider through the Redis queue
    assert answer.http_response.status_code == 200
    completion = answer.parse()
    assert completion.choices[0].message.content
    assert completion.choices[0].finish_reason == "stop"
    assert completion.usage is not None and completion.usage.completion_tokens > 0
    assert answer.headers["X-Tidegate-Job-Id"]
    # And the Lua scripts the wheel holds ran on that Redis
    with redis.Redis.from_url(own_redis) as server:
        assert int(server.info("memory")["number_of_cached_scripts"]) > 0
        assert server.keys("tidegate:{default}:*")
    # And up exited 0 within its grace, having said so, without a traceback
    assert status == 0, up.output
    assert took_s < GRACE_S + MARGIN_S
    assert "Stopped." in "".join(up.stdout), up.output
    assert "Traceback" not in up.output, up.output
