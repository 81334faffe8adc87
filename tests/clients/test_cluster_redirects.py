"""A claim with replicas follows its slot: to the new owner after MOVED, to the importing node after ASK.

A cluster of two primaries of each test's own (its slots are moved under the
client's feet), no replicas: a claim that reaches a primary is taken there and
not acknowledged (NotReplicatedError), which shows which node ran it. Both drivers.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
import redis
import redis.asyncio.cluster
import redis.cluster
from redis.crc import key_slot

from goblin_claim import AsyncClaim, Claim, Claimed, Completed, InFlight, NotReplicatedError
from tests.conftest import record, unique, until, until_async
from tests.support import servers


@pytest.fixture
def nodes(redis_server_binary: str) -> Iterator[list[servers.RedisProcess]]:
    """Two primaries of the test's own (its slots are moved)."""
    with servers.cluster(redis_server_binary, primaries=2) as made:
        yield made


def _ids(nodes: list[servers.RedisProcess]) -> list[str]:
    ids = []
    for node in nodes:
        client = node.client()
        ids.append(client.execute_command("CLUSTER MYID").decode())
        client.close()
    return ids


def _owner_and_other(nodes: list[servers.RedisProcess], claim_key: str) -> tuple[int, int]:
    owner = 0 if key_slot(claim_key.encode()) < 8192 else 1
    return owner, 1 - owner


def _move(nodes: list[servers.RedisProcess], slot: int, to: int) -> None:
    """Give ``slot`` (empty) to node ``to``, on every node: the clients' tables are now stale."""
    target = _ids(nodes)[to]
    for index in (to, 1 - to):
        client = nodes[index].client()
        client.execute_command("CLUSTER SETSLOT", slot, "NODE", target)
        client.close()


def _migrate(nodes: list[servers.RedisProcess], slot: int, source: int) -> None:
    """Start moving ``slot`` from ``source`` to the other node: keys absent on the source are asked of the other."""
    ids = _ids(nodes)
    importing, migrating = nodes[1 - source].client(), nodes[source].client()
    importing.execute_command("CLUSTER SETSLOT", slot, "IMPORTING", ids[source])
    migrating.execute_command("CLUSTER SETSLOT", slot, "MIGRATING", ids[1 - source])
    importing.close()
    migrating.close()


def _held_on(node: servers.RedisProcess, claim_key: str, asking: bool = False) -> Any:
    client = node.client()
    try:
        pipe = client.pipeline(transaction=False)
        if asking:
            pipe.execute_command("ASKING")
        pipe.get(claim_key)
        return pipe.execute()[-1]
    finally:
        client.close()


def _redirect(nodes: list[servers.RedisProcess], claim_key: str, how: str) -> tuple[int, bool]:
    """Move the claim's slot away (``moved``) or start migrating it (``ask``), after the client read the table.

    Returns the node the claim must run on, and whether reading it there takes ``ASKING``.
    """
    owner, other = _owner_and_other(nodes, claim_key)
    slot = key_slot(claim_key.encode())
    if how == "moved":
        _move(nodes, slot, other)
    else:
        _migrate(nodes, slot, owner)
    return other, how == "ask"


# MOVED: the slot moved after the client read the table, so the claim runs on the new owner,
# not the old. ASK: the slot is migrating and the key is not on the source, so the claim is
# asked of, and runs on, the importing node.
REDIRECTS = ["moved", "ask"]


@pytest.mark.parametrize("how", REDIRECTS)
def test_a_replicated_claim_follows_its_slot(nodes: list[servers.RedisProcess], how: str) -> None:
    """A claim with replicas follows MOVED to the slot's new owner and ASK to the importing node."""
    client = redis.cluster.RedisCluster(host=servers.HOST, port=nodes[0].port)
    claim = Claim(client, unique(how), replicas=1, replica_timeout_ms=50, lease=30)
    try:
        client.ping()  # the table is read
        runs_on, asking = _redirect(nodes, claim.claim_key, how)
        with pytest.raises(NotReplicatedError):
            claim.acquire()
        assert _held_on(nodes[runs_on], claim.claim_key, asking=asking) == claim.token.encode()
    finally:
        client.close()


@pytest.mark.parametrize("how", REDIRECTS)
def test_an_async_replicated_claim_follows_its_slot(nodes: list[servers.RedisProcess], how: str) -> None:
    """The asyncio twin."""

    async def main() -> tuple[AsyncClaim, int, bool]:
        client = redis.asyncio.cluster.RedisCluster(host=servers.HOST, port=nodes[0].port)
        claim = AsyncClaim(client, unique(how), replicas=1, replica_timeout_ms=50, lease=30)
        try:
            await client.ping()
            runs_on, asking = _redirect(nodes, claim.claim_key, how)
            with pytest.raises(NotReplicatedError):
                await claim.acquire()
        finally:
            await client.aclose()
        return claim, runs_on, asking

    claim, runs_on, asking = asyncio.run(main())
    assert _held_on(nodes[runs_on], claim.claim_key, asking=asking) == claim.token.encode()


# --------------------------------------------------------------------------- renewals of a migrated key


def _migrate_key(nodes: list[servers.RedisProcess], claim_key: str, source: int) -> None:
    """Move ``claim_key``'s slot, with the key, from ``source`` to the other node, as a resharding would."""
    slot = key_slot(claim_key.encode())
    target = 1 - source
    _migrate(nodes, slot, source)
    migrating = nodes[source].client()
    try:
        migrating.execute_command("MIGRATE", servers.HOST, nodes[target].port, claim_key, 0, 5000)
    finally:
        migrating.close()
    _move(nodes, slot, target)


def test_renewals_follow_a_key_migrated_to_another_node(nodes: list[servers.RedisProcess]) -> None:
    """The claim's slot moves to the other node while the keep-alive runs: it renews there, and the work completes."""
    client = redis.cluster.RedisCluster(host=servers.HOST, port=nodes[0].port)
    claim = Claim(client, unique("renewed"), lease=6)
    try:
        assert isinstance(claim.acquire(), Claimed)
        owner, other = _owner_and_other(nodes, claim.claim_key)
        with claim.keep_alive(interval=1) as keeper:
            assert until(lambda: keeper.renewals >= 1, 15)
            _migrate_key(nodes, claim.claim_key, owner)
            moved_at = keeper.renewals
            assert until(lambda: keeper.renewals >= moved_at + 2, 15)
            assert not keeper.lost
        claim.complete(b"done")
        assert _held_on(nodes[other], claim.claim_key) == record(claim.token, b"done")
    finally:
        client.close()


def test_async_renewals_follow_a_key_migrated_to_another_node(nodes: list[servers.RedisProcess]) -> None:
    """The asyncio twin."""

    async def main() -> tuple[AsyncClaim, int]:
        client = redis.asyncio.cluster.RedisCluster(host=servers.HOST, port=nodes[0].port)
        claim = AsyncClaim(client, unique("renewed"), lease=6)
        try:
            assert isinstance(await claim.acquire(), Claimed)
            owner, other = _owner_and_other(nodes, claim.claim_key)
            async with claim.keep_alive(interval=1) as keeper:
                assert await until_async(lambda: keeper.renewals >= 1, 15)
                _migrate_key(nodes, claim.claim_key, owner)
                moved_at = keeper.renewals
                assert await until_async(lambda: keeper.renewals >= moved_at + 2, 15)
                assert not keeper.lost
            await claim.complete(b"done")
        finally:
            await client.aclose()
        return claim, other

    claim, other = asyncio.run(main())
    assert _held_on(nodes[other], claim.claim_key) == record(claim.token, b"done")


# --------------------------------------------------------------------------- the server's own commands


def _plain_flow_sync(client: Any, key: str) -> tuple[Claim, object, object]:
    claim = Claim(client, key, lease=30)
    taken = claim.acquire()
    busy = Claim(client, key).acquire()  # SET ... NX GET, then GET, PTTL and PEXPIRETIME, pipelined
    claim.complete(b"done")  # Valkey: SET ... IFEQ and its SPUBLISH, pipelined; Redis 7: the script
    return claim, taken, busy


@pytest.mark.parametrize("redis_server_binary", ["redis", "valkey"], indirect=True)
@pytest.mark.parametrize("how", REDIRECTS)
def test_a_plain_claim_its_read_its_store_and_forget_follow_their_slot(
    nodes: list[servers.RedisProcess], how: str
) -> None:
    """SET ... NX GET, the in-flight read behind it and the store (SET ... IFEQ on Valkey) follow MOVED and ASK.

    forget()'s DEL follows MOVED. Under ASK it is refused, as forget.lua is: both name the
    record and its checkpoint key, and a slot being imported answers TRYAGAIN to a command
    on several keys not all there; the cluster client gives up ("TTL exhausted").
    """
    client = redis.cluster.RedisCluster(host=servers.HOST, port=nodes[0].port)
    key = unique(how)
    try:
        client.ping()  # the table is read
        runs_on, asking = _redirect(nodes, Claim(client, key).claim_key, how)
        claim, taken, busy = _plain_flow_sync(client, key)
        assert isinstance(taken, Claimed)
        assert isinstance(busy, InFlight)
        assert busy.holder == claim.token
        assert busy.retry_after is not None
        assert _held_on(nodes[runs_on], claim.claim_key, asking=asking) == record(claim.token, b"done")
        assert Claim(client, key).acquire() == Completed(key=key, value=b"done")
        if how == "moved":
            assert claim.forget() is True
            assert _held_on(nodes[runs_on], claim.claim_key, asking=asking) is None
    finally:
        client.close()


@pytest.mark.parametrize("redis_server_binary", ["redis", "valkey"], indirect=True)
@pytest.mark.parametrize("how", REDIRECTS)
def test_an_async_plain_claim_its_read_its_store_and_forget_follow_their_slot(
    nodes: list[servers.RedisProcess], how: str
) -> None:
    """The asyncio twin."""
    key = unique(how)

    async def main() -> tuple[AsyncClaim, object, object, object, bool]:
        client = redis.asyncio.cluster.RedisCluster(host=servers.HOST, port=nodes[0].port)
        try:
            await client.ping()
            claim = AsyncClaim(client, key, lease=30)
            moved[:] = _redirect(nodes, claim.claim_key, how)
            taken = await claim.acquire()
            busy = await AsyncClaim(client, key).acquire()
            await claim.complete(b"done")
            again = await AsyncClaim(client, key).acquire()
            forgot = await claim.forget() if how == "moved" else None  # under ASK: see the sync test
        finally:
            await client.aclose()
        return claim, taken, busy, again, forgot

    moved: list[Any] = []
    claim, taken, busy, again, forgot = asyncio.run(main())
    runs_on, asking = moved
    assert isinstance(taken, Claimed)
    assert isinstance(busy, InFlight)
    assert busy.holder == claim.token
    assert again == Completed(key=key, value=b"done")
    if how == "moved":
        assert forgot is True
        assert _held_on(nodes[runs_on], claim.claim_key, asking=asking) is None
    else:
        assert _held_on(nodes[runs_on], claim.claim_key, asking=asking) == record(claim.token, b"done")
