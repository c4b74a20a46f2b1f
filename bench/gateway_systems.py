"""What the gateway benchmark measures, each started in processes of its own on loopback: the
simulated provider, tidegate (embedded `up`, or `tidegate gateway` + `tidegate worker` on a
private Redis), LiteLLM's proxy and Portkey's gateway, all pointed at that one simulator.

Each system is an async context manager that yields a `System` (where to send, with which key,
and which processes to meter) and stops everything it started when the block ends.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import secrets
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

import aiohttp

from bench.common import BenchmarkError
from bench.gateway_load import MODEL, Endpoint
from bench.gateway_procs import REPO_ROOT, running, tidegate_command, wait_for_http, wait_for_line
from bench.gateway_up import READY_PREFIX
from bench.servers import free_port, private_redis
from tidegate import Priority
from tidegate.testing import Tenant, default_models, tenant_store_for

SIM_KEY = "sk-bench"  # the simulator checks no key; clients send one as they would to a provider
SIM_READY = r"Simulated provider listening on (\S+)"
START_TIMEOUT_S = 30.0
LITELLM_START_TIMEOUT_S = 300.0  # it imports a great deal, once per worker: minutes on a busy machine
# Where `make bench` installs Portkey's gateway with npm (ignored by git; see the Makefile).
PORTKEY_PREFIX = REPO_ROOT / "bench" / ".peers"
PORTKEY_PACKAGE = PORTKEY_PREFIX / "node_modules" / "@portkey-ai" / "gateway"
PORTKEY_LOOPBACK = REPO_ROOT / "bench" / "portkey_loopback.cjs"
PORTKEY_START_TIMEOUT_S = 60.0
TENANT = Tenant(name="bench", max_priority=Priority.HIGH, default_priority=Priority.NORMAL)


@dataclass(frozen=True, slots=True)
class System:
    """A running system: where the load goes and which process trees do its work."""

    key: str  # short id used on the command line: direct, up, redis, litellm
    name: str  # for the tables
    layout: str  # what runs where, for the report
    endpoint: Endpoint
    pids: dict[str, int] = field(default_factory=dict)  # name -> pid, each metered with its children


@dataclass(frozen=True, slots=True)
class Simulator:
    """The simulated provider's process, URL and the `direct` system that calls it."""

    base_url: str
    pid: int

    @property
    def direct(self) -> System:
        """Requests straight to the simulator: the baseline every gateway is compared with."""
        return System("direct", "direct to the simulator", "no gateway", Endpoint(self.base_url, SIM_KEY))

    async def received(self, session: aiohttp.ClientSession) -> int:
        """Chat requests the simulator has received for the benchmark's model so far."""
        url = self.base_url.removesuffix("/v1") + "/_sim/stats"
        async with session.get(url) as response:
            if response.status != 200:
                raise BenchmarkError(f"simulator GET /_sim/stats: HTTP {response.status}")
            stats = await response.json()
        return int(stats["models"].get(MODEL, {}).get("received", 0))


@contextlib.asynccontextmanager
async def simulator(folder: Path, latency_ms: float) -> AsyncIterator[Simulator]:
    """`tidegate simulate` on a free port: every answer after a fixed `latency_ms`, no limits."""
    argv = [*tidegate_command(), "simulate", "--port", "0", "--seed", "1", "--latency-ms", f"{latency_ms:g}"]
    async with running("simulator", argv, folder) as child:
        match = await wait_for_line(child, SIM_READY, START_TIMEOUT_S)
        yield Simulator(match[1], child.pid)


def write_tidegate_config(path: Path, sim_url: str, queue_url: str, max_concurrency: int) -> Path:
    """A tidegate.toml whose one provider is the simulator, serving the benchmark's model at its
    shipped prices with no rate limit (so the worker never paces) and room for `max_concurrency`
    calls in flight."""
    [priced] = [model for model in default_models() if model.name == MODEL]
    path.write_text("\n".join([
        f'queue_url = "{queue_url}"',
        "",
        "[[providers]]",
        'name = "sim"',
        f'base_url = "{sim_url}"',
        "",
        "[[providers.models]]",
        f'name = "{MODEL}"',
        f'input_usd_per_1m = "{priced.input_usd_per_1m}"',
        f'output_usd_per_1m = "{priced.output_usd_per_1m}"',
        f"max_concurrency = {max_concurrency}",
        "",
    ]))
    return path


@contextlib.asynccontextmanager
async def tidegate_up(folder: Path, sim: Simulator, concurrency: int) -> AsyncIterator[System]:
    """The embedded layout: SQLite queue, worker and gateway in one process (`tidegate up`)."""
    db = folder / "up" / "tidegate.db"
    config = write_tidegate_config(folder / "up.toml", sim.base_url, f"sqlite:///{db}", concurrency)
    argv = [sys.executable, "-m", "bench.gateway_up", "--config", str(config),
            "--concurrency", str(concurrency)]
    async with running("tidegate-up", argv, folder) as child:
        match = await wait_for_line(child, "^" + READY_PREFIX + "(.+)$", START_TIMEOUT_S)
        ready = json.loads(match[1])
        yield System(
            "up", "tidegate up",
            f"1 process: gateway + worker ({concurrency} in flight), SQLite queue; change flow off",
            Endpoint(ready["api_url"], ready["admin_key"]), {"tidegate": child.pid},
        )


def redis_name(processes: int) -> str:
    """The report's name of the Redis layout with `processes` gateways and as many workers."""
    return "tidegate gateway + worker" + (f" (x{processes})" if processes > 1 else "")


@contextlib.asynccontextmanager
async def tidegate_redis(folder: Path, sim: Simulator, concurrency: int, processes: int = 1,
                         ) -> AsyncIterator[System]:
    """The scale-out layout: `tidegate gateway` (with `--processes N`: N processes on its port)
    and N `tidegate worker` processes, on a private redis-server; the tenant's key is created
    beforehand as an operator would."""
    with private_redis() as server:
        queue_url = f"{server.url}?name=bench"
        config = write_tidegate_config(folder / "redis.toml", sim.base_url, queue_url, concurrency)
        async with tenant_store_for(queue_url, auth_cache_s=0) as store:
            await store.put_tenant(TENANT)
            _, key = await store.create_key(TENANT.name)
        port = free_port()
        gateway_argv = [*tidegate_command(), "gateway", "--queue", queue_url, "--config", str(config),
                        "--port", str(port), "--processes", str(processes)]
        async with contextlib.AsyncExitStack() as stack:
            gateway = await stack.enter_async_context(running("tidegate-gateway", gateway_argv, folder))
            workers = [await stack.enter_async_context(running(f"tidegate-worker-{n}", [
                *tidegate_command(), "worker", "--queue", queue_url, "--config", str(config),
                "--concurrency", str(concurrency), "--worker-id", f"w{n}"], folder))
                for n in range(1, processes + 1)]
            await wait_for_http(gateway, f"http://127.0.0.1:{port}/readyz", START_TIMEOUT_S)
            for n, worker in enumerate(workers, start=1):
                await wait_for_line(worker, f"worker w{n} serving", START_TIMEOUT_S)
            pids = {"gateway": gateway.pid}  # with its processes, metered as one tree
            pids |= {"worker" if processes == 1 else f"worker {n}": worker.pid
                     for n, worker in enumerate(workers, start=1)}
            yield System(
                "redis", redis_name(processes),
                f"{2 * processes} processes: gateway x{processes} on one port, worker x{processes} "
                f"({concurrency} in flight each); Redis queue (redis-server {server.version})"
                if processes > 1 else
                f"2 processes: gateway, worker ({concurrency} in flight); Redis queue "
                f"(redis-server {server.version})",
                Endpoint(f"http://127.0.0.1:{port}/v1", key),
                {**pids, "redis-server": server.pid},
            )


def litellm_version() -> str | None:
    """The installed LiteLLM's version, or None when it is not installed."""
    if importlib.util.find_spec("litellm") is None:
        return None
    try:
        return metadata.version("litellm")
    except metadata.PackageNotFoundError:
        return None


def _litellm_config(path: Path, sim_url: str) -> Path:
    """The proxy config: one model on the simulator, and the settings LiteLLM's own benchmark
    page uses to measure the proxy (no callbacks, no retries, a 30 s timeout), telemetry off."""
    # Written by hand (a JSON string is a YAML string): no YAML library needed.
    path.write_text("\n".join([
        "model_list:",
        f"  - model_name: {MODEL}",
        "    litellm_params:",
        f"      model: openai/{MODEL}",
        f"      api_base: {json.dumps(sim_url)}",
        f"      api_key: {SIM_KEY}",
        "litellm_settings:",
        "  telemetry: false",
        "  callbacks: []",
        "  num_retries: 0",
        "  request_timeout: 30",
        "",
    ]))
    return path


@contextlib.asynccontextmanager
async def litellm_proxy(folder: Path, sim: Simulator, workers: int) -> AsyncIterator[System]:
    """`litellm --config` (its proxy) on a free port with `workers` uvicorn workers, routing the
    benchmark's model to the simulator as an OpenAI-compatible provider. No database: keys are
    checked against the master key. Telemetry is off and the model cost map is read from the
    package, so nothing is fetched from the network."""
    version = litellm_version()
    if version is None:
        raise BenchmarkError("LiteLLM is not installed (pip install -e '.[bench]')")
    binary = Path(sys.executable).with_name("litellm")
    if not binary.exists():
        raise BenchmarkError(f"LiteLLM {version} is installed but its `litellm` command is not at {binary}")
    config = _litellm_config(folder / "litellm.yaml", sim.base_url)
    master_key = "sk-" + secrets.token_hex(24)
    env = {**os.environ, "LITELLM_MASTER_KEY": master_key, "LITELLM_LOCAL_MODEL_COST_MAP": "True",
           "LITELLM_TELEMETRY": "False", "LITELLM_LOG": "ERROR"}
    port = free_port()
    argv = [str(binary), "--config", str(config), "--host", "127.0.0.1", "--port", str(port),
            "--num_workers", str(workers)]
    # Its own working folder: the proxy reads a .env file from there.
    work = folder / "litellm"
    work.mkdir(exist_ok=True)
    async with running("litellm", argv, folder, env=env, cwd=work) as child:
        await wait_for_http(child, f"http://127.0.0.1:{port}/health/liveliness", LITELLM_START_TIMEOUT_S)
        yield System(
            "litellm", litellm_name(workers),
            f"LiteLLM {version}: {workers} uvicorn worker process{'es' if workers != 1 else ''}, "
            "no database, master key auth",
            Endpoint(f"http://127.0.0.1:{port}/v1", master_key), {"litellm": child.pid},
        )


def litellm_name(workers: int) -> str:
    """`LiteLLM proxy (2 workers)`."""
    return f"LiteLLM proxy ({workers} worker{'s' if workers != 1 else ''})"


def node_binary() -> str:
    """The `node` on PATH; fails saying how to install it."""
    node = shutil.which("node")
    if node is None:
        raise BenchmarkError("Node.js is not installed (Debian: apt-get install nodejs npm)")
    return node


def node_version() -> str:
    """`v20.20.2`, from `node --version`."""
    node = node_binary()
    try:
        done = subprocess.run([node, "--version"], capture_output=True, text=True, timeout=10, check=True)
    except (OSError, subprocess.SubprocessError) as error:
        raise BenchmarkError(f"`{node} --version` failed: {error}") from error
    return done.stdout.strip()


def portkey_version() -> str | None:
    """The version of the Portkey gateway `make bench` installed, or None when it is absent."""
    try:
        manifest = json.loads((PORTKEY_PACKAGE / "package.json").read_text())
    except (OSError, ValueError):
        return None
    return str(manifest.get("version", "unknown"))


@contextlib.asynccontextmanager
async def portkey_gateway(folder: Path, sim: Simulator) -> AsyncIterator[System]:
    """Portkey's open-source gateway (`node build/start-server.js`, one Node process) on a free
    port, headless (no web UI, no log stream), every request routed by its headers to the
    simulator as an OpenAI provider at a custom host. The bearer key goes through to the
    simulator as the provider's key: the gateway itself checks none."""
    version = portkey_version()
    if version is None:
        raise BenchmarkError(f"Portkey's gateway is not installed in {PORTKEY_PREFIX} (`make bench` installs "
                             "it with npm)")
    node, node_at = node_binary(), node_version()
    port = free_port()
    # --require: it listens on loopback only (see the file); --port=N is its own option.
    argv = [node, "--require", str(PORTKEY_LOOPBACK), str(PORTKEY_PACKAGE / "build" / "start-server.js"),
            f"--port={port}", "--headless"]
    async with running("portkey", argv, folder, cwd=folder) as child:
        # GET / answers "AI Gateway says hey!" once the server listens.
        await wait_for_http(child, f"http://127.0.0.1:{port}/", PORTKEY_START_TIMEOUT_S)
        headers = (("x-portkey-provider", "openai"), ("x-portkey-custom-host", sim.base_url))
        yield System(
            "portkey", "Portkey gateway",
            f"Portkey gateway {version} on Node {node_at}: 1 process, headless, provider openai "
            "at a custom host; no config, cache or retries",
            Endpoint(f"http://127.0.0.1:{port}/v1", SIM_KEY, headers), {"portkey": child.pid},
        )
