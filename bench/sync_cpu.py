"""CPU time of the change-flow benchmark's processes, per named process tree, and of the rest
of the machine; and how late the machine lets a sleeping thread run.

A tree's time is that of its root and every live descendant, each with the time of the children
it has already reaped: PostgreSQL's backends come and go (a writer's connection ends before the
reading is taken), and the postmaster's reaped-children time keeps what they used.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from bench.common import percentile
from bench.gateway_procs import tree_pids
from bench.machine import _machine_busy_s

_TICKS_PER_S = os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()  # the fields after the command name
    except OSError:
        return None


def process_cpu_s(pid: int) -> float:
    """utime + stime of one process, without its children."""
    fields = _stat(pid)
    return (int(fields[11]) + int(fields[12])) / _TICKS_PER_S if fields else 0.0


def tree_cpu_s(pid: int) -> float:
    """utime + stime + reaped children's time of `pid` and of every live process below it."""
    total = 0.0
    for member in tree_pids(pid):
        fields = _stat(member)
        if fields is not None:
            total += sum(int(value) for value in fields[11:15]) / _TICKS_PER_S
    return total


def _own_s() -> float:
    times = os.times()
    return times.user + times.system + times.children_user + times.children_system


@dataclass(slots=True)
class CpuWatch:
    """CPU of named process trees (and of single processes) between `start()` and `stop()`,
    and what the rest of the machine used meanwhile: all busy time minus this process, its
    reaped children (writers, pg_recvlogical) and the named trees."""

    trees: Mapping[str, int]
    singles: Mapping[str, int] = field(default_factory=dict)  # inside a tree: not in `other`
    _before: dict[str, float] = field(default_factory=dict)

    def _read(self) -> dict[str, float]:
        reading = {name: tree_cpu_s(pid) for name, pid in self.trees.items()}
        reading.update({name: process_cpu_s(pid) for name, pid in self.singles.items()})
        reading["_busy"], reading["_own"] = _machine_busy_s(), _own_s()
        return reading

    def start(self) -> None:
        """Take the first reading."""
        self._before = self._read()

    def stop(self) -> dict[str, float]:
        """Core-seconds per name since `start()`, with `other` for the rest of the machine and
        `bench` for this process and its reaped children."""
        after = self._read()
        used = {name: max(after[name] - self._before.get(name, 0.0), 0.0) for name in after}
        busy, own = used.pop("_busy"), used.pop("_own")
        trees = sum(used[name] for name in self.trees)
        used["bench"] = own
        used["other"] = max(busy - own - trees, 0.0)
        return used


class SleeperProbe:
    """How late the machine lets a process run: a thread that sleeps `interval_s` over and over
    and records by how much each wake-up comes late. Every process of the benchmark (writer,
    WAL sender, pipeline) waits for the same scheduler, so this is the stall the rest of the
    machine imposes on them, measured beside them."""

    def __init__(self, interval_s: float = 0.001) -> None:
        self.interval_s = interval_s
        self.late_s: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sleeper-probe", daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            before = time.perf_counter()
            time.sleep(self.interval_s)
            self.late_s.append(max(time.perf_counter() - before - self.interval_s, 0.0))

    def start(self) -> None:
        """Start sleeping."""
        self._thread.start()

    def stop(self) -> dict[str, float]:
        """Stop; the p99 and the largest lateness in milliseconds."""
        self._stop.set()
        self._thread.join()
        if not self.late_s:
            return {}
        return {"p99_ms": percentile(self.late_s, 0.99), "max_ms": max(self.late_s) * 1000}
