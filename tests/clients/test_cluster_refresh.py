"""A cluster round whose node is unreachable refreshes the slot table, one refresh at a time per client.

``_clients.cluster`` refreshes a cluster client's slot table when a node's connection
fails, so the caller's next try reaches whoever took the slots. Across a partition
a refresh takes seconds (each cut-off startup node costs a connect timeout), and
every caller failing meanwhile used to start one more, spaced by ``_REFRESH_EVERY``
only: valkey-py's asyncio refreshes do not coalesce, each replaces every node and
closes the connections others were using, and a flapping partition's callers ran
past their deadlines behind dozens of them. Here the node refuses every connection
(a port nobody listens on), the slot table's ``initialize()`` blocks until released,
and the clock is the test's: no server, no sleep.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import socket
import threading
import types
from collections.abc import Iterator
from typing import Any

import pytest
import redis
import redis.asyncio
import redis.asyncio.cluster
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff
from redis.retry import Retry

from goblin_claim._clients import cluster as rounds

ROUND = [("SET", "k", "v")]


@pytest.fixture
def refused_port() -> int:
    """A local port nobody listens on: a connection to it is refused at once."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class Clock:
    """``time.monotonic`` for ``_clients.cluster``, moved by the test."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        """The test's time."""
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    """The clock ``_clients.cluster`` reads, moved by the test."""
    made = Clock()
    monkeypatch.setattr(rounds, "time", types.SimpleNamespace(monotonic=made.monotonic))
    return made


class SyncManager:
    """A slot table whose ``initialize()`` runs until ``release`` is set, counting how many run at once."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.started = threading.Semaphore(0)
        self.calls = self.running = self.peak = 0
        self._lock = threading.Lock()

    def initialize(self) -> None:
        """One refresh: counted, then held until ``release``."""
        with self._lock:
            self.calls += 1
            self.running += 1
            self.peak = max(self.peak, self.running)
        self.started.release()
        try:
            self.release.wait(10)
        finally:
            with self._lock:
                self.running -= 1


class SyncCluster:
    """What ``node_round`` uses of a sync cluster client: a slot table and a node client, refused."""

    def __init__(self, port: int) -> None:
        self.nodes_manager = SyncManager()
        self.client = redis.Redis(port=port, socket_connect_timeout=1, retry=Retry(NoBackoff(), 0))

    def get_node_from_key(self, key: str) -> object:
        """The slot's primary (any node: its client is the refused one)."""
        return object()

    def get_redis_connection(self, node: object) -> redis.Redis:
        """The node's client: refused."""
        return self.client


class AsyncManager:
    """``SyncManager`` for an asyncio cluster client."""

    default_node = None
    # What redis-py 8.2's refresh reads of its slot table besides ``initialize``: no refresh
    # asked for at an earlier epoch, and a refresh always due (no backoff after a failure).
    _epoch = 0
    _refresh_requested_at_epoch = None
    _requested_last_failed_node_name = None
    _requested_additional_startup_nodes = ()

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.started = asyncio.Event()
        self.calls = self.running = self.peak = 0

    async def aclose(self, attr: str = "nodes_cache") -> None:
        """Nothing to close (the client closes its slot table with it)."""

    def _refresh_due(self, retry: object = None) -> bool:
        """Always due: the test's refreshes are the client's first."""
        return True

    async def initialize(self, **_options: Any) -> None:
        """One refresh: counted, then held until ``release``."""
        self.started.set()
        self.calls += 1
        self.running += 1
        self.peak = max(self.peak, self.running)
        try:
            await self.release.wait()
        finally:
            self.running -= 1


class AsyncCluster:
    """What ``node_round_async`` uses of an asyncio cluster client: a slot table and a node, refused."""

    def __init__(self, port: int) -> None:
        self.nodes_manager = AsyncManager()
        self.node = redis.asyncio.cluster.ClusterNode(
            "127.0.0.1", port, socket_connect_timeout=1, retry=AsyncRetry(NoBackoff(), 0)
        )

    def get_node_from_key(self, key: str) -> Any:
        """The slot's primary: refused."""
        return self.node


@contextlib.contextmanager
def _released(manager: SyncManager) -> Iterator[concurrent.futures.ThreadPoolExecutor]:
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        try:
            yield pool
        finally:
            manager.release.set()


def test_callers_failing_while_a_refresh_runs_start_no_other(refused_port: int, clock: Clock) -> None:
    """Sync: one refresh at a time, however long it takes; the others' errors go up at once."""
    client = SyncCluster(refused_port)
    manager = client.nodes_manager
    with _released(manager) as pool:
        first = pool.submit(rounds.node_round, client, "k", ROUND)
        assert manager.started.acquire(timeout=10), "the first failure did not refresh"
        for _ in range(5):
            clock.now += 1.0  # long past _REFRESH_EVERY since the refresh began
            other = pool.submit(rounds.node_round, client, "k", ROUND)
            with pytest.raises(redis.ConnectionError):
                other.result(timeout=5)  # before: it started a refresh of its own and waited in it
        assert (manager.calls, manager.peak) == (1, 1)
        manager.release.set()
        with pytest.raises(redis.ConnectionError):
            first.result(timeout=10)
    client.client.close()


def test_a_refresh_ends_and_the_next_failure_refreshes_again(refused_port: int, clock: Clock) -> None:
    """Sync: no failure waits for a refresh, and none is refused one for good: _REFRESH_EVERY after the last ends."""
    client = SyncCluster(refused_port)
    manager = client.nodes_manager
    manager.release.set()  # every refresh ends at once
    for _ in range(2):
        with pytest.raises(redis.ConnectionError):
            rounds.node_round(client, "k", ROUND)
    assert manager.calls == 1  # the second failed within _REFRESH_EVERY of the first refresh's end
    clock.now += rounds._REFRESH_EVERY
    with pytest.raises(redis.ConnectionError):
        rounds.node_round(client, "k", ROUND)
    assert manager.calls == 2
    client.client.close()


def test_async_callers_failing_while_a_refresh_runs_start_no_other(refused_port: int, clock: Clock) -> None:
    """Asyncio: one refresh at a time per client, for all its tasks; the others' errors go up at once."""

    async def main() -> tuple[int, int]:
        client = AsyncCluster(refused_port)
        manager = client.nodes_manager
        first = asyncio.ensure_future(rounds.node_round_async(client, "k", ROUND))
        try:
            await asyncio.wait_for(manager.started.wait(), 10)
            others = []
            for _ in range(5):
                clock.now += 1.0  # long past _REFRESH_EVERY since the refresh began
                others.append(asyncio.ensure_future(rounds.node_round_async(client, "k", ROUND)))
                # before: each started a refresh of its own and waited in it
                done, _pending = await asyncio.wait([others[-1]], timeout=5)
                assert done, "a caller waited in a refresh of its own"
                assert isinstance(others[-1].exception(), redis.ConnectionError)
            seen = (manager.calls, manager.peak)
        finally:
            manager.release.set()
            with contextlib.suppress(redis.ConnectionError):
                await asyncio.wait_for(first, 10)
            await client.node.disconnect()
        assert isinstance(first.exception(), redis.ConnectionError)
        return seen

    assert asyncio.run(main()) == (1, 1)


def test_an_async_refresh_ends_and_the_next_failure_refreshes_again(refused_port: int, clock: Clock) -> None:
    """Asyncio: _REFRESH_EVERY after the last refresh ends, a failure refreshes again."""

    async def main() -> list[int]:
        client = AsyncCluster(refused_port)
        manager = client.nodes_manager
        manager.release.set()
        calls = []
        for step in (0.0, 0.0, rounds._REFRESH_EVERY):
            clock.now += step
            with pytest.raises(redis.ConnectionError):
                await rounds.node_round_async(client, "k", ROUND)
            calls.append(manager.calls)
        await client.node.disconnect()
        return calls

    assert asyncio.run(main()) == [1, 1, 2]


def _asyncio_cluster(kind: str, port: int) -> Any:
    """An asyncio cluster client of ``kind`` (not connected: its refreshes are the test's)."""
    if kind == "valkey-py":
        valkey_cluster = pytest.importorskip("valkey.asyncio.cluster")
        return valkey_cluster.ValkeyCluster(host="127.0.0.1", port=port)
    return redis.asyncio.cluster.RedisCluster(host="127.0.0.1", port=port)


@pytest.mark.parametrize("kind", ["redis-py", "valkey-py"])
def test_an_async_refresh_joins_the_clients_own(kind: str, refused_port: int, clock: Clock) -> None:
    """A failed round refreshes through the client's own refresh: one under way is waited for, not run beside.

    valkey-py's asyncio refresh makes every node anew and closes the connections of the
    nodes it replaced; one of the SDK's beside the client's own failed it, and every
    command of the client waited for the next.
    """

    async def main() -> tuple[int, int]:
        client = _asyncio_cluster(kind, refused_port)
        manager = AsyncManager()
        client.nodes_manager = manager  # the slot table: its refresh blocks until released
        client.commands_parser = types.SimpleNamespace(commands={}, initialize=lambda *args, **kwargs: asyncio.sleep(0))
        node = redis.asyncio.cluster.ClusterNode(
            "127.0.0.1", refused_port, socket_connect_timeout=1, retry=AsyncRetry(NoBackoff(), 0)
        )
        client.get_node_from_key = lambda key: node
        client._initialize = True  # as after a connection error of the client's own
        own = asyncio.ensure_future(client.initialize())
        await asyncio.wait_for(manager.started.wait(), 10)
        ours = asyncio.ensure_future(rounds.node_round_async(client, "k", ROUND))
        try:
            for _ in range(20):
                await asyncio.sleep(0.01)  # before: the SDK's refresh ran beside the client's
            seen = (manager.calls, manager.peak)
        finally:
            manager.release.set()
            await asyncio.wait_for(own, 10)
            with contextlib.suppress(redis.ConnectionError):
                await asyncio.wait_for(ours, 10)
            await node.disconnect()
            await client.aclose()
        assert isinstance(ours.exception(), redis.ConnectionError)
        assert manager.calls == 1  # the client's refresh was the SDK's: none after it
        return seen

    assert asyncio.run(main()) == (1, 1)
