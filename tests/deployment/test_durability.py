"""Opt-in durability: ``replicas=`` sends WAIT behind the claim and behind complete(), on real servers.

The replicated tests run on redis-server and again on valkey-server.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.cluster

from goblin_claim import (
    AsyncClaim,
    Claim,
    Claimed,
    Completed,
    InvalidArgumentError,
    InvalidArgumentTypeError,
    NotReplicatedError,
    idempotent,
)
from tests.conftest import record, unique
from tests.support import servers

# The tests that start servers of their own run on both (tests/conftest.py).
SERVERS = ("redis", "valkey")


@pytest.fixture(params=SERVERS)
def replicated(request: pytest.FixtureRequest) -> tuple[servers.RedisProcess, servers.RedisProcess]:
    """The session's primary and its replica: redis-server, then valkey-server."""
    made: tuple[servers.RedisProcess, servers.RedisProcess] = request.getfixturevalue(f"{request.param}_replicated")
    return made


@pytest.fixture
def pair(replicated: tuple[servers.RedisProcess, servers.RedisProcess]) -> Iterator[tuple[Any, Any]]:
    """Sync clients on the session's primary and on its replica."""
    primary, replica = replicated
    clients = (primary.client(), replica.client())
    yield clients
    for client in clients:
        client.close()


def test_claim_and_complete_reach_the_replica_before_returning(pair: tuple[Any, Any]) -> None:
    """With replicas=1, the replica holds the claim when acquire() returns, and the result when complete() does."""
    primary, replica = pair
    key = unique()
    owner = Claim(primary, key, replicas=1, replica_timeout_ms=5000)
    assert isinstance(owner.acquire(), Claimed)
    assert replica.get(owner.claim_key) == owner.token.encode()
    owner.complete(b"charged")
    assert replica.get(owner.claim_key) == record(owner.token, b"charged")
    assert Claim(primary, key, replicas=1).acquire() == Completed(key=key, value=b"charged")


def test_async_claim_and_complete_reach_the_replica(
    replicated: tuple[servers.RedisProcess, servers.RedisProcess], pair: tuple[Any, Any]
) -> None:
    """The asyncio twin waits for the replica the same way."""
    primary_server, _ = replicated
    replica = pair[1]

    async def scenario() -> None:
        client = redis.asyncio.Redis(host=servers.HOST, port=primary_server.port)
        try:
            owner = AsyncClaim(client, unique(), replicas=1, replica_timeout_ms=5000)
            assert isinstance(await owner.acquire(), Claimed)
            assert replica.get(owner.claim_key) == owner.token.encode()
            await owner.complete(b"charged")
            assert replica.get(owner.claim_key) == record(owner.token, b"charged")
        finally:
            await client.aclose()

    asyncio.run(scenario())


def test_more_replicas_than_exist_raise_after_the_timeout(pair: tuple[Any, Any]) -> None:
    """replicas=2 with one replica: NotReplicatedError(acknowledged=1) after the timeout; the claim is held."""
    primary, _ = pair
    owner = Claim(primary, unique(), replicas=2, replica_timeout_ms=200)
    started = time.monotonic()
    with pytest.raises(NotReplicatedError) as info:
        owner.acquire()
    assert time.monotonic() - started >= 0.19
    assert (info.value.acknowledged, info.value.replicas, info.value.key) == (1, 2, owner.key)
    assert primary.get(owner.claim_key) == owner.token.encode()
    assert owner.release() is True


def test_a_stopped_replica_is_reported_and_the_writes_stay_on_the_primary(redis_server_binary: str) -> None:
    """With the replica stopped: acquire() and complete() raise NotReplicatedError(0), having written on the primary."""
    with servers.primary_with_replica(redis_server_binary) as (primary_server, replica_server):
        primary = primary_server.client()
        try:
            primary.set(unique("warm"), 1)
            assert primary.wait(1, 10000) == 1  # acknowledging already, before the 300 ms WAITs
            owner = Claim(primary, unique(), replicas=1, replica_timeout_ms=300)
            assert isinstance(owner.acquire(), Claimed)
            replica_server.stop()
            again = Claim(primary, unique(), replicas=1, replica_timeout_ms=300)
            with pytest.raises(NotReplicatedError) as info:
                again.acquire()
            assert info.value.acknowledged == 0
            assert primary.get(again.claim_key) == again.token.encode()
            with pytest.raises(NotReplicatedError):
                owner.complete(b"v")
            assert primary.get(owner.claim_key) == record(owner.token, b"v")
            # Sending complete() again is safe: it finds its own result and waits again.
            with pytest.raises(NotReplicatedError):
                owner.complete(b"v")
        finally:
            primary.close()


def test_the_decorator_waits_for_replicas(pair: tuple[Any, Any]) -> None:
    """@idempotent(replicas=1): the replica holds the result when the first call returns."""
    primary, replica = pair
    runs: list[str] = []
    namespace = unique("ns")

    @idempotent(primary, key="order_id", namespace=namespace, replicas=1, replica_timeout_ms=5000)
    def charge(order_id: str) -> str:
        runs.append(order_id)
        return f"charged {order_id}"

    assert charge("o1") == "charged o1"
    assert charge("o1") == "charged o1"
    assert runs == ["o1"]
    assert any(key.startswith(namespace.encode()) for key in replica.keys(f"{namespace}:*"))


def test_sync_cluster_waits_on_the_keys_primary(redis_cluster: list[servers.RedisProcess]) -> None:
    """On a cluster without replicas, replicas=1 reaches the key's primary and reports 0 acknowledgements."""
    client = redis.cluster.RedisCluster(host=servers.HOST, port=redis_cluster[0].port)
    try:
        owner = Claim(client, unique(), replicas=1, replica_timeout_ms=100)
        with pytest.raises(NotReplicatedError) as info:
            owner.acquire()
        assert info.value.acknowledged == 0
        assert client.get(owner.claim_key) == owner.token.encode()
    finally:
        client.close()


def test_async_cluster_waits_on_the_keys_primary(redis_cluster: list[servers.RedisProcess]) -> None:
    """The asyncio cluster client takes replicas= too: the key's primary, 0 acknowledgements there, the claim held."""

    async def scenario() -> None:
        client = redis.asyncio.cluster.RedisCluster(host=servers.HOST, port=redis_cluster[0].port)
        try:
            owner = AsyncClaim(client, unique(), replicas=1, replica_timeout_ms=100)
            with pytest.raises(NotReplicatedError) as info:
                await owner.acquire()
            assert info.value.acknowledged == 0
            assert await client.get(owner.claim_key) == owner.token.encode()
        finally:
            await client.aclose()

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"replicas": -1}, InvalidArgumentError),
        ({"replicas": True}, InvalidArgumentTypeError),
        ({"replicas": "1"}, InvalidArgumentTypeError),
        ({"replicas": 1, "replica_timeout_ms": 0}, InvalidArgumentError),
        ({"replicas": 1, "replica_timeout_ms": 1.5}, InvalidArgumentTypeError),
        ({"fencing": "yes"}, InvalidArgumentTypeError),
    ],
)
def test_bad_durability_options_are_refused_at_construction(kwargs: dict[str, Any], error: type[Exception]) -> None:
    """Bad replicas, replica_timeout_ms or fencing raise a typed error when the handle is made."""
    from goblin_claim.testing import fake_redis

    with pytest.raises(error):
        Claim(fake_redis(native=False), "k", **kwargs)
