"""Soak: `tidegate up` under steady mixed traffic for a long time, watching memory and disk.

    .venv/bin/python -m bench.soak                          # 200 req/s for 30 minutes
    .venv/bin/python -m bench.soak --minutes 4 --rate 100 --answered-ttl-s 30 --finished-ttl-s 60 \\
        --baseline-min 1 --sample-s 15                      # a short check of the harness

It starts `tidegate simulate` (its own process: latency ~300 ms median, 2 s at p99 for chat, a
few ms between streamed tokens, ~50 ms for embeddings; no rate limits, no faults) and `tidegate
up` on it (embedded SQLite in a data folder of its own, no change flow), then sends requests at a
fixed rate, whatever the answers take (an open loop), with the key of a tenant made with the CLI:
synchronous chat completions, streamed ones read to their end, embeddings, and asynchronous
/v1/jobs. Every `--sample-s` seconds it records
the resident memory of the `up` process and its children, and the size of the data folder (the
SQLite file with its WAL).

Retention: a synchronous call's job is kept `answered_ttl_s` after it was answered (the queue's
default: 300 s), an asynchronous job `finished_ttl_s` (24 h by default; here 900 s unless given,
so the folder can reach its steady state within the run: at the default the asynchronous jobs
alone add their own size for a day, by design). The folder is judged once both have passed.

The summary (printed as markdown, and written as JSON and markdown under bench/results/) gives
the memory after `--baseline-min` minutes and at the end (+x %; memory rises during the first
five minutes by design: the in-process stream relay keeps a finished stream's chunks for 300 s,
CHANNEL_TTL_S, for a late reader), the folder's size over time (the SQLite file and its WAL)
after retention with its trend (bytes per minute, least squares) and whether it is flat (its
trend over the judged span is under 5 % of its mean size, or under 1 MiB), the errors by kind,
and the rate achieved with the latencies of the synchronous calls.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import platform
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from bench.common import BenchmarkError, command_line, percentile
from tidegate.testing import default_models

START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 60.0
REQUEST_TIMEOUT_S = 120.0
MAX_IN_FLIGHT = 5_000  # beyond this the client, not tidegate, is the bottleneck: a send is skipped
FLAT_SHARE = 0.05  # a trend over the judged span under this share of the mean size is flat
FLAT_BYTES = 1024 * 1024  # ... or under this many bytes
WORDS = ("red", "shoes", "kettle", "summer", "garden", "lamp", "wool", "coffee", "travel", "desk")
# What one send is, by weight.
MIX: tuple[tuple[str, float], ...] = (("chat", 0.50), ("stream", 0.20), ("embeddings", 0.25), ("job", 0.05))


# ---------------------------------------------------------------------- processes


def free_port() -> int:
    """A loopback port nobody listens on now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def simulator_toml(path: Path) -> None:
    """The simulated provider's behaviour: chat with a realistic spread of latency, streams with a
    pause between tokens, embeddings quick."""
    lines = ["seed = 7", "", "[defaults]", "latency_ms = 300", "latency_p99_ms = 2000",
             "inter_token_ms = 4"]
    for model in default_models():
        if model.kind == "embeddings":
            lines += ["", f'[models."{model.name}"]', "latency_ms = 50", "latency_p99_ms = 200"]
    path.write_text("\n".join(lines) + "\n")


def tidegate_toml(path: Path, data: Path, sim_url: str, args: argparse.Namespace) -> None:
    """`tidegate up`'s config: the simulator as its provider, serving the shipped price table,
    and the queue in `data` with the run's retention."""
    query = f"answered_ttl_s={args.answered_ttl_s:g}&finished_ttl_s={args.finished_ttl_s:g}"
    lines = [f'queue_url = "sqlite:///{data / "tidegate.db"}?{query}"', "", "[[providers]]",
             'name = "sim"', f'base_url = "{sim_url}"']
    for model in default_models():
        lines += ["", "[[providers.models]]", f'name = "{model.name}"', f'kind = "{model.kind}"',
                  f'input_usd_per_1m = "{model.input_usd_per_1m}"',
                  f'output_usd_per_1m = "{model.output_usd_per_1m}"',
                  f"context_tokens = {model.context_tokens}"]
    # The gateway sweeps batches in progress often enough to read their answers within half of
    # finished_ttl_s (it refuses to start otherwise): 25 sweeps for a batch of the largest size.
    sweep_s = min(60.0, args.finished_ttl_s / 2 / 25)
    lines += ["", "[gateway]", f"batch_sweep_s = {sweep_s:g}"]
    path.write_text("\n".join(lines) + "\n")


def tidegate(*args: str, log: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """`tidegate <args>` in a process group of its own, its output in `log`."""
    with log.open("wb") as out:
        return subprocess.Popen([sys.executable, "-m", "tidegate", *args], stdout=out,
                                stderr=subprocess.STDOUT, env={**os.environ, **(env or {})},
                                start_new_session=True)


def tenant_key(queue_url: str, tenant: str) -> str:
    """A tenant of the queue's store and a new API key of its, made with the CLI as an operator
    would (`tidegate tenants put`, `tidegate keys create`); returns the key."""
    def cli(*args: str) -> str:
        done = subprocess.run([sys.executable, "-m", "tidegate", *args, "--queue", queue_url],
                              capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise BenchmarkError(f"tidegate {' '.join(args)} failed: {done.stdout}{done.stderr}")
        return done.stdout

    cli("tenants", "put", tenant)
    keys = [line for line in cli("keys", "create", tenant).splitlines() if line.startswith("tg_")]
    if not keys:
        raise BenchmarkError("tidegate keys create printed no key")
    return keys[-1].strip()


def stop(proc: subprocess.Popen[bytes], what: str) -> None:
    """SIGINT (a graceful stop), then SIGKILL past STOP_TIMEOUT_S."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        print(f"{what} did not stop within {STOP_TIMEOUT_S:g}s: killed", file=sys.stderr)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


async def wait_listening(url: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    """Until `url` answers 2xx; fails naming the log if the process ends or time runs out."""
    give_up = time.monotonic() + START_TIMEOUT_S
    async with aiohttp.ClientSession() as session:
        while time.monotonic() < give_up:
            if proc.poll() is not None:
                raise BenchmarkError(f"it exited with {proc.returncode}: see {log}")
            with contextlib.suppress(aiohttp.ClientError, OSError):
                async with session.get(url) as answer:
                    if answer.status < 300:
                        return
            await asyncio.sleep(0.2)
    raise BenchmarkError(f"{url} did not answer within {START_TIMEOUT_S:g}s: see {log}")


async def simulator_url(log: Path, proc: subprocess.Popen[bytes]) -> str:
    """The URL `tidegate simulate` prints once it listens."""
    give_up = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < give_up:
        for line in (await asyncio.to_thread(log.read_text, errors="replace")).splitlines():
            if line.startswith("Simulated provider listening on "):
                return line.removeprefix("Simulated provider listening on ").strip()
        if proc.poll() is not None:
            raise BenchmarkError(f"the simulator exited with {proc.returncode}: see {log}")
        await asyncio.sleep(0.1)
    raise BenchmarkError(f"the simulator did not start within {START_TIMEOUT_S:g}s: see {log}")


# ---------------------------------------------------------------------- what is measured


def process_tree(pid: int) -> list[int]:
    """`pid` and its descendants, from /proc."""
    tree, todo = [], [pid]
    while todo:
        current = todo.pop()
        tree.append(current)
        with contextlib.suppress(OSError):
            for task in os.listdir(f"/proc/{current}/task"):
                with open(f"/proc/{current}/task/{task}/children") as children:
                    todo += [int(child) for child in children.read().split()]
    return tree


def rss_bytes(pid: int) -> int:
    """The resident memory of `pid` and its descendants."""
    total = 0
    for member in process_tree(pid):
        with contextlib.suppress(OSError), open(f"/proc/{member}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
    return total


def folder_bytes(folder: Path) -> tuple[int, int]:
    """The size of every file under `folder`, and of the WAL files among them."""
    total = wal = 0
    for root, _, files in os.walk(folder):
        for name in files:
            with contextlib.suppress(OSError):
                size = (Path(root) / name).stat().st_size
                total += size
                wal += size if name.endswith("-wal") else 0
    return total, wal


@dataclass(frozen=True, slots=True)
class Sample:
    """One reading, `t_s` seconds into the load."""

    t_s: float
    rss_bytes: int
    folder_bytes: int
    wal_bytes: int  # of folder_bytes, the SQLite WAL
    sent: int
    answered: int
    errors: int


@dataclass(slots=True)
class Load:
    """What the traffic did so far."""

    sent: int = 0
    answered: int = 0
    skipped: int = 0  # sends left out: MAX_IN_FLIGHT were open
    errors: Counter[str] = field(default_factory=Counter)
    by_kind: Counter[str] = field(default_factory=Counter)
    latency_s: dict[str, list[float]] = field(default_factory=dict)
    in_flight: int = 0


def body_of(kind: str, rng: random.Random) -> tuple[str, dict[str, Any]]:
    """The path and body of one send of `kind`, its words varied."""
    words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 40)))
    chat: dict[str, Any] = {"model": "auto", "max_tokens": 96,
                            "messages": [{"role": "user", "content": f"Describe: {words}"}]}
    if kind == "chat":
        return "/v1/chat/completions", chat
    if kind == "stream":
        return "/v1/chat/completions", {**chat, "stream": True}
    if kind == "embeddings":
        return "/v1/embeddings", {"model": "auto", "input": words}
    return "/v1/jobs", {"kind": "chat", "body": chat}


async def send(session: aiohttp.ClientSession, base: str, kind: str, rng: random.Random,
               load: Load) -> None:
    """One request, read to its end; its outcome counted in `load`."""
    path, body = body_of(kind, rng)
    started = time.perf_counter()
    load.in_flight += 1
    try:
        async with session.post(base + path, data=orjson.dumps(body)) as answer:
            await answer.read()  # a stream is read to its last event
            if answer.status >= 300:
                load.errors[f"{kind} HTTP {answer.status}"] += 1
                return
        load.answered += 1
        load.latency_s.setdefault(kind, []).append(time.perf_counter() - started)
    except (aiohttp.ClientError, TimeoutError, OSError) as exc:
        load.errors[f"{kind} {type(exc).__name__}"] += 1
    finally:
        load.in_flight -= 1


async def drive(base: str, key: str, args: argparse.Namespace, load: Load, samples: list[Sample],
                up_pid: int, data: Path) -> float:
    """Send at `args.rate` for `args.minutes`, sampling every `args.sample_s`; returns the seconds
    the sending took."""
    rng = random.Random(11)
    kinds, weights = zip(*MIX, strict=True)
    duration_s = args.minutes * 60
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
    tasks: set[asyncio.Task[None]] = set()
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {key}"}
    async with aiohttp.ClientSession(connector=connector, timeout=timeout, headers=headers) as session:
        loop = asyncio.get_running_loop()
        start = loop.time()

        def sample() -> None:
            folder, wal = folder_bytes(data)
            samples.append(Sample(round(loop.time() - start, 1), rss_bytes(up_pid), folder, wal,
                                  load.sent, load.answered, sum(load.errors.values())))
            last = samples[-1]
            print(f"  {last.t_s:7.0f}s  rss {last.rss_bytes / 2**20:7.1f} MiB  folder "
                  f"{last.folder_bytes / 2**20:8.1f} MiB (WAL {last.wal_bytes / 2**20:5.1f})  "
                  f"sent {last.sent:>9,}  errors {last.errors}", flush=True)

        sample()
        next_sample = start + args.sample_s
        n = 0
        while (now := loop.time()) - start < duration_s:
            if now >= next_sample:
                sample()
                next_sample += args.sample_s
            due = start + n / args.rate
            if due > now:
                await asyncio.sleep(due - now)
            n += 1
            if load.in_flight >= MAX_IN_FLIGHT:
                load.skipped += 1
                continue
            kind = rng.choices(kinds, weights)[0]
            load.sent += 1
            load.by_kind[kind] += 1
            task = asyncio.create_task(send(session, base, kind, rng, load))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        sent_s = loop.time() - start
        if tasks:
            await asyncio.wait(tasks, timeout=REQUEST_TIMEOUT_S)
        sample()
    return sent_s


# ---------------------------------------------------------------------- the summary


def trend_per_min(points: list[tuple[float, int]]) -> float:
    """The least-squares slope of (seconds, bytes), in bytes per minute (0 for fewer than 2)."""
    if len(points) < 2:
        return 0.0
    mean_t = sum(t for t, _ in points) / len(points)
    mean_v = sum(v for _, v in points) / len(points)
    spread = sum((t - mean_t) ** 2 for t, _ in points)
    if spread == 0:
        return 0.0
    return sum((t - mean_t) * (v - mean_v) for t, v in points) / spread * 60


def sample_at(samples: list[Sample], t_s: float) -> Sample:
    """The first sample taken at or after `t_s` (the last one if none)."""
    return next((sample for sample in samples if sample.t_s >= t_s), samples[-1])


def summarise(args: argparse.Namespace, load: Load, samples: list[Sample], sent_s: float,
              data: Path) -> dict[str, Any]:
    """The run's figures, as the JSON document."""
    baseline = sample_at(samples, args.baseline_min * 60)
    end = samples[-1]
    retention_s = max(args.answered_ttl_s, args.finished_ttl_s) + args.sample_s
    judged = [(s.t_s, s.folder_bytes) for s in samples if s.t_s >= retention_s]
    slope = trend_per_min(judged)
    span_min = (judged[-1][0] - judged[0][0]) / 60 if len(judged) > 1 else 0.0
    mean = sum(v for _, v in judged) / len(judged) if judged else 0.0
    drift = abs(slope) * span_min
    latencies = {kind: {"p50_ms": round(percentile(values, 0.5), 1),
                        "p99_ms": round(percentile(values, 0.99), 1), "count": len(values)}
                 for kind, values in sorted(load.latency_s.items())}
    return {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": f"Python {platform.python_version()} on {platform.system()} {platform.machine()}, "
                   f"{os.cpu_count()} CPUs",
        "command": command_line("bench.soak", sys.argv[1:]),
        "settings": {"rate": args.rate, "minutes": args.minutes, "answered_ttl_s": args.answered_ttl_s,
                     "finished_ttl_s": args.finished_ttl_s, "sample_s": args.sample_s,
                     "baseline_min": args.baseline_min, "concurrency": args.concurrency,
                     "mix": dict(MIX)},
        "sent": load.sent, "answered": load.answered, "skipped": load.skipped,
        "errors": sum(load.errors.values()), "errors_by_kind": dict(load.errors),
        "sent_by_kind": dict(load.by_kind),
        "achieved_rate": round(load.answered / sent_s, 1) if sent_s else 0.0,
        "latency": latencies,
        "rss": {"baseline_t_s": baseline.t_s, "baseline_bytes": baseline.rss_bytes,
                "end_bytes": end.rss_bytes,
                "change_pct": round((end.rss_bytes / baseline.rss_bytes - 1) * 100, 1)
                if baseline.rss_bytes else None},
        "folder": {"path": str(data), "judged_from_t_s": retention_s, "samples_judged": len(judged),
                   "trend_bytes_per_min": round(slope), "mean_bytes": round(mean),
                   "flat": bool(judged) and drift <= max(FLAT_SHARE * mean, FLAT_BYTES),
                   "end_bytes": end.folder_bytes},
        "samples": [asdict(sample) for sample in samples],
    }


def markdown(doc: dict[str, Any]) -> str:
    """The summary for people (and BENCHMARKS.md)."""
    rss, folder, settings = doc["rss"], doc["folder"], doc["settings"]
    mib = 2**20
    verdict = "flat" if folder["flat"] else "growing"
    if not folder["samples_judged"]:
        verdict = "not judged (the run ended before retention passed)"
    lines = [
        f"### Soak: `tidegate up` at {settings['rate']:g} req/s for {settings['minutes']:g} min",
        "",
        f"`{doc['command']}` — {doc['when']}, {doc['machine']}; answered_ttl_s "
        f"{settings['answered_ttl_s']:g}, finished_ttl_s {settings['finished_ttl_s']:g}; mix "
        + ", ".join(f"{kind} {share:.0%}" for kind, share in settings["mix"].items()) + ".",
        "",
        "| figure | value |",
        "|---|---|",
        f"| requests sent / answered / skipped | {doc['sent']:,} / {doc['answered']:,} / "
        f"{doc['skipped']:,} |",
        f"| achieved rate | {doc['achieved_rate']:g} req/s |",
        f"| errors | {doc['errors']:,} {doc['errors_by_kind'] or ''} |",
        f"| RSS after {rss['baseline_t_s']:g} s → end | {rss['baseline_bytes'] / mib:.1f} → "
        f"{rss['end_bytes'] / mib:.1f} MiB ({rss['change_pct']:+.1f} %) |",
        f"| data folder from {folder['judged_from_t_s']:g} s | mean {folder['mean_bytes'] / mib:.1f} MiB, "
        f"trend {folder['trend_bytes_per_min'] / 1024:+.1f} KiB/min: **{verdict}** |",
    ]
    for kind, figures in doc["latency"].items():
        lines.append(f"| {kind} latency p50 / p99 | {figures['p50_ms']:g} / {figures['p99_ms']:g} ms "
                     f"({figures['count']:,}) |")
    lines += ["", "| t (s) | RSS (MiB) | data folder (MiB) | of which WAL (MiB) | sent | errors |",
              "|---:|---:|---:|---:|---:|---:|"]
    lines += [f"| {s['t_s']:g} | {s['rss_bytes'] / mib:.1f} | {s['folder_bytes'] / mib:.2f} | "
              f"{s['wal_bytes'] / mib:.2f} | {s['sent']:,} | {s['errors']} |" for s in doc["samples"]]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------- main


@contextlib.contextmanager
def running(proc: subprocess.Popen[bytes], what: str) -> Iterator[subprocess.Popen[bytes]]:
    """`proc`, stopped gracefully when the block ends."""
    try:
        yield proc
    finally:
        stop(proc, what)


async def soak(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """Start the simulator and `tidegate up`, drive the load, and return the summary."""
    data = work / "data"
    data.mkdir(parents=True, exist_ok=True)
    simulator_toml(work / "simulator.toml")
    sim_log, up_log = work / "simulator.log", work / "up.log"
    sim = tidegate("simulate", "--port", "0", "--config", str(work / "simulator.toml"), log=sim_log)
    with running(sim, "the simulator"):
        sim_url = await simulator_url(sim_log, sim)
        tidegate_toml(work / "tidegate.toml", data, sim_url, args)
        key = await asyncio.to_thread(tenant_key, f"sqlite:///{data / 'tidegate.db'}", "soak")
        port = free_port()
        up = tidegate("up", "--port", str(port), "--config", str(work / "tidegate.toml"),
                      "--no-change-flow", "--concurrency", str(args.concurrency), log=up_log)
        with running(up, "tidegate up"):
            base = f"http://127.0.0.1:{port}"
            await wait_listening(base + "/healthz", up, up_log)
            print(f"tidegate up (pid {up.pid}) at {base}, data in {data}; {args.rate:g} req/s for "
                  f"{args.minutes:g} min", flush=True)
            load, samples = Load(), list[Sample]()
            sent_s = await drive(base, key, args, load, samples, up.pid, data)
            return summarise(args, load, samples, sent_s, data)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rate", type=float, default=200.0, help="requests per second (default 200)")
    parser.add_argument("--minutes", type=float, default=30.0, help="how long to send (default 30)")
    parser.add_argument("--sample-s", type=float, default=30.0, help="seconds between readings (default 30)")
    parser.add_argument("--baseline-min", type=float, default=5.0,
                        help="the reading memory is compared from, in minutes (default 5)")
    parser.add_argument("--answered-ttl-s", type=float, default=300.0,
                        help="the queue's answered_ttl_s (default: its own, 300)")
    parser.add_argument("--finished-ttl-s", type=float, default=900.0,
                        help="the queue's finished_ttl_s, for the asynchronous jobs (default 900)")
    parser.add_argument("--concurrency", type=int, default=256,
                        help="tidegate up's calls in flight (default 256)")
    parser.add_argument("--work", type=Path, default=None,
                        help="folder for the configs, logs and data (default: a temporary one, removed)")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results",
                        help="where soak-<time>.json and .md go (default bench/results/)")
    args = parser.parse_args(argv)
    if args.rate <= 0 or args.minutes <= 0 or args.sample_s <= 0:
        parser.error("--rate, --minutes and --sample-s must be above 0")
    return args


def main(argv: list[str] | None = None) -> int:
    """Run the soak and write its summary; 1 when it could not run."""
    args = parse_args(argv)
    with contextlib.ExitStack() as stack:
        work = args.work or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="tidegate-soak-")))
        try:
            doc = asyncio.run(soak(args, work))
        except BenchmarkError as exc:
            print(f"soak failed: {exc}", file=sys.stderr)
            return 1
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / f"soak-{datetime.now(UTC).strftime('%Y%m%dT%H%M%SZ')}"
    text = markdown(doc)
    stem.with_suffix(".json").write_bytes(orjson.dumps(doc, option=orjson.OPT_INDENT_2))
    stem.with_suffix(".md").write_text(text)
    print()
    print(text)
    print(f"written: {stem}.json, {stem}.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
