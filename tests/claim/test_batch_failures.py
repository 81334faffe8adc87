"""acquire_many / release_many when Redis fails under the batch: the error the caller gets, and what is left.

An unreachable server, a batch interrupted while its claims are on the wire, a
claim key of the wrong type in a release batch: both drivers, on fakeredis and
on real servers.
"""

from __future__ import annotations

import asyncio
import signal
import threading
from collections.abc import Iterator
from types import FrameType
from typing import Any

import pytest
import redis
import redis.asyncio
from redis.backoff import NoBackoff
from redis.retry import Retry

from goblin_claim import AsyncClaim, Claim, Claimed, ConnectionFailedError, WrongTypeError
from tests.conftest import Driver, unique
from tests.support import servers
from tests.support.proxy import FaultProxy

BACKENDS = ("fake", "fake-native", "standalone", "cluster")


def _release_many(driver: Driver, handles: list[Any]) -> list[bool]:
    if driver.run is None:
        return Claim.release_many(driver.client, handles)
    inner = [handle._handle for handle in handles]
    return driver.run(AsyncClaim.release_many(driver.client, inner))  # type: ignore[no-any-return]


def test_release_many_over_a_wrong_type_claim_key_raises_and_releases_the_others(driver: Driver) -> None:
    """A claim key turned into a hash: WrongTypeError for that key; the batch's other claims are released."""
    namespace = unique("ns")
    first, odd, last = (driver.claim(unique(name), namespace=namespace, lease=30) for name in ("a", "odd", "b"))
    for handle in (first, odd, last):
        assert isinstance(handle.acquire(), Claimed)
    driver.raw.delete(odd.claim_key)
    driver.raw.hset(odd.claim_key, "f", "v")

    with pytest.raises(WrongTypeError) as caught:
        _release_many(driver, [first, odd, last])
    assert caught.value.key == odd.key
    assert "not a string" in str(caught.value)
    assert driver.raw.get(first.claim_key) is None
    assert driver.raw.get(last.claim_key) is None
    assert driver.raw.hgetall(odd.claim_key) == {b"f": b"v"}  # the foreign value is left alone


# --------------------------------------------------------------------------- an unreachable server


@pytest.fixture
def nobody_port() -> int:
    """A loopback port nobody listens on."""
    return servers.free_port()


def test_acquire_many_on_an_unreachable_server_raises_connection_failed(nobody_port: int) -> None:
    """No server: ConnectionFailedError for the batch, carrying its first key."""
    client = redis.Redis(host=servers.HOST, port=nobody_port, retry=Retry(NoBackoff(), 0))
    keys = [unique("a"), unique("b")]
    try:
        with pytest.raises(ConnectionFailedError) as caught:
            Claim.acquire_many(client, keys, namespace=unique("ns"))
    finally:
        client.close()
    assert caught.value.key == keys[0]
    assert "a batch of 2 claims" in str(caught.value)


def test_async_acquire_many_on_an_unreachable_server_raises_connection_failed(nobody_port: int) -> None:
    """The asyncio twin: ConnectionFailedError for the batch, carrying its first key."""

    async def main() -> ConnectionFailedError:
        client = redis.asyncio.Redis(host=servers.HOST, port=nobody_port, retry=None)
        try:
            with pytest.raises(ConnectionFailedError) as caught:
                await AsyncClaim.acquire_many(client, keys, namespace=unique("ns"))
        finally:
            await client.aclose()
        return caught.value

    keys = [unique("a"), unique("b")]
    error = asyncio.run(main())
    assert error.key == keys[0]
    assert "a batch of 2 claims" in str(error)


def test_release_many_on_an_unreachable_server_raises_connection_failed(nobody_port: int) -> None:
    """No server: ConnectionFailedError for the release batch, carrying its first key."""
    client = redis.Redis(host=servers.HOST, port=nobody_port, retry=Retry(NoBackoff(), 0))
    handles = [Claim(client, unique("a")), Claim(client, unique("b")), Claim(client, unique("c"))]
    try:
        with pytest.raises(ConnectionFailedError) as caught:
            Claim.release_many(client, handles)
    finally:
        client.close()
    assert caught.value.key == handles[0].key
    assert "a batch of 3 releases" in str(caught.value)


def test_async_release_many_on_an_unreachable_server_raises_connection_failed(nobody_port: int) -> None:
    """The asyncio twin: ConnectionFailedError for the release batch, carrying its first key."""

    async def main() -> tuple[ConnectionFailedError, str]:
        client = redis.asyncio.Redis(host=servers.HOST, port=nobody_port, retry=None)
        handles = [AsyncClaim(client, unique("a")), AsyncClaim(client, unique("b"))]
        try:
            with pytest.raises(ConnectionFailedError) as caught:
                await AsyncClaim.release_many(client, handles)
        finally:
            await client.aclose()
        return caught.value, handles[0].key

    error, first = asyncio.run(main())
    assert error.key == first
    assert "a batch of 2 releases" in str(error)


# --------------------------------------------------------------------------- interrupted on the wire


class Interrupted(BaseException):
    """What a signal handler raises into the blocked caller (as Ctrl-C's KeyboardInterrupt does)."""


@pytest.fixture
def interrupt_after() -> Iterator[Any]:
    """Arm a timer whose signal raises ``Interrupted`` in the main thread, where the sync call blocks."""
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signals reach the main thread only")

    def handler(signum: int, frame: FrameType | None) -> None:
        raise Interrupted

    previous = signal.signal(signal.SIGALRM, handler)

    def arm(seconds: float) -> None:
        signal.setitimer(signal.ITIMER_REAL, seconds)

    try:
        yield arm
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _claim_keys(client: Any, keys: list[str], namespace: str) -> list[str]:
    return [Claim(client, key, namespace=namespace).claim_key for key in keys]


def test_acquire_many_interrupted_while_its_replies_are_held_gives_every_claim_back(
    redis_standalone: servers.RedisProcess, interrupt_after: Any
) -> None:
    """The server took the batch's claims, no reply came, the caller was interrupted: every claim is released."""
    namespace = unique("ns")
    keys = [unique("a"), unique("b"), unique("c")]
    raw = redis.Redis(host=servers.HOST, port=redis_standalone.port)
    with FaultProxy(redis_standalone.port) as proxy:
        client = redis.Redis(host=servers.HOST, port=proxy.port)
        try:
            claim_keys = _claim_keys(client, keys, namespace)
            proxy.faults.hold_next_reply(claim_keys[0].encode())
            interrupt_after(1.0)
            with pytest.raises(Interrupted):
                Claim.acquire_many(client, keys, namespace=namespace, lease=60)
            assert proxy.faults.lost(claim_keys[0].encode()) == 1  # the claims reached the server
            assert [raw.get(claim_key) for claim_key in claim_keys] == [None, None, None]  # and went back
            pairs = Claim.acquire_many(client, keys, namespace=namespace, lease=60)  # a retry claims them at once
            assert all(isinstance(outcome, Claimed) for _, outcome in pairs)
        finally:
            client.close()
            raw.close()


def test_async_acquire_many_cancelled_while_its_replies_are_held_gives_every_claim_back(
    redis_standalone: servers.RedisProcess,
) -> None:
    """The asyncio twin: a batch cancelled (a timeout) with its replies held back leaves no key claimed."""
    namespace = unique("ns")
    keys = [unique("a"), unique("b"), unique("c")]

    async def main() -> None:
        raw = redis.asyncio.Redis(host=servers.HOST, port=redis_standalone.port)
        with FaultProxy(redis_standalone.port) as proxy:
            client = redis.asyncio.Redis(host=servers.HOST, port=proxy.port)
            try:
                claim_keys = [AsyncClaim(client, key, namespace=namespace).claim_key for key in keys]
                proxy.faults.hold_next_reply(claim_keys[0].encode())
                with pytest.raises(asyncio.TimeoutError):
                    await asyncio.wait_for(AsyncClaim.acquire_many(client, keys, namespace=namespace, lease=60), 1.0)
                assert proxy.faults.lost(claim_keys[0].encode()) == 1
                assert [await raw.get(claim_key) for claim_key in claim_keys] == [None, None, None]
                pairs = await AsyncClaim.acquire_many(client, keys, namespace=namespace, lease=60)
                assert all(isinstance(outcome, Claimed) for _, outcome in pairs)
            finally:
                await client.aclose()
                await raw.aclose()

    asyncio.run(main())
