"""``at_most_once=True``: an attempt that ends without a result is never run again, on every implementation.

Both drivers, on fakeredis (scripts, and the native plug-in), a stock redis-server, the
redis-server with the reference module, a cluster, Valkey 9 and Redis 8.2. Where the
server has native commands or built-in owner checks (``GOBLIN.CLAIM``, ``GOBLIN.CAD``,
``SET ... IFEQ``, ``DELIFEQ``) an at-most-once handle still runs the scripts, the
documented fallback: the commands cannot read the record. A deadline passes by
rewriting it into the past (``tests/support/units.py``), so nothing here sleeps out a
lease except the keep-alive's test.
"""

from __future__ import annotations

import datetime
import time
from typing import Any

import pytest
import redis

from goblin_claim import (
    Claim,
    Claimed,
    ClaimLostError,
    Completed,
    InFlight,
    InterruptedWorkError,
    InvalidArgumentTypeError,
    StillInFlightError,
)
from goblin_claim.testing import fake_redis
from tests.conftest import Driver, record, stored, unique, until
from tests.protocol.test_valkey_owner_checks import _commandstats, _keep_alive, _reset_stats
from tests.support.units import checkpoint_key, held, pass_deadline

BACKENDS = ("fake", "fake-native", "standalone", "native", "cluster", "valkey", "redis8")


def _owner(driver: Driver, key: str | None = None, **options: Any) -> Any:
    options.setdefault("lease", 30)
    options.setdefault("ttl", 600)
    handle = driver.claim(key or unique("amo"), at_most_once=True, **options)
    assert isinstance(handle.acquire(), Claimed)
    return handle


def _near_now(moment: datetime.datetime) -> bool:
    return abs(moment.timestamp() - time.time()) < 60 and moment.tzinfo is datetime.timezone.utc


def test_the_attempt_is_kept_as_a_held_record_for_the_ttl(driver: Driver) -> None:
    """The record holds the deadline (the lease), the claim time and the token, for the ttl; others are InFlight."""
    owner = _owner(driver, token="worker-7", lease=30, ttl=600)
    found = held(driver.raw, owner)
    assert found is not None, driver.raw.get(owner.claim_key)  # the script's record, never GOBLIN.CLAIM's token
    assert found.token == "worker-7"
    assert found.deadline_ms - found.claimed_ms == 30_000
    assert abs(found.claimed_ms - time.time() * 1000) < 60_000
    assert 590 <= driver.raw.ttl(owner.claim_key) <= 600
    for options in ({"at_most_once": True}, {}, {"checkpoints": True}):
        outcome = driver.claim(owner.key, **options).acquire()
        assert isinstance(outcome, InFlight), options
        assert outcome.holder == "worker-7"
        assert outcome.retry_after is not None
        assert 0 < outcome.retry_after <= 30


def test_a_handle_given_the_holders_token_is_in_flight_and_the_holders_own_handle_claimed(driver: Driver) -> None:
    """At most once, a token the handle made is its own wherever found; one given to another handle is not."""
    owner = _owner(driver)
    assert isinstance(owner.acquire(), Claimed)  # its own claim, read back
    adopter = driver.claim(owner.key, at_most_once=True, token=owner.token)
    outcome = adopter.acquire()
    assert isinstance(outcome, InFlight)
    assert outcome.holder == owner.token


def test_a_short_ttl_still_keeps_the_record_for_the_lease(driver: Driver) -> None:
    """The record is kept max(lease, ttl): a ttl under the lease never drops the attempt before its deadline."""
    owner = _owner(driver, lease=60, ttl=5)
    assert 55 <= driver.raw.ttl(owner.claim_key) <= 60


def test_an_attempt_past_its_deadline_is_interrupted_for_every_caller(driver: Driver) -> None:
    """Past the deadline without a result: acquire() and wait() raise InterruptedWorkError, for everyone."""
    owner = _owner(driver, token="worker-7")
    claimed_ms = pass_deadline(driver.raw, owner).claimed_ms
    callers = [
        driver.claim(owner.key, at_most_once=True),
        driver.claim(owner.key),  # a plain handle meets the record: the same answer
        driver.claim(owner.key, checkpoints=True),
        driver.claim(owner.key, at_most_once=True, fencing=True),
        owner,  # the owner itself, once its deadline passed
    ]
    for caller in callers:
        for call in (caller.acquire, lambda c=caller: c.wait(timeout=0.5)):
            with pytest.raises(InterruptedWorkError) as caught:
                call()
            assert caught.value.key == owner.key
            assert caught.value.holder == "worker-7"
            assert caught.value.claimed_at == datetime.datetime.fromtimestamp(
                claimed_ms / 1000, tz=datetime.timezone.utc
            )
            assert _near_now(caught.value.claimed_at)
    assert held(driver.raw, owner) is not None  # nothing changed it


def test_a_late_owner_still_stores_its_result(driver: Driver) -> None:
    """The owner's complete() after its deadline stores the result: from then on everyone reads it."""
    owner = _owner(driver)
    pass_deadline(driver.raw, owner)
    owner.complete(b"late receipt")
    assert driver.raw.get(owner.claim_key) == record(owner.token, b"late receipt")
    assert driver.claim(owner.key, at_most_once=True).acquire() == Completed(key=owner.key, value=b"late receipt")
    owner.complete(b"late receipt")  # sent again: a success


def test_forget_reopens_an_interrupted_attempt(driver: Driver) -> None:
    """forget() deletes the record (and its checkpoint): the next caller claims and runs the work."""
    owner = _owner(driver, checkpoints=True)
    owner.checkpoint(b"step=2")
    pass_deadline(driver.raw, owner)
    assert driver.claim(owner.key).forget() is True
    assert driver.raw.exists(owner.claim_key, checkpoint_key(owner)) == 0
    again = driver.claim(owner.key, at_most_once=True, checkpoints=True)
    outcome = again.acquire()
    assert isinstance(outcome, Claimed)
    assert outcome.checkpoint is None
    again.complete(b"ran")
    with pytest.raises(ClaimLostError):  # the interrupted owner cannot overwrite it
        owner.complete(b"late")
    assert stored(driver.raw, again) == b"ran"


@pytest.mark.parametrize("past", [False, True], ids=["within", "past-deadline"])
def test_release_gives_the_attempt_back(driver: Driver, past: bool) -> None:
    """The owner's release() deletes its record, within its deadline or past it: the key is free, not interrupted."""
    owner = _owner(driver)
    if past:
        pass_deadline(driver.raw, owner)
    assert owner.release() is True  # a script: GOBLIN.CAD and DELIFEQ would not match the record
    assert driver.raw.exists(owner.claim_key) == 0
    assert owner.release() is False
    assert isinstance(driver.claim(owner.key, at_most_once=True).acquire(), Claimed)


def test_another_tokens_release_extend_and_complete_change_nothing(driver: Driver) -> None:
    """Plain and at-most-once handles of another token: release False, extend and complete ClaimLostError naming the holder."""  # noqa: E501
    owner = _owner(driver, token="worker-7")
    before = driver.raw.get(owner.claim_key)
    for options in ({}, {"at_most_once": True}, {"checkpoints": True}):
        other = driver.claim(owner.key, **options)
        assert other.release() is False
        with pytest.raises(ClaimLostError):
            other.extend()
        with pytest.raises(ClaimLostError) as caught:
            other.complete(b"theirs")
        assert caught.value.holder == "worker-7"
    assert driver.raw.get(owner.claim_key) == before


def test_extend_moves_the_deadline_while_it_lasts(driver: Driver) -> None:
    """extend() moves the deadline (the ttl kept); once the deadline passed it raises ClaimLostError and changes nothing."""  # noqa: E501
    owner = _owner(driver, lease=5, ttl=600)
    first = held(driver.raw, owner)
    assert first is not None
    owner.extend(lease=60)
    renewed = held(driver.raw, owner)
    assert renewed is not None
    assert renewed.deadline_ms - first.deadline_ms > 50_000
    assert renewed.claimed_ms == first.claimed_ms
    assert 590 <= driver.raw.ttl(owner.claim_key) <= 600
    owner.extend(lease=900)  # past the record's ttl: the key is kept as long as the lease
    assert 890 <= driver.raw.ttl(owner.claim_key) <= 900
    lapsed = pass_deadline(driver.raw, owner)
    with pytest.raises(ClaimLostError):
        owner.extend()
    assert held(driver.raw, owner) == lapsed


def test_fences_strictly_increase_across_reopened_attempts(driver: Driver) -> None:
    """fencing=True with at_most_once: every owner's fence is higher; a stale fence's complete() is refused."""
    first = driver.claim(unique("amo-fenced"), at_most_once=True, fencing=True)
    won = first.acquire()
    assert isinstance(won, Claimed)
    assert isinstance(won.fence, int)
    pass_deadline(driver.raw, first)
    with pytest.raises(InterruptedWorkError):
        driver.claim(first.key, at_most_once=True, fencing=True).acquire()
    driver.raw.delete(first.claim_key)  # an operator's DEL of the record alone: the counter stays
    second = driver.claim(first.key, at_most_once=True, fencing=True, token=first.token)
    taken = second.acquire()
    assert isinstance(taken, Claimed)
    assert isinstance(taken.fence, int)
    assert taken.fence > won.fence
    with pytest.raises(ClaimLostError):  # the same token, a stale fence: refused
        first.complete(b"stale")
    second.complete(b"fresh")
    assert stored(driver.raw, second) == b"fresh"
    assert driver.raw.exists(f"{first.claim_key}:fence") == 0  # the record written, the counter goes


def test_wait_answers_the_result_or_the_interruption(driver: Driver) -> None:
    """wait() on a live attempt: StillInFlightError naming the holder; on a completed one the value."""
    owner = _owner(driver, token="worker-7")
    with pytest.raises(StillInFlightError) as caught:
        driver.claim(owner.key, at_most_once=True).wait(timeout=0.2)
    assert caught.value.holder == "worker-7"
    owner.complete(b"done")
    assert driver.claim(owner.key, at_most_once=True).wait(timeout=1) == Completed(key=owner.key, value=b"done")


def test_a_batch_claims_at_most_once(driver: Driver) -> None:
    """acquire_many with at_most_once: each key a held record; an interrupted key's error in its place."""
    keys = [unique("amo-batch") for _ in range(3)]
    interrupted = driver.claim(keys[0], at_most_once=True, token="worker-7")
    assert isinstance(interrupted.acquire(), Claimed)
    pass_deadline(driver.raw, interrupted)
    if driver.run is None:
        outcomes = Claim.acquire_many(driver.client, keys, at_most_once=True)
    else:
        outcomes = driver.run(type(driver.claim(keys[0])._handle).acquire_many(driver.client, keys, at_most_once=True))
    (_, first), *rest = outcomes
    assert isinstance(first, InterruptedWorkError)
    assert first.holder == "worker-7"
    for handle, outcome in rest:
        assert isinstance(outcome, Claimed)
        assert held(driver.raw, handle) is not None


@pytest.mark.parametrize(
    "options", [{"at_most_once": 1}, {"at_most_once": "yes"}, {"at_most_once": None}, {"checkpoints": "yes"}]
)
def test_bad_flags_are_refused_before_anything_is_sent(options: dict[str, Any]) -> None:
    """A flag that is not True or False: InvalidArgumentTypeError from the constructor, no I/O (the client is dead)."""
    dead = redis.Redis(port=1, socket_connect_timeout=0.1)
    with pytest.raises(InvalidArgumentTypeError) as caught:
        Claim(dead, "evt", **options)
    assert caught.value.key == "evt"
    client = fake_redis(native=False)
    with pytest.raises(InvalidArgumentTypeError):
        Claim.acquire_many(client, ["a", "b"], **options)
    assert client.dbsize() == 0


# --------------------------------------------------------------------------- the native fallback, counted


@pytest.mark.parametrize("backend", ["native", "native-cluster", "valkey", "valkey-native"], indirect=True)
def test_at_most_once_runs_every_step_as_a_script_where_native_commands_exist(driver: Driver) -> None:
    """INFO commandstats: with the module or Valkey's owner checks, an at-most-once claim's steps are all EVALSHAs."""
    owner = driver.claim(unique("amo-sent"), at_most_once=True, checkpoints=True, lease=3)
    assert isinstance(owner.acquire(), Claimed)  # the probe and SCRIPT LOAD come before the counting
    _reset_stats(driver.raw)
    owner.extend()
    owner.checkpoint(b"step=1")
    keeper = _keep_alive(driver, owner, lambda k: k.renewals >= 1 or k.lost)
    assert not keeper.lost
    # A plain handle: SET ... NX GET, then GET, PTTL and PEXPIRETIME for the lease left (every server here has them).
    assert isinstance(driver.claim(owner.key).acquire(), InFlight)
    assert owner.release() is True
    again = driver.claim(owner.key, at_most_once=True)
    assert isinstance(again.acquire(), Claimed)
    again.complete(b"done")
    stats = _commandstats(driver.raw)
    for native in ("goblin.cad", "delifeq", "delex"):
        assert native not in stats, stats
    assert stats.get("goblin.claim", 0) == 0
    assert stats.get("pexpiretime") == 1, stats
    # extend, checkpoint, each renewal, release, claim, complete
    expected = 2 + keeper.renewals + 3
    assert stats.get("evalsha") == expected, stats


@pytest.mark.parametrize("backend", ["standalone", "valkey", "cluster"], indirect=True)
def test_a_keep_alive_holds_an_at_most_once_claim_past_its_lease(driver: Driver) -> None:
    """lease=1 and a keep-alive for twice that: the deadline keeps moving, nobody is told it was interrupted."""
    owner = _owner(driver, lease=1, ttl=600)
    started = time.monotonic()
    keeper = _keep_alive(driver, owner, lambda k: time.monotonic() - started > 1.6 or k.lost, interval=0.25)
    assert not keeper.lost
    assert isinstance(driver.claim(owner.key, at_most_once=True).acquire(), InFlight)
    owner.complete(b"kept")
    assert stored(driver.raw, owner) == b"kept"


@pytest.mark.parametrize("backend", ["replica"], indirect=True)
def test_replicas_wait_for_an_at_most_once_checkpointed_claim_and_its_result(driver: Driver) -> None:
    """replicas=1 on a primary with its replica: claim and result acknowledged; the replica holds the record."""
    owner = driver.claim(unique("amo-wait"), at_most_once=True, checkpoints=True, replicas=1, replica_timeout_ms=2000)
    assert isinstance(owner.acquire(), Claimed)
    assert isinstance(owner.acquire(), Claimed)  # its own claim read back: rewritten for the WAIT, acknowledged
    owner.checkpoint(b"step=1")
    owner.complete(b"replicated")
    again = driver.claim(owner.key, at_most_once=True, checkpoints=True, replicas=1, replica_timeout_ms=2000)
    assert again.acquire() == Completed(key=owner.key, value=b"replicated")
    assert driver.raw.exists(checkpoint_key(owner)) == 0
    assert until(lambda: driver.raw.wait(1, 2000) >= 1, 5)
