"""valkey-py's clients on the failure paths where they once broke, sync and asyncio, on real servers.

valkey-py is redis-py's fork with exception classes of its own; each test here is
one way that showed: a flushed script cache (NoScriptError), a key of the wrong
type, a server that is down (for ``wait()``, ``@idempotent``'s final write and the
ASGI middleware), an ACL user without pub/sub, ``ValkeyCluster`` taken for a
standalone client, the direct round trip and its retries, and the command line's
``valkey://`` URLs. The core, failure-path, decorator and fault suites run on
valkey-py too (the ``valkey-py`` backends, tests/conftest.py).
"""

from __future__ import annotations

import asyncio
import io
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import valkey
import valkey.asyncio
import valkey.asyncio.cluster
import valkey.asyncio.retry
import valkey.backoff
import valkey.cluster
import valkey.exceptions
import valkey.retry

import goblin_claim.asgi
from goblin_claim import (
    AsyncClaim,
    Claim,
    Claimed,
    Completed,
    ConnectionFailedError,
    InFlight,
    InvalidArgumentTypeError,
    NotReplicatedError,
    ServerError,
    ServerUnavailableError,
    WrongTypeError,
    idempotent,
)
from goblin_claim._cli.main import main
from goblin_claim._clients.errors import is_transient, translate
from goblin_claim._clients.transport import state_of
from goblin_claim._drivers.wakeup import async_wakeups, wakeups
from goblin_claim._protocol.scripts import SCRIPTS
from tests.conftest import unique
from tests.support import servers
from tests.support.proxy import FaultProxy, Faults
from tests.support.servers import HOST, RedisProcess, start_server

NO_RETRY = valkey.retry.Retry(valkey.backoff.NoBackoff(), 0)


def _no_retry(kind: str) -> Any:
    return valkey.asyncio.retry.Retry(valkey.backoff.NoBackoff(), 0) if kind == "async" else NO_RETRY


class Clients:
    """valkey-py clients of one kind (sync or asyncio) and topology, driven from sync test code."""

    def __init__(self, kind: str, topology: str, port: int) -> None:
        self.kind, self.topology, self.port = kind, topology, port
        self.loop = asyncio.new_event_loop() if kind == "async" else None
        self._made: list[Any] = []

    def run(self, value: Any) -> Any:
        """``value`` itself (sync), or the coroutine run to its end (asyncio)."""
        return value if self.loop is None else self.loop.run_until_complete(value)

    def client(self, **options: Any) -> Any:
        """A new client of this kind on the server."""
        cluster = self.topology == "cluster"

        async def make() -> Any:
            kind = valkey.asyncio.cluster.ValkeyCluster if cluster else valkey.asyncio.Valkey
            return kind(host=HOST, port=self.port, **options)

        if self.loop is None:
            made = (valkey.cluster.ValkeyCluster if cluster else valkey.Valkey)(host=HOST, port=self.port, **options)
        else:
            made = self.run(make())
        self._made.append(made)
        return made

    def claim(self, client: Any, key: str, **options: Any) -> Any:
        """A handle of this kind."""
        return (Claim if self.loop is None else AsyncClaim)(client, key, **options)

    def close(self) -> None:
        """Close every client, then the loop."""
        for client in self._made:
            self.run(client.close() if self.loop is None else client.aclose())
        if self.loop is not None:
            self.loop.close()


@pytest.fixture(params=["sync-standalone", "async-standalone", "sync-cluster", "async-cluster"])
def clients(request: pytest.FixtureRequest) -> Iterator[Clients]:
    """valkey-py's four clients on the session's servers: Valkey, asyncio Valkey and both ValkeyClusters."""
    kind, topology = request.param.split("-")
    if topology == "cluster":
        port = request.getfixturevalue("redis_cluster")[0].port
    else:
        port = request.getfixturevalue("redis_standalone").port
    made = Clients(kind, topology, port)
    yield made
    made.close()


def _flush_scripts(clients: Clients, raw: Any) -> None:
    """SCRIPT FLUSH on every primary (the cluster client sends it to all of them)."""
    raw.script_flush()


def _raw(clients: Clients) -> Any:
    """A sync valkey-py client on the same data, to arrange and inspect it."""
    if clients.topology == "cluster":
        return valkey.cluster.ValkeyCluster(host=HOST, port=clients.port)
    return valkey.Valkey(host=HOST, port=clients.port)


# --------------------------------------------------------------------------- the failures of the issue


def test_script_flush_then_every_operation_works_again(clients: Clients) -> None:
    """After SCRIPT FLUSH the next claim, complete, extend, release and batch run (EVAL once), and keep working."""
    raw = _raw(clients)
    try:
        client = clients.client()
        first = clients.claim(client, unique())
        assert isinstance(clients.run(first.acquire()), Claimed)  # loaded
        for _ in range(2):  # flushed twice: the client is never left broken
            _flush_scripts(clients, raw)
            handle = clients.claim(client, unique())
            assert isinstance(clients.run(handle.acquire()), Claimed)
            _flush_scripts(clients, raw)
            clients.run(handle.extend())
            _flush_scripts(clients, raw)
            clients.run(handle.complete(b"v"))
            assert clients.run(clients.claim(client, handle.key).acquire()) == Completed(key=handle.key, value=b"v")
            _flush_scripts(clients, raw)
            other = clients.claim(client, unique())
            assert isinstance(clients.run(other.acquire()), Claimed)
            _flush_scripts(clients, raw)
            assert clients.run(other.release()) is True
            _flush_scripts(clients, raw)
            kind = Claim if clients.kind == "sync" else AsyncClaim
            batch = clients.run(kind.acquire_many(client, [unique() for _ in range(3)]))
            assert all(isinstance(outcome, Claimed) for _, outcome in batch)
    finally:
        raw.close()


def test_a_key_of_the_wrong_type_is_wrong_type_error(clients: Clients) -> None:
    """Keys holding a set or a hash: WrongTypeError (not valkey-py's ResponseError), with the key; nothing changed.

    The one key holding a set, and (a ``from_keys`` handle, two keys) a result key holding a hash.
    """
    raw = _raw(clients)
    try:
        client = clients.client()
        handle = clients.claim(client, unique())
        raw.sadd(handle.claim_key, "m")
        for action in (handle.extend, handle.release, lambda: handle.complete(b"x")):
            with pytest.raises(WrongTypeError) as info:
                clients.run(action())
            assert info.value.key == handle.key
            assert isinstance(info.value.__cause__, valkey.exceptions.ResponseError)
        assert set(raw.smembers(handle.claim_key)) == {b"m"}
        # A result key of its own holding a hash: only the two keys of from_keys can have one.
        name = unique()
        kind = Claim if clients.kind == "sync" else AsyncClaim
        owner = kind.from_keys(client, f"claim:{{{name}}}", f"result:{{{name}}}")
        assert isinstance(clients.run(owner.acquire()), Claimed)
        raw.hset(owner.result_key, "f", "v")
        with pytest.raises(WrongTypeError):
            clients.run(owner.complete(b"x"))
        assert raw.hgetall(owner.result_key) == {b"f": b"v"}
    finally:
        raw.close()


def test_a_cluster_client_takes_every_path(clients: Clients) -> None:
    """ValkeyCluster is a cluster client: claims, batches, keep-alive, release_many and wait on every node."""
    client = clients.client()
    kind = Claim if clients.kind == "sync" else AsyncClaim
    keys = [unique() for _ in range(12)]  # spread over the three primaries
    batch = clients.run(kind.acquire_many(client, keys, lease=2))
    assert [type(outcome) for _, outcome in batch] == [Claimed] * 12
    handles = [handle for handle, _ in batch]
    assert clients.run(kind.release_many(client, handles[1:])) == [True] * 11
    assert isinstance(clients.run(kind(client, keys[1]).acquire()), Claimed)

    async def keep_async() -> bool:
        async with handles[0].keep_alive(interval=0.2) as keeper:
            await asyncio.sleep(2.3)
        return bool(keeper.lost)

    if clients.kind == "sync":
        with handles[0].keep_alive(interval=0.2) as keeper:
            time.sleep(2.3)  # past the lease: only the renewals keep it
        lost = keeper.lost
    else:
        lost = clients.run(keep_async())
    assert not lost
    assert isinstance(clients.run(kind(client, keys[0]).acquire()), InFlight)
    clients.run(handles[0].complete(b"done"))
    assert clients.run(kind(client, keys[0]).wait(timeout=2)) == Completed(key=keys[0], value=b"done")


def test_replicas_wait_on_the_keys_primary(clients: Clients) -> None:
    """replicas=1 without replicas: NotReplicatedError from the key's own primary, alone and batched, every client."""
    raw = _raw(clients)
    try:
        client = clients.client()
        owner = clients.claim(client, unique(), replicas=1, replica_timeout_ms=100)
        with pytest.raises(NotReplicatedError) as info:
            clients.run(owner.acquire())
        assert info.value.acknowledged == 0
        assert raw.get(owner.claim_key) == owner.token.encode()
        kind = Claim if clients.kind == "sync" else AsyncClaim
        keys = [unique() for _ in range(6)]  # on a cluster, keys of several nodes: a round and a WAIT each
        batch = clients.run(kind.acquire_many(client, keys, replicas=1, replica_timeout_ms=100))
        assert [type(outcome) for _, outcome in batch] == [NotReplicatedError] * len(keys)  # each key's outcome
        assert all(raw.get(handle.claim_key) == handle.token.encode() for handle, _ in batch)
    finally:
        raw.close()


def test_wait_polls_through_refused_connections_to_its_deadline(redis_server_binary: str, kind: str) -> None:
    """The server gone while waiting: wait() polls on to its deadline, then raises ConnectionFailedError."""
    server = start_server(redis_server_binary)
    clients = Clients(kind, "standalone", server.port)
    try:
        client = clients.client(retry=_no_retry(kind), socket_connect_timeout=0.2)
        owner = clients.claim(client, unique())
        assert isinstance(clients.run(owner.acquire()), Claimed)
        server.stop()
        started = time.monotonic()
        with pytest.raises(ConnectionFailedError):
            clients.run(clients.claim(client, owner.key).wait(timeout=0.8))
        assert 0.7 < time.monotonic() - started < 4  # not the first refusal: the whole wait
    finally:
        clients.close()
        server.stop()


def test_wait_polls_through_a_dropped_connection_to_the_result(redis_standalone: RedisProcess, kind: str) -> None:
    """A retry-less waiter whose connections are killed mid-wait keeps polling and gets the result."""
    clients = Clients(kind, "standalone", redis_standalone.port)
    raw = redis_standalone.client()
    try:
        waiter = clients.client(retry=_no_retry(kind))
        key = unique()
        owner = Claim(raw, key)
        assert isinstance(owner.acquire(), Claimed)
        duplicate = clients.claim(waiter, key)
        assert isinstance(clients.run(duplicate.acquire()), InFlight)  # its connection is open now

        def cut_then_complete() -> None:
            time.sleep(0.2)
            raw.execute_command("CLIENT KILL", "TYPE", "normal", "SKIPME", "yes")
            time.sleep(0.3)
            owner.complete(b"v")

        thread = threading.Thread(target=cut_then_complete)
        thread.start()
        try:
            assert clients.run(duplicate.wait(timeout=10)) == Completed(key=key, value=b"v")
        finally:
            thread.join()
    finally:
        clients.close()
        raw.close()


def test_the_decorator_retries_its_final_write_after_a_dropped_connection(
    redis_standalone: RedisProcess, kind: str
) -> None:
    """A retry-less valkey-py client cut while the function runs: the final write is retried, the function ran once."""
    clients = Clients(kind, "standalone", redis_standalone.port)
    killer = redis_standalone.client()
    calls: list[str] = []

    def charge(order_id: str) -> str:
        calls.append(order_id)
        killer.execute_command("CLIENT KILL", "TYPE", "normal", "SKIPME", "yes")  # the decorator's own too
        return f"charged {order_id}"

    async def charge_async(order_id: str) -> str:
        return charge(order_id)

    try:
        client = clients.client(retry=_no_retry(kind))
        options = {"key": "order_id", "namespace": unique("ns"), "keep_alive": False}
        wrapped: Callable[[str], Any] = idempotent(client, **options)(charge if kind == "sync" else charge_async)
        assert clients.run(wrapped("o1")) == "charged o1"
        assert clients.run(wrapped("o1")) == "charged o1"
        assert calls == ["o1"]
    finally:
        clients.close()
        killer.close()


def test_the_asgi_middleware_answers_503_when_the_server_is_down() -> None:
    """valkey.asyncio.Valkey on a port nothing listens on: 503 with Retry-After, and the app never runs."""
    runs: list[int] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        runs.append(1)
        await send({"type": "http.response.start", "status": 201, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    async def main_() -> list[dict[str, Any]]:
        client = valkey.asyncio.Valkey(
            host=HOST, port=servers.free_port(), retry=_no_retry("async"), socket_connect_timeout=1
        )
        middleware = goblin_claim.asgi.IdempotencyMiddleware(app, client=client, namespace=unique("ns"))
        sent: list[dict[str, Any]] = []
        body = [{"type": "http.request", "body": b"{}", "more_body": False}]

        async def receive() -> dict[str, Any]:
            if body:
                return body.pop()
            await asyncio.Event().wait()
            raise AssertionError("unreachable")

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        scope = {
            "type": "http",
            "method": "POST",
            "path": "/orders",
            "query_string": b"",
            "headers": [(b"idempotency-key", b"k-1"), (b"content-type", b"application/json")],
        }
        try:
            await middleware(scope, receive, send)
        finally:
            await client.aclose()
        return sent

    sent = asyncio.run(main_())
    assert sent[0]["status"] == 503
    assert (b"retry-after", b"1") in [(bytes(n), bytes(v)) for n, v in sent[0]["headers"]]
    assert b"unavailable" in b"".join(m.get("body", b"") for m in sent[1:])
    assert runs == []


def test_a_user_without_pub_sub_waits_by_polling(redis_standalone: RedisProcess, kind: str) -> None:
    """An ACL user refused SUBSCRIBE: the refusal is recognised, the waiter polls and gets the result."""
    admin = redis_standalone.client()
    namespace, name, password = unique("acl"), unique("user"), unique("pw")
    rules = ["reset", "on", f">{password}", f"~{namespace}:*", "+@read", "+@write", "+@scripting"]
    admin.execute_command("ACL SETUSER", name, *rules)
    clients = Clients(kind, "standalone", redis_standalone.port)
    try:
        client = clients.client(username=name, password=password)
        key = unique()
        owner = clients.claim(client, key, namespace=namespace)
        assert isinstance(clients.run(owner.acquire()), Claimed)
        waiter = clients.claim(client, key, namespace=namespace)
        if kind == "sync":
            seen: list[object] = []
            thread = threading.Thread(target=lambda: seen.append(waiter.wait(timeout=10)))
            thread.start()
            time.sleep(0.5)  # the subscriber tried and was refused
            owner.complete(b"done")  # its announcement is refused too: still stored
            thread.join(15)
            assert seen == [Completed(key=key, value=b"done")]
            assert wakeups(client)._registry.refused  # type: ignore[union-attr]

        else:

            async def scenario() -> None:
                task = asyncio.create_task(waiter.wait(timeout=10))
                await asyncio.sleep(0.5)
                await owner.complete(b"done")
                assert await asyncio.wait_for(task, 15) == Completed(key=key, value=b"done")
                assert async_wakeups(client)._registry.refused  # type: ignore[union-attr]

            clients.run(scenario())
    finally:
        clients.close()
        admin.acl_deluser(name)
        admin.close()


@pytest.mark.parametrize(
    "reply",
    [
        valkey.exceptions.ReadOnlyError("You can't write against a read only replica."),
        valkey.exceptions.ResponseError("UNBLOCKED client unblocked via CLIENT UNBLOCK"),
        valkey.exceptions.BusyLoadingError("Valkey is loading the dataset in memory"),
        valkey.exceptions.MasterDownError("Link with MASTER is down and replica-serve-stale-data is set to 'no'."),
        valkey.exceptions.TryAgainError("Multiple keys request during rehashing of slot"),
        valkey.exceptions.ClusterDownError("The cluster is down"),
        valkey.exceptions.ResponseError("NOREPLICAS Not enough good replicas to write."),
    ],
    ids=lambda reply: type(reply).__name__,
)
def test_valkey_py_transient_replies_become_server_unavailable(reply: Exception) -> None:
    """valkey-py's READONLY, UNBLOCKED, LOADING, MASTERDOWN, TRYAGAIN, CLUSTERDOWN, NOREPLICAS: transient."""
    assert is_transient(reply)
    assert isinstance(translate(reply, "k", "goblin:{k}:claim"), ServerUnavailableError)


@pytest.mark.parametrize(
    ("reply", "error"),
    [
        (valkey.exceptions.ConnectionError("Connection refused"), ConnectionFailedError),
        (valkey.exceptions.TimeoutError("Timeout reading from socket"), ConnectionFailedError),
        (valkey.exceptions.MaxConnectionsError("Too many connections"), ConnectionFailedError),
        (valkey.exceptions.ResponseError("WRONGTYPE Operation against a key"), WrongTypeError),
        (valkey.exceptions.NoPermissionError("this user has no permissions to run the 'set' command"), ServerError),
        (valkey.exceptions.OutOfMemoryError("command not allowed when used memory > 'maxmemory'."), ServerError),
    ],
    ids=lambda value: type(value).__name__ if isinstance(value, Exception) else value.__name__,
)
def test_valkey_py_errors_are_translated_as_redis_py_ones(reply: Exception, error: type[Exception]) -> None:
    """Connection errors, timeouts, a full pool, WRONGTYPE, NOPERM and OOM: the error redis-py's would give."""
    assert type(translate(reply, "k", "goblin:{k}:claim")) is error
    assert not is_transient(reply)


def test_a_replica_answering_readonly_is_server_unavailable(
    redis_replicated: tuple[RedisProcess, RedisProcess], kind: str
) -> None:
    """A valkey-py client on a replica: READONLY is ServerUnavailableError, not valkey-py's ReadOnlyError."""
    clients = Clients(kind, "standalone", redis_replicated[1].port)
    try:
        with pytest.raises(ServerUnavailableError) as info:
            clients.run(clients.claim(clients.client(), unique()).acquire())
        assert isinstance(info.value.__cause__, valkey.exceptions.ReadOnlyError)
    finally:
        clients.close()


# --------------------------------------------------------------------------- the direct round trip


def test_a_stock_valkey_client_takes_the_direct_round_trip(clients: Clients) -> None:
    """valkey.Valkey and valkey.asyncio.Valkey take the direct path; ValkeyCluster goes through execute_command."""
    client = clients.client()
    clients.run(clients.claim(client, unique()).acquire())
    direct = state_of(client).direct
    if clients.topology == "cluster":
        assert direct is None
    else:
        assert direct is client.connection_pool


def test_a_wrapped_or_single_connection_valkey_client_keeps_execute_command(
    redis_standalone: RedisProcess, kind: str
) -> None:
    """A subclass overriding execute_command, or a single-connection client, is not sent around it."""
    base: Any = valkey.Valkey if kind == "sync" else valkey.asyncio.Valkey
    seen: list[object] = []

    class Spied(base):  # type: ignore[misc, valid-type]
        def execute_command(self, *args: Any, **options: Any) -> Any:
            seen.append(args[0])
            return super().execute_command(*args, **options)

    class AsyncSpied(base):  # type: ignore[misc, valid-type]
        async def execute_command(self, *args: Any, **options: Any) -> Any:
            seen.append(args[0])
            return await super().execute_command(*args, **options)

    clients = Clients(kind, "standalone", redis_standalone.port)

    async def make() -> Any:
        return AsyncSpied(host=HOST, port=redis_standalone.port)

    try:
        spied = Spied(host=HOST, port=redis_standalone.port) if kind == "sync" else clients.run(make())
        single = clients.client(single_connection_client=True)
        for client in (spied, single):
            assert isinstance(clients.run(clients.claim(client, unique()).acquire()), Claimed)
            assert state_of(client).direct is None
        assert "SET" in seen  # the claim: Redis 7's SET ... NX GET
        clients.run(spied.close() if kind == "sync" else spied.aclose())
    finally:
        clients.close()


@pytest.mark.parametrize("kind", ["sync", "async"])
@pytest.mark.parametrize("listed", [False, True], ids=["retry-unlisted", "retry-listed"])
def test_the_direct_path_retries_what_valkey_py_would_retry(
    redis_standalone: RedisProcess, kind: str, listed: bool
) -> None:
    """A cut connection: retried where retry_on_error lists the error (as valkey-py's execute_command), else raised."""
    faults = Faults()
    with FaultProxy(redis_standalone.port, faults) as proxy:
        clients = Clients(kind, "standalone", proxy.port)
        try:
            retry_class = valkey.asyncio.retry.Retry if kind == "async" else valkey.retry.Retry
            options: dict[str, Any] = {"retry": retry_class(valkey.backoff.NoBackoff(), 2)}
            if listed:
                options["retry_on_error"] = [valkey.exceptions.ConnectionError]
            client = clients.client(**options)
            clients.run(clients.claim(client, unique()).acquire())  # probed and loaded
            assert state_of(client).direct is not None
            handle = clients.claim(client, unique())
            faults.drop_before(handle.claim_key.encode())
            if listed:
                assert isinstance(clients.run(handle.acquire()), Claimed)
                assert (faults.dropped(handle.claim_key.encode()), faults.count(handle.claim_key.encode())) == (1, 1)
            else:
                with pytest.raises(ConnectionFailedError):
                    clients.run(handle.acquire())
                # Cut once and never sent again.
                assert (faults.dropped(handle.claim_key.encode()), faults.count(handle.claim_key.encode())) == (1, 0)
        finally:
            clients.close()


# --------------------------------------------------------------------------- messages and the command line


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_client_of_the_wrong_kind_is_told_every_family(kind: str) -> None:
    """A client of the wrong kind is told the clients of the right kind: redis-py's, valkey-py's and GLIDE's."""

    async def make() -> Any:
        return valkey.asyncio.Valkey(host=HOST, port=servers.free_port())

    if kind == "sync":
        with pytest.raises(InvalidArgumentTypeError) as info:
            AsyncClaim(valkey.Valkey(host=HOST, port=servers.free_port()), "k")
        for name in ("redis.asyncio.Redis", "valkey.asyncio.Valkey", "valkey.asyncio.cluster.ValkeyCluster", "glide"):
            assert name in str(info.value)
    else:
        client = asyncio.run(make())
        with pytest.raises(InvalidArgumentTypeError) as info:
            Claim(client, "k")
        for name in ("redis.Redis", "valkey.Valkey", "valkey.cluster.ValkeyCluster", "glide_sync.GlideClient"):
            assert name in str(info.value)


def _cli(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    status = main(list(argv), out=out)
    return status, out.getvalue()


def test_the_command_takes_valkey_urls(redis_standalone: RedisProcess) -> None:
    """doctor, inspect and forget with a valkey:// URL connect through valkey-py and work as with redis://."""
    ns = unique("ns")
    target = f"valkey://{HOST}:{redis_standalone.port}/0"
    raw = redis_standalone.client()
    try:
        status, text = _cli("doctor", "--url", target, "--namespace", ns, "--ephemeral")
        assert status == 0, text
        assert f"the {len(SCRIPTS)} Lua scripts load" in text
        owner = Claim(raw, "evt88", namespace=ns, token="worker-3")
        assert isinstance(owner.acquire(), Claimed)
        status, text = _cli("inspect", "evt88", "--namespace", ns, "--url", target)
        assert status == 0, text
        assert "held by 'worker-3'" in text
        status, text = _cli("forget", "evt88", "--namespace", ns, "--url", target)
        assert status == 0, text
        assert raw.exists(owner.claim_key) == 0
    finally:
        raw.close()


def test_the_command_takes_a_valkey_url_of_a_cluster(redis_cluster: list[RedisProcess]) -> None:
    """A valkey:// URL of a cluster node: a ValkeyCluster, every primary checked."""
    status, text = _cli("doctor", "--url", f"valkey://{HOST}:{redis_cluster[0].port}/0", "--ephemeral")
    assert status == 0, text
    assert "a cluster of 3 primaries" in text


def test_an_unreachable_valkey_url_exits_1() -> None:
    """No server at a valkey:// URL: exit 1 with what to check, as for redis://."""
    status, text = _cli("doctor", "--url", f"valkey://{HOST}:{servers.free_port()}/0")
    assert status == 1
    assert "cannot connect" in text


def test_a_valkey_url_without_valkey_py_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    """valkey-py missing: a valkey:// URL is refused before connecting, naming the extra to install."""
    for name in ("valkey", "valkey.cluster"):
        monkeypatch.setitem(sys.modules, name, None)  # import fails as if not installed
    status, text = _cli("doctor", "--url", f"valkeys://{HOST}:{servers.free_port()}/0")
    assert status == 1
    assert "valkeys:// URLs need valkey-py: pip install 'goblin-claim[valkey]'" in text


def test_django_takes_a_valkey_url(redis_standalone: RedisProcess) -> None:
    """The Django setting's client as a valkey:// URL: valkey-py's clients (a blocking pool for ASGI)."""
    from goblin_claim.django import _url_clients

    sync_class, async_class, async_pool = _url_clients(f"valkey://{HOST}:{redis_standalone.port}/0", "client")
    assert (sync_class, async_class, async_pool) == (
        valkey.Valkey,
        valkey.asyncio.Valkey,
        valkey.asyncio.BlockingConnectionPool,
    )
    client = sync_class.from_url(f"valkey://{HOST}:{redis_standalone.port}/0")
    try:
        assert isinstance(Claim(client, unique()).acquire(), Claimed)
    finally:
        client.close()


@pytest.fixture(params=["sync", "async"])
def kind(request: pytest.FixtureRequest) -> str:
    """The driver: Claim with valkey.Valkey, or AsyncClaim with valkey.asyncio.Valkey."""
    return str(request.param)


# --------------------------------------------------------------------------- goblin_claim.testing


@pytest.mark.parametrize("native", [False, True], ids=["scripts", "native"])
def test_the_valkey_fakes_take_both_paths(native: bool) -> None:
    """``fake_valkey`` / ``fake_async_valkey`` are valkey-py clients, on the path asked for."""
    from goblin_claim._protocol.scripts import NATIVE_COMMANDS
    from goblin_claim.testing import fake_async_valkey, fake_valkey

    client = fake_valkey(native)
    assert isinstance(client, valkey.Valkey)
    runs: list[str] = []

    @idempotent(client, key=lambda order: order)
    def charge(order: str) -> str:
        runs.append(order)
        return f"charged {order}"

    key = unique("fake-valkey")
    assert charge(key) == charge(key) == f"charged {key}"
    assert runs == [key]
    assert (state_of(client).native or frozenset()).issuperset(NATIVE_COMMANDS) is native

    async def main() -> None:
        aclient = fake_async_valkey(native)
        assert isinstance(aclient, valkey.asyncio.Valkey)
        handle = AsyncClaim(aclient, key)
        assert isinstance(await handle.acquire(), Claimed)
        await handle.complete(b"done")
        again = await AsyncClaim(aclient, key).acquire()
        assert isinstance(again, Completed)
        assert again.value == b"done"
        assert (state_of(aclient).native or frozenset()).issuperset(NATIVE_COMMANDS) is native
        await aclient.aclose()

    asyncio.run(main())
    client.close()


def test_a_reader_closed_under_a_read_is_a_connection_failure() -> None:
    """valkey-py's "Buffer is closed." (its asyncio reader torn down mid-read) is transient, like redis-py's OSError."""
    error = translate(valkey.exceptions.ValkeyError("Buffer is closed."), "k", "goblin:{k}")
    assert isinstance(error, ConnectionFailedError)
    assert not isinstance(translate(valkey.exceptions.ValkeyError("something else"), "k", "k"), ConnectionFailedError)
