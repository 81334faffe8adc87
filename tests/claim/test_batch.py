"""Claim.acquire_many / AsyncClaim.acquire_many on every backend and both drivers."""

from __future__ import annotations

from typing import Any

import fakeredis
import pytest

import goblin_claim._drivers.aio
import goblin_claim._drivers.sync
from goblin_claim import AsyncClaim, Claim, Claimed, Completed, InFlight, InvalidArgumentError, WrongTypeError
from goblin_claim._clients.transport import state_of
from goblin_claim._protocol.scripts import PEEK
from goblin_claim.testing import fake_redis
from tests.conftest import Driver, SyncView, unique


def acquire_many(driver: Driver, keys: list[str], **options: Any) -> list[tuple[Any, Any]]:
    """The driver's acquire_many, called from sync test code."""
    if driver.run is None:
        return Claim.acquire_many(driver.client, keys, **options)
    pairs = driver.run(AsyncClaim.acquire_many(driver.client, keys, **options))
    return [(SyncView(handle, driver.run), outcome) for handle, outcome in pairs]


def test_batch_gives_the_outcomes_of_one_by_one(driver: Driver) -> None:
    """Free, completed, in flight, evicted and wrong-type keys: the same outcomes as acquire() one by one, in order.

    An evicted record (the one key deleted after completion) is free work again: Claimed.
    """
    namespace = unique("ns")
    free, done, busy, lost, odd = (unique(name) for name in ("free", "done", "busy", "evicted", "odd"))
    owner = driver.claim(done, namespace=namespace)
    owner.acquire()
    owner.complete(b"receipt")
    driver.claim(busy, namespace=namespace).acquire()
    gone = driver.claim(lost, namespace=namespace)
    gone.acquire()
    gone.complete(b"v")
    driver.raw.delete(gone.claim_key)  # as allkeys-lru would
    other = driver.claim(odd, namespace=namespace)
    other.acquire()
    driver.raw.delete(other.claim_key)
    driver.raw.hset(other.claim_key, "f", "v")

    pairs = acquire_many(driver, [free, done, busy, lost, odd], namespace=namespace, lease=30)
    assert [handle.key for handle, _ in pairs] == [free, done, busy, lost, odd]
    outcomes = [outcome for _, outcome in pairs]
    assert isinstance(outcomes[0], Claimed)
    assert outcomes[0].token == pairs[0][0].token
    assert outcomes[1] == Completed(key=done, value=b"receipt")
    assert outcomes[2] == InFlight(key=busy)
    assert isinstance(outcomes[3], Claimed)
    assert outcomes[3].token == pairs[3][0].token
    assert isinstance(outcomes[4], WrongTypeError)
    assert outcomes[4].key == odd
    assert driver.raw.get(pairs[0][0].claim_key) == pairs[0][0].token.encode()
    assert driver.raw.get(pairs[3][0].claim_key) == pairs[3][0].token.encode()
    assert driver.raw.hgetall(other.claim_key) == {b"f": b"v"}
    pairs[0][0].complete(b"mine")
    assert driver.claim(free, namespace=namespace).acquire() == Completed(key=free, value=b"mine")


@pytest.mark.parametrize("backend", ["fake-native", "native", "native-cluster", "standalone"], indirect=True)
def test_batch_sees_work_completed_between_the_native_nil_and_its_read(
    driver: Driver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SET ... NX GET answers the holder's token for a key whose owner completes before the batch's reads: Completed.

    The read is GET, PTTL and PEXPIRETIME of the record, in one round trip (for GOBLIN.CLAIM's nil,
    on a server without SET ... NX GET: peek.lua, below).
    """
    namespace = unique("ns")
    busy, free = unique("busy"), unique("free")
    owner = driver.claim(busy, namespace=namespace)
    owner.acquire()
    finisher = Claim(driver.raw, busy, namespace=namespace, token=owner.token)  # the owner, on a sync client
    reads: list[int] = []

    def finish_before_the_reads(commands: Any) -> None:
        if any(command[0] == "GET" for command in commands):
            reads.append(len(commands))
            finisher.complete(b"v")

    if driver.run is None:
        send = goblin_claim._drivers.sync._pipelined

        def pipelined(client: Any, commands: Any, pipe: Any = None, sends: Any = None) -> list[object]:
            finish_before_the_reads(commands)
            return send(client, commands, pipe, sends)

        monkeypatch.setattr(goblin_claim._drivers.sync, "_pipelined", pipelined)
    else:
        send_async = goblin_claim._drivers.aio._pipelined

        async def async_pipelined(client: Any, commands: Any, pipe: Any = None, sends: Any = None) -> list[object]:
            finish_before_the_reads(commands)
            return await send_async(client, commands, pipe, sends)

        monkeypatch.setattr(goblin_claim._drivers.aio, "_pipelined", async_pipelined)

    outcomes = [outcome for _, outcome in acquire_many(driver, [free, busy], namespace=namespace)]
    assert isinstance(outcomes[0], Claimed)
    assert outcomes[1] == Completed(key=busy, value=b"v")
    assert reads == [3]  # one read (three commands), of the key the claim answered the holder for


def test_batch_reads_goblin_claims_nil_with_peek_lua(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the module but no SET ... NX GET (Redis 6.2), GOBLIN.CLAIM's nil is read by peek.lua: Completed."""
    client = fake_redis(native=True, server=fakeredis.FakeServer(version=(6, 2)))
    namespace = unique("ns")
    busy, free = unique("busy"), unique("free")
    owner = Claim(client, busy, namespace=namespace)
    owner.acquire()
    reads: list[int] = []
    send = goblin_claim._drivers.sync._pipelined

    def pipelined(client: Any, commands: Any, pipe: Any = None, sends: Any = None) -> list[object]:
        if any(PEEK.source in command for command in commands):
            reads.append(len(commands))
            owner.complete(b"v")
        return send(client, commands, pipe, sends)

    monkeypatch.setattr(goblin_claim._drivers.sync, "_pipelined", pipelined)
    outcomes = [outcome for _, outcome in Claim.acquire_many(client, [free, busy], namespace=namespace)]
    assert isinstance(outcomes[0], Claimed)
    assert outcomes[1] == Completed(key=busy, value=b"v")
    assert reads == [1]  # one read, of the key the native command answered nil for
    assert "SET NX GET" not in (state_of(client).native or ())


def test_batch_of_a_hundred_fresh_keys(driver: Driver) -> None:
    """A hundred fresh keys are all claimed, each by its own handle; a second batch finds them in flight."""
    namespace = unique("ns")
    keys = [f"m-{n}" for n in range(100)]
    first = acquire_many(driver, keys, namespace=namespace)
    assert all(isinstance(outcome, Claimed) for _, outcome in first)
    assert len({handle.token for handle, _ in first}) == 100
    second = acquire_many(driver, keys, namespace=namespace)
    assert all(outcome == InFlight(key=key) for key, (_, outcome) in zip(keys, second, strict=True))


def test_batch_handles_share_the_options(driver: Driver) -> None:
    """Every handle of a batch gets the options, fencing included: fences increase with each new owner."""
    namespace = unique("ns")
    key = unique()
    [(handle, outcome)] = acquire_many(driver, [key], namespace=namespace, lease=7, ttl=70, fencing=True)
    assert (handle.lease, handle.ttl, handle.claim_key.startswith(namespace)) == (7, 70, True)
    assert isinstance(outcome, Claimed)
    assert outcome.fence is not None
    handle.release()
    [(_, again)] = acquire_many(driver, [key], namespace=namespace, fencing=True)
    assert isinstance(again, Claimed)
    assert again.fence == outcome.fence + 1


def test_a_fenced_batch_over_records(driver: Driver) -> None:
    """Fenced batch: a completed key is Completed and numbers nobody; a forgotten one is claimed with a larger fence."""
    namespace = unique("ns")
    done, again = unique("done"), unique("again")
    [(first, _), (second, claimed)] = acquire_many(driver, [done, again], namespace=namespace, fencing=True)
    assert isinstance(claimed, Claimed)
    first.complete(b"v1")
    second.complete(b"v2")
    assert driver.claim(again, namespace=namespace).forget() is True
    [(_, completed), (_, retaken)] = acquire_many(driver, [done, again], namespace=namespace, fencing=True)
    assert completed == Completed(key=done, value=b"v1")
    assert isinstance(retaken, Claimed)
    assert retaken.fence > claimed.fence
    assert driver.raw.exists(first.claim_key + ":fence") == 0


def test_empty_batch_sends_nothing(driver: Driver) -> None:
    """No keys: an empty list."""
    assert acquire_many(driver, []) == []


@pytest.mark.parametrize("options", [{"lease": 0}, {"namespace": "a{b"}, {"bogus": 1}])
def test_bad_batch_options_are_refused_before_io(driver: Driver, options: dict[str, Any]) -> None:
    """Bad options fail before anything is written."""
    key = unique()
    with pytest.raises(TypeError if "bogus" in options else InvalidArgumentError):
        acquire_many(driver, [key], **options)
    assert driver.raw.exists(f"goblin:{{{key}}}") == 0


def test_batch_recovers_a_flushed_script_cache(driver: Driver) -> None:
    """After SCRIPT FLUSH the batch still claims every key (one more pipelined round trip)."""
    acquire_many(driver, [unique()])  # loaded
    driver.raw.script_flush()  # every primary, on a cluster
    keys = [unique() for _ in range(10)]
    assert all(isinstance(outcome, Claimed) for _, outcome in acquire_many(driver, keys))
