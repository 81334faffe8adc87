"""A keep-alive whose server stops answering: each failing renewal is a WARNING, an event and a span.

On a redis-server of the test's own, frozen with SIGSTOP while the keep-alive runs
(and woken before the lease lapses), the client's socket timeout well under the interval.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from typing import Any

import pytest
import redis

import goblin_claim
import goblin_claim.otel
from goblin_claim import Claim, Claimed
from goblin_claim._events import Event
from tests.conftest import unique
from tests.observability.conftest import Telemetry
from tests.support import servers


def test_failing_renewals_are_warned_about_observed_and_retried(
    own_server: Any, otel: Telemetry, caplog: pytest.LogCaptureFixture
) -> None:
    """Frozen: "renewal failing" at WARNING, renew events and spans "unavailable"; thawed, the lease is still held."""
    server = own_server()
    client = redis.Redis(host=servers.HOST, port=server.port, socket_timeout=0.2, retry=None)
    events: list[Event] = []
    goblin_claim.add_listener(events.append)
    caplog.set_level(logging.WARNING, logger="goblin_claim")
    try:
        claim = Claim(client, unique("renew"), lease=6)
        assert isinstance(claim.acquire(), Claimed)
        with claim.keep_alive(interval=0.3) as keeper:
            os.kill(server.process.pid, signal.SIGSTOP)
            try:
                deadline = time.monotonic() + 10
                while not any(e.operation == "renew" and e.outcome == "unavailable" for e in events):
                    assert time.monotonic() < deadline, "no failing renewal was reported"
                    time.sleep(0.05)
            finally:
                os.kill(server.process.pid, signal.SIGCONT)
            assert not keeper.lost
        assert claim.release() is True  # still ours: the lease outlived the freeze
    finally:
        goblin_claim.remove_listener(events.append)
        client.close()
    failing = [e for e in events if e.operation == "renew" and e.outcome == "unavailable"]
    assert failing[0].key == claim.key
    assert any("renewal failing" in r.getMessage() and r.levelno == logging.WARNING for r in caplog.records)
    spans = otel.finished("goblin_claim.renew")
    assert any(s.attributes is not None and s.attributes["goblin_claim.outcome"] == "unavailable" for s in spans)
