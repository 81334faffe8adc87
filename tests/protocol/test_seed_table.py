"""The seed's four examples and every row of its "Return value" table.

On every backend (scripts and native, fake and real) and through both drivers.
"""

from __future__ import annotations

import time

import pytest
import redis

from goblin_claim import Claimed, Completed, InFlight, InvalidArgumentError, WrongTypeError
from goblin_claim._protocol.scripts import CLAIM
from goblin_claim.testing import fake_redis
from tests.conftest import ALL_BACKENDS, Driver

# Also on redis-server with the reference module loaded (the SDK takes the native path).
BACKENDS = ALL_BACKENDS


@pytest.fixture
def seed_keys(driver: Driver) -> tuple[str, str]:
    """The seed's own key names (hash-tagged on a cluster, which needs one slot), cleared first."""
    keys = ("claim:{evt88}", "result:{evt88}") if driver.backend.is_cluster else ("claim:evt88", "result:evt88")
    driver.raw.delete(*keys)
    return keys


def test_seed_first_caller_claims(driver: Driver, seed_keys: tuple[str, str]) -> None:
    """GOBLIN.CLAIM claim:evt88 result:evt88 worker-3 30 -> CLAIMED, and the claim holds the token."""
    outcome = driver.from_keys(*seed_keys, token="worker-3", lease=30).acquire()
    assert outcome == Claimed(key=seed_keys[0], token="worker-3", lease=30)
    assert driver.raw.get(seed_keys[0]) == b"worker-3"
    assert 0 < driver.raw.ttl(seed_keys[0]) <= 30


def test_seed_duplicate_gets_stored_answer(driver: Driver, seed_keys: tuple[str, str]) -> None:
    """After SET result:evt88 charged:txn_551, a duplicate gets that value and does not re-claim."""
    assert isinstance(driver.from_keys(*seed_keys, token="worker-3").acquire(), Claimed)
    driver.raw.set(seed_keys[1], "charged:txn_551", ex=86400)
    outcome = driver.from_keys(*seed_keys, token="worker-9").acquire()
    assert outcome == Completed(key=seed_keys[0], value=b"charged:txn_551")
    assert driver.raw.get(seed_keys[0]) == b"worker-3"


def test_seed_racing_duplicate_sees_in_flight(driver: Driver, seed_keys: tuple[str, str]) -> None:
    """A duplicate arriving while worker-3 still works gets nil: InFlight."""
    assert isinstance(driver.from_keys(*seed_keys, token="worker-3").acquire(), Claimed)
    assert driver.from_keys(*seed_keys, token="worker-9").acquire() == InFlight(key=seed_keys[0])
    assert driver.raw.get(seed_keys[0]) == b"worker-3"


def test_seed_crashed_owner_is_retaken_after_lease(driver: Driver, seed_keys: tuple[str, str]) -> None:
    """worker-3 never publishes; once its lease lapses worker-9 gets CLAIMED and retries the work."""
    assert isinstance(driver.from_keys(*seed_keys, token="worker-3", lease=1).acquire(), Claimed)
    assert isinstance(driver.from_keys(*seed_keys, token="worker-9", lease=1).acquire(), InFlight)
    time.sleep(1.1)
    outcome = driver.from_keys(*seed_keys, token="worker-9", lease=30).acquire()
    assert outcome == Claimed(key=seed_keys[0], token="worker-9", lease=30)
    assert driver.raw.get(seed_keys[0]) == b"worker-9"


def test_table_claim_held_result_not_a_string(driver: Driver, seed_keys: tuple[str, str]) -> None:
    """Claim held and result_key a hash: WRONGTYPE, as WrongTypeError carrying the key and the redis error."""
    driver.raw.set(seed_keys[0], "worker-3", ex=30)
    driver.raw.hset(seed_keys[1], "field", "value")
    with pytest.raises(WrongTypeError) as info:
        driver.from_keys(*seed_keys, token="worker-9").acquire()
    assert info.value.key == seed_keys[0]
    assert isinstance(info.value.__cause__, redis.ResponseError)
    assert driver.raw.hgetall(seed_keys[1]) == {b"field": b"value"}
    assert driver.raw.get(seed_keys[0]) == b"worker-3"


def test_table_claim_key_of_another_type_just_fails_the_claim(driver: Driver, seed_keys: tuple[str, str]) -> None:
    """NX only tests existence: a claim_key holding a list is 'held', so the reply is GET result_key."""
    driver.raw.rpush(seed_keys[0], "x")
    assert driver.from_keys(*seed_keys).acquire() == InFlight(key=seed_keys[0])
    driver.raw.set(seed_keys[1], "done")
    assert driver.from_keys(*seed_keys).acquire() == Completed(key=seed_keys[0], value=b"done")
    assert driver.raw.lrange(seed_keys[0], 0, -1) == [b"x"]


@pytest.mark.parametrize("seconds", [0, -1, 1.5, True, "30", None])
def test_table_bad_seconds_refused_before_io(driver: Driver, seed_keys: tuple[str, str], seconds: object) -> None:
    """A lease that is not a positive int is refused by the SDK before anything reaches Redis."""
    with pytest.raises((ValueError, TypeError)):
        driver.from_keys(*seed_keys, lease=seconds)
    assert driver.raw.exists(*seed_keys) == 0


# The protocol itself, below the SDK: the native command and the script give the
# same replies and the same kind of error for every row of the seed's table. Where
# GOBLIN.CLAIM answers nil, the script also says what claim_key holds and its
# lease left (PTTL), so the SDK tells "in flight" and "result lost" apart in the
# same round trip; after a native nil the SDK reads the holder once (same
# outcomes). A holder equal to the caller's own token is reported like any
# other: only the client knows whether it re-sent its own claim or another
# handle was given the same token. The rows' claims have no expiry: PTTL -1.

ROWS = {
    # row: (setup, native reply, script reply)
    "free": ((), b"CLAIMED", b"CLAIMED"),
    "held, value": (
        (("set", "c", "worker-3"), ("set", "r", "charged:txn_551")),
        b"charged:txn_551",
        b"charged:txn_551",
    ),
    "held, absent": ((("set", "c", "worker-3"),), None, [b"worker-3", -1]),
    "held by me, absent": ((("set", "c", "worker-9"),), None, [b"worker-9", -1]),
    "done, result lost": ((("set", "c", "done worker-3"),), None, [b"done worker-3", -1]),
    "held as a list, absent": ((("rpush", "c", "x"),), None, []),
}


def _raw_native(client: redis.Redis, seconds: object) -> object:
    return client.execute_command("GOBLIN.CLAIM", "c", "r", "worker-9", seconds)


def _raw_script(client: redis.Redis, seconds: object) -> object:
    return client.eval(CLAIM.source, 2, "c", "r", "worker-9", seconds)


@pytest.mark.parametrize("path", [_raw_native, _raw_script], ids=["native", "script"])
@pytest.mark.parametrize("row", list(ROWS), ids=list(ROWS))
def test_raw_protocol_rows_on_both_paths(path: object, row: str) -> None:
    """Each row gives the seed's reply from GOBLIN.CLAIM, and the script the same or the holder where that is nil."""
    client = fake_redis(native=True)
    setup, native, script = ROWS[row]
    for command, *args in setup:
        client.execute_command(command, *args)
    assert path(client, 30) == (native if path is _raw_native else script)  # type: ignore[operator]


@pytest.mark.parametrize("path", [_raw_native, _raw_script], ids=["native", "script"])
@pytest.mark.parametrize("held", [False, True], ids=["free", "held"])
@pytest.mark.parametrize(
    ("seconds", "fragment"),
    [(0, "invalid expire time"), (-1, "invalid expire time"), ("1.5", "not an integer"), ("x", "not an integer")],
)
def test_raw_protocol_bad_seconds_error_on_both_paths(path: object, held: bool, seconds: object, fragment: str) -> None:
    """A bad seconds is an error on both paths, even when the claim is held, and writes nothing."""
    client = fake_redis(native=True)
    if held:
        client.set("c", "worker-3")
    with pytest.raises(redis.ResponseError, match=fragment):
        path(client, seconds)  # type: ignore[operator]
    assert client.get("c") == (b"worker-3" if held else None)


@pytest.mark.parametrize("path", [_raw_native, _raw_script], ids=["native", "script"])
def test_raw_protocol_wrongtype_on_both_paths(path: object) -> None:
    """Claim held and result_key a hash: WRONGTYPE from both paths."""
    client = fake_redis(native=True)
    client.set("c", "worker-3")
    client.hset("r", "f", "v")
    with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
        path(client, 30)  # type: ignore[operator]


def test_raw_script_on_real_redis_bad_seconds(redis_standalone: object) -> None:
    """On real Redis 7 the script's bad-seconds error names SET's expire check (matched by substring)."""
    client = redis_standalone.client()  # type: ignore[attr-defined]
    try:
        client.set("held:{c}", "worker-3")
        with pytest.raises(redis.ResponseError, match="invalid expire time"):
            client.eval(CLAIM.source, 2, "held:{c}", "held:{r}", "worker-9", 0)
    finally:
        client.delete("held:{c}")
        client.close()


def test_bad_lease_is_a_value_error(driver: Driver) -> None:
    """Lease 0 raises InvalidArgumentError, which is a ValueError."""
    with pytest.raises(InvalidArgumentError):
        driver.claim("k", lease=0)
