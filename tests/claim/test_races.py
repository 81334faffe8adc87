"""Races on one key: real threads and real asyncio tasks, counting who won."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from goblin_claim import AsyncClaim, Claim, Claimed, Completed, InFlight
from tests.conftest import ALL_BACKENDS, Backend, unique

# Also on redis-server with the reference module loaded (the SDK takes the native path).
BACKENDS = ALL_BACKENDS


def test_fifty_threads_one_key_one_winner(backend: Backend) -> None:
    """50 threads, each with its own handle, acquire one key at once: exactly one Claimed."""
    client = backend.sync()
    key = unique()
    barrier = threading.Barrier(50)
    outcomes: list[Any] = []
    lock = threading.Lock()

    def racer() -> None:
        handle = Claim(client, key)
        barrier.wait()
        outcome = handle.acquire()
        with lock:
            outcomes.append(outcome)

    threads = [threading.Thread(target=racer) for _ in range(50)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(outcomes) == 50
    assert sum(isinstance(o, Claimed) for o in outcomes) == 1
    assert sum(isinstance(o, InFlight) for o in outcomes) == 49


def test_five_hundred_tasks_one_key_one_winner(backend: Backend) -> None:
    """500 asyncio tasks acquire one key at once: exactly one Claimed; after complete, all see the value."""

    async def scenario() -> tuple[list[Any], list[Any]]:
        client = backend.async_()
        key = unique()
        try:
            first = await asyncio.gather(*(AsyncClaim(client, key).acquire() for _ in range(500)))
            winner = next(o for o in first if isinstance(o, Claimed))
            await AsyncClaim(client, key, token=winner.token).complete(b"once")
            later = await asyncio.gather(*(AsyncClaim(client, key).acquire() for _ in range(500)))
        finally:
            await client.aclose()
        return first, later

    first, later = asyncio.run(scenario())
    assert sum(isinstance(o, Claimed) for o in first) == 1
    assert sum(isinstance(o, InFlight) for o in first) == 499
    assert all(isinstance(o, Completed) and o.value == b"once" for o in later)
