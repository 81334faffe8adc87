"""``replicas=`` checked on every path that reports success, on a real primary and replica.

WAIT counts the replicas that reached the last write of its own connection; a
reply that wrote nothing (a stored result read back, a re-sent complete, a claim
this handle already held, on a fresh connection) would make it count nothing.
The scripts rewrite what they read, unchanged, so the WAIT behind them means it.
Each test freezes the replica (SIGSTOP) where a write must not be reported as
replicated, and counts what the SDK says; on redis-server 7, valkey-server and Redis 8.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
import redis.asyncio

from goblin_claim import (
    AsyncClaim,
    Claim,
    Claimed,
    ClaimLostError,
    Completed,
    InvalidArgumentTypeError,
    NotReplicatedError,
    ServerUnavailableError,
)
from goblin_claim.testing import fake_redis
from goblin_claim.wsgi import IdempotencyMiddleware
from tests.conftest import record, server_binary, unique
from tests.http.test_wsgi_unit import App, call
from tests.support import servers

FAST_SYNC = ("--repl-diskless-sync-delay", "0")
# Short: every WAIT against the frozen replica runs out.
TIMEOUT_MS = 300


@pytest.fixture(scope="module", params=["redis", "valkey", "redis8"])
def pair(request: pytest.FixtureRequest) -> Iterator[tuple[servers.RedisProcess, servers.RedisProcess]]:
    """A primary and its replica for this module (the session's replica is never frozen), on each server."""
    with servers.primary_with_replica(server_binary(request.param), FAST_SYNC) as made:
        with contextlib.closing(made[0].client()) as client:
            client.set(unique("warm"), 1)
            assert client.wait(1, 10000) == 1  # the replica acknowledges before the first test
        yield made


@pytest.fixture
def frozen(pair: tuple[servers.RedisProcess, servers.RedisProcess]) -> Iterator[Any]:
    """A function that freezes the replica; it is thawed (and caught up) after the test whatever happens."""
    primary, replica = pair
    stopped: list[bool] = []

    def freeze() -> None:
        replica.process.send_signal(signal.SIGSTOP)
        stopped.append(True)

    yield freeze
    if stopped:
        replica.process.send_signal(signal.SIGCONT)
    with contextlib.closing(primary.client()) as client:
        client.set(unique("sync"), 1)
        assert client.wait(1, 10000) == 1  # caught up before the next test


@pytest.fixture
def client(pair: tuple[servers.RedisProcess, servers.RedisProcess]) -> Iterator[redis.Redis]:
    """A sync client on the primary."""
    made = pair[0].client()
    yield made
    made.close()


def _thaw(pair: tuple[servers.RedisProcess, servers.RedisProcess]) -> None:
    pair[1].process.send_signal(signal.SIGCONT)


def _stored_on_the_primary_alone(client: redis.Redis, key: str, frozen: Any) -> Claim:
    """``key`` claimed, then completed with the replica frozen: NotReplicatedError, stored on the primary only.

    The pool's connections are dropped after it: what is sent next goes on a fresh
    connection, as after a failover.
    """
    owner = Claim(client, key, replicas=1, replica_timeout_ms=5000)
    assert isinstance(owner.acquire(), Claimed)
    frozen()
    owner._replica_timeout_ms = TIMEOUT_MS  # from here every WAIT runs out
    with pytest.raises(NotReplicatedError):
        owner.complete(b"charged")  # on the primary only
    client.connection_pool.disconnect()
    return owner


def test_completed_read_back_is_not_reported_replicated_while_the_replica_lags(
    pair: tuple[servers.RedisProcess, servers.RedisProcess], frozen: Any, client: redis.Redis
) -> None:
    """A result stored on the primary alone, read back under replicas=1, raises NotReplicatedError, not Completed."""
    key = unique()
    owner = _stored_on_the_primary_alone(client, key, frozen)
    duplicate = Claim(client, key, replicas=1, replica_timeout_ms=TIMEOUT_MS)
    with pytest.raises(NotReplicatedError) as caught:
        duplicate.acquire()
    assert caught.value.acknowledged == 0
    _thaw(pair)
    assert Claim(client, key, replicas=1, replica_timeout_ms=10000).acquire() == Completed(key=key, value=b"charged")
    with contextlib.closing(pair[1].client()) as replica:
        assert replica.get(owner.claim_key) == record(owner.token, b"charged")


def test_read_back_changes_neither_value_nor_expiry(client: redis.Redis) -> None:
    """The rewrite behind a read-back keeps the record and its expiry as they were."""
    key = unique()
    owner = Claim(client, key, ttl=1000, replicas=1, replica_timeout_ms=5000)
    owner.acquire()
    owner.complete(b"charged")
    before = (client.get(owner.claim_key), client.pexpiretime(owner.claim_key))
    assert before[0] == record(owner.token, b"charged")
    assert Claim(client, key, replicas=1, replica_timeout_ms=5000).acquire() == Completed(key=key, value=b"charged")
    after = (client.get(owner.claim_key), client.pexpiretime(owner.claim_key))
    assert after == before


def test_a_result_beside_a_foreign_claim_key_is_read_back_keeping_its_expiry(client: redis.Redis) -> None:
    """Two keys (from_keys): a raw result beside a non-string claim key is rewritten for the WAIT, expiry kept."""
    key = unique()
    claim_key, result_key = f"goblin:{{{key}}}:claim", f"goblin:{{{key}}}:result"
    handle = Claim.from_keys(client, claim_key, result_key, replicas=1, replica_timeout_ms=5000)
    client.rpush(handle.claim_key, b"not a claim")
    client.set(handle.result_key, b"raw", ex=500)
    expires = client.pexpiretime(handle.result_key)
    assert handle.acquire() == Completed(key=claim_key, value=b"raw")
    assert client.get(handle.result_key) == b"raw"
    assert client.pexpiretime(handle.result_key) == expires


def test_resent_complete_on_a_fresh_connection_waits_again(
    pair: tuple[servers.RedisProcess, servers.RedisProcess], frozen: Any, client: redis.Redis
) -> None:
    """complete() sent again after NotReplicatedError, on a new connection, still reports the lagging replica."""
    owner = _stored_on_the_primary_alone(client, unique(), frozen)
    with pytest.raises(NotReplicatedError):
        owner.complete(b"charged")  # safe to send twice, and waits again
    _thaw(pair)
    owner._replica_timeout_ms = 10000
    owner.complete(b"charged")  # the replica caught up: the third send succeeds


def test_own_claim_acquired_again_on_a_fresh_connection_waits_again(
    frozen: Any, client: redis.Redis
) -> None:  # fmt: skip
    """acquire() again by the handle that holds the claim, on a new connection, reports the lagging replica."""
    owner = Claim(client, unique(), replicas=1, replica_timeout_ms=TIMEOUT_MS)
    frozen()
    with pytest.raises(NotReplicatedError):
        owner.acquire()  # claimed on the primary only
    client.connection_pool.disconnect()
    with pytest.raises(NotReplicatedError):
        owner.acquire()


def test_batch_after_script_flush_waits_behind_the_eval_round(
    pair: tuple[servers.RedisProcess, servers.RedisProcess], frozen: Any, client: redis.Redis
) -> None:
    """acquire_many(replicas=1) after SCRIPT FLUSH sends a WAIT behind its EVAL round: a frozen replica is reported."""
    keys = [unique() for _ in range(5)]
    Claim.acquire_many(client, [unique()], replicas=1, replica_timeout_ms=5000)  # scripts loaded
    client.script_flush()
    frozen()
    outcomes = Claim.acquire_many(client, keys, replicas=1, replica_timeout_ms=TIMEOUT_MS)
    assert [type(outcome) for _, outcome in outcomes] == [NotReplicatedError] * len(keys)
    assert all(client.get(handle.claim_key) == handle.token.encode() for handle, _ in outcomes)  # claimed


def test_batch_after_script_flush_replicates_every_claim(
    pair: tuple[servers.RedisProcess, servers.RedisProcess], client: redis.Redis
) -> None:
    """With the replica live, the EVAL round's claims are Claimed and on the replica when acquire_many returns."""
    keys = [unique() for _ in range(5)]
    client.script_flush()
    outcomes = Claim.acquire_many(client, keys, replicas=1, replica_timeout_ms=5000)
    assert all(isinstance(outcome, Claimed) for _, outcome in outcomes)
    with contextlib.closing(pair[1].client()) as replica:
        assert [replica.get(handle.claim_key) for handle, _ in outcomes] == [h.token.encode() for h, _ in outcomes]


def test_batch_read_back_of_completed_keys_waits(
    pair: tuple[servers.RedisProcess, servers.RedisProcess], frozen: Any, client: redis.Redis
) -> None:
    """acquire_many(replicas=1) reading back completed keys while the replica is frozen reports NotReplicatedError."""
    keys = [unique() for _ in range(3)]
    for handle, _ in Claim.acquire_many(client, keys, replicas=1, replica_timeout_ms=5000):
        handle.complete(b"done")
    frozen()  # the replica has them, but nothing can show it now
    client.connection_pool.disconnect()
    outcomes = Claim.acquire_many(client, keys, replicas=1, replica_timeout_ms=TIMEOUT_MS)
    assert [type(outcome) for _, outcome in outcomes] == [NotReplicatedError] * len(keys)


def test_batch_with_replicas_sends_scripts_even_where_native() -> None:
    """With replicas, a batch's claims go as EVALSHA even where GOBLIN.CLAIM is available, as acquire() sends them."""
    handle = Claim(fake_redis(True), unique(), replicas=1)
    command = handle._claim_command(frozenset({"GOBLIN.CLAIM", "GOBLIN.CAD"}))
    assert command[0] == "EVALSHA"
    assert command[-1] == "wait"
    plain = Claim(fake_redis(True), unique())
    assert plain._claim_command(frozenset({"GOBLIN.CLAIM", "GOBLIN.CAD"}))[0] == "GOBLIN.CLAIM"


def test_async_read_back_and_batch_wait_too(
    pair: tuple[servers.RedisProcess, servers.RedisProcess], frozen: Any, client: redis.Redis
) -> None:
    """AsyncClaim: a read-back and an EVAL batch round under replicas=1 report a frozen replica the same way."""
    key = unique()
    owner = Claim(client, key, replicas=1, replica_timeout_ms=5000)
    owner.acquire()
    frozen()
    owner._replica_timeout_ms = TIMEOUT_MS
    with pytest.raises(NotReplicatedError):
        owner.complete(b"charged")
    client.script_flush()

    async def scenario() -> tuple[type[BaseException], list[type[Any]]]:
        aclient = redis.asyncio.Redis(host=servers.HOST, port=pair[0].port)
        try:
            with pytest.raises(NotReplicatedError) as caught:
                await AsyncClaim(aclient, key, replicas=1, replica_timeout_ms=TIMEOUT_MS).acquire()
            batch = await AsyncClaim.acquire_many(
                aclient, [unique(), unique()], replicas=1, replica_timeout_ms=TIMEOUT_MS
            )
            return caught.type, [type(outcome) for _, outcome in batch]
        finally:
            await aclient.aclose()

    read_back, batch = asyncio.run(scenario())
    assert read_back is NotReplicatedError
    assert batch == [NotReplicatedError, NotReplicatedError]


@pytest.fixture(scope="module")
def deposed(pair: tuple[servers.RedisProcess, servers.RedisProcess]) -> Iterator[servers.RedisProcess]:
    """A primary with no replica and none of the pair's data: what a partition's old side looks like to a client."""
    with servers.standalone(pair[0].args[0]) as made:  # the pair's own server binary
        yield made


@pytest.mark.parametrize("ending", ["free", "another", "completed"])
def test_a_refusal_from_a_node_that_cannot_show_it_leads_is_transient_and_writes_nothing(
    pair: tuple[servers.RedisProcess, servers.RedisProcess],
    deposed: servers.RedisProcess,
    client: redis.Redis,
    ending: str,
) -> None:
    """replicas=1: a "gone"/"another's" from a node whose WAIT shows 0 replicas is ServerUnavailableError, not lost."""
    key, token = unique(), unique("owner")
    owner = Claim(client, key, replicas=1, replica_timeout_ms=5000, token=token)
    assert isinstance(owner.acquire(), Claimed)  # the claim lives on the real primary
    with contextlib.closing(deposed.client()) as stale:
        stale_handle = Claim(stale, key, replicas=1, replica_timeout_ms=TIMEOUT_MS, token=token)
        if ending == "another":
            Claim(stale, key, token="someone-else").acquire()
        elif ending == "completed":
            other = Claim(stale, key, token="someone-else")
            other.acquire()
            other.complete(b"theirs")
        before = {name: stale.dump(name) for name in stale.keys("*")}
        with pytest.raises(ServerUnavailableError) as caught:
            stale_handle.complete(b"charged")
        assert not isinstance(caught.value, ClaimLostError)
        assert "0 of 1 replicas" in str(caught.value)
        assert "lease lapsed" not in str(caught.value)
        assert {name: stale.dump(name) for name in stale.keys("*")} == before  # nothing written there
    owner.complete(b"charged")  # the same complete on the primary stores
    assert Claim(client, key).acquire() == Completed(key=key, value=b"charged")


@pytest.mark.parametrize("when", ["within the lease", "after the lease"])
def test_an_owners_unproven_refusal_is_transient_only_while_its_lease_lasts(
    deposed: servers.RedisProcess, client: redis.Redis, when: str
) -> None:
    """replicas=1: complete()'s unproven "gone" is transient inside the lease by the handle's clock, lost after it.

    Once the lease the handle took is over by its own clock the claim cannot be its own,
    whichever node answered: retrying (as @idempotent does while the lease lasts) would only
    end in a connection error that hides that the work's claim was lost.
    """
    owner = Claim(client, unique(), lease=1, replicas=1, replica_timeout_ms=TIMEOUT_MS)
    assert isinstance(owner.acquire(), Claimed)
    if when == "after the lease":
        time.sleep(1.1)
    with contextlib.closing(deposed.client()) as stale:
        owner._client = stale  # the owner's complete() reaches a node that lacks its claim
        with pytest.raises(ServerUnavailableError if when == "within the lease" else ClaimLostError) as caught:
            owner.complete(b"charged")
        assert isinstance(caught.value, ClaimLostError) == (when == "after the lease")
        assert not stale.exists(owner.claim_key, owner.result_key)


def test_without_replicas_a_gone_claim_stays_claim_lost(deposed: servers.RedisProcess) -> None:
    """Without replicas= there is no WAIT to weigh a verdict by: a "gone" claim is ClaimLostError, as documented."""
    with contextlib.closing(deposed.client()) as stale, pytest.raises(ClaimLostError):
        Claim(stale, unique(), token=unique("owner")).complete(b"charged")


def test_async_refusal_from_a_node_that_cannot_show_it_leads_is_transient(deposed: servers.RedisProcess) -> None:
    """AsyncClaim with replicas=1: the same unproven "gone" is ServerUnavailableError, and nothing is written."""

    async def scenario() -> tuple[type[BaseException] | None, int]:
        aclient = redis.asyncio.Redis(host=servers.HOST, port=deposed.port)
        handle = AsyncClaim(aclient, unique(), replicas=1, replica_timeout_ms=TIMEOUT_MS)
        raised: type[BaseException] | None = None
        try:
            await handle.complete(b"charged")
        except Exception as exc:
            raised = type(exc)
        finally:
            written = await aclient.exists(handle.claim_key, handle.result_key)
            await aclient.aclose()
        return raised, written

    assert asyncio.run(scenario()) == (ServerUnavailableError, 0)


def test_a_renewal_refused_by_a_node_without_the_claim_is_transient_while_the_lease_lasts(
    deposed: servers.RedisProcess, client: redis.Redis
) -> None:
    """replicas=1: extend()'s "not held" from another node, inside the lease by the handle's clock, is not lost."""
    owner = Claim(client, unique(), lease=30, replicas=1, replica_timeout_ms=5000)
    assert isinstance(owner.acquire(), Claimed)
    with contextlib.closing(deposed.client()) as stale:
        owner._client = stale  # the owner's next round trip reaches a node that lacks its claim
        with pytest.raises(ServerUnavailableError, match="has no WAIT"):
            owner.extend()
        assert not stale.exists(owner.claim_key)
        owner._client = client
    owner.extend()  # still this handle's on the primary: renewed there
    assert client.pttl(owner.claim_key) > 29_000
    plain = Claim(client, unique(), lease=30)
    assert isinstance(plain.acquire(), Claimed)
    with contextlib.closing(deposed.client()) as stale:
        plain._client = stale
        with pytest.raises(ClaimLostError):
            plain.extend()  # without replicas= the refusal is taken as it comes


def test_the_http_door_takes_replicas_and_runs_nothing_on_an_unacknowledged_claim(
    pair: tuple[servers.RedisProcess, servers.RedisProcess], frozen: Any, client: redis.Redis
) -> None:
    """A WSGI door with replicas=1: runs once and replays; replica frozen: 503, not run, the key given back."""
    app = App()
    door = IdempotencyMiddleware(app, client=client, replicas=1, replica_timeout_ms=5000, namespace="repl-door")
    key = unique("door")
    first = call(door, key=key)
    assert first.status == 201
    assert call(door, key=key).headers.get("idempotent-replayed") == "true"
    assert app.runs == 1

    def freezing(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        frozen()  # after the claim was acknowledged, before the answer is stored
        return list(app(environ, start_response))

    slow = IdempotencyMiddleware(
        freezing, client=client, replicas=1, replica_timeout_ms=TIMEOUT_MS, namespace="repl-door"
    )
    unacknowledged = call(slow, key=unique("door"))
    assert unacknowledged.status == 201  # answered, but marked: the primary alone has it
    assert unacknowledged.headers.get("idempotent-stored") == "false"
    assert app.runs == 2
    refused = unique("door")
    assert call(slow, key=refused).status == 503
    assert app.runs == 2  # the app never ran on a claim a failover could lose
    plain = IdempotencyMiddleware(app, client=client, namespace="repl-door")
    assert call(plain, key=refused).status == 201  # the key was given back: it runs now
    assert app.runs == 3
    with pytest.raises(InvalidArgumentTypeError):
        IdempotencyMiddleware(app, client=client, replicas="1")  # type: ignore[arg-type]
