"""What every benchmark part shares: the result record, percentiles, the command line of a run,
and the one error."""

from __future__ import annotations

import shlex
import sys
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

SINGLE = "single"
BATCHED = "batched"
BATCHED_EACH = "batched/each"  # tidegate only: batched, but each job completed on its own
ROUND_TRIP = "round trip"


def command_line(module: str, argv: Sequence[str]) -> str:
    """The command that reproduces a run, as typed at the repository root (BENCHMARKS.md shows
    it): this interpreter, relative to the current folder when it lives there, with `-m module`."""
    executable = Path(sys.executable)
    try:
        shown = str(executable.relative_to(Path.cwd()))
    except ValueError:
        shown = str(executable)
    return shlex.join([shown, "-m", module, *argv])


class BenchmarkError(RuntimeError):
    """A run that cannot give an honest figure: a job lost, a server missing, a worker dead."""


@dataclass(frozen=True, slots=True)
class Result:
    """One measured run of one system on one path.

    `jobs` counts units of work that were verified done (jobs, or items/round trips for the raw
    Redis rows); `seconds` is the wall time from the first enqueue to the last completion.
    """

    system: str
    path: str
    jobs: int
    seconds: float
    p50_ms: float | None = None
    p99_ms: float | None = None
    # Set on a summary of several rounds: the lowest and highest rate among them.
    spread: tuple[float, float] | None = None

    @property
    def rate(self) -> float:
        """Units per second."""
        return self.jobs / self.seconds if self.seconds > 0 else float("inf")


def percentile(samples_s: Sequence[float], fraction: float) -> float:
    """The `fraction` quantile (0..1) of durations in seconds, returned in milliseconds.

    Nearest-rank on the sorted samples: with N=2000 the p99 is the 1980th sample, a real
    observation rather than an interpolation between two.
    """
    if not samples_s:
        raise ValueError("no samples")
    ordered = sorted(samples_s)
    rank = max(1, min(len(ordered), round(fraction * len(ordered) + 0.5)))
    return ordered[rank - 1] * 1000.0


def median_result(results: Sequence[Result]) -> Result:
    """The run with the median rate (the lower one for an even count), carrying the spread of
    all the runs: robust to one slow or lucky round, and always a run that really happened."""
    if not results:
        raise ValueError("no results")
    ordered = sorted(results, key=lambda r: r.rate)
    return replace(ordered[(len(ordered) - 1) // 2], spread=(ordered[0].rate, ordered[-1].rate))


def check_count(system: str, path: str, what: str, expected: int, got: int) -> None:
    """Fail loudly when a system did not do all the work it was given."""
    if got != expected:
        raise BenchmarkError(f"{system} {path}: {what} is {got}, expected {expected}")
