"""The previous release, runnable beside the code under test: its `src/tidegate` taken from git
history into a temporary folder and put first on the PYTHONPATH of subprocesses that use the same
interpreter (and so today's locked dependencies). Its own `tidegate worker`/`gateway` commands and
tests/support/old_release_driver.py run there as the old release's code.

The release is named by its commit, not its tag: CI clones main afresh, where tags may be missing
but the history is whole. A clone without that commit (a shallow one) fails the fixture with a
message saying so; it never skips.
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import tarfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
DRIVER = Path(__file__).resolve().with_name("old_release_driver.py")
PREVIOUS_RELEASE = "bb38afbac33556b7e38b6572880aab54385b3259"  # v0.1.0
COMMAND_TIMEOUT_S = 120.0


class OldReleaseUnavailable(Exception):
    """The previous release's code could not be taken from git or does not import."""


@dataclass(frozen=True)
class OldRelease:
    """The previous release's code in `src` (holding `tidegate/`), run in subprocesses."""

    commit: str
    src: Path

    def env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """The environment of an old-release process: its code first on the path."""
        env = {key: value for key, value in os.environ.items() if not key.startswith("TIDEGATE_")}
        env["PYTHONPATH"] = os.pathsep.join([str(self.src), *filter(None, [env.get("PYTHONPATH")])])
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        return {**env, **(extra or {})}

    def run(self, command: str, args: Mapping[str, Any] | None = None, *,
            timeout_s: float = COMMAND_TIMEOUT_S) -> dict[str, Any]:
        """Run a driver command to its end and return its RESULT."""
        proc = subprocess.run(
            [sys.executable, str(DRIVER), command, json.dumps(args or {})], cwd=self.src.parent,
            env=self.env(), capture_output=True, timeout=timeout_s, check=False)
        if proc.returncode != 0:
            raise AssertionError(f"old release: `{command}` exited with {proc.returncode}\n"
                                 f"--- stderr ---\n{proc.stderr.decode(errors='replace')[-6000:]}")
        return result_of(proc.stdout.decode(), command)

    def start(self, command: str, args: Mapping[str, Any] | None = None) -> subprocess.Popen[str]:
        """Start a driver command that keeps running (its stdout as text lines)."""
        return subprocess.Popen(
            [sys.executable, str(DRIVER), command, json.dumps(args or {})], cwd=self.src.parent,
            env=self.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def cli(self, *argv: str, env: Mapping[str, str] | None = None) -> subprocess.Popen[bytes]:
        """Start `tidegate ARGV…` of the old release (a worker or a gateway), its output piped."""
        return subprocess.Popen([sys.executable, "-m", "tidegate", *argv], cwd=self.src.parent,
                                env=self.env(env), stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def result_of(stdout: str, command: str) -> dict[str, Any]:
    """The RESULT line a driver command printed."""
    for line in stdout.splitlines():
        if line.startswith("RESULT "):
            result: dict[str, Any] = json.loads(line.removeprefix("RESULT "))
            return result
    raise AssertionError(f"old release: `{command}` printed no RESULT line:\n{stdout[-4000:]}")


def extract(folder: Path, commit: str = PREVIOUS_RELEASE) -> OldRelease:
    """`src/tidegate` of `commit` written under `folder`, checked to import from there."""
    try:
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", commit, "src/tidegate"],
                                 capture_output=True, check=False, timeout=60)
    except FileNotFoundError as exc:
        raise OldReleaseUnavailable("git is not on PATH: the upgrade tests take the previous release "
                                    "from git history") from exc
    if archive.returncode != 0:
        raise OldReleaseUnavailable(
            f"`git archive {commit}` failed in {ROOT}: {archive.stderr.decode(errors='replace').strip()}\n"
            "The upgrade tests need the previous release's commit in the history: a shallow clone "
            "lacks it; fetch the whole history (`git fetch --unshallow`).")
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(folder, filter="data")
    old = OldRelease(commit, folder / "src")
    found = old.run("probe")["file"]
    if not Path(found).resolve().is_relative_to(old.src.resolve()):
        raise OldReleaseUnavailable(f"the old release's subprocess imported tidegate from {found}, not from "
                                    f"{old.src}: PYTHONPATH did not take precedence")
    return old


def stop(proc: subprocess.Popen[Any], sig: signal.Signals = signal.SIGTERM, timeout_s: float = 30.0) -> str:
    """Signal a process started here and wait for it; returns its stderr."""
    if proc.poll() is None:
        proc.send_signal(sig)
    try:
        _, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
    return err.decode(errors="replace") if isinstance(err, bytes) else str(err or "")
