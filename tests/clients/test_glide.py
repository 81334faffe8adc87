"""GLIDE's own clients, passed in as they are: the decorator, the ASGI door, wake-ups, replicas and faults.

The core and failure-path suites run on the ``glide`` and ``glide-cluster`` backends
(``tests/conftest.py``); this module covers what those suites do not: the adapter's
identity and error mapping, ``@idempotent`` under concurrent callers, the ASGI
middleware, ``wait()``'s push wake-up through GLIDE's pub/sub, ``replicas=`` against
GLIDE's request timeout, the native probe under RESP3, and lost replies and cut
connections through ``tests/support/proxy.py``, counting how often the work runs.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
import redis.exceptions

import goblin_claim
from goblin_claim import (
    AsyncClaim,
    Claim,
    Claimed,
    Completed,
    ConnectionFailedError,
    InvalidArgumentError,
    NotReplicatedError,
    idempotent,
)
from goblin_claim._clients.errors import is_transient
from goblin_claim._clients.families import adapt
from goblin_claim._clients.glide import AsyncGlideAdapter, GlideAdapter, adapter_for
from goblin_claim._clients.kinds import client_kind
from goblin_claim._clients.transport import state_of
from goblin_claim._protocol.refusals import is_unknown_command
from goblin_claim._protocol.scripts import COMPLETE, DEL_KEYS, PEXPIRETIME
from goblin_claim._protocol.scripts import SET_NX_GET as SET_NX_GET_PROBED
from tests.claim.test_wakeup import (  # a poll every 5 s: only a wake-up is quicker
    SlowPollingAsyncClaim,
    SlowPollingClaim,
)
from tests.conftest import IN_CI, Runner, unique
from tests.support import servers
from tests.support.proxy import SET_NX_GET, FaultProxy

try:
    import glide
    import glide_sync
except ImportError:  # pragma: no cover -- the dev group installs both
    if IN_CI:
        raise
    pytest.skip("valkey-glide and valkey-glide-sync are not installed", allow_module_level=True)


def sync_client(port: int, *, cluster: bool = False, timeout_ms: int | None = 2000, protocol: int = 3) -> Any:
    """A glide_sync client on a loopback port (``timeout_ms=None``: GLIDE's default request timeout)."""
    make = glide_sync.GlideClusterClientConfiguration if cluster else glide_sync.GlideClientConfiguration
    version = glide_sync.ProtocolVersion.RESP2 if protocol == 2 else glide_sync.ProtocolVersion.RESP3
    config = make([glide_sync.NodeAddress(servers.HOST, port)], protocol=version, request_timeout=timeout_ms)
    kind = glide_sync.GlideClusterClient if cluster else glide_sync.GlideClient
    return kind.create(config)


async def async_client(port: int, *, cluster: bool = False, timeout_ms: int | None = 2000, protocol: int = 3) -> Any:
    """An asyncio glide client on a loopback port."""
    make = glide.GlideClusterClientConfiguration if cluster else glide.GlideClientConfiguration
    version = glide.ProtocolVersion.RESP2 if protocol == 2 else glide.ProtocolVersion.RESP3
    config = make([glide.NodeAddress(servers.HOST, port)], protocol=version, request_timeout=timeout_ms)
    kind = glide.GlideClusterClient if cluster else glide.GlideClient
    return await kind.create(config)


@pytest.fixture
def run() -> Iterator[Runner]:
    """An event loop for the asyncio clients of one test."""
    runner = Runner()
    yield runner
    runner.close()


@pytest.fixture(params=["standalone", "cluster"])
def topology(request: pytest.FixtureRequest) -> tuple[int, bool]:
    """The session's standalone server or cluster: (a port to reach it, is a cluster)."""
    if request.param == "standalone":
        return request.getfixturevalue("redis_standalone").port, False
    return request.getfixturevalue("redis_cluster")[0].port, True


# --------------------------------------------------------------------------- the adapter


def test_one_adapter_per_client_and_the_right_kind(redis_standalone: Any, run: Runner) -> None:
    """A GLIDE client always gets the same adapter, sync for glide_sync and asyncio for glide."""
    client = sync_client(redis_standalone.port)
    try:
        assert adapter_for(client) is adapter_for(client) is adapt(client)
        assert isinstance(adapt(client), GlideAdapter)
        assert client_kind(adapt(client)) is False
        assert Claim(client, unique())._client is adapt(client)
    finally:
        client.close()
    aclient = run(async_client(redis_standalone.port))
    try:
        assert isinstance(adapt(aclient), AsyncGlideAdapter)
        assert client_kind(adapt(aclient)) is True
        assert AsyncClaim(aclient, unique())._client is adapt(aclient)
        with pytest.raises(TypeError, match="Claim needs a sync client"):
            Claim(aclient, unique())
    finally:
        run(aclient.close())


def test_glide_errors_come_back_as_redis_py_errors(redis_standalone: Any) -> None:
    """Server errors keep their kind: NOSCRIPT, WRONGTYPE, READONLY, an unknown command, a script's own error."""
    adapter = adapt(sync_client(redis_standalone.port))
    key = unique()
    redis_standalone.client().rpush(key, "x")
    try:
        with pytest.raises(redis.exceptions.NoScriptError):
            adapter.execute_command("EVALSHA", "0" * 40, 0)
        with pytest.raises(redis.exceptions.ResponseError, match="WRONGTYPE"):
            adapter.execute_command("GET", key)
        with pytest.raises(redis.exceptions.ReadOnlyError) as readonly:
            adapter.execute_command("EVAL", "return redis.error_reply('READONLY You can not write')", 0)
        assert is_transient(readonly.value)
        with pytest.raises(redis.exceptions.ResponseError) as unblocked:
            adapter.execute_command("EVAL", "return redis.error_reply('UNBLOCKED force unblocked')", 0)
        assert is_transient(unblocked.value)
        with pytest.raises(redis.exceptions.ResponseError) as unknown:
            adapter.execute_command("GOBLIN.CLAIM", key, key, "t", 30)
        assert is_unknown_command(unknown.value)
        with pytest.raises(redis.exceptions.ResponseError, match="invalid expire time"):
            adapter.execute_command("EVAL", "return redis.call('set', KEYS[1], 'v', 'EX', 0)", 1, unique())
        replies = adapter.pipeline().execute_command("GET", key).execute_command("ECHO", "ok").execute(False)
        assert isinstance(replies[0], redis.exceptions.ResponseError)
        assert replies[1] == b"ok"
    finally:
        adapter.glide.close()


# --------------------------------------------------------------------------- @idempotent


def test_idempotent_sync_runs_once_for_concurrent_callers(redis_standalone: Any) -> None:
    """Eight threads call one glide_sync-backed function with one key: it runs once, all get its result."""
    client = sync_client(redis_standalone.port)
    runs: list[str] = []

    @idempotent(client, key="order_id", lease=10, wait=10.0, namespace=unique("ns"))
    def charge(order_id: str) -> dict[str, str]:
        runs.append(order_id)
        time.sleep(0.2)
        return {"receipt": f"r-{order_id}"}

    results: list[Any] = []
    threads = [threading.Thread(target=lambda: results.append(charge("o1"))) for _ in range(8)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(20)
        assert runs == ["o1"]
        assert results == [{"receipt": "r-o1"}] * 8
        assert charge("o1") == {"receipt": "r-o1"}
        assert runs == ["o1"]
    finally:
        client.close()


def test_idempotent_async_runs_once_for_concurrent_tasks(topology: tuple[int, bool], run: Runner) -> None:
    """Twenty tasks await one glide-backed function with one key: it runs once, all get its result."""
    port, cluster = topology

    async def scenario() -> tuple[list[str], list[Any]]:
        client = await async_client(port, cluster=cluster)
        runs: list[str] = []

        @idempotent(client, key="order_id", lease=10, wait=10.0, namespace=unique("ns"))
        async def charge(order_id: str) -> dict[str, str]:
            runs.append(order_id)
            await asyncio.sleep(0.2)
            return {"receipt": f"r-{order_id}"}

        try:
            results = await asyncio.gather(*(charge("o1") for _ in range(20)))
            results.append(await charge("o1"))
            return runs, results
        finally:
            await client.close()

    runs, results = run(scenario())
    assert runs == ["o1"]
    assert results == [{"receipt": "r-o1"}] * 21


# --------------------------------------------------------------------------- the ASGI door


def test_asgi_middleware_replays_with_a_glide_client(redis_standalone: Any, run: Runner) -> None:
    """The ASGI middleware takes a glide client: a repeated Idempotency-Key is replayed, the endpoint runs once."""
    import httpx

    from goblin_claim.asgi import IdempotencyMiddleware

    runs: list[bytes] = []

    async def app(scope: dict[str, Any], receive: Callable[..., Any], send: Callable[..., Any]) -> None:
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        runs.append(body)
        await send({"type": "http.response.start", "status": 201, "headers": [(b"content-type", b"text/plain")]})
        await send({"type": "http.response.body", "body": b"made " + body})

    async def scenario() -> list[httpx.Response]:
        client = await async_client(redis_standalone.port)
        door = IdempotencyMiddleware(app, client=client, namespace=unique("http"))
        key = unique("idem")
        try:
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=door), base_url="http://test") as http:
                return [await http.post("/orders", content=b"tea", headers={"Idempotency-Key": key}) for _ in range(3)]
        finally:
            await client.close()

    answers = run(scenario())
    assert runs == [b"tea"]
    assert [a.status_code for a in answers] == [201, 201, 201]
    assert [a.content for a in answers] == [b"made tea"] * 3
    assert [a.headers.get("idempotent-replayed") for a in answers] == [None, "true", "true"]


def test_wsgi_middleware_replays_with_a_glide_sync_client(redis_standalone: Any) -> None:
    """The WSGI middleware takes a glide_sync client: a repeated Idempotency-Key is replayed, the app runs once."""
    from goblin_claim.wsgi import IdempotencyMiddleware
    from tests.http.test_wsgi_unit import App, call

    client = sync_client(redis_standalone.port)
    app = App()
    door = IdempotencyMiddleware(app, client=client, namespace=unique("wsgi"))
    key = unique("idem")
    try:
        replies = [call(door, b'{"items": ["tea"]}', key) for _ in range(3)]
    finally:
        client.close()
    assert app.runs == 1
    assert [reply.status for reply in replies] == [201, 201, 201]
    assert [reply.headers.get("idempotent-replayed") for reply in replies] == [None, "true", "true"]


# --------------------------------------------------------------------------- wait()


def _wakes(events: list[Any]) -> list[str]:
    return [event.outcome for event in events if event.operation == "wake"]


def test_sync_wait_is_woken_by_glide_pub_sub(topology: tuple[int, bool]) -> None:
    """A glide_sync waiter learns of complete() through GLIDE's pub/sub, long before its next poll."""
    port, cluster = topology
    client = sync_client(port, cluster=cluster)
    key = unique()
    owner = Claim(client, key, lease=30)
    assert isinstance(owner.acquire(), Claimed)
    waiter = SlowPollingClaim(client, key, lease=30)
    outcome: list[Any] = []
    events: list[Any] = []
    goblin_claim.add_listener(events.append)
    try:
        thread = threading.Thread(target=lambda: outcome.append(waiter.wait(timeout=20)))
        thread.start()
        time.sleep(0.5)  # the waiter polled once and subscribed; it sleeps towards its next poll
        started = time.monotonic()
        owner.complete(b"done")
        thread.join(10)
        assert time.monotonic() - started < 2.5
        assert outcome == [Completed(key=key, value=b"done")]
        assert "push" in _wakes(events)
    finally:
        goblin_claim.remove_listener(events.append)
        client.close()


def test_a_resp2_client_is_still_woken_by_push(redis_standalone: Any) -> None:
    """GLIDE's pub/sub needs RESP3: a RESP2 client's waiters get a RESP3 subscriber of their own, and push."""
    client = sync_client(redis_standalone.port, protocol=2)
    key = unique()
    owner = Claim(client, key, lease=30)
    owner.acquire()
    outcome: list[Any] = []
    events: list[Any] = []
    goblin_claim.add_listener(events.append)
    try:
        thread = threading.Thread(target=lambda: outcome.append(SlowPollingClaim(client, key).wait(timeout=20)))
        thread.start()
        time.sleep(0.5)
        owner.complete(b"done")
        thread.join(3)
        assert outcome == [Completed(key=key, value=b"done")]
        assert "push" in _wakes(events)
    finally:
        goblin_claim.remove_listener(events.append)
        client.close()


def test_async_wait_is_woken_by_glide_pub_sub(topology: tuple[int, bool], run: Runner) -> None:
    """An asyncio glide waiter (standalone or cluster client) learns of release() through GLIDE's pub/sub."""
    port, cluster = topology
    events: list[Any] = []

    async def scenario() -> tuple[Any, float]:
        client = await async_client(port, cluster=cluster)
        key = unique()
        try:
            owner = AsyncClaim(client, key, lease=30)
            assert isinstance(await owner.acquire(), Claimed)
            waiter = SlowPollingAsyncClaim(client, key, lease=30)
            task = asyncio.ensure_future(waiter.wait(timeout=20))
            await asyncio.sleep(0.5)
            started = time.monotonic()
            assert await owner.release()
            outcome = await asyncio.wait_for(task, 10)
            return (outcome, waiter.token), time.monotonic() - started
        finally:
            await client.close()

    goblin_claim.add_listener(events.append)
    try:
        (outcome, token), took = run(scenario())
    finally:
        goblin_claim.remove_listener(events.append)
    assert isinstance(outcome, Claimed)
    assert outcome.token == token
    assert took < 2.5
    assert "push" in _wakes(events)


# --------------------------------------------------------------------------- replicas=


def test_replicas_wait_longer_than_glide_request_timeout(redis_replicated: Any, run: Runner) -> None:
    """With GLIDE's default 250 ms request timeout a 400 ms WAIT runs to its end, not into a timeout.

    Too few replicas is NotReplicatedError after the whole WAIT; enough is a claim (its WAIT
    may wait up to 2 s for a loaded machine's replica, and ends as soon as it acknowledges).
    """
    primary, _replica = redis_replicated
    client = sync_client(primary.port, timeout_ms=None)
    try:
        key = unique()
        assert isinstance(Claim(client, key, replicas=1, replica_timeout_ms=2000).acquire(), Claimed)
        started = time.monotonic()
        with pytest.raises(NotReplicatedError) as short:
            Claim(client, unique(), replicas=2, replica_timeout_ms=400).acquire()
        assert time.monotonic() - started >= 0.35  # WAIT waited its whole timeout
        assert short.value.acknowledged == 1
    finally:
        client.close()

    async def scenario() -> None:
        aclient = await async_client(primary.port, timeout_ms=None)
        try:
            handle = AsyncClaim(aclient, unique(), replicas=2, replica_timeout_ms=400)
            with pytest.raises(NotReplicatedError):
                await handle.acquire()
            done = AsyncClaim(aclient, unique(), replicas=1, replica_timeout_ms=2000)
            assert isinstance(await done.acquire(), Claimed)
            await done.complete(b"v")
        finally:
            await aclient.close()

    run(scenario())


# --------------------------------------------------------------------------- the native probe


@pytest.mark.parametrize("protocol", [2, 3])
def test_native_probe_does_not_break_a_resp3_glide_client(redis_native: Any, protocol: int) -> None:
    """On a server with the module, GLIDE (RESP2 and RESP3) finds GOBLIN.CLAIM / GOBLIN.CAD and claims natively.

    Two keys: GOBLIN.CLAIM (one key takes the server's own SET ... NX GET, which the probe finds too).
    """
    client = sync_client(redis_native.port, protocol=protocol)
    raw = redis_native.client()
    try:
        before = raw.info("commandstats").get("cmdstat_goblin.claim", {}).get("calls", 0)
        key = unique()
        handle = Claim.from_keys(client, f"c:{{{key}}}", f"r:{{{key}}}", lease=30)
        assert isinstance(handle.acquire(), Claimed)
        found = frozenset({"GOBLIN.CLAIM", "GOBLIN.CAD", PEXPIRETIME, SET_NX_GET_PROBED, DEL_KEYS})
        assert state_of(adapt(client)).native == found
        assert raw.info("commandstats")["cmdstat_goblin.claim"]["calls"] == before + 1
        assert handle.release()
    finally:
        client.close()


def test_native_commands_on_a_glide_cluster_client(redis_native_cluster: Any) -> None:
    """With the module on every node, GLIDE's cluster client claims and releases natively.

    One key at a time, and in batches whose keys spread over the nodes: the claims of one
    key take the server's own SET ... NX GET, two keys GOBLIN.CLAIM, releases GOBLIN.CAD.
    """
    client = sync_client(redis_native_cluster[0].port, cluster=True)

    def calls(*names: str) -> int:
        stats = [node.client().info("commandstats") for node in redis_native_cluster]
        return sum(s.get(f"cmdstat_{name}", {}).get("calls", 0) for s in stats for name in names)

    try:
        before, sets = calls("goblin.claim", "goblin.cad"), calls("set")
        key = unique()
        one = Claim.from_keys(client, f"c:{{{key}}}", f"r:{{{key}}}", lease=30)
        assert isinstance(one.acquire(), Claimed)
        assert one.release()
        taken = Claim.acquire_many(client, [unique() for _ in range(12)], lease=30)
        assert all(isinstance(outcome, Claimed) for _, outcome in taken)
        assert Claim.release_many(client, [handle for handle, _ in taken]) == [True] * 12
        assert calls("goblin.claim", "goblin.cad") == before + 2 + 12
        assert calls("set") >= sets + 12
    finally:
        client.close()


# --------------------------------------------------------------------------- faults


def test_lost_reply_of_complete_never_reruns_the_work(redis_standalone: Any) -> None:
    """complete()'s reply is lost and the connection cut: the function ran once, its result is kept.

    The decorator's final write succeeds on its re-send; a duplicate gets the result.
    """
    with FaultProxy(redis_standalone.port) as proxy:
        client = sync_client(proxy.port)
        runs: list[str] = []

        @idempotent(client, key="order_id", lease=10, namespace=unique("ns"))
        def charge(order_id: str) -> str:
            runs.append(order_id)
            return f"r-{order_id}"

        try:
            proxy.faults.lose_next_reply(COMPLETE.sha.encode())
            assert charge("o1") == "r-o1"
            assert proxy.faults.lost(COMPLETE.sha.encode()) == 1
            assert charge("o1") == "r-o1"
            assert runs == ["o1"]
        finally:
            client.close()


def test_lost_reply_of_the_claim_then_the_same_handle_is_claimed(redis_standalone: Any, run: Runner) -> None:
    """The claim ran but its reply was lost: acquire() raises, then the same handle is Claimed.

    Its next acquire() is its own claim sent again; another handle sees the claim in flight.
    """
    with FaultProxy(redis_standalone.port) as proxy:

        async def scenario() -> None:
            client = await async_client(proxy.port)
            try:
                handle = AsyncClaim(client, unique(), lease=30)
                await handle.acquire()  # probe and scripts loaded; the claim is taken
                assert await handle.release()
                proxy.faults.lose_next_reply(SET_NX_GET)
                with pytest.raises(ConnectionFailedError):
                    await handle.acquire()
                assert isinstance(await handle.acquire(), Claimed)
                other = await AsyncClaim(client, handle.key, lease=30).acquire()
                assert other.kind == "in_flight"
                # Four claims reached the server (the first, the lost one, its re-send, the other's):
                # GLIDE itself re-sent none.
                assert proxy.faults.count(SET_NX_GET, handle.claim_key.encode()) == 4
            finally:
                await client.close()

        run(scenario())


def test_cut_connection_before_the_claim_claims_nothing_and_recovers(redis_standalone: Any) -> None:
    """The connection is cut before the claim reaches the server: ConnectionFailedError, nothing written.

    GLIDE reconnects by itself, and the next acquire() claims.
    """
    with FaultProxy(redis_standalone.port) as proxy:
        client = sync_client(proxy.port)
        raw = redis_standalone.client()
        try:
            handle = Claim(client, unique(), lease=30)
            Claim(client, unique()).acquire()  # probe and scripts loaded
            proxy.faults.drop_before(SET_NX_GET, handle.claim_key.encode())
            with pytest.raises(ConnectionFailedError):
                handle.acquire()
            assert raw.get(handle.claim_key) is None
            assert proxy.faults.count(handle.claim_key.encode()) == 0
            deadline = time.monotonic() + 5
            while True:  # GLIDE reconnects in the background
                try:
                    outcome = handle.acquire()
                    break
                except ConnectionFailedError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.05)
            assert isinstance(outcome, Claimed)
            assert raw.get(handle.claim_key) == handle.token.encode()
        finally:
            client.close()


def test_script_flush_and_batches_and_keep_alive(topology: tuple[int, bool]) -> None:
    """acquire_many across a SCRIPT FLUSH, keep_alive renewing one claim past its lease, release_many, on glide_sync."""
    port, cluster = topology
    client = sync_client(port, cluster=cluster)
    raw: Any = redis.cluster.RedisCluster(host=servers.HOST, port=port) if cluster else redis.Redis(port=port)
    try:
        keys = [unique() for _ in range(6)]
        Claim(client, unique()).acquire()
        raw.script_flush()
        taken = Claim.acquire_many(client, keys, lease=2)
        assert all(isinstance(outcome, Claimed) for _, outcome in taken)
        first = taken[0][0]
        with first.keep_alive(interval=0.5) as alive:
            time.sleep(2.5)  # past the 2 s lease: renewed
            assert not alive.lost
        assert raw.get(first.claim_key) == first.token.encode()
        # The others were not kept alive: their leases lapsed, and nothing of theirs is left to release.
        assert Claim.release_many(client, [handle for handle, _ in taken]) == [True] + [False] * 5
        assert all(raw.get(handle.claim_key) is None for handle, _ in taken)
    finally:
        client.close()
        raw.close()


def test_replicas_on_a_glide_cluster_wait_on_the_key_primary(redis_cluster: Any) -> None:
    """On a GLIDE cluster client a claim's WAIT goes with it to its key's primary.

    The session's cluster has no replicas, so WAIT counts none there. A batch of claims
    on several slots with replicas= is refused, and claims nothing.
    """
    client = sync_client(redis_cluster[0].port, cluster=True, timeout_ms=None)
    try:
        with pytest.raises(NotReplicatedError) as refused:
            Claim(client, unique(), replicas=1, replica_timeout_ms=300).acquire()
        assert refused.value.acknowledged == 0
        keys = [unique() for _ in range(8)]
        with pytest.raises(InvalidArgumentError, match="needs a standalone client"):
            Claim.acquire_many(client, keys, replicas=1)
        raw = redis.cluster.RedisCluster(host=servers.HOST, port=redis_cluster[0].port)
        try:
            assert all(raw.get(Claim(client, key).claim_key) is None for key in keys)
        finally:
            raw.close()
    finally:
        client.close()
