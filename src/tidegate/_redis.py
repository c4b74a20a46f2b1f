"""Redis plumbing every component shares.

- `RedisClient`: the one opener of every Redis connection (queue, coordination state, buses,
  entity cache, recommendation store): a pool with `connection_options()` (or, for a
  `redis+cluster://` URL, a Redis Cluster client), the caller's Lua scripts (`lua_source`)
  registered on it, an optional PING to fail early, and driver errors translated into the
  caller's own error with the URL's credentials left out. `key_prefix` is the hash-tagged start of
  a named queue's keys.
- `Outage`: how a component lives through a lost connection (a Redis restart, a dropped socket).
  It logs once when the connection is lost and once when it is back (never once per attempt),
  paces reconnect attempts with redis-py's capped exponential backoff with jitter, and counts
  each recovery in `tidegate_redis_reconnects_total{component}` (`RECONNECT_REGISTRY`).

Pooled request/response clients need no loop of their own: the pool checks a connection before
lending it and replaces one the server closed, so the first call after a restart goes out on a
fresh connection. Every client is opened with `connection_options()`, which keeps that check on
(redis-py 8 skips it while its maintenance notifications, a Redis Cloud feature, are enabled, as
they are by default) and bounds every reply and connect.

Long-lived reads (a pub/sub subscription, a blocking stream read) do need a loop: each holds one
connection, so it reconnects, resubscribes and re-checks what it may have missed meanwhile.

Redis Cluster: `redis+cluster://host:port` (`rediss+cluster://` with TLS) names any node of a
cluster; the client learns the others and which node serves each slot from it, and follows a
failover or a resharding (MOVED, ASK) by itself. Every component keeps all the keys one call
touches under one `{hash tag}`, so each script, transaction and multi-key command runs within one
slot. What a cluster changes for the callers is in `RedisClient`'s methods: `listen` (sharded
pub/sub, with `publish_command`), `server_time_ms` (the clock of the node a key lives on),
`pipelined` with `script_command` (scripts inside a pipeline) and `replicated_script` (WAIT on
the connection that wrote).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping, Sequence
from functools import cache
from importlib import resources
from typing import Any, TypeVar
from urllib.parse import urlsplit

from prometheus_client import CollectorRegistry, Counter

from tidegate._urls import redact_url
from tidegate.errors import MissingDependency, TidegateError

__all__ = [
    "BLOCK_MAX_S",
    "CLUSTER_SCHEMES",
    "CONNECT_TIMEOUT_S",
    "POOL_TIMEOUT_S",
    "RECONNECTS",
    "RECONNECT_REGISTRY",
    "REDIS_SCHEMES",
    "RETRY_WITHIN_S",
    "SOCKET_TIMEOUT_S",
    "Outage",
    "RedisClient",
    "call_with_reconnect",
    "connection_options",
    "driver_errors",
    "honouring_cancellation",
    "is_cluster_url",
    "is_connection_error",
    "is_redis_url",
    "key_prefix",
    "lua_source",
    "publish_command",
    "require_redis",
]

log = logging.getLogger("tidegate.redis")
T = TypeVar("T")

# Reconnect pacing: the first retry within 0.05-0.1 s, the bound doubling up to 2 s; each delay is
# drawn between half its bound and its bound (equal jitter), so a fleet of clients does not
# reconnect in step and no loop ever retries without pausing.
BACKOFF_BASE_S = 0.05
BACKOFF_CAP_S = 2.0

# The longest one reply may take before the connection counts as lost. Blocking reads (BLPOP,
# XREAD BLOCK) ask the server for at most BLOCK_MAX_S, well inside it: redis-py's default socket
# timeout (5 s since redis-py 6) would otherwise cut a 5 s blocking read short.
SOCKET_TIMEOUT_S = 10.0
CONNECT_TIMEOUT_S = 5.0
BLOCK_MAX_S = 5.0
# How long a call that is harmless to send twice is retried across a lost connection: long enough
# for a restart (a few hundred milliseconds), short enough that a caller hears of a real outage.
RETRY_WITHIN_S = 2.0
POOL_TIMEOUT_S = 30.0  # longest a call waits for a free connection of a bounded pool
CLUSTER_MAX_CONNECTIONS = 2**31 - 1  # per node: unbounded (see _cluster_client)
CLOSE_TIMEOUT_S = 1.0  # longest a subscription's clean-up may take
SHARDED_POLL_S = 1.0  # how often a sharded subscription checks it still stands while idle
WAIT_TIMEOUT_S = 1.0  # default longest wait for replicas to confirm a write (wait_replicas)
# A script's clock: routed by its one key, so on a cluster it is the clock of that key's node.
_CLOCK_LUA = "return redis.call('TIME')"

# URL schemes of a Redis Cluster, each with the scheme redis-py's cluster client reads for it.
CLUSTER_SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}
# Every scheme a Redis backend is chosen by: one server (TCP, TLS, Unix socket) or a cluster.
REDIS_SCHEMES = ("redis", "rediss", "unix", *CLUSTER_SCHEMES)

# One registry per process: components are built in many places (gateway, worker, sync) and this
# counter is about the process's connections, whichever component holds them.
RECONNECT_REGISTRY = CollectorRegistry()
RECONNECTS = Counter(
    "tidegate_redis_reconnects",
    "Times a component got its Redis connection back after losing it (once per outage)",
    ["component"], registry=RECONNECT_REGISTRY,
)


def connection_options() -> dict[str, Any]:
    """Keyword arguments for every pool or client tidegate opens (see the module doc)."""
    from redis.maint_notifications import MaintNotificationsConfig

    return {
        "socket_timeout": SOCKET_TIMEOUT_S,
        "socket_connect_timeout": CONNECT_TIMEOUT_S,
        "maint_notifications_config": MaintNotificationsConfig(enabled=False),
    }


def is_redis_url(url: str) -> bool:
    """Whether `url` names a Redis server or cluster (see REDIS_SCHEMES)."""
    return urlsplit(url).scheme in REDIS_SCHEMES


def is_cluster_url(url: str) -> bool:
    """Whether `url` names a Redis Cluster: `redis+cluster://` or `rediss+cluster://`."""
    return urlsplit(url).scheme in CLUSTER_SCHEMES


def publish_command(url: str) -> str:
    """The command that publishes to a `RedisClient.listen` channel on `url`: SPUBLISH on a
    cluster (the message stays within the shard that serves the channel's slot, where PUBLISH
    would send it to every node), PUBLISH otherwise."""
    return "SPUBLISH" if is_cluster_url(url) else "PUBLISH"


@cache
def driver_errors() -> tuple[type[Exception], ...]:
    """What redis-py raises for a failed call: its RedisError, the cluster client's own exception
    (which is not one: a cluster it cannot reach, a slot no node serves) and socket errors."""
    from redis.exceptions import RedisClusterException, RedisError

    return (RedisError, RedisClusterException, OSError)


def is_connection_error(exc: BaseException) -> bool:
    """Whether `exc` means the connection was lost or refused (worth a reconnect), as opposed to
    an answer of the server (a script error, a wrong type) that another attempt would repeat.

    On a cluster, a failover in progress counts too: a slot without a master (CLUSTERDOWN,
    TRYAGAIN) or a client that reached no node at all passes once a replica is promoted. The
    server refused those commands before running them."""
    from redis.exceptions import ClusterDownError, RedisClusterException, SlotNotCoveredError, TryAgainError
    from redis.exceptions import ConnectionError as RedisConnectionError
    from redis.exceptions import TimeoutError as RedisTimeoutError

    if isinstance(exc, (RedisConnectionError, RedisTimeoutError, OSError, ClusterDownError, TryAgainError,
                        SlotNotCoveredError)):
        return True
    # The cluster client reports "no node reachable" as its own exception, caused by the last
    # node's connection error.
    cause = exc.__cause__
    return isinstance(exc, RedisClusterException) and cause is not None and is_connection_error(cause)


class Outage:
    """The connection state of one component, `component` naming it in logs and metrics.

    `lost(exc)` at every failed attempt (logs only the first of an outage), `delay_s()` for the
    pause before the next attempt, `restored()` once an attempt succeeds (logs and counts only
    when there was an outage). Used from one event loop; cheap enough to call on every success."""

    def __init__(self, component: str, url: str) -> None:
        from redis.backoff import EqualJitterBackoff

        self.component = component
        self._where = redact_url(url)
        self._backoff = EqualJitterBackoff(cap=BACKOFF_CAP_S, base=BACKOFF_BASE_S)
        self._failures = 0
        self._since: float | None = None  # monotonic start of the current outage
        self.recoveries = 0  # outages this component has come back from

    def lost(self, exc: BaseException) -> None:
        """An attempt failed on a lost or refused connection."""
        self._failures += 1
        if self._since is None:
            self._since = time.monotonic()
            log.warning("%s lost its Redis connection at %s (%s); reconnecting with backoff",
                        self.component, self._where, exc)

    def delay_s(self) -> float:
        """Seconds to wait before the next attempt: at random between half of
        min(cap, base * 2**failures) and all of it."""
        delay: float = self._backoff.compute(self._failures)
        return delay

    def restored(self) -> None:
        """An attempt succeeded: the end of the outage, if there was one."""
        self._failures = 0
        if self._since is not None:
            down_s, self._since = time.monotonic() - self._since, None
            self.recoveries += 1
            RECONNECTS.labels(self.component).inc()
            log.warning("%s reconnected to Redis at %s after %.1f s", self.component, self._where, down_s)

    async def pause(self) -> None:
        """Sleep `delay_s()` before the next attempt (cancel the task to stop at once)."""
        await asyncio.sleep(self.delay_s())


async def honouring_cancellation(call: Awaitable[T]) -> T:
    """`await call`, raising CancelledError if the task was cancelled meanwhile even when the
    call returned. redis-py can swallow a cancellation that arrives while a pooled command is
    under way (seen in a pipeline's execute): the command completes and the cancel is lost, and
    the cancelled task runs on, so a shutdown that cancels it and waits for it waits forever."""
    task = asyncio.current_task()
    before = task.cancelling() if task is not None else 0
    result = await call
    if task is not None and task.cancelling() > before:
        raise asyncio.CancelledError
    return result


async def call_with_reconnect(call: Callable[[], Awaitable[T]], outage: Outage, *,
                              within_s: float = RETRY_WITHIN_S) -> T:
    """`call()`, sent again on a lost or refused connection, with `outage`'s backoff, for up to
    `within_s`; then (or at once for any other error) its driver error propagates for the caller
    to translate. Only for calls that are harmless to run twice: the first attempt may have run."""
    give_up = time.monotonic() + within_s
    while True:
        try:
            result = await honouring_cancellation(call())
        except Exception as exc:
            if not is_connection_error(exc):
                raise
            outage.lost(exc)
            remaining = give_up - time.monotonic()
            if remaining <= 0:
                raise
            await asyncio.sleep(min(outage.delay_s(), remaining))
            continue
        outage.restored()
        return result


def require_redis(what: str) -> None:
    """Raise MissingDependency when redis-py is missing: `what` (a Redis backend, imported only
    when its URL is chosen) needs the extra."""
    try:
        import redis  # noqa: F401
    except ImportError as exc:  # pragma: no cover - exercised only without the extra
        raise MissingDependency(f"{what} needs redis-py: pip install 'tidegate[redis]'") from exc


def key_prefix(name: str) -> str:
    """`tidegate:{name}:`, the start of every key of the queue (or store) called `name`: the hash
    tag keeps all of them on one Redis Cluster slot, so any script may touch any of them."""
    return f"tidegate:{{{name}}}:"


@cache
def lua_source(package: str, name: str, *, common: str | None = None) -> str:
    """The text of `<package>/lua/<name>.lua`, after `lua/<common>.lua` when given (helpers shared
    by a package's scripts)."""
    lua = resources.files(package) / "lua"
    shared = (lua / f"{common}.lua").read_text() + "\n" if common else ""
    return shared + (lua / f"{name}.lua").read_text()


@cache
def _hiredis_packing(connection_class: type) -> type:
    """`connection_class` (plain, TLS or Unix socket, as the URL chose) packing its commands with
    hiredis, as redis-py's synchronous connection already does when hiredis is installed. The
    asyncio connection packs in Python at ~0.6 us an argument, the bulk of a client's time for a
    script call with a few dozen keys; hiredis packs one in ~3 us whatever its length."""
    import hiredis
    from redis.connection import HiredisRespSerializer

    fallback = HiredisRespSerializer()  # type: ignore[no-untyped-call]  # redis-py 8.2 types all but this

    def pack_command(self: Any, *args: Any) -> list[bytes]:
        # A command name of several words ("SCRIPT LOAD") is sent as separate arguments.
        name = args[0].encode() if isinstance(args[0], str) else args[0]
        if b" " not in name:
            with contextlib.suppress(TypeError):
                return [hiredis.pack_command(args)]
        # redis-py's own serializer: it splits the name, converts views and buffers, and turns
        # an argument hiredis refuses into redis-py's DataError.
        packed: list[bytes] = fallback.pack(*args)
        return packed

    return type(f"Hiredis{connection_class.__name__}", (connection_class,), {"pack_command": pack_command})


def _server_client(url: str, max_connections: int | None, options: dict[str, Any]) -> Any:
    """A client of one server (redis://, rediss://, unix://) on a pool of hiredis-packing
    connections; a bounded pool makes a caller wait for a free connection."""
    import redis.asyncio as aioredis

    pool: Any
    if max_connections is None:
        pool = aioredis.ConnectionPool.from_url(url, **options)
    else:
        pool = aioredis.BlockingConnectionPool.from_url(
            url, max_connections=max_connections, timeout=POOL_TIMEOUT_S, **options)
    pool.connection_class = _hiredis_packing(pool.connection_class)
    # from_pool hands the pool to the client, so aclose() also closes its connections.
    return aioredis.Redis.from_pool(pool)


def _cluster_client(url: str, options: dict[str, Any]) -> Any:
    """A Redis Cluster client seeded with the node `url` names, its connections packing with
    hiredis. Query options of the URL (`?socket_timeout=…`) reach every node's connections."""
    from redis.asyncio.cluster import RedisCluster
    from redis.asyncio.retry import Retry
    from redis.backoff import NoBackoff

    if not hasattr(RedisCluster, "pubsub"):  # asyncio cluster pub/sub came with redis-py 8.0
        raise MissingDependency(f"a Redis Cluster ({redact_url(url)}) needs redis-py 8 or later: "
                                "pip install -U 'redis[hiredis]>=8'")
    parts = urlsplit(url)
    client = RedisCluster.from_url(
        parts._replace(scheme=CLUSTER_SCHEMES[parts.scheme]).geturl(),
        # Nothing sent again by the driver (a call that timed out may have run); redirections
        # (MOVED, ASK) are still followed, since a redirected command did not run.
        retry=Retry(NoBackoff(), 0),
        # redis-py's cluster pools refuse a call (MaxConnectionsError) rather than wait once a
        # node holds max_connections, which would turn a burst into errors: so none is bounded.
        max_connections=CLUSTER_MAX_CONNECTIONS,
        **{key: value for key, value in options.items() if key != "retry"},
    )
    packing = _hiredis_packing(client.connection_kwargs["connection_class"])
    # Nodes are built from these kwargs as the client discovers them; the seed node already was.
    client.connection_kwargs["connection_class"] = packing
    for node in client.startup_nodes:
        node.connection_class = packing
    return client


class RedisClient:
    """The one way tidegate opens Redis: a pool for `url`, the family's Lua scripts registered on
    it, and driver errors translated into the family's own `unavailable` error, naming `what`
    and the URL with its credentials left out.

    Building one does no I/O (redis-py connects on first use), so it may be built outside the
    event loop; `ping()` fails early when the caller wants to. Pool: `max_connections` bounds a
    blocking pool (a caller waits up to POOL_TIMEOUT_S for a free connection); None leaves it
    unbounded. Every connection has `connection_options()` and no retries of the driver's own
    (`retry=None`): a lost connection is retried by `run` (and the long-lived readers' loops) on
    one bounded schedule, never twice by the driver for a call that must not be sent twice.

    A script is sent as EVALSHA and loaded again by redis-py when the server answers NOSCRIPT
    (its script cache is empty after a restart).

    A `redis+cluster://` URL opens a Redis Cluster client (`cluster` is True) instead, with the
    same options; its per-node pools are unbounded (see `_cluster_client`). `wait_replicas` (0:
    none) is how many replicas must have a write of `replicated_script` before it returns, within
    `wait_timeout_s`."""

    def __init__(  # noqa: PLR0913 (outstanding, issue 27)
        self,
        url: str,
        *,
        what: str,
        unavailable: type[TidegateError],
        scripts: Mapping[str, str] | None = None,
        max_connections: int | None = None,
        decode_responses: bool = False,
        component: str | None = None,
        wait_replicas: int = 0,
        wait_timeout_s: float = WAIT_TIMEOUT_S,
    ) -> None:
        self.url = url
        self.what = what
        self._unavailable = unavailable
        self._errors = driver_errors()
        self.cluster = is_cluster_url(url)
        options = {**connection_options(), "retry": None, "decode_responses": decode_responses}
        self.client: Any = (_cluster_client(url, options) if self.cluster
                            else _server_client(url, max_connections, options))
        self.scripts: dict[str, Any] = {
            name: self.client.register_script(source) for name, source in (scripts or {}).items()
        }
        self._clock = self.client.register_script(_CLOCK_LUA)
        self.outage = Outage(component or what.replace(" ", "_"), url)
        self.wait_replicas = wait_replicas
        self.wait_timeout_s = wait_timeout_s
        self._learnt = not self.cluster  # whether the client knows the cluster's slots yet
        self._slots_lost = False  # a pipeline lost its node: learn the slots again (see _send)

    def __repr__(self) -> str:
        return f"RedisClient({redact_url(self.url)!r}, what={self.what!r})"

    def is_driver_error(self, exc: BaseException) -> bool:
        """Whether `exc` came from the driver or the socket (what `error` translates)."""
        return isinstance(exc, self._errors)

    def error(self, exc: BaseException, doing: str | None = None) -> TidegateError:
        """`exc` as the family's error: "<doing, else what> on <url>: <exc>"."""
        return self._unavailable(f"{doing or self.what} on {redact_url(self.url)}: {exc}")

    async def ping(self) -> None:
        """Reach the server (or the cluster: the client learns its nodes and slots) now; on
        failure close the client and raise the family's error."""
        try:
            await self.client.ping()
            self._learnt = True
        except self._errors as exc:
            await self.client.aclose()
            raise self._unavailable(f"cannot reach {self.what} at {redact_url(self.url)}: {exc}") from exc

    async def learn_slots(self) -> None:
        """On a cluster, make sure the client knows which node serves each slot before the
        first command (a no-op afterwards, and on one server). redis-py learns them lazily, but
        routes the commands that arrive meanwhile as keyless, to any node: their MOVED replies,
        five of them, make it close every connection, under other calls in flight."""
        if not self._learnt:
            await self.client.initialize()
            self._learnt = True

    async def run(self, call: Callable[[], Awaitable[T]], *, retry: bool, doing: str | None = None) -> T:
        """`call()`, sent again across a lost connection for up to RETRY_WITHIN_S when `retry`
        (only for calls harmless to run twice), driver errors translated."""
        try:
            if not self._learnt:
                await call_with_reconnect(self.learn_slots, self.outage,
                                          within_s=RETRY_WITHIN_S if retry else 0.0)
            return await call_with_reconnect(call, self.outage, within_s=RETRY_WITHIN_S if retry else 0.0)
        except self._errors as exc:
            raise self.error(exc, doing) from exc

    async def script(self, name: str, keys: list[str], args: list[Any], *, retry: bool = False) -> Any:
        """Run one registered script; `retry` when running it twice is harmless."""
        return await self.run(lambda: self.scripts[name](keys=keys, args=args), retry=retry,
                              doing=f"{self.what} script {name}")

    async def command(self, *args: Any, retry: bool = False) -> Any:
        """Run one plain Redis command; `retry` when sending it twice is harmless."""
        return await self.run(lambda: self.client.execute_command(*args), retry=retry)

    def script_command(self, name: str, keys: Sequence[Any], args: Sequence[Any]) -> tuple[Any, ...]:
        """Script `name` as one command of a `pipelined` batch: a cluster's pipeline refuses
        redis-py's script objects, and EVALSHA goes through either kind of pipeline."""
        return ("EVALSHA", self.scripts[name].sha, len(keys), *keys, *args)

    async def pipelined(self, commands: Sequence[tuple[Any, ...]]) -> list[Any]:
        """`commands` in one pipeline without MULTI (on a cluster, one per node, each node's in
        order), their replies in order; the first error raised, untranslated. A command a server
        refused with NOSCRIPT (its script cache is empty: a restart, a promoted replica) did not
        run: the scripts are loaded and those commands sent again."""
        replies = await self._send(commands)
        refused = [index for index, reply in enumerate(replies) if _is_noscript(reply)]
        if refused:
            for script in self.scripts.values():
                await self.client.script_load(script.script)  # on a cluster, every master
            for index, reply in zip(refused, await self._send([commands[i] for i in refused]), strict=True):
                replies[index] = reply
        for reply in replies:
            if isinstance(reply, Exception):
                raise reply
        return replies

    async def replicated_script(self, name: str, keys: list[str], args: list[Any]) -> Any:
        """Run script `name`, then `WAIT wait_replicas` on the same connection, so that it returns
        only once that many replicas hold what it wrote: a failover that promotes one of them
        then cannot lose it. Fewer within `wait_timeout_s` raise the family's error (the write
        may be on the master alone). Without `wait_replicas`, the script alone. Driver errors
        are raised untranslated."""
        if not self.wait_replicas:
            return await self.scripts[name](keys=keys, args=args)
        result, acked = await self._send([self.script_command(name, keys, args)], wait_on=keys[0])
        if _is_noscript(result):
            await self.client.script_load(self.scripts[name].script)
            result, acked = await self._send([self.script_command(name, keys, args)], wait_on=keys[0])
        if isinstance(result, Exception):
            raise result
        if isinstance(acked, Exception) or int(acked) < self.wait_replicas:
            confirmed = (f"WAIT failed ({acked})" if isinstance(acked, Exception) else
                         f"{acked} of {self.wait_replicas} replicas confirmed it in {self.wait_timeout_s}s")
            raise self._unavailable(f"{self.what} script {name} on {redact_url(self.url)}: written on the "
                                    f"master, but {confirmed}; a failover now could lose it")
        return result

    async def server_time_ms(self, key: str) -> int:
        """The clock of the server that holds `key`, in ms: on a cluster, of the node serving its
        slot, the clock its scripts read."""
        seconds, micros = await self._clock(keys=[key])
        return int(seconds) * 1000 + int(micros) // 1000

    async def listen(self, channel: str) -> AsyncGenerator[bytes | None, None]:
        """Subscribe to `channel` and yield None each time the subscription stands, then each
        message's data, until the connection is lost (its error propagates: reconnecting is the
        caller's loop). On a cluster the channel is sharded (SSUBSCRIBE; publish with
        `publish_command(url)`, SPUBLISH) and lives on the node serving its slot; the client asks the
        cluster for its slots first, so a listener coming back after a failover finds the new
        master. A slot moving away ends the subscription like a lost connection."""
        pubsub = self.client.pubsub()
        try:
            if not self.cluster:
                await pubsub.subscribe(channel)
                async for message in pubsub.listen():
                    if message["type"] == "subscribe":
                        yield None
                    elif message["type"] == "message":
                        yield message["data"]
                return
            await self.client.nodes_manager.initialize()
            await pubsub.ssubscribe(channel)
            while True:
                message = await pubsub.get_sharded_message(timeout=SHARDED_POLL_S)
                if message is None:
                    if not pubsub.shard_channels:
                        raise _lost(f"sharded subscription to {channel} ended")
                    continue
                kind = message["type"]
                if kind == "ssubscribe":
                    yield None
                elif kind == "smessage":
                    yield message["data"]
                elif kind == "sunsubscribe":
                    # The server unsubscribes us when the slot moves (failover, resharding).
                    raise _lost(f"{channel}'s slot moved to another node")
        finally:
            # Bounded: a close that cannot reach the server must not hold up a reconnect or close.
            with contextlib.suppress(*self._errors, TimeoutError):
                await asyncio.wait_for(pubsub.aclose(), CLOSE_TIMEOUT_S)

    async def follow(self, channel: str, outage: Outage, *, running: Callable[[], bool],
                     on_message: Callable[[bytes], None], on_subscribed: Callable[[], None],
                     on_lost: Callable[[], None] = lambda: None) -> None:
        """`listen` to `channel` for as long as `running()`: each message to `on_message`;
        `on_subscribed` each time the subscription stands (again: what was published while it
        did not arrives never), `on_lost` each time it fell; a lost connection is retried with
        `outage`'s backoff. Cancel the task to stop at once."""
        # Bounded by `running` as well as by cancellation: on Python 3.11 a cancel that lands
        # while the clean-up's wait_for finishes can be lost, and a listener must not outlive its
        # component (reconnecting to a closed pool until the event loop ends).
        while running():
            try:
                async with contextlib.aclosing(self.listen(channel)) as messages:
                    async for data in messages:
                        if data is None:
                            outage.restored()
                            on_subscribed()
                        else:
                            on_message(data)
            except Exception as exc:  # whatever ends it, the listener must not stay dead
                if not running():
                    return
                if not is_connection_error(exc):
                    log.error("%s listener of %s failed: %r; starting it again",
                              outage.component, channel, exc)
                outage.lost(exc)
            finally:
                on_lost()
            await outage.pause()

    async def _send(self, commands: Sequence[tuple[Any, ...]], *, wait_on: str | None = None) -> list[Any]:
        """`commands` in one pipeline without MULTI, errors returned in place; with `wait_on` (a
        key), then `WAIT wait_replicas` on the connection of that key's commands.

        On a cluster, WAIT names no key, so it is sent to the node that serves `wait_on`, where
        the pipeline sends that node's commands on one connection, in order. A cluster pipeline
        that lost its node does not make the client learn the slots again (a plain command
        does): so the next `_send` does, or it would go to the dead node for good."""
        try:
            if self.cluster:
                if self._slots_lost:
                    self._slots_lost = False  # once, whichever of several callers comes first
                    await self.client.nodes_manager.initialize()
                await self.learn_slots()
            sent = list(commands)
            if wait_on is not None:
                wait_ms = max(1, round(self.wait_timeout_s * 1000))
                target = {"target_nodes": self.client.get_node_from_key(wait_on)} if self.cluster else {}
                sent.append(("WAIT", self.wait_replicas, wait_ms, target))
            async with self.client.pipeline(transaction=False) as pipe:
                for command in sent:
                    if isinstance(command[-1], dict):
                        pipe.execute_command(*command[:-1], **command[-1])
                    else:
                        pipe.execute_command(*command)
                replies: list[Any] = await pipe.execute(raise_on_error=False)
        except Exception as exc:
            self._slots_lost = self.cluster and is_connection_error(exc)
            raise
        self._slots_lost = self.cluster and any(
            isinstance(reply, Exception) and is_connection_error(reply) for reply in replies)
        return replies

    async def aclose(self) -> None:
        """Release the pool's connections."""
        await self.client.aclose()


def _is_noscript(reply: Any) -> bool:
    from redis.exceptions import NoScriptError

    return isinstance(reply, NoScriptError)


def _lost(why: str) -> Exception:
    """A subscription that ended without a socket error, as the connection error it amounts to."""
    from redis.exceptions import ConnectionError as RedisConnectionError

    return RedisConnectionError(why)
