"""Claims on a Redis Cluster that changes shape: slots that move or migrate, connections killed under the client.

Every test runs on a real cluster of three primaries with a replica each
(``servers.cluster_with_replicas``), on redis-server and on valkey-server, one
cluster per module and server kind; a test that moves a slot moves one of its own
keys and leaves every slot owned by a primary when it ends. Slots are moved by
hand, as ``redis-cli --cluster reshard`` does it: ``SETSLOT IMPORTING`` on the
target, ``MIGRATING`` on the source, ``MIGRATE`` of the keys, then ``SETSLOT NODE``
on every primary.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import signal
import threading
import time
import types
from collections.abc import AsyncIterator, Callable, Iterator

import httpx
import pytest
import redis
import redis.asyncio.cluster
import redis.cluster
from redis.crc import key_slot

from goblin_claim import (
    AsyncClaim,
    Claim,
    Claimed,
    Completed,
    ConnectionFailedError,
    GoblinClaimError,
    ServerUnavailableError,
    idempotent,
)
from goblin_claim._clients.errors import raised_by_client, translate
from goblin_claim._clients.transport import pack
from tests.conftest import Backend, aclose, glide_backend, missing, unique, valkey_py_backend
from tests.support import servers

pytestmark = pytest.mark.slow


def _binary(kind: str) -> str:
    found = servers.redis_server_binary() if kind == "redis" else servers.valkey_server_binary()
    if found is None:
        missing(f"{kind} server binary not found (make redis-server / make valkey-server)")
    return found


@pytest.fixture(scope="module", params=["redis", "valkey"])
def shaped(request: pytest.FixtureRequest) -> Iterator[servers.ReplicatedCluster]:
    """A 3+3 cluster of the given server kind, whole at the start of every test."""
    with servers.cluster_with_replicas(_binary(request.param), primaries=3, replicas_per_primary=1) as group:
        yield group


@pytest.fixture
def cluster(shaped: servers.ReplicatedCluster) -> Iterator[servers.ReplicatedCluster]:
    """The module's cluster, checked whole before and after the test."""
    shaped.wait_healthy(timeout=60)
    yield shaped
    shaped.wait_healthy(timeout=60)


def _sync_client(group: servers.ReplicatedCluster) -> redis.cluster.RedisCluster:
    return redis.cluster.RedisCluster(host=servers.HOST, port=group.nodes[0].port, socket_timeout=5)


def _async_client(group: servers.ReplicatedCluster) -> redis.asyncio.cluster.RedisCluster:
    return redis.asyncio.cluster.RedisCluster(
        host=servers.HOST, port=group.nodes[0].port, socket_timeout=5, max_connections=1000
    )


class _Move:
    """One slot's move from its owner to another primary, step by step."""

    def __init__(self, group: servers.ReplicatedCluster, key: str) -> None:
        self.group = group
        self.slot = key_slot(key.encode())
        self.source = group.owner_of(self.slot)
        self.target = next(node for node in group.primaries() if node.node_id != self.source.node_id)

    def begin(self) -> None:
        """Mark the slot importing on the target and migrating on the source."""
        with contextlib.closing(self.target.client()) as target:
            target.execute_command("CLUSTER SETSLOT", self.slot, "IMPORTING", self.source.node_id)
        with contextlib.closing(self.source.client()) as source:
            source.execute_command("CLUSTER SETSLOT", self.slot, "MIGRATING", self.target.node_id)

    def migrate(self, *keys: str) -> None:
        """MIGRATE ``keys`` (all of the slot's when none are given) to the target."""
        with contextlib.closing(self.source.client()) as source:
            found = source.execute_command("CLUSTER GETKEYSINSLOT", self.slot, 1000)
            names = list(keys) or [k if isinstance(k, str) else k.decode() for k in found]
            if names:
                source.execute_command("MIGRATE", servers.HOST, self.target.port, "", 0, 5000, "KEYS", *names)

    def finish(self) -> None:
        """Move the rest of the slot's keys and give the slot to the target on every primary."""
        self.migrate()
        for node in self.group.primaries():
            with contextlib.closing(node.client()) as client:
                client.execute_command("CLUSTER SETSLOT", self.slot, "NODE", self.target.node_id)
        deadline = time.monotonic() + 20
        while self.group.owner_of(self.slot).node_id != self.target.node_id or self.group.problems():
            assert time.monotonic() < deadline, "the slot's move did not settle"
            time.sleep(0.05)


def test_sync_replicas_follow_a_moved_slot(cluster: servers.ReplicatedCluster) -> None:
    """After the key's slot moved, replicas=1 sends claim and complete to the new owner, WAIT counting its replica."""
    client = _sync_client(cluster)
    try:
        key = unique()
        warm = Claim(client, unique(), replicas=1, replica_timeout_ms=2000)
        assert isinstance(warm.acquire(), Claimed)  # the client's slot table is loaded before the move
        move = _Move(cluster, f"goblin:{{{key}}}")
        move.begin()
        move.finish()
        owner = Claim(client, key, replicas=1, replica_timeout_ms=2000)
        assert isinstance(owner.acquire(), Claimed)
        owner.complete("done")
        with contextlib.closing(move.target.client()) as target:
            assert target.exists(owner.claim_key) == 1
        assert Claim(client, key, replicas=1, replica_timeout_ms=2000).acquire() == Completed(key=key, value=b"done")
        # Every later call on that slot works too: the table was corrected, not worked around once.
        for _ in range(5):
            again = Claim(client, unique() + key, replicas=1, replica_timeout_ms=2000)
            assert isinstance(again.acquire(), Claimed)
    finally:
        client.close()


def test_sync_replicas_follow_ask_mid_migration(cluster: servers.ReplicatedCluster) -> None:
    """Mid-migration, with the record already moved, complete() goes to the importing node behind ASKING."""
    client = _sync_client(cluster)
    try:
        key = unique()
        owner = Claim(client, key, replicas=1, replica_timeout_ms=2000)
        assert isinstance(owner.acquire(), Claimed)
        move = _Move(cluster, owner.claim_key)
        move.begin()
        move.migrate(owner.claim_key)  # the source now answers ASK for it
        try:
            owner.complete("done")
            with contextlib.closing(move.target.client()) as target:
                target.execute_command("ASKING")
                assert target.get(owner.claim_key) is not None
        finally:
            move.finish()
        assert Claim(client, key).acquire() == Completed(key=key, value=b"done")
    finally:
        client.close()


def test_async_replicas_on_a_cluster_follow_a_moved_slot(cluster: servers.ReplicatedCluster) -> None:
    """The asyncio cluster client takes replicas=: WAIT counts the replica, and a moved slot is followed."""

    async def scenario() -> None:
        client = _async_client(cluster)
        try:
            key = unique()
            first = AsyncClaim(client, unique(), replicas=1, replica_timeout_ms=2000)
            assert isinstance(await first.acquire(), Claimed)
            move = _Move(cluster, f"goblin:{{{key}}}")
            await asyncio.to_thread(move.begin)
            await asyncio.to_thread(move.finish)
            owner = AsyncClaim(client, key, replicas=1, replica_timeout_ms=2000)
            assert isinstance(await owner.acquire(), Claimed)
            await owner.complete("done")
            again = AsyncClaim(client, key, replicas=1, replica_timeout_ms=2000)
            assert await again.acquire() == Completed(key=key, value=b"done")
        finally:
            await client.aclose()

    asyncio.run(scenario())


def test_acquire_many_with_replicas_waits_once_per_node(cluster: servers.ReplicatedCluster) -> None:
    """acquire_many(replicas=1) on a cluster claims keys of every node, each node's WAIT counting its replica."""
    client = _sync_client(cluster)
    try:
        keys = [unique() for _ in range(30)]
        got = Claim.acquire_many(client, keys, replicas=1, replica_timeout_ms=2000)
        assert [type(outcome) for _, outcome in got] == [Claimed] * len(keys)
        nodes = {client.get_node_from_key(handle.claim_key).name for handle, _ in got}
        assert len(nodes) == 3
        for handle, _ in got:
            handle.complete("v")
        again = Claim.acquire_many(client, keys, replicas=1, replica_timeout_ms=2000)
        assert [outcome for _, outcome in again] == [Completed(key=k, value=b"v") for k in keys]
    finally:
        client.close()


def test_async_acquire_many_with_replicas_follows_a_moved_slot(cluster: servers.ReplicatedCluster) -> None:
    """The asyncio acquire_many(replicas=1) claims a key whose slot moved after the client loaded its table."""

    async def scenario() -> None:
        client = _async_client(cluster)
        try:
            keys = [unique() for _ in range(12)]
            await client.initialize()
            move = _Move(cluster, f"goblin:{{{keys[0]}}}")
            await asyncio.to_thread(move.begin)
            await asyncio.to_thread(move.finish)
            got = await AsyncClaim.acquire_many(client, keys, replicas=1, replica_timeout_ms=2000)
            assert [type(outcome) for _, outcome in got] == [Claimed] * len(keys)
        finally:
            await client.aclose()

    asyncio.run(scenario())


def _split_fenced(cluster: servers.ReplicatedCluster, claim: Claim | AsyncClaim, held_ms: int) -> _Move:
    """Begin moving ``claim``'s slot with its record moved and its fence counter not: TRYAGAIN for both together.

    The record is another holder's claim for ``held_ms``; the counter stands at 1.
    """
    move = _Move(cluster, claim.claim_key)
    with contextlib.closing(move.source.client()) as source:
        source.incr(claim._fence_key)  # type: ignore[arg-type]
        source.set(claim.claim_key, "someone-else", px=held_ms)
    move.begin()
    move.migrate(claim.claim_key)
    return move


def _fail_over(cluster: servers.ReplicatedCluster) -> None:
    """A manual CLUSTER FAILOVER of the first primary's replica, waited for until the cluster is whole again."""
    primary = cluster.primaries()[0]
    replica = cluster.replicas_of(primary)[0]
    with contextlib.closing(replica.client()) as client:
        client.execute_command("CLUSTER FAILOVER")
    deadline = time.monotonic() + 30
    while not cluster.view()[replica.node_id].is_primary or cluster.problems():
        assert time.monotonic() < deadline, "the failover did not settle"
        time.sleep(0.05)


@pytest.mark.parametrize("flavour", ["sync", "asyncio"])
def test_acquire_many_with_replicas_follows_a_failover(cluster: servers.ReplicatedCluster, flavour: str) -> None:
    """After a failover the client has not seen, acquire_many(replicas=1) claims every key (the demoted node's too)."""
    keys = [unique() for _ in range(40)]
    if flavour == "sync":
        with contextlib.closing(_sync_client(cluster)) as client:
            Claim.acquire_many(client, [unique() for _ in range(10)], replicas=1, replica_timeout_ms=2000)
            _fail_over(cluster)
            got = Claim.acquire_many(client, keys, replicas=1, replica_timeout_ms=2000)
    else:

        async def scenario() -> list[tuple[AsyncClaim, object]]:
            client = _async_client(cluster)
            try:
                await AsyncClaim.acquire_many(
                    client, [unique() for _ in range(10)], replicas=1, replica_timeout_ms=2000
                )
                await asyncio.to_thread(_fail_over, cluster)
                return await AsyncClaim.acquire_many(client, keys, replicas=1, replica_timeout_ms=2000)  # type: ignore[return-value]
            finally:
                await client.aclose()

        got = asyncio.run(scenario())  # type: ignore[assignment]
    assert [type(outcome) for _, outcome in got] == [Claimed] * len(keys)


@pytest.mark.parametrize("flavour", ["sync", "asyncio"])
def test_fenced_claim_in_a_migrating_slot_waits_for_the_move(cluster: servers.ReplicatedCluster, flavour: str) -> None:
    """A fenced acquire() meeting TRYAGAIN (record moved, fence counter not) is sent again until the move ends."""
    key = unique()
    with contextlib.closing(_sync_client(cluster)) as client:
        move = _split_fenced(cluster, Claim(client, key, fencing=True), held_ms=300)
    finisher = threading.Timer(1.0, move.finish)
    started = time.monotonic()
    finisher.start()
    try:
        if flavour == "sync":
            with contextlib.closing(_sync_client(cluster)) as client:
                outcome = Claim(client, key, fencing=True, lease=10).acquire()
        else:

            async def scenario() -> object:
                client = _async_client(cluster)
                try:
                    return await AsyncClaim(client, key, fencing=True, lease=10).acquire()
                finally:
                    await client.aclose()

            outcome = asyncio.run(scenario())
    finally:
        finisher.join()
    assert isinstance(outcome, Claimed)
    assert outcome.fence == 2
    assert 0.9 < time.monotonic() - started < 10


@pytest.mark.parametrize("flavour", ["sync", "asyncio"])
def test_fenced_complete_in_a_migrating_slot_is_stored_once_the_move_ends(
    cluster: servers.ReplicatedCluster, flavour: str
) -> None:
    """complete() of a fenced claim whose record moved ahead of its counter (TRYAGAIN) is sent again and stored."""
    key = unique()

    async def complete_async(port_key: str) -> None:
        client = _async_client(cluster)
        try:
            owner = AsyncClaim(client, port_key, fencing=True, lease=10)
            assert isinstance(await owner.acquire(), Claimed)
            move = await asyncio.to_thread(_split_own, owner)
            finisher = threading.Timer(1.0, move.finish)
            finisher.start()
            try:
                await owner.complete("done")
            finally:
                await asyncio.to_thread(finisher.join)
        finally:
            await client.aclose()

    def _split_own(owner: Claim | AsyncClaim) -> _Move:
        move = _Move(cluster, owner.claim_key)
        move.begin()
        move.migrate(owner.claim_key)  # the record went, its fence counter stays behind
        return move

    started = time.monotonic()
    if flavour == "sync":
        with contextlib.closing(_sync_client(cluster)) as client:
            owner = Claim(client, key, fencing=True, lease=10)
            assert isinstance(owner.acquire(), Claimed)
            move = _split_own(owner)
            finisher = threading.Timer(1.0, move.finish)
            finisher.start()
            try:
                owner.complete("done")
            finally:
                finisher.join()
    else:
        asyncio.run(complete_async(key))
    assert time.monotonic() - started > 0.9  # it did wait for the move
    with contextlib.closing(_sync_client(cluster)) as client:
        assert Claim(client, key).acquire() == Completed(key=key, value=b"done")


def test_migration_that_outlasts_the_lease_is_server_unavailable(cluster: servers.ReplicatedCluster) -> None:
    """A fenced claim's TRYAGAIN that lasts past the lease raises ServerUnavailableError, retried no longer."""
    with contextlib.closing(_sync_client(cluster)) as client:
        claim = Claim(client, unique(), fencing=True, lease=1)
        move = _split_fenced(cluster, claim, held_ms=30_000)
        try:
            started = time.monotonic()
            with pytest.raises(ServerUnavailableError) as info:
                claim.acquire()
            assert 0.9 < time.monotonic() - started < 6
            assert "TRYAGAIN" in str(info.value) or "TTL exhausted" in str(info.value)
        finally:
            move.finish()


def test_a_client_library_failure_is_a_connection_failure() -> None:
    """An exception raised inside a client library's code (not one of its classes) is ConnectionFailedError."""

    async def write_on_a_closed_connection() -> None:
        connection = redis.asyncio.Connection()
        connection._writer = types.SimpleNamespace()  # a writer with nothing on it: AttributeError inside redis-py
        try:
            await connection._send_packed_command([b"PING\r\n"])
        finally:
            connection._writer = None  # nothing was opened: no "unclosed Connection" warning when it is collected

    with pytest.raises(AttributeError) as info:
        asyncio.run(write_on_a_closed_connection())
    assert raised_by_client(info.value)
    error = translate(info.value, "k", "goblin:{k}")
    assert type(error) is ConnectionFailedError
    assert "AttributeError" in str(error)


def test_our_own_bug_is_not_taken_for_the_clients() -> None:
    """An exception raised in goblin-claim's own code, even called back from the client's, stays what it is."""
    connection = redis.Connection()
    with pytest.raises(TypeError) as info:
        # pack() refuses an argument kind the SDK never sends, from inside redis-py's Retry.
        connection.retry.call_with_retry(lambda: pack(("GET", object()), connection.encoder), lambda _: None)
    assert not raised_by_client(info.value)
    with pytest.raises(redis.exceptions.ConnectionError) as refused:
        redis.Redis(port=servers.free_port(), socket_connect_timeout=0.5, retry=None).ping()
    assert raised_by_client(refused.value)


FAMILIES = ["redis-py", "valkey-py", "glide"]


def _family(name: str, group: servers.ReplicatedCluster) -> Backend:
    """The makers of sync and asyncio cluster clients of one client family, on ``group``."""
    port = group.nodes[0].port
    if name == "glide":
        return glide_backend(name, servers.HOST, port, cluster=True)
    if name == "valkey-py":
        return valkey_py_backend(name, servers.HOST, port, cluster=True)
    return Backend(
        name,
        native=False,
        make_sync=lambda **kw: redis.cluster.RedisCluster(host=servers.HOST, port=port, **kw),
        make_async=lambda **kw: redis.asyncio.cluster.RedisCluster(
            host=servers.HOST, port=port, max_connections=1000, **kw
        ),
        is_cluster=True,
        is_server=True,
    )


class _Storm:
    """150 asyncio tasks and 32 threads calling an ``@idempotent`` function on fresh and repeated keys.

    Counts the runs per key and sorts every exception a caller saw into typed
    (``GoblinClaimError``) and not.
    """

    def __init__(self, family: Backend) -> None:
        self.family = family
        self.lock = threading.Lock()
        self.runs: dict[str, int] = {}
        self.typed: list[GoblinClaimError] = []
        self.untyped: list[BaseException] = []
        self.calls = 0
        self.ready = threading.Event()  # both clients made: faults may begin
        self.sync_client = family.make_sync()

    def _work(self, key: str) -> str:
        with self.lock:
            self.runs[key] = self.runs.get(key, 0) + 1
        return f"ran {key}"

    def _tally(self, exc: BaseException | None) -> None:
        with self.lock:
            self.calls += 1
            if isinstance(exc, GoblinClaimError):
                self.typed.append(exc)
            elif exc is not None:
                self.untyped.append(exc)

    async def _tasks(self, deadline: float) -> None:
        made = self.family.make_async()
        client = await made if asyncio.iscoroutine(made) else made
        if hasattr(client, "initialize"):
            await client.initialize()  # its slot table, before the faults
        self.ready.set()

        @idempotent(client, key="key", namespace=unique("storm"), lease=10)
        async def once(key: str) -> str:
            return self._work(key)

        async def one(index: int) -> None:
            while time.monotonic() < deadline:
                try:
                    await once(f"a{index}-{int(time.monotonic() * 4)}")
                    self._tally(None)
                except Exception as exc:
                    self._tally(exc)
                    await asyncio.sleep(0.05)

        try:
            await asyncio.gather(*(one(i) for i in range(150)))
        finally:
            await aclose(client)

    def _threads(self, deadline: float) -> None:
        client = self.sync_client

        @idempotent(client, key="key", namespace=unique("storm"), lease=10)
        def once(key: str) -> str:
            return self._work(key)

        def one(index: int) -> None:
            while time.monotonic() < deadline:
                try:
                    once(f"s{index}-{int(time.monotonic() * 4)}")
                    self._tally(None)
                except Exception as exc:
                    self._tally(exc)
                    time.sleep(0.05)

        workers = [threading.Thread(target=one, args=(i,)) for i in range(32)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        client.close()

    def run(self, seconds: float, faults: Callable[[], None]) -> None:
        """Call for ``seconds`` from both sides at once, ``faults`` running in a thread once both clients are made."""
        deadline = time.monotonic() + seconds
        sync_side = threading.Thread(target=self._threads, args=(deadline,))
        chaos = threading.Thread(target=lambda: self.ready.wait(30) and faults())
        sync_side.start()
        chaos.start()
        try:
            asyncio.run(self._tasks(deadline))
        finally:
            self.ready.set()
            sync_side.join()
            chaos.join()

    def assert_typed(self) -> None:
        """Every exception a caller saw is a GoblinClaimError, and a transient one."""
        assert self.calls > 500
        assert self.untyped == [], sorted({f"{type(e).__name__}: {e}" for e in self.untyped})[:5]
        kinds = sorted({type(e).__name__ for e in self.typed if not isinstance(e, ConnectionFailedError)})
        assert kinds == [], [str(e) for e in self.typed if not isinstance(e, ConnectionFailedError)][:3]


def _kill_clients(cluster: servers.ReplicatedCluster, stop: threading.Event, seconds: float = math.inf) -> int:
    """CLIENT KILL every normal client of every node, over and over until ``stop`` or ``seconds``; how many rounds."""
    rounds = 0
    deadline = time.monotonic() + seconds
    while not stop.is_set() and time.monotonic() < deadline:
        for node in cluster.nodes:
            if not node.alive:
                continue
            with contextlib.suppress(redis.RedisError, OSError), contextlib.closing(node.client()) as admin:
                admin.execute_command("CLIENT KILL TYPE normal SKIPME yes")
        rounds += 1
        time.sleep(0.05)
    return rounds


# The storms below load both cores for seconds: they run with the machine to themselves
# (`alone`), so that other tests' leases and failover timings are not theirs to share.


@pytest.mark.alone
@pytest.mark.parametrize("family", FAMILIES)
def test_client_kill_storm_reaches_callers_typed(cluster: servers.ReplicatedCluster, family: str) -> None:
    """150 tasks and 32 threads call while every node's clients are killed over and over: typed errors, one run each."""
    storm = _Storm(_family(family, cluster))
    stop = threading.Event()
    rounds: list[int] = []
    storm.run(6, lambda: rounds.append(_kill_clients(cluster, stop, seconds=5)))
    assert rounds[0] > 3
    storm.assert_typed()
    assert all(count == 1 for count in storm.runs.values()), {k: v for k, v in storm.runs.items() if v != 1}


@pytest.mark.alone
@pytest.mark.parametrize("family", FAMILIES)
def test_killed_and_paused_primaries_reach_callers_typed(cluster: servers.ReplicatedCluster, family: str) -> None:
    """A primary paused 2 s, another SIGKILLed (its replica promoted) and CLIENT KILLs: callers see typed errors only.

    Runs are counted but not held to one: a primary killed before its replica had a
    claim loses it (asynchronous replication, "Failovers" in the README).
    """
    storm = _Storm(_family(family, cluster))
    stop = threading.Event()
    paused, killed = cluster.primaries()[:2]

    def faults() -> None:
        time.sleep(1.0)
        paused.server.process.send_signal(signal.SIGSTOP)
        time.sleep(2.0)
        paused.server.process.send_signal(signal.SIGCONT)
        killed.kill()
        _kill_clients(cluster, stop, seconds=4)

    try:
        storm.run(9, faults)
    finally:
        stop.set()
        paused.server.process.send_signal(signal.SIGCONT)
        if not killed.alive:
            killed.restart()
    storm.assert_typed()
    twice = sum(1 for count in storm.runs.values() if count > 1)
    assert twice <= len(storm.runs) // 20, twice


def test_asgi_door_on_an_asyncio_cluster_stores_every_answer_through_a_client_kill_storm(
    cluster: servers.ReplicatedCluster,
) -> None:
    """Under uvicorn, POSTs sent three times each while the nodes' clients are killed: each key runs once, no 500."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route

    from goblin_claim.asgi import IdempotencyMiddleware
    from tests.support.asgi_server import serve

    runs: dict[str, int] = {}

    async def pay(request: Request) -> Response:
        key = request.headers["idempotency-key"]
        runs[key] = runs.get(key, 0) + 1
        return JSONResponse({"paid": key, "run": runs[key]}, status_code=201)

    made: list[redis.asyncio.cluster.RedisCluster] = []

    def client() -> redis.asyncio.cluster.RedisCluster:  # made in the server's loop, on first use
        made.append(_async_client(cluster))
        return made[-1]

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        for one in made:
            await one.aclose()

    app = Starlette(routes=[Route("/payments", pay, methods=["POST"])], lifespan=lifespan)
    app.add_middleware(IdempotencyMiddleware, client=client, namespace=unique("http"), lease=10)
    stop = threading.Event()
    answers: dict[str, list[tuple[int, str]]] = {}

    async def send(http: httpx.AsyncClient, key: str) -> None:
        for _ in range(300):  # a retrying client: 409 and 503 mean "later"
            response = await http.post("/payments", headers={"Idempotency-Key": key}, json={"amount": 1})
            if response.status_code in (409, 503):
                assert "retry-after" in response.headers
                await asyncio.sleep(0.1)
                continue
            answers.setdefault(key, []).append((response.status_code, response.text))
            return
        raise AssertionError(f"{key} got no answer")

    async def traffic(url: str) -> None:
        async with httpx.AsyncClient(base_url=url, timeout=30) as http:
            await send(http, "warm-up")
            killer = threading.Thread(target=_kill_clients, args=(cluster, stop))
            killer.start()
            threading.Timer(5, stop.set).start()  # then the storm ends, and every key must get its answer
            try:
                keys = [unique("pay") for _ in range(100)]
                await asyncio.gather(*(send(http, key) for key in keys for _ in range(3)))
            finally:
                stop.set()
                killer.join()

    with serve(app) as url:
        asyncio.run(traffic(url))
    assert len(answers) == 101
    for key, got in answers.items():
        assert runs[key] == 1, (key, runs[key])
        assert {status for status, _ in got} == {201}, got
        assert len({text for _, text in got}) == 1, got
