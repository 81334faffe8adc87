"""Two promises of the public API: in-flight answers compare by key, and a keep-alive's interval fits its lease."""

from __future__ import annotations

import pytest

from goblin_claim import Claim, Claimed, InFlight, InvalidArgumentError
from goblin_claim.testing import fake_redis
from tests.conftest import unique


def test_in_flight_answers_for_one_key_are_equal_whatever_their_retry_after() -> None:
    """``retry_after`` is a clock reading, not the situation: equal and hashed alike; never equal to a non-outcome."""
    first, later = InFlight(key="k", retry_after=1.5), InFlight(key="k", retry_after=9.0)
    assert first == later
    assert hash(first) == hash(later)
    assert len({first, later}) == 1
    assert first != InFlight(key="other")
    assert first != "k"
    assert (first == "k") is False


@pytest.mark.parametrize("interval", [0, 60, 61])
def test_a_keep_alive_interval_outside_the_lease_is_refused(interval: float) -> None:
    """``keep_alive(interval=...)`` must be above 0 and below the lease: else InvalidArgumentError saying so."""
    claim = Claim(fake_redis(native=False), unique("k"), lease=60)
    assert isinstance(claim.acquire(), Claimed)
    with pytest.raises(InvalidArgumentError, match=r"interval must be > 0 and shorter than the lease \(60s\)"):
        claim.keep_alive(interval=interval)
