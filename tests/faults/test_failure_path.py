"""The failure path on every backend and both drivers: re-sent commands, late finishers, lost results, fencing.

redis-py re-sends a command whose reply was lost; each command must give the
same outcome the second time. The proxy-driven versions of these (a reply really
held back on the wire) live in ``test_real_faults.py``.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from redis.backoff import NoBackoff
from redis.retry import Retry

from goblin_claim import (
    AsyncClaim,
    Claim,
    Claimed,
    ClaimLostError,
    Completed,
    ConnectionFailedError,
    InFlight,
    ResultLostError,
    StillInFlightError,
    idempotent,
)
from tests.conftest import ALL_BACKENDS, Deco, Driver, SyncView, publish, record, stored, unique
from tests.support.servers import RedisProcess, start_server

# Also on redis-server with the reference module loaded (the SDK takes the native path).
BACKENDS = ALL_BACKENDS

# --------------------------------------------------------------------------- sent twice


def test_acquire_sent_twice_is_claimed_both_times(driver: Driver) -> None:
    """A second acquire() by the token that holds the claim answers Claimed, not InFlight."""
    key = unique()
    owner = driver.claim(key, lease=30)
    first = owner.acquire()
    assert isinstance(first, Claimed)
    assert owner.acquire() == first
    assert isinstance(driver.claim(key).acquire(), InFlight)
    assert 25 < driver.raw.ttl(owner.claim_key) <= 30


def test_acquire_sent_twice_by_a_from_keys_handle(driver: Driver) -> None:
    """The same holds for exact keys shared with raw users; another handle given the same token is InFlight."""
    keys = (f"c:{{{unique()}}}", f"r:{{{unique()}}}")
    keys = (keys[0], keys[0].replace("c:", "r:", 1))
    owner = driver.from_keys(*keys, token="worker-3")
    assert isinstance(owner.acquire(), Claimed)
    assert isinstance(owner.acquire(), Claimed)
    assert isinstance(driver.from_keys(*keys, token="worker-3").acquire(), InFlight)
    assert isinstance(driver.from_keys(*keys, token="worker-9").acquire(), InFlight)


def test_complete_sent_twice_is_a_success(driver: Driver) -> None:
    """complete() again with the same value after it stored succeeds and writes nothing new."""
    key = unique()
    owner = driver.claim(key, ttl=600)
    owner.acquire()
    owner.complete(b"charged:txn_551")
    owner.complete(b"charged:txn_551")
    assert driver.claim(key).acquire() == Completed(key=key, value=b"charged:txn_551")


def test_complete_with_another_value_keeps_the_first(driver: Driver) -> None:
    """complete() with a different value after completing raises ClaimLostError; the first value stays."""
    key = unique()
    owner = driver.claim(key)
    owner.acquire()
    owner.complete(b"first")
    with pytest.raises(ClaimLostError, match="another value"):
        owner.complete(b"second")
    assert stored(driver.raw, owner) == b"first"
    assert driver.raw.get(owner.claim_key) == record(owner.token, b"first")


def test_extend_sent_twice_is_a_success(driver: Driver) -> None:
    """extend() twice in a row renews twice; the claim stays this token's."""
    owner = driver.claim(unique(), lease=30)
    owner.acquire()
    owner.extend(60)
    owner.extend(60)
    assert 55 < driver.raw.ttl(owner.claim_key) <= 60


def test_release_sent_twice_reports_false_the_second_time(driver: Driver) -> None:
    """A re-sent release() finds nothing to delete: False, and the claim is free either way."""
    key = unique()
    owner = driver.claim(key)
    owner.acquire()
    assert owner.release() is True
    assert owner.release() is False
    assert isinstance(driver.claim(key).acquire(), Claimed)


# --------------------------------------------------------------------------- late finishers


def test_late_complete_with_nobody_claiming_since_is_stored(driver: Driver) -> None:
    """A fenced owner whose lease lapsed while nobody claimed the key still completes it: stored, and marked done.

    Without fencing nothing proves "nobody claimed since", and the late complete()
    is refused (tests/claim/test_late_complete.py).
    """
    key = unique()
    owner = driver.claim(key, lease=1, ttl=600, fencing=True)
    owner.acquire()
    time.sleep(1.1)
    assert driver.raw.exists(owner.claim_key) == 0
    owner.complete(b"late but uncontested")
    assert driver.claim(key).acquire() == Completed(key=key, value=b"late but uncontested")
    assert 590 < driver.raw.ttl(owner.claim_key) <= 600


def test_late_complete_after_a_takeover_writes_nothing(driver: Driver) -> None:
    """When another token took the claim over, the late owner's complete() raises and writes nothing."""
    key = unique()
    stale = driver.claim(key)
    stale.acquire()
    driver.raw.delete(stale.claim_key)  # the lease lapsed...
    fresh = driver.claim(key)
    assert isinstance(fresh.acquire(), Claimed)  # ...and someone took it
    with pytest.raises(ClaimLostError):
        stale.complete(b"stale")
    assert stored(driver.raw, stale) is None
    assert driver.raw.get(fresh.claim_key) == fresh.token.encode()
    fresh.complete(b"fresh")
    with pytest.raises(ClaimLostError):
        stale.complete(b"stale")
    assert stored(driver.raw, stale) == b"fresh"
    assert driver.raw.get(fresh.claim_key) == record(fresh.token, b"fresh")


def test_late_complete_never_overwrites_a_result_stored_by_others(driver: Driver) -> None:
    """Claim gone but a result stored (a raw writer finished it): the late owner's complete() raises.

    Two keys (``from_keys``): a raw writer's SET result_key while the claim key is empty.
    """
    tag = unique()
    stale = driver.from_keys(f"c:{{{tag}}}", f"r:{{{tag}}}")
    stale.acquire()
    driver.raw.delete(stale.claim_key)
    driver.raw.set(stale.result_key, b"theirs")
    with pytest.raises(ClaimLostError):
        stale.complete(b"mine")
    assert driver.raw.get(stale.result_key) == b"theirs"
    assert driver.raw.exists(stale.claim_key) == 0


@pytest.mark.parametrize("fencing", [False, True])
def test_late_complete_never_overwrites_a_record_stored_by_others(driver: Driver, fencing: bool) -> None:
    """The lease lapsed and another writer completed the one key: the late owner's complete() raises, record intact."""
    key = unique()
    stale = driver.claim(key, fencing=fencing)
    stale.acquire()
    driver.raw.delete(stale.claim_key)
    publish(driver.raw, stale, b"theirs")
    with pytest.raises(ClaimLostError):
        stale.complete(b"mine")
    assert driver.raw.get(stale.claim_key) == record("raw-writer", b"theirs")
    assert driver.claim(key).acquire() == Completed(key=key, value=b"theirs")


# --------------------------------------------------------------------------- lost results


def test_lost_result_is_an_error_not_in_flight(driver: Driver) -> None:
    """Claim marked done, result gone: acquire() and wait() raise ResultLostError at once.

    Two keys (``from_keys``): only there can the done marker outlive its result.
    """
    tag = unique()
    key = f"c:{{{tag}}}"
    owner = driver.from_keys(key, f"r:{{{tag}}}")
    owner.acquire()
    owner.complete(b"v")
    driver.raw.delete(owner.result_key)  # as allkeys-lru would
    duplicate = driver.from_keys(key, owner.result_key)
    with pytest.raises(ResultLostError) as info:
        duplicate.acquire()
    assert info.value.key == key
    started = time.monotonic()
    with pytest.raises(ResultLostError):
        duplicate.wait(timeout=5)
    assert time.monotonic() - started < 1
    assert driver.raw.exists(owner.claim_key) == 1  # nothing reopened by itself


def test_an_evicted_record_reopens_the_work(driver: Driver) -> None:
    """The one key's record evicted or deleted: the work is free again, the next caller claims it, no error."""
    key = unique()
    owner = driver.claim(key)
    owner.acquire()
    owner.complete(b"v")
    driver.raw.delete(owner.claim_key)  # as allkeys-lru would
    successor = driver.claim(key)
    assert successor.wait(timeout=5) == Claimed(key=key, token=successor.token, lease=successor.lease)
    assert driver.raw.get(owner.claim_key) == successor.token.encode()
    with pytest.raises(ClaimLostError):
        owner.complete(b"v")  # a re-send after the eviction finds another owner: nothing written
    successor.complete(b"again")
    assert driver.claim(key).acquire() == Completed(key=key, value=b"again")


@pytest.mark.parametrize("backend", ["fake-native", "native", "native-cluster"], indirect=True)
def test_work_completed_between_the_native_nil_and_its_read_is_completed_not_lost(driver: Driver) -> None:
    """GOBLIN.CLAIM answers nil (in flight); the owner completes before the read that follows it.

    That read sees the done marker and the result together: Completed, never ResultLostError.
    """
    key = unique()
    owner = driver.claim(key)
    owner.acquire()
    finisher = Claim(driver.raw, key, token=owner.token)  # the owner, on a sync client
    reads: list[str] = []

    class FinishedFirst(Claim):
        def _peek(self) -> object:
            reads.append(key)
            finisher.complete(b"v")
            return super()._peek()

    class AsyncFinishedFirst(AsyncClaim):
        async def _peek(self) -> object:
            reads.append(key)
            finisher.complete(b"v")
            return await super()._peek()

    if driver.run is None:
        duplicate: Any = FinishedFirst(driver.client, key)
    else:
        duplicate = SyncView(AsyncFinishedFirst(driver.client, key), driver.run)
    assert duplicate.acquire() == Completed(key=key, value=b"v")
    assert reads == [key]  # the native command answered nil, and the read followed


def test_forget_reopens_a_lost_result(driver: Driver) -> None:
    """forget() deletes claim and result whoever holds them; the next caller claims the work.

    Two keys (``from_keys``): a done marker whose result is gone.
    """
    tag = unique()
    keys = (f"c:{{{tag}}}", f"r:{{{tag}}}")
    owner = driver.from_keys(*keys)
    owner.acquire()
    owner.complete(b"v")
    driver.raw.delete(owner.result_key)
    operator = driver.from_keys(*keys)
    assert operator.forget() is True
    assert operator.forget() is False
    assert driver.raw.exists(owner.claim_key, owner.result_key) == 0
    assert isinstance(driver.from_keys(*keys).acquire(), Claimed)


def test_forget_reopens_a_completed_record(driver: Driver) -> None:
    """forget() deletes the one key's record whoever wrote it; the next caller claims the work."""
    key = unique()
    owner = driver.claim(key)
    owner.acquire()
    owner.complete(b"v")
    operator = driver.claim(key)
    assert operator.forget() is True
    assert operator.forget() is False
    assert driver.raw.exists(owner.claim_key) == 0
    assert isinstance(driver.claim(key).acquire(), Claimed)


def test_forget_an_in_flight_claim(driver: Driver) -> None:
    """forget() on another owner's live claim deletes it; that owner's complete() is refused and writes nothing.

    (With fencing, and nobody claiming since, it lands: tests/claim/test_late_complete.py.)
    """
    key = unique()
    owner = driver.claim(key)
    owner.acquire()
    assert driver.claim(key).forget() is True
    with pytest.raises(ClaimLostError):
        owner.complete(b"v")
    assert driver.raw.exists(owner.claim_key, owner.result_key) == 0
    assert isinstance(driver.claim(key).acquire(), Claimed)


def test_wait_still_times_out_on_real_in_flight_work(driver: Driver) -> None:
    """A live owner that never completes: wait() raises StillInFlightError, not ResultLostError."""
    key = unique()
    driver.claim(key).acquire()
    with pytest.raises(StillInFlightError):
        driver.claim(key).wait(timeout=0.1)


# --------------------------------------------------------------------------- fencing


def test_fences_increase_across_owners(driver: Driver) -> None:
    """With fencing, every new owner's fence is greater than the last; a re-send repeats its own."""
    key = unique()
    fences = []
    for _ in range(3):
        owner = driver.claim(key, fencing=True)
        outcome = owner.acquire()
        assert isinstance(outcome, Claimed)
        assert isinstance(outcome.fence, int)
        assert owner.acquire() == outcome  # re-sent: same fence
        fences.append(outcome.fence)
        owner.release()
    assert fences == sorted(set(fences))
    assert fences[1] == fences[0] + 1


def test_fence_counter_survives_forget_and_expires(driver: Driver) -> None:
    """forget() keeps the fence counter (fences never go back); the counter has a TTL like every key."""
    key = unique()
    first = driver.claim(key, fencing=True, ttl=600)
    fence = first.acquire().fence
    first.forget()
    assert driver.claim(key, fencing=True, ttl=600).acquire().fence == fence + 1
    fence_key = first.claim_key + ":fence"
    assert 590 < driver.raw.ttl(fence_key) <= 600


def test_a_fenced_complete_deletes_the_counter_and_later_fences_still_grow(driver: Driver) -> None:
    """complete() with fencing deletes the counter beside the record; after a forget the next fence is still larger."""
    key = unique()
    owner = driver.claim(key, fencing=True, ttl=600)
    first = owner.acquire()
    assert isinstance(first, Claimed)
    fence_key = owner.claim_key + ":fence"
    assert driver.raw.exists(fence_key) == 1
    owner.complete(b"v")
    assert driver.raw.exists(fence_key) == 0
    owner.complete(b"v")  # re-sent once the counter is gone: still a success
    assert driver.claim(key, fencing=True).acquire() == Completed(key=key, value=b"v")
    assert driver.raw.exists(fence_key) == 0  # a duplicate's read numbers nobody
    assert driver.claim(key).forget() is True
    later = driver.claim(key, fencing=True).acquire()
    assert isinstance(later, Claimed)
    assert later.fence > first.fence


def test_without_fencing_there_is_no_fence(driver: Driver) -> None:
    """Claimed.fence is None without fencing, and no counter key is written."""
    owner = driver.claim(unique())
    assert owner.acquire().fence is None
    assert driver.raw.exists(owner.claim_key + ":fence") == 0


# --------------------------------------------------------------------------- the decorator


def test_decorator_reruns_once_after_its_record_was_evicted(deco: Deco) -> None:
    """A completed key whose record was evicted is free again: the next call runs it once, without waiting."""
    calls: list[str] = []

    def charge(order_id: str) -> str:
        calls.append(order_id)
        return f"charged {order_id}"

    wrapped = deco(charge, key="order_id", wait=10)
    assert wrapped("o1") == "charged o1"
    assert wrapped("o1") == "charged o1"
    assert calls == ["o1"]
    assert deco.raw.delete(f"{deco.namespace}:{{o1}}") == 1  # as allkeys-lru would
    started = time.monotonic()
    assert wrapped("o1") == "charged o1"
    assert time.monotonic() - started < 1
    assert wrapped("o1") == "charged o1"
    assert calls == ["o1", "o1"]


def test_decorator_work_outliving_its_lease_raises_claim_lost_with_the_result(deco: Deco) -> None:
    """keep_alive=False, work longer than the lease: nothing proves nobody ran it meanwhile, so ClaimLostError.

    The error carries the computed result; nothing is stored, so the next call runs again.
    """
    calls: list[str] = []

    def slow(order_id: str) -> str:
        calls.append(order_id)
        time.sleep(1.2)
        return "slow result"

    wrapped = deco(slow, key="order_id", lease=1, keep_alive=False)
    with pytest.raises(ClaimLostError) as info:
        wrapped("o1")
    assert info.value.result == "slow result"
    assert deco.raw.exists(f"{deco.namespace}:{{o1}}") == 0
    assert calls == ["o1"]


def test_decorator_retries_the_final_write_after_a_dropped_connection(redis_standalone: RedisProcess) -> None:
    """A retry-less client whose connection is killed while the function runs still stores the result, once."""
    client = redis_standalone.client(retry=Retry(NoBackoff(), 0))
    killer = redis_standalone.client()
    calls: list[str] = []

    def charge(order_id: str) -> str:
        calls.append(order_id)
        # Cut every other connection, the decorator's own included: its next command fails.
        killer.execute_command("CLIENT KILL", "TYPE", "normal", "SKIPME", "yes")
        return f"charged {order_id}"

    wrapped = idempotent(client, key="order_id", namespace=unique("ns"), keep_alive=False)(charge)
    try:
        assert wrapped("o1") == "charged o1"
        assert wrapped("o1") == "charged o1"
        assert calls == ["o1"]
    finally:
        client.close()
        killer.close()


def test_decorator_error_after_the_lease_carries_the_result(redis_server_binary: str) -> None:
    """The server gone for good at the final write: after retrying for the lease, the error carries the result."""
    server = start_server(redis_server_binary)
    client = server.client(retry=Retry(NoBackoff(), 0), socket_connect_timeout=0.2)
    calls: list[str] = []

    def charge(order_id: str) -> str:
        calls.append(order_id)
        server.stop()
        return f"charged {order_id}"

    wrapped = idempotent(client, key="order_id", namespace=unique("ns"), lease=1, keep_alive=False)(charge)
    try:
        started = time.monotonic()
        with pytest.raises(ConnectionFailedError) as info:
            wrapped("o1")
        assert 0.9 < time.monotonic() - started < 5
        assert info.value.result == "charged o1"
        assert calls == ["o1"]
    finally:
        client.close()
        server.stop()


def test_wait_polls_through_a_dropped_connection(redis_standalone: RedisProcess) -> None:
    """A retry-less waiter whose connection is cut mid-wait keeps polling and gets the result."""
    waiter = redis_standalone.client(retry=Retry(NoBackoff(), 0))
    raw = redis_standalone.client()
    key = unique()
    owner = Claim(raw, key)
    owner.acquire()
    duplicate = Claim(waiter, key)
    assert isinstance(duplicate.acquire(), InFlight)  # the waiter's connection is open now

    def cut_then_complete() -> None:
        time.sleep(0.2)
        raw.execute_command("CLIENT KILL", "TYPE", "normal", "SKIPME", "yes")
        time.sleep(0.3)
        owner.complete(b"v")

    thread = threading.Thread(target=cut_then_complete)
    thread.start()
    try:
        assert duplicate.wait(timeout=10) == Completed(key=key, value=b"v")
    finally:
        thread.join()
        waiter.close()
        raw.close()


def test_wait_reports_the_connection_error_at_the_deadline(redis_server_binary: str) -> None:
    """A server gone for the whole wait: ConnectionFailedError at the deadline, not StillInFlightError."""
    server = start_server(redis_server_binary)
    client = server.client(retry=Retry(NoBackoff(), 0), socket_connect_timeout=0.2)
    try:
        claim = Claim(client, unique())
        claim.acquire()
        server.stop()
        started = time.monotonic()
        with pytest.raises(ConnectionFailedError):
            claim.wait(timeout=0.5)
        assert 0.4 < time.monotonic() - started < 3
    finally:
        client.close()
        server.stop()
