"""Lost means stopped, under ``@idempotent``: the work whose claim is lost does not reach its side effect.

An ``async def`` whose claim is lost while it runs is cancelled (it sees
``CancelledError``; its caller gets ``ClaimLostError``, nothing is stored, the claim
is left to its new owner); a ``def`` asks ``current_claim().ensure_held()`` before
its irreversible step. Side effects are counted in Redis across both owners, with
real threads, tasks and processes: a key taken over mid-work (forgotten, then
claimed by another call), and an owner process frozen (SIGSTOP) past its lease.
A cancellation from outside stays ``CancelledError``, also when it comes with a loss.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import json
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
import redis.asyncio

import goblin_claim
from goblin_claim import (
    AsyncClaim,
    Claim,
    Claimed,
    ClaimLostError,
    Completed,
    GoblinClaimError,
    NoCurrentClaimError,
    current_claim,
    idempotent,
)
from goblin_claim._decorator import aio as decorator_aio
from goblin_claim._decorator import sync as decorator_sync
from goblin_claim._drivers.keepalive import GONE
from goblin_claim.testing import fake_async_redis, fake_redis
from tests.conftest import unique, until
from tests.support import frozen_owner, servers
from tests.support.servers import RedisProcess

SPAWN = multiprocessing.get_context("spawn")
LEASE = 2  # renewals every 2/3 s: a takeover is seen within that and a round trip


@pytest.fixture
def raw(redis_standalone: RedisProcess) -> Iterator[redis.Redis]:
    """A sync client on the session's standalone server."""
    client = redis.Redis(host=servers.HOST, port=redis_standalone.port)
    yield client
    client.close()


def _effects(raw: redis.Redis, namespace: str) -> int:
    return int(raw.get(f"{namespace}:effects") or 0)


# --------------------------------------------------------------------------- a key taken over mid-work


def test_an_async_call_whose_key_is_taken_over_is_cancelled_before_its_side_effect(raw: redis.Redis) -> None:
    """Forgotten and claimed by another call mid-work: the first is cancelled, its caller gets ClaimLostError.

    The side effect runs once over both owners (the second's), the second's result
    is what is stored and replayed, and the first call gave nothing back: the
    second's claim was never released under it.
    """
    namespace = unique("lost-async")
    port = raw.connection_pool.connection_kwargs["port"]
    seen: list[str] = []

    async def scenario() -> tuple[BaseException, str, str, float]:
        client = redis.asyncio.Redis(host=servers.HOST, port=port)
        started = asyncio.Event()

        @idempotent(client, key="order", namespace=namespace, lease=LEASE, wait=0)
        async def charge(order: str) -> str:
            run = await client.incr(f"{namespace}:runs")
            if run == 1:
                started.set()
                try:
                    await asyncio.sleep(30)  # the first owner's long step: the loss lands here
                except asyncio.CancelledError:
                    seen.append("cancelled")
                    raise
            await client.incr(f"{namespace}:effects")
            return f"charged by run {run}"

        first = asyncio.ensure_future(charge("o-1"))
        await asyncio.wait_for(started.wait(), 10)
        assert await charge.forget("o-1")  # an operator reopens the key...
        taken_at = time.monotonic()
        second = await charge("o-1")  # ...and a retry claims it and runs
        with pytest.raises(ClaimLostError) as caught:
            await first
        stopped_after = time.monotonic() - taken_at
        replayed = await charge("o-1")
        await client.aclose()
        return caught.value, second, replayed, stopped_after

    error, second, replayed, stopped_after = asyncio.run(scenario())
    assert seen == ["cancelled"]
    assert _effects(raw, namespace) == 1
    assert second == replayed == "charged by run 2"
    assert error.result is None
    assert "was cancelled" in str(error)
    assert GONE in str(error)
    assert isinstance(error.__cause__, asyncio.CancelledError)
    assert stopped_after < LEASE  # within a renewal interval and a round trip
    assert isinstance(Claim(raw, "o-1", namespace=namespace).acquire(), Completed)


def test_a_sync_call_whose_key_is_taken_over_stops_at_ensure_held(raw: redis.Redis) -> None:
    """Threads: the first owner's ensure_held() raises once its keep-alive saw the takeover; one side effect."""
    namespace = unique("lost-sync")
    client = redis.Redis(host=servers.HOST, port=raw.connection_pool.connection_kwargs["port"])
    started, go_on = threading.Event(), threading.Event()
    handles: list[Any] = []

    @idempotent(client, key="order", namespace=namespace, lease=LEASE, wait=0)
    def charge(order: str) -> str:
        run = client.incr(f"{namespace}:runs")
        if run == 1:
            handles.append(current_claim())
            started.set()
            go_on.wait(30)
        current_claim().ensure_held()  # the irreversible step is next
        client.incr(f"{namespace}:effects")
        return f"charged by run {run}"

    errors: list[ClaimLostError] = []

    def first() -> None:
        try:
            charge("o-1")
        except ClaimLostError as exc:
            errors.append(exc)

    thread = threading.Thread(target=first)
    thread.start()
    assert started.wait(10)
    assert charge.forget("o-1")
    assert charge("o-1") == "charged by run 2"
    (handle,) = handles
    assert until(lambda: _raises(handle), LEASE * 2)  # its keep-alive's renewal found the key taken
    go_on.set()
    thread.join(10)
    assert len(errors) == 1
    assert GONE in str(errors[0])
    assert repr(handle.token) in str(errors[0])
    assert _effects(raw, namespace) == 1
    assert charge("o-1") == "charged by run 2"  # stored by the second owner, untouched by the first
    client.close()


def _raises(handle: Any) -> bool:
    try:
        handle.ensure_held()
    except ClaimLostError:
        return True
    return False


def test_a_stopped_call_ends_in_a_lease_lost_event(raw: redis.Redis) -> None:
    """The call's event says its work was stopped by the loss (lease_lost), after the renewal's lease_lost."""
    namespace = unique("lost-event")
    recorded: list[goblin_claim._events.Event] = []
    goblin_claim.add_listener(recorded.append)
    try:

        async def scenario() -> None:
            client = redis.asyncio.Redis(host=servers.HOST, port=raw.connection_pool.connection_kwargs["port"])
            started = asyncio.Event()

            @idempotent(client, key="order", namespace=namespace, lease=LEASE, wait=0)
            async def charge(order: str) -> str:
                started.set()
                await asyncio.sleep(30)
                return "never"

            first = asyncio.ensure_future(charge("o-2"))
            await asyncio.wait_for(started.wait(), 10)
            Claim(raw, "o-2", namespace=namespace).forget()
            raw.set(Claim(raw, "o-2", namespace=namespace).claim_key, "another-owner", ex=30)
            with pytest.raises(ClaimLostError):
                await first
            await client.aclose()

        asyncio.run(scenario())
    finally:
        goblin_claim.remove_listener(recorded.append)
    mine = [(e.operation, e.outcome) for e in recorded if e.key == "o-2" and e.operation in ("call", "renew")]
    assert mine[-2:] == [("renew", "lease_lost"), ("call", "lease_lost")]
    assert raw.get(Claim(raw, "o-2", namespace=namespace).claim_key) == b"another-owner"  # not released


# --------------------------------------------------------------------------- cancellation from outside


def test_an_outside_cancellation_stays_cancelled_error_and_gives_the_claim_back(raw: redis.Redis) -> None:
    """No loss: cancelling the caller cancels the work as ever; the claim is given back and a retry runs."""
    namespace = unique("outside")

    async def scenario() -> None:
        client = redis.asyncio.Redis(host=servers.HOST, port=raw.connection_pool.connection_kwargs["port"])
        started = asyncio.Event()

        @idempotent(client, key="order", namespace=namespace, lease=LEASE, wait=0)
        async def charge(order: str) -> str:
            if await client.incr(f"{namespace}:runs") == 1:
                started.set()
                await asyncio.sleep(30)
            await client.incr(f"{namespace}:effects")
            return "charged"

        task = asyncio.ensure_future(charge("o-3"))
        await asyncio.wait_for(started.wait(), 10)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert await charge("o-3") == "charged"  # given back: the retry ran at once
        await client.aclose()

    asyncio.run(scenario())
    assert _effects(raw, namespace) == 1


@pytest.mark.parametrize("first", ["loss", "outside"])
def test_an_outside_cancellation_in_the_same_loop_turn_as_a_loss_wins(first: str) -> None:
    """A loss and an outside cancellation in one loop turn, either first: the caller gets CancelledError.

    The loss is marked by hand (no renewal needed), in the same callback as the
    outside ``cancel()``, so both reach the task before it runs again: on 3.11+ the
    task's cancellation count tells them apart, on 3.10 the work's own task does.
    """

    async def scenario() -> None:
        client = fake_async_redis(native=False)
        namespace = unique("both")
        started = asyncio.Event()
        handles: list[Any] = []

        @idempotent(client, key="order", namespace=namespace, lease=30, wait=0)
        async def charge(order: str) -> str:
            handles.append(current_claim())
            started.set()
            await asyncio.sleep(30)
            return "never"

        task = asyncio.ensure_future(charge("o-4"))
        await asyncio.wait_for(started.wait(), 10)
        keeper = handles[0]._keeper

        def both() -> None:
            if first == "outside":
                task.cancel()
            keeper._lose(GONE, None)
            if first == "loss":
                task.cancel()

        asyncio.get_running_loop().call_soon(both)
        with pytest.raises(asyncio.CancelledError):
            await task
        assert keeper.lost
        assert not keeper._stopped_work
        await client.aclose()

    asyncio.run(scenario())


def test_a_loss_alone_in_a_turn_is_claim_lost_and_leaves_the_callers_task_uncancelled() -> None:
    """The loss marked by hand: ClaimLostError, and the caller's task goes on as if never cancelled."""

    async def scenario() -> None:
        client = fake_async_redis(native=False)
        namespace = unique("alone")
        started = asyncio.Event()
        handles: list[Any] = []

        @idempotent(client, key="order", namespace=namespace, lease=30, wait=0)
        async def charge(order: str) -> str:
            handles.append(current_claim())
            started.set()
            await asyncio.sleep(30)
            return "never"

        async def caller() -> str:
            try:
                await charge("o-5")
            except ClaimLostError:
                await asyncio.sleep(0.01)  # an uncancelled task awaits on
                return "told"
            return "not told"

        task = asyncio.ensure_future(caller())
        await asyncio.wait_for(started.wait(), 10)
        asyncio.get_running_loop().call_soon(handles[0]._keeper._lose, GONE, None)
        assert await task == "told"
        if hasattr(task, "cancelling"):
            assert task.cancelling() == 0
        await client.aclose()

    asyncio.run(scenario())


# --------------------------------------------------------------------------- current_claim()


def test_current_claim_outside_a_call_raises_a_lookup_error() -> None:
    """Outside a decorated function's run: NoCurrentClaimError, a GoblinClaimError and a LookupError."""
    with pytest.raises(NoCurrentClaimError, match="outside the function of an @idempotent call"):
        current_claim()
    assert issubclass(NoCurrentClaimError, GoblinClaimError)
    assert issubclass(NoCurrentClaimError, LookupError)


def test_current_claim_names_the_innermost_call_in_both_flavours() -> None:
    """Inside: the call's own handle (its key and token); nested: the inner one, then the outer's again."""
    client = fake_redis(native=False)
    seen: list[tuple[str, str]] = []

    @idempotent(client, key="item", namespace=unique("inner"))
    def inner(item: str) -> str:
        handle = current_claim()
        assert isinstance(handle, Claim)
        seen.append(("inner", handle.key))
        return item

    @idempotent(client, key="item", namespace=unique("outer"))
    def outer(item: str) -> str:
        seen.append(("outer", current_claim().key))
        inner(f"{item}-in")
        seen.append(("outer", current_claim().key))
        return item

    assert outer("a") == "a"
    assert seen == [("outer", "a"), ("inner", "a-in"), ("outer", "a")]
    with pytest.raises(LookupError):
        current_claim()

    async def scenario() -> None:
        aclient = fake_async_redis(native=False)

        @idempotent(aclient, key="item", namespace=unique("async"))
        async def work(item: str) -> str:
            handle = current_claim()
            assert isinstance(handle, AsyncClaim)
            handle.ensure_held()
            # A task the work starts sees it too (tasks copy the context).
            assert await asyncio.ensure_future(_key_of_current()) == item
            return handle.key

        assert await work("b") == "b"
        with pytest.raises(NoCurrentClaimError):
            current_claim()
        await aclient.aclose()

    asyncio.run(scenario())


async def _key_of_current() -> str:
    return current_claim().key


class _Spy:
    """Stands for the decorator's context variable, counting what sets it."""

    def __init__(self) -> None:
        self.sets = 0
        self._var: contextvars.ContextVar[Any] = contextvars.ContextVar("spy")

    def set(self, value: Any) -> contextvars.Token[Any]:
        self.sets += 1
        return self._var.set(value)

    def reset(self, token: contextvars.Token[Any]) -> None:
        self._var.reset(token)


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_duplicate_never_touches_the_context_variable(kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Only a call that runs the function sets it: a replay (the hot path) costs nothing for current_claim()."""
    spy = _Spy()
    monkeypatch.setattr(decorator_sync if kind == "sync" else decorator_aio, "CURRENT", spy)
    if kind == "sync":

        @idempotent(fake_redis(native=False), key="item", namespace=unique("spy"))
        def work(item: str) -> str:
            return item

        assert [work("k"), work("k"), work("k")] == ["k"] * 3
    else:

        async def scenario() -> list[str]:
            @idempotent(fake_async_redis(native=False), key="item", namespace=unique("spy"))
            async def work(item: str) -> str:
                return item

            return [await work("k"), await work("k"), await work("k")]

        assert asyncio.run(scenario()) == ["k"] * 3
    assert spy.sets == 1


# --------------------------------------------------------------------------- an owner frozen past its lease


def _freeze_past_the_lease(raw: redis.Redis, kind: str) -> tuple[str, dict[str, Any], float, int]:
    """A child process owns the key and is frozen (SIGSTOP) 3 s into a 2 s lease; a second owner runs meanwhile.

    Returns the namespace, what the child's caller got, when it was woken (SIGCONT,
    the monotonic clock) and the child's exit code.
    """
    namespace = unique(f"frozen-{kind}")
    port = raw.connection_pool.connection_kwargs["port"]
    child = SPAWN.Process(target=frozen_owner.run, args=(port, namespace, kind, LEASE, 4.0))
    child.start()
    assert child.pid is not None
    try:
        assert until(lambda: raw.get(frozen_owner.started_key(namespace)) is not None, 30), "never started"
        time.sleep(0.3)
        os.kill(child.pid, signal.SIGSTOP)
        frozen_at = time.monotonic()
        claim_key = Claim(raw, "item", namespace=namespace).claim_key
        assert until(lambda: raw.get(claim_key) is None, LEASE + 2)  # its lease lapsed on the server
        # The second owner: claims the lapsed key and runs the side effect while the first is frozen.
        second = Claim(raw, "item", namespace=namespace, lease=30)
        assert isinstance(second.acquire(), Claimed)
        raw.incr(frozen_owner.effects_key(namespace))
        second.complete(b'"ran in the second owner"')
        time.sleep(max(0.0, frozen_at + LEASE + 1.0 - time.monotonic()))  # frozen a second past the lease
        woken = time.monotonic()
        os.kill(child.pid, signal.SIGCONT)
        child.join(30)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(child.pid, signal.SIGCONT)
        if child.is_alive():
            child.kill()
    outcome = json.loads(raw.get(frozen_owner.outcome_key(namespace)) or b"{}")
    return namespace, outcome, woken, child.exitcode or 0


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["sync", "async"])
def test_an_owner_frozen_past_its_lease_is_stopped_before_its_side_effect(raw: redis.Redis, kind: str) -> None:
    """SIGSTOP past the lease, a second owner runs, SIGCONT: the first never reaches its side effect.

    Sync: its ``ensure_held()`` raises, by its keep-alive's clock (the renewer had no
    time to run). asyncio: its keep-alive's overdue timer marks the loss first, and
    the work is cancelled in its sleep. The caller gets ``ClaimLostError``; one side
    effect in all; the second owner's result stands.
    """
    namespace, outcome, woken, exitcode = _freeze_past_the_lease(raw, kind)
    assert exitcode == 0
    assert outcome["got"] == "ClaimLostError", outcome
    assert _effects(raw, namespace) == 1  # the second owner's alone
    stopped = float(raw.get(frozen_owner.stopped_key(namespace)) or 0)
    assert woken <= stopped < woken + LEASE  # stopped soon after it could run again
    assert isinstance(Claim(raw, "item", namespace=namespace).acquire(), Completed)
    assert raw.get(Claim(raw, "item", namespace=namespace).claim_key).startswith(b"done ")  # type: ignore[union-attr]
