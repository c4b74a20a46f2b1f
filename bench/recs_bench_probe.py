"""How fresh the recommendations are, seen from both ends.

`Recorder` is a change-flow sink placed right after the `RecsSink`: it sees each batch once the
recommender has recorded it, so `time.time() - commit_time` there is the interaction's commit →
recommender-state-updated time (the commit timestamp is PostgreSQL's, on the same host clock).

`Prober` asks the question a shopper would: when does `recommend(user)` first return a list that
reflects what the user just did? It commits interactions of its own users through its own
connection and calls `Recommender.recommend(RecQuery(user, n=10))` until the answer shows them:

- purchase: a probe user (given three views first, so they have a personal list) buys the first
  item of their current list; reflected when that item is no longer in their top 50 (a purchased
  item is never recommended again; a list of 50 so that other users' activity, which reorders the
  top 10 within seconds at 1,000 interactions/s, does not push it out first);
- new user: a user never seen before views a popular item; reflected when the answer is no longer
  a cold start (their list became personal).

The prober calls `recommend` after `poll_s` (then at doubling intervals) and at once when the
recorder reports the row applied: it does not spend the pipeline's CPU polling fast, yet sees the
change as soon as it can show. A probe's freshness is the end of the first call that reflects it
minus the commit time. An answer may show the change before the recorder has seen it: the Redis
store writes the user's state first and the batch's neighbour and trending updates after, and
the prober can run in between; such probes are counted (`before_sink`) and timed all the same.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import random
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg2  # type: ignore[import-untyped]

from tidegate.testing import Recommender, RecQuery, RecResult

PROBE_PREFIX = "probe-"  # users with a history, who buy
FRESH_PREFIX = "fresh-"  # users never seen before their one view
PREPARE_VIEWS = 3
PROBE_TIMEOUT_S = 10.0
# A purchase probe watches the top 50, not 10: the bought item (the first) leaves it by being
# excluded, hardly ever by other users' activity moving it down 50 places meanwhile.
PURCHASE_LIST = 50
MAX_POLL_S = 0.5
INSERT = ("INSERT INTO interactions (user_id, product_id, kind, quantity, created_at) "
          "VALUES (%s, %s, %s, 1, now() AT TIME ZONE 'UTC') RETURNING id")


@dataclass(slots=True)
class Applied:
    """A probe row as the recorder saw it."""

    commit_s: float
    applied_s: float


@dataclass(slots=True)
class Recorder:
    """A sink after the RecsSink: commit → recommender updated for each streamed interaction of
    the current window; snapshot rows counted per table; probe rows reported to the prober."""

    name: str = "bench-recs-recorder"
    snapshot: dict[str, int] = field(default_factory=dict)
    streamed: int = 0  # streamed interactions applied since the start
    latencies_s: list[float] = field(default_factory=list)  # this window's
    last_applied_s: float = 0.0
    probes: dict[str, Applied] = field(default_factory=dict)  # row id -> when
    _waiters: dict[str, asyncio.Event] = field(default_factory=dict)

    async def apply(self, results: Sequence[Any]) -> None:
        """Record the batch (the Sink contract)."""
        now = time.time()
        for result in results:
            change = result.change
            if change.xid is None:
                self.snapshot[change.entity_type] = self.snapshot.get(change.entity_type, 0) + 1
                continue
            if change.entity_type != "interactions":
                continue
            commit_s = change.commit_time.timestamp()
            self.latencies_s.append(now - commit_s)
            self.streamed += 1
            user = str((change.after or {}).get("user_id", ""))
            if user.startswith((PROBE_PREFIX, FRESH_PREFIX)):
                self.probes[change.entity_id] = Applied(commit_s, now)
                self.waiter(change.entity_id).set()
        self.last_applied_s = now

    def waiter(self, row_id: str) -> asyncio.Event:
        """Set once the probe row `row_id` is applied."""
        return self._waiters.setdefault(row_id, asyncio.Event())

    def forget(self, row_id: str) -> None:
        """Drop a finished probe's waiter."""
        self._waiters.pop(row_id, None)

    def new_window(self) -> None:
        """Forget the latencies so far."""
        self.latencies_s = []


@dataclass(frozen=True, slots=True)
class ProbeSample:
    """One probe: its kind, commit → reflected in recommend(), commit → applied (the sink side)."""

    kind: str
    reflected_s: float
    applied_s: float


@dataclass(slots=True)
class ProbeReport:
    """Everything the prober saw."""

    samples: list[ProbeSample] = field(default_factory=list)
    calls_s: list[float] = field(default_factory=list)  # each recommend() call's duration
    before_sink: dict[str, int] = field(default_factory=dict)  # per kind: shown before the sink returned
    timeouts: dict[str, int] = field(default_factory=dict)  # per kind: never shown in PROBE_TIMEOUT_S
    skipped: int = 0  # no item to buy, or a "new" user who was not a cold start


class Prober:
    """Commits probe interactions at `rate_per_s` and times when recommend() reflects them."""

    def __init__(self, recommender: Recommender, recorder: Recorder, dsn: str, items: Sequence[str], *,
                 users: int, rate_per_s: float, poll_s: float, seed: int = 3) -> None:
        self.recommender = recommender
        self.recorder = recorder
        self.dsn = dsn
        self.items = list(items)
        self.users = [f"{PROBE_PREFIX}{n}" for n in range(users)]
        self.rate_per_s = rate_per_s
        self.poll_s = poll_s
        self.report = ProbeReport()
        self._random = random.Random(seed)
        self._run_id = uuid.uuid4().hex[:6]
        self._conn: Any = None
        self._busy: set[str] = set()  # probe users with a probe in flight
        self._fresh = 0  # new users made so far

    async def __aenter__(self) -> Prober:
        self._conn = await asyncio.to_thread(psycopg2.connect, self.dsn)
        self._conn.autocommit = True
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await asyncio.to_thread(self._conn.close)

    def _insert(self, user: str, item: str, kind: str) -> str:
        with self._conn.cursor() as cur:
            cur.execute(INSERT, (user, item, kind))
            return str(cur.fetchone()[0])

    async def prepare(self, timeout_s: float) -> None:
        """Give every probe user a few views, and wait until the recommender has them."""
        rows = []
        for user in self.users:
            for item in self._random.sample(self.items, PREPARE_VIEWS):
                rows.append(await asyncio.to_thread(self._insert, user, item, "view"))
        async with asyncio.timeout(timeout_s):
            for row in rows:
                await self.recorder.waiter(row).wait()
                self.recorder.forget(row)

    async def run(self, stop: asyncio.Event) -> None:
        """Start a probe every 1 / rate seconds, alternating the kinds, until `stop`."""
        tasks: set[asyncio.Task[None]] = set()
        users = itertools.cycle(self.users)
        start = time.monotonic()
        for number in itertools.count():
            due = start + number / self.rate_per_s
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), max(0.0, due - time.monotonic()))
            if stop.is_set():
                break
            task = asyncio.create_task(self._purchase(next(users)) if number % 2 == 0 else self._new_user())
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        await asyncio.gather(*tasks)

    async def _recommend(self, user: str, n: int = 10) -> RecResult:
        started = time.perf_counter()
        result = await self.recommender.recommend(RecQuery(user, n=n))
        self.report.calls_s.append(time.perf_counter() - started)
        return result

    async def _purchase(self, user: str) -> None:
        if user in self._busy:  # the previous probe of this user is still waiting
            self.report.skipped += 1
            return
        self._busy.add(user)
        try:
            before = await self._recommend(user, PURCHASE_LIST)
            if not before.items:
                self.report.skipped += 1
                return
            item = before.items[0].item_id
            row = await asyncio.to_thread(self._insert, user, item, "purchase")
            await self._until_reflected("purchase", user, row,
                                        lambda result: all(r.item_id != item for r in result.items),
                                        PURCHASE_LIST)
        finally:
            self._busy.discard(user)

    async def _new_user(self) -> None:
        self._fresh += 1
        user = f"{FRESH_PREFIX}{self._run_id}-{self._fresh}"
        if not (await self._recommend(user)).cold_start:
            self.report.skipped += 1
            return
        row = await asyncio.to_thread(self._insert, user, self._random.choice(self.items), "view")
        await self._until_reflected("new user", user, row, lambda result: not result.cold_start)

    async def _until_reflected(self, kind: str, user: str, row: str,
                               reflects: Callable[[RecResult], bool], n: int = 10) -> None:
        applied = self.recorder.waiter(row)
        deadline = time.monotonic() + PROBE_TIMEOUT_S
        poll_s = self.poll_s
        try:
            while time.monotonic() < deadline:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(applied.wait(), poll_s)
                # A change that takes long to arrive is looked for less often: polling a
                # lagging recommender must not take the CPU it needs to catch up.
                poll_s = min(2 * poll_s, MAX_POLL_S)
                result = await self._recommend(user, n)
                if reflects(result):
                    await self._sample(kind, row, time.time(), deadline)
                    return
                if applied.is_set():
                    await asyncio.sleep(0.001)  # applied but not shown yet: look again shortly
            self.report.timeouts[kind] = self.report.timeouts.get(kind, 0) + 1
        finally:
            self.recorder.forget(row)

    async def _sample(self, kind: str, row: str, reflected_s: float, deadline: float) -> None:
        """Record a probe shown at `reflected_s`, once the recorder has the row's commit time."""
        if row not in self.recorder.probes:
            # Shown before the sink returned (a store that writes the user's state before the
            # batch's other updates): real, and timed once the recorder gives the commit time.
            self.report.before_sink[kind] = self.report.before_sink.get(kind, 0) + 1
            try:
                async with asyncio.timeout(max(deadline - time.monotonic(), 0.0)):
                    await self.recorder.waiter(row).wait()
            except TimeoutError:
                self.report.timeouts[kind] = self.report.timeouts.get(kind, 0) + 1
                return
        seen = self.recorder.probes[row]
        self.report.samples.append(ProbeSample(kind, reflected_s - seen.commit_s,
                                               seen.applied_s - seen.commit_s))
