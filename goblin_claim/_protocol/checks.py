"""Argument checks: leases, timeouts, namespaces, tokens, values and replica counts, refused before any write."""

from __future__ import annotations

from typing import Final, Literal

from .._errors import (
    InvalidArgumentError,
    InvalidArgumentTypeError,
)
from .record import _CLAIMED_REPLIES, CLAIMED

NativeMode = Literal["auto", "never", "always"]
_NATIVE_MODES: Final = ("auto", "never", "always")


# A lease or ttl above this is refused: Redis rejects expiries that overflow its
# millisecond clock, and no real claim needs to be held for longer than ~68 years.
MAX_SECONDS: Final = 2**31 - 1

# Namespaces already validated: most services use one or two, on every request.
# Bounded: a service minting namespaces (one per tenant, say) empties the set when
# it passes the limit and revalidates, so a hit stays one set lookup.
_NAMESPACES_SEEN: set[str] = set()
NAMESPACES_SEEN_MAX: Final = 4096


# --------------------------------------------------------------------------- validation


def describe(value: object, limit: int = 80) -> str:
    """``repr(value)`` for an error message: shortened, and never raising.

    A bad argument must not break its own error: ``repr`` of an int past Python's
    digit limit raises ``ValueError``, and a user's ``__repr__`` may raise anything.
    """
    try:
        text = repr(value)
    except Exception:
        return f"<{type(value).__name__} object>"
    return text if len(text) <= limit else f"{text[: limit - 3]}..."


def check_seconds(name: str, value: object, key: str | None = None) -> int:
    """Return ``value`` if it is a positive int of seconds, else raise.

    ``bool`` is refused although it is an ``int``: ``lease=True`` is a bug.
    """
    if type(value) is not int:
        raise InvalidArgumentTypeError(
            f"{name} must be a positive int of seconds, not {type(value).__name__} {describe(value)}", key=key
        )
    if not 0 < value <= MAX_SECONDS:
        raise InvalidArgumentError(
            f"{name} must be a positive int of seconds (at most {MAX_SECONDS}), not {describe(value)}", key=key
        )
    return value


def check_timeout(name: str, value: object, key: str | None = None) -> float:
    """Return ``value`` as float seconds if it is a number from 0 to ``MAX_SECONDS`` (not a bool), else raise.

    NaN, infinities and numbers too big for a float are refused: a deadline must exist.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidArgumentTypeError(
            f"{name} must be a number of seconds, not {type(value).__name__} {describe(value)}", key=key
        )
    if not 0 <= value <= MAX_SECONDS:  # also refuses NaN, infinities and ints past float's range
        raise InvalidArgumentError(
            f"{name} must be a number of seconds from 0 to {MAX_SECONDS}, not {describe(value)}", key=key
        )
    return float(value)


def _check_text(name: str, value: object, key: str | None = None) -> str:
    if type(value) is not str:
        raise InvalidArgumentTypeError(f"{name} must be a str, not {type(value).__name__} {describe(value)}", key=key)
    if not value:
        raise InvalidArgumentError(f"{name} must not be empty", key=key)
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:  # a lone surrogate
            raise InvalidArgumentError(
                f"{name} is not encodable as UTF-8 (a lone surrogate?): {describe(value)}", key=key
            ) from exc
    return value


def check_namespace(value: object) -> str:
    """Return a valid namespace: a non-empty str without braces."""
    namespace = _check_text("namespace", value)
    if "{" in namespace or "}" in namespace:
        # Braces would move the cluster hash tag away from the claim's own key.
        raise InvalidArgumentError(f"namespace must not contain braces: {describe(namespace)}")
    return namespace


def _remember_namespace(namespace: str) -> None:
    # Emptied rather than evicted one by one: cheap, and a hit never pays for the bound.
    if len(_NAMESPACES_SEEN) >= NAMESPACES_SEEN_MAX:
        _NAMESPACES_SEEN.clear()
    _NAMESPACES_SEEN.add(namespace)


def check_token(value: object) -> str:
    """Return a valid token: a non-empty str of printable characters without whitespace.

    The protocol's markers are refused too: a claim holding ``CLAIMED`` would read
    as a win, and one holding the done marker as completed work.
    """
    token = _check_text("token", value)
    # Every whitespace character but the space is also unprintable. The done
    # marker holds a space, so no token can start like it.
    if not token.isprintable() or " " in token:
        raise InvalidArgumentError(f"token must be printable and contain no whitespace: {describe(token)}")
    if token == CLAIMED:
        raise InvalidArgumentError(
            f"token {CLAIMED!r} is reserved: it is the protocol's winning reply, so a claim holding it "
            "would read as a win wherever the holder is reported"
        )
    return token


def check_value(value: object, key: str, *, text_only: bool = False, encoding: str = "utf-8") -> bytes | str:
    """Return a value ``complete()`` may store and a duplicate reads back equal, else raise.

    bytes or str, never ``CLAIMED``. A str must encode in the client's encoding
    (a lone surrogate never does); with ``text_only`` (a client that decodes
    replies) bytes must decode in it, or every duplicate would fail to read them.

    Args:
        value: What the caller wants to store.
        key: The handle's key, for the error.
        text_only: Whether the client decodes replies (``decode_responses=True``).
        encoding: The client's encoding (its ``Encoder.encoding``).
    """
    if type(value) is str:
        if encoding != "utf-8" or not value.isascii():
            try:
                value.encode(encoding)
            except UnicodeEncodeError as exc:
                raise InvalidArgumentError(
                    f"the result is not encodable as {encoding} (a lone surrogate?): {describe(value)}", key=key
                ) from exc
    elif type(value) is bytes:
        if text_only and (encoding != "utf-8" or not value.isascii()):
            try:
                value.decode(encoding)
            except UnicodeDecodeError as exc:
                raise InvalidArgumentError(
                    f"the result is not {encoding} text, and this client decodes replies (decode_responses=True): "
                    f"a duplicate could not read it; store str, or use a client without decode_responses: "
                    f"{describe(value)}",
                    key=key,
                ) from exc
    else:
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
    modes = ", ".join(map(repr, _NATIVE_MODES))
    if type(value) is not str:
        raise InvalidArgumentTypeError(f"native must be one of {modes}, not {type(value).__name__} {describe(value)}")
    if value not in _NATIVE_MODES:
        raise InvalidArgumentError(f"native must be one of {modes}, not {describe(value)}")
    return value  # type: ignore[return-value]  # one of the modes, checked just above


def check_replicas(replicas: object, timeout_ms: object) -> tuple[int, int]:
    """Return ``(replicas, timeout_ms)`` for WAIT: an int >= 0, and a positive int of milliseconds."""
    for name, value, low in (("replicas", replicas, 0), ("replica_timeout_ms", timeout_ms, 1)):
        if type(value) is not int:
            raise InvalidArgumentTypeError(f"{name} must be an int, not {type(value).__name__} {describe(value)}")
        if not low <= value <= MAX_SECONDS:
            raise InvalidArgumentError(f"{name} must be an int from {low} to {MAX_SECONDS}, not {describe(value)}")
    return replicas, timeout_ms  # type: ignore[return-value]  # both checked just above


def check_flags(**flags: object) -> None:
    """Check a door's or the decorator's switches: each ``True`` or ``False``, and no two that contradict.

    ``fail_open`` runs the work unclaimed while the server is out of reach; ``at_most_once``
    never runs it twice: together they would promise both.
    """
    for name, flag in flags.items():
        if type(flag) is not bool:
            raise InvalidArgumentTypeError(f"{name} must be True or False, not {describe(flag)}")
    if flags.get("fail_open") and flags.get("at_most_once"):
        raise InvalidArgumentError(
            "fail_open and at_most_once contradict each other: fail_open runs the work unclaimed while the "
            "server is out of reach, at_most_once never runs it twice; choose one"
        )
