"""Typing checks: mypy --strict reads this file (make test); pytest never runs it.

Each assert_type states what a type checker must infer; each "type: ignore[...]"
states an error it must report (an unused ignore is itself an error under --strict).
"""

from __future__ import annotations

from collections.abc import Coroutine
from typing import Any

import redis
import redis.asyncio
from typing_extensions import assert_type

from goblin_claim import AsyncClaim, Claim, Claimed, Completed, InFlight, current_claim, idempotent

client = redis.Redis()
async_client = redis.asyncio.Redis()


@idempotent(client, key="order_id")
def charge(order_id: str, amount: int) -> int:
    """A decorated def keeps its parameters and return type."""
    return amount


@idempotent(async_client, key=lambda order_id, amount: order_id)
async def charge_async(order_id: str, amount: int) -> str:
    """A decorated async def stays a coroutine function of the same parameters."""
    return order_id


assert_type(charge("o-1", 5), int)
charge("o-1", "five")  # type: ignore[arg-type]
assert_type(charge.forget("o-1", 5), bool)
charge.forget("o-1")  # type: ignore[call-arg]


async def call_async() -> None:
    """The async twin's call is a coroutine of the declared result."""
    pending: Coroutine[Any, Any, str] = charge_async("o-1", 5)
    assert_type(await pending, str)
    await charge_async(order_id="o-1")  # type: ignore[call-arg]
    assert_type(await charge_async.forget("o-1", 5), bool)
    await charge_async.forget("o-1", amount="5")  # type: ignore[arg-type]


def outcomes() -> None:
    """acquire() narrows with match and isinstance."""
    claim = Claim(client, "evt88", lease=30)
    match claim.acquire():
        case Claimed(token=token):
            assert_type(token, str)
        case Completed(value=value):
            assert_type(value, str | bytes)
        case InFlight(key=key):
            assert_type(key, str)
    assert_type(claim.wait(timeout=1.0), Claimed | Completed)
    assert_type(claim.release(), bool)


async def async_outcomes() -> None:
    """AsyncClaim's methods are awaitable twins."""
    claim = AsyncClaim(async_client, "evt88")
    assert_type(await claim.acquire(), Claimed | Completed | InFlight)
    assert_type(await claim.release(), bool)
    async with claim.keep_alive() as keeper:
        assert_type(keeper.lost, bool)


def lost_means_stopped() -> None:
    """ensure_held() is a plain method on both handles; current_claim() is one handle or the other."""
    assert_type(Claim(client, "evt88").ensure_held(), None)
    assert_type(AsyncClaim(async_client, "evt88").ensure_held(), None)
    handle = current_claim()
    assert_type(handle, Claim | AsyncClaim)
    handle.ensure_held()
    AsyncClaim(async_client, "evt88").keep_alive(cancel_on_loss=True)
    Claim(client, "evt88").keep_alive(1.0, True)  # type: ignore[call-arg]  # cancel_on_loss is keyword-only
