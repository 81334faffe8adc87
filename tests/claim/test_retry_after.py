"""``InFlight.retry_after`` and ``StillInFlightError.retry_after``: the holder's lease left, on every path."""

from __future__ import annotations

import pytest

from goblin_claim import Claim, Claimed, InFlight, StillInFlightError
from tests.conftest import ALL_BACKENDS, Deco, Driver, unique

BACKENDS = ("fake-native", "standalone", "native", "cluster")
assert set(BACKENDS) <= set(ALL_BACKENDS)


def test_in_flight_says_the_holders_lease_left(driver: Driver) -> None:
    """A duplicate's InFlight carries the seconds the owner's lease has left (from the claim reply, natively too)."""
    key = unique()
    assert isinstance(driver.claim(key, lease=30).acquire(), Claimed)
    outcome = driver.claim(key, lease=30).acquire()
    assert isinstance(outcome, InFlight)
    assert outcome.retry_after is not None
    assert 25 < outcome.retry_after <= 30


def test_in_flight_follows_a_renewed_lease(driver: Driver) -> None:
    """After the owner extends its lease, retry_after reports the new lease, not the old one."""
    key = unique()
    owner = driver.claim(key, lease=5)
    assert isinstance(owner.acquire(), Claimed)
    owner.extend(lease=60)
    outcome = driver.claim(key, lease=5).acquire()
    assert isinstance(outcome, InFlight)
    assert outcome.retry_after is not None
    assert 55 < outcome.retry_after <= 60


def test_in_flight_without_an_expiry_is_unknown(driver: Driver) -> None:
    """A raw writer's claim with no expiry gives retry_after None, never a negative delay."""
    key = unique()
    handle = driver.claim(key)
    driver.raw.set(handle.claim_key, "someone")
    outcome = handle.acquire()
    assert isinstance(outcome, InFlight)
    assert outcome.retry_after is None


def test_wait_deadline_error_carries_retry_after(driver: Driver) -> None:
    """wait() reaching its deadline raises StillInFlightError whose retry_after is the owner's lease left."""
    key = unique()
    assert isinstance(driver.claim(key, lease=20).acquire(), Claimed)
    with pytest.raises(StillInFlightError) as caught:
        driver.claim(key, lease=20).wait(timeout=0.2)
    assert caught.value.retry_after is not None
    assert 15 < caught.value.retry_after <= 20


def test_decorator_wait_zero_error_carries_retry_after(deco: Deco) -> None:
    """@idempotent(wait=0) on in-flight work raises StillInFlightError carrying the owner's lease left, runs nothing."""
    runs: list[str] = []

    def body(order_id: str) -> str:
        runs.append(order_id)
        return "done"

    charge = deco(body, key="order_id", lease=12, wait=0)
    # Another worker holds the claim (a raw SET, as claim.lua does it), with a 12 s lease.
    assert isinstance(Claim(deco.raw, "o1", namespace=deco.namespace, lease=12).acquire(), Claimed)
    with pytest.raises(StillInFlightError) as caught:
        charge("o1")
    assert runs == []
    assert caught.value.retry_after is not None
    assert 8 < caught.value.retry_after <= 12


def test_in_flight_equality_ignores_the_clock_reading() -> None:
    """Two in-flight answers for one key are equal whatever lease they read; different keys are not."""
    assert InFlight(key="k", retry_after=3.0) == InFlight(key="k", retry_after=None)
    assert InFlight(key="k") != InFlight(key="j")
    assert hash(InFlight(key="k", retry_after=1.0)) == hash(InFlight(key="k"))
    match InFlight(key="k", retry_after=2.5):
        case InFlight(key=key, retry_after=left):
            assert (key, left) == ("k", 2.5)


def test_job_retry_delay_follows_the_lease_left() -> None:
    """The job-queue rule: retry just past the holder's lease; soon when unknown; never zero or negative."""
    from goblin_claim._jobs import retry_delay

    assert retry_delay(StillInFlightError("x", key="k", retry_after=2.5), lease=30) == pytest.approx(2.55)
    assert retry_delay(StillInFlightError("x", key="k", retry_after=0.0), lease=30) == pytest.approx(0.05)
    assert retry_delay(StillInFlightError("x", key="k"), lease=30) == 1.0
    assert retry_delay(StillInFlightError("x", key="k"), lease=1) == 1.0


def test_job_function_leaves_the_context_argument_out() -> None:
    """skip_first: the context is neither a key argument nor fingerprinted; forget() takes the job's own arguments."""
    from goblin_claim._jobs import call_with_first, job_function
    from goblin_claim.testing import fake_redis

    client = fake_redis(native=False)
    runs: list[tuple[str, str, int]] = []

    def job(ctx: dict[str, str], event_id: str, amount: int) -> int:
        runs.append((ctx["job_id"], event_id, amount))
        return amount * 2

    decorated = job_function(job, client, "event_id", {}, namespace=unique("ns"), skip_first=True)
    assert call_with_first(decorated, {"job_id": "a"}, "e1", 5) == 10
    assert call_with_first(decorated, {"job_id": "b"}, "e1", 5) == 10  # another ctx: the same call
    assert runs == [("a", "e1", 5)]
    assert decorated.forget("e1", 5) is True
    assert call_with_first(decorated, {"job_id": "c"}, "e1", 5) == 10
    assert runs == [("a", "e1", 5), ("c", "e1", 5)]
