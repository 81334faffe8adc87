"""keep_alive() when renewals fail on the wire: a dropped renewal is retried, renewals failing for a lease lose it.

A loopback fault proxy cuts the connection as a renewal reaches it; the clients
retry nothing themselves, so the keep-alive's own retries are what is tested.
Both drivers, on the session's standalone redis-server.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
import redis
import redis.asyncio
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff
from redis.retry import Retry

from goblin_claim import AsyncClaim, Claim, Claimed, ClaimLostError
from tests.conftest import record, unique, until, until_async
from tests.support import servers
from tests.support.proxy import FaultProxy


@pytest.fixture
def proxy(redis_standalone: servers.RedisProcess) -> Iterator[FaultProxy]:
    """A fault proxy in front of the standalone server."""
    with FaultProxy(redis_standalone.port) as made:
        yield made


@pytest.fixture
def raw(redis_standalone: servers.RedisProcess) -> Iterator[redis.Redis]:
    """A client straight to the server, past the proxy."""
    client = redis.Redis(host=servers.HOST, port=redis_standalone.port)
    yield client
    client.close()


def test_a_renewal_cut_on_the_wire_is_retried_and_the_claim_kept(proxy: FaultProxy, raw: redis.Redis) -> None:
    """Sync: the first renewal's connection is cut; the keep-alive renews again within the lease and completes."""
    client = redis.Redis(host=servers.HOST, port=proxy.port, retry=Retry(NoBackoff(), 0))
    claim = Claim(client, unique("renew"), lease=6)
    try:
        assert isinstance(claim.acquire(), Claimed)
        proxy.faults.drop_before(claim.claim_key.encode())  # the next request naming the key: the renewal
        with claim.keep_alive(interval=1) as keeper:
            assert until(lambda: keeper.renewals >= 1, 15)
            assert not keeper.lost
        assert proxy.faults.dropped(claim.claim_key.encode()) == 1
        claim.complete(b"done")
        assert raw.get(claim.claim_key) == record(claim.token, b"done")
    finally:
        client.close()


def test_an_async_renewal_cut_on_the_wire_is_retried_and_the_claim_kept(proxy: FaultProxy, raw: redis.Redis) -> None:
    """asyncio: the same, from the event loop's renewals."""

    async def main() -> AsyncClaim:
        client = redis.asyncio.Redis(host=servers.HOST, port=proxy.port, retry=AsyncRetry(NoBackoff(), 0))
        claim = AsyncClaim(client, unique("renew"), lease=6)
        try:
            assert isinstance(await claim.acquire(), Claimed)
            proxy.faults.drop_before(claim.claim_key.encode())
            async with claim.keep_alive(interval=1) as keeper:
                assert await until_async(lambda: keeper.renewals >= 1, 15)
                assert not keeper.lost
            await claim.complete(b"done")
        finally:
            await client.aclose()
        return claim

    claim = asyncio.run(main())
    assert proxy.faults.dropped(claim.claim_key.encode()) == 1
    assert raw.get(claim.claim_key) == record(claim.token, b"done")


def _lost_setup(proxy: FaultProxy, claim: Any) -> None:
    proxy.faults.drop_before(claim.claim_key.encode(), times=None)  # every renewal, until cleared


def test_renewals_failing_for_the_whole_lease_lose_the_claim(proxy: FaultProxy, raw: redis.Redis) -> None:
    """Sync: no renewal gets through: lost before the lease lapses; once it has, complete() refuses, writing nothing."""
    client = redis.Redis(host=servers.HOST, port=proxy.port, retry=Retry(NoBackoff(), 0))
    claim = Claim(client, unique("lapse"), lease=2)
    try:
        assert isinstance(claim.acquire(), Claimed)
        _lost_setup(proxy, claim)
        with claim.keep_alive(interval=0.5) as keeper:
            assert until(lambda: keeper.lost, 15)
            assert keeper.renewals == 0
        assert proxy.faults.dropped(claim.claim_key.encode()) >= 1
        assert until(lambda: raw.get(claim.claim_key) is None, 15)  # unrenewed, the lease lapsed on the server
        proxy.faults.clear()
        with pytest.raises(ClaimLostError):
            claim.complete(b"late")
        assert raw.get(claim.claim_key) is None  # the late result is not written
    finally:
        client.close()


def test_async_renewals_failing_for_the_whole_lease_lose_the_claim(proxy: FaultProxy, raw: redis.Redis) -> None:
    """asyncio: the same."""

    async def main() -> AsyncClaim:
        client = redis.asyncio.Redis(host=servers.HOST, port=proxy.port, retry=AsyncRetry(NoBackoff(), 0))
        claim = AsyncClaim(client, unique("lapse"), lease=2)
        try:
            assert isinstance(await claim.acquire(), Claimed)
            _lost_setup(proxy, claim)
            async with claim.keep_alive(interval=0.5) as keeper:
                assert await until_async(lambda: keeper.lost, 15)
                assert keeper.renewals == 0
            assert await until_async(lambda: raw.get(claim.claim_key) is None, 15)
            proxy.faults.clear()
            with pytest.raises(ClaimLostError):
                await claim.complete(b"late")
        finally:
            await client.aclose()
        return claim

    claim = asyncio.run(main())
    assert proxy.faults.dropped(claim.claim_key.encode()) >= 1
    assert raw.get(claim.claim_key) is None
