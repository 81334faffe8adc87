"""Lost means stopped, on the handle: ``ensure_held()`` and ``keep_alive(cancel_on_loss=True)``.

``ensure_held()`` reads no server: it goes by the handle's keep-alive (a renewal
found the claim gone, none succeeded before the lease ran out, or the lease is over
by the clock when the renewer did not run in time) or, without one, by the handle's
own clock. An asyncio keep-alive armed with ``cancel_on_loss=True`` cancels the
block's task when it marks the claim lost; the block raises ``ClaimLostError``, a
cancellation from outside stays ``CancelledError``. On the session's standalone
redis-server (fakeredis where no time passes), both drivers.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
import redis
import redis.asyncio

from goblin_claim import AsyncClaim, Claim, Claimed, ClaimLostError, InvalidArgumentError, InvalidArgumentTypeError
from goblin_claim._drivers.keepalive import GONE, LAPSED, OVER
from goblin_claim._protocol.scripts import EXTEND
from goblin_claim.testing import fake_async_redis, fake_redis
from tests.conftest import unique, until, until_async
from tests.support import servers
from tests.support.proxy import FaultProxy
from tests.support.servers import RedisProcess

NS = "held"


def _take_over(raw: redis.Redis, claim: Any) -> Claim:
    """Delete ``claim``'s record and claim the key with another token, as an operator and a retry would."""
    Claim(raw, claim.key, namespace=NS).forget()
    other = Claim(raw, claim.key, namespace=NS, lease=30)
    assert isinstance(other.acquire(), Claimed)
    return other


@pytest.fixture
def raw(redis_standalone: RedisProcess) -> Any:
    """A sync client on the session's standalone server."""
    client = redis.Redis(host=servers.HOST, port=redis_standalone.port)
    yield client
    client.close()


# --------------------------------------------------------------------------- without a keep-alive


def test_a_handle_that_took_no_claim_raises_naming_key_and_token() -> None:
    """Never claimed, or made with another handle's token: no lease of its own to go by."""
    client = fake_redis(native=False)
    fresh = Claim(client, "evt-1", namespace=NS)
    with pytest.raises(ClaimLostError, match="holds no claim of its own") as caught:
        fresh.ensure_held()
    assert caught.value.key == "evt-1"
    assert repr(fresh.token) in str(caught.value)
    owner = Claim(client, "evt-1", namespace=NS)
    assert isinstance(owner.acquire(), Claimed)
    owner.ensure_held()  # held: returns None
    adopted = Claim(client, "evt-1", namespace=NS, token=owner.token)
    with pytest.raises(ClaimLostError, match="token of a claim another handle took"):
        adopted.ensure_held()


@pytest.mark.parametrize("end", ["complete", "release", "forget"])
def test_a_claim_given_up_is_not_held(end: str) -> None:
    """After complete(), release() or forget(), the handle holds nothing: ensure_held() raises."""
    claim = Claim(fake_redis(native=False), unique("given-up"), namespace=NS)
    assert isinstance(claim.acquire(), Claimed)
    claim.ensure_held()
    if end == "complete":
        claim.complete(b"done")
    else:
        getattr(claim, end)()
    with pytest.raises(ClaimLostError, match="holds no claim of its own"):
        claim.ensure_held()


def test_without_a_keep_alive_the_lease_ends_by_the_handles_own_clock(raw: redis.Redis) -> None:
    """A 1 s lease, no keep-alive: held until a second after the claim was sent, then lost by its own clock."""
    claim = Claim(raw, unique("clock"), namespace=NS, lease=1)
    sent = time.monotonic()
    assert isinstance(claim.acquire(), Claimed)
    claim.ensure_held()
    assert until(lambda: _raises(claim), 3)
    assert time.monotonic() - sent >= 1.0  # never before the lease it took was over
    with pytest.raises(ClaimLostError, match="over by this handle's own clock"):
        claim.ensure_held()


def _raises(claim: Any) -> bool:
    try:
        claim.ensure_held()
    except ClaimLostError:
        return True
    return False


def test_the_async_handle_reads_the_same_knowledge() -> None:
    """AsyncClaim.ensure_held() is a plain method: no await, the same answers."""

    async def scenario() -> None:
        claim = AsyncClaim(fake_async_redis(native=False), unique("async-held"), namespace=NS)
        with pytest.raises(ClaimLostError):
            claim.ensure_held()
        assert isinstance(await claim.acquire(), Claimed)
        claim.ensure_held()
        await claim.release()
        with pytest.raises(ClaimLostError):
            claim.ensure_held()

    asyncio.run(scenario())


# --------------------------------------------------------------------------- with a keep-alive


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_renewal_that_finds_the_claim_taken_makes_ensure_held_raise(raw: redis.Redis, kind: str) -> None:
    """The key forgotten and taken by another token mid-work: within a renewal, ensure_held() says gone."""
    lease = 2
    if kind == "sync":
        claim: Any = Claim(raw, unique("taken"), namespace=NS, lease=lease)
        assert isinstance(claim.acquire(), Claimed)
        with claim.keep_alive() as keeper:
            claim.ensure_held()
            taken_at = time.monotonic()
            other = _take_over(raw, claim)
            assert until(lambda: _raises(claim), lease * 2)
            seen_after = time.monotonic() - taken_at
            assert keeper.lost
    else:

        async def scenario() -> tuple[Any, Any, float]:
            client = redis.asyncio.Redis(host=servers.HOST, port=raw.connection_pool.connection_kwargs["port"])
            claim = AsyncClaim(client, unique("taken"), namespace=NS, lease=lease)
            assert isinstance(await claim.acquire(), Claimed)
            async with claim.keep_alive() as keeper:
                claim.ensure_held()
                taken_at = time.monotonic()
                other = await asyncio.to_thread(_take_over, raw, claim)
                assert await until_async(lambda: _raises(claim), lease * 2)
                seen_after = time.monotonic() - taken_at
                assert keeper.lost
            await client.aclose()
            return claim, other, seen_after

        claim, other, seen_after = asyncio.run(scenario())
    with pytest.raises(ClaimLostError) as caught:
        claim.ensure_held()
    assert GONE in str(caught.value)
    assert repr(claim.key) in str(caught.value)
    assert repr(claim.token) in str(caught.value)
    assert seen_after < lease  # within one renewal interval (a third of the lease) and a round trip
    assert raw.get(other.claim_key) == other.token.encode()  # the new owner's claim is untouched


def test_a_keep_alive_that_cannot_renew_raises_once_its_lease_is_over() -> None:
    """Every renewal refused on the wire: lost before the lease's end, and ensure_held() says why."""
    client = redis.Redis(host=servers.HOST, port=servers.free_port(), socket_connect_timeout=0.2)
    claim = Claim(client, unique("unrenewed"), namespace=NS, lease=1)
    claim._mine_until = time.monotonic() + 1  # as if it took the claim now: there is no server to take it on
    try:
        with claim.keep_alive(interval=0.2) as keeper:
            claim.ensure_held()
            assert until(lambda: keeper.lost, 5)
            with pytest.raises(ClaimLostError, match=LAPSED):
                claim.ensure_held()
    finally:
        client.close()


def test_a_keep_alive_whose_renewer_did_not_run_in_time_goes_by_the_clock(raw: redis.Redis) -> None:
    """Past the keep-alive's deadline with nothing marked yet (a frozen process): lost by the clock, at once."""
    claim = Claim(raw, unique("late-renewer"), namespace=NS, lease=2)
    assert isinstance(claim.acquire(), Claimed)
    with claim.keep_alive() as keeper:
        keeper._deadline = time.monotonic() - 0.01  # as a freeze past the lease leaves it, before the renewer runs
        claim._mine_until = keeper._deadline
        assert not keeper.lost
        with pytest.raises(ClaimLostError, match="over by this handle's own clock"):
            claim.ensure_held()
    assert OVER.startswith("the lease is over by this handle's own clock")
    claim.release()


def test_a_keep_alive_of_an_adopted_handle_answers_for_it(raw: redis.Redis) -> None:
    """A handle made with another's token has no clock of its own; its keep-alive's renewals answer instead."""
    owner = Claim(raw, unique("adopted"), namespace=NS, lease=2)
    assert isinstance(owner.acquire(), Claimed)
    adopted = Claim(raw, owner.key, namespace=NS, lease=2, token=owner.token)
    with pytest.raises(ClaimLostError):
        adopted.ensure_held()
    with adopted.keep_alive() as keeper:
        adopted.ensure_held()  # the keep-alive's knowledge: a whole lease from its start, renewed
        assert until(lambda: keeper.renewals >= 1, 5)
        adopted.ensure_held()
        _take_over(raw, owner)
        assert until(lambda: _raises(adopted), 5)


# --------------------------------------------------------------------------- cancel_on_loss


def test_a_sync_keep_alive_refuses_cancel_on_loss() -> None:
    """A thread cannot be cancelled: Claim.keep_alive(cancel_on_loss=True) says to call ensure_held() instead."""
    claim = Claim(fake_redis(native=False), "evt-2", namespace=NS)
    with pytest.raises(InvalidArgumentError, match="ensure_held"):
        claim.keep_alive(cancel_on_loss=True)
    with pytest.raises(InvalidArgumentTypeError):
        claim.keep_alive(cancel_on_loss=1)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentTypeError):
        AsyncClaim(fake_async_redis(native=False), "evt-2", namespace=NS).keep_alive(cancel_on_loss="yes")  # type: ignore[arg-type]


def test_cancel_on_loss_cancels_the_block_and_raises_claim_lost(raw: redis.Redis) -> None:
    """The key taken mid-block: the block's await is cancelled before the side effect; ClaimLostError comes out."""
    effects: list[str] = []

    async def scenario() -> tuple[BaseException | None, list[str], float]:
        client = redis.asyncio.Redis(host=servers.HOST, port=raw.connection_pool.connection_kwargs["port"])
        claim = AsyncClaim(client, unique("block"), namespace=NS, lease=2)
        assert isinstance(await claim.acquire(), Claimed)
        seen: list[str] = []
        caught: BaseException | None = None
        taken_at = 0.0
        try:
            async with claim.keep_alive(cancel_on_loss=True) as keeper:
                await asyncio.sleep(0.1)
                await asyncio.to_thread(_take_over, raw, claim)
                taken_at = time.monotonic()
                try:
                    await asyncio.sleep(10)
                except asyncio.CancelledError:
                    seen.append("cancelled")
                    raise
                effects.append("charged")
        except ClaimLostError as exc:
            caught = exc
        stopped_after = time.monotonic() - taken_at
        assert keeper.lost
        assert keeper._stopped_work
        await client.aclose()
        return caught, seen, stopped_after

    caught, seen, stopped_after = asyncio.run(scenario())
    assert isinstance(caught, ClaimLostError)
    assert "was cancelled" in str(caught)
    assert GONE in str(caught)
    assert isinstance(caught.__cause__, asyncio.CancelledError)
    assert seen == ["cancelled"]
    assert effects == []
    assert stopped_after < 2  # within a renewal interval and a round trip, well inside the lease


def test_cancel_on_loss_keeps_an_outside_cancellation(raw: redis.Redis) -> None:
    """A block cancelled from outside, its claim held: CancelledError as ever, the key's claim left to its owner."""

    async def scenario() -> None:
        client = redis.asyncio.Redis(host=servers.HOST, port=raw.connection_pool.connection_kwargs["port"])
        claim = AsyncClaim(client, unique("outside"), namespace=NS, lease=5)
        assert isinstance(await claim.acquire(), Claimed)

        async def block() -> None:
            async with claim.keep_alive(cancel_on_loss=True):
                await asyncio.sleep(10)

        task = asyncio.ensure_future(block())
        await asyncio.sleep(0.2)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        claim.ensure_held()
        await claim.release()
        await client.aclose()

    asyncio.run(scenario())


def test_an_event_loop_stalled_past_the_lease_stops_the_block_before_its_next_step(raw: redis.Redis) -> None:
    """The loop blocked past the lease by other code: the work is cancelled before its next step.

    The keep-alive's late timer marks the loss in the same loop turn as the work's own
    timer fires, so the work never runs on past its sleep.
    """
    effects: list[str] = []

    async def scenario() -> BaseException | None:
        client = redis.asyncio.Redis(host=servers.HOST, port=raw.connection_pool.connection_kwargs["port"])
        claim = AsyncClaim(client, unique("stall"), namespace=NS, lease=1)
        assert isinstance(await claim.acquire(), Claimed)
        loop = asyncio.get_running_loop()
        try:
            async with claim.keep_alive(cancel_on_loss=True):
                loop.call_later(0.1, time.sleep, 1.3)  # another callback blocks the loop past the lease
                await asyncio.sleep(0.6)  # its timer comes due during the stall, as the keep-alive's does
                effects.append("charged")
        except ClaimLostError as exc:
            return exc
        finally:
            await client.aclose()
        return None

    caught = asyncio.run(scenario())
    assert isinstance(caught, ClaimLostError)
    assert LAPSED in str(caught)
    assert effects == []


def test_work_that_blocks_its_own_loop_asks_ensure_held(raw: redis.Redis) -> None:
    """Work that stalls the loop itself runs on until it awaits: ensure_held() before the step says lost."""

    async def scenario() -> None:
        client = redis.asyncio.Redis(host=servers.HOST, port=raw.connection_pool.connection_kwargs["port"])
        claim = AsyncClaim(client, unique("own-stall"), namespace=NS, lease=1)
        assert isinstance(await claim.acquire(), Claimed)
        try:
            async with claim.keep_alive() as keeper:
                time.sleep(1.3)  # noqa: ASYNC251 -- the work's own blocking step: no timer runs meanwhile
                assert not keeper.lost  # nothing ran to mark it
                with pytest.raises(ClaimLostError, match="over by this handle's own clock"):
                    claim.ensure_held()
        finally:
            await client.aclose()

    asyncio.run(scenario())


def test_a_loop_stalled_while_a_renewal_is_out_stops_the_block_before_its_next_step(raw: redis.Redis) -> None:
    """A renewal held on the wire, then the loop blocked past the lease: the batch's give-up marks the loss first.

    The work's own timer comes due during the stall too, before the give-up's: the
    give-up still runs in the same loop turn, so the work is cancelled where it awaits.
    """
    effects: list[str] = []
    port = raw.connection_pool.connection_kwargs["port"]

    async def scenario(proxy: FaultProxy) -> BaseException | None:
        client = redis.asyncio.Redis(host=servers.HOST, port=proxy.port)
        claim = AsyncClaim(client, unique("out-stall"), namespace=NS, lease=1)
        assert isinstance(await claim.acquire(), Claimed)
        proxy.faults.hold_next_reply(b"EVALSHA", EXTEND.sha.encode(), times=None)
        loop = asyncio.get_running_loop()
        try:
            async with claim.keep_alive(cancel_on_loss=True):
                await asyncio.sleep(0.45)  # the renewal went out at a third of the lease; its reply is held
                loop.call_later(0.05, time.sleep, 1.0)  # then the loop blocks past the lease's end
                await asyncio.sleep(0.3)  # due during the stall
                effects.append("charged")
        except ClaimLostError as exc:
            return exc
        finally:
            await client.aclose()
        return None

    with FaultProxy(port, hold_limit=5) as proxy:
        caught = asyncio.run(scenario(proxy))
        assert proxy.faults.lost(b"EVALSHA", EXTEND.sha.encode()) >= 1  # the renewal was on the wire
    assert isinstance(caught, ClaimLostError)
    assert LAPSED in str(caught)
    assert effects == []
