"""A real Redis Cluster of the tests' own: redis-server processes in cluster mode on free loopback
ports in a temporary folder, joined with `redis-cli --cluster create`, never the machine's own
Redis.

`running_cluster(folder)` starts three masters (with `replicas=1`, a replica for each master as
well; with `masters=1`, one node that serves every slot), waits until every node reports
`cluster_state:ok` and agrees on who serves each slot (and, with replicas, until every replica is
in sync), yields a `RedisCluster` and stops every process it started. A test may kill a node
(`kill_master_of`), wait for its replica's promotion (`await_promotion`), start the node again
(`restart`: it comes back empty, as the new master's replica) and wait until it has caught up
(`await_replica`).
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import socket
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from support.waiting import eventually_sync

START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0
PORT_ATTEMPTS = 20
# A node's cluster bus listens on its port + 10000, so both must be free and below 65536.
BUS_OFFSET = 10_000


class ClusterUnavailable(Exception):
    """The cluster could not be started; the message says why and how to fix it."""


@dataclass
class ClusterNode:
    """One redis-server of the cluster, and the command line that started it."""

    port: int
    process: subprocess.Popen[bytes]
    log_path: Path
    command: list[str]

    @property
    def address(self) -> str:
        """`127.0.0.1:<port>`, as redis-cli and CLUSTER NODES name it."""
        return f"127.0.0.1:{self.port}"

    def log(self) -> str:
        """What the node wrote to its log."""
        return self.log_path.read_text(errors="replace")


@dataclass
class RedisCluster:
    """A running cluster: `url` is tidegate's URL for it (any node, redis+cluster://)."""

    nodes: list[ClusterNode]
    folder: Path
    node_timeout_ms: int
    killed: list[ClusterNode] = field(default_factory=list)

    @property
    def url(self) -> str:
        """`redis+cluster://127.0.0.1:<port>/0` of the first node still running."""
        return f"redis+cluster://{self.alive()[0].address}/0"

    def alive(self) -> list[ClusterNode]:
        """The nodes whose process still runs."""
        return [node for node in self.nodes if node.process.poll() is None]

    def master_of(self, key: str) -> ClusterNode:
        """The node that serves `key`'s slot now, as the cluster itself says."""
        import redis

        with _client(self.alive()[0].port) as client:
            slot = int(client.execute_command("CLUSTER KEYSLOT", key))
            for start, end, master, *_ in client.execute_command("CLUSTER SLOTS"):
                if start <= slot <= end:
                    return self._node(int(master[1]))
        raise redis.RedisError(f"no node serves slot {slot}")

    def kill_master_of(self, key: str) -> ClusterNode:
        """SIGKILL the master that serves `key` (no chance to flush or hand over); returns it."""
        node = self.master_of(key)
        node.process.send_signal(signal.SIGKILL)
        node.process.wait(timeout=STOP_TIMEOUT_S)
        self.killed.append(node)
        return node

    def restart(self, node: ClusterNode) -> None:
        """Start a stopped node again on its port, with its cluster configuration (who it is) and
        no data: it learns it lost its slots and becomes a replica."""
        node.process = _spawn(node.command, node.log_path)
        _await_ping(node)

    def await_replica(self, node: ClusterNode, master: ClusterNode,
                      timeout_s: float = START_TIMEOUT_S) -> None:
        """Wait until `node` replicates `master` and is in sync with it."""
        def replication() -> dict[str, Any]:
            with _client(node.port) as client:
                return dict(client.info("replication"))

        def in_sync(info: dict[str, Any]) -> bool:
            synced = info.get("master_link_status") == "up" and not info.get("master_sync_in_progress")
            return info["role"] == "slave" and info.get("master_port") == master.port and synced

        eventually_sync(replication, f"{node.address} is {master.address}'s replica, in sync", until=in_sync,
                        timeout_s=timeout_s, every_s=0.1,
                        ignoring=(Exception,),  # the node may still be loading
                        describe=lambda info: f"role {info['role']}, master port {info.get('master_port')}\n"
                        + self.describe())

    def await_promotion(self, key: str, dead: ClusterNode, timeout_s: float = START_TIMEOUT_S) -> ClusterNode:
        """Wait until a replica of `dead` serves `key`'s slot and every surviving node reports
        `cluster_state:ok`; returns the new master."""
        def promoted() -> ClusterNode | None:
            master = self.master_of(key)
            settled = master is not dead and all(_state_ok(node.port) for node in self.alive())
            return master if settled else None

        master = eventually_sync(promoted, f"a replica takes over from {dead.address}", timeout_s=timeout_s,
                                 every_s=0.1, ignoring=(Exception,),  # a node answering mid-failover
                                 describe=lambda _: self.describe())
        assert master is not None
        return master

    def describe(self) -> str:
        """Every node's log, for a failure message."""
        return "\n".join(f"--- {node.address} ---\n{node.log()}" for node in self.nodes)

    def _node(self, port: int) -> ClusterNode:
        return next(node for node in self.nodes if node.port == port)


@contextlib.contextmanager
def running_cluster(folder: Path, *, masters: int = 3, replicas: int = 0,
                    node_timeout_ms: int = 5_000) -> Iterator[RedisCluster]:
    """Start a cluster of `masters` masters with `replicas` replicas each in `folder`, yield it
    once it serves every slot, and stop all its nodes. Raises ClusterUnavailable when the
    binaries are missing or the cluster did not form."""
    server, cli = shutil.which("redis-server"), shutil.which("redis-cli")
    if server is None or cli is None:
        raise ClusterUnavailable(
            "redis-server and redis-cli must be on PATH for the Redis Cluster tests: run `make test` "
            "(it installs them) or `apt-get install redis-server redis-tools`")
    nodes: list[ClusterNode] = []
    try:
        for index in range(masters * (1 + replicas)):
            nodes.append(_answering_node(server, folder / f"node{index}", node_timeout_ms))
        cluster = RedisCluster(nodes, folder, node_timeout_ms)
        if masters == 1 and not replicas:
            # redis-cli creates clusters of three masters or more; one node takes every slot.
            command = [cli, "-p", str(nodes[0].port), "CLUSTER", "ADDSLOTSRANGE", "0", "16383"]
        else:
            command = [cli, "--cluster", "create", *(node.address for node in nodes),
                       "--cluster-replicas", str(replicas), "--cluster-yes"]
        create = subprocess.run(command, capture_output=True, text=True, timeout=START_TIMEOUT_S, check=False)
        if create.returncode != 0 or "ERR" in create.stdout:
            raise ClusterUnavailable(f"{' '.join(command)} failed:\n{create.stdout}{create.stderr}")
        _await_formed(cluster, masters, replicas)
        yield cluster
    finally:
        for node in nodes:
            _stop(node.process)


def _free_port_pair() -> int:
    """A loopback port that is free, and whose cluster bus port (+10000) is free too."""
    for _ in range(PORT_ATTEMPTS):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port: int = sock.getsockname()[1]
        if port + BUS_OFFSET > 65_535:
            continue
        with socket.socket() as bus:
            try:
                bus.bind(("127.0.0.1", port + BUS_OFFSET))
            except OSError:
                continue
        return port
    raise ClusterUnavailable(f"no free port with a free cluster bus port in {PORT_ATTEMPTS} attempts")


def _start_node(server: str, workdir: Path, node_timeout_ms: int) -> ClusterNode:
    workdir.mkdir(parents=True, exist_ok=True)
    port = _free_port_pair()
    log_path = workdir / "redis.log"
    command = [server, "--port", str(port), "--bind", "127.0.0.1", "--cluster-enabled", "yes",
               "--cluster-config-file", str(workdir / "nodes.conf"),
               "--cluster-node-timeout", str(node_timeout_ms),
               "--save", "", "--appendonly", "no", "--dir", str(workdir), "--daemonize", "no",
               # A replica's full sync starts at once instead of waiting 5 s for more replicas.
               "--repl-diskless-sync-delay", "0"]
    return ClusterNode(port, _spawn(command, log_path), log_path, command)


def _answering_node(server: str, workdir: Path, node_timeout_ms: int) -> ClusterNode:
    """A started node that answers. A port found free may be taken before redis-server binds it
    (the bus port, +10000, by another process's outgoing connection, say): such a node exits
    with "Failed listening", and another is started on other ports."""
    for _ in range(PORT_ATTEMPTS):
        node = _start_node(server, workdir, node_timeout_ms)
        try:
            _await_ping(node)
        except ClusterUnavailable:
            _stop(node.process)
            if "Failed listening" not in node.log():
                raise
            # A clean start: no node id or log of the attempt that could not listen.
            (workdir / "nodes.conf").unlink(missing_ok=True)
            node.log_path.unlink(missing_ok=True)
            continue
        return node
    raise ClusterUnavailable(f"no node of {workdir} could listen on its ports in {PORT_ATTEMPTS} attempts")


def _spawn(command: list[str], log_path: Path) -> subprocess.Popen[bytes]:
    with log_path.open("ab") as log:
        return subprocess.Popen(command, cwd=log_path.parent, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)


def _client(port: int) -> Any:
    import redis

    return redis.Redis(host="127.0.0.1", port=port, socket_timeout=2, socket_connect_timeout=1,
                       decode_responses=True)


def _await_ping(node: ClusterNode) -> None:
    """Until *our* process answers on the node's port."""
    import redis

    def answering_pid() -> int:
        if node.process.poll() is not None:
            raise ClusterUnavailable(f"redis-server on {node.address} exited:\n{node.log()}")
        with _client(node.port) as client:
            return int(client.info("server")["process_id"])

    try:
        pid = eventually_sync(answering_pid, f"{node.address} answers", timeout_s=START_TIMEOUT_S,
                              every_s=0.05, ignoring=(redis.RedisError,))
    except AssertionError as exc:
        raise ClusterUnavailable(str(exc)) from exc
    if pid != node.process.pid:
        raise ClusterUnavailable(f"{node.address} is answered by another redis-server (pid {pid})")


def _state_ok(port: int) -> bool:
    with _client(port) as client:
        return bool(client.execute_command("CLUSTER INFO")["cluster_state"] == "ok")


def _await_formed(cluster: RedisCluster, masters: int, replicas: int) -> None:
    """Until every node says the cluster is ok, all agree on the slots' masters, and (with
    replicas) every replica's link to its master is up and caught up."""
    import redis

    try:
        eventually_sync(lambda: _formed(cluster, masters, replicas),
                        "the nodes agree on the slots and the replicas are in sync",
                        timeout_s=START_TIMEOUT_S, every_s=0.1, ignoring=(redis.RedisError,),
                        describe=lambda _: cluster.describe())
    except AssertionError as exc:
        raise ClusterUnavailable(str(exc)) from exc


def _formed(cluster: RedisCluster, masters: int, replicas: int) -> bool:
    views = set()
    for node in cluster.nodes:
        with _client(node.port) as client:
            if client.execute_command("CLUSTER INFO")["cluster_state"] != "ok":
                return False
            # (first slot, last slot, master's port) of every range of slots. CLUSTER SLOTS lists
            # a replica only once its master has pinged it (every 10 s): counted below instead.
            views.add(tuple(sorted((start, end, master[1])
                                   for start, end, master, *_ in client.execute_command("CLUSTER SLOTS"))))
            info = client.info("replication")
            if info["role"] == "master" and info["connected_slaves"] != replicas:
                return False
            if info["role"] == "slave" and (info.get("master_link_status") != "up"
                                            or info.get("master_sync_in_progress")):
                return False
    if len(views) != 1:
        return False
    (view,) = views
    return len({master for _, _, master in view}) == masters


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
