"""Push wake-up: complete(), release() and forget() wake waiters through the claim key's channel.

The waiters here poll every five seconds, so only a wake-up can bring them back
within the bounds these tests allow.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest
import redis
import redis.asyncio
import redis.cluster

from goblin_claim import AsyncClaim, Claim, Claimed, Completed
from goblin_claim._drivers.wakeup import wakeups
from goblin_claim._protocol.timing import Backoff, WaitSchedule
from tests.conftest import Backend, subscribed, unique, until, until_async
from tests.support.servers import HOST

SLOW = Backoff(first=5.0, cap=5.0, floor=5.0)  # a poll every five seconds


class SlowPollingClaim(Claim):
    """A Claim whose wait() polls only every five seconds."""

    __slots__ = ()

    def _wait_schedule(self, timeout: float) -> WaitSchedule:
        return WaitSchedule(timeout, self.key, SLOW)


class SlowPollingAsyncClaim(AsyncClaim):
    """An AsyncClaim whose wait() polls only every five seconds."""

    __slots__ = ()

    def _wait_schedule(self, timeout: float) -> WaitSchedule:
        return WaitSchedule(timeout, self.key, SLOW)


@pytest.mark.parametrize("action", ["complete", "release", "forget"])
def test_sync_waiter_wakes_on_the_announcement(backend: Backend, action: str) -> None:
    """A waiter learns of complete(), release() or forget() long before its next poll."""
    client = backend.sync()
    key = unique()
    owner = Claim(client, key, lease=30)
    owner.acquire()
    waiter = SlowPollingClaim(client, key, lease=30)
    outcome: list[Any] = []

    def wait() -> None:
        outcome.append(waiter.wait(timeout=20))

    thread = threading.Thread(target=wait)
    thread.start()
    # The waiter polled once, found the work in flight and listens; its next poll is 5 s away.
    raw = backend.raw()
    assert until(lambda: subscribed(raw, waiter.claim_key), timeout=10), "never subscribed"
    started = time.monotonic()
    if action == "complete":
        owner.complete(b"done")
    elif action == "release":
        assert owner.release()
    else:
        assert Claim(client, key).forget()
    thread.join(10)
    assert time.monotonic() - started < 2.5
    expected = (
        Completed(key=key, value=b"done") if action == "complete" else Claimed(key=key, token=waiter.token, lease=30)
    )
    assert outcome == [expected]


def test_async_waiter_wakes_on_complete(backend: Backend) -> None:
    """The asyncio twin: a waiting task learns of complete() at once (polls where pub/sub is missing)."""
    raw = backend.raw()

    async def scenario() -> float:
        client = backend.async_()
        try:
            key = unique()
            owner = AsyncClaim(client, key)
            await owner.acquire()
            waiter = SlowPollingAsyncClaim(client, key)
            task = asyncio.create_task(waiter.wait(timeout=20))
            if not backend.is_cluster:  # the asyncio cluster client has no pub/sub: nothing to wait for
                assert await until_async(lambda: subscribed(raw, waiter.claim_key), timeout=10), "never subscribed"
            started = time.monotonic()
            await owner.complete(b"done")
            assert await task == Completed(key=key, value=b"done")
            return time.monotonic() - started
        finally:
            await client.aclose()

    elapsed = asyncio.run(scenario())
    if not backend.is_cluster:  # the asyncio cluster client has no pub/sub: it polls
        assert elapsed < 2.5


def test_many_waiters_share_one_subscriber(backend: Backend) -> None:
    """Twenty waiting threads on twenty keys use one subscriber connection and all wake."""
    before = set(threading.enumerate())
    client = backend.sync()
    keys = [unique() for _ in range(20)]
    owners = [Claim(client, key) for key in keys]
    for owner in owners:
        owner.acquire()
    results: list[Any] = []
    threads = [
        threading.Thread(target=lambda k=key: results.append(SlowPollingClaim(client, k).wait(20))) for key in keys
    ]
    for thread in threads:
        thread.start()
    raw = backend.raw()
    assert until(lambda: all(subscribed(raw, owner.claim_key) for owner in owners), timeout=10), "not all subscribed"
    subscriber = wakeups(client)
    assert subscriber is not None
    listeners = [t for t in set(threading.enumerate()) - before if t.name == "goblin-claim wake-ups"]
    started = time.monotonic()
    for owner in owners:
        owner.complete(b"v")
    for thread in threads:
        thread.join(10)
    assert time.monotonic() - started < 2.5
    assert len(results) == 20
    assert all(isinstance(result, Completed) for result in results)
    assert len(listeners) == 1


# What a connection runs before its first poll (CLIENT LIST's cmd): its set-up and the native probe.
_SET_UP = frozenset({"NULL", "hello", "auth", "client|setinfo", "client|setname", "select", "ping", "command|info"})


def _polled(admin: Any, **match: str) -> bool:
    """Whether a connection whose CLIENT LIST fields hold ``match`` has sent a poll: a command past its set-up."""
    return any(
        all(entry.get(field) == value for field, value in match.items()) and entry.get("cmd") not in _SET_UP
        for entry in admin.client_list()
    )


def test_waiters_poll_where_pub_sub_is_refused(redis_standalone: Any) -> None:
    """An ACL user without pub/sub still waits (by polling) and gets the result."""
    admin = redis_standalone.client()
    user = f"nopubsub-{unique()}"
    admin.acl_setuser(user, enabled=True, passwords=["+pw"], keys=["*"], commands=["+@all", "-@pubsub"])
    client = redis_standalone.client(username=user, password="pw")
    try:
        key = unique()
        owner = Claim(admin, key)
        owner.acquire()

        def later() -> None:
            assert until(lambda: _polled(admin, user=user), timeout=10), "the waiter never polled"
            owner.complete(b"v")

        thread = threading.Thread(target=later)
        thread.start()
        assert Claim(client, key).wait(timeout=10) == Completed(key=key, value=b"v")
        thread.join()
    finally:
        client.close()
        admin.acl_deluser(user)
        admin.close()


def test_a_crashed_owner_is_taken_over_as_its_lease_lapses(backend: Backend) -> None:
    """The in-flight reply carries the lease left: a waiter takes over just after it lapses, not polls later."""
    client = backend.sync()
    key = unique()
    Claim(client, key, lease=1).acquire()  # and never completes: a crashed owner
    waiter = SlowPollingClaim(client, key, lease=30)
    started = time.monotonic()
    outcome = waiter.wait(timeout=20)
    assert isinstance(outcome, Claimed)
    assert time.monotonic() - started < 3.5


# A client whose connections are capped at one: a blocking pool of one, a plain pool of one.
ONE_CONNECTION = ("blocking-pool", "plain-pool")


def _connections_named(admin: Any, name: str) -> int:
    return sum(1 for entry in admin.client_list() if entry.get("name") == name)


def _sync_one_connection(server: Any, kind: str, name: str) -> Any:
    if kind == "plain-pool":
        return redis.Redis(host=HOST, port=server.port, max_connections=1, client_name=name)
    pool = redis.BlockingConnectionPool(host=HOST, port=server.port, max_connections=1, timeout=5, client_name=name)
    return redis.Redis.from_pool(pool)  # owns the pool: close() disconnects it


def _async_one_connection(server: Any, kind: str, name: str) -> Any:
    if kind == "plain-pool":
        return redis.asyncio.Redis(host=HOST, port=server.port, max_connections=1, client_name=name)
    pool = redis.asyncio.BlockingConnectionPool(
        host=HOST, port=server.port, max_connections=1, timeout=5, client_name=name
    )
    return redis.asyncio.Redis.from_pool(pool)  # owns the pool: aclose() disconnects it


@pytest.mark.parametrize("kind", ONE_CONNECTION)
def test_sync_waiter_on_one_connection_sees_the_completion(redis_standalone: Any, kind: str) -> None:
    """wait() on a client capped at one connection polls (no subscriber takes that one) and gets the result."""
    admin = redis_standalone.client()
    name = unique("one")
    client = _sync_one_connection(redis_standalone, kind, name)
    try:
        key = unique()
        owner = Claim(admin, key)
        owner.acquire()
        seen: list[int] = []

        def later() -> None:
            assert until(lambda: _polled(admin, name=name), timeout=10), "the waiter never polled"
            seen.append(_connections_named(admin, name))
            owner.complete(b"v")

        thread = threading.Thread(target=later)
        thread.start()
        assert Claim(client, key).wait(timeout=8) == Completed(key=key, value=b"v")
        thread.join()
        assert seen == [1]  # the waiter's own connection, and no subscriber beside it
    finally:
        client.close()
        admin.close()


@pytest.mark.parametrize("kind", ONE_CONNECTION)
def test_async_waiter_on_one_connection_sees_the_completion(redis_standalone: Any, kind: str) -> None:
    """The asyncio twin, the owner on the same one connection: the waiting task gets the result by polling."""
    admin = redis_standalone.client()
    name = unique("one")
    key = unique()

    async def scenario() -> tuple[Any, int]:
        client = _async_one_connection(redis_standalone, kind, name)
        try:
            # The claim is taken elsewhere, so the first command past the one connection's set-up
            # is the waiter's poll; the owner then completes on that same connection, as the
            # tasks of one application share it. The waiter polls every five seconds: once its
            # first poll is answered and the connection is back in the pool, the owner's round
            # cannot meet one of the waiter's (a plain pool refuses a second connection).
            token = Claim(admin, key).acquire().token
            task = asyncio.create_task(SlowPollingAsyncClaim(client, key).wait(timeout=8))
            pool = client.connection_pool
            assert await until_async(lambda: _polled(admin, name=name) and not pool._in_use_connections, timeout=10), (
                "the waiter never polled"
            )
            owner = AsyncClaim(client, key, token=token)
            count = await asyncio.to_thread(_connections_named, admin, name)
            await owner.complete(b"v")
            return await task, count
        finally:
            await client.aclose()

    try:
        outcome, count = asyncio.run(scenario())
    finally:
        admin.close()
    assert outcome == Completed(key=key, value=b"v")
    assert count == 1


def test_a_single_connection_client_is_woken_by_push(redis_standalone: Any) -> None:
    """single_connection_client on its default pool: the subscriber takes a second connection, as pubsub() would."""
    client = redis_standalone.client(single_connection_client=True)
    admin = redis_standalone.client()
    try:
        key = unique()
        owner = Claim(client, key)
        owner.acquire()
        outcome: list[Any] = []
        thread = threading.Thread(target=lambda: outcome.append(SlowPollingClaim(client, key).wait(timeout=20)))
        thread.start()
        assert until(lambda: subscribed(admin, owner.claim_key), timeout=10), "never subscribed"
        started = time.monotonic()
        owner.complete(b"v")
        thread.join(10)
        assert time.monotonic() - started < 2.5  # its next poll is five seconds away: only push is this soon
        assert outcome == [Completed(key=key, value=b"v")]
    finally:
        client.close()
        admin.close()


def test_an_asyncio_single_connection_client_is_woken_by_push(redis_standalone: Any) -> None:
    """The asyncio twin: a single_connection_client's waiting task learns of complete() by push."""
    admin = redis_standalone.client()

    async def scenario() -> tuple[Any, float]:
        client = redis.asyncio.Redis(host=HOST, port=redis_standalone.port, single_connection_client=True)
        try:
            key = unique()
            owner = AsyncClaim(client, key)
            await owner.acquire()
            task = asyncio.create_task(SlowPollingAsyncClaim(client, key).wait(timeout=20))
            assert await until_async(lambda: subscribed(admin, owner.claim_key), timeout=10), "never subscribed"
            started = time.monotonic()
            await owner.complete(b"v")
            outcome = await task
            return outcome, time.monotonic() - started
        finally:
            await client.aclose()

    try:
        outcome, elapsed = asyncio.run(scenario())
    finally:
        admin.close()
    assert outcome.kind == "completed"
    assert elapsed < 2.5


def test_a_cluster_client_with_one_connection_per_node_polls(redis_cluster: list[Any]) -> None:
    """A sync cluster client capped at one connection per node: no subscriber takes the key's node's only one."""
    admin = redis.cluster.RedisCluster(host=HOST, port=redis_cluster[0].port)
    name = unique("one")
    client = redis.cluster.RedisCluster(host=HOST, port=redis_cluster[0].port, max_connections=1, client_name=name)
    try:
        key = unique()
        owner = Claim(admin, key)
        owner.acquire()
        node = redis.Redis(host=HOST, port=admin.get_node_from_key(owner.claim_key).port)

        def later() -> None:
            assert until(lambda: _polled(node, name=name), timeout=10), "the waiter never polled"
            owner.complete(b"v")

        thread = threading.Thread(target=later)
        thread.start()
        assert Claim(client, key).wait(timeout=8) == Completed(key=key, value=b"v")
        thread.join()
        node.close()
    finally:
        client.close()
        admin.close()
