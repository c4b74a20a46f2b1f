"""The dispatch benchmark's load generator and its observers.

- `VirtualUsers`: an open-loop arrival process. Each virtual user sends requests at exponential
  intervals (a Poisson process of rate total/users); together they form a Poisson process at the
  phase's total rate. A request is one enqueued AI chat job. Arrival times are drawn in advance
  from the user's own seeded generator, never from when the previous request returned, so a slow
  queue does not slow the load down (no coordinated omission); how late each enqueue started is
  recorded instead.
- `DepthSampler`: `queue.stats()` once a second, for the depth-over-time table.
- `LoopLag`: how late the shared event loop wakes a 50 ms sleep — the CPU contention every
  figure of an in-process run carries.
"""

from __future__ import annotations

import asyncio
import bisect
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from bench.dispatch_scenario import FIFO_LEVEL, PRIORITIES, Phase, Scenario
from tidegate import Priority, Queue, QueueStats

LAG_PROBE_S = 0.05
SAMPLE_EVERY_S = 1.0


@dataclass(frozen=True, slots=True)
class Clock:
    """One run's time base: load-relative seconds on the loop's monotonic clock, mapped to the
    wall clock the queue stamps jobs with (created_at, finished_at)."""

    mono_start: float
    wall_start: float

    @classmethod
    def starting_in(cls, delay_s: float) -> Clock:
        """A clock whose zero is `delay_s` from now (so every user task is waiting at zero)."""
        mono = asyncio.get_running_loop().time()
        return cls(mono_start=mono + delay_s, wall_start=time.time() + delay_s)

    def now(self) -> float:
        """Seconds since the load started (negative before)."""
        return asyncio.get_running_loop().time() - self.mono_start

    def wall(self, relative_s: float) -> float:
        """Load-relative seconds → epoch seconds."""
        return self.wall_start + relative_s

    def relative(self, wall_s: float) -> float:
        """Epoch seconds → load-relative seconds."""
        return wall_s - self.wall_start


@dataclass(frozen=True, slots=True)
class Arrival:
    """One request as the load generator sent it. `priority` is the class the request belongs
    to; `level` is the priority it was enqueued at (FIFO_LEVEL for every request in a FIFO run)."""

    job_id: str
    priority: Priority
    level: Priority
    tenant: str
    phase: str
    scheduled_s: float  # load-relative time the arrival process drew
    lag_s: float  # how late the enqueue call started


@dataclass(slots=True)
class VirtualUsers:
    """`scenario.users` users sending requests through `queue` during `scenario.phases()`."""

    scenario: Scenario
    queue: Queue
    clock: Clock
    fifo: bool = False
    arrivals: list[Arrival] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)  # enqueue errors, reported as lost requests

    async def run(self) -> None:
        """Send every user's requests; returns when the last phase ends."""
        async with asyncio.TaskGroup() as group:
            for user in range(self.scenario.users):
                group.create_task(self._user(user))

    async def _user(self, user: int) -> None:
        scenario = self.scenario
        phases = scenario.phases()
        # A generator per user, seeded by run seed and user: the same arrivals in every run and
        # in both modes, whatever order the loop happens to run the users in.
        rng = random.Random(f"{scenario.seed}:{user}")
        tenant = f"tenant-{user % scenario.tenants:02d}"
        classes = list(scenario.mix)
        cumulative = _cumulative([scenario.mix[p] for p in classes])
        at_s, n = 0.0, 0
        while True:
            at_s, phase = _next_arrival(rng, at_s, phases, scenario.users)
            if phase is None:
                return
            priority = classes[min(bisect.bisect_right(cumulative, rng.random()), len(classes) - 1)]
            delay = at_s - self.clock.now()
            if delay > 0:
                await asyncio.sleep(delay)
            await self._send(user, n, tenant, priority, phase.name, at_s)
            n += 1

    async def _send(self, user: int, n: int, tenant: str, priority: Priority, phase: str,
                    at_s: float) -> None:
        level = FIFO_LEVEL if self.fifo else priority
        lag_s = max(self.clock.now() - at_s, 0.0)
        try:
            job_id = await self.queue.enqueue(
                self.scenario.chat_payload(user, n), priority=level, tenant=tenant
            )
        except Exception as exc:  # a refused or failed enqueue is a lost request: count it, go on
            self.failures.append(f"{type(exc).__name__}: {exc}")
            return
        self.arrivals.append(Arrival(job_id, priority, level, tenant, phase, at_s, lag_s))


def _cumulative(weights: Sequence[float]) -> list[float]:
    total, out = 0.0, []
    for weight in weights:
        total += weight
        out.append(total)
    return out


def _next_arrival(rng: random.Random, at_s: float, phases: Sequence[Phase],
                  users: int) -> tuple[float, Phase | None]:
    """The user's next arrival after `at_s` under piecewise-constant rates. A draw that crosses
    into the next phase restarts at the boundary with that phase's rate: exact for a Poisson
    process, which has no memory."""
    for phase in phases:
        if at_s >= phase.end_s:
            continue
        at_s = max(at_s, phase.start_s)
        gap = rng.expovariate(phase.rate_per_s / users)
        if at_s + gap < phase.end_s:
            return at_s + gap, phase
        at_s = phase.end_s
    return at_s, None


@dataclass(frozen=True, slots=True)
class DepthSample:
    """The queue at one moment: waiting jobs per level, parked (delayed) and leased jobs."""

    at_s: float
    depth: dict[Priority, int]
    delayed: int
    in_flight: int


@dataclass(slots=True)
class DepthSampler:
    """Samples `queue.stats()` every SAMPLE_EVERY_S until stopped."""

    queue: Queue
    clock: Clock
    samples: list[DepthSample] = field(default_factory=list)

    async def run(self) -> None:
        """Sample until cancelled, on a fixed grid so a slow `stats()` does not drift it."""
        tick = 0
        while True:
            stats: QueueStats = await self.queue.stats()
            self.samples.append(DepthSample(
                at_s=self.clock.now(),
                depth={p: stats.levels[p].depth for p in PRIORITIES},
                delayed=stats.delayed,
                in_flight=stats.in_flight,
            ))
            tick += 1
            await asyncio.sleep(max(tick * SAMPLE_EVERY_S - self.clock.now(), 0.0))


@dataclass(slots=True)
class LoopLag:
    """How late the event loop runs a timer: a probe sleeps LAG_PROBE_S and records the excess."""

    clock: Clock
    lags: list[tuple[float, float]] = field(default_factory=list)  # (load-relative time, lag s)

    async def run(self) -> None:
        """Probe until cancelled."""
        loop = asyncio.get_running_loop()
        while True:
            before = loop.time()
            await asyncio.sleep(LAG_PROBE_S)
            self.lags.append((self.clock.now(), max(loop.time() - before - LAG_PROBE_S, 0.0)))
