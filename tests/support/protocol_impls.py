"""The protocol's implementations behind one small interface, for the conformance and stateful tests.

- the reference module (``GOBLIN.CLAIM`` / ``GOBLIN.CAD`` on a redis-server that loaded it),
- the seed's own Lua script (and the scripted CAD) on a stock redis-server,
- a server's built-in owner checks (Valkey 9's ``DELIFEQ`` for CAD, ``SET ... IFEQ ...
  EX`` for the lease renewal; the claim is the seed's script there),
- a server's own claim of the one-key record, ``SET key token NX GET EX seconds``
  (Redis 7.0 and later, Valkey, fakeredis), read as the SDK reads it: nil is ``CLAIMED``,
  anything else what the key held (two keys: the seed's script),
- the fakeredis plug-in (``goblin_claim.testing.fake_redis(native=True)``),
- the pure-Python model (``tests/support/protocol_model.py``).

Each runs a command ("claim", "cad", or "extend": the SDK's lease renewal) in a
context ("direct", inside MULTI/EXEC, or from a script with ``redis.call``),
arranges keys, and reports what a key holds. Replies come back as ``Reply``
values, errors by kind; a renewal's OK / nil as 1 / 0, as the SDK reads them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import redis

from goblin_claim._protocol.scripts import EXTEND, RELEASE
from tests.support.protocol_model import Error, Model, Reply, error_kind

__all__ = [
    "CALL_CAD",
    "CALL_CLAIM",
    "CALL_DELIFEQ",
    "CALL_SET_IFEQ",
    "CALL_SET_NX_GET",
    "CONTEXTS",
    "SCRIPT_CAD",
    "SCRIPT_EXTEND",
    "SEED_CLAIM",
    "ClientImpl",
    "Look",
    "ModelImpl",
]

# The seed's script, verbatim: the Lua form of GOBLIN.CLAIM on stock Redis.
SEED_CLAIM = """\
if redis.call("set", KEYS[1], ARGV[1], "NX", "EX", ARGV[2]) then
  return "CLAIMED"
end
return redis.call("get", KEYS[2])
"""
# The scripted GOBLIN.CAD is the SDK's release script: held to the same cases.
SCRIPT_CAD = RELEASE.source
# The native commands, called from a script.
CALL_CLAIM = "return redis.call('GOBLIN.CLAIM', KEYS[1], KEYS[2], ARGV[1], ARGV[2])"
CALL_CAD = "return redis.call('GOBLIN.CAD', KEYS[1], ARGV[1])"
# The lease renewal is the SDK's extend script, where the server has no built-in check.
SCRIPT_EXTEND = EXTEND.source
# The built-in owner checks, called from a script.
CALL_DELIFEQ = "return redis.call('DELIFEQ', KEYS[1], ARGV[1])"
# The server's own claim of the one-key record, called from a script (nil comes back as false).
CALL_SET_NX_GET = "return redis.call('SET', KEYS[1], ARGV[1], 'NX', 'GET', 'EX', ARGV[2])"
CALL_SET_IFEQ = "return redis.call('SET', KEYS[1], ARGV[1], 'IFEQ', ARGV[1], 'EX', ARGV[2])"

CONTEXTS = ("direct", "multi", "eval")


def _reply(call: Any) -> Reply:
    try:
        value = call()
    except redis.ResponseError as exc:
        return Error(error_kind(str(exc)))
    if isinstance(value, list):  # MULTI/EXEC: one command's reply, or its error
        (value,) = value
        if isinstance(value, redis.ResponseError):
            return Error(error_kind(str(value)))
    return value  # type: ignore[no-any-return]


def _renewed(reply: Reply) -> Reply:
    """SET ... IFEQ's reply as the SDK reads a renewal: OK (True through redis-py) 1, nil 0."""
    if reply is True or reply == b"OK":
        return 1
    return 0 if reply is None else reply


@dataclass
class Look:
    """What a key holds: its type, its value and its remaining life in ms (-1 none, -2 absent)."""

    type: str
    value: object
    ttl_ms: float

    def agrees(self, other: Look) -> bool:
        """Same type and value, and the same TTL within two seconds (clocks and rounding differ)."""
        if (self.type, self.value) != (other.type, other.value):
            return False
        if self.ttl_ms < 0 or other.ttl_ms < 0:
            return self.ttl_ms == other.ttl_ms
        return abs(self.ttl_ms - other.ttl_ms) <= 2000


class ClientImpl:
    """An implementation reached through a redis-py client: the module, the seed's script, the plug-in, or built-ins.

    Args:
        name: For assertion messages.
        client: A sync client (bytes replies).
        native: Send GOBLIN.CLAIM / GOBLIN.CAD; else run the scripted forms.
        builtin: Send the server's own owner checks for CAD (DELIFEQ) and the
            renewal (SET ... IFEQ ... EX), whatever ``native`` says of the claim.
        own_claim: Claim one key (claim key = result key) with the server's own
            ``SET ... NX GET EX``, as the SDK does, its nil read as ``CLAIMED``.
    """

    def __init__(
        self, name: str, client: redis.Redis, native: bool, builtin: bool = False, own_claim: bool = False
    ) -> None:
        self.name = name
        self.client = client
        self.native = native
        self.builtin = builtin
        self.own_claim = own_claim

    def arrange(self, op: tuple[Any, ...]) -> None:
        """Apply one setup step: ("set", key, value[, px]) or ("hset", key) (a hash replaces the key)."""
        if op[0] == "set":
            self.client.set(op[1], op[2], px=op[3] if len(op) > 3 and op[3] is not None else None)
        else:
            self.client.delete(op[1])
            self.client.hset(op[1], "field", "value")

    def delete(self, key: bytes) -> None:
        """``DEL key``."""
        self.client.delete(key)

    def expire_soon(self, key: bytes) -> None:
        """``PEXPIRE key 1``: the key lapses a millisecond from now (sleep past it before reading)."""
        self.client.pexpire(key, 1)

    def run(self, command: str, context: str, args: Sequence[bytes]) -> Reply:
        """``command`` ("claim", "cad" or "extend") with ``args``, in ``context``."""
        if command == "extend" or (command == "cad" and self.builtin):
            return self._run_owner_check(command, context, args)
        if command == "claim" and self.own_claim and args[0] == args[1]:
            return self._run_set_nx_get(context, args)
        numkeys = 2 if command == "claim" else 1
        native = "GOBLIN.CLAIM" if command == "claim" else "GOBLIN.CAD"
        if not self.native:
            # The scripted forms are scripts already: "direct" and "eval" are the same call.
            script = SEED_CLAIM if command == "claim" else SCRIPT_CAD
            if context == "multi":
                return _reply(lambda: self._multi(lambda pipe: pipe.eval(script, numkeys, *args)))
            return _reply(lambda: self.client.eval(script, numkeys, *args))
        if context == "direct":
            return _reply(lambda: self.client.execute_command(native, *args))
        if context == "multi":
            return _reply(lambda: self._multi(lambda pipe: pipe.execute_command(native, *args)))
        call = CALL_CLAIM if command == "claim" else CALL_CAD
        return _reply(lambda: self.client.eval(call, numkeys, *args))

    def _run_owner_check(self, command: str, context: str, args: Sequence[bytes]) -> Reply:
        """A renewal or a CAD: the built-in command where ``builtin``, else the SDK's script (extend.lua)."""
        if not self.builtin:  # the renewal has no module command: the script, in every context
            if context == "multi":
                return _reply(lambda: self._multi(lambda pipe: pipe.eval(SCRIPT_EXTEND, 1, *args)))
            return _reply(lambda: self.client.eval(SCRIPT_EXTEND, 1, *args))
        if command == "cad":
            native: tuple[bytes | str, ...] = ("DELIFEQ", *args)
            call = CALL_DELIFEQ
        else:
            key, token, seconds = args
            native = ("SET", key, token, "IFEQ", token, "EX", seconds)
            call = CALL_SET_IFEQ
        if context == "direct":
            reply = _reply(lambda: self.client.execute_command(*native))
        elif context == "multi":
            reply = _reply(lambda: self._multi(lambda pipe: pipe.execute_command(*native)))
        else:
            reply = _reply(lambda: self.client.eval(call, 1, *args))
        return _renewed(reply) if command == "extend" else reply

    def _run_set_nx_get(self, context: str, args: Sequence[bytes]) -> Reply:
        """``SET key token NX GET EX seconds``: its nil (or a script's false) as ``CLAIMED``, as the SDK reads it."""
        key, _result, token, seconds = args
        command = ("SET", key, token, "NX", "GET", "EX", seconds)
        if context == "direct":
            reply = _reply(lambda: self.client.execute_command(*command, get=True))
        elif context == "multi":
            reply = _reply(lambda: self._multi(lambda pipe: pipe.execute_command(*command, get=True)))
        else:
            reply = _reply(lambda: self.client.eval(CALL_SET_NX_GET, 1, key, token, seconds))
        return b"CLAIMED" if reply is None else reply

    def _multi(self, queue: Any) -> list[Any]:
        pipe = self.client.pipeline(transaction=True)
        queue(pipe)
        return pipe.execute(raise_on_error=False)

    def look(self, keys: Sequence[bytes]) -> list[Look]:
        """Each key's type, value and TTL, in one round trip."""
        pipe = self.client.pipeline(transaction=False)
        for key in keys:
            pipe.type(key)
            pipe.get(key)
            pipe.hgetall(key)
            pipe.pttl(key)
        replies = pipe.execute(raise_on_error=False)
        looks = []
        for index in range(0, len(replies), 4):
            kind, text, table, ttl = replies[index : index + 4]
            kind = kind.decode() if isinstance(kind, bytes) else kind
            value = text if kind == "string" else table if kind == "hash" else None
            looks.append(Look(kind, value, float(ttl)))
        return looks


class ModelImpl:
    """The pure-Python model, behind the same interface."""

    name = "model"

    def __init__(self) -> None:
        self.model = Model()

    def arrange(self, op: tuple[Any, ...]) -> None:
        """Apply one setup step, as ``ClientImpl.arrange``."""
        if op[0] == "set":
            self.model.set(op[1], op[2], op[3] if len(op) > 3 else None)
        else:
            self.model.delete(op[1])
            self.model.hset(op[1], "field", "value")

    def delete(self, key: bytes) -> None:
        """``DEL key``."""
        self.model.delete(key)

    def expire_soon(self, key: bytes) -> None:
        """The key lapses a millisecond from now."""
        entry = self.model.entry(key)
        if entry is not None:
            entry.expire_at = self.model.clock() + 1

    def run(self, command: str, context: str, args: Sequence[bytes]) -> Reply:
        """The model has no MULTI or scripts: every context is the same call."""
        del context
        if command == "extend":
            return self.model.extend(*args)
        return self.model.claim(*args) if command == "claim" else self.model.cad(*args)

    def look(self, keys: Sequence[bytes]) -> list[Look]:
        """Each key's type, value and TTL."""
        looks = []
        for key in keys:
            entry = self.model.entry(key)
            if entry is None:
                looks.append(Look("none", None, -2))
            else:
                looks.append(Look(entry.type, entry.value, self.model.ttl_ms(key)))
        return looks
