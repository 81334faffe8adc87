"""Every decision of a claim, with no I/O and no redis import.

The sync and async drivers (``_sync.py``, ``_async.py``) only move bytes: they
ask this module what to send, send it, and ask it what the reply means. Keeping
the rules here means one place to read, and unit tests that need no server.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import random
import secrets
from dataclasses import dataclass
from importlib import resources
from typing import Final, Generic, Literal, TypeVar

from ._errors import (
    ClaimLostError,
    InvalidArgumentError,
    InvalidArgumentTypeError,
    NativeUnavailableError,
    StillInFlightError,
)
from ._outcomes import Claimed, Completed, InFlight

__all__ = [
    "CLAIM",
    "CLAIMED",
    "COMPLETE",
    "EXTEND",
    "NATIVE_COMMANDS",
    "PEEK",
    "RELEASE",
    "SCRIPTS",
    "ClaimBase",
    "NativeMode",
    "Script",
    "WaitSchedule",
    "check_seconds",
    "native_command",
]

NativeMode = Literal["auto", "never", "always"]
_NATIVE_MODES: Final = ("auto", "never", "always")

CLAIMED: Final = "CLAIMED"
_CLAIMED_REPLIES: Final = (CLAIMED.encode(), CLAIMED)

# A lease or ttl above this is refused: Redis rejects expiries that overflow its
# millisecond clock, and no real claim needs to be held for longer than ~68 years.
MAX_SECONDS: Final = 2**31 - 1

# Namespaces already validated: most services use one or two, on every request.
_NAMESPACES_SEEN: set[str] = set()

# What complete() leaves in claim_key. It contains a space, which no token may
# contain, so a completed claim never matches an owner check.
DONE_PREFIX: Final = "done "


# --------------------------------------------------------------------------- scripts


@dataclass(frozen=True)
class Script:
    """One Lua script of the protocol, and the native command that replaces it.

    Attributes:
        name: The ``.lua`` file's stem.
        source: The script text.
        sha: Its SHA1, as EVALSHA wants it.
        numkeys: How many of the arguments are keys.
        native: The server command with the same semantics, if there is one.
    """

    name: str
    source: str
    sha: str
    numkeys: int
    native: str | None = None

    @classmethod
    def load(cls, name: str, numkeys: int, native: str | None = None) -> Script:
        """Read ``scripts/<name>.lua`` from the package and hash it once."""
        source = (resources.files(__package__) / "scripts" / f"{name}.lua").read_text("utf-8")
        sha = hashlib.sha1(source.encode("utf-8"), usedforsecurity=False).hexdigest()
        return cls(name, source, sha, numkeys, native)


CLAIM: Final = Script.load("claim", 2, native="GOBLIN.CLAIM")
COMPLETE: Final = Script.load("complete", 2)
EXTEND: Final = Script.load("extend", 1)
RELEASE: Final = Script.load("release", 1, native="GOBLIN.CAD")
PEEK: Final = Script.load("peek", 1)
SCRIPTS: Final = (CLAIM, COMPLETE, EXTEND, RELEASE, PEEK)
NATIVE_COMMANDS: Final = tuple(s.native for s in SCRIPTS if s.native)


def native_command(mode: NativeMode, available: frozenset[str] | None, script: Script, key: str) -> str | None:
    """The native command a call sends instead of ``script``, or ``None`` for the script.

    Args:
        mode: The handle's ``native`` setting.
        available: The native commands the server answers (``None`` until probed).
        script: The script the call would run.
        key: The handle's key, for the error.

    Raises:
        NativeUnavailableError: ``mode`` is ``"always"`` and the server lacks a command.
    """
    if mode == "auto":  # first: the common case costs one membership test
        return script.native if available and script.native in available else None
    if mode == "always" and not (available or frozenset()).issuperset(NATIVE_COMMANDS):
        missing = ", ".join(c for c in NATIVE_COMMANDS if not available or c not in available)
        raise NativeUnavailableError(
            f'native="always", but the server lacks {missing}; use native="auto" to fall back to scripts',
            key=key,
        )
    return script.native if mode == "always" else None


# --------------------------------------------------------------------------- validation


def check_seconds(name: str, value: object) -> int:
    """Return ``value`` if it is a positive int of seconds, else raise.

    ``bool`` is refused although it is an ``int``: ``lease=True`` is a bug.
    """
    if type(value) is not int:
        raise InvalidArgumentTypeError(
            f"{name} must be a positive int of seconds, not {type(value).__name__} {value!r}"
        )
    if not 0 < value <= MAX_SECONDS:
        raise InvalidArgumentError(f"{name} must be a positive int of seconds (at most {MAX_SECONDS}), not {value!r}")
    return value


def check_timeout(name: str, value: object, key: str | None = None) -> float:
    """Return ``value`` as float seconds if it is a number >= 0 (not a bool, not NaN), else raise."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidArgumentTypeError(f"{name} must be a number of seconds, not {value!r}", key=key)
    if not value >= 0:  # also refuses NaN
        raise InvalidArgumentError(f"{name} must be >= 0, not {value!r}", key=key)
    return float(value)


def _check_text(name: str, value: object) -> str:
    if type(value) is not str:
        raise InvalidArgumentTypeError(f"{name} must be a str, not {type(value).__name__} {value!r}")
    if not value:
        raise InvalidArgumentError(f"{name} must not be empty")
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise InvalidArgumentError(f"{name} is not encodable as UTF-8: {value!r}") from exc
    return value


def check_namespace(value: object) -> str:
    """Return a valid namespace: a non-empty str without braces."""
    namespace = _check_text("namespace", value)
    if "{" in namespace or "}" in namespace:
        # Braces would move the cluster hash tag away from the claim's own key.
        raise InvalidArgumentError(f"namespace must not contain braces: {namespace!r}")
    return namespace


def check_token(value: object) -> str:
    """Return a valid token: a non-empty str of printable characters without whitespace."""
    token = _check_text("token", value)
    if not token.isprintable() or any(c.isspace() for c in token):
        raise InvalidArgumentError(f"token must be printable and contain no whitespace: {token!r}")
    return token


def check_value(value: object, key: str) -> bytes | str:
    """Return a value ``complete()`` may store: bytes or str, never ``CLAIMED``."""
    if type(value) is not bytes and type(value) is not str:
        raise InvalidArgumentTypeError(
            f"a result must be bytes or str, not {type(value).__name__}; serialize it first", key=key
        )
    if value in _CLAIMED_REPLIES:
        raise InvalidArgumentError(
            f"the result {value!r} cannot be stored: a duplicate would read it as winning the claim", key=key
        )
    return value


def check_native(value: object) -> NativeMode:
    """Return a valid ``native`` mode."""
    if value not in _NATIVE_MODES:
        raise InvalidArgumentError(f"native must be one of {', '.join(map(repr, _NATIVE_MODES))}, not {value!r}")
    return value


def _new_token_prefix() -> None:
    global _token_prefix, _token_counter
    _token_prefix = secrets.token_hex(12) + "-"
    _token_counter = itertools.count(1)


_token_prefix = ""
_token_counter = itertools.count(1)
_new_token_prefix()
# A forked child must not repeat its parent's tokens.
os.register_at_fork(after_in_child=_new_token_prefix)


def new_token() -> str:
    """A token unique to this handle: 96 random bits per process, then a counter.

    Cheaper than fresh randomness per call, and just as unique: the prefix is
    drawn again in every forked child.
    """
    return f"{_token_prefix}{next(_token_counter):x}"


# --------------------------------------------------------------------------- keys


def _escape_tag(key: str) -> str:
    # Percent-escape the three characters that could end or empty the hash tag,
    # so the whole key is always the (non-empty) tag and distinct keys stay distinct.
    if "%" in key or "{" in key or "}" in key:
        return key.replace("%", "%25").replace("{", "%7B").replace("}", "%7D")
    return key


def build_keys(namespace: str, key: str) -> tuple[str, str]:
    """The claim and result keys of ``key``: ``<ns>:{<key>}:claim`` and ``<ns>:{<key>}:result``.

    Both share the hash tag ``{<key>}`` (braces and ``%`` in ``key`` are
    percent-escaped), so they always sit in one cluster slot.
    """
    prefix = f"{namespace}:{{{_escape_tag(key)}}}:"
    return prefix + "claim", prefix + "result"


# --------------------------------------------------------------------------- the shared handle


ClientT = TypeVar("ClientT")


class ClaimBase(Generic[ClientT]):
    """What ``Claim`` and ``AsyncClaim`` share: validated settings and derived keys.

    Handles are made once per request, so construction stays cheap: plain type
    and range checks, no pydantic, namespaces validated once per process.
    """

    __slots__ = ("_client", "_native", "claim_key", "key", "lease", "result_key", "token", "ttl")

    def __init__(
        self,
        client: ClientT,
        key: str,
        *,
        lease: int = 30,
        ttl: int = 86400,
        namespace: str = "goblin",
        token: str | None = None,
        native: NativeMode = "auto",
    ) -> None:
        # Each check takes its fast path inline for the valid, common case and
        # calls the full checker (which raises with a clear message) otherwise.
        self._client = client
        if type(key) is not str or not key or not key.isascii():
            _check_text("key", key)
        self.key = key
        if namespace not in _NAMESPACES_SEEN:
            _NAMESPACES_SEEN.add(check_namespace(namespace))
        self.claim_key, self.result_key = build_keys(namespace, key)
        self.lease = lease if type(lease) is int and 0 < lease <= MAX_SECONDS else check_seconds("lease", lease)
        self.ttl = ttl if type(ttl) is int and 0 < ttl <= MAX_SECONDS else check_seconds("ttl", ttl)
        self.token = new_token() if token is None else check_token(token)
        self._native = native if native == "auto" else check_native(native)

    @classmethod
    def _with_keys(
        cls,
        client: ClientT,
        claim_key: str,
        result_key: str,
        lease: int,
        ttl: int,
        token: str | None,
        native: NativeMode,
    ) -> ClaimBase[ClientT]:
        _check_text("claim_key", claim_key)
        _check_text("result_key", result_key)
        if claim_key == result_key:
            raise InvalidArgumentError(f"claim_key and result_key must differ: {claim_key!r}")
        # The usual construction checks everything else; then the exact keys replace the derived ones.
        self = cls(client, claim_key, lease=lease, ttl=ttl, token=token, native=native)
        self.claim_key, self.result_key = claim_key, result_key
        return self

    def __repr__(self) -> str:
        return f"{type(self).__name__}(key={self.key!r}, token={self.token!r}, lease={self.lease}, ttl={self.ttl})"

    # -- what to send, and what the replies mean

    def _claim_outcome(self, reply: object) -> Claimed | Completed | InFlight:
        # Plain constructors: pydantic's validated __init__ is faster than model_construct.
        if reply is None:
            return InFlight(key=self.key)
        if reply in _CLAIMED_REPLIES:
            return Claimed(key=self.key, token=self.token, lease=self.lease)
        return Completed(key=self.key, value=reply)  # type: ignore[arg-type]  # bytes or str from redis-py

    def _complete_args(self, value: object) -> tuple[str, str, str, bytes | str, int, str]:
        stored = check_value(value, self.key)
        return self.claim_key, self.result_key, self.token, stored, self.ttl, DONE_PREFIX + self.token

    def _extend_lease(self, lease: int | None) -> int:
        return self.lease if lease is None else check_seconds("lease", lease)

    def _lost(self, action: str) -> ClaimLostError:
        return ClaimLostError(
            f"cannot {action} {self.key!r}: token {self.token!r} no longer holds {self.claim_key!r} "
            "(its lease lapsed, or the work was already completed)",
            key=self.key,
        )

    def _wait_schedule(self, timeout: float) -> WaitSchedule:
        return WaitSchedule(timeout, self.key)


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
            f"interval must be > 0 and shorter than the lease ({lease}s), not {interval!r}", key=key
        )
    return seconds


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

    __slots__ = ("_attempt", "_backoff", "_deadline", "_key", "_timeout")

    def __init__(self, timeout: float, key: str, backoff: Backoff | None = None) -> None:
        self._timeout = check_timeout("timeout", timeout, key)
        self._key = key
        self._backoff = backoff or Backoff()
        self._attempt = 0
        self._deadline: float | None = None

    def start(self, now: float) -> None:
        """Fix the deadline; ``now`` is ``time.monotonic()`` (or the loop's clock)."""
        self._deadline = now + self._timeout

    def next_delay(self, now: float) -> float | None:
        """Seconds to sleep before the next attempt, or ``None`` once the deadline has passed."""
        assert self._deadline is not None, "start() first"
        remaining = self._deadline - now
        if remaining <= 0:
            return None
        delay = self._backoff.delay(self._attempt)
        self._attempt += 1
        return min(delay, remaining)

    def expired(self) -> StillInFlightError:
        """The error for a wait that ran out of time."""
        return StillInFlightError(
            f"{self._key!r} is still in flight after waiting {self._timeout:g}s ({self._attempt + 1} attempts)",
            key=self._key,
        )
