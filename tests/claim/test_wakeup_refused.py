"""wait() for a client whose ACL refuses pub/sub: the waiter polls and still sees the result.

An ACL user with every command but the subscribe family, on the session's
standalone redis-server; both drivers.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Iterator

import pytest
import redis
import redis.asyncio

from goblin_claim import AsyncClaim, Claim, Claimed, Completed, InFlight
from tests.conftest import unique, until
from tests.support import servers

PASSWORD = "no-pubsub-pw"


@pytest.fixture
def no_pubsub_user(redis_standalone: servers.RedisProcess) -> Iterator[str]:
    """An ACL user that may run everything except SUBSCRIBE, PSUBSCRIBE and SSUBSCRIBE."""
    name = unique("nopubsub")
    admin = redis.Redis(host=servers.HOST, port=redis_standalone.port)
    admin.execute_command(
        "ACL", "SETUSER", name, "on", f">{PASSWORD}", "~*", "&*", "+@all", "-subscribe", "-psubscribe", "-ssubscribe"
    )
    try:
        yield name
    finally:
        admin.execute_command("ACL", "DELUSER", name)
        admin.close()


def _wakeup_lines(caplog: pytest.LogCaptureFixture) -> list[tuple[str, str]]:
    return [(r.wakeup, r.getMessage()) for r in caplog.records if r.name == "goblin_claim.wakeup"]  # type: ignore[attr-defined]


def test_a_sync_waiter_refused_pub_sub_polls_and_gets_the_result(
    redis_standalone: servers.RedisProcess, no_pubsub_user: str, caplog: pytest.LogCaptureFixture
) -> None:
    """SUBSCRIBE is refused (NOPERM): wait() polls on and returns the owner's result, and the log says it polls."""
    raw = redis.Redis(host=servers.HOST, port=redis_standalone.port)
    client = redis.Redis(host=servers.HOST, port=redis_standalone.port, username=no_pubsub_user, password=PASSWORD)
    key, namespace = unique("order"), unique("ns")
    owner = Claim(raw, key, namespace=namespace, lease=30)
    waiter = Claim(client, key, namespace=namespace, lease=30)
    try:
        assert isinstance(owner.acquire(), Claimed)
        assert waiter.acquire() == InFlight(key=key)
        finisher = threading.Timer(1.0, owner.complete, args=(b"receipt",))
        finisher.start()
        try:
            with caplog.at_level(logging.INFO, logger="goblin_claim.wakeup"):
                assert waiter.wait(timeout=20) == Completed(key=key, value=b"receipt")
                until(lambda: bool(_wakeup_lines(caplog)), timeout=5)
        finally:
            finisher.join()
    finally:
        client.close()
        raw.close()
    assert owner.acquire() == Completed(key=key, value=b"receipt")
    # Never "woken by pub/sub": the subscription was refused, not confirmed.
    assert _wakeup_lines(caplog) == [("poll", "Redis: waiters poll (pub/sub refused)")]


def test_an_async_waiter_refused_pub_sub_polls_and_gets_the_result(
    redis_standalone: servers.RedisProcess, no_pubsub_user: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The asyncio twin: the subscriber's task is refused, wait() polls on and returns the result."""
    key, namespace = unique("order"), unique("ns")

    async def main() -> object:
        raw = redis.asyncio.Redis(host=servers.HOST, port=redis_standalone.port)
        client = redis.asyncio.Redis(
            host=servers.HOST, port=redis_standalone.port, username=no_pubsub_user, password=PASSWORD
        )
        owner = AsyncClaim(raw, key, namespace=namespace, lease=30)
        waiter = AsyncClaim(client, key, namespace=namespace, lease=30)
        try:
            assert isinstance(await owner.acquire(), Claimed)
            assert await waiter.acquire() == InFlight(key=key)

            async def finish() -> None:
                await asyncio.sleep(1.0)
                await owner.complete(b"receipt")

            finisher = asyncio.ensure_future(finish())
            outcome = await waiter.wait(timeout=20)
            await finisher
            return outcome
        finally:
            await client.aclose()
            await raw.aclose()

    with caplog.at_level(logging.INFO, logger="goblin_claim.wakeup"):
        assert asyncio.run(main()) == Completed(key=key, value=b"receipt")
    assert _wakeup_lines(caplog) == [("poll", "Redis: waiters poll (pub/sub refused)")]
