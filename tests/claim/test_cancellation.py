"""asyncio cancellation at every await of ``@idempotent`` and of ``AsyncClaim``'s helpers.

A cancellation (``asyncio.wait_for``, ``asyncio.timeout``, a client gone) may land
at any await. Whatever it hits, no key is left claimed by nobody and no result the
function returned is dropped: a claim that may have been taken goes back, and a
returned result is stored before the cancellation goes on. The sweeps cancel a
call after 0, 1, 2, ... event-loop iterations until it finishes uncancelled, so
every point where the flow really suspends is hit once.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import redis.asyncio

from goblin_claim import AsyncClaim, Completed, idempotent
from goblin_claim._protocol.record import DONE_PREFIX
from tests.conftest import Backend, unique
from tests.support import servers
from tests.support.proxy import FaultProxy

# Real servers only: fakeredis's asyncio connection finishes a command even when
# its caller is cancelled, so a cancellation never lands inside its round trips.
BACKENDS = ("standalone", "native", "cluster")
NAMESPACE = "cancel"


async def _cancel_after(task: asyncio.Task[Any], iterations: int) -> None:
    for _ in range(iterations):
        await asyncio.sleep(0)  # exactly one turn of the event loop
    task.cancel()


async def _run_cancelled(make: Callable[[], Awaitable[Any]], iterations: int) -> bool:
    """Run ``make()`` as a task cancelled after ``iterations`` loop turns; whether the cancellation hit it."""
    task = asyncio.ensure_future(make())
    canceller = asyncio.ensure_future(_cancel_after(task, iterations))
    try:
        await task
    except asyncio.CancelledError:
        return True
    finally:
        canceller.cancel()
    return False


async def _holder(client: Any, key: str) -> bytes | str | None:
    claim_key = AsyncClaim(client, key, namespace=NAMESPACE).claim_key
    value: bytes | str | None = await client.get(claim_key)
    return value


def _is_done(holder: bytes | str | None) -> bool:
    text = holder.decode() if isinstance(holder, bytes) else holder
    return text is not None and text.startswith(DONE_PREFIX)


async def _turns(make: Callable[[], Awaitable[Any]]) -> int:
    """How many event-loop turns ``make()`` takes, uncancelled."""
    task = asyncio.ensure_future(make())
    turns = 0
    while not task.done():
        await asyncio.sleep(0)
        turns += 1
    await task
    return turns


async def _sweep(client: Any, decorated: Callable[[str], Awaitable[Any]], returned: collections.Counter[str]) -> int:
    """Cancel a first call at each loop turn in turn; check every key and retry it. The number of calls hit."""
    # Past the turns an uncancelled first call takes, with room for a slower run.
    turns = await _turns(lambda: decorated(unique("measure")))
    hit = 0
    for iterations in range(2 * turns + 10):
        key = unique("sweep")
        # redis-py lets some cancellations pass (the command finishes): those calls count as not hit.
        hit += await _run_cancelled(lambda key=key: decorated(key), iterations)  # type: ignore[misc]
        # Never claimed by nobody: free, or completed with the first run's result.
        holder = await _holder(client, key)
        assert holder is None or _is_done(holder), (iterations, holder)
        assert _is_done(holder) is (returned[key] == 1), (iterations, holder, returned[key])
        # The retry gets the result at once (wait=0: a blocked key raises), from the one run.
        assert await decorated(key) == {"order": key}, iterations
        assert returned[key] == 1, (iterations, returned[key])
    return hit


def test_a_cancellation_at_any_await_of_the_async_decorator_blocks_no_key_and_drops_no_result(
    backend: Backend,
) -> None:
    """Cancelled at each await in turn, @idempotent leaves the key free or completed; the work returns once."""

    async def main() -> int:
        client = backend.async_()
        returned: collections.Counter[str] = collections.Counter()

        @idempotent(client, key="order", lease=30, wait=0, namespace=NAMESPACE)
        async def charge(order: str) -> dict[str, str]:
            await asyncio.sleep(0)  # the function's own await: a cancellation there is its raising
            returned[order] += 1
            return {"order": order}

        try:
            await charge(unique("warm"))  # first use probes the server: sweep the steady state
            return await _sweep(client, charge, returned)
        finally:
            await client.aclose()

    hit = asyncio.run(main())
    assert hit >= 3  # the claim, the function and the store each suspend at least once


def test_a_cancellation_at_any_await_of_async_wait_leaves_no_takeover_held(backend: Backend) -> None:
    """A wait() cancelled at each await in turn, while a lapsed claim is taken over, gives back what it took."""

    async def main() -> None:
        client = backend.async_()
        try:
            for iterations in range(2000):
                key = unique("wait")
                # A crashed owner: its claim lapses in about 1 s (PEXPIRE makes it sooner).
                crashed = AsyncClaim(client, key, namespace=NAMESPACE, lease=1)
                await crashed.acquire()
                await client.pexpire(crashed.claim_key, 5)
                await asyncio.sleep(0.01)
                waiter = AsyncClaim(client, key, namespace=NAMESPACE, lease=30)
                if not await _run_cancelled(lambda waiter=waiter: waiter.wait(timeout=5), iterations):  # type: ignore[misc]
                    assert await client.get(waiter.claim_key) in (waiter.token, waiter.token.encode())
                    return
                # Cancelled: the takeover (if it happened) was given back, so the key is free.
                assert await client.get(waiter.claim_key) is None, iterations
        finally:
            await client.aclose()
        raise AssertionError("wait() never finished uncancelled")

    asyncio.run(main())


def test_a_store_waiting_for_a_pooled_connection_ends_before_the_timeout_goes_on(backend: Backend) -> None:
    """wait_for() firing while the result waits for a pooled connection: stored first, then TimeoutError."""
    if backend.is_cluster:
        pytest.skip("the asyncio cluster client has no blocking pool")

    async def main() -> None:
        # One connection, taken by another task while the function returns.
        client = backend.async_(max_connections=1)
        pool = client.connection_pool
        runs = 0
        held = asyncio.Event()

        async def occupy() -> None:
            conn = await pool.get_connection()
            held.set()
            await asyncio.sleep(0.5)
            await pool.release(conn)

        occupier: list[asyncio.Task[None]] = []

        @idempotent(client, key="event", lease=30, wait=0, namespace=NAMESPACE)
        async def charge(event: str) -> str:
            nonlocal runs
            runs += 1
            occupier.append(asyncio.ensure_future(occupy()))
            await held.wait()
            return f"charged:{event}"

        key = unique("evt")
        try:
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(charge(key), 0.2)
            # Stored before the timeout went on: the duplicate replays it, nothing runs again.
            assert await charge(key) == f"charged:{key}"
            assert runs == 1
        finally:
            await asyncio.gather(*occupier)
            await client.aclose()

    asyncio.run(main())


@pytest.mark.parametrize("native", [False, True], ids=["script", "native"])
def test_a_claim_cancelled_while_its_reply_is_held_back_is_given_back(
    native: bool, redis_standalone: servers.RedisProcess, redis_native: servers.RedisProcess
) -> None:
    """The server took the claim but the reply never came and the caller was cancelled: the claim is released."""
    server = redis_native if native else redis_standalone

    async def main() -> None:
        with FaultProxy(server.port) as proxy:
            client = redis.asyncio.Redis(host=servers.HOST, port=proxy.port)
            raw = redis.asyncio.Redis(host=servers.HOST, port=server.port)
            runs = 0

            @idempotent(client, key="event", lease=30, wait=0, namespace=NAMESPACE)
            async def charge(event: str) -> str:
                nonlocal runs
                runs += 1
                return f"charged:{event}"

            key = unique("held")
            claim_key = AsyncClaim(client, key, namespace=NAMESPACE).claim_key
            try:
                proxy.faults.hold_next_reply(claim_key.encode())
                with pytest.raises(asyncio.TimeoutError):
                    await asyncio.wait_for(charge(key), 0.3)
                assert proxy.faults.lost(claim_key.encode()) == 1  # the claim ran on the server
                assert await raw.get(claim_key) is None  # and was given back
                assert await charge(key) == f"charged:{key}"  # the retry runs at once
                assert runs == 1
            finally:
                await client.aclose()
                await raw.aclose()

    asyncio.run(main())


def test_an_async_claim_completed_meanwhile_is_replayed_after_a_cancelled_wait(backend: Backend) -> None:
    """A cancelled wait() on in-flight work takes nothing: the owner's complete() still lands and replays."""

    async def main() -> None:
        client = backend.async_()
        key = unique("owner")
        owner = AsyncClaim(client, key, namespace=NAMESPACE)
        try:
            await owner.acquire()
            waiter = AsyncClaim(client, key, namespace=NAMESPACE)
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(waiter.wait(timeout=5), 0.2)
            await owner.complete("done")
            assert await waiter.acquire() == Completed(key=key, value=b"done")
        finally:
            await client.aclose()

    asyncio.run(main())
