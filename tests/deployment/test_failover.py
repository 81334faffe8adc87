"""The final write of ``@idempotent`` across failovers: demoted primaries, unblocked WAITs, restarts.

Every scenario runs on real server processes of its own, redis-server and then
valkey-server (a demotion or a restart would disturb the session's servers), and
counts executions: the function runs once, and every error raised after it
returned carries ``.result``.
A ``FaultProxy`` plays the virtual IP or DNS name a failover moves: connections
already open stay on the old primary, new ones reach the new one.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
import redis.asyncio
from redis.backoff import NoBackoff
from redis.retry import Retry

from goblin_claim import (
    AsyncClaim,
    Claim,
    ClaimLostError,
    ConnectionFailedError,
    ServerError,
    WrongTypeError,
    idempotent,
)
from goblin_claim._clients.errors import is_transient, translate
from goblin_claim._errors import ServerUnavailableError
from tests.conftest import stored, unique
from tests.support import servers
from tests.support.proxy import FaultProxy

# A replica syncs at once instead of after redis-server's default 5 s delay.
FAST_SYNC = ("--repl-diskless-sync-delay", "0")
# The scenarios on servers of their own run on redis-server and again on valkey-server.
SERVERS = ("redis", "valkey")


@pytest.fixture
def pair(redis_server_binary: str) -> Iterator[tuple[servers.RedisProcess, servers.RedisProcess]]:
    """A primary and its replica of this test's own."""
    with servers.primary_with_replica(redis_server_binary, FAST_SYNC) as made:
        yield made


@pytest.fixture
def vip(pair: tuple[servers.RedisProcess, servers.RedisProcess]) -> Iterator[FaultProxy]:
    """The address clients use: a proxy to the primary, moved to the new primary by a failover."""
    with FaultProxy(pair[0].port) as proxy:
        yield proxy


class Run:
    """Decorates a plain body for one kind (a ``def`` with a sync client, an ``async def`` with an asyncio one)."""

    def __init__(self, kind: str, port: int) -> None:
        self.kind = kind
        self.port = port
        self.loop = asyncio.new_event_loop() if kind == "async" else None
        self.client: Any = None
        if self.loop is None:
            self.client = redis.Redis(host=servers.HOST, port=port)
        else:

            async def make() -> Any:
                return redis.asyncio.Redis(host=servers.HOST, port=port)

            self.client = self.loop.run_until_complete(make())

    def decorate(self, body: Callable[[str], str], **options: Any) -> Callable[[str], str]:
        """``body`` under ``@idempotent``, callable from the test's thread."""
        if self.loop is None:
            return idempotent(self.client, key=lambda order: order, **options)(body)

        async def as_async(order: str) -> str:
            return body(order)

        decorated = idempotent(self.client, key=lambda order: order, **options)(as_async)
        loop = self.loop
        return lambda order: loop.run_until_complete(decorated(order))

    def handle(self, key: str, namespace: str) -> Claim:
        """A sync handle on the keys the decorator uses (for their names)."""
        return Claim(redis.Redis(host=servers.HOST, port=self.port), key, namespace=namespace)

    def close(self) -> None:
        """Close the client (and the loop)."""
        if self.loop is None:
            self.client.close()
        else:
            self.loop.run_until_complete(self.client.aclose())
            self.loop.close()


@pytest.fixture(params=["sync", "async"])
def kind(request: pytest.FixtureRequest) -> str:
    """The decorator on a ``def`` and on an ``async def``."""
    return str(request.param)


def _wait_for(condition: Callable[[], object], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.02)


def _promote(new: servers.RedisProcess, old: servers.RedisProcess) -> None:
    """What a failover does: ``new`` becomes the primary, ``old`` its replica."""
    with contextlib.closing(new.client()) as client:
        client.replicaof("NO", "ONE")
    with contextlib.closing(old.client()) as client:
        client.replicaof(servers.HOST, new.port)


def _blocked_in_wait(server: servers.RedisProcess) -> int | None:
    """The id of a client blocked in WAIT on ``server``, if there is one."""
    with contextlib.closing(server.client()) as client:
        for entry in client.client_list():
            if entry.get("cmd") == "wait" and "b" in entry.get("flags", ""):
                return int(entry["id"])
    return None


def _errors_answered(server: servers.RedisProcess, code: str) -> int:
    """How many ``code`` error replies ``server`` has sent (INFO errorstats)."""
    with contextlib.closing(server.client()) as client:
        entry = client.info("errorstats").get(f"errorstat_{code}")
    return int(entry["count"]) if isinstance(entry, dict) else 0


def _wait_replicated(replica: servers.RedisProcess, key: str) -> None:
    """Until ``key`` reached ``replica``."""
    with contextlib.closing(replica.client()) as client:
        _wait_for(lambda: client.exists(key))


def _charged_twice(
    run: Run, body: Callable[[str], str], namespace: str, key: str, stopped: servers.RedisProcess
) -> None:
    """``body`` decorated with replicas=1 answers ``key``'s receipt twice; ``stopped`` is let go on the way out."""
    charge = run.decorate(body, namespace=namespace, lease=20, wait=5, replicas=1, replica_timeout_ms=15000)
    try:
        assert charge(key) == f"receipt {key}"
        assert charge(key) == f"receipt {key}"
    finally:
        stopped.process.send_signal(signal.SIGCONT)
        run.close()


def _assert_receipt_on(server: servers.RedisProcess, run: Run, namespace: str, key: str) -> None:
    """``server`` holds ``key``'s stored receipt."""
    with contextlib.closing(server.client()) as client:
        assert f"receipt {key}".encode() in (stored(client, run.handle(key, namespace)) or b"")


# --------------------------------------------------------------------------- classification


@pytest.mark.parametrize(
    "reply",
    [
        redis.exceptions.ReadOnlyError("You can't write against a read only replica."),
        redis.exceptions.ResponseError("UNBLOCKED client unblocked via CLIENT UNBLOCK"),
        redis.exceptions.BusyLoadingError("Redis is loading the dataset in memory"),
        redis.exceptions.MasterDownError("Link with MASTER is down and replica-serve-stale-data is set to 'no'."),
        redis.exceptions.TryAgainError("Multiple keys request during rehashing of slot"),
        redis.exceptions.ClusterDownError("The cluster is down"),
        redis.exceptions.ResponseError("NOREPLICAS Not enough good replicas to write."),
    ],
)
def test_transient_replies_become_server_unavailable(reply: redis.RedisError) -> None:
    """READONLY, UNBLOCKED, LOADING, MASTERDOWN, TRYAGAIN, CLUSTERDOWN and NOREPLICAS are transient, like a drop."""
    error = translate(reply, "k", "goblin:{k}:claim")
    assert is_transient(reply)
    assert isinstance(error, ServerUnavailableError)
    assert isinstance(error, ConnectionFailedError)


def test_other_refusals_stay_plain_server_errors() -> None:
    """OOM, NOPERM and a script error are not retried: they are ServerError, not ConnectionFailedError."""
    for reply in (
        redis.exceptions.OutOfMemoryError("command not allowed when used memory > 'maxmemory'."),
        redis.exceptions.NoPermissionError("this user has no permissions to run the 'set' command"),
        redis.exceptions.ResponseError("ERR user_script:1: Script attempted to access nonexistent global variable"),
    ):
        error = translate(reply, "k", "goblin:{k}:claim")
        assert not is_transient(reply)
        assert type(error) is ServerError


# --------------------------------------------------------------------------- a demotion while the function runs


def test_demoted_mid_work_the_store_follows_the_new_primary(
    kind: str, pair: tuple[servers.RedisProcess, servers.RedisProcess], vip: FaultProxy
) -> None:
    """The primary is demoted while the function runs: READONLY, reconnect, the result lands on the new primary."""
    old, new = pair
    run = Run(kind, vip.port)
    namespace, key = unique("ns"), unique()
    claim_key = run.handle(key, namespace).claim_key
    runs = []

    def body(order: str) -> str:
        runs.append(order)
        _wait_replicated(new, claim_key)
        _promote(new, old)
        vip.upstream = (servers.HOST, new.port)  # the failover moves the address
        return f"receipt {order}"

    charge = run.decorate(body, namespace=namespace, lease=20, wait=5)
    try:
        assert charge(key) == f"receipt {key}"
        assert charge(key) == f"receipt {key}"  # a duplicate, answered by the new primary
    finally:
        run.close()
    assert runs == [key]
    assert _errors_answered(old, "READONLY") >= 1
    _assert_receipt_on(new, run, namespace, key)


def test_demoted_for_good_the_error_carries_the_result(
    kind: str, pair: tuple[servers.RedisProcess, servers.RedisProcess]
) -> None:
    """A primary demoted for good answers READONLY while the lease lasts; the error that ends it carries the result.

    The claim expires on the new primary about when the retries end, so that error is
    the READONLY or the ClaimLostError of the expired claim the old primary replicated.
    """
    old, new = pair
    run = Run(kind, old.port)
    namespace, key = unique("ns"), unique()
    claim_key = run.handle(key, namespace).claim_key
    runs = []

    def body(order: str) -> str:
        runs.append(order)
        _wait_replicated(new, claim_key)
        _promote(new, old)  # nobody moves the address: the client keeps reaching the old primary
        return f"receipt {order}"

    charge = run.decorate(body, namespace=namespace, lease=2, wait=5)
    started = time.monotonic()
    try:
        with pytest.raises((ConnectionFailedError, ClaimLostError)) as caught:
            charge(key)
    finally:
        run.close()
    assert runs == [key]
    assert caught.value.result == f"receipt {key}"
    if isinstance(caught.value, ConnectionFailedError):
        assert "READONLY" in str(caught.value.__cause__)
    assert time.monotonic() - started >= 1.5  # retried while the lease lasted, not given up at once


# --------------------------------------------------------------------------- an unblocked WAIT


def test_wait_unblocked_by_client_unblock_is_retried(
    kind: str, pair: tuple[servers.RedisProcess, servers.RedisProcess]
) -> None:
    """With replicas=1, a WAIT cut short by CLIENT UNBLOCK ... ERROR is sent again; the result is replicated once."""
    primary, replica = pair
    run = Run(kind, primary.port)
    namespace, key = unique("ns"), unique()
    runs, unblocked = [], []

    def unblock() -> None:
        _wait_for(lambda: _blocked_in_wait(primary) is not None)
        with contextlib.closing(primary.client()) as client:
            unblocked.append(client.execute_command("CLIENT UNBLOCK", _blocked_in_wait(primary), "ERROR"))
        replica.process.send_signal(signal.SIGCONT)

    def body(order: str) -> str:
        runs.append(order)
        replica.process.send_signal(signal.SIGSTOP)  # the store's WAIT blocks
        threading.Thread(target=unblock, daemon=True).start()
        return f"receipt {order}"

    _charged_twice(run, body, namespace, key, stopped=replica)
    assert runs == [key]
    assert unblocked == [True]
    assert _errors_answered(primary, "UNBLOCKED") == 1
    _assert_receipt_on(replica, run, namespace, key)


def test_wait_unblocked_by_a_demotion_lands_on_the_new_primary(
    kind: str, pair: tuple[servers.RedisProcess, servers.RedisProcess], vip: FaultProxy
) -> None:
    """A WAIT unblocked by the primary's demotion (-UNBLOCKED) is retried on the new primary, and replicated there."""
    old, new = pair
    run = Run(kind, vip.port)
    namespace, key = unique("ns"), unique()
    claim_key = run.handle(key, namespace).claim_key
    runs: list[str] = []
    failover_done = threading.Event()

    def failover() -> None:
        _wait_for(lambda: _blocked_in_wait(old) is not None)
        # Demoted first, while the replica cannot acknowledge: the WAIT ends -UNBLOCKED.
        with contextlib.closing(old.client()) as client:
            client.replicaof(servers.HOST, new.port)
        new.process.send_signal(signal.SIGCONT)
        with contextlib.closing(new.client()) as client:
            client.replicaof("NO", "ONE")
        vip.upstream = (servers.HOST, new.port)
        failover_done.set()

    def body(order: str) -> str:
        runs.append(order)
        _wait_replicated(new, claim_key)
        new.process.send_signal(signal.SIGSTOP)  # the store's WAIT blocks on the old primary
        threading.Thread(target=failover, daemon=True).start()
        return f"receipt {order}"

    _charged_twice(run, body, namespace, key, stopped=new)
    assert failover_done.is_set()
    assert _errors_answered(old, "UNBLOCKED") == 1
    assert runs == [key]
    _assert_receipt_on(new, run, namespace, key)


# --------------------------------------------------------------------------- a restart that loads


@pytest.fixture
def slow_loader(redis_server_binary: str) -> Iterator[list[servers.RedisProcess]]:
    """A server whose next start spends seconds loading its RDB, answering LOADING meanwhile.

    A list, so a test can put the restarted process in for the teardown to stop.
    """
    server = servers.start_server(
        redis_server_binary,
        "--enable-debug-command", "local",  # DEBUG POPULATE, for the filler
        "--key-load-delay", "100",  # microseconds per key while loading
        "--loading-process-events-interval-bytes", "1024",  # answer LOADING while it loads
    )  # fmt: skip
    with contextlib.closing(server.client()) as client:
        client.execute_command("DEBUG", "POPULATE", 20000, "filler")
    held = [server]
    yield held
    for process in held:
        process.stop()


def test_loading_after_a_restart_is_waited_out(kind: str, slow_loader: list[servers.RedisProcess]) -> None:
    """The server is killed and restarts while the function runs: LOADING is retried and the result stored once."""
    server = slow_loader[0]
    run = Run(kind, server.port)
    namespace, key = unique("ns"), unique()
    runs, loading = [], []

    def body(order: str) -> str:
        runs.append(order)
        with contextlib.closing(server.client()) as client:
            client.save()  # the claim and the filler, on disk
        server.process.kill()
        server.process.wait(10)
        process = subprocess.Popen(server.args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        slow_loader.append(servers.RedisProcess(server.port, server.directory, process, server.args))

        def says_loading() -> bool:
            # No retries of its own: redis-py's would wait the loading out.
            with contextlib.closing(server.client(socket_timeout=1, retry=Retry(NoBackoff(), 0))) as client:
                try:
                    client.ping()
                except redis.exceptions.BusyLoadingError:
                    loading.append(True)
                    return True
                except redis.ConnectionError:
                    return False
            raise AssertionError("the server loaded before the function returned")

        _wait_for(says_loading)
        return f"receipt {order}"

    charge = run.decorate(body, namespace=namespace, lease=30, wait=5)
    try:
        assert charge(key) == f"receipt {key}"
        assert charge(key) == f"receipt {key}"
    finally:
        run.close()
    assert runs == [key]
    assert loading
    slow_loader.remove(server)  # killed already; its directory goes with the restarted one


# --------------------------------------------------------------------------- the asyncio handle on its own


def test_async_handle_complete_retried_by_the_caller_after_readonly(
    pair: tuple[servers.RedisProcess, servers.RedisProcess], vip: FaultProxy
) -> None:
    """AsyncClaim.complete() answered READONLY raises ServerUnavailableError; sent again after the move, it lands."""
    old, new = pair

    async def scenario() -> None:
        client = redis.asyncio.Redis(host=servers.HOST, port=vip.port)
        try:
            claim = AsyncClaim(client, unique(), lease=20)
            await claim.acquire()
            _wait_replicated(new, claim.claim_key)
            _promote(new, old)
            with pytest.raises(ServerUnavailableError):
                await claim.complete(b"v")
            vip.upstream = (servers.HOST, new.port)
            await claim.complete(b"v")  # the idle connections were dropped: this one reaches the new primary
        finally:
            await client.aclose()

    asyncio.run(scenario())


# --------------------------------------------------------------------------- refusals that are not transient


def test_a_refused_store_carries_the_result(kind: str, redis_standalone: servers.RedisProcess) -> None:
    """A store the server refuses for good (WRONGTYPE here) is not retried, and its error carries the result.

    Someone else's list replaces the claim's one key while the function runs.
    """
    run = Run(kind, redis_standalone.port)
    namespace, key = unique("ns"), unique()
    record_key = run.handle(key, namespace).result_key
    runs = []

    def body(order: str) -> str:
        runs.append(order)
        with contextlib.closing(redis_standalone.client()) as client:
            client.pipeline().delete(record_key).rpush(record_key, b"someone else's list").execute()
        return f"receipt {order}"

    charge = run.decorate(body, namespace=namespace, lease=20, wait=5)
    started = time.monotonic()
    try:
        with pytest.raises(WrongTypeError) as caught:
            charge(key)
    finally:
        run.close()
    assert runs == [key]
    assert caught.value.result == f"receipt {key}"
    assert time.monotonic() - started < 15  # given up at once, not retried through the lease


def test_keep_alive_follows_a_demotion_to_the_new_primary(
    kind: str, pair: tuple[servers.RedisProcess, servers.RedisProcess], vip: FaultProxy
) -> None:
    """Work outliving two leases across a demotion: renewals reconnect past READONLY, the claim holds, it runs once."""
    old, new = pair
    namespace, key = unique("ns"), unique()
    claim_key = Claim(redis.Redis(host=servers.HOST, port=vip.port), key, namespace=namespace).claim_key
    runs = []

    def fail_over() -> None:
        _wait_replicated(new, claim_key)
        _promote(new, old)
        vip.upstream = (servers.HOST, new.port)  # the failover moves the address

    if kind == "sync":
        client: Any = redis.Redis(host=servers.HOST, port=vip.port)

        @idempotent(client, key=lambda order: order, namespace=namespace, lease=3, wait=0)
        def charge(order: str) -> str:
            runs.append(order)
            fail_over()
            time.sleep(7)  # more than two leases: only renewals on the new primary keep the claim
            return f"receipt {order}"

        try:
            assert charge(key) == f"receipt {key}"
            assert charge(key) == f"receipt {key}"
        finally:
            client.close()
    else:

        async def main() -> None:
            client = redis.asyncio.Redis(host=servers.HOST, port=vip.port)

            @idempotent(client, key=lambda order: order, namespace=namespace, lease=3, wait=0)
            async def charge(order: str) -> str:
                runs.append(order)
                await asyncio.to_thread(fail_over)
                await asyncio.sleep(7)
                return f"receipt {order}"

            try:
                assert await charge(key) == f"receipt {key}"
                assert await charge(key) == f"receipt {key}"
            finally:
                await client.aclose()

        asyncio.run(main())
    assert runs == [key]
    assert _errors_answered(old, "READONLY") >= 1  # a renewal did meet the demoted primary
