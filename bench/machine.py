"""How busy the rest of the machine was while the benchmark ran.

The benchmark shares its cores with whatever else runs (a test suite, another build). The load
average cannot tell that apart from the benchmark's own processes, so this counts CPU time
instead: all busy time of the machine (from /proc/stat, VM steal included) minus the time of
this process, its finished children (RQ workers) and the private redis-server.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass

_TICKS_PER_S = os.sysconf("SC_CLK_TCK")


def _machine_busy_s() -> float:
    with open("/proc/stat") as stat:
        fields = [int(value) for value in stat.readline().split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (fields + [0] * 8)[:8]
    return (user + nice + system + irq + softirq + steal) / _TICKS_PER_S


def _process_s(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            # Fields after the parenthesised command name; utime and stime are the 12th and 13th.
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _TICKS_PER_S


def _own_s(pids: Sequence[int]) -> float:
    times = os.times()
    own = times.user + times.system + times.children_user + times.children_system
    return own + sum(_process_s(pid) for pid in pids)


@dataclass(slots=True)
class CpuMeter:
    """CPU used by other processes between `start()` and `stop()`, in core-seconds."""

    pids: Sequence[int] = ()  # long-lived helpers of ours that are not yet waited for
    _busy: float = 0.0
    _own: float = 0.0
    _wall: float = 0.0
    other_s: float = 0.0
    wall_s: float = 0.0

    def start(self) -> None:
        """Take the first reading."""
        self._busy, self._own, self._wall = _machine_busy_s(), _own_s(self.pids), time.monotonic()

    def stop(self) -> None:
        """Take the second reading; `other_s` is what the rest of the machine used in between."""
        busy, own = _machine_busy_s() - self._busy, _own_s(self.pids) - self._own
        self.wall_s = time.monotonic() - self._wall
        self.other_s = max(busy - own, 0.0)

    @property
    def share_pct(self) -> float:
        """Other processes' CPU as a percentage of one core over the measured interval."""
        return 100 * self.other_s / self.wall_s if self.wall_s else 0.0

    def describe(self) -> str:
        """`12.3 core-s in 160.2 s (8 % of one core)`."""
        return f"{self.other_s:.1f} core-s in {self.wall_s:.1f} s ({self.share_pct:.0f} % of one core)"
