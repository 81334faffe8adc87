"""Every decision of a claim, with no I/O and no redis import.

The sync and async drivers (``_sync.py``, ``_async.py``) only move bytes: they
ask this module what to send, send it, and ask it what the reply means. Keeping
the rules here means one place to read, and unit tests that need no server.
"""

from __future__ import annotations

import hashlib
import inspect
import itertools
import os
import random
import secrets
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from importlib import resources
from typing import Any, ClassVar, Final, Generic, Literal, TypeVar, Union, cast

from ._errors import (
    ClaimLostError,
    InvalidArgumentError,
    InvalidArgumentTypeError,
    NativeUnavailableError,
    NotReplicatedError,
    ResultLostError,
    StillInFlightError,
)
from ._outcomes import Claimed, Completed, InFlight

Outcome = Union[Claimed, Completed, InFlight]  # noqa: UP007 -- a run-time alias on 3.10

__all__ = [
    "ANY_CLIENT",
    "ASYNC_NEEDS",
    "BUILTIN_COMMANDS",
    "CLAIM",
    "CLAIMED",
    "CLAIM_FENCED",
    "COMPLETE",
    "COMPLETE_FENCED",
    "DELEX",
    "DELIFEQ",
    "EXTEND",
    "FORGET",
    "NATIVE_COMMANDS",
    "PEEK",
    "PROBED_COMMANDS",
    "RELEASE",
    "SCRIPTS",
    "SET_IFEQ",
    "SYNC_NEEDS",
    "ClaimBase",
    "NativeMode",
    "Script",
    "Stored",
    "WaitSchedule",
    "adapted",
    "check_seconds",
    "native_command",
    "owner_check",
    "owner_check_command",
    "script_command",
    "with_owner_checks",
]

DEFAULT_NAMESPACE: Final = "goblin"

NativeMode = Literal["auto", "never", "always"]
_NATIVE_MODES: Final = ("auto", "never", "always")

CLAIMED: Final = "CLAIMED"
_CLAIMED_REPLIES: Final = (CLAIMED.encode(), CLAIMED)
# Outcomes from a dict of their fields, as Claimed(**fields) makes them (validated).
_claimed_outcome: Final[Callable[[dict[str, Any]], Claimed]] = Claimed.__pydantic_validator__.validate_python
_completed_outcome: Final[Callable[[dict[str, Any]], Completed]] = Completed.__pydantic_validator__.validate_python


class Stored:
    """A completed record's stored value, without the ``Completed`` model around it.

    For a caller that only reads the value and never hands the outcome on (the
    decorator's duplicate): validating a ``Completed`` is most of what reading a
    short record costs.
    """

    __slots__ = ("value",)

    def __init__(self, value: bytes | str) -> None:
        self.value = value


# A lease or ttl above this is refused: Redis rejects expiries that overflow its
# millisecond clock, and no real claim needs to be held for longer than ~68 years.
MAX_SECONDS: Final = 2**31 - 1

# Namespaces already validated: most services use one or two, on every request.
# Bounded: a service minting namespaces (one per tenant, say) empties the set when
# it passes the limit and revalidates, so a hit stays one set lookup.
_NAMESPACES_SEEN: set[str] = set()
NAMESPACES_SEEN_MAX: Final = 4096

# What complete() leaves in claim_key. It contains a space, which no token may
# contain, so a completed claim never matches an owner check.
DONE_PREFIX: Final = "done "
_DONE_PREFIXES: Final = (DONE_PREFIX.encode(), DONE_PREFIX)  # as bytes and as str

# What the fence counter's key adds to the record's (fencing=True).
FENCE_SUFFIX: Final = ":fence"

# complete.lua's replies.
_STORED: Final = 1
_COMPLETED_OTHERWISE: Final = 2
_UNPROVEN: Final = 3  # claim_key empty, and nothing shows that nobody claimed it since


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
# The same script with the fence counter as a third key; GOBLIN.CLAIM has no fences.
CLAIM_FENCED: Final = replace(CLAIM, numkeys=3, native=None)
COMPLETE: Final = Script.load("complete", 2)
# The same script with the fence counter as a third key: a late completion is then provable.
COMPLETE_FENCED: Final = replace(COMPLETE, numkeys=3)
EXTEND: Final = Script.load("extend", 1)
RELEASE: Final = Script.load("release", 1, native="GOBLIN.CAD")
PEEK: Final = Script.load("peek", 2)
FORGET: Final = Script.load("forget", 2)
SCRIPTS: Final = (CLAIM, COMPLETE, EXTEND, RELEASE, PEEK, FORGET)
NATIVE_COMMANDS: Final = tuple(s.native for s in SCRIPTS if s.native)

# Owner checks some servers have built in, needing no module and no scripting:
# DELIFEQ (Valkey 9.0) and DELEX ... IFEQ (Valkey 9.2, Redis 8.4) delete a key only
# while it holds a value, as release.lua does; SET ... IFEQ ... EX (Valkey 8.1,
# Redis 8.4) renews a lease only while the key holds the token, as extend.lua does.
# The probe asks about the two delete commands. SET's IFEQ is an option, with no
# command of its own to ask about; it came with or before either of them, so a
# server with DELIFEQ or DELEX has it (Valkey 8.1 and 8.2, which have SET IFEQ but
# no DELIFEQ, keep the extend script).
DELIFEQ: Final = "DELIFEQ"
DELEX: Final = "DELEX"
SET_IFEQ: Final = "SET IFEQ"  # a name in the probed set, not a command: inferred, never asked about
BUILTIN_COMMANDS: Final = (DELIFEQ, DELEX)
PROBED_COMMANDS: Final = NATIVE_COMMANDS + BUILTIN_COMMANDS
# What each owner-checked script may become, best first (DELIFEQ is the cheaper delete).
_OWNER_CHECKS: Final = {EXTEND.name: (SET_IFEQ,), RELEASE.name: (DELIFEQ, DELEX)}


def with_owner_checks(found: frozenset[str]) -> frozenset[str]:
    """``found`` (the probed commands a server has), with ``SET IFEQ`` where it can be inferred."""
    return found | {SET_IFEQ} if DELIFEQ in found or DELEX in found else found


def owner_check(mode: NativeMode, available: frozenset[str] | None, script: Script) -> str | None:
    """The built-in owner check a call sends instead of ``script`` (extend, release), or ``None``.

    Where the server has one it is preferred, in ``"auto"`` and ``"always"`` alike:
    it answers as the script does and costs the server least. ``"never"`` means the
    scripts, always.
    """
    if mode == "never" or not available:
        return None
    for name in _OWNER_CHECKS.get(script.name, ()):
        if name in available:
            return name
    return None


def owner_check_command(name: str, args: tuple[str | bytes | int, ...]) -> tuple[str | bytes | int, ...]:
    """The command of owner check ``name`` for a script's arguments (extend's, or release's).

    ``SET claim_key token IFEQ token EX seconds`` writes the value the key holds
    already, so it only renews the lease, as ``EXPIRE`` in extend.lua does; it
    answers OK where the script answers 1, nil where it answers 0.
    """
    if name == SET_IFEQ:
        key, token, seconds = args[:3]
        return ("SET", key, token, "IFEQ", token, "EX", seconds)
    key, token = args[:2]
    return (DELIFEQ, key, token) if name == DELIFEQ else (DELEX, key, "IFEQ", token)


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


# Per client type: True when its commands are coroutines (asyncio), False when not.
# Judged by what the client does, so redis-py-compatible clients keep working.
# Bounded like _NAMESPACES_SEEN: types made at run time (a mock's class per
# instance) would otherwise be kept alive here for good.
_CLIENT_KINDS: dict[type, bool] = {}
CLIENT_KINDS_MAX: Final = 256
_CLIENT_METHODS: Final = ("execute_command", "evalsha", "eval")


def client_kind(client: object) -> bool | None:
    """Whether ``client`` is an asyncio client (``True``) or a sync one (``False``).

    ``None`` when it is no redis-py-like client at all (it lacks ``execute_command``,
    ``evalsha`` or ``eval``). The answer is cached per client type.
    """
    kind = _CLIENT_KINDS.get(type(client))
    if kind is None:
        if not all(callable(getattr(client, name, None)) for name in _CLIENT_METHODS):
            return None
        kind = inspect.iscoroutinefunction(client.execute_command)  # type: ignore[attr-defined]
        if len(_CLIENT_KINDS) >= CLIENT_KINDS_MAX:
            _CLIENT_KINDS.clear()
        _CLIENT_KINDS[type(client)] = kind
    return kind


# What a client of the wrong kind is told it needs (the families of _clients.py).
SYNC_NEEDS: Final = (
    "a sync client (redis.Redis, redis.cluster.RedisCluster, valkey.Valkey, "
    "valkey.cluster.ValkeyCluster, or GLIDE's glide_sync.GlideClient)"
)
ASYNC_NEEDS: Final = (
    "an asyncio client (redis.asyncio.Redis, redis.asyncio.cluster.RedisCluster, valkey.asyncio.Valkey, "
    "valkey.asyncio.cluster.ValkeyCluster, or GLIDE's glide.GlideClient or glide.GlideClusterClient)"
)
ANY_CLIENT: Final = "pass a redis-py, valkey-py or GLIDE client"


def adapted(client: Any) -> Any:
    """``client``, or the adapter of a GLIDE client (``_clients.adapt``), imported only for GLIDE.

    Told by the class's module, so this core imports no client library for the others.
    """
    if type(client).__module__.startswith(("glide.", "glide_sync.")):
        from ._clients import adapt

        return adapt(client)
    return client


def check_client(client: object, wants_async: bool | None, user: str) -> None:
    """Raise unless ``client`` is a client of the kind ``user`` needs (asyncio or sync).

    Args:
        client: The client passed in.
        wants_async: Whether ``user`` awaits the client's commands; ``None`` checks nothing.
        user: The handle class that needs the client, for the message.
    """
    if wants_async is None:
        return
    kind = client_kind(client)
    if kind is wants_async:
        return
    needs = ASYNC_NEEDS if wants_async else SYNC_NEEDS
    got = f"{type(client).__module__}.{type(client).__qualname__}"
    if kind is None:
        hint = ANY_CLIENT
    elif wants_async:
        hint = "use Claim for a sync client, or pass an asyncio one"
    else:
        hint = "use AsyncClaim (and await its methods) for an asyncio client, or pass a sync client"
    raise InvalidArgumentTypeError(f"{user} needs {needs}, not {got}; {hint}")


def _new_token_prefix() -> None:
    global _token_prefix, _token_counter
    # 96 random bits in 16 URL-safe characters: a completed record with a short value
    # then stays within Redis's 44-byte embedded string (one allocation, not two).
    _token_prefix = secrets.token_urlsafe(12) + "-"
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
    """The claim and result keys of ``key``: one key, ``<ns>:{<key>}``, returned as both.

    One key holds the whole record: the owner's token while the work runs, then
    ``done <token> <value>`` for the ttl (claim.lua, complete.lua). The hash tag
    ``{<key>}`` (braces and ``%`` in ``key`` percent-escaped) keeps the fence
    counter (``fencing=True``), ``<ns>:{<key>}:fence``, in the same cluster slot.
    """
    record = f"{namespace}:{{{_escape_tag(key)}}}"
    return record, record


def check_replicas(replicas: object, timeout_ms: object) -> tuple[int, int]:
    """Return ``(replicas, timeout_ms)`` for WAIT: an int >= 0, and a positive int of milliseconds."""
    for name, value, low in (("replicas", replicas, 0), ("replica_timeout_ms", timeout_ms, 1)):
        if type(value) is not int:
            raise InvalidArgumentTypeError(f"{name} must be an int, not {type(value).__name__} {describe(value)}")
        if not low <= value <= MAX_SECONDS:
            raise InvalidArgumentError(f"{name} must be an int from {low} to {MAX_SECONDS}, not {describe(value)}")
    return replicas, timeout_ms  # type: ignore[return-value]  # both checked just above


# --------------------------------------------------------------------------- the shared handle


ClientT = TypeVar("ClientT")
HandleT = TypeVar("HandleT", bound="ClaimBase[Any]")


class ClaimBase(Generic[ClientT]):
    """What ``Claim`` and ``AsyncClaim`` share: validated settings and derived keys.

    Handles are made once per request, so construction stays cheap: plain type
    and range checks, no pydantic, namespaces validated once per process.
    """

    __slots__ = (
        "_client",
        "_fence",
        "_fence_key",
        "_holder",
        "_lapse_ms",
        "_mine_until",
        "_native",
        "_replica_timeout_ms",
        "_replicas",
        "claim_key",
        "key",
        "lease",
        "result_key",
        "token",
        "ttl",
    )

    # Whether the handle awaits its client's commands; None (ClaimBase itself): no client check.
    _wants_async: ClassVar[bool | None] = None

    def __init_subclass__(cls, **kwargs: object) -> None:
        # Judged once per class from what it does (an awaitable acquire), so the
        # drivers need no marker of their own.
        super().__init_subclass__(**kwargs)
        acquire = getattr(cls, "acquire", None)
        if acquire is not None:
            cls._wants_async = inspect.iscoroutinefunction(acquire)

    def __init__(
        self,
        client: ClientT,
        key: str,
        *,
        lease: int = 30,
        ttl: int = 86400,
        namespace: str = DEFAULT_NAMESPACE,
        token: str | None = None,
        native: NativeMode = "auto",
        fencing: bool = False,
        replicas: int = 0,
        replica_timeout_ms: int = 500,
    ) -> None:
        # Each check takes its fast path inline for the valid, common case and
        # calls the full checker (which raises with a clear message) otherwise.
        if _CLIENT_KINDS.get(type(client)) is not self._wants_async:
            client = adapted(client)
            check_client(client, self._wants_async, type(self).__name__)
        self._client = client
        if type(key) is not str or not key or not key.isascii():
            _check_text("key", key)
        self.key = key
        if type(namespace) is not str or namespace not in _NAMESPACES_SEEN:
            _remember_namespace(check_namespace(namespace))
        self.claim_key, self.result_key = build_keys(namespace, key)
        self.lease = lease if type(lease) is int and 0 < lease <= MAX_SECONDS else check_seconds("lease", lease)
        self.ttl = ttl if type(ttl) is int and 0 < ttl <= MAX_SECONDS else check_seconds("ttl", ttl)
        self.token = new_token() if token is None else check_token(token)
        self._native = native if type(native) is str and native == "auto" else check_native(native)
        self._lapse_ms: int | None = None  # what the last in-flight reply said the lease has left
        self._holder: object = None  # what the last claim reply said claim_key holds, when it said
        self._mine_until = 0.0  # see _owns: until when a claim holding this token is this handle's own
        self._fence: int | None = None  # the fence of the claim this handle holds or last held
        if fencing is False:
            self._fence_key: str | None = None
        elif fencing is True:
            self._fence_key = self.claim_key + FENCE_SUFFIX
        else:
            raise InvalidArgumentTypeError(f"fencing must be True or False, not {describe(fencing)}", key=key)
        # The default, no WAIT; exact types first, so False or 0.0 are refused below like any bad value.
        if type(replicas) is int and replicas == 0 and type(replica_timeout_ms) is int and replica_timeout_ms == 500:
            self._replicas, self._replica_timeout_ms = 0, 500
        else:
            self._replicas, self._replica_timeout_ms = check_replicas(replicas, replica_timeout_ms)

    @classmethod
    def _checked(
        cls: type[HandleT],
        client: Any,
        key: str,
        namespace: str,
        token: str,
        lease: int,
        ttl: int,
        native: NativeMode,
        replicas: int,
        replica_timeout_ms: int,
    ) -> HandleT:
        """A handle from settings the caller already checked (the decorator does, once).

        The same handle ``__init__`` makes (a test compares every slot), without
        checking again what was checked at decoration, on every call.
        """
        self = cls.__new__(cls)
        self._client = client
        self.key = key
        self.claim_key, self.result_key = build_keys(namespace, key)
        self.lease, self.ttl, self.token, self._native = lease, ttl, token, native
        self._fence_key = None
        self._replicas, self._replica_timeout_ms = replicas, replica_timeout_ms
        self._lapse_ms = None
        self._holder = None
        self._mine_until = 0.0
        self._fence = None
        return self

    @classmethod
    def _many(cls: type[HandleT], client: Any, keys: Iterable[str], options: dict[str, Any]) -> list[HandleT]:
        """The handles of a batch: ``cls(client, key, **options)`` for each key, the options checked once.

        The first handle is made by the constructor; the others copy its checked
        settings and check only their own key (each draws its own token). With a
        ``token`` or ``fencing`` in the options each goes through the constructor.
        """
        keys = list(keys)
        if not keys:
            return []
        first = cls(client, keys[0], **options)
        if "token" in options or first._fence_key is not None:
            return [first, *(cls(client, key, **options) for key in keys[1:])]
        namespace = options.get("namespace", DEFAULT_NAMESPACE)  # the first handle checked it
        handles = [first]
        for key in keys[1:]:
            if type(key) is not str or not key or not key.isascii():
                _check_text("key", key)
            handle = cls._checked(
                first._client, key, namespace, new_token(), first.lease, first.ttl, first._native,
                first._replicas, first._replica_timeout_ms,
            )  # fmt: skip
            handles.append(handle)
        return handles

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
        replicas: int,
        replica_timeout_ms: int,
    ) -> ClaimBase[ClientT]:
        _check_text("claim_key", claim_key)
        _check_text("result_key", result_key)
        if claim_key == result_key:
            raise InvalidArgumentError(f"claim_key and result_key must differ: {claim_key!r}")
        # The usual construction checks everything else; then the exact keys replace the derived ones.
        self = cls(
            client, claim_key, lease=lease, ttl=ttl, token=token, native=native,
            replicas=replicas, replica_timeout_ms=replica_timeout_ms,
        )  # fmt: skip
        self.claim_key, self.result_key = claim_key, result_key
        return self

    def __repr__(self) -> str:
        return f"{type(self).__name__}(key={self.key!r}, token={self.token!r}, lease={self.lease}, ttl={self.ttl})"

    # -- what to send, and what the replies mean

    @property
    def _both_keys(self) -> str:
        """Both keys (the one key of the record), as errors about a command on both name them."""
        if self.claim_key == self.result_key:
            return self.claim_key
        return f"{self.claim_key} / {self.result_key}"

    def _claim_call(self) -> tuple[Script, tuple[str | int, ...]]:
        if self._fence_key is None:
            if self._replicas:  # "wait": a read-back is rewritten for the WAIT behind it (claim.lua)
                return CLAIM, (self.claim_key, self.result_key, self.token, self.lease, 0, "wait")
            return CLAIM, (self.claim_key, self.result_key, self.token, self.lease)
        # The counter outlives the claim and its result; past that, the clock takes over.
        keep = max(self.lease, self.ttl)
        fenced = (self.claim_key, self.result_key, self._fence_key, self.token, self.lease, keep)
        return CLAIM_FENCED, (*fenced, "wait") if self._replicas else fenced

    def _claim_command(
        self, available: frozenset[str] | None, *, source: bool = False
    ) -> tuple[str | bytes | int, ...]:
        """The claim as one command for a pipeline: GOBLIN.CLAIM where chosen, else the script.

        ``source`` sends the script's text (EVAL), for a server that lost its cache.
        """
        script, args = self._claim_call()
        # With replicas, always the script, as acquire() sends it: only it rewrites a read-back for the WAIT.
        native = None if source or self._replicas else native_command(self._native, available, script, self.key)
        return (native, *args) if native is not None else script_command(script, args, source=source)

    def _claim_outcome(
        self,
        reply: object,
        acknowledged: int | None = None,
        *,
        resent: bool = False,
        sent_at: float = 0.0,
        now: float = 0.0,
    ) -> tuple[Outcome, object]:
        """The outcome of a claim reply, and what claim_key holds when that is known.

        ``reply`` is GOBLIN.CLAIM's or claim.lua's: ``CLAIMED``, the stored value,
        or (in flight) a list holding claim_key's value; the driver answers the native
        command's nil with one read (``peek.lua``) that replies as claim.lua would.

        A holder equal to this handle's token is ``Claimed`` only when it is this
        handle's own claim (see ``_owns``); another handle given the same token
        looks the same on the server, and is ``InFlight``.

        Args:
            reply: The server's reply.
            acknowledged: WAIT's count, with ``replicas``.
            resent: The driver sent this claim more than once (its retry, after a
                failure that may have left the first send applied).
            sent_at: The monotonic clock before the claim was first sent.
            now: The monotonic clock once the reply was read.

        Raises:
            ResultLostError: claim_key says done, but the result is gone.
            NotReplicatedError: This handle took the claim, but too few replicas acknowledged it.
        """
        # Validated, not model_construct (slower); the two hot outcomes straight
        # through their validators, which is what __init__ does, less its wrapper.
        if type(reply) is list:
            holder = reply[0] if reply else None
            if self._fence_key is not None and len(reply) == 2 and holder in _CLAIMED_REPLIES:
                # A fenced win has two entries; a fenced in-flight reply three.
                return self._claimed(reply[1], acknowledged, sent_at), self.token
            if holder is None:
                # Free meanwhile (the next attempt may take it), or a non-string: in flight, as natively.
                self._mine_until = 0.0
                return InFlight(key=self.key), None
            lapse = None
            if len(reply) > 1 and type(reply[1]) is int:
                self._lapse_ms = reply[1]
                # PTTL: -1 is a raw writer's claim without an expiry, so no time is known.
                lapse = reply[1] / 1000 if reply[1] >= 0 else None
            if holder == self.token or holder == self.token.encode():
                fence = reply[2] if len(reply) > 2 else None
                if self._owns(resent, now, fence):
                    return self._claimed(fence, acknowledged, sent_at, held=True), holder
                self._mine_until = 0.0
                return InFlight(key=self.key, retry_after=lapse), holder  # another handle with this token holds it
            self._mine_until = 0.0
            if holder.startswith(_DONE_PREFIXES[0] if type(holder) is bytes else DONE_PREFIX):
                raise ResultLostError(
                    f"{self.key!r} was completed, but its result ({self.result_key!r}) is gone: evicted by a "
                    "maxmemory-policy other than noeviction, or deleted; forget() reopens the work",
                    key=self.key,
                )
            return InFlight(key=self.key, retry_after=lapse), holder
        if reply in _CLAIMED_REPLIES:
            return self._claimed(None, acknowledged, sent_at), self.token
        self._mine_until = 0.0
        if reply is None:
            return InFlight(key=self.key), None
        holder = None
        if self.claim_key is self.result_key or self.claim_key == self.result_key:
            holder, reply = self._read_record(reply)
            if holder is None:  # a token, not a record: in flight (the driver peeks first)
                return InFlight(key=self.key), reply
        if acknowledged is not None and acknowledged < self._replicas:
            # Read back from the primary alone: a failover now could lose it.
            raise self._not_replicated("read", acknowledged)
        return _completed_outcome({"key": self.key, "value": reply}), holder

    def _stored_of(self, reply: object, acknowledged: int | None) -> Stored | None:
        """A claim reply that is a one-key record, as ``Stored`` (its holder kept); else ``None``.

        What ``_claim_outcome`` answers a record with, less the ``Completed``. With
        ``replicas`` (an acknowledgement to check) it leaves the reply to ``_claim_outcome``.
        """
        if acknowledged is not None or self.claim_key != self.result_key:
            return None
        holder, value = self._read_record(reply)
        if holder is None:
            return None
        self._mine_until = 0.0
        self._holder = holder
        return Stored(cast("bytes | str", value))  # a slice of the reply, which was one of them

    def _read_record(self, reply: object) -> tuple[object, object]:
        """``(holder, value)`` of a one-key record ``done <token> <value>``; ``(None, reply)`` for a token."""
        if type(reply) is bytes:
            if not reply.startswith(_DONE_PREFIXES[0]):
                return None, reply
            cut = reply.find(b" ", len(DONE_PREFIX))
        elif type(reply) is str:
            if not reply.startswith(DONE_PREFIX):
                return None, reply
            cut = reply.find(" ", len(DONE_PREFIX))
        else:
            return None, reply
        if cut < 0:
            raise ResultLostError(
                f"{self.key!r} ({self.claim_key!r}) holds a done marker without a value: not written by this "
                "release's complete(); forget() reopens the work",
                key=self.key,
            )
        return reply[len(DONE_PREFIX) : cut], reply[cut + 1 :]

    def _needs_peek(self, reply: object) -> bool:
        """Whether a claim reply needs one read (peek.lua) to be told apart.

        GOBLIN.CLAIM answers nil in flight on two keys, and on the one-key record
        the holder's token itself; claim.lua answers neither.
        """
        if reply is None:
            return True
        if type(reply) is bytes:
            return self.claim_key == self.result_key and not reply.startswith(_DONE_PREFIXES[0]) and reply != b"CLAIMED"
        if type(reply) is str:
            return self.claim_key == self.result_key and not reply.startswith(DONE_PREFIX) and reply != CLAIMED
        return False

    def _owns(self, resent: bool, now: float, fence: object) -> bool:
        """Whether a claim holding this handle's token is this handle's own.

        The token is stored verbatim, so the server cannot tell this handle's
        re-sent claim from another handle given the same token (a worker id).
        The handle can: it is its own when the driver re-sent this very claim,
        or while the lease of a claim this handle took (or sent without learning
        the outcome) has not run out by its own clock, measured from before that
        send, which is never later than the server's expiry. With fencing, a
        counter that moved on since this handle's fence means another owner.

        Not told apart (and so taken as its own): a first send that never reached
        the server, then another handle with this token claiming before the
        re-send arrives, or deleting this handle's live claim (``forget()``, a raw
        ``GOBLIN.CAD``) and claiming within its lease.
        """
        if resent:
            return True
        if now >= self._mine_until:
            return False
        return self._fence is None or type(fence) is not int or fence == self._fence

    def _claimed(self, fence: object, acknowledged: int | None, sent_at: float, *, held: bool = False) -> Claimed:
        # A new claim lives at least lease seconds from before its send; a claim
        # this handle already held keeps the deadline it had.
        if not held or sent_at >= self._mine_until:
            self._mine_until = sent_at + self.lease
        if type(fence) is not int:
            fence = None
        elif fence != self._fence:
            self._fence = fence
        if acknowledged is not None and acknowledged < self._replicas:
            raise self._not_replicated("claim", acknowledged)
        return _claimed_outcome({"key": self.key, "token": self.token, "lease": self.lease, "fence": fence})

    def _claim_unknown(self, sent_at: float) -> None:
        """A claim sent at ``sent_at`` failed without a reply: it may have taken the claim.

        The handle's next claim is then a re-send of this one.
        """
        if sent_at >= self._mine_until:
            self._mine_until = sent_at + self.lease
            self._fence = None

    def _extended(self, sent_at: float, seconds: int) -> None:
        """The lease was renewed by a call sent at ``sent_at``, while this handle held it."""
        if sent_at < self._mine_until:
            self._mine_until = sent_at + seconds

    def _let_go(self) -> None:
        """This handle no longer holds the claim: released, completed, or forgotten."""
        self._mine_until = 0.0

    def _complete_call(
        self, value: object, encoding: str = "utf-8", text_only: bool = False, wake: str = ""
    ) -> tuple[Script, tuple[str | bytes | int, ...]]:
        """complete.lua and its arguments; with fencing, the counter and this handle's fence too."""
        stored = check_value(value, self.key, text_only=text_only, encoding=encoding)
        marker = DONE_PREFIX + self.token
        if self._fence_key is None:
            return COMPLETE, (self.claim_key, self.result_key, self.token, stored, self.ttl, marker, wake)
        fence = "" if self._fence is None else self._fence
        keys = (self.claim_key, self.result_key, self._fence_key)
        return COMPLETE_FENCED, (*keys, self.token, stored, self.ttl, marker, wake, fence)

    def _completed(self, reply: object, acknowledged: int | None = None) -> None:
        """Check complete.lua's reply.

        Raises:
            ClaimLostError: Another token holds or completed the claim, or this one
                completed it with another value; nothing was written.
            NotReplicatedError: Stored, but too few replicas acknowledged it.
        """
        if reply == _UNPROVEN:
            raise ClaimLostError(
                f"cannot complete {self.key!r}: the claim of token {self.token!r} is gone (its lease lapsed, or "
                "it was released or forgotten) and "
                + (
                    "its fence is unknown or the counter expired"
                    if self._fence_key is not None
                    else "without fencing=True nothing shows that nobody claimed the key since"
                )
                + "; nothing was written",
                key=self.key,
            )
        if reply == _COMPLETED_OTHERWISE:
            raise ClaimLostError(
                f"cannot complete {self.key!r}: token {self.token!r} already completed it with another value; "
                "the first value stays",
                key=self.key,
            )
        if reply != _STORED:
            raise self._lost("complete")
        if acknowledged is not None and acknowledged < self._replicas:
            raise self._not_replicated("complete", acknowledged)

    def _not_replicated(self, action: str, acknowledged: int) -> NotReplicatedError:
        held = {
            "claim": "this handle holds the claim",
            "read": "the result was read back (the work is completed)",
        }.get(action, "the result is stored")
        return NotReplicatedError(
            f"{action} of {self.key!r}: {acknowledged} of {self._replicas} replicas acknowledged within "
            f"{self._replica_timeout_ms} ms; {held} on the primary, but a failover now could lose it",
            key=self.key,
            acknowledged=acknowledged,
            replicas=self._replicas,
        )

    def _extend_lease(self, lease: int | None) -> int:
        return self.lease if lease is None else check_seconds("lease", lease)

    def _lost(self, action: str) -> ClaimLostError:
        return ClaimLostError(
            f"cannot {action} {self.key!r}: token {self.token!r} no longer holds {self.claim_key!r} "
            "(its lease lapsed and another caller took it, or the work was completed)",
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

    def expired(self) -> StillInFlightError:
        """The error for a wait that ran out of time."""
        return StillInFlightError(
            f"{self._key!r} is still in flight after waiting {self._timeout:g}s ({self._attempt + 1} attempts)",
            key=self._key,
            retry_after=self._lapse_ms / 1000 if self._lapse_ms is not None and self._lapse_ms >= 0 else None,
        )
