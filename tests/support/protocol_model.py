"""A pure-Python model of the protocol: its two commands, written from the seed alone, and the SDK's scripts.

``GOBLIN.CLAIM claim_key result_key token seconds``: ``SET claim_key token NX EX
seconds``, replying ``CLAIMED`` when that set the key and ``GET result_key``
otherwise; ``GOBLIN.CAD key value``: delete ``key`` only while it holds ``value``.
Beside them the lease renewal (extend.lua, or Valkey's ``SET ... IFEQ ... EX``):
renew ``key`` only while it holds the token. The conformance suite and the
stateful test hold the module, the seed's Lua, the fakeredis plug-in and Valkey's
built-in owner checks to this model. Replies are compared as ``Reply`` values, errors
by kind (Redis 7 suffixes errors raised inside scripts; fakeredis words some
differently), so ``error_kind`` maps a message to the kind it names.

``Model.script`` runs the SDK's scripts (``goblin_claim/_protocol/lua``) as the server
runs them, from what each one's header says: the one-key record, its at-most-once
form ``held <deadline_ms> <claimed_ms> <token>`` (interrupted once the deadline passes
without a result), the fence counter and the checkpoint key. Replies come back as
redis-py reads a script's reply over RESP2 (bytes, ints, ``None`` for Lua's false,
lists); a write made before an error stays made, as a script's does.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Union

__all__ = [
    "ERROR_KINDS",
    "Entry",
    "Error",
    "Model",
    "Reply",
    "ScriptReply",
    "error_kind",
    "replies_agree",
    "values_agree",
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
# A script's reply: a Reply, or a list of them (nested for a checkpoint).
ScriptReply = Union[Reply, list["ScriptReply"]]  # noqa: UP007


class _WrongType(Exception):
    """A command inside a script met a key of another type: the script stops with WRONGTYPE."""


# An at-most-once record: "held <deadline_ms> <claimed_ms> <token>" (claim.lua).
_HELD = re.compile(rb"held (\d+) (\d+) (.+)", re.DOTALL)
_DONE = b"done "
# A fence: the server clock in microseconds, or a count up from one.
_FENCE_DIGITS = re.compile(rb"[0-9]{15,}")


def _close(a: int, b: int) -> bool:
    """Two integers of a reply or a record that may differ by the clocks that made them.

    Exact for small ones (a reply code, a counter); within 2 s for milliseconds (a
    lease left, a claim time) and for a fence made of the clock in microseconds.
    """
    if a == b:
        return True
    largest = max(abs(a), abs(b))
    if largest >= 10**14:  # microseconds since the epoch: a fence from the clock
        return abs(a - b) <= 2_000_000
    if largest >= 50 and (a > 0) == (b > 0):  # milliseconds: left, or since the epoch
        return abs(a - b) <= 2000
    return False


def values_agree(a: object, b: object) -> bool:
    """Two stored values alike: equal, or a held record or a fence whose clock readings are close."""
    if a == b:
        return True
    if isinstance(a, bytes) and isinstance(b, bytes):
        held_a, held_b = _HELD.fullmatch(a), _HELD.fullmatch(b)
        if held_a and held_b:
            return held_a[3] == held_b[3] and all(_close(int(held_a[i]), int(held_b[i])) for i in (1, 2))
        if _FENCE_DIGITS.fullmatch(a) and _FENCE_DIGITS.fullmatch(b):
            return _close(int(a), int(b))
    return False


def replies_agree(a: object, b: object) -> bool:
    """Two script replies alike: the same shape and values, clock readings within ``_close``."""
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(replies_agree(x, y) for x, y in zip(a, b, strict=True))
    if type(a) is int and type(b) is int:
        return _close(a, b)
    return values_agree(a, b)


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

    # -- the SDK's scripts (goblin_claim/_protocol/lua), one-key record and two keys

    def script(self, name: str, keys: Sequence[bytes | str], args: Sequence[bytes | str | int]) -> ScriptReply:
        """Run the SDK script ``name`` (claim, complete, extend, release, peek, forget, checkpoint)."""
        run = getattr(self, f"_script_{name}")
        try:
            return run([_as_bytes(key) for key in keys], [_as_bytes(arg) for arg in args])  # type: ignore[no-any-return]
        except _WrongType:
            return Error("WRONGTYPE")

    def _get(self, key: bytes) -> bytes | None:
        """``redis.call("get", key)``: WRONGTYPE stops the script."""
        found = self.entry(key)
        if found is None:
            return None
        if found.type != "string":
            raise _WrongType
        return found.value  # type: ignore[return-value]

    def _pget(self, key: bytes) -> bytes | None:
        """``redis.pcall("get", key)`` read as the scripts read it: a non-string is no string."""
        found = self.entry(key)
        return found.value if found is not None and found.type == "string" else None  # type: ignore[return-value]

    def _pttl(self, key: bytes) -> int:
        return int(self.ttl_ms(key))

    def _ms(self) -> int:
        """``TIME`` as the scripts read it: milliseconds."""
        return int(self.clock())

    def _set_keepttl(self, key: bytes, value: bytes) -> None:
        found = self.entry(key)
        expire_at = found.expire_at if found is not None else None
        self.keys[key] = Entry("string", value, expire_at)

    @staticmethod
    def _number(value: bytes | None) -> int | None:
        """Lua's ``tonumber`` of a stored value (the SDK's are integers or nothing)."""
        if value is None or not _INTEGER.fullmatch(value):
            return None
        return int(value)

    def _script_claim(self, keys: list[bytes], args: list[bytes]) -> ScriptReply:
        token, lease = args[0], int(args[1])
        checkpoint_key = keys[-1] if len(args) > 5 and args[5] == b"checkpoint" else None
        fence_key = keys[2] if len(keys) > 2 and keys[2] != checkpoint_key else None
        keep = self._number(args[4]) if len(args) > 4 else None
        counter: int | None = None
        now: int | None = None  # the clock in microseconds, once read
        if fence_key is not None:
            counter = self._number(self._get(fence_key))
            if counter is None:
                now = int(self.clock() * 1000)
        saved = self._get(checkpoint_key) if checkpoint_key is not None else None
        record, expiry = token, lease
        if keep is not None:
            now = now if now is not None else int(self.clock() * 1000)
            at = now // 1000
            record = b"held %d %d %s" % (at + lease * 1000, at, token)
            expiry = keep
        if self.entry(keys[0]) is None:  # SET NX: any type holds it
            self.set(keys[0], record, expiry * 1000)
            fence: int | None = None
            if fence_key is not None:
                fence = counter + 1 if counter is not None else now
                self.set(fence_key, b"%d" % fence, int(args[2]) * 1000)  # type: ignore[str-format]
            if checkpoint_key is not None:
                return [b"CLAIMED", fence, [saved] if saved is not None else []]
            return b"CLAIMED" if fence_key is None else [b"CLAIMED", fence]
        result = self._get(keys[1])
        if result is not None and keys[0] == keys[1] and not result.startswith(_DONE):
            result = None
        if result is not None:
            return result
        holder = self._pget(keys[0])
        if holder is None:
            return []
        held = _HELD.fullmatch(holder)
        own = (held[3] if held else holder) == token
        clock = now // 1000 if now is not None else None
        if checkpoint_key is not None and own:
            if held:
                left: int | None = int(held[1]) - (clock if clock is not None else self._ms())
            else:
                left = self._pttl(keys[0])
            return [
                held[3] if held else holder, left, counter, int(held[2]) if held else None,
                [saved] if saved is not None else [],
            ]  # fmt: skip
        if held:
            return [held[3], int(held[1]) - (clock if clock is not None else self._ms()), counter, int(held[2])]
        if fence_key is None:
            return [holder, self._pttl(keys[0])]
        return [holder, self._pttl(keys[0]), counter]

    def _script_peek(self, keys: list[bytes], args: list[bytes]) -> ScriptReply:
        del args
        result = self._get(keys[1])
        if result is not None and keys[0] == keys[1] and not result.startswith(_DONE):
            result = None
        if result is not None:
            return result
        holder = self._pget(keys[0])
        if holder is None:
            return []
        held = _HELD.fullmatch(holder)
        if held:
            return [held[3], int(held[1]) - self._ms(), None, int(held[2])]
        return [holder, self._pttl(keys[0])]

    def _script_complete(self, keys: list[bytes], args: list[bytes]) -> ScriptReply:
        token, value, ttl, marker = args[0], args[1], int(args[2]), args[3]
        checkpoint_key = keys[-1] if len(args) > 7 and args[7] == b"checkpoint" else None
        fence_key = keys[2] if len(keys) > 2 and keys[2] != checkpoint_key else None
        wait = len(args) > 6 and args[6] == b"wait"

        def refuse(code: int, held: bytes | None) -> ScriptReply:
            if wait:
                if held is not None:
                    self._set_keepttl(keys[0], held)
                else:
                    self.delete(keys[0])
            return [0, held] if code == 0 else code

        def refused(held: bytes | None) -> int | None:
            counter = self._number(self._get(fence_key)) if fence_key is not None else None
            fence = self._number(args[5]) if fence_key is not None and len(args) > 5 else None
            if counter is not None and fence is not None and counter != fence:
                return 0
            if held is None and not (counter is not None and fence is not None):
                return 3
            return None

        if keys[0] == keys[1]:
            raw = self._get(keys[0])
            held = raw
            mine = marker + b" "
            parts = _HELD.fullmatch(held) if held is not None else None
            if parts and parts[3] == token:
                held = token  # this token's at-most-once attempt
            if held is not None and held != token:
                if not held.startswith(mine):
                    return refuse(0, held)
                if held[len(mine) :] == value:
                    self._set_keepttl(keys[0], held)
                    return 1
                return refuse(2, held)
            refusal = refused(held)
            if refusal is not None:
                return refuse(refusal, raw)
            self.set(keys[0], mine + value, ttl * 1000)
            if fence_key is not None:
                self.delete(fence_key)
            if checkpoint_key is not None:
                self.delete(checkpoint_key)
            return 1
        holder = self._get(keys[0])
        if holder != token and holder != marker and holder is not None:
            return refuse(0, holder)
        stored = self._get(keys[1])
        if holder == marker and stored is not None:
            if stored == value:
                self._set_keepttl(keys[0], holder)
                return 1
            return refuse(2, holder)
        if holder is None and stored is not None:
            return refuse(0, holder)
        if holder != marker:
            refusal = refused(holder)
            if refusal is not None:
                return refuse(refusal, holder)
        self.set(keys[1], value, ttl * 1000)
        self.set(keys[0], marker, ttl * 1000)
        return 1

    def _script_extend(self, keys: list[bytes], args: list[bytes]) -> ScriptReply:
        token, seconds = args[0], int(args[1])
        held = self._get(keys[0])
        if held == token:
            found = self.entry(keys[0])
            assert found is not None
            found.expire_at = self.clock() + seconds * 1000
            return 1
        parts = _HELD.fullmatch(held) if held is not None else None
        if parts is None:
            return 0
        now = self._ms()
        if parts[3] != token or int(parts[1]) <= now:
            return 0
        lease = seconds * 1000
        record = b"held %d %s %s" % (now + lease, parts[2], parts[3])
        if self._pttl(keys[0]) < lease:
            self.set(keys[0], record, lease)
        else:
            self._set_keepttl(keys[0], record)
        return 1

    def _script_release(self, keys: list[bytes], args: list[bytes]) -> ScriptReply:
        token = args[0]
        held = self._get(keys[0])
        parts = _HELD.fullmatch(held) if held is not None else None
        if held != token and not (parts and parts[3] == token):
            return 0
        self.delete(keys[0])
        return 1

    def _script_forget(self, keys: list[bytes], args: list[bytes]) -> ScriptReply:
        del args
        return sum(self.delete(key) for key in keys)

    def _script_checkpoint(self, keys: list[bytes], args: list[bytes]) -> ScriptReply:
        token, value, ttl = args[0], args[1], int(args[2])
        held = self._get(keys[0])
        if held != token:
            parts = _HELD.fullmatch(held) if held is not None else None
            if parts is None or parts[3] != token or int(parts[1]) <= self._ms():
                return 0
        if len(keys) > 2:
            counter = self._number(self._get(keys[2]))
            fence = self._number(args[3]) if len(args) > 3 else None
            if counter is not None and fence is not None and counter != fence:
                return 0
        self.set(keys[1], value, ttl * 1000)
        return 1
