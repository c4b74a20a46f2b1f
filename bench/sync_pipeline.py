"""The pipeline process of the change-flow benchmark, and its parent-side handle.

The child (`python -m bench.sync_pipeline …`) opens the change flow as `tidegate sync` does
(`tidegate.app.sync.open_sync`: PostgreSQL source, the given bus and cache) with one more sink,
the recorder, and runs it until told to stop, on the loop `tidegate sync` runs on
(`tidegate._eventloop.run`: uvloop, the collector set for a server, the loaded snapshot frozen
out of its reach); `--plain-loop` runs it on asyncio's own loop with Python's default collector
instead, as this benchmark did before. The recorder also times the collector's runs per
generation. It is driven over its stdin and stdout with JSON
lines: the parent sends commands, the child answers each one and, every 0.1 s, reports its
progress (`{"event": "progress", "snapshot": n, "streamed": m}`).

The recorder is the last sink, so it sees a change after the cache applied it: for every
streamed change it records `time.time() - commit_time`, the commit timestamp PostgreSQL wrote
(the same host clock), i.e. the change's commit → cache latency. Snapshot rows (no xid) are
only counted. The bus is wrapped too, to record commit → published (acknowledged by the bus).

Commands: `window` (start a new measurement window), `pause` / `resume` (hold the source's
transactions back, so a backlog builds in the slot while the writer runs; resume takes the
number of changes the backlog holds and times the drain), `report` (the window's figures),
`verify` (the cache against the database, row by row) and `stop`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import gc
import json
import logging
import resource
import sys
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

from bench.common import BenchmarkError, percentile

PROGRESS_INTERVAL_S = 0.1
REQUEST_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0


# ---------------------------------------------------------------------- child side


@dataclass(slots=True)
class Recorder:
    """A sink that times each streamed change from its commit to its arrival here (after the
    cache), within the current window."""

    name: str = "bench-recorder"
    snapshot: int = 0  # snapshot rows applied
    streamed: int = 0  # streamed changes applied, since the start
    window_started: float = 0.0  # wall clock
    window_base: int = 0  # `streamed` when the window started
    latencies_s: list[float] = field(default_factory=list)
    published_s: list[float] = field(default_factory=list)  # commit → publish acknowledged
    applied: list[tuple[float, int]] = field(default_factory=list)  # (wall clock, streamed) per batch
    fetches_s: list[float] = field(default_factory=list)  # bus fetch calls that returned changes
    empty_fetches: int = 0  # bus fetch calls that returned nothing (their wait ran out)
    fetched: int = 0  # deliveries those calls returned
    acks_s: list[float] = field(default_factory=list)  # bus ack calls (Kafka: the offset commit)
    publishes: int = 0  # bus publish calls (Kafka: one record batch per partition each touches)
    target: int | None = None  # changes in the window after which `reached` is set
    reached: float | None = None
    gc_s: list[float] = field(default_factory=lambda: [0.0] * 3)  # collector time per generation
    gc_runs: list[int] = field(default_factory=lambda: [0] * 3)  # its collections per generation
    _gc_started: float = 0.0

    def watch_gc(self) -> None:
        """Time the garbage collector's runs (its callbacks fire at the start and end of each)."""
        gc.callbacks.append(self._on_gc)

    def _on_gc(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._gc_started = time.perf_counter()
        else:
            self.gc_s[info["generation"]] += time.perf_counter() - self._gc_started
            self.gc_runs[info["generation"]] += 1

    async def apply(self, results: Sequence[Any]) -> None:
        """Record the batch (the Sink contract)."""
        now = time.time()
        count = 0
        for result in results:
            change = result.change
            if change.xid is None:
                self.snapshot += 1
                continue
            self.latencies_s.append(now - change.commit_time.timestamp())
            count += 1
        if count:
            self.streamed += count
            self.applied.append((now, self.streamed))
            if self.target is not None and self.reached is None and self.in_window >= self.target:
                self.reached = now

    @property
    def in_window(self) -> int:
        """Streamed changes applied since the window started."""
        return self.streamed - self.window_base

    def new_window(self, target: int | None = None) -> None:
        """Forget the samples so far; count from now."""
        self.window_started, self.window_base = time.time(), self.streamed
        self.latencies_s, self.published_s, self.applied = [], [], []
        self.fetches_s, self.empty_fetches, self.fetched, self.acks_s = [], 0, 0, []
        self.publishes = 0
        self.target, self.reached = target, None
        self.gc_s, self.gc_runs = [0.0] * 3, [0] * 3

    def report(self) -> dict[str, Any]:
        """The window's figures (latencies in ms, times as wall clock)."""
        lat, bus = self.latencies_s, self.published_s
        return {
            "count": len(lat), "window_started": self.window_started,
            "p50_ms": percentile(lat, 0.50) if lat else None,
            "p99_ms": percentile(lat, 0.99) if lat else None,
            "p999_ms": percentile(lat, 0.999) if lat else None,
            "max_ms": max(lat) * 1000 if lat else None,
            "mean_ms": sum(lat) / len(lat) * 1000 if lat else None,
            "bus_p50_ms": percentile(bus, 0.50) if bus else None,
            "bus_p99_ms": percentile(bus, 0.99) if bus else None,
            "bus_mean_ms": sum(bus) / len(bus) * 1000 if bus else None,
            "first_applied": self.applied[0][0] if self.applied else None,
            "last_applied": self.applied[-1][0] if self.applied else None,
            "reached": self.reached, "peak_per_s": self._peak_per_s(),
            "fetch_p50_ms": percentile(self.fetches_s, 0.50) if self.fetches_s else None,
            "fetch_p99_ms": percentile(self.fetches_s, 0.99) if self.fetches_s else None,
            "fetches": len(self.fetches_s), "empty_fetches": self.empty_fetches, "publishes": self.publishes,
            "per_fetch": self.fetched / len(self.fetches_s) if self.fetches_s else None,
            "ack_p50_ms": percentile(self.acks_s, 0.50) if self.acks_s else None,
            "ack_p99_ms": percentile(self.acks_s, 0.99) if self.acks_s else None,
            "cpu_s": _cpu_s(), "gc_s": list(self.gc_s), "gc_runs": list(self.gc_runs),
            "gc_tracked": len(gc.get_objects()),  # objects the collector follows, at the report
        }

    def _peak_per_s(self) -> float | None:
        """The most changes applied within one whole second of the window (by batch times)."""
        if not self.applied:
            return None
        per_second: dict[int, int] = {}
        before = self.window_base
        for at, total in self.applied:
            second = int(at - self.window_started)
            per_second[second] = per_second.get(second, 0) + total - before
            before = total
        return float(max(per_second.values()))


class TimedBus:
    """The pipeline's bus, recording for each streamed change the time from its commit to the
    bus acknowledging its publish (commit → Kafka, as Sequin and Debezium measure it)."""

    def __init__(self, inner: Any, recorder: Recorder) -> None:
        self.inner = inner
        self.recorder = recorder

    async def publish(self, changes: Sequence[Any]) -> None:
        """Publish, then record."""
        await self.inner.publish(changes)
        now = time.time()
        self.recorder.publishes += 1
        self.recorder.published_s.extend(now - change.commit_time.timestamp()
                                         for change in changes if change.xid is not None)

    def subscribe(self, group: str, consumer: str, entity_types: Sequence[str]) -> TimedSubscription:
        """The inner bus's subscription, its fetch and ack calls timed."""
        return TimedSubscription(self.inner.subscribe(group, consumer, entity_types), self.recorder)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class TimedSubscription:
    """The pipeline's subscription, recording how long each fetch call took (those that returned
    changes: from the call until the bus handed them over, which is how long the changes waited
    there once the consumer asked) and each ack (Kafka: the offset commit, on the consumer's path
    before its next fetch)."""

    def __init__(self, inner: Any, recorder: Recorder) -> None:
        self.inner = inner
        self.recorder = recorder

    async def __aenter__(self) -> Self:
        await self.inner.__aenter__()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.inner.__aexit__(*exc_info)

    async def fetch(self, max_count: int, timeout_s: float) -> list[Any]:
        """Fetch, then record."""
        started = time.perf_counter()
        deliveries: list[Any] = await self.inner.fetch(max_count, timeout_s)
        if deliveries:
            self.recorder.fetches_s.append(time.perf_counter() - started)
            self.recorder.fetched += len(deliveries)
        else:
            self.recorder.empty_fetches += 1
        return deliveries

    async def ack(self, deliveries: Sequence[Any]) -> None:
        """Ack, then record."""
        started = time.perf_counter()
        await self.inner.ack(deliveries)
        self.recorder.acks_s.append(time.perf_counter() - started)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class GatedSource:
    """The pipeline's source with a gate in front of its transactions: while closed, the
    pipeline takes nothing more, the source's reader waits with a full queue (still answering
    the server's keepalives) and the backlog stays in the slot."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.gate = asyncio.Event()
        self.gate.set()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        pass

    async def transactions(self) -> AsyncIterator[Any]:
        """The inner source's transactions, each one waiting for an open gate."""
        async for transaction in self.inner.transactions():
            if not self.gate.is_set():
                await self.gate.wait()
            yield transaction

    async def confirm(self, position: int) -> None:
        """Passed through."""
        await self.inner.confirm(position)

    async def confirm_snapshot(self, mark: Any) -> None:
        """Passed through."""
        await self.inner.confirm_snapshot(mark)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)  # status(), for the pipeline's monitor


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _emit(message: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def _database_checksums(dsn: str, table: str) -> dict[str, str]:
    import psycopg2  # type: ignore[import-untyped]

    from tidegate.testing import canonical, checksum

    with contextlib.closing(psycopg2.connect(dsn)) as conn, conn.cursor() as cur:
        cur.execute(f"SELECT * FROM {table}")
        names = [column.name for column in cur.description]
        rows = [dict(zip(names, row, strict=True)) for row in cur.fetchall()]
    return {str(row["id"]): checksum(canonical(row)) for row in rows}


async def _verify(pipeline: Any, dsn: str, table: str) -> dict[str, Any]:
    expected = await asyncio.to_thread(_database_checksums, dsn, table)
    cached = {entry.entity_id: entry.checksum async for entry in pipeline.cache.scan(table)}
    differ = [key for key in expected if cached.get(key) != expected[key]]
    extra = [key for key in cached if key not in expected]
    return {"rows": len(expected), "cached": len(cached), "differ": len(differ), "extra": len(extra),
            "examples": (differ + extra)[:5]}


async def _commands(pipeline: Any, source: GatedSource, recorder: Recorder, dsn: str, table: str,
                    stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while not stop.is_set():
        line = await reader.readline()
        if not line:  # the parent is gone
            stop.set()
            return
        command = json.loads(line)
        name = command["cmd"]
        answer: dict[str, Any] = {}
        if name == "window":
            recorder.new_window()
            answer = {"base": recorder.window_base}
        elif name == "pause":
            source.gate.clear()
        elif name == "resume":
            recorder.new_window(target=int(command["target"]))
            source.gate.set()
            answer = {"base": recorder.window_base}
        elif name == "report":
            answer = recorder.report()
        elif name == "verify":
            answer = await _verify(pipeline, dsn, table)
        elif name == "stop":
            stop.set()
            return  # answered once the pipeline has stopped
        _emit({"reply": name, **answer})


async def _progress(recorder: Recorder) -> None:
    while True:
        _emit({"event": "progress", "snapshot": recorder.snapshot, "streamed": recorder.streamed})
        await asyncio.sleep(PROGRESS_INTERVAL_S)


async def serve(args: argparse.Namespace) -> None:
    """Run the change flow with the recorder until `stop`."""
    from tidegate.testing import SyncConfig, TidegateConfig, open_sync

    sync = SyncConfig(source_url=args.source_url, bus_url=args.bus_url, cache_url=args.cache_url,
                      tables=(args.table,), slot=args.slot, publication=args.publication,
                      prefix=args.prefix, heartbeat_s=None, batch_size=args.batch_size)
    recorder = Recorder()
    recorder.watch_gc()
    stop = asyncio.Event()
    async with open_sync(TidegateConfig.load(sync=sync), sinks=[recorder]) as pipeline:
        source = GatedSource(pipeline.source)
        pipeline.source = source
        pipeline.bus = TimedBus(pipeline.bus, recorder)
        tasks = [asyncio.create_task(_commands(pipeline, source, recorder, args.dsn, args.table, stop)),
                 asyncio.create_task(_progress(recorder))]
        try:
            await pipeline.run(stop)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
    _emit({"reply": "stop", "cpu_s": _cpu_s()})


def main(argv: Sequence[str] | None = None) -> int:
    """The pipeline process."""
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    for name in ("source-url", "bus-url", "cache-url", "slot", "publication", "prefix", "dsn"):
        parser.add_argument(f"--{name}", required=True)
    parser.add_argument("--table", default="products")
    parser.add_argument("--batch-size", type=int, default=500)
    parser.add_argument("--profile", type=Path, help="run under cProfile and write its stats here")
    parser.add_argument("--plain-loop", action="store_true",
                        help="asyncio's own loop and Python's default collector, not tidegate's")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    # As `tidegate sync` runs: uvloop, and the collector set for a server, the loaded snapshot
    # frozen out of its reach (`tidegate._eventloop`).
    from tidegate.testing import run_loop as run

    run_loop: Callable[[Any], Any] = asyncio.run if args.plain_loop else run
    if args.profile is None:
        run_loop(serve(args))
        return 0
    profiler = cProfile.Profile()
    try:
        profiler.runcall(run_loop, serve(args))
    finally:
        profiler.dump_stats(args.profile)
    return 0


# ---------------------------------------------------------------------- parent side


class PipelineProcess:
    """The parent's handle on a running pipeline process."""

    def __init__(self, process: asyncio.subprocess.Process, log_path: Path) -> None:
        self.process = process
        self.log_path = log_path
        self.snapshot = 0
        self.streamed = 0
        self._replies: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._reader = asyncio.create_task(self._read())

    @property
    def pid(self) -> int:
        """The child's process id."""
        return self.process.pid

    @classmethod
    @contextlib.asynccontextmanager
    async def running(cls, argv: Sequence[str], log_path: Path, cwd: Path) -> AsyncIterator[PipelineProcess]:
        """Start the child; stop it (and wait for it) when the block ends."""
        with log_path.open("ab") as log:
            process = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "bench.sync_pipeline", *argv, stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE, stderr=log, cwd=cwd, limit=1 << 20)
        handle = cls(process, log_path)
        try:
            yield handle
        finally:
            await handle.stop()

    async def _read(self) -> None:
        assert self.process.stdout is not None
        while line := await self.process.stdout.readline():
            message = json.loads(line)
            if message.get("event") == "progress":
                self.snapshot, self.streamed = message["snapshot"], message["streamed"]
            else:
                await self._replies.put(message)

    def failure(self, what: str) -> BenchmarkError:
        """An error naming what did not happen, with the end of the child's log."""
        tail = self.log_path.read_text(errors="replace")[-3000:] if self.log_path.exists() else ""
        status = "running" if self.process.returncode is None else f"exited with {self.process.returncode}"
        return BenchmarkError(f"the pipeline process ({status}): {what}; the end of its log:\n{tail}")

    async def request(self, command: str, timeout_s: float = REQUEST_TIMEOUT_S,
                      **fields: Any) -> dict[str, Any]:
        """Send one command and return the child's answer."""
        assert self.process.stdin is not None
        if self.process.returncode is not None:
            raise self.failure(f"cannot take {command!r}")
        self.process.stdin.write((json.dumps({"cmd": command, **fields}) + "\n").encode())
        await self.process.stdin.drain()
        try:
            answer = await asyncio.wait_for(self._replies.get(), timeout_s)
        except TimeoutError:
            raise self.failure(f"no answer to {command!r} within {timeout_s:.0f} s") from None
        if answer.get("reply") != command:
            raise self.failure(f"answered {answer!r} to {command!r}")
        return answer

    async def wait_until(self, done: Callable[[], bool], what: str, timeout_s: float) -> bool:
        """Wait until `done()` holds (it reads the progress reports); False on timeout."""
        deadline = time.monotonic() + timeout_s
        while not done():
            if self.process.returncode is not None or self._reader.done():
                raise self.failure(f"exited while waiting until {what}")
            if time.monotonic() > deadline:
                return False
            await asyncio.sleep(PROGRESS_INTERVAL_S / 2)
        return True

    async def stop(self) -> dict[str, Any] | None:
        """Ask the child to stop; kill it if it does not exit in time. Its last answer, if any."""
        answer = None
        if self.process.returncode is None:
            with contextlib.suppress(BenchmarkError, ConnectionError, OSError):
                answer = await self.request("stop", timeout_s=STOP_TIMEOUT_S)
            try:
                await asyncio.wait_for(self.process.wait(), STOP_TIMEOUT_S)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    self.process.kill()
                await self.process.wait()
        self._reader.cancel()
        await asyncio.gather(self._reader, return_exceptions=True)
        return answer


if __name__ == "__main__":
    sys.exit(main())
