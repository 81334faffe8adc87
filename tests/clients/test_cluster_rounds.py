"""A claim with replicas on a cluster goes to its primary in one round with its WAIT; a cut connection fails it.

The cluster's nodes sit behind fault proxies sharing one set of faults; the
connection is cut as the claim reaches its node, so nothing runs there. Both
drivers, on the session's cluster (primaries without replicas: a claim that does
reach its node is not acknowledged).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
import redis
import redis.asyncio.cluster
import redis.cluster

from goblin_claim import AsyncClaim, Claim, ConnectionFailedError, NotReplicatedError
from tests.conftest import unique
from tests.support import servers
from tests.support.proxy import Faults, proxy_nodes


@pytest.fixture
def routed(redis_cluster: list[servers.RedisProcess]) -> Iterator[tuple[Faults, Any, int]]:
    """The shared faults, the address remap through one proxy per node, and the first proxy's port."""
    faults = Faults()
    with proxy_nodes([node.port for node in redis_cluster], faults) as (proxies, remap):
        yield faults, remap, proxies[0].port


@pytest.fixture
def raw(redis_cluster: list[servers.RedisProcess]) -> Iterator[redis.cluster.RedisCluster]:
    """A cluster client straight to the nodes."""
    client = redis.cluster.RedisCluster(host=servers.HOST, port=redis_cluster[0].port)
    yield client
    client.close()


def test_a_replicated_claim_cut_before_its_node_raises_connection_failed(
    routed: tuple[Faults, Any, int], raw: redis.cluster.RedisCluster
) -> None:
    """Cut before the primary: ConnectionFailedError, nothing claimed; once the round passes, the claim runs."""
    faults, remap, port = routed
    client = redis.cluster.RedisCluster(host=servers.HOST, port=port, address_remap=remap)
    claim = Claim(client, unique("replicated"), replicas=1, replica_timeout_ms=50, lease=30)
    try:
        faults.drop_before(claim.claim_key.encode(), times=None)
        with pytest.raises(ConnectionFailedError) as caught:
            claim.acquire()
        assert caught.value.key == claim.key
        assert faults.dropped(claim.claim_key.encode()) >= 1
        assert raw.get(claim.claim_key) is None
        faults.clear()
        with pytest.raises(NotReplicatedError):  # it reached the primary; no replica acknowledged it
            claim.acquire()
        assert raw.get(claim.claim_key) == claim.token.encode()  # taken on the primary, unacknowledged
    finally:
        client.close()


def test_an_async_replicated_claim_cut_before_its_node_raises_connection_failed(
    routed: tuple[Faults, Any, int], raw: redis.cluster.RedisCluster
) -> None:
    """The asyncio twin."""
    faults, remap, port = routed

    async def main() -> AsyncClaim:
        client = redis.asyncio.cluster.RedisCluster(host=servers.HOST, port=port, address_remap=remap)
        claim = AsyncClaim(client, unique("replicated"), replicas=1, replica_timeout_ms=50, lease=30)
        try:
            faults.drop_before(claim.claim_key.encode(), times=None)
            with pytest.raises(ConnectionFailedError) as caught:
                await claim.acquire()
            assert caught.value.key == claim.key
            assert raw.get(claim.claim_key) is None
            faults.clear()
            with pytest.raises(NotReplicatedError):
                await claim.acquire()
        finally:
            await client.aclose()
        return claim

    claim = asyncio.run(main())
    assert faults.dropped(claim.claim_key.encode()) >= 1
