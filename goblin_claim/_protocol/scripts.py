"""The Lua scripts and the native commands: what each operation sends, and the owner checks a server may have."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field, replace
from importlib import resources
from typing import Final

from .._errors import (
    NativeUnavailableError,
)
from .checks import NativeMode
from .record import CLAIMED

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
        owner_checks: The server's own commands that may do its job (owner checks,
            and the claim's ``SET ... NX GET``), best first (see ``owner_check``).
        went: The handle's slot where a driver records how a call of it went to the
            server (``"command"``, ``"native"`` or ``"script"``, ``_protocol.refusals``),
            for its event (``Event.path``): a claim's is kept apart from the other
            calls', as a decorated call's event reports its claim's whatever its store
            took. A driver sets it with ``setattr``, no call of its own on every round trip.
    """

    name: str
    source: str
    sha: str
    numkeys: int
    native: str | None = None
    owner_checks: tuple[str, ...] = ()
    went: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "went", "_claim_path" if self.name == "claim" else "_path")

    @classmethod
    def load(cls, name: str, numkeys: int, native: str | None = None, owner_checks: tuple[str, ...] = ()) -> Script:
        """Read ``lua/<name>.lua`` from the package and hash it once."""
        source = (resources.files(__package__) / "lua" / f"{name}.lua").read_text("utf-8")
        sha = hashlib.sha1(source.encode("utf-8"), usedforsecurity=False).hexdigest()
        return cls(name, source, sha, numkeys, native, owner_checks)


# Owner checks some servers have built in, needing no module and no scripting:
# DELIFEQ (Valkey 9.0) and DELEX ... IFEQ (Valkey 9.2, Redis 8.4) delete a key only
# while it holds a value, as release.lua does; SET ... IFEQ ... EX (Valkey 8.1,
# Redis 8.4) renews a lease only while the key holds the token, as extend.lua does,
# and stores a plain one-key record only while the key holds the token, as
# complete.lua does (a refusal is then told apart by one read: ClaimBase._store_verdict).
# The probe asks about the two delete commands. SET's IFEQ is an option, with no
# command of its own to ask about; it came with or before either of them, so a
# server with DELIFEQ or DELEX has it (Valkey 8.1 and 8.2, which have SET IFEQ but
# no DELIFEQ, keep the extend and complete scripts).
DELIFEQ: Final = "DELIFEQ"
DELEX: Final = "DELEX"
SET_IFEQ: Final = "SET IFEQ"  # a name in the probed set, not a command: inferred, never asked about
# SET ... NX GET ... EX (Redis 7.0, every Valkey) takes a claim or answers what the key
# holds, in one command: the claim of a plain one-key record, but for the lease left,
# which PTTL reads. Its NX with GET came in Redis 7.0, with PEXPIRETIME, which the probe
# asks about instead; an in-flight reply reads both beside GET, and PEXPIRETIME less PTTL
# is the server's clock, which an at-most-once record's deadline is read against
# (peek.lua reads TIME). Like SET IFEQ, inferred: a server that refuses it (a syntax
# error) costs one call, then the script.
SET_NX_GET: Final = "SET NX GET"
PEXPIRETIME: Final = "PEXPIRETIME"
# forget.lua deletes the record's keys and announces it: DEL, with the announcement
# pipelined behind it (sent whether or not it deleted). Every server has DEL; it is
# taken where SET ... NX GET is, so a server's own commands serve every operation of
# a plain handle, or none of them does.
DEL_KEYS: Final = "DEL"
BUILTIN_COMMANDS: Final = (DELIFEQ, DELEX, PEXPIRETIME)

CLAIM: Final = Script.load("claim", 2, native="GOBLIN.CLAIM")
# The claim of a plain one-key record (no fence, no WAIT, nothing owed beyond the
# claim): SET ... NX GET where the server has it, else as CLAIM.
CLAIM_ONE_KEY: Final = replace(CLAIM, owner_checks=(SET_NX_GET,))
# The claim behind a WAIT (replicas=): always the script, which rewrites a read-back for it.
CLAIM_WAITED: Final = replace(CLAIM, native=None)
# The same script with the fence counter as a third key; GOBLIN.CLAIM has no fences.
CLAIM_FENCED: Final = replace(CLAIM, numkeys=3, native=None)
COMPLETE: Final = Script.load("complete", 2)
# The store of a plain one-key record: SET ... IFEQ where the server has it.
COMPLETE_ONE_KEY: Final = replace(COMPLETE, owner_checks=(SET_IFEQ,))
# The same script with the fence counter as a third key: a late completion is then provable.
COMPLETE_FENCED: Final = replace(COMPLETE, numkeys=3)
# Renewals may be SET ... IFEQ; releases DELIFEQ (the cheaper delete), else DELEX.
EXTEND: Final = Script.load("extend", 1, owner_checks=(SET_IFEQ,))
RELEASE: Final = Script.load("release", 1, native="GOBLIN.CAD", owner_checks=(DELIFEQ, DELEX))
PEEK: Final = Script.load("peek", 2)
FORGET: Final = Script.load("forget", 2, owner_checks=(DEL_KEYS,))
CHECKPOINT: Final = Script.load("checkpoint", 2)
SCRIPTS: Final = (CLAIM, COMPLETE, EXTEND, RELEASE, PEEK, FORGET, CHECKPOINT)
NATIVE_COMMANDS: Final = tuple(s.native for s in SCRIPTS if s.native)
PROBED_COMMANDS: Final = NATIVE_COMMANDS + BUILTIN_COMMANDS

# An at-most-once record ("held <deadline> <claimed> <token>", claim.lua) is the scripts'
# alone: GOBLIN.CLAIM writes a bare token for the lease, and the native and built-in
# owner checks compare the whole value with the token. Its renewals and releases run the
# same scripts, never their replacements.
EXTEND_HELD: Final = replace(EXTEND, owner_checks=())
RELEASE_HELD: Final = replace(RELEASE, native=None, owner_checks=())


def keyed(script: Script, extra: int) -> Script:
    """``script`` with ``extra`` optional keys after its own (a fence counter, a checkpoint), always as a script."""
    numkeys = script.numkeys + extra
    found = _KEYED.get((script.name, numkeys))
    if found is None:
        found = _KEYED[script.name, numkeys] = replace(script, numkeys=numkeys, native=None)
    return found


_KEYED: dict[tuple[str, int], Script] = {}


def with_owner_checks(found: frozenset[str]) -> frozenset[str]:
    """``found`` (the probed commands a server has), with ``SET IFEQ`` and ``SET NX GET`` where they can be inferred."""
    if DELIFEQ in found or DELEX in found:
        found |= {SET_IFEQ}
    return found | {SET_NX_GET, DEL_KEYS} if PEXPIRETIME in found else found


def owner_check(mode: NativeMode, available: frozenset[str] | None, script: Script) -> str | None:
    """The server's own command a call sends instead of ``script`` (claim, complete, extend, release), or ``None``.

    Where the server has one it is preferred, in ``"auto"`` and ``"always"`` alike:
    it answers as the script does and costs the server least. ``"never"`` means the
    scripts, always.
    """
    if mode == "never" or not available:
        return None
    for name in script.owner_checks:
        if name in available:
            return name
    return None


def owner_check_command(
    name: str, args: tuple[str | bytes | int, ...], script: Script | None = None
) -> tuple[str | bytes | int, ...]:
    """The command of owner check ``name`` for the arguments of ``script`` (extend's or release's by default).

    ``SET claim_key token IFEQ token EX seconds`` writes the value the key holds
    already, so it only renews the lease, as ``EXPIRE`` in extend.lua does; it
    answers OK where the script answers 1, nil where it answers 0. For complete
    (``script``), ``SET claim_key "<marker> <value>" IFEQ token EX ttl`` stores the
    record (the handle sends it only with an ASCII token when the value is bytes: the
    marker is then its own bytes in any encoding). ``SET claim_key token NX GET EX
    lease`` is the claim (see ``owner_check_reply``); ``DEL`` of ``script``'s keys, forget.
    """
    if name == DEL_KEYS:
        return ("DEL", *args[: script.numkeys if script is not None else 2])
    if name == SET_NX_GET:
        key, _result_key, token, seconds = args[:4]
        return ("SET", key, token, "NX", "GET", "EX", seconds)
    if name == SET_IFEQ:
        if script is not None and script.name == "complete":
            key, _result_key, token, stored, ttl, marker = args[:6]
            head = f"{marker!s} "
            record = head + stored if isinstance(stored, str) else head.encode("ascii") + bytes(stored)
            return ("SET", key, record, "IFEQ", token, "EX", ttl)
        key, token, seconds = args[:3]
        return ("SET", key, token, "IFEQ", token, "EX", seconds)
    key, token = args[:2]
    return (DELIFEQ, key, token) if name == DELIFEQ else (DELEX, key, "IFEQ", token)


def owner_check_reply(name: str, script: Script, reply: object) -> object:
    """An owner check's reply as its script would answer, where they differ.

    ``SET ... NX GET`` answers nil when it took the claim (``CLAIMED``), else what the
    key held: the record, or a token (in flight: the lease left is read beside it,
    or after it). complete's ``SET ... IFEQ`` answers OK when it stored (1) and nil
    when it did not, which only a read can tell apart (``None`` here).
    """
    if name == SET_NX_GET:
        return CLAIMED if reply is None else reply
    if name == SET_IFEQ and script.name == "complete":
        return 1 if reply else None
    return reply


def script_command(
    script: Script, args: tuple[str | bytes | int, ...], *, source: bool = False
) -> tuple[str | bytes | int, ...]:
    """``script`` as one command for a pipeline: EVALSHA, or EVAL of its text (``source``).

    The text is for a server that lost its script cache.
    """
    if source:
        return ("EVAL", script.source, script.numkeys, *args)
    return ("EVALSHA", script.sha, script.numkeys, *args)


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
