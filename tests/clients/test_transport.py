"""The direct round trip: which clients take it, and that nothing is lost when they do.

A stock client's round trips go straight through its pool (``_clients.transport.send_direct``);
anyone watching ``execute_command`` (a subclass, an instrumentation patched onto
the class, redis-py's own observability) gets every command through it instead.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
from typing import Any

import pytest
import redis
import redis.asyncio
import redis.cluster
from hypothesis import given
from hypothesis import strategies as st
from redis._parsers.encoders import Encoder
from redis.connection import PythonRespSerializer

from goblin_claim import AsyncClaim, Claim, Claimed, Completed, InFlight
from goblin_claim._clients.transport import direct_pool, pack, state_of
from goblin_claim._protocol.scripts import SCRIPTS
from tests.conftest import unique
from tests.support import servers
from tests.support.proxy import SET_NX_GET


@pytest.fixture
def server(redis_standalone: servers.RedisProcess) -> servers.RedisProcess:
    """The session's standalone redis-server."""
    return redis_standalone


def _sync(server: servers.RedisProcess, cls: type[redis.Redis] = redis.Redis, **kwargs: Any) -> redis.Redis:
    return cls(host=servers.HOST, port=server.port, **kwargs)


def _async(
    server: servers.RedisProcess, cls: type[redis.asyncio.Redis] = redis.asyncio.Redis, **kwargs: Any
) -> redis.asyncio.Redis:
    return cls(host=servers.HOST, port=server.port, **kwargs)


def _commands_run(client: redis.Redis) -> int:
    stats = client.info("commandstats")
    counted = ("cmdstat_evalsha", "cmdstat_eval", "cmdstat_set", "cmdstat_del")
    return sum(int(entry["calls"]) for name, entry in stats.items() if name in counted)


# A handle's flow on Redis 7 (acquire, extend, complete, a duplicate, release, forget): the claims
# take its SET ... NX GET and forget its DEL, the rest the scripts (Redis 7 has no SET IFEQ or DELIFEQ).
FLOW = ["SET", "EVALSHA", "EVALSHA", "SET", "EVALSHA", "DEL"]
# As a client whose execute_command is watched sees it: forget's announcement is a command of its own.
WATCHED_FLOW = [*FLOW, "publish"]


# --------------------------------------------------------------------------- packing


def _redis_py_pack(command: tuple[Any, ...], encoder: Encoder) -> bytes:
    return b"".join(PythonRespSerializer(6000, encoder.encode).pack(*command))


_args = st.one_of(
    st.text(min_size=0, max_size=40),
    st.binary(max_size=40),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.binary(min_size=6001, max_size=7000),
)


@given(name=st.sampled_from(["EVALSHA", "EVAL", "GOBLIN.CLAIM"]), args=st.lists(_args, max_size=10))
def test_packing_matches_redis_py_byte_for_byte(name: str, args: list[Any]) -> None:
    """Any str, bytes or int arguments, short or long, pack as redis-py packs them."""
    encoder = Encoder("utf-8", "strict", False)
    command = (name, *args)
    assert b"".join(pack(command, encoder)) == _redis_py_pack(command, encoder)


@given(sha=st.sampled_from([script.sha for script in SCRIPTS]), args=st.lists(_args, max_size=8))
def test_packing_of_the_sdks_scripts_matches_redis_py(sha: str, args: list[Any]) -> None:
    """EVALSHA with one of the SDK's SHAs (its head packed once, per encoding) packs as redis-py packs it."""
    for encoding in ("utf-8", "utf-16"):  # utf-16: the cached head is the encoding's own
        encoder = Encoder(encoding, "strict", False)
        command = ("EVALSHA", sha, *args)
        assert b"".join(pack(command, encoder)) == _redis_py_pack(command, encoder)


@given(args=st.lists(st.text(alphabet=st.characters(max_codepoint=255), max_size=20), max_size=6))
def test_packing_uses_the_clients_encoding(args: list[str]) -> None:
    """A client set to latin-1 sends its str arguments in latin-1."""
    encoder = Encoder("latin-1", "strict", False)
    command = ("EVALSHA", *args)
    assert b"".join(pack(command, encoder)) == _redis_py_pack(command, encoder)


def test_a_large_value_is_sent_as_its_own_buffer() -> None:
    """A large result goes out as the caller's own bytes object."""
    big = b"x" * 100_000
    buffers = pack(("EVALSHA", "sha", 2, "a", "b", big, 30), Encoder("utf-8", "strict", False))
    assert any(buffer is big for buffer in buffers)  # not copied into a joined command


# --------------------------------------------------------------------------- which clients go direct


class _Watched(redis.Redis):
    """A client that records every command it is asked to run."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.seen: list[str] = []

    def execute_command(self, *args: Any, **options: Any) -> Any:
        self.seen.append(str(args[0]))
        return super().execute_command(*args, **options)


class _AsyncWatched(redis.asyncio.Redis):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.seen: list[str] = []

    async def execute_command(self, *args: Any, **options: Any) -> Any:
        self.seen.append(str(args[0]))
        return await super().execute_command(*args, **options)


def test_stock_clients_go_direct_and_others_through_execute_command(
    server: servers.RedisProcess, redis_cluster: list[servers.RedisProcess]
) -> None:
    """Stock clients use their pool directly; every other kind goes through execute_command."""
    stock, single, watched = _sync(server), _sync(server, single_connection_client=True), _sync(server, _Watched)
    astock, asingle, awatched = (
        _async(server),
        _async(server, single_connection_client=True),
        _async(server, _AsyncWatched),
    )
    cluster = redis.cluster.RedisCluster(host=servers.HOST, port=redis_cluster[0].port)
    try:
        assert direct_pool(stock) is stock.connection_pool
        assert direct_pool(astock) is astock.connection_pool
        for client in (single, watched, asingle, awatched, cluster):
            assert direct_pool(client) is None, client
    finally:
        for client in (stock, single, watched, cluster):
            client.close()
        asyncio.run(_close(astock, asingle, awatched))


async def _close(*clients: redis.asyncio.Redis) -> None:
    for client in clients:
        await client.aclose()


def test_a_stock_client_runs_every_round_trip_direct(server: servers.RedisProcess) -> None:
    """Every call of a stock client reaches the server once, through its pool."""
    client, probe = _sync(server), _sync(server)
    try:
        claim = Claim(client, unique("direct"), lease=30)
        before = _commands_run(probe)
        assert isinstance(claim.acquire(), Claimed)
        assert state_of(client).direct is client.connection_pool
        claim.extend()
        claim.complete(b"done")
        assert isinstance(Claim(client, claim.key).acquire(), Completed)
        assert not claim.release()  # completed: nothing to give back
        assert claim.forget()
        # Each one reached the server, once (and complete.lua's own SET, which commandstats counts too).
        assert _commands_run(probe) - before == 6 + 1
    finally:
        client.close()
        probe.close()


def _flow(claim: Claim, again: Claim) -> list[object]:
    return [claim.acquire(), claim.extend(), claim.complete(b"v"), again.acquire(), claim.release(), claim.forget()]


def test_a_subclass_that_watches_execute_command_sees_every_round_trip(server: servers.RedisProcess) -> None:
    """A subclass overriding execute_command is asked to run every command."""
    client = _sync(server, _Watched)
    try:
        key = unique("watched")
        Claim(client, unique("warm")).acquire()  # the first use loads the scripts (a pipeline)
        client.seen.clear()
        _flow(Claim(client, key, lease=30), Claim(client, key))
        assert client.seen == WATCHED_FLOW
        assert state_of(client).direct is None
    finally:
        client.close()


def test_an_async_subclass_that_watches_execute_command_sees_every_round_trip(server: servers.RedisProcess) -> None:
    """The same for an asyncio client."""

    async def main() -> list[str]:
        client = _async(server, _AsyncWatched)
        try:
            key = unique("awatched")
            await AsyncClaim(client, unique("warm")).acquire()
            client.seen.clear()
            claim, again = AsyncClaim(client, key, lease=30), AsyncClaim(client, key)
            await claim.acquire()
            await claim.extend()
            await claim.complete(b"v")
            assert isinstance(await again.acquire(), Completed)
            await claim.release()
            await claim.forget()
            return list(client.seen)
        finally:
            await client.aclose()

    assert asyncio.run(main()) == WATCHED_FLOW


@pytest.fixture
def instrumented(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """``redis.Redis.execute_command`` wrapped on the class, as tracing instrumentation does."""
    seen: list[str] = []
    original = redis.Redis.execute_command

    @functools.wraps(original)
    def traced(self: redis.Redis, *args: Any, **options: Any) -> Any:
        seen.append(str(args[0]))
        return original(self, *args, **options)

    monkeypatch.setattr(redis.Redis, "execute_command", traced)
    return seen


def test_a_spy_set_on_one_client_sees_every_round_trip(server: servers.RedisProcess) -> None:
    """execute_command replaced on the client object itself (a spy, a mock) is called for every command."""
    client = _sync(server)
    try:
        seen: list[str] = []
        original = client.execute_command

        def spy(*args: Any, **options: Any) -> Any:
            seen.append(str(args[0]))
            return original(*args, **options)

        client.execute_command = spy  # type: ignore[method-assign]
        key = unique("spied")
        _flow(Claim(client, key, lease=30), Claim(client, key))
        assert seen == WATCHED_FLOW
        assert state_of(client).direct is None
    finally:
        client.close()


def test_instrumentation_patched_onto_the_class_sees_every_round_trip(
    server: servers.RedisProcess, instrumented: list[str]
) -> None:
    """A tracer that wraps redis.Redis.execute_command on the class sees every command."""
    client = _sync(server)
    try:
        key = unique("traced")
        Claim(client, unique("warm")).acquire()
        instrumented.clear()
        _flow(Claim(client, key, lease=30), Claim(client, key))
        assert instrumented == WATCHED_FLOW
    finally:
        client.close()


def test_redis_py_observability_keeps_commands_recorded(server: servers.RedisProcess) -> None:
    """With redis-py's own metrics on, commands go where redis-py records them."""
    observability = pytest.importorskip("redis.observability.providers")
    config = pytest.importorskip("redis.observability.config")
    observability.get_observability_instance().init(config.OTelConfig())
    client = _sync(server)
    try:
        assert observability.get_observability_instance().is_enabled()
        assert isinstance(Claim(client, unique("observed")).acquire(), Claimed)
        assert state_of(client).direct is None
    finally:
        observability.reset_observability_instance()
        client.close()


# --------------------------------------------------------------------------- the failure path, direct


def _value(outcome: object) -> object:
    assert isinstance(outcome, Completed), outcome
    return outcome.value


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_killed_connection_is_retried_on_the_direct_path(server: servers.RedisProcess, kind: str) -> None:
    """The pool's connection dies between calls: the next call reconnects, as execute_command would."""
    admin = _sync(server)
    key = unique("killed")
    try:
        if kind == "sync":
            client = _sync(server)
            claim = Claim(client, key, lease=30)
            assert isinstance(claim.acquire(), Claimed)
            assert state_of(client).direct is client.connection_pool
            assert admin.client_kill_filter(_id=client.client_id()) == 1  # the pool's one connection
            claim.complete(b"after the kill")
            assert _value(Claim(client, key).acquire()) == b"after the kill"
            client.close()
        else:

            async def main() -> object:
                client = _async(server)
                try:
                    claim = AsyncClaim(client, key, lease=30)
                    assert isinstance(await claim.acquire(), Claimed)
                    assert state_of(client).direct is client.connection_pool
                    assert admin.client_kill_filter(_id=await client.client_id()) == 1
                    await claim.complete(b"after the kill")
                    return await AsyncClaim(client, key).acquire()
                finally:
                    await client.aclose()

            assert _value(asyncio.run(main())) == b"after the kill"
    finally:
        admin.close()


# --------------------------------------------------------------------------- work done while a reply is on its way


@pytest.mark.parametrize("watched", [False, True], ids=["direct", "execute_command"])
def test_work_meanwhile_runs_once_even_when_the_script_is_sent_twice(
    server: servers.RedisProcess, watched: bool
) -> None:
    """The hook a round trip runs while its reply is on the way runs once, also across a NOSCRIPT re-send."""
    client = _sync(server, _Watched if watched else redis.Redis)
    try:
        ran: list[int] = []
        claim = Claim(client, unique("meanwhile"), lease=30)
        assert isinstance(claim._acquire(lambda: ran.append(1)), Claimed)
        client.script_flush()  # the next EVALSHA is refused: EVAL follows
        claim._complete(b"v", lambda: ran.append(2))
        assert ran == [1, 2]
        assert _value(Claim(client, claim.key).acquire()) == b"v"
    finally:
        client.close()


@pytest.mark.parametrize("watched", [False, True], ids=["direct", "execute_command"])
def test_failing_work_meanwhile_leaves_the_round_trip_whole(server: servers.RedisProcess, watched: bool) -> None:
    """Bookkeeping that fails while a reply is on the way loses neither the reply nor the connection."""
    client = _sync(server, _Watched if watched else redis.Redis, max_connections=1)

    def fails() -> None:
        raise RuntimeError("bookkeeping failed")

    try:
        claim = Claim(client, unique("failing"), lease=30)
        assert isinstance(claim._acquire(fails), Claimed)
        assert isinstance(Claim(client, claim.key).acquire(), InFlight)  # the one connection, clean
        claim._complete(b"v", fails)
        assert _value(Claim(client, claim.key).acquire()) == b"v"
    finally:
        client.close()


# --------------------------------------------------------------------------- shared rounds (asyncio)


class _CountingPool(redis.asyncio.BlockingConnectionPool):
    """A real blocking pool that counts the connections it hands out: one per round trip."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.taken = 0

    async def get_connection(self, *args: Any, **kwargs: Any) -> Any:
        self.taken += 1
        return await super().get_connection(*args, **kwargs)


def _counting_client(port: int, max_connections: int = 50, **kwargs: Any) -> tuple[redis.asyncio.Redis, _CountingPool]:
    pool = _CountingPool(host=servers.HOST, port=port, max_connections=max_connections, **kwargs)
    return redis.asyncio.Redis.from_pool(pool), pool


def _claims_sent(faults: Any, key: str) -> int:
    """Claims of ``key`` that reached the server: SET ... NX GET on Redis 7."""
    return int(faults.count(SET_NX_GET, key.encode()))


@pytest.mark.parametrize("max_connections", [2, 50])  # 2: the waiters' subscriber holds one
def test_concurrent_tasks_share_round_trips_and_each_gets_its_own_reply(
    server: servers.RedisProcess, max_connections: int
) -> None:
    """600 tasks claiming 300 keys at once take far fewer connections than commands.

    Each reply is its own, and each key runs once.
    """
    admin = _sync(server)
    keys = [unique("shared") for _ in range(300)]
    ran: collections.Counter[str] = collections.Counter()

    async def main() -> tuple[list[object], int]:
        client, pool = _counting_client(server.port, max_connections)
        try:

            async def one(key: str) -> object:
                claim = AsyncClaim(client, key, lease=30)
                outcome = await claim.acquire()
                if isinstance(outcome, Claimed):
                    ran[key] += 1
                    await claim.complete(key.encode())
                    return await AsyncClaim(client, key).acquire()
                return outcome if isinstance(outcome, Completed) else await claim.wait(timeout=10)

            await AsyncClaim(client, unique("shared"), lease=30).acquire()  # the probe and SCRIPT LOAD first
            assert state_of(client).direct is pool
            before = pool.taken
            outcomes = await asyncio.gather(*(one(key) for key in keys * 2))
            return outcomes, pool.taken - before
        finally:
            await client.aclose()

    try:
        outcomes, taken = asyncio.run(main())
        assert sorted(ran.values()) == [1] * len(keys)  # each key ran once, by one of its two tasks
        wrong = [
            (o, k)
            for o, k in zip(outcomes, keys * 2, strict=True)
            if not (isinstance(o, Completed) and o.value == k.encode())
        ]
        assert not wrong, wrong[:3]
        assert taken <= len(keys) // 3  # 1,200 round trips alone (measured: under 20 shared)
        for key in keys:
            assert admin.get(f"goblin:{{{key}}}") is not None
    finally:
        admin.close()


@pytest.mark.parametrize("fault", ["lose", "drop"])
def test_a_shared_round_cut_midway_is_resent_whole_and_each_claim_answers_claimed(
    server: servers.RedisProcess, fault: str
) -> None:
    """A round whose connection is cut (a reply lost, a request never sent) goes again whole.

    Under the connection's Retry the claims it had already taken answer ``Claimed`` to their
    own tokens, and each key runs once.
    """
    from redis.asyncio.retry import Retry
    from redis.backoff import ExponentialWithJitterBackoff

    from tests.support.proxy import FaultProxy

    keys = [unique("cut") for _ in range(40)]
    victim = keys[25]
    ran: collections.Counter[str] = collections.Counter()

    with FaultProxy(server.port) as proxy:

        async def main() -> list[object]:
            retry = Retry(ExponentialWithJitterBackoff(base=0.01, cap=0.2), 3)
            client, _pool = _counting_client(proxy.port, retry=retry)
            try:
                await client.ping()
                holder = AsyncClaim(client, unique("holder"), lease=30)
                proxy.faults.hold_next_reply(holder.key.encode())  # on the wire: the others gather

                async def one(key: str) -> object:
                    claim = AsyncClaim(client, key, lease=30)
                    outcome = await claim.acquire()
                    if isinstance(outcome, Claimed):
                        ran[key] += 1
                        await claim.complete(b"done")
                    return outcome

                held = asyncio.ensure_future(holder.acquire())
                await asyncio.sleep(0.2)
                (proxy.faults.lose_next_reply if fault == "lose" else proxy.faults.drop_before)(victim.encode())
                outcomes = await asyncio.gather(*(one(key) for key in keys))
                held.cancel()
                with contextlib.suppress(BaseException):
                    await held
                return outcomes
            finally:
                await client.aclose()

        outcomes = asyncio.run(main())
        assert all(isinstance(outcome, Claimed) for outcome in outcomes), outcomes
        assert sorted(ran) == sorted(keys)
        assert set(ran.values()) == {1}
        assert _claims_sent(proxy.faults, victim) == (2 if fault == "lose" else 1)  # the round went again
        # Whole, not the victim alone: the claims before it in the round went twice.
        assert sum(_claims_sent(proxy.faults, key) == 2 for key in keys if key != victim) >= 1


def test_a_shared_round_that_cannot_be_resent_fails_each_of_its_claims_and_a_resend_answers_claimed(
    server: servers.RedisProcess,
) -> None:
    """Without retries, a round whose reply is lost fails each claim in it with ``ConnectionFailedError``.

    Each handle's next ``acquire()`` is a re-send that answers ``Claimed`` where its claim was taken.
    """
    from redis.asyncio.retry import Retry
    from redis.backoff import NoBackoff

    from goblin_claim import ConnectionFailedError
    from tests.support.proxy import FaultProxy

    keys = [unique("unresent") for _ in range(30)]
    with FaultProxy(server.port) as proxy:

        async def main() -> tuple[int, list[object]]:
            client, _pool = _counting_client(proxy.port, retry=Retry(NoBackoff(), 0))
            try:
                await client.ping()
                holder = AsyncClaim(client, unique("holder"), lease=30)
                proxy.faults.hold_next_reply(holder.key.encode())
                held = asyncio.ensure_future(holder.acquire())
                await asyncio.sleep(0.2)
                proxy.faults.lose_next_reply(keys[10].encode())
                claims = [AsyncClaim(client, key, lease=30) for key in keys]
                first = await asyncio.gather(*(claim.acquire() for claim in claims), return_exceptions=True)
                failed = sum(isinstance(outcome, ConnectionFailedError) for outcome in first)
                again = [await claim.acquire() for claim in claims]
                held.cancel()
                with contextlib.suppress(BaseException):
                    await held
                return failed, again
            finally:
                await client.aclose()

        failed, again = asyncio.run(main())
        assert failed >= 1  # the round with the lost reply: every claim in it was told
        assert all(isinstance(outcome, Claimed) for outcome in again), again


def test_a_task_cancelled_before_its_round_is_sent_is_left_out(server: servers.RedisProcess) -> None:
    """A task that joins a round and is cancelled before the round goes out sends nothing: its key stays free."""
    from tests.support.proxy import FaultProxy

    with FaultProxy(server.port) as proxy:
        key = unique("left-out")

        async def main() -> None:
            client, _pool = _counting_client(proxy.port)
            try:
                await client.ping()
                holder = AsyncClaim(client, unique("holder"), lease=30)
                proxy.faults.hold_next_reply(holder.key.encode())
                held = asyncio.ensure_future(holder.acquire())
                await asyncio.sleep(0.2)  # the holder's claim is on the wire
                joined = asyncio.ensure_future(AsyncClaim(client, key, lease=30).acquire())
                await asyncio.sleep(0)  # it joins the round being gathered...
                joined.cancel()  # ...and is cancelled before the round's task runs
                with pytest.raises(asyncio.CancelledError):
                    await joined
                assert isinstance(await AsyncClaim(client, key, lease=30).acquire(), Claimed)  # it was free
                held.cancel()
                with contextlib.suppress(BaseException):
                    await held
            finally:
                await client.aclose()

        asyncio.run(main())
        assert _claims_sent(proxy.faults, key) == 1  # the second handle's claim alone


def test_a_lone_task_sends_alone(server: servers.RedisProcess) -> None:
    """With nothing else on the wire a command goes at once, over its own connection: no round is gathered."""
    from goblin_claim._clients import transport as _server

    async def main() -> None:
        client, pool = _counting_client(server.port)
        try:
            await AsyncClaim(client, unique("alone"), lease=30).acquire()  # the probe and SCRIPT LOAD first
            before = pool.taken
            for _ in range(5):
                await AsyncClaim(client, unique("alone"), lease=30).acquire()
            assert pool.taken - before == 5
            rounds = _server._ROUNDS[pool]
            assert rounds.gathering is None
            assert not rounds.sending
            assert rounds.on_wire == 0
        finally:
            await client.aclose()

    asyncio.run(main())


def test_a_round_whose_replies_stall_times_out_once_and_leaves_no_reply_behind(server: servers.RedisProcess) -> None:
    """A batch whose reply is held past the read timeout fails once, as a timeout.

    The connection is not given back with a reply still to come: the next round trip reads its own.
    """
    from redis.asyncio.retry import Retry
    from redis.backoff import NoBackoff

    from goblin_claim import ConnectionFailedError
    from tests.support.proxy import FaultProxy

    keys = [unique("stalled") for _ in range(10)]
    with FaultProxy(server.port, hold_limit=5) as proxy:

        async def main() -> None:
            client, _pool = _counting_client(
                proxy.port, max_connections=1, socket_timeout=0.5, retry=Retry(NoBackoff(), 0)
            )
            try:
                await AsyncClaim(client, unique("warm"), lease=30).acquire()
                proxy.faults.hold_next_reply(keys[5].encode())
                started = asyncio.get_running_loop().time()
                with pytest.raises(ConnectionFailedError, match=r"[Tt]imeout"):
                    await AsyncClaim.acquire_many(client, keys, lease=30)
                took = asyncio.get_running_loop().time() - started
                assert 0.4 < took < 2.0  # one deadline for the round: not one per reply, not none
                after = AsyncClaim(client, unique("after"), lease=30)
                assert isinstance(await after.acquire(), Claimed)  # its own reply, not a late one
                await after.complete(b"v")
                assert _value(await AsyncClaim(client, after.key).acquire()) == b"v"
            finally:
                await client.aclose()

        asyncio.run(main())


def test_a_pool_that_shared_rounds_is_freed_with_its_client(server: servers.RedisProcess) -> None:
    """The rounds a pool shared keep no hold on it: dropped with its client, it is freed."""
    import gc
    import weakref

    from goblin_claim._clients import transport as _server

    async def main() -> weakref.ref[Any]:
        client, pool = _counting_client(server.port)
        await asyncio.gather(*(AsyncClaim(client, unique("freed"), lease=30).acquire() for _ in range(50)))
        assert pool in _server._ROUNDS
        await client.aclose()
        return weakref.ref(pool)

    pool_ref = asyncio.run(main())
    gc.collect()
    assert pool_ref() is None
