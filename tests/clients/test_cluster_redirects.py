"""A claim with replicas follows its slot: to the new owner after MOVED, to the importing node after ASK.

A cluster of two primaries of each test's own (its slots are moved under the
client's feet), no replicas: a claim that reaches a primary is taken there and
not acknowledged (NotReplicatedError), which shows which node ran it. Both drivers.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
import redis.asyncio.cluster
import redis.cluster
from redis.crc import key_slot

from goblin_claim import AsyncClaim, Claim, Claimed, NotReplicatedError
from tests.conftest import record, unique
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


def _sync_claim(nodes: list[servers.RedisProcess]) -> tuple[redis.cluster.RedisCluster, Claim]:
    client = redis.cluster.RedisCluster(host=servers.HOST, port=nodes[0].port)
    return client, Claim(client, unique("moved"), replicas=1, replica_timeout_ms=50, lease=30)


def test_a_replicated_claim_follows_moved_to_the_slots_new_owner(nodes: list[servers.RedisProcess]) -> None:
    """The slot moved after the client read the table: the claim runs on the new owner, not the old."""
    client, claim = _sync_claim(nodes)
    try:
        client.ping()  # the table is read
        _, other = _owner_and_other(nodes, claim.claim_key)
        _move(nodes, key_slot(claim.claim_key.encode()), other)
        with pytest.raises(NotReplicatedError):
            claim.acquire()
        assert _held_on(nodes[other], claim.claim_key) == claim.token.encode()
    finally:
        client.close()


def test_an_async_replicated_claim_follows_moved_to_the_slots_new_owner(nodes: list[servers.RedisProcess]) -> None:
    """The asyncio twin."""

    async def main() -> tuple[AsyncClaim, int]:
        client = redis.asyncio.cluster.RedisCluster(host=servers.HOST, port=nodes[0].port)
        claim = AsyncClaim(client, unique("moved"), replicas=1, replica_timeout_ms=50, lease=30)
        try:
            await client.ping()
            _, other = _owner_and_other(nodes, claim.claim_key)
            _move(nodes, key_slot(claim.claim_key.encode()), other)
            with pytest.raises(NotReplicatedError):
                await claim.acquire()
        finally:
            await client.aclose()
        return claim, other

    claim, other = asyncio.run(main())
    assert _held_on(nodes[other], claim.claim_key) == claim.token.encode()


def test_a_replicated_claim_follows_ask_to_the_importing_node(nodes: list[servers.RedisProcess]) -> None:
    """The slot is migrating and the key is not on the source: the claim is asked of, and runs on, the target."""
    client, claim = _sync_claim(nodes)
    try:
        client.ping()
        owner, other = _owner_and_other(nodes, claim.claim_key)
        _migrate(nodes, key_slot(claim.claim_key.encode()), owner)
        with pytest.raises(NotReplicatedError):
            claim.acquire()
        assert _held_on(nodes[other], claim.claim_key, asking=True) == claim.token.encode()
    finally:
        client.close()


def test_an_async_replicated_claim_follows_ask_to_the_importing_node(nodes: list[servers.RedisProcess]) -> None:
    """The asyncio twin."""

    async def main() -> tuple[AsyncClaim, int]:
        client = redis.asyncio.cluster.RedisCluster(host=servers.HOST, port=nodes[0].port)
        claim = AsyncClaim(client, unique("asked"), replicas=1, replica_timeout_ms=50, lease=30)
        try:
            await client.ping()
            owner, other = _owner_and_other(nodes, claim.claim_key)
            _migrate(nodes, key_slot(claim.claim_key.encode()), owner)
            with pytest.raises(NotReplicatedError):
                await claim.acquire()
        finally:
            await client.aclose()
        return claim, other

    claim, other = asyncio.run(main())
    assert _held_on(nodes[other], claim.claim_key, asking=True) == claim.token.encode()


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


def _until(condition: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_renewals_follow_a_key_migrated_to_another_node(nodes: list[servers.RedisProcess]) -> None:
    """The claim's slot moves to the other node while the keep-alive runs: it renews there, and the work completes."""
    client = redis.cluster.RedisCluster(host=servers.HOST, port=nodes[0].port)
    claim = Claim(client, unique("renewed"), lease=6)
    try:
        assert isinstance(claim.acquire(), Claimed)
        owner, other = _owner_and_other(nodes, claim.claim_key)
        with claim.keep_alive(interval=1) as keeper:
            assert _until(lambda: keeper.renewals >= 1, 15)
            _migrate_key(nodes, claim.claim_key, owner)
            moved_at = keeper.renewals
            assert _until(lambda: keeper.renewals >= moved_at + 2, 15)
            assert not keeper.lost
        claim.complete(b"done")
        assert _held_on(nodes[other], claim.claim_key) == record(claim.token, b"done")
    finally:
        client.close()


def test_async_renewals_follow_a_key_migrated_to_another_node(nodes: list[servers.RedisProcess]) -> None:
    """The asyncio twin."""

    async def until(condition: Callable[[], bool], timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while not condition():
            if time.monotonic() > deadline:
                return False
            await asyncio.sleep(0.05)
        return True

    async def main() -> tuple[AsyncClaim, int]:
        client = redis.asyncio.cluster.RedisCluster(host=servers.HOST, port=nodes[0].port)
        claim = AsyncClaim(client, unique("renewed"), lease=6)
        try:
            assert isinstance(await claim.acquire(), Claimed)
            owner, other = _owner_and_other(nodes, claim.claim_key)
            async with claim.keep_alive(interval=1) as keeper:
                assert await until(lambda: keeper.renewals >= 1, 15)
                _migrate_key(nodes, claim.claim_key, owner)
                moved_at = keeper.renewals
                assert await until(lambda: keeper.renewals >= moved_at + 2, 15)
                assert not keeper.lost
            await claim.complete(b"done")
        finally:
            await client.aclose()
        return claim, other

    claim, other = asyncio.run(main())
    assert _held_on(nodes[other], claim.claim_key) == record(claim.token, b"done")
