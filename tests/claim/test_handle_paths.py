"""A handle reading what it cannot decode, a repeated claim failing while it holds the work, an interrupted claim.

Both drivers: fakeredis and the standalone server for the first, the
standalone server behind a fault proxy for the others.
"""

from __future__ import annotations

import asyncio
import signal
import threading
from collections.abc import Callable, Iterator
from types import FrameType

import pytest
import redis
import redis.asyncio
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff
from redis.retry import Retry

from goblin_claim import AsyncClaim, Claim, Claimed, ConnectionFailedError, UnreadableResultError
from tests.conftest import Driver, record, unique
from tests.support import servers
from tests.support.proxy import FaultProxy

BACKENDS = ("fake", "standalone")


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_decoding_client_reading_bytes_it_cannot_decode_raises_unreadable_result(
    make_driver: Callable[..., Driver], kind: str
) -> None:
    """Another writer stored non-UTF-8 bytes as the result: a decode_responses client is told so, not crashed."""
    driver = make_driver(kind, decode_responses=True)
    namespace = unique("ns")
    key = unique("bytes")
    handle = driver.claim(key, namespace=namespace)
    driver.raw.set(handle.result_key, record("other-writer", b"\xff\xfe receipt"), ex=600)
    with pytest.raises(UnreadableResultError) as caught:
        handle.acquire()
    assert caught.value.key == key
    assert "cannot decode" in str(caught.value)


@pytest.fixture
def proxy(redis_standalone: servers.RedisProcess) -> Iterator[FaultProxy]:
    """A fault proxy in front of the standalone server."""
    with FaultProxy(redis_standalone.port) as made:
        yield made


def test_a_repeated_claim_cut_on_the_wire_leaves_the_holder_able_to_complete(
    proxy: FaultProxy, redis_standalone: servers.RedisProcess
) -> None:
    """Claimed, then acquire() again is cut before the server: ConnectionFailedError; the work still completes."""
    raw = redis.Redis(host=servers.HOST, port=redis_standalone.port)
    client = redis.Redis(host=servers.HOST, port=proxy.port, retry=Retry(NoBackoff(), 0))
    claim = Claim(client, unique("again"), lease=30)
    try:
        assert isinstance(claim.acquire(), Claimed)
        proxy.faults.drop_before(claim.claim_key.encode())
        with pytest.raises(ConnectionFailedError):
            claim.acquire()
        assert raw.get(claim.claim_key) == claim.token.encode()  # still this handle's
        claim.complete(b"done")
        assert raw.get(claim.claim_key) == record(claim.token, b"done")
    finally:
        client.close()
        raw.close()


def test_an_async_repeated_claim_cut_on_the_wire_leaves_the_holder_able_to_complete(
    proxy: FaultProxy, redis_standalone: servers.RedisProcess
) -> None:
    """The asyncio twin."""
    raw = redis.Redis(host=servers.HOST, port=redis_standalone.port)

    async def main() -> AsyncClaim:
        client = redis.asyncio.Redis(host=servers.HOST, port=proxy.port, retry=AsyncRetry(NoBackoff(), 0))
        claim = AsyncClaim(client, unique("again"), lease=30)
        try:
            assert isinstance(await claim.acquire(), Claimed)
            proxy.faults.drop_before(claim.claim_key.encode())
            with pytest.raises(ConnectionFailedError):
                await claim.acquire()
            assert raw.get(claim.claim_key) == claim.token.encode()
            await claim.complete(b"done")
        finally:
            await client.aclose()
        return claim

    try:
        claim = asyncio.run(main())
        assert raw.get(claim.claim_key) == record(claim.token, b"done")
    finally:
        raw.close()


class Interrupted(BaseException):
    """What a signal handler raises into the blocked caller (as Ctrl-C's KeyboardInterrupt does)."""


def test_a_sync_claim_interrupted_while_its_reply_is_held_back_is_given_back(
    proxy: FaultProxy, redis_standalone: servers.RedisProcess
) -> None:
    """The server took the claim, no reply came, a signal interrupted the caller: the claim is released."""
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signals reach the main thread only")

    def handler(signum: int, frame: FrameType | None) -> None:
        raise Interrupted

    raw = redis.Redis(host=servers.HOST, port=redis_standalone.port)
    client = redis.Redis(host=servers.HOST, port=proxy.port)
    claim = Claim(client, unique("held"), lease=60)
    previous = signal.signal(signal.SIGALRM, handler)
    try:
        proxy.faults.hold_next_reply(claim.claim_key.encode())
        signal.setitimer(signal.ITIMER_REAL, 1.0)
        with pytest.raises(Interrupted):
            claim.acquire()
        signal.setitimer(signal.ITIMER_REAL, 0)
        assert proxy.faults.lost(claim.claim_key.encode()) == 1  # the claim ran on the server
        assert raw.get(claim.claim_key) is None  # and was given back
        assert isinstance(Claim(client, claim.key, lease=60).acquire(), Claimed)  # a retry claims at once
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        client.close()
        raw.close()
