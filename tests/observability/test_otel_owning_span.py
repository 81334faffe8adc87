"""OpenTelemetry: a fenced claim's span carries its fence; a lease lost under the application's span marks it.

On fakeredis, read back through the SDK's in-memory exporters.
"""

from __future__ import annotations

import time

from goblin_claim import Claim, Claimed
from goblin_claim.testing import fake_redis
from tests.conftest import unique
from tests.observability.conftest import Telemetry


def test_a_fenced_claims_span_carries_its_fence(otel: Telemetry) -> None:
    """``fencing=True``: the acquire span's goblin_claim.fence is the fence the caller got."""
    outcome = Claim(fake_redis(native=False), unique("k"), fencing=True).acquire()
    assert isinstance(outcome, Claimed)
    (span,) = otel.finished("goblin_claim.acquire")
    assert span.attributes is not None
    assert span.attributes["goblin_claim.fence"] == outcome.fence


def test_a_lease_lost_under_the_applications_span_is_marked_on_it(otel: Telemetry) -> None:
    """A keep-alive started inside the application's span: losing the lease adds "lease lost" to that span."""
    client = fake_redis(native=False)
    tracer = otel.tracer_provider.get_tracer("app")
    claim = Claim(client, unique("k"), lease=5)
    with tracer.start_as_current_span("handle-order") as span:
        assert isinstance(claim.acquire(), Claimed)
        with claim.keep_alive(interval=0.1) as keeper:
            client.set(claim.claim_key, "someone-else")
            deadline = time.monotonic() + 10
            # The keeper marks the span from its own thread, just after it says the lease is lost.
            while "lease lost" not in [event.name for event in span.events] and time.monotonic() < deadline:  # type: ignore[attr-defined]
                time.sleep(0.02)
            assert keeper.lost
    (owning,) = otel.finished("handle-order")
    assert "lease lost" in [event.name for event in owning.events]
    renewals = otel.finished("goblin_claim.renew")
    assert renewals[-1].parent is not None
    assert renewals[-1].parent.span_id == owning.context.span_id


def test_a_from_keys_handles_span_and_points_carry_no_namespace(otel: Telemetry) -> None:
    """A handle made with from_keys has no namespace: its span and duration points leave the attribute out."""
    handle = Claim.from_keys(fake_redis(native=False), unique("claim"), unique("result"))
    assert isinstance(handle.acquire(), Claimed)
    (span,) = otel.finished("goblin_claim.acquire")
    assert span.attributes is not None
    assert "goblin_claim.namespace" not in span.attributes
    assert span.attributes["goblin_claim.outcome"] == "claimed"
    points = otel.points("goblin_claim.operation.duration")
    assert points
    assert all("goblin_claim.namespace" not in point.attributes for point in points)
