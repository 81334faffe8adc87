"""A pure-Python model of the protocol's two commands, written from the seed alone.

``GOBLIN.CLAIM claim_key result_key token seconds``: ``SET claim_key token NX EX
seconds``, replying ``CLAIMED`` when that set the key and ``GET result_key``
otherwise; ``GOBLIN.CAD key value``: delete ``key`` only while it holds ``value``.
Beside them the lease renewal (extend.lua, or Valkey's ``SET ... IFEQ ... EX``):
renew ``key`` only while it holds the token. The conformance suite and the
stateful test hold the module, the seed's Lua, the fakeredis plug-in and Valkey's
built-in owner checks to this model. Replies are compared as ``Reply`` values, errors
by kind (Redis 7 suffixes errors raised inside scripts; fakeredis words some
differently), so ``error_kind`` maps a message to the kind it names.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Union

__all__ = [
    "ERROR_KINDS",
    "Entry",
    "Error",
    "Model",
    "Reply",
    "error_kind",
]

LLONG_MAX = 2**63 - 1

# The error kinds of the protocol, each named by a fragment every implementation's
# message contains (Redis, Redis inside a script, fakeredis).
ERROR_KINDS = {
    "WRONGTYPE": "WRONGTYPE",
    "not an integer": "not an integer or out of range",
    "invalid expire": "invalid expire time",
    "arity": "wrong number of arguments",
}


def error_kind(message: str) -> str:
    """The kind of error ``message`` names, or the message itself when it names none."""
    for kind, fragment in ERROR_KINDS.items():
        if fragment in message:
            return kind
    return message


@dataclass(frozen=True)
class Error:
    """An error reply, by kind."""

    kind: str


Reply = Union[bytes, int, None, Error]  # noqa: UP007 -- a run-time alias on 3.10


@dataclass
class Entry:
    """One key: its type, its value (bytes for a string), and its absolute expiry in ms (or None)."""

    type: str
    value: object
    expire_at: float | None = None


# Redis's string2ll: no sign but '-', no spaces, no leading zeros, within a long long.
_INTEGER = re.compile(rb"0|-?[1-9][0-9]*")


def _as_bytes(value: bytes | str | int) -> bytes:
    if isinstance(value, bytes):
        return value
    return str(value).encode()


@dataclass
class Model:
    """The keyspace and the two commands; ``clock`` gives milliseconds since the epoch."""

    clock: Callable[[], float] = field(default=lambda: time.time() * 1000)
    keys: dict[bytes, Entry] = field(default_factory=dict)

    # -- the keyspace, lazily expired as Redis does on every access

    def entry(self, key: bytes | str) -> Entry | None:
        """The live entry at ``key``; an elapsed one is removed first."""
        name = _as_bytes(key)
        found = self.keys.get(name)
        if found is not None and found.expire_at is not None and found.expire_at < self.clock():  # as Redis: now > when
            del self.keys[name]
            return None
        return found

    def set(self, key: bytes | str, value: bytes | str, ttl_ms: float | None = None) -> None:
        """``SET key value [PX ttl_ms]``."""
        expire_at = None if ttl_ms is None else self.clock() + ttl_ms
        self.keys[_as_bytes(key)] = Entry("string", _as_bytes(value), expire_at)

    def hset(self, key: bytes | str, name: bytes | str, value: bytes | str) -> None:
        """``HSET key name value`` (a key of another type, for WRONGTYPE)."""
        found = self.entry(key)
        if found is None:
            found = self.keys[_as_bytes(key)] = Entry("hash", {})
        assert found.type == "hash"
        found.value[_as_bytes(name)] = _as_bytes(value)  # type: ignore[index]

    def delete(self, key: bytes | str) -> int:
        """``DEL key``."""
        return 0 if self.entry(key) is None else int(self.keys.pop(_as_bytes(key)) is not None)

    def ttl_ms(self, key: bytes | str) -> float:
        """``PTTL key``: -2 when absent, -1 without an expiry."""
        found = self.entry(key)
        if found is None:
            return -2
        if found.expire_at is None:
            return -1
        return found.expire_at - self.clock()

    # -- the commands

    def claim(self, *args: bytes | str | int) -> Reply:
        """``GOBLIN.CLAIM claim_key result_key token seconds``."""
        if len(args) != 4:
            return Error("arity")
        claim_key, result_key, token, seconds = (_as_bytes(arg) for arg in args)
        # SET ... EX checks the expiry first, so a bad one fails even when the claim is held.
        if not _INTEGER.fullmatch(seconds) or not -LLONG_MAX - 1 <= int(seconds) <= LLONG_MAX:
            return Error("not an integer")
        now = self.clock()
        lease = int(seconds)
        if lease <= 0 or lease > LLONG_MAX // 1000 or lease * 1000 + int(now) > LLONG_MAX:
            return Error("invalid expire")
        if self.entry(claim_key) is None:  # NX tests existence only: any type holds the claim
            self.keys[claim_key] = Entry("string", token, now + lease * 1000)
            return b"CLAIMED"
        result = self.entry(result_key)
        if result is None:
            return None
        if result.type != "string":
            return Error("WRONGTYPE")
        return result.value  # type: ignore[return-value]  # bytes for a string

    def cad(self, *args: bytes | str | int) -> Reply:
        """``GOBLIN.CAD key value``."""
        if len(args) != 2:
            return Error("arity")
        key, value = (_as_bytes(arg) for arg in args)
        found = self.entry(key)
        if found is None:
            return 0
        if found.type != "string":
            return Error("WRONGTYPE")
        if found.value != value:
            return 0
        del self.keys[key]
        return 1

    def extend(self, *args: bytes | str | int) -> Reply:
        """extend.lua, or ``SET key token IFEQ token EX seconds`` read as the SDK reads it: 1 renewed, 0 not held.

        ``seconds`` is a positive int of seconds: the SDK checks it before sending
        (extend.lua's EXPIRE would delete the key at 0, where SET refuses it).
        """
        if len(args) != 3:
            return Error("arity")
        key, token, seconds = (_as_bytes(arg) for arg in args)
        found = self.entry(key)
        if found is None:
            return 0
        if found.type != "string":
            return Error("WRONGTYPE")
        if found.value != token:
            return 0
        found.expire_at = self.clock() + int(seconds) * 1000
        return 1
