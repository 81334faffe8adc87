"""``checkpoints=True``: progress an owner saves reaches the next owner, and only an owner can save it.

Both drivers, on fakeredis (scripts, and the native plug-in), a stock redis-server, the
redis-server with the reference module, a cluster, Valkey 9 and Redis 8.2: the next
owner's ``Claimed.checkpoint``; a stale owner refused (and never overwriting); cleared by
``complete()``, kept by ``release()``, deleted by ``forget()``; fenced; bounded at 64 KiB,
and every bad input refused before anything is sent.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
import redis
import redis.asyncio

from goblin_claim import (
    AsyncClaim,
    Claim,
    Claimed,
    ClaimLostError,
    Completed,
    InterruptedWorkError,
    InvalidArgumentError,
    InvalidArgumentTypeError,
    WrongTypeError,
)
from goblin_claim._defaults import CHECKPOINT_MAX_BYTES
from tests.conftest import Driver, unique
from tests.support.units import checkpoint_key, held, lapse_lease, pass_deadline

BACKENDS = ("fake", "fake-native", "standalone", "native", "cluster", "valkey", "redis8")


def _owner(driver: Driver, key: str | None = None, **options: Any) -> Any:
    handle = driver.claim(key or unique("cp"), checkpoints=True, lease=30, ttl=600, **options)
    outcome = handle.acquire()
    assert isinstance(outcome, Claimed)
    return handle


def test_the_next_owner_resumes_from_the_last_checkpoint(driver: Driver) -> None:
    """Checkpoints kept for the ttl; after a lapse the next owner's Claimed carries the last; complete() clears it."""
    first = _owner(driver)
    assert first.last_checkpoint is None
    for step in (b"step=1", b"step=2", b"step=3"):
        first.checkpoint(step)
        assert first.last_checkpoint == step
    assert driver.raw.get(checkpoint_key(first)) == b"step=3"
    assert 590 <= driver.raw.ttl(checkpoint_key(first)) <= 600
    lapse_lease(driver.raw, first)
    second = driver.claim(first.key, checkpoints=True)
    outcome = second.acquire()
    assert isinstance(outcome, Claimed)
    assert outcome.checkpoint == b"step=3"
    assert second.last_checkpoint == b"step=3"
    second.checkpoint(b"step=4")
    second.complete(b"done")
    assert driver.raw.exists(checkpoint_key(first)) == 0
    assert driver.claim(first.key, checkpoints=True).acquire() == Completed(key=first.key, value=b"done")


def test_a_stale_owner_never_overwrites_the_next_owners_checkpoint(driver: Driver) -> None:
    """Lapsed and taken over: the first owner's checkpoint() raises ClaimLostError and writes nothing."""
    first = _owner(driver)
    first.checkpoint(b"step=1 by first")
    lapse_lease(driver.raw, first)
    second = driver.claim(first.key, checkpoints=True)
    assert isinstance(second.acquire(), Claimed)
    second.checkpoint(b"step=2 by second")
    with pytest.raises(ClaimLostError):
        first.checkpoint(b"step=2 by first")
    assert driver.raw.get(checkpoint_key(first)) == b"step=2 by second"
    assert first.last_checkpoint == b"step=1 by first"


def test_release_keeps_the_checkpoint_and_forget_deletes_it(driver: Driver) -> None:
    """release() gives the work back with its progress; forget() starts it afresh."""
    first = _owner(driver)
    first.checkpoint(b"step=5")
    assert first.release() is True
    second = driver.claim(first.key, checkpoints=True)
    assert second.acquire() == Claimed(key=first.key, token=second.token, lease=second.lease, checkpoint=b"step=5")
    assert second.forget() is True
    assert driver.raw.exists(first.claim_key, checkpoint_key(first)) == 0
    third = driver.claim(first.key, checkpoints=True)
    outcome = third.acquire()
    assert isinstance(outcome, Claimed)
    assert outcome.checkpoint is None


@pytest.mark.parametrize("after", ["complete", "release", "forget", "lapse"])
def test_a_checkpoint_once_the_claim_is_gone_is_refused_and_writes_nothing(driver: Driver, after: str) -> None:
    """After complete(), release(), forget() or a lapse, checkpoint() raises ClaimLostError and stores nothing."""
    owner = _owner(driver)
    owner.checkpoint(b"step=1")
    if after == "complete":
        owner.complete(b"done")
    elif after == "lapse":
        lapse_lease(driver.raw, owner)
    else:
        getattr(owner, after)()
    before = driver.raw.get(checkpoint_key(owner))
    with pytest.raises(ClaimLostError):
        owner.checkpoint(b"step=2")
    assert driver.raw.get(checkpoint_key(owner)) == before


def test_an_at_most_once_owner_checkpoints_until_its_deadline(driver: Driver) -> None:
    """With at_most_once: checkpoints while the deadline lasts; past it ClaimLostError, nothing written."""
    owner = _owner(driver, at_most_once=True)
    owner.checkpoint(b"step=1")
    pass_deadline(driver.raw, owner)
    with pytest.raises(ClaimLostError):
        owner.checkpoint(b"step=2")
    assert driver.raw.get(checkpoint_key(owner)) == b"step=1"
    owner.complete(b"late")  # a late owner still stores, and the checkpoint goes with it
    assert driver.raw.exists(checkpoint_key(owner)) == 0


def test_a_fenced_checkpoint_of_a_stale_owner_sharing_its_token_is_refused(driver: Driver) -> None:
    """Two owners with one token (a worker id): only the fence tells them apart; the stale one's checkpoint is refused."""  # noqa: E501
    first = _owner(driver, token="worker-7", fencing=True)
    lapse_lease(driver.raw, first)
    second = _owner(driver, first.key, token="worker-7", fencing=True)
    second.checkpoint(b"step=1 by second")
    with pytest.raises(ClaimLostError):
        first.checkpoint(b"step=9 by first")
    assert driver.raw.get(checkpoint_key(first)) == b"step=1 by second"
    second.complete(b"done")
    assert driver.raw.exists(checkpoint_key(first), f"{first.claim_key}:fence") == 0


def test_a_fenced_at_most_once_checkpointed_claim_answers_fence_and_checkpoint(driver: Driver) -> None:
    """All three options: the win carries the next fence and the saved checkpoint."""
    first = _owner(driver, at_most_once=True, fencing=True)
    first.checkpoint(b"step=2")
    assert first.release() is True
    second = driver.claim(first.key, checkpoints=True, at_most_once=True, fencing=True)
    outcome = second.acquire()
    assert isinstance(outcome, Claimed)
    assert outcome.checkpoint == b"step=2"
    assert isinstance(outcome.fence, int)
    assert held(driver.raw, second) is not None


def test_the_bound_is_64_kib_and_a_larger_checkpoint_is_refused_before_it_is_sent(driver: Driver) -> None:
    """64 KiB is stored; one byte more (or a str that encodes to more) is InvalidArgumentError, nothing changed."""
    owner = _owner(driver)
    owner.checkpoint(b"x" * CHECKPOINT_MAX_BYTES)
    assert driver.raw.strlen(checkpoint_key(owner)) == CHECKPOINT_MAX_BYTES
    owner.checkpoint(b"step=1")
    for too_big in (b"x" * (CHECKPOINT_MAX_BYTES + 1), "\u00e9" * (CHECKPOINT_MAX_BYTES // 2 + 1)):
        with pytest.raises(InvalidArgumentError) as caught:
            owner.checkpoint(too_big)
        assert caught.value.key == owner.key
        assert str(CHECKPOINT_MAX_BYTES) in str(caught.value)
    assert driver.raw.get(checkpoint_key(owner)) == b"step=1"
    assert owner.last_checkpoint == b"step=1"


def test_a_checkpoint_key_of_another_type_fails_the_claim_before_it_is_written(driver: Driver) -> None:
    """A hash at the checkpoint key: WrongTypeError, and no record, no counter (an at-most-once key is not poisoned)."""
    key = unique("cp-hash")
    probe = driver.claim(key, checkpoints=True)
    driver.raw.hset(checkpoint_key(probe), "field", "value")
    handle = driver.claim(key, checkpoints=True, at_most_once=True, fencing=True)
    with pytest.raises(WrongTypeError):
        handle.acquire()
    assert driver.raw.exists(handle.claim_key, f"{handle.claim_key}:fence") == 0
    driver.raw.delete(checkpoint_key(probe))
    assert isinstance(handle.acquire(), Claimed)


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_decoding_client_reads_its_checkpoint_as_str(make_driver: Callable[..., Driver], kind: str) -> None:
    """With decode_responses=True the next owner's checkpoint is a str."""
    driver = make_driver(kind, decode_responses=True)
    first = _owner(driver)
    first.checkpoint("étape=3")
    lapse_lease(driver.raw, first)
    outcome = driver.claim(first.key, checkpoints=True).acquire()
    assert isinstance(outcome, Claimed)
    assert outcome.checkpoint == "étape=3"


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_resp3_replies_read_the_same(make_driver: Callable[..., Driver], kind: str) -> None:
    """On RESP3 (Lua's false is a boolean there): the checkpointed win, its re-read and the interruption read the same."""  # noqa: E501
    driver = make_driver(kind, protocol=3)
    first = _owner(driver, at_most_once=True)
    first.checkpoint(b"step=3")
    again = first.acquire()  # its own claim, read back: five entries, the checkpoint last
    assert isinstance(again, Claimed)
    assert again.checkpoint == b"step=3"
    assert again.fence is None
    pass_deadline(driver.raw, first)
    with pytest.raises(InterruptedWorkError):
        driver.claim(first.key, checkpoints=True).acquire()
    assert first.release() is True
    outcome = driver.claim(first.key, checkpoints=True).acquire()
    assert isinstance(outcome, Claimed)
    assert outcome.checkpoint == b"step=3"
    assert outcome.fence is None


@pytest.mark.parametrize(
    ("options", "value", "error"),
    [
        ({}, b"step=1", InvalidArgumentError),  # a handle without checkpoints=True
        ({"checkpoints": True}, None, InvalidArgumentTypeError),
        ({"checkpoints": True}, 3, InvalidArgumentTypeError),
        ({"checkpoints": True}, b"x" * (CHECKPOINT_MAX_BYTES + 1), InvalidArgumentError),
        ({"checkpoints": True}, "\ud800", InvalidArgumentError),  # a lone surrogate: no encoding
    ],
    ids=["without-checkpoints", "none", "int", "too-big", "surrogate"],
)
@pytest.mark.parametrize("kind", ["sync", "async"])
def test_bad_checkpoints_are_refused_before_anything_is_sent(
    options: dict[str, Any], value: object, error: type[Exception], kind: str
) -> None:
    """Refused on a client that cannot connect: the error is the argument's, never a connection failure."""
    if kind == "sync":
        handle = Claim(redis.Redis(port=1, socket_connect_timeout=0.1), "evt", **options)
        with pytest.raises(error) as caught:
            handle.checkpoint(value)  # type: ignore[arg-type]
        assert caught.value.key == "evt"  # type: ignore[attr-defined]
        return

    async def main() -> None:
        client = redis.asyncio.Redis(port=1, socket_connect_timeout=0.1)
        try:
            with pytest.raises(error) as raised:
                await AsyncClaim(client, "evt", **options).checkpoint(value)  # type: ignore[arg-type]
            assert raised.value.key == "evt"  # type: ignore[attr-defined]
        finally:
            await client.aclose()

    asyncio.run(main())
