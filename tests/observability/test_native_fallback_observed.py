"""A server that loses the native commands after the probe found them: the fallback is warned about and counted.

A redis-server of the test's own with the reference module, unloaded (MODULE UNLOAD)
after a first native claim; the next claim falls back to the scripts and lands.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest

import goblin_claim
import goblin_claim.otel
from goblin_claim import Claim, Claimed
from goblin_claim._events import Event
from tests.conftest import unique
from tests.observability.conftest import Telemetry


def _pair() -> tuple[str, str]:
    key = unique("n")
    return f"c:{{{key}}}", f"r:{{{key}}}"


def test_native_commands_gone_after_the_probe_fall_back_to_the_scripts(
    own_server: Any, goblin_module: str, otel: Telemetry, caplog: pytest.LogCaptureFixture
) -> None:
    """Module unloaded: the next claim lands through the scripts, with a WARNING, an event and a counted fallback."""
    server = own_server("--loadmodule", goblin_module, "--enable-module-command", "yes")
    client = server.client()
    events: list[Event] = []
    goblin_claim.add_listener(events.append)
    caplog.set_level(logging.WARNING, logger="goblin_claim")
    try:
        # Two keys: GOBLIN.CLAIM (a one-key claim takes the server's own SET ... NX GET).
        assert isinstance(Claim.from_keys(client, *_pair()).acquire(), Claimed)
        client.execute_command("MODULE", "UNLOAD", "goblin")  # the reference module's name
        later = Claim.from_keys(client, *_pair())
        assert isinstance(later.acquire(), Claimed)
        assert client.get(later.claim_key) is not None
    finally:
        goblin_claim.remove_listener(events.append)
        client.close()
    assert [(e.operation, e.outcome) for e in events if e.operation == "native_fallback"] == [
        ("native_fallback", "fell_back")
    ]
    assert any("lacks the native commands after all" in r.getMessage() for r in caplog.records)
    assert sum(p.value for p in otel.points("goblin_claim.native_fallbacks")) == 1
