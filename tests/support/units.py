"""What the tests of a unit of work read and arrange: at-most-once records, deadlines, checkpoints.

An at-most-once claim writes ``held <deadline_ms> <claimed_ms> <token>`` (claim.lua); its
deadline lives in the value, so a test moves it into the past by rewriting the value with
the key's TTL kept, rather than sleeping past a lease. A plain claim's lease lapses by
``PEXPIRE key 1``.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Any

__all__ = ["Held", "checkpoint_key", "held", "lapse_lease", "pass_deadline"]

_HELD = re.compile(rb"held (\d+) (\d+) (.+)", re.DOTALL)


@dataclass(frozen=True)
class Held:
    """An at-most-once record's parts: its deadline and claim time (server clock, ms) and its token."""

    deadline_ms: int
    claimed_ms: int
    token: str


def held(raw: Any, handle: Any) -> Held | None:
    """The at-most-once record at ``handle``'s key; ``None`` when the key holds anything else or nothing."""
    value = raw.get(handle.claim_key)
    found = _HELD.fullmatch(value) if isinstance(value, bytes) else None
    if found is None:
        return None
    return Held(int(found[1]), int(found[2]), found[3].decode())


def pass_deadline(raw: Any, handle: Any, by_ms: int = 1000) -> Held:
    """Move the at-most-once record's deadline ``by_ms`` into the past, its TTL kept: the attempt is interrupted."""
    found = held(raw, handle)
    assert found is not None, raw.get(handle.claim_key)
    deadline = int(time.time() * 1000) - by_ms
    raw.set(handle.claim_key, b"held %d %d %s" % (deadline, found.claimed_ms, found.token.encode()), keepttl=True)
    return Held(deadline, found.claimed_ms, found.token)


def lapse_lease(raw: Any, handle: Any) -> None:
    """A plain claim's lease lapses now (``PEXPIRE key 1``, then past it)."""
    raw.pexpire(handle.claim_key, 1)
    time.sleep(0.01)


def checkpoint_key(handle: Any) -> str:
    """Where a handle's checkpoints live: ``<record>:checkpoint``."""
    return f"{handle.claim_key}:checkpoint"
