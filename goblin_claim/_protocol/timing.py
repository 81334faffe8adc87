"""Timing: renewal intervals, lease margins, retry backoff and the wait schedule."""

from __future__ import annotations

import random
from dataclasses import dataclass

from .._errors import (
    InvalidArgumentError,
    StillInFlightError,
)
from .checks import check_timeout, describe

# --------------------------------------------------------------------------- waiting and renewing


def renew_interval(lease: int, interval: object, key: str) -> float:
    """Seconds between lease renewals: ``interval`` if given, else a third of the lease.

    A third leaves two more chances to renew before the lease lapses.
    """
    if interval is None:
        return lease / 3
    seconds = check_timeout("interval", interval, key)
    if not 0 < seconds < lease:
        raise InvalidArgumentError(
            f"interval must be > 0 and shorter than the lease ({lease}s), not {describe(interval)}", key=key
        )
    return seconds


def lease_margin(lease: int) -> float:
    """Seconds before the estimated lapse at which an unanswered renewal is given up.

    A twentieth of the lease, at most a quarter second: the claim is declared
    lost slightly before the server could let it go, never after.
    """
    return min(0.25, lease / 20)


def retry_delay(interval: float, left: float) -> float:
    """Seconds until a failed renewal is tried again, with ``left`` seconds of lease remaining.

    Sooner than a tick (a third of what is left, at least 50 ms): waiting a whole
    interval after a failure would leave a single try before the lease lapses.
    """
    return min(interval, max(0.05, left / 3))


@dataclass
class Backoff:
    """Exponential backoff with full jitter: attempt ``n`` sleeps ``uniform(0, min(cap, first * 2**n))``.

    Full jitter spreads a crowd of duplicates over time instead of waking them in
    lockstep. ``floor`` keeps a waiter from spinning on tiny sleeps.
    """

    first: float = 0.02
    cap: float = 0.5
    floor: float = 0.005

    def delay(self, attempt: int, rng: random.Random | None = None) -> float:
        """The sleep before attempt ``attempt + 1`` (``attempt`` counts from 0)."""
        ceiling = min(self.cap, self.first * (2 ** min(attempt, 32)))
        return max(self.floor, (rng or random).uniform(0.0, ceiling))


class WaitSchedule:
    """The retry-poll plan of ``wait()``: a deadline on a monotonic clock and backoff.

    The driver loops: try once; if still in flight, ask ``next_delay(now)``; sleep
    that long, or raise what ``expired()`` returns when it says ``None``.
    """

    __slots__ = ("_attempt", "_backoff", "_deadline", "_key", "_lapse_ms", "_timeout")

    def __init__(self, timeout: float, key: str, backoff: Backoff | None = None) -> None:
        self._timeout = check_timeout("timeout", timeout, key)
        self._key = key
        self._backoff = backoff or Backoff()
        self._attempt = 0
        self._deadline: float | None = None
        self._lapse_ms: int | None = None

    def start(self, now: float) -> None:
        """Fix the deadline; ``now`` is ``time.monotonic()`` (or the loop's clock)."""
        self._deadline = now + self._timeout

    def next_delay(self, now: float, lapse_ms: int | None = None) -> float | None:
        """Seconds to sleep before the next attempt, or ``None`` once the deadline has passed.

        ``lapse_ms`` (the holder's lease left, from the last reply) caps the sleep, so
        a waiter tries to take over just after a crashed owner's lease lapses; the
        last one given is what ``expired()`` reports as ``retry_after``.
        """
        assert self._deadline is not None, "start() first"
        self._lapse_ms = lapse_ms
        remaining = self._deadline - now
        if remaining <= 0:
            return None
        delay = self._backoff.delay(self._attempt)
        self._attempt += 1
        if lapse_ms is not None and lapse_ms >= 0:
            delay = min(delay, lapse_ms / 1000 + 0.002)
        return min(delay, remaining)

    def expired(self, holder: str | None = None) -> StillInFlightError:
        """The error for a wait that ran out of time; ``holder``: the token that holds the claim, when known."""
        held = f", held by token {holder!r}" if holder is not None else ""
        return StillInFlightError(
            f"{self._key!r} is still in flight after waiting {self._timeout:g}s ({self._attempt + 1} attempts){held}",
            key=self._key,
            retry_after=self._lapse_ms / 1000 if self._lapse_ms is not None and self._lapse_ms >= 0 else None,
            holder=holder,
        )
