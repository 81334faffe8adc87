"""asyncio cancellation at every await of ``@idempotent`` and of ``AsyncClaim``'s helpers.

A cancellation (``asyncio.wait_for``, ``asyncio.timeout``, a client gone) may land
at any await. Whatever it hits, no key is left claimed by nobody and no result the
function returned is dropped: a claim that may have been taken goes back, and a
returned result is stored before the cancellation goes on.

Two sweeps look for a point that leaks. One cancels a call after 0, 1, 2, ...
event-loop turns, so every point where the flow suspends is hit once, in turns.
The other cancels it 0, 20, 40, ... microseconds after it starts, until one call
finishes uncancelled: where the flow waits on the wire (a reply, a pooled
connection, the wake-up listener stopping), how many turns a stage takes depends
on the interpreter and the load, and only a sweep in time lands in each stage
wherever it falls.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest
import redis.asyncio

from goblin_claim import AsyncClaim, Claimed, Completed, idempotent
from goblin_claim._protocol.record import DONE_PREFIX
from tests.conftest import Backend, unique
from tests.support import servers
from tests.support.proxy import FaultProxy

# Real servers only: fakeredis's asyncio connection finishes a command even when
# its caller is cancelled, so a cancellation never lands inside its round trips.
BACKENDS = ("standalone", "native", "cluster")
NAMESPACE = "cancel"

# The time sweep's step, and the most time it may sweep before a call finishes uncancelled.
STEP = 20e-6
TIME_BUDGET = 30.0
# How long a key may stay claimed once a cancelled call has raised, before the check
# fails: a give-back runs shielded and ends before the cancellation goes on, so a
# correct flow leaves the key settled at the first read; this only absorbs a slow read.
GIVE_BACK = 0.5

# Arms a cancellation of a task; returns what disarms it once the task is done, which
# tells whether the cancellation had been delivered (the task may have finished first).
Cancel = Callable[["asyncio.Task[Any]"], Callable[[], bool]]


async def _cancel_after(task: asyncio.Task[Any], iterations: int) -> None:
    for _ in range(iterations):
        await asyncio.sleep(0)  # exactly one turn of the event loop
    task.cancel()


def _after_turns(iterations: int) -> Cancel:
    """Cancel after ``iterations`` turns of the event loop."""

    def arm(task: asyncio.Task[Any]) -> Callable[[], bool]:
        canceller = asyncio.ensure_future(_cancel_after(task, iterations))

        def disarm() -> bool:
            delivered = canceller.done()
            canceller.cancel()
            return delivered

        return disarm

    return arm


def _after_seconds(seconds: float) -> Cancel:
    """Cancel at the loop's first turn ``seconds`` or more after the call starts."""

    def arm(task: asyncio.Task[Any]) -> Callable[[], bool]:
        delivered = False

        def fire() -> None:
            nonlocal delivered
            delivered = True
            task.cancel()

        timer = asyncio.get_running_loop().call_later(seconds, fire)

        def disarm() -> bool:
            timer.cancel()
            return delivered

        return disarm

    return arm


def _in_turns(count: int) -> Iterator[Cancel]:
    """After 0, 1, 2, ... ``count - 1`` loop turns."""
    return (_after_turns(iterations) for iterations in range(count))


def _in_time() -> Iterator[Cancel]:
    """After 0, ``STEP``, 2 ``STEP``, ... seconds, for up to ``TIME_BUDGET`` seconds of sweeping."""
    deadline = time.monotonic() + TIME_BUDGET
    step = 0
    while time.monotonic() < deadline:
        yield _after_seconds(step * STEP)
        step += 1


# What a call armed with a cancellation did: raised it, finished though it was
# delivered (redis-py lets some pass: the command finishes), or finished before it came.
HIT, PASSED, FINISHED = "hit", "passed", "finished"


async def _run_cancelled(make: Callable[[], Awaitable[Any]], cancel: Cancel) -> str:
    """Run ``make()`` as a task with ``cancel`` armed on it: ``HIT``, ``PASSED`` or ``FINISHED``."""
    task = asyncio.ensure_future(make())
    disarm = cancel(task)
    try:
        await task
    except asyncio.CancelledError:
        disarm()
        return HIT
    return PASSED if disarm() else FINISHED


async def _holder(client: Any, key: str) -> bytes | str | None:
    claim_key = AsyncClaim(client, key, namespace=NAMESPACE).claim_key
    value: bytes | str | None = await client.get(claim_key)
    return value


async def _settled_holder(client: Any, key: str) -> bytes | str | None:
    """The claim key's value after a cancelled call: read at once, again for up to ``GIVE_BACK`` s while claimed."""
    deadline = time.monotonic() + GIVE_BACK
    while True:
        holder = await _holder(client, key)
        if holder is None or _is_done(holder) or time.monotonic() > deadline:
            return holder
        await asyncio.sleep(0.01)


def _is_done(holder: bytes | str | None) -> bool:
    text = holder.decode() if isinstance(holder, bytes) else holder
    return text is not None and text.startswith(DONE_PREFIX)


def _holds(holder: bytes | str | None, claim: AsyncClaim) -> bool:
    return holder in (claim.token, claim.token.encode())


async def _turns(make: Callable[[], Awaitable[Any]]) -> int:
    """How many event-loop turns ``make()`` takes, uncancelled."""
    task = asyncio.ensure_future(make())
    turns = 0
    while not task.done():
        await asyncio.sleep(0)
        turns += 1
    await task
    return turns


async def _decorated(client: Any) -> tuple[Callable[[str], Awaitable[Any]], collections.Counter[str]]:
    """An ``@idempotent`` function counting its returns per key, used once (the probe) before a sweep."""
    returned: collections.Counter[str] = collections.Counter()

    @idempotent(client, key="order", lease=30, wait=0, namespace=NAMESPACE)
    async def charge(order: str) -> dict[str, str]:
        await asyncio.sleep(0)  # the function's own await: a cancellation there is its raising
        returned[order] += 1
        return {"order": order}

    await charge(unique("warm"))  # first use probes the server: sweep the steady state
    return charge, returned


async def _sweep(
    client: Any,
    decorated: Callable[[str], Awaitable[Any]],
    returned: collections.Counter[str],
    cancels: Iterator[Cancel],
    until_finished: bool = False,
) -> int:
    """Cancel a first call with each of ``cancels``; check every key and retry it. The number of calls hit.

    ``until_finished``: stop after the first call that finished before its cancellation came, which must come.
    """
    hit = 0
    for i, cancel in enumerate(cancels):
        key = unique("sweep")
        ran = await _run_cancelled(lambda key=key: decorated(key), cancel)  # type: ignore[misc]
        hit += ran == HIT
        # Never claimed by nobody: free, or completed with the first run's result.
        holder = await _settled_holder(client, key)
        assert holder is None or _is_done(holder), (i, ran, holder)
        assert _is_done(holder) is (returned[key] == 1), (i, ran, holder, returned[key])
        # The retry gets the result at once (wait=0: a blocked key raises), from the one run.
        assert await decorated(key) == {"order": key}, i
        assert returned[key] == 1, (i, returned[key])
        if until_finished and ran == FINISHED:
            return hit
    assert not until_finished, "the call never finished before its cancellation"
    return hit


def test_a_cancellation_at_any_await_of_the_async_decorator_blocks_no_key_and_drops_no_result(
    backend: Backend,
) -> None:
    """Cancelled at each await in turn, @idempotent leaves the key free or completed; the work returns once.

    The key is read right after each cancellation, and again for up to ``GIVE_BACK``
    (0.5 s) while it is still claimed.
    """

    async def main() -> int:
        client = backend.async_()
        try:
            charge, returned = await _decorated(client)
            # Past the turns an uncancelled first call takes, with room for a slower run.
            turns = await _turns(lambda: charge(unique("measure")))
            return await _sweep(client, charge, returned, _in_turns(2 * turns + 10))
        finally:
            await client.aclose()

    hit = asyncio.run(main())
    assert hit >= 3  # the claim, the function and the store each suspend at least once


def test_a_cancellation_at_any_moment_of_the_async_decorator_blocks_no_key_and_drops_no_result(
    backend: Backend,
) -> None:
    """Cancelled 0, 20, 40, ... µs into a call until one finishes, @idempotent leaves the key free or completed.

    The key is read right after each cancellation, and again for up to ``GIVE_BACK``
    (0.5 s) while it is still claimed: free, or completed exactly when the function
    returned; the retry replays that one run.
    """

    async def main() -> int:
        client = backend.async_()
        try:
            charge, returned = await _decorated(client)
            return await _sweep(client, charge, returned, _in_time(), until_finished=True)
        finally:
            await client.aclose()

    hit = asyncio.run(main())
    assert hit >= 3  # a call spans more than three steps: the first ones cannot all miss it


async def _sweep_acquire(client: Any, cancels: Iterator[Cancel]) -> int:
    """Cancel ``acquire()`` of a free key with each of ``cancels``, until one finishes before it.

    Returns the number of calls the cancellation reached (raised or let pass).
    """
    await AsyncClaim(client, unique("warm"), namespace=NAMESPACE).acquire()  # the probe, before the sweep
    reached = 0
    for i, cancel in enumerate(cancels):
        claim = AsyncClaim(client, unique("acquire"), namespace=NAMESPACE, lease=30)
        got: list[object] = []

        async def acquire(claim: AsyncClaim = claim, got: list[object] = got) -> None:
            got.append(await claim.acquire())

        ran = await _run_cancelled(acquire, cancel)
        reached += ran != FINISHED
        if ran == HIT:
            # Cancelled: a claim it may have taken was given back, so the key is free.
            assert await _settled_holder(client, claim.key) is None, i
            continue
        # Finished: its caller has the claim.
        assert isinstance(got[0], Claimed), (i, ran, got)
        assert _holds(await client.get(claim.claim_key), claim), (i, ran)
        if ran == FINISHED:
            return reached
    raise AssertionError("acquire() never finished before its cancellation")


def test_a_cancellation_at_any_await_of_async_acquire_leaves_no_claim_held(backend: Backend) -> None:
    """An acquire() cancelled at each await in turn gives back what it may have taken.

    The key is read right after each cancellation, and again for up to ``GIVE_BACK``
    (0.5 s) while it is still claimed: it must be free by then.
    """

    async def main() -> int:
        client = backend.async_()
        try:
            return await _sweep_acquire(client, _in_turns(2000))
        finally:
            await client.aclose()

    assert asyncio.run(main()) >= 1


def test_a_cancellation_at_any_moment_of_async_acquire_leaves_no_claim_held(backend: Backend) -> None:
    """An acquire() cancelled 0, 20, 40, ... µs in, until one finishes, gives back what it may have taken.

    The key is read right after each cancellation, and again for up to ``GIVE_BACK``
    (0.5 s) while it is still claimed: it must be free by then.
    """

    async def main() -> int:
        client = backend.async_()
        try:
            return await _sweep_acquire(client, _in_time())
        finally:
            await client.aclose()

    assert asyncio.run(main()) >= 1


async def _sweep_wait(client: Any, cancels: Iterator[Cancel]) -> int:
    """Cancel a ``wait()`` taking a lapsed claim over with each of ``cancels``, until one finishes before it.

    Returns the number of calls the cancellation reached (raised or let pass).
    """
    reached = 0
    for i, cancel in enumerate(cancels):
        key = unique("wait")
        # A crashed owner: its claim lapses in about 1 s (PEXPIRE makes it sooner).
        crashed = AsyncClaim(client, key, namespace=NAMESPACE, lease=1)
        await crashed.acquire()
        await client.pexpire(crashed.claim_key, 5)
        await asyncio.sleep(0.01)
        waiter = AsyncClaim(client, key, namespace=NAMESPACE, lease=30)
        got: list[object] = []

        async def wait(waiter: AsyncClaim = waiter, got: list[object] = got) -> None:
            got.append(await waiter.wait(timeout=5))

        ran = await _run_cancelled(wait, cancel)
        reached += ran != FINISHED
        if ran == HIT:
            # Cancelled: the takeover (if it happened) was given back, so the key is free.
            assert await _settled_holder(client, key) is None, i
            continue
        # Finished: its caller took the work over.
        assert isinstance(got[0], Claimed), (i, ran, got)
        assert _holds(await client.get(waiter.claim_key), waiter), (i, ran)
        if ran == FINISHED:
            return reached
    raise AssertionError("wait() never finished before its cancellation")


def test_a_cancellation_at_any_await_of_async_wait_leaves_no_takeover_held(backend: Backend) -> None:
    """A wait() cancelled at each await in turn, while a lapsed claim is taken over, gives back what it took.

    The key is read right after each cancellation, and again for up to ``GIVE_BACK``
    (0.5 s) while it is still claimed: it must be free by then.
    """

    async def main() -> int:
        client = backend.async_()
        try:
            return await _sweep_wait(client, _in_turns(2000))
        finally:
            await client.aclose()

    assert asyncio.run(main()) >= 1


def test_a_cancellation_at_any_moment_of_async_wait_leaves_no_takeover_held(backend: Backend) -> None:
    """A wait() cancelled 0, 20, 40, ... µs in, until one finishes, gives back the lapsed claim it took over.

    The key is read right after each cancellation, and again for up to ``GIVE_BACK``
    (0.5 s) while it is still claimed: it must be free by then, not held for the
    new lease (30 s) by a waiter that is gone.
    """

    async def main() -> int:
        client = backend.async_()
        try:
            return await _sweep_wait(client, _in_time())
        finally:
            await client.aclose()

    assert asyncio.run(main()) >= 1


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


@pytest.mark.skipif(not hasattr(asyncio.Task, "cancelling"), reason="a task counts its cancellations from Python 3.11")
def test_a_wait_whose_cancellation_a_round_trip_swallowed_stops_at_its_next_poll(backend: Backend) -> None:
    """Before 3.12 a wait_for in the client library can return and drop the task's cancellation; wait() still stops."""

    async def main() -> None:
        client = backend.async_()
        key = unique("swallowed")
        owner = AsyncClaim(client, key, namespace=NAMESPACE)
        try:
            await owner.acquire()
            task = asyncio.current_task()
            assert task is not None
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await asyncio.sleep(0)  # what the client library's wait_for does: catch it and go on
            started = time.monotonic()
            with pytest.raises(asyncio.CancelledError):
                await AsyncClaim(client, key, namespace=NAMESPACE).wait(timeout=5)
            assert time.monotonic() - started < 2.5  # one poll, not the whole timeout
            task.uncancel()
            await owner.release()
        finally:
            await client.aclose()

    asyncio.run(main())
