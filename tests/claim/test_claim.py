"""Claim / AsyncClaim semantics on every backend.

Covers complete, extend, release, wait, validation before I/O, error mapping, keys,
decoding and protocol versions.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest
import redis
import redis.asyncio
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff
from redis.crc import key_slot
from redis.retry import Retry

from goblin_claim import (
    AsyncClaim,
    Claim,
    Claimed,
    ClaimLostError,
    Completed,
    ConnectionFailedError,
    InFlight,
    InvalidArgumentError,
    InvalidArgumentTypeError,
    ServerError,
    StillInFlightError,
    WrongTypeError,
)
from tests.conftest import ALL_BACKENDS, Driver, publish, record, stored, unique
from tests.support.servers import HOST, free_port

# Also on redis-server with the reference module loaded (the SDK takes the native path).
BACKENDS = ALL_BACKENDS

NO_RETRY = Retry(NoBackoff(), 0)  # fail at once: the port is known to be closed
ASYNC_NO_RETRY = AsyncRetry(NoBackoff(), 0)


def keyspace(driver: Driver) -> list[bytes]:
    """Every key on the backend, sorted (to show that nothing was written)."""
    return sorted(driver.raw.keys("*"))


# --------------------------------------------------------------------------- complete


def test_complete_publishes_to_duplicates(driver: Driver) -> None:
    """After complete(), a duplicate handle gets Completed with the stored bytes."""
    key = unique()
    owner = driver.claim(key, ttl=600)
    assert isinstance(owner.acquire(), Claimed)
    owner.complete("charged:txn_551")
    assert driver.claim(key).acquire() == Completed(key=key, value=b"charged:txn_551")
    assert 590 < driver.raw.ttl(owner.result_key) <= 600


@pytest.mark.parametrize("value", [b"", b"two words", b"done other v", b"\x00\xff "], ids=repr)
def test_any_value_round_trips_through_the_one_key_record(driver: Driver, value: bytes) -> None:
    """The record ``done <token> <value>`` gives any value back: empty, with spaces, looking like a record, binary."""
    key = unique()
    owner = driver.claim(key)
    assert isinstance(owner.acquire(), Claimed)
    owner.complete(value)
    assert driver.raw.get(owner.claim_key) == record(owner.token, value)
    assert driver.claim(key).acquire() == Completed(key=key, value=value)
    owner.complete(value)  # re-sent: still a success, the record unchanged
    assert driver.raw.get(owner.claim_key) == record(owner.token, value)


def test_complete_keeps_the_claim_for_ttl(driver: Driver) -> None:
    """complete() keeps claim_key alive for ttl, so the work stays completed after the lease lapses."""
    key = unique()
    owner = driver.claim(key, lease=1, ttl=600)
    assert isinstance(owner.acquire(), Claimed)
    owner.complete(b"done")
    assert 590 < driver.raw.ttl(owner.claim_key) <= 600
    time.sleep(1.1)
    assert driver.claim(key, lease=1).acquire() == Completed(key=key, value=b"done")


def test_after_complete_release_and_extend_reopen_nothing(driver: Driver) -> None:
    """Once completed, release() is False, extend() and a second complete() raise, the result stays."""
    key = unique()
    owner = driver.claim(key)
    owner.acquire()
    owner.complete(b"v1")
    assert owner.release() is False
    with pytest.raises(ClaimLostError) as info:
        owner.extend()
    assert info.value.key == key
    with pytest.raises(ClaimLostError):
        owner.complete(b"v2")
    assert driver.claim(key).acquire() == Completed(key=key, value=b"v1")


def test_stale_owner_cannot_overwrite_the_new_owner(driver: Driver) -> None:
    """An owner whose lease lapsed and was taken over gets ClaimLostError; the new owner's state is intact."""
    key = unique()
    stale = driver.claim(key, lease=1)
    assert isinstance(stale.acquire(), Claimed)
    time.sleep(1.1)
    fresh = driver.claim(key, lease=30)
    assert isinstance(fresh.acquire(), Claimed)
    with pytest.raises(ClaimLostError):
        stale.complete(b"stale")
    assert stale.release() is False
    assert driver.raw.get(fresh.claim_key) == fresh.token.encode()
    assert stored(driver.raw, fresh) is None
    fresh.complete(b"fresh")
    assert driver.claim(key).acquire() == Completed(key=key, value=b"fresh")


@pytest.mark.parametrize(
    ("value", "error"),
    [(b"CLAIMED", InvalidArgumentError), ("CLAIMED", InvalidArgumentError), (42, InvalidArgumentTypeError),
     (None, InvalidArgumentTypeError), (bytearray(b"x"), InvalidArgumentTypeError)],
)  # fmt: skip
def test_complete_refuses_bad_values_before_io(driver: Driver, value: Any, error: type[Exception]) -> None:
    """complete() refuses CLAIMED and non-bytes/str values with a typed error; the claim stays held."""
    key = unique()
    owner = driver.claim(key)
    owner.acquire()
    with pytest.raises(error):
        owner.complete(value)
    assert stored(driver.raw, owner) is None
    assert driver.raw.get(owner.claim_key) == owner.token.encode()


def test_complete_into_a_non_string_result_writes_nothing(driver: Driver) -> None:
    """result_key holding a hash: complete() raises WrongTypeError before writing; hash and claim unchanged.

    Two keys (``from_keys``): the default layout's one key cannot hold a hash while it is claimed.
    """
    tag = unique()
    key = f"claim:{{{tag}}}"
    owner = driver.from_keys(key, f"result:{{{tag}}}")
    assert isinstance(owner.acquire(), Claimed)
    driver.raw.hset(owner.result_key, "f", "v")
    with pytest.raises(WrongTypeError) as info:
        owner.complete(b"x")
    assert info.value.key == key
    assert driver.raw.hgetall(owner.result_key) == {b"f": b"v"}
    assert driver.raw.get(owner.claim_key) == owner.token.encode()


def test_owner_checks_on_a_non_string_claim_key(driver: Driver) -> None:
    """claim_key holding a set: complete, extend and release raise WrongTypeError; the set is unchanged."""
    key = unique()
    handle = driver.claim(key)
    driver.raw.sadd(handle.claim_key, "m")
    for action in (lambda: handle.complete(b"x"), handle.extend, handle.release):
        with pytest.raises(WrongTypeError):
            action()
    assert driver.raw.smembers(handle.claim_key) == {b"m"}


# --------------------------------------------------------------------------- extend / release


def test_extend_renews_the_lease(driver: Driver) -> None:
    """extend() sets the claim's TTL to the new lease; extend(lease=0) is refused before I/O."""
    key = unique()
    owner = driver.claim(key, lease=5)
    owner.acquire()
    owner.extend(lease=100)
    assert 95 < driver.raw.ttl(owner.claim_key) <= 100
    owner.extend()
    assert driver.raw.ttl(owner.claim_key) <= 5
    with pytest.raises(InvalidArgumentError):
        owner.extend(lease=0)
    assert driver.raw.ttl(owner.claim_key) > 0


def test_extend_after_the_lease_lapsed_raises(driver: Driver) -> None:
    """extend() on a lapsed claim raises ClaimLostError and creates nothing."""
    key = unique()
    owner = driver.claim(key, lease=1)
    owner.acquire()
    driver.raw.delete(owner.claim_key)  # as if the lease had lapsed
    with pytest.raises(ClaimLostError):
        owner.extend()
    assert driver.raw.exists(owner.claim_key) == 0


def test_release_is_owner_checked(driver: Driver) -> None:
    """Another token's release() is False and keeps the claim; the owner's is True and reopens the work."""
    key = unique()
    owner = driver.claim(key)
    owner.acquire()
    assert driver.claim(key).release() is False
    assert driver.raw.get(owner.claim_key) == owner.token.encode()
    assert owner.release() is True
    assert owner.release() is False
    assert isinstance(driver.claim(key).acquire(), Claimed)


# --------------------------------------------------------------------------- wait


def test_wait_returns_the_result_once_published(driver: Driver) -> None:
    """A waiter polls until the owner completes, then gets Completed."""
    key = unique()
    owner = driver.claim(key)
    owner.acquire()

    def finish() -> None:
        time.sleep(0.3)
        publish(driver.raw, owner, "late")

    thread = threading.Thread(target=finish)
    thread.start()
    try:
        assert driver.claim(key).wait(timeout=10) == Completed(key=key, value=b"late")
    finally:
        thread.join()


def test_wait_takes_over_a_lapsed_lease(driver: Driver) -> None:
    """When the owner's lease lapses during the wait, the waiter gets Claimed with its own token."""
    key = unique()
    driver.claim(key, lease=1).acquire()
    waiter = driver.claim(key, lease=30)
    outcome = waiter.wait(timeout=10)
    assert outcome == Claimed(key=key, token=waiter.token, lease=30)


def test_wait_zero_makes_one_attempt(driver: Driver) -> None:
    """wait(timeout=0) on in-flight work raises StillInFlightError at once; on completed work it returns."""
    key = unique()
    owner = driver.claim(key)
    owner.acquire()
    started = time.monotonic()
    with pytest.raises(StillInFlightError) as info:
        driver.claim(key).wait(timeout=0)
    assert time.monotonic() - started < 1
    assert info.value.key == key
    owner.complete(b"v")
    assert driver.claim(key).wait(timeout=0) == Completed(key=key, value=b"v")


def test_wait_gives_up_at_the_deadline(driver: Driver) -> None:
    """wait(timeout=0.5) on work that never finishes raises after about half a second."""
    key = unique()
    driver.claim(key).acquire()
    started = time.monotonic()
    with pytest.raises(StillInFlightError):
        driver.claim(key).wait(timeout=0.5)
    assert 0.45 < time.monotonic() - started < 3


@pytest.mark.parametrize(("timeout", "error"), [(-1, ValueError), ("1", TypeError), (True, TypeError)])
def test_wait_refuses_bad_timeouts(driver: Driver, timeout: Any, error: type[Exception]) -> None:
    """A negative or non-numeric timeout is refused before any I/O."""
    handle = driver.claim(unique())
    with pytest.raises(error):
        handle.wait(timeout=timeout)
    assert driver.raw.exists(handle.claim_key) == 0


# --------------------------------------------------------------------------- validation


BAD_SECONDS = [0, -1, 1.5, True, "30", None, 2**31]


@pytest.mark.parametrize("field", ["lease", "ttl"])
@pytest.mark.parametrize("value", BAD_SECONDS, ids=repr)
def test_bad_lease_or_ttl_refused_before_io(driver: Driver, field: str, value: Any) -> None:
    """lease/ttl of 0, -1, 1.5, True, "30", None or too large raise ValueError/TypeError; nothing is written."""
    before = keyspace(driver)
    with pytest.raises((ValueError, TypeError)) as info:
        driver.claim(unique(), **{field: value})
    assert field in str(info.value)
    assert set(keyspace(driver)) <= set(before)  # nothing new (other tests' keys may expire meanwhile)


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [({"key": ""}, ValueError), ({"key": b"k"}, TypeError), ({"key": 7}, TypeError), ({"key": "\ud800"}, ValueError),
     ({"namespace": "a{b"}, ValueError), ({"namespace": "a}b"}, ValueError), ({"namespace": ""}, ValueError),
     ({"token": ""}, ValueError), ({"token": "two words"}, ValueError), ({"token": "tab\t"}, ValueError),
     ({"token": 5}, TypeError), ({"native": "sometimes"}, ValueError)],
)  # fmt: skip
def test_bad_arguments_refused_before_io(driver: Driver, kwargs: dict[str, Any], error: type[Exception]) -> None:
    """Bad keys, namespaces, tokens and native modes raise ValueError/TypeError; nothing is written."""
    before = keyspace(driver)
    arguments: dict[str, Any] = {"key": unique(), **kwargs}
    with pytest.raises(error):
        driver.claim(arguments.pop("key"), **arguments)
    assert set(keyspace(driver)) <= set(before)  # nothing new (other tests' keys may expire meanwhile)


@pytest.mark.parametrize(("claim_key", "result_key"), [("", "r"), ("c", ""), ("same", "same"), (b"c", "r")])
def test_from_keys_refuses_bad_keys(driver: Driver, claim_key: Any, result_key: Any) -> None:
    """from_keys refuses empty, equal or non-str keys."""
    with pytest.raises((ValueError, TypeError)):
        driver.from_keys(claim_key, result_key)


# --------------------------------------------------------------------------- keys

ODD_KEYS = ["{", "}", "{}", "}{", "a{b}c", "{x}", "%7B", "%", "ключ-🔑", "x" * 300, " ", "a:b:c"]


@pytest.mark.parametrize("key", ODD_KEYS, ids=range(len(ODD_KEYS)))
def test_odd_keys_work_end_to_end(driver: Driver, key: str) -> None:
    """Braces, percent signs, unicode and 300 characters: one slot, the namespace prefix, a full claim cycle."""
    handle = driver.claim(key, namespace="shop")
    assert handle.claim_key.startswith("shop:")
    assert handle.result_key.startswith("shop:")
    assert key_slot(handle.claim_key.encode()) == key_slot(handle.result_key.encode())
    driver.raw.delete(handle.claim_key, handle.result_key)
    assert isinstance(handle.acquire(), Claimed)
    handle.complete(b"ok")
    assert driver.claim(key, namespace="shop").acquire() == Completed(key=key, value=b"ok")


def test_from_keys_interoperates_with_raw_writers(driver: Driver) -> None:
    """A raw user publishing with SET result_key is read back by an SDK handle on the same keys."""
    tag = unique()
    claim_key, result_key = f"claim:{{{tag}}}", f"result:{{{tag}}}"
    owner = driver.from_keys(claim_key, result_key, token="worker-3")
    assert isinstance(owner.acquire(), Claimed)
    driver.raw.set(result_key, "raw-answer")
    assert driver.from_keys(claim_key, result_key).acquire() == Completed(key=claim_key, value=b"raw-answer")


@pytest.mark.parametrize("backend", ["cluster", "native-cluster"], indirect=True)
def test_cross_slot_keys_on_a_cluster_are_a_clear_error(driver: Driver) -> None:
    """On a cluster, from_keys with keys in different slots fails with ServerError, writing nothing."""
    handle = driver.from_keys(f"claim:{unique()}", f"result:{unique()}")
    with pytest.raises(ServerError):
        handle.acquire()
    assert driver.raw.exists(handle.claim_key) == 0


# --------------------------------------------------------------------------- replies


@pytest.mark.parametrize("kind", ["sync", "async"])
@pytest.mark.parametrize("protocol", [2, 3])
@pytest.mark.parametrize("decode", [False, True])
def test_values_follow_decode_responses_on_resp2_and_resp3(
    make_driver: Any, kind: str, protocol: int, decode: bool
) -> None:
    """Completed.value is str with decode_responses, else bytes; RESP2 and RESP3 give the same outcomes."""
    driver = make_driver(kind, protocol=protocol, decode_responses=decode)
    key = unique()
    owner = driver.claim(key)
    assert owner.acquire() == Claimed(key=key, token=owner.token, lease=owner.lease)
    assert driver.claim(key).acquire() == InFlight(key=key)
    owner.complete("héllo")
    expected = "héllo" if decode else "héllo".encode()
    outcome = driver.claim(key).acquire()
    assert outcome == Completed(key=key, value=expected)
    assert type(outcome.value) is type(expected)
    assert owner.release() is False


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_connection_failure_maps_to_its_own_error(kind: str) -> None:
    """An unreachable server raises ConnectionFailedError with the key and the redis error as cause."""
    port = free_port()  # nothing listens there
    if kind == "sync":
        with pytest.raises(ConnectionFailedError) as info:
            Claim(redis.Redis(host=HOST, port=port, retry=NO_RETRY), "evt88").acquire()
    else:

        async def attempt() -> None:
            client = redis.asyncio.Redis(host=HOST, port=port, retry=ASYNC_NO_RETRY)
            try:
                await AsyncClaim(client, "evt88").acquire()
            finally:
                await client.aclose()

        with pytest.raises(ConnectionFailedError) as info:
            asyncio.run(attempt())
    assert info.value.key == "evt88"
    assert isinstance(info.value.__cause__, redis.ConnectionError)
